"""launchers: context-parallel plans (``ir.Layout.context`` > 1) exported to every target.

The plans are the bundled ``data/`` plans with their meshes' layouts replaced by context-parallel
ones of the same devices (data x context x tensor = the mesh's devices); the expectations are
worked out by hand from each launcher's rules: Megatron-LM derives data parallel as
``world / (tp x pp x cp)`` and needs the global batch to split into micro batches over it,
torchtitan's world is ``replicate x shard x cp x tp x pp``, MaxText's is the product of its
``ici_*`` and ``dcn_*`` axes."""

from __future__ import annotations

import math
import shlex
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from ir import Layout, Plan
from ir.plan_file import load_plan
from launchers import LauncherError, export_plan, part_views
from launchers.torchtitan import cp_attention_note

DATA = Path(__file__).resolve().parent / "data"
H100X128 = DATA / "llama3-70b-h100x128.json"        # 4 meshes of 32 H100 (4 nodes each), M 32
INTERLEAVED = DATA / "llama3-70b-interleaved.json"  # 2 meshes of 64 H100 (8 nodes each)
DP_PLAN = DATA / "llama3-70b-h100-tpu-data-parallel.json"   # part 1: one mesh of 256 TPU v5e


def with_layouts(path: Path, **layouts: Layout) -> Plan:
    """The plan at ``path`` with each named mesh's layout replaced (``"*"``: every mesh)."""
    plan = load_plan(path)
    assert isinstance(plan, Plan)
    new = {m: layouts.get(m, layouts.get("*", lay)) for m, lay in plan.layouts.items()}
    for m, lay in new.items():
        assert lay.devices == plan.devices[m][1], f"{m}: {lay} is not {plan.devices[m][1]} devices"
    return replace(plan, layouts=new)


def files(plan: Plan) -> dict[str, tuple[str, tuple[str, ...]]]:
    out = {}
    for target in ("megatron", "torchtitan@0.2", "maxtext"):
        (f,) = export_plan(plan, target, "x")
        out[target.split("@")[0]] = (f.text, f.notes)
    return out


def megatron_args(text: str) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            words = shlex.split(line)
            out[words[0]] = words[1] if len(words) > 1 else None
    return out


def maxtext_devices(doc: dict) -> int:
    return math.prod(v for k, v in doc.items() if k.endswith("_parallelism"))


