"""``mpmd models``: the models ``--model`` takes: the zoo's, the published configs shipped in
``zoo/configs/`` (by name or path), and the Hugging Face ``model_type`` values a ``config.json``
may have.

Counting parameters builds each model's parameter shapes (JAX), so the command imports JAX when
it runs; nothing is traced or allocated.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from mpmd.cli.common import console, guard

if TYPE_CHECKING:   # zoo.models imports JAX: the command loads it only when it runs
    from rich.table import Table

    from zoo.config import ModelConfig

COLUMNS = ("model", "family", "use", "layers", "hidden", "heads", "experts", "params",
           "active")
"""The columns of both tables (``heads``: query / key-value heads; ``experts``: how many routed
experts a token goes to, of how many, + shared ones; ``active``: the parameters one token uses)."""

WIDTH = 100
"""The widest line printed, in characters."""


def model_row(name: str, family: str, cfg: ModelConfig) -> tuple[str, ...]:
    """One row of :data:`COLUMNS`: ``name`` as ``--model`` takes it, ``family`` as given."""
    from mpmd.cli.output import params_text
    from zoo import active_param_count, param_count

    experts = f"{cfg.experts_per_token} of {cfg.experts}" if cfg.moe else "-"
    if cfg.shared_experts:
        experts += f" +{cfg.shared_experts}"
    return (name, family, "train" if cfg.training else "infer", str(cfg.layers),
            str(cfg.hidden), f"{cfg.heads}/{cfg.kv_heads}", experts,
            params_text(param_count(cfg)), params_text(active_param_count(cfg)))


def _table(title: str) -> Table:
    from rich import box
    from rich.table import Table

    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False,
              pad_edge=False, collapse_padding=True)
    for col in COLUMNS:
        t.add_column(col, justify="right" if col in ("layers", "hidden", "params", "active")
                     else "left", no_wrap=True)
    return t


def config_family(path: Path, cfg: ModelConfig) -> str:
    """A shipped config's family: its Hugging Face ``model_type`` (``deepseek_v3``), or
    ``llama spec`` / ``gpt spec`` for a YAML model spec."""
    from ir.files import read_json
    from zoo.model_files import model_type

    if path.suffix == ".json":
        return model_type(read_json(path, "model config"))
    return f"{cfg.family} spec"


def types_text() -> str:
    """What a model file may be: the Hugging Face ``model_type`` values a config.json may have,
    dense then mixtures of experts (:data:`zoo.model_files.SUPPORTED_TYPES`), or a YAML spec."""
    from zoo.model_files import MOE_TYPES, SPEC_FAMILIES, SUPPORTED_TYPES

    dense = [t for t in SUPPORTED_TYPES if t not in MOE_TYPES]
    return (f"a Hugging Face config.json of model_type {', '.join(dense)}, or of the mixtures of "
            f"experts {', '.join(MOE_TYPES)}; or a YAML model spec (family "
            f"{' or '.join(SPEC_FAMILIES)})")


@click.command()
@guard
def models() -> None:
    """List the models --model takes, with their sizes.

    The zoo's models and the published configs shipped in zoo/configs/ (by the name --model
    takes), each with its family, layers, width, query/key-value heads, experts and parameters
    (total, and active per token); then the model files --model also reads."""
    from zoo.config import get_config, list_models
    from zoo.model_files import load_model_file, shipped_models

    zoo = _table("zoo models (--model NAME)")
    for name in list_models():
        cfg = get_config(name)
        zoo.add_row(*model_row(name, cfg.family, cfg))
    shipped = _table("shipped configs, zoo/configs/ (--model NAME, or the file's path)")
    for name, path in sorted(shipped_models().items()):
        cfg = load_model_file(path)
        shipped.add_row(*model_row(name, config_family(path, cfg), cfg))
    console.print(zoo)
    console.print(shipped)
    width = min(console.width, WIDTH)
    console.print("heads: query/key-value; experts: the routed experts a token goes to, of all "
                  "(+ shared experts); active: the parameters one token uses.", highlight=False,
                  width=width)
    console.print(f"--model also takes a model file: {types_text()}.", highlight=False,
                  width=width)
