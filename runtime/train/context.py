"""Context parallelism in ``mpmd run``: which layers' attention splits the sequence, and how.

A mesh whose :class:`~ir.Layout` has ``context > 1`` gets a ``"context"`` axis
(:func:`runtime.train.layouts.layout_axes`), its microbatches' sequence dimension is split over it
(:func:`runtime.train.layouts.batch_spec`), and every layer placed on it is traced inside
``zoo.context_parallel.context_split`` with the mesh and the layout's ``context_method``
(:func:`layer_splits`, :func:`context_loss`), so its attention runs by that method
(``zoo.context_parallel``: ring, all-gather or DeepSpeed-Ulysses all-to-all). Every other layer
is traced as without context parallelism; a plain ``jax.jit`` of the same step (the run's
reference) has no mesh and computes the attention on the whole sequence.

:func:`context_problem` refuses what this runtime cannot run with context parallelism, in one
line: a model other than a (non-hybrid) decoder, a sequence the method cannot split, ring
attention with attention sinks, expert parallelism together with context parallelism.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import zoo
from compiler.named import named_computation
from ir import DataParallelPlan, Plan, layout_problem
from runtime.train.layouts import layer_meshes
from zoo.config import ModelConfig
from zoo.context_parallel import ContextSplit, context_split


def context_problem(plan: Plan | DataParallelPlan, cfg: ModelConfig) -> str | None:
    """Why ``mpmd run`` cannot run ``plan``'s context-parallel layouts for ``cfg`` (one line
    naming the mesh and the fix), or None (also for a plan without context parallelism)."""
    for part in plan.parts if isinstance(plan, DataParallelPlan) else (plan,):
        for mesh, lay in part.layouts.items():
            if lay.context <= 1:
                continue
            where = f"mesh {mesh}'s layout {lay} (context parallel {lay.context})"
            if cfg.family == "mochi" or cfg.hybrid:
                kind = "a Mochi DiT" if cfg.family == "mochi" else "a hybrid Mamba model"
                return (f"{where}: mpmd run splits the sequence of decoder attention only, and "
                        f"{cfg.name!r} is {kind}; fix: run a plan with context 1 for it")
            why = layout_problem(None, 1, context=lay.context, context_method=lay.context_method,
                                 seq_len=part.seq_len)
            if why:
                return f"{where}: {why}; fix: a seq_len that divides, or another context degree"
            if lay.context_method == "ring" and cfg.attention_sinks:
                return (f"{where}: ring attention has no attention sinks ({cfg.name!r} has); fix: "
                        f"context_method allgather or alltoall")
            if lay.expert > 1:
                return (f"{where}: expert parallel {lay.expert} with context parallel is planned "
                        f"and exported, not run by mpmd run; fix: expert 1 or context 1")
    return None


def layer_splits(plan: Plan, cfg: ModelConfig, topology: Mapping[str, Any]
                 ) -> dict[str, ContextSplit]:
    """Layer name -> the :class:`~zoo.context_parallel.ContextSplit` of the mesh it is placed on
    (``topology[mesh]``, with its layout's method), for the layers on context-parallel meshes;
    empty for a plan without context parallelism."""
    where = layer_meshes(plan, zoo.layer_names(cfg))
    out = {}
    for name, mesh in where.items():
        lay = plan.layouts.get(mesh)
        if lay is not None and lay.context > 1:
            out[name] = ContextSplit(lay.context_method, topology[mesh])
    return out


def _within(fn: Callable[..., Any], split: ContextSplit) -> Callable[..., Any]:
    def layer(*args: Any, **kwargs: Any) -> Any:
        with context_split(split):
            return fn(*args, **kwargs)
    return layer


def context_loss(cfg: ModelConfig, splits: Mapping[str, ContextSplit]
                 ) -> Callable[[Any, dict], Any]:
    """``zoo.forward_loss(cfg)`` with each layer of ``splits`` traced inside its
    :func:`~zoo.context_parallel.context_split` (the other layers as they are); each layer is a
    ``named_computation`` named as the zoo names it. ``splits`` empty: ``zoo.forward_loss``."""
    if not splits:
        return zoo.forward_loss(cfg)
    fns = {n: named_computation(f if n not in splits else _within(f, splits[n]), name=n)
           for n, f in zoo.layer_fns(cfg).items()}

    def loss(params, batch):
        x = fns["embed"](params["embed"], batch["tokens"])
        for i, p in enumerate(params["blocks"]):
            x = fns[f"block{i}"](p, x)
        return fns["head"](params["head"], x, batch["targets"])
    return loss
