"""Rows of NVIDIA's Megatron-Bridge performance summary as the table prints them (its 25.11
section, docs/performance-summary.md at commit 08968b3): model names with their qualifiers,
``DGX-`` systems, ``FP8-CS`` / ``FP8-MX`` precisions, no DP, ``n/a`` VP, its GA, and no shape
columns at all. ``mpmd validate`` must express every one and say what it assumed."""

from __future__ import annotations

from click.testing import CliRunner

from mpmd.cli.main import main

TABLE = """source,model,device,gpus,precision,global_batch,micro_batch,seq_len,fsdp,tp,pp,cp,vp,ep,microbatches,metric,value
nemo-25.11,LLAMA3_8B,DGX-B200,8,FP8-CS,128,2,8192,0,1,1,1,n/a,1,8,tokens_per_gpu_s,30624
nemo-25.11,Qwen3_30B_a3B,DGX-GB200,8,FP8-MX,512,4,4096,0,1,1,1,1,8,16,tokens_per_gpu_s,23766
nemo-25.11,Qwen3_235B_a22B,DGX-GB300,256,BF16,8192,2,4096,0,1,4,1,12,16,32,tokens_per_gpu_s,6131
nemo-25.09,Qwen3_30B_a3B (tokendrop),DGX-H100,16,FP8-CS,512,2,4096,0,1,2,1,24,8,32,tokens_per_gpu_s,10494
"""
"""Four rows copied as printed (the 25.09 one with the precision its section leaves out)."""


def test_rows_as_the_table_prints_them_are_scored(tmp_path):
    path = tmp_path / "table.csv"
    path.write_text(TABLE)
    out = tmp_path / "report.md"
    res = CliRunner().invoke(main, ["validate", "--csv", str(path), "--out", str(out)])
    assert res.exit_code == 0, res.output
    md = out.read_text()
    assert "**4 of 4 rows scored**" in md
    rows = {ln.split(" | ")[1]: ln for ln in md.splitlines() if ln.startswith("| nemo-25.")}
    assert set(rows) == {"LLAMA3_8B", "Qwen3_30B_a3B", "Qwen3_235B_a22B",
                         "Qwen3_30B_a3B (tokendrop)"}
    # devices and precisions as printed, read as the profiles and recipes they name
    assert rows["LLAMA3_8B"].split(" | ")[2:4] == ["b200", "fp8"]
    assert rows["Qwen3_30B_a3B"].split(" | ")[2:4] == ["gb200", "mxfp8"]
    # no DP printed: the GPUs the other degrees leave; HybridEP on an NVL72 rack
    assert rows["Qwen3_30B_a3B"].split(" | ")[5] == "1/1/8"
    assert "dispatcher deepep (not published: HybridEP, as NVIDIA runs on gb200)" in rows[
        "Qwen3_30B_a3B"]
    # the GA the table prints disagrees with its batch: the batch is kept and the row says so
    assert ("microbatches 32 as published disagree with global_batch / (micro_batch x dp) = 64"
            in rows["Qwen3_235B_a22B"])
    # the "(tokendrop)" qualifier is the row's routing: a stated dispatcher, no assumption
    assert "dispatcher" not in rows["Qwen3_30B_a3B (tokendrop)"].split(" | ")[8]


def test_a_model_the_zoo_lacks_is_skipped_naming_what_it_lacks(tmp_path):
    """A table row of a model whose architecture the zoo knows it cannot cost yet (DeepSeek-V4)
    is listed under "not simulated" with that reason, not as a missing shape column; an H100
    row whose expert group leaves the node states the DeepEP it assumes."""
    path = tmp_path / "table.csv"
    path.write_text(TABLE.splitlines()[0] + "\n"
                    "t,DeepSeekV4_Flash,DGX-GB200,64,BF16,512,1,4096,0,1,1,1,1,64,8,tokens_per_gpu_s,5000\n"
                    "t,Qwen3_30B_a3B,DGX-H100,16,FP8-CS,512,2,4096,0,1,1,1,1,16,16,tokens_per_gpu_s,5000\n")
    out = tmp_path / "report.md"
    res = CliRunner().invoke(main, ["validate", "--csv", str(path), "--out", str(out)])
    assert res.exit_code == 0, res.output
    md = out.read_text()
    assert "**1 of 2 rows scored**" in md
    assert "model 'deepseekv4-flash' is not modelled yet: the zoo lacks DeepSeek-V4's" in md
    assert ("dispatcher deepep (not published: DeepEP: the expert-parallel group spans "
            "scale-up domains)") in md