def test_ring_context_on_every_target():
    """dp4 x cp2 x tp4 on each of 4 meshes of 32 H100: Megatron's derived data parallel is
    128 / (4 x 4 x 2) = 4, so 256 samples in 32 microbatches are micro batches of 2; the ring is
    Megatron's p2p and torchtitan's "alltoall" rotation; MaxText keeps the context axis inside
    the 8-GPU node (tensor 4 x context 2) and the data axis across the mesh's 4 nodes."""
    text, notes = files(with_layouts(H100X128, **{"*": Layout(4, 4, context=2)}))["megatron"]
    a = megatron_args(text)
    assert (a["--tensor-model-parallel-size"], a["--pipeline-model-parallel-size"],
            a["--context-parallel-size"], a["--cp-comm-type"]) == ("4", "4", "2", "p2p")
    assert (a["--micro-batch-size"], a["--global-batch-size"]) == ("2", "256")
    assert "--use-distributed-optimizer" in a and "--overlap-grad-reduce" in a
    assert "# 128 x h100-sxm: data 4 x context 2 (ring) x tensor 4 x pipeline 4; 32 microbatches " \
           "of 2 per replica" in text
    assert notes == ()

    out = files(with_layouts(H100X128, **{"*": Layout(4, 4, context=2)}))
    doc = tomllib.loads(out["torchtitan"][0])
    par = doc["parallelism"]
    assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"],
            par["context_parallel_degree"], par["tensor_parallel_degree"],
            par["pipeline_parallel_degree"]) == (1, 4, 2, 4, 4)
    assert par["context_parallel_rotate_method"] == "alltoall"
    assert doc["training"]["local_batch_size"] == 64        # 256 over data 4, not data x context
    assert par["pipeline_parallel_microbatch_size"] == 2
    assert out["torchtitan"][1] == (
        "torchtitan's llama3 70B flavour has rope scaling llama3 x8 (low/high 1/4 over 8192), "
        "the plan's model none: the 0.2 TOML cannot set it",
        "torchtitan shards parameters, gradients and optimizer state over data x context 8 "
        "(FSDP: its DDP does not combine with tensor, pipeline or expert parallel); the plan kept "
        "whole parameters and sharded the optimizer state (distributed optimizer): expect "
        "parameter gathers the plan did not cost, or plan with FSDP",
        cp_attention_note("flash"),
        "torchtitan computes the loss with PyTorch's cross_entropy on the fp32 logits, op by op: "
        "the run holds more memory at the loss than the plan's fused loss (plan with "
        "--cross-entropy eager)")

    mx = yaml.safe_load(out["maxtext"][0])
    assert (mx["ici_context_parallelism"], mx["dcn_context_parallelism"]) == (2, 1)
    assert (mx["ici_data_parallelism"], mx["dcn_data_parallelism"]) == (1, 4)
    assert (mx["ici_tensor_parallelism"], mx["dcn_pipeline_parallelism"]) == (4, 4)
    assert maxtext_devices(mx) == 128
    assert (mx["context_parallel_strategy"], mx["context_parallel_load_balance"],
            mx["attention"]) == ("ring", True, "cudnn_flash_te")
    assert mx["per_device_batch_size"] == 2.0                # 256 samples over 128 devices
    assert any(n.startswith("MaxText shards parameters over its context axis") for n in
               out["maxtext"][1])


def test_allgather_context_spanning_nodes():
    """dp1 x cp8 x tp4: no data parallel at all in Megatron's sense (128 / (4 x 4 x 8) = 1), so
    the micro batch is the whole microbatch (256 / 32 = 8); the gradients are still reduced and
    the optimizer sharded over the 8 context ranks. MaxText: one data replica spans the mesh's
    4 nodes, so its context axis does: 4 across nodes x 2 inside each."""
    out = files(with_layouts(H100X128, **{"*": Layout(1, 4, context=8,
                                                      context_method="allgather")}))
    a = megatron_args(out["megatron"][0])
    assert (a["--context-parallel-size"], a["--cp-comm-type"]) == ("8", "all_gather")
    assert (a["--micro-batch-size"], a["--global-batch-size"]) == ("8", "256")
    assert "--use-distributed-optimizer" in a and "--overlap-grad-reduce" in a

    par = tomllib.loads(out["torchtitan"][0])["parallelism"]
    assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"],
            par["context_parallel_degree"]) == (1, 1, 8)
    assert par["context_parallel_rotate_method"] == "allgather"
    assert any("gathers the K/V once but passes their gradients around the ring" in n
               for n in out["torchtitan"][1])

    mx = yaml.safe_load(out["maxtext"][0])
    assert (mx["ici_context_parallelism"], mx["dcn_context_parallelism"]) == (2, 4)
    assert (mx["ici_data_parallelism"], mx["dcn_data_parallelism"]) == (1, 1)
    assert maxtext_devices(mx) == 128
    assert (mx["context_parallel_strategy"], mx["context_parallel_load_balance"]) == (
        "all_gather", True)


