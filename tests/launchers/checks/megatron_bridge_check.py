"""Run inside the launcher environment (scripts/launchers_env.sh), not by pytest: each
Megatron-Bridge overrides file through Megatron-Bridge's own configuration code, then the
resulting ConfigContainer's values as JSON on stdout.

For each file: the recipe its header names is called (``megatron.bridge.recipes.NAME()``: the
real recipe, whose model is built by ``AutoBridge.from_hf_pretrained(...)
.to_megatron_provider(load_weights=False)`` from the model's Hugging Face config), the
overrides (as the file's launch line hands them to ``run_recipe.py``: the manifest's ``argv``)
are applied by ``process_config_with_overrides`` (OmegaConf in struct mode: an unknown key is an
error), ``model.seq_length`` is taken from ``dataset.seq_length`` as the runner does, and
``runtime_config_update`` resolves the mixed-precision recipe, sets the data-parallel size for
the world size and runs ``ConfigContainer.validate()``.

No network and no CUDA here: the Hugging Face configs come from an offline hub cache built from
the manifest's ``hf_configs`` (repository -> a published ``config.json`` file: the zoo's shipped
configs, ``pinned/hf/*.json``), stored under every revision the recipes pin; Transformer Engine
is the import-only stand-in in ``checks/stubs`` (on ``PYTHONPATH``).

Usage: python megatron_bridge_check.py MANIFEST.json, the manifest
{"hf_configs": {...}, "entries": [{"path", "argv", "world_size", "gpu"}, ...]} (``gpu``: the
part's device kind, the GPU :data:`GPUS` describes to Bridge's checks) (or a bare list of
entries); prints {"launcher", "results": [{"path", "ok", "error" | "values"}]}, or
{"unavailable": reason} when megatron-bridge does not import."""

from __future__ import annotations

import io
import json
import os
import re
import sys
import tempfile
import traceback
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path


def _hub_cache(configs: dict[str, str], recipes_dir: Path) -> str:
    """An offline Hugging Face hub cache holding each repository's config.json at ``main`` and
    at every revision a recipe pins for it (``_X_MODEL_ID`` / ``_X_MODEL_REVISION`` pairs)."""
    pins: dict[str, set[str]] = {}
    for f in recipes_dir.rglob("*.py"):
        text = f.read_text()
        ids = dict(re.findall(r'^(_\w+)_MODEL_ID = "([^"]+)"', text, re.M))
        for stem, rev in re.findall(r'^(_\w+)_MODEL_REVISION = "([0-9a-f]{40})"', text, re.M):
            if stem in ids:
                pins.setdefault(ids[stem], set()).add(rev)
    root = Path(tempfile.mkdtemp(prefix="mpmd-hf-"))
    for repo, path in configs.items():
        d = root / "hub" / f"models--{repo.replace('/', '--')}"
        main = "0" * 40
        for rev in {main, *pins.get(repo, ())}:
            (d / "snapshots" / rev).mkdir(parents=True, exist_ok=True)
            (d / "snapshots" / rev / "config.json").write_text(Path(path).read_text())
        (d / "refs").mkdir(exist_ok=True)
        (d / "refs" / "main").write_text(main)
    return str(root)


def _value(x):
    if isinstance(x, (int, float, str, bool)) or x is None:
        return x
    if isinstance(x, (list, tuple)):
        return [_value(i) for i in x]
    return str(x)


MODEL_KEYS = ("tensor_model_parallel_size", "pipeline_model_parallel_size",
              "virtual_pipeline_model_parallel_size", "context_parallel_size", "cp_comm_type",
              "expert_model_parallel_size", "expert_tensor_parallel_size", "sequence_parallel",
              "pipeline_model_parallel_layout", "seq_length", "recompute_granularity",
              "recompute_method", "recompute_num_layers", "num_layers", "hidden_size",
              "ffn_hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
              "vocab_size", "share_embeddings_and_output_weights", "qk_layernorm",
              "rotary_base", "num_moe_experts", "moe_router_topk", "moe_ffn_hidden_size",
              "moe_shared_expert_intermediate_size", "moe_layer_freq", "mtp_num_layers",
              "multi_latent_attention", "q_lora_rank", "kv_lora_rank", "window_size",
              "moe_token_dispatcher_type", "fp8", "fp8_recipe", "fp4", "fp4_recipe", "bf16",
              "fp16", "position_embedding_type", "rope_scaling", "rope_scaling_factor",
              "seq_len_interpolation_factor", "yarn_rotary_scaling_factor",
              "yarn_original_max_position_embeddings", "yarn_beta_fast", "yarn_beta_slow",
              "yarn_correction_range_round_to_int", "rope_type", "rotary_scaling_factor",
              "original_max_position_embeddings", "beta_fast", "beta_slow")


