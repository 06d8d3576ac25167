"""Hostile model files, swept: every field of four shipped Hugging Face configs (Qwen3-8B,
DeepSeek-V3, Mixtral 8x22B, GPT-2) and of a YAML spec set to each of eleven hostile values
(null, a list, a mapping, a string, -1, 0, 2**63, 1.5, true, 1e308, and for specs "1e9"), each
given to ``mpmd plan`` in its own process capped at 3 GiB of address space. A case passes when
the command refuses it in one line starting ``error:`` with exit status 2 and writes nothing,
or accepts it as the value the config format allows (``null`` for an optional field, 1.5 for a
float field); anything else (a traceback, another exit status, a crash under the cap) is listed.

Usage:
    python benchmarks/bench_hostile_models.py          # about 10 minutes on 2 cores

Prints one line per failing case and a summary; writes only into a temporary folder.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CAP = 3 * 2**30
BAD = [None, [], {}, "x", -1, 0, 2**63, 1.5, True, 1e308]
SPEC = {"family": "llama", "layers": 4, "hidden": 512, "heads": 8, "ffn": 1536, "vocab": 256,
        "seq_len": 128}
FIELDS = {
    "Qwen3-8B.json": ["num_hidden_layers", "hidden_size", "num_attention_heads",
                      "num_key_value_heads", "intermediate_size", "vocab_size",
                      "max_position_embeddings", "head_dim", "rope_theta", "rms_norm_eps",
                      "tie_word_embeddings"],
    "DeepSeek-V3.json": ["n_routed_experts", "num_experts_per_tok", "moe_intermediate_size",
                         "n_shared_experts", "first_k_dense_replace", "q_lora_rank",
                         "kv_lora_rank", "qk_rope_head_dim", "v_head_dim", "qk_nope_head_dim",
                         "moe_layer_freq"],
    "Mixtral-8x22B-v0.1.json": ["num_local_experts", "num_experts_per_tok", "sliding_window"],
    "gpt2.json": ["n_layer", "n_embd", "n_head", "n_positions", "n_inner", "layer_norm_epsilon"],
}
SPEC_FIELDS = ["layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len", "head_size",
               "rope_theta", "norm_eps", "capacity_factor", "experts", "dense_layers", "name",
               "family", "dtype", "bias", "training", "norm", "patch_size", "kv_lora_rank",
               "q_lora_rank"]


def cases() -> list[tuple[str, str]]:
    """(file name, text) of every case."""
    out = []
    for src, keys in FIELDS.items():
        base = json.loads((ROOT / "zoo" / "configs" / src).read_text())
        for k in keys:
            for i, v in enumerate(BAD):
                out.append((f"{Path(src).stem}-{k}-{i}.json", json.dumps({**base, k: v})))
    for k in SPEC_FIELDS:
        for i, v in enumerate(BAD + ["1e9"]):
            out.append((f"spec-{k}-{i}.yaml", yaml.safe_dump({**SPEC, k: v})))
    return out


def run_case(folder: Path, name: str, text: str) -> tuple[str, str] | None:
    """None when the case passes, else (verdict, last stderr line)."""
    f, out = folder / name, folder / "plan.json"
    f.write_text(text)
    boot = ("import os, resource, sys; resource.setrlimit(resource.RLIMIT_AS, (%d, %d)); "
            "os.execv(sys.executable, [sys.executable, '-m', 'mpmd', *sys.argv[1:]])" % (CAP, CAP))
    p = subprocess.run([sys.executable, "-c", boot, "plan", "--model", str(f), "--cluster",
                        "cpu4x2", "--global-batch", "8", "--time-limit", "1", "--out", str(out)],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    written = out.exists()
    out.unlink(missing_ok=True)
    if p.returncode == 0:
        return None                     # accepted: a value the format allows (see the docstring)
    if p.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and not written:
        return None
    return f"exit {p.returncode}", (lines[-1] if lines else "")[:200]


def main() -> None:
    all_cases = cases()
    failed = 0
    with tempfile.TemporaryDirectory() as d:
        for name, text in all_cases:
            bad = run_case(Path(d), name, text)
            if bad:
                failed += 1
                print(f"FAIL {name}: {bad[0]}: {bad[1]}")
    print(f"{len(all_cases)} hostile model files, {failed} not refused cleanly "
          f"(one line, exit 2, nothing written, under a {CAP // 2**30} GiB cap)")


if __name__ == "__main__":
    main()