def test_alltoall_context_on_gpus():
    """Ulysses: Megatron's a2a exactly; torchtitan and MaxText (whose Ulysses is TPU-only) have
    none on GPUs and write an all-gather with a note naming the approximation."""
    out = files(with_layouts(H100X128, **{"*": Layout(4, 4, context=2,
                                                      context_method="alltoall")}))
    a = megatron_args(out["megatron"][0])
    assert (a["--context-parallel-size"], a["--cp-comm-type"]) == ("2", "a2a")
    assert not any("a2a" in n for n in out["megatron"][1])   # 8 kv heads / tp 4 = 2, by cp 2
    par = tomllib.loads(out["torchtitan"][0])["parallelism"]
    assert (par["context_parallel_degree"], par["context_parallel_rotate_method"]) == (
        2, "allgather")
    assert ("torchtitan has no all-to-all (DeepSpeed-Ulysses) context parallel: context 2 written "
            "as its allgather ring attention (the plan's step assumed heads scattered by "
            "all-to-all)") in out["torchtitan"][1]
    mx = yaml.safe_load(out["maxtext"][0])
    assert (mx["context_parallel_strategy"], mx["context_parallel_load_balance"]) == (
        "all_gather", True)
    assert ("MaxText runs all-to-all (Ulysses) context parallel on TPU only: context 2 written as "
            "all_gather (the plan's step assumed heads scattered by all-to-all)"
            ) in out["maxtext"][1]


def test_alltoall_beyond_each_tensor_ranks_kv_heads_is_a_megatron_note():
    """dp2 x cp4 x tp4: 64 heads split 16 ways run (the plan's check), but Transformer Engine's a2a
    splits each tensor rank's 8 / 4 = 2 key/value heads 4 ways and refuses: a note says so."""
    (f,) = export_plan(with_layouts(H100X128, **{"*": Layout(2, 4, context=4,
                                                             context_method="alltoall")}),
                       "megatron", "x")
    assert megatron_args(f.text)["--cp-comm-type"] == "a2a"
    assert ("Transformer Engine's a2a context parallel splits each tensor rank's 2 key/value "
            "heads 4 ways and refuses this layout: re-plan with another context method") in f.notes


def test_fsdp_context_shards_over_data_and_context():
    """dp8 x cp2 x tp4, FSDP in 2 HSDP replicas, on 2 meshes of 64 H100 (8 nodes each): torchtitan
    shards over dp_shard x cp = 4 x 2 (its dp_shard excludes cp) in 2 replicas: 2 x 4 x 2 x 4 x 2
    = 128 devices; MaxText: fsdp 4 and the 2 replicas across nodes, context 2 inside a node."""
    lay = Layout(8, 4, fsdp=True, hsdp=2, context=2)
    assert lay.shard == 8
    out = files(with_layouts(INTERLEAVED, **{"*": lay}))
    a = megatron_args(out["megatron"][0])
    assert "--use-megatron-fsdp" in a and a["--data-parallel-sharding-strategy"] == "optim_grads_params"
    assert a["--context-parallel-size"] == "2"
    assert ("hybrid sharding over 2 replicas: written as Megatron-FSDP's "
            "full sharding over data x context 8 x 2") in out["megatron"][1]
    par = tomllib.loads(out["torchtitan"][0])["parallelism"]
    assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"],
            par["context_parallel_degree"], par["tensor_parallel_degree"],
            par["pipeline_parallel_degree"]) == (2, 4, 2, 4, 2)
    assert not any("FSDP over dp_shard x cp" in n for n in out["torchtitan"][1])
    mx = yaml.safe_load(out["maxtext"][0])
    assert (mx["ici_fsdp_parallelism"], mx["dcn_fsdp_parallelism"], mx["dcn_data_parallelism"],
            mx["ici_context_parallelism"], mx["dcn_context_parallelism"]) == (1, 4, 2, 2, 1)
    assert maxtext_devices(mx) == 128
    assert not any("shards parameters over its context axis" in n for n in out["maxtext"][1])


@pytest.mark.parametrize("method,strategy,balance", [
    ("alltoall", "ulysses", False), ("ring", "ring", True), ("allgather", "all_gather", True)])
