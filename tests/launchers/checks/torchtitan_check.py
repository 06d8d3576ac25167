"""Run inside the launcher environment (scripts/launchers_env.sh), not by pytest: each torchtitan
export through torchtitan's own ``ConfigManager.parse_args`` (0.3: ``--module/--config`` with the
exported module on ``sys.path``; 0.2: ``--job.config_file``), then ``ParallelDims`` built on the
config's degrees and the world size and its device mesh built on a fake process group
(``torch.testing._internal.distributed.fake_pg``: no GPU, no other process), then the
gradient-accumulation arithmetic of torchtitan's trainer; the parsed values as JSON on stdout.

Usage: python torchtitan_check.py MANIFEST.json, a list of {"path": ..., "world_size": N}."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import sys
import traceback
from contextlib import redirect_stderr, redirect_stdout


def _jsonable(x):
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: _jsonable(getattr(x, f.name)) for f in dataclasses.fields(x)
                if not f.name.startswith("_")}
    if isinstance(x, (list, tuple)):
        return [_jsonable(i) for i in x]
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (int, float, str, bool)) or x is None:
        return x
    return type(x).__name__


def _find(d, key):
    """The first value of ``key`` in a nested dict/list (depth first), else None."""
    if isinstance(d, dict):
        if key in d:
            return d[key]
        d = list(d.values())
    if isinstance(d, list):
        for x in d:
            got = _find(x, key) if isinstance(x, (dict, list)) else None
            if got is not None:
                return got
    return None


def _rope_03(rope: dict) -> list:
    """0.3's ``RoPE.Config`` scaling (``models/common/rope.py``) as a list: ``[]`` none;
    ``["llama3", factor, low, high, original positions]``; ``["yarn", factor, original
    positions, beta fast, beta slow, truncate]``."""
    kind = rope.get("scaling") or "none"
    if kind == "llama":
        return ["llama3", rope["scaling_factor"], rope["low_freq_factor"],
                rope["high_freq_factor"], rope["original_max_position_embeddings"]]
    if kind == "yarn" and (rope.get("rope_factor") or 1.0) > 1.0:
        return ["yarn", rope["rope_factor"], rope["original_seq_len"], rope["beta_fast"],
                rope["beta_slow"], rope.get("truncate", True)]
    return []


def _rope_02(a: dict) -> list:
    """0.2's model arguments' RoPE scaling, as :func:`_rope_03`'s list (llama3's
    ``rope_scaling_args``; DeepSeek-V3's and gpt-oss's YaRN ``rope_factor`` and betas)."""
    r = a.get("rope_scaling_args")
    if r:
        return ["llama3", r["scaling_factor"], r["low_freq_factor"], r["high_freq_factor"],
                r["original_max_position_embeddings"]]
    if (a.get("rope_factor") or 1.0) > 1.0:
        # gpt_oss 0.2.2 names YaRN's betas ntk_beta (fast) and ntk_alpha (slow)
        return ["yarn", a["rope_factor"], a.get("original_seq_len", 4096),
                a.get("beta_fast", a.get("ntk_beta", 32.0)),
                a.get("beta_slow", a.get("ntk_alpha", 1.0)), a.get("truncate", True)]
    return []


def _model_summary(mc: dict) -> dict:
    """The architecture of torchtitan's model config (``model_spec.model``, as JSON): block
    count, widths, heads, RoPE base and scaling, QK-norm, MLA ranks, dense first blocks, routed
    and shared experts, tied embeddings."""
    layers = mc.get("layers") or []
    layers = list(layers.values()) if isinstance(layers, dict) else layers
    attn = layers[0].get("attention") or {}
    dense = [x for x in layers if not x.get("moe")]
    moe = next((x["moe"] for x in layers if x.get("moe")), None)
    ff = dense[0].get("feed_forward") if dense else None
    shared = moe.get("shared_experts") if moe else None
    rope = _find(attn, "rope") or {}
    return {"layers": len(layers), "dim": mc.get("dim"), "vocab_size": mc.get("vocab_size"),
            "n_heads": _find(attn, "n_heads"), "n_kv_heads": _find(attn, "n_kv_heads"),
            "head_dim": _find(attn, "head_dim"), "rope_theta": rope.get("theta"),
            "rope_scaling": rope.get("scaling"), "qk_norm": _find(attn, "qk_norm") is not None,
            "rope": _rope_03(rope),
            "q_lora_rank": attn.get("q_lora_rank"), "kv_lora_rank": attn.get("kv_lora_rank"),
            "dense_layers": len(dense) if moe else 0,
            "ffn_hidden": ff["w1"]["out_features"] if ff else None,
            "num_experts": moe.get("num_experts") if moe else None,
            "top_k": _find(moe.get("router"), "top_k") if moe else None,
            "moe_hidden": _find(moe.get("routed_experts"), "hidden_dim") if moe else None,
            "shared_hidden": shared["w1"]["out_features"] if shared else None,
            "tied_embeddings": bool(mc.get("enable_weight_tying", False)),
            # each block's sliding window (0: full attention), as its attention config says
            "windows": [_find(x.get("attention") or {}, "sliding_window_size") or 0
                        for x in layers]}


def _args_summary(name: str, flavor: str) -> dict:
    """torchtitan 0.2's model arguments for ``name``/``flavor`` (its train spec's
    ``model_args``), with :func:`_model_summary`'s keys (None where 0.2 derives the value at
    build time: Llama's FFN width from ``multiple_of``)."""
    from torchtitan.protocols.train_spec import get_train_spec

    a = _jsonable(get_train_spec(name).model_args[flavor])
    moe = a.get("moe_args") if (a.get("moe_enabled") or "n_dense_layers" in a
                                or name == "gpt_oss") else None
    inter = a.get("moe_inter_dim")
    return {"layers": a["n_layers"], "dim": a["dim"], "vocab_size": a["vocab_size"],
            "n_heads": a["n_heads"], "n_kv_heads": a.get("n_kv_heads") or a["n_heads"],
            "head_dim": a.get("head_dim"), "rope_theta": a.get("rope_theta"),
            "rope_scaling": "llama" if a.get("rope_scaling_args") else None,
            "rope": _rope_02(a),
            "qk_norm": bool(a.get("qk_norm", False)), "q_lora_rank": a.get("q_lora_rank"),
            "kv_lora_rank": a.get("kv_lora_rank"),
            "dense_layers": a.get("n_dense_layers", 0) if moe else 0,
            "ffn_hidden": a.get("inter_dim") or a.get("hidden_dim"),
            "num_experts": moe["num_experts"] if moe else None,
            "top_k": moe["top_k"] if moe else None, "moe_hidden": inter if moe else None,
            "shared_hidden": (moe["num_shared_experts"] * inter or None) if moe else None,
            "tied_embeddings": bool(a.get("enable_weight_tying", False)),
            # gpt_oss 0.2.2 (model/model.py, TransformerBlock): sliding_window_size on the blocks
            # with layer_id % 2 == 0, full attention on the others; no other 0.2 model slides
            "windows": [a["sliding_window_size"] if name == "gpt_oss" and i % 2 == 0 else 0
                        for i in range(a["n_layers"])]}