GPUS = {"gb300": (10, "NVIDIA GB300"), "gb200": (10, "NVIDIA GB200"), "b200": (10, "NVIDIA B200"),
        "h800": (9, "NVIDIA H800"), "h200": (9, "NVIDIA H200"), "h100": (9, "NVIDIA H100 80GB HBM3"),
        "a100": (8, "NVIDIA A100-SXM4-80GB"), "l40s": (8, "NVIDIA L40S"),
        "v100": (7, "Tesla V100-SXM2-32GB")}
"""Device profile prefix -> (compute capability major, CUDA device name): what
``torch.cuda.get_device_properties(0)`` would say on the part's GPUs (Bridge's validation asks it
which MoE dispatcher backends the GPU runs)."""


def _patch_gpu(kind: str) -> None:
    import types

    import torch

    major, name = next(g for k, g in GPUS.items() if kind.lower().startswith(k))
    props = types.SimpleNamespace(major=major, minor=0, name=name)
    torch.cuda.get_device_properties = lambda *a, **k: props
    torch.cuda.get_device_capability = lambda *a, **k: (major, 0)
    torch.cuda.get_device_name = lambda *a, **k: name


def check(entry: dict) -> dict:
    from megatron.bridge import recipes
    from megatron.bridge.training.config import runtime_config_update
    from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides

    _patch_gpu(entry.get("gpu", "h100"))
    os.environ["WORLD_SIZE"] = str(entry["world_size"])
    os.environ["RANK"] = "0"
    argv = entry["argv"]
    recipe = argv[argv.index("--recipe") + 1]
    overrides = [w for w in argv if "=" in w and not w.startswith("-")]
    log = io.StringIO()
    try:
        with redirect_stdout(log), redirect_stderr(log):
            cfg = getattr(recipes, recipe)()
            cfg = process_config_with_overrides(cfg, cli_overrides=overrides)
            cfg.model.seq_length = cfg.dataset.seq_length      # run_recipe.py's sync
            runtime_config_update(cfg)
    except BaseException as e:   # the launcher's own refusal: an assertion, a ValueError, ...
        tb = traceback.extract_tb(e.__traceback__)[-1]
        return {"path": entry["path"], "ok": False,
                "error": f"{type(e).__name__}: {str(e)[:800]} "
                         f"({os.path.basename(tb.filename)}:{tb.lineno})"}
    m, mp = cfg.model, cfg.mixed_precision
    values = {k: _value(getattr(m, k, None)) for k in MODEL_KEYS}
    values |= {"recipe": recipe, "micro_batch_size": cfg.train.micro_batch_size,
               "global_batch_size": cfg.train.global_batch_size,
               "dataset_seq_length": cfg.dataset.seq_length,
               "data_parallel_size": cfg.data_parallel_size,
               "use_megatron_fsdp": bool(cfg.ddp.use_megatron_fsdp),
               "use_distributed_optimizer": bool(cfg.ddp.use_distributed_optimizer),
               "mp_fp8": _value(mp.fp8), "mp_fp8_recipe": _value(mp.fp8_recipe),
               "mp_fp4": _value(mp.fp4), "mp_fp4_recipe": _value(mp.fp4_recipe),
               "mp_bf16": bool(mp.bf16), "mp_fp16": bool(mp.fp16)}
    return {"path": entry["path"], "ok": True, "values": values}


def main() -> None:
    from importlib.metadata import version

    doc = json.load(open(sys.argv[1]))
    entries = doc["entries"] if isinstance(doc, dict) else doc
    import importlib.util

    spec = importlib.util.find_spec("megatron.bridge")
    if spec is None or not spec.submodule_search_locations:
        sys.stdout.write(json.dumps({"unavailable": "megatron-bridge is not installed"}) + "\n")
        return
    # before anything imports huggingface_hub, which reads HF_HOME once
    os.environ["HF_HOME"] = _hub_cache(doc.get("hf_configs", {}) if isinstance(doc, dict)
                                       else {}, Path(spec.submodule_search_locations[0]) / "recipes")
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
            import megatron.bridge.recipes  # noqa: F401
    except Exception as e:    # noqa: BLE001: a dependency missing
        sys.stdout.write(json.dumps({"unavailable": f"{type(e).__name__}: {e}"}) + "\n")
        return
    out = {"launcher": f"megatron-bridge {version('megatron-bridge')}",
           "results": [check(e) for e in entries]}
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