def test_maxtext_on_tpu(method, strategy, balance):
    """The TPU part of the data-parallel plan (256 v5e, dp64 x cp2 x tp2 FSDP): MaxText's own
    Ulysses (its causal reorder off, as MaxText requires) and ring run in the Tokamax splash
    kernel, whose keys are written; all_gather needs neither."""
    tpu = load_plan(DP_PLAN).parts[1]
    plan = replace(tpu, layouts={"tpu_0": Layout(64, 2, fsdp=True, context=2,
                                                 context_method=method)})
    (f,) = export_plan(plan, "maxtext", "x")
    mx = yaml.safe_load(f.text)
    assert (mx["context_parallel_strategy"], mx["context_parallel_load_balance"]) == (
        strategy, balance)
    assert (mx["ici_fsdp_parallelism"], mx["ici_context_parallelism"],
            mx["dcn_context_parallelism"], mx["ici_tensor_parallelism"]) == (64, 2, 1, 2)
    assert maxtext_devices(mx) == 256
    tokamax = {"attention": "flash", "use_tokamax_splash": True}
    assert {k: mx[k] for k in tokamax if k in mx} == (tokamax if method != "allgather" else {})
    assert not any("context" in n for n in f.notes)


def test_sequence_that_the_context_split_does_not_divide_is_refused():
    """Ring and all-gather split the sequence into 2 x context chunks (the zig-zag), all-to-all
    into context chunks: 8190 tokens take context 2 only by all-to-all."""
    plan = replace(with_layouts(H100X128, **{"*": Layout(4, 4, context=2)}), seq_len=8190)
    with pytest.raises(LauncherError, match=r"mesh h100\.0's layout cannot run: context parallel 2 "
                                            r"\(ring\) splits the sequence into 4 chunks, which do "
                                            r"not divide 8190 tokens"):
        part_views(plan)
    ulysses = replace(with_layouts(H100X128, **{"*": Layout(4, 4, context=2,
                                                            context_method="alltoall")}),
                      seq_len=8190)
    out = files(ulysses)
    assert megatron_args(out["megatron"][0])["--seq-length"] == "8190"
    assert any(n.endswith("its causal split into 4 chunks does not divide 8190 tokens: turn "
                          "torchtitan's context load balancing off") for n in out["torchtitan"][1])


def test_a_context_mesh_among_others_is_a_note_never_silent():
    """One of four meshes with context parallel: the most common layout (no context) is written
    and the note names the mesh and its cp degree; three of four: context 2 is written."""
    one = with_layouts(H100X128, **{"h100.1": Layout(4, 4, context=2)})
    (v,) = part_views(one)
    assert v.layout == Layout(8, 4) and v.context == 1
    assert ("mesh h100.1 runs dp4xcp2xtp4, the others dp8xtp4: one layout per pipeline is "
            "written (dp8xtp4)") in v.notes
    a = megatron_args(export_plan(one, "megatron", "x")[0].text)
    assert "--context-parallel-size" not in a
    most = with_layouts(H100X128, **{m: Layout(4, 4, context=2)
                                     for m in ("h100.1", "h100.2", "h100.3")})
    (v,) = part_views(most)
    assert v.layout == Layout(4, 4, context=2) and v.data == 4
    assert ("mesh h100.0 runs dp4xtp8, the others dp4xcp2xtp4: one layout per pipeline is "
            "written (dp4xcp2xtp4)") in v.notes
    written = megatron_args(export_plan(most, "megatron", "x")[0].text)
    assert written["--context-parallel-size"] == "2"


def test_maxtext_context_that_does_not_follow_the_nodes_is_all_ici():
    """dp1 x cp2 x tp16 on 4 nodes: neither data 1 nor context 2 splits 4 ways."""
    (f,) = export_plan(with_layouts(H100X128, **{"*": Layout(1, 16, context=2)}), "maxtext", "x")
    mx = yaml.safe_load(f.text)
    assert (mx["ici_context_parallelism"], mx["dcn_context_parallelism"],
            mx["dcn_data_parallelism"]) == (2, 1, 1)
    assert "data 1 x context 2 does not split over 4 nodes: all of it written as ici" in f.notes