def _mesh(parallelism, world: int) -> dict:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from torchtitan.distributed import ParallelDims

    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    if hasattr(ParallelDims, "from_config"):
        dims = ParallelDims.from_config(parallelism, world)
    else:
        dims = ParallelDims(dp_shard=parallelism.data_parallel_shard_degree,
                            dp_replicate=parallelism.data_parallel_replicate_degree,
                            cp=parallelism.context_parallel_degree,
                            tp=parallelism.tensor_parallel_degree,
                            pp=parallelism.pipeline_parallel_degree,
                            ep=parallelism.expert_parallel_degree,
                            etp=parallelism.expert_tensor_parallel_degree, world_size=world)
    import torchtitan.distributed.parallel_dims as pd
    pd.device_type = "cpu"
    mesh = dims.build_mesh() if hasattr(dims, "build_mesh") else dims.world_mesh
    dist.destroy_process_group()
    return {"mesh_shape": list(mesh.shape), "mesh_dims": list(mesh.mesh_dim_names or ()),
            "dp_shard": dims.dp_shard, "dp_replicate": dims.dp_replicate}


def check(entry: dict, version: str) -> dict:
    from torchtitan.config.manager import ConfigManager

    path = entry["path"]
    if version.startswith("0.2"):
        argv = ["--job.config_file", path]
    else:
        sys.path.insert(0, os.path.dirname(path))
        argv = ["--module", os.path.basename(path)[:-3], "--config", "mpmd_plan"]
    log = io.StringIO()
    try:
        with redirect_stdout(log), redirect_stderr(log):
            cfg = ConfigManager().parse_args(argv)
            mesh = _mesh(cfg.parallelism, entry["world_size"])
            t, p = cfg.training, cfg.parallelism
            batch = p.data_parallel_replicate_degree * mesh["dp_shard"]
            gbs = t.global_batch_size if t.global_batch_size > 0 else t.local_batch_size * batch
            assert gbs % (t.local_batch_size * batch) == 0, (
                f"global batch size must be multiple of local batch size times data-parallel "
                f"degree ({gbs} % ({t.local_batch_size} * {batch}) != 0)")   # the trainer's check
            accumulation = gbs // (t.local_batch_size * batch)
    except SystemExit as e:
        box = [ln.strip("│ ") for ln in log.getvalue().splitlines() if ln.startswith("│")]
        return {"path": path, "ok": False,
                "error": f"exit {e.code}: {' '.join(box)[:600] or log.getvalue()[-600:]}"}
    except BaseException as e:
        tb = traceback.extract_tb(e.__traceback__)[-1]
        return {"path": path, "ok": False,
                "error": f"{type(e).__name__}: {e} ({os.path.basename(tb.filename)}:{tb.lineno})"}
    model = (_model_summary(_jsonable(cfg.model_spec.model)) if hasattr(cfg, "model_spec")
             else _args_summary(cfg.model.name, cfg.model.flavor))
    flavor = (cfg.model_spec.flavor if hasattr(cfg, "model_spec") else cfg.model.flavor)
    name = (cfg.model_spec.name if hasattr(cfg, "model_spec") else cfg.model.name)
    ac = cfg.activation_checkpoint
    return {"path": path, "ok": True, "values": {
        "model": name, "flavor": flavor, "model_config": model,
        "converters": (list(cfg.model.converters) if version.startswith("0.2") else None),
        "training": _jsonable(t), "parallelism": _jsonable(p), "accumulation": accumulation,
        "activation_checkpoint": (getattr(ac, "mode", None) if ac is not None else "none")
        if version.startswith("0.2") else ("none" if ac is None else type(ac).__qualname__),
        **mesh}}


def main() -> None:
    from importlib.metadata import version as dist_version

    import torchtitan
    version = getattr(torchtitan, "__version__", None) or dist_version("torchtitan")
    entries = json.load(open(sys.argv[1]))
    out = {"launcher": f"torchtitan {version}", "results": [check(e, version) for e in entries]}
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
