#!/usr/bin/env bash
# Installs the launchers' own configuration code, pinned, for the 'launchers' test suite
# (./scripts/test.sh -m launchers), outside the project's environment, under $MPMD_LAUNCHERS
# (default /tmp/mpmd-launchers). Everything comes from PyPI; nothing is fetched at test time.
#   py312/  Python 3.12: torch 2.13.0, megatron-core 0.19.2 (ships megatron/training/arguments.py:
#           Megatron-LM's parse_args/validate_args; needs Python >= 3.12), maxtext 0.2.5 (pyconfig),
#           megatron-bridge 0.6.2 (its recipes, ConfigContainer and override code; Transformer
#           Engine, a CUDA build it imports, is tests/launchers/checks/stubs' stand-in)
#   py311/  Python 3.11: torch 2.13.0, torchtitan's config dependencies
#   tt-0.3.0/, tt-0.2.2/  torchtitan 0.3.0 and 0.2.2 (pip --target, one on PYTHONPATH at a time)
set -euo pipefail
ROOT=${MPMD_LAUNCHERS:-/tmp/mpmd-launchers}
PY312=${PY312:-$(command -v python3.12 || echo "$HOME/.pyenv/versions/3.12.1/bin/python")}
PY311=${PY311:-$(command -v python3.11 || command -v python)}
mkdir -p "$ROOT"
[ -x "$ROOT/py312/bin/python" ] || "$PY312" -m venv "$ROOT/py312"
[ -x "$ROOT/py311/bin/python" ] || "$PY311" -m venv "$ROOT/py311"
P12="$ROOT/py312/bin/pip"; P11="$ROOT/py311/bin/pip"
# Megatron-LM (megatron-core's wheel) and MaxText, their config code's imports only (--no-deps:
# their full dependency sets pull CUDA and TPU stacks the config code does not use)
"$P12" install -q "torch==2.13.0" packaging numpy einops
"$P12" install -q --no-deps "megatron-core==0.19.2" "maxtext==0.2.5"
"$P12" install -q jax omegaconf pydantic absl-py flax pathwaysutils
# Megatron-Bridge: the wheel without its CUDA/TE/logging stack, then what its recipes import
"$P12" install -q --no-deps "megatron-bridge==0.6.2"
"$P12" install -q "hydra-core>=1.3.4,<1.4" "transformers>=5.8,<=5.12.1" datasets accelerate peft \
  six megatron-energon tensorboard diffusers nvidia-modelopt
# torchtitan: config dependencies, then each release in its own folder
"$P11" install -q "torch==2.13.0" tyro tomli torchdata "spmd_types==0.2.3" torch_checkpointing \
  safetensors einops tensorboard datasets tokenizers
rm -rf "$ROOT/tt-0.3.0" "$ROOT/tt-0.2.2"
"$P11" install -q --no-deps --target "$ROOT/tt-0.3.0" "torchtitan==0.3.0"
"$P11" install -q --no-deps --target "$ROOT/tt-0.2.2" "torchtitan==0.2.2"
echo "launchers installed under $ROOT"