@pytest.mark.parametrize("lay", [Layout(4, 4, context=2), Layout(1, 4, context=8),
                                 Layout(2, 4, context=4, context_method="alltoall"),
                                 Layout(2, 4, fsdp=True, context=4, context_method="allgather")],
                         ids=str)
def test_degrees_multiply_to_the_devices_with_context(lay):
    """Every target's degrees, context included, multiply to the 128 devices, and each one's
    data-parallel degree excludes the context ranks."""
    plan = with_layouts(H100X128, **{"*": lay})
    out = files(plan)
    a = megatron_args(out["megatron"][0])
    t, p, c = (int(a[k]) for k in ("--tensor-model-parallel-size",
                                   "--pipeline-model-parallel-size", "--context-parallel-size"))
    dp = 128 // (t * p * c)
    assert dp * t * p * c == 128 and dp == lay.data
    assert int(a["--global-batch-size"]) % (int(a["--micro-batch-size"]) * dp) == 0
    par = tomllib.loads(out["torchtitan"][0])["parallelism"]
    dp = par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
    assert dp == lay.data and par["context_parallel_degree"] == lay.context
    assert dp * par["context_parallel_degree"] * par["tensor_parallel_degree"] * \
        par["pipeline_parallel_degree"] == 128
    mx = yaml.safe_load(out["maxtext"][0])
    assert maxtext_devices(mx) == 128
    assert mx["ici_context_parallelism"] * mx["dcn_context_parallelism"] == lay.context


def test_each_target_notes_an_attention_kernel_it_does_not_run():
    """The plan's attention kernel (``ModelConfig.attention_kernel``, carried in the plan's model
    config): torchtitan runs FlashAttention-2 under context parallelism, so a context-parallel
    plan costed with the device's own kernel says so there and one costed as flash2 does not;
    Megatron and MaxText run their own fused kernels, so a flash2 plan says so there."""
    from launchers.megatron import MEGATRON_FLASH2_NOTE
    from zoo import get_config
    from zoo.model_files import config_fields

    def kernel_notes(plan: Plan) -> dict[str, list[str]]:
        return {t: [n for n in notes if "FlashAttention-2" in n]
                for t, (_, notes) in files(plan).items()}

    cp = with_layouts(H100X128, **{"*": Layout(4, 4, context=2)})
    assert kernel_notes(cp) == {"megatron": [], "torchtitan": [cp_attention_note("flash")],
                                "maxtext": []}
    fa2 = replace(cp, model_config=config_fields(get_config(cp.model, attention_kernel="flash2")))
    notes = kernel_notes(fa2)
    assert notes["megatron"] == [MEGATRON_FLASH2_NOTE] and notes["torchtitan"] == []
    assert len(notes["maxtext"]) == 1 and "splash" in notes["maxtext"][0]
    assert kernel_notes(load_plan(H100X128)) == {"megatron": [], "torchtitan": [], "maxtext": []}


def test_each_target_notes_a_loss_it_does_not_compute():
    """The plan's ``cross_entropy``: torchtitan computes PyTorch's eager loss, so a plan costed
    with any other says so there; Megatron and MaxText compute theirs fused, so an eager plan
    says so there; the loss a target computes is no note."""
    from launchers.megatron import MEGATRON_LOSS_NOTE

    def loss_notes(plan: Plan) -> dict[str, list[str]]:
        return {t: [n for n in notes if "loss" in n] for t, (_, notes) in files(plan).items()}

    plan = load_plan(H100X128)
    assert loss_notes(replace(plan, cross_entropy="eager")) == {
        "megatron": [MEGATRON_LOSS_NOTE], "torchtitan": [],
        "maxtext": ["MaxText's loss is XLA-fused (the compute-dtype logits kept): the plan costed "
                    "its loss as eager, more memory than the run holds"]}
    fused = loss_notes(plan)
    assert fused["megatron"] == fused["maxtext"] == [] and len(fused["torchtitan"]) == 1
