"""Whether a layout can run a model: the one rule the search, ``validate``, ``export`` and the
compiler share.

Tensor parallelism (Shoeybi et al. 2019, "Megatron-LM", Sec. 3) gives each of ``t`` devices
whole attention heads and a ``1/t`` slice of every MLP's inner width, so ``t`` must divide the
query heads and every inner width (the dense MLP's, each expert's, the Mochi text stream's).
Key/value heads are split the same way while ``t`` does not exceed them; past that each device
keeps one and a group of ``t / kv`` devices shares it (replicated, as Megatron-Core and vLLM do
for grouped-query attention), so then the key/value heads must divide ``t``. Expert parallelism
gives each of ``e`` devices ``experts / e`` whole experts, so ``e`` divides the experts. Context
parallelism splits each sequence ``c`` ways: into ``2c`` chunks for the causal zig-zag of the ring
and all-gather methods (so ``2c`` divides the sequence), into ``c`` for DeepSpeed-Ulysses'
all-to-all, which also gives each device ``heads / (t c)`` whole heads (so ``t c`` divides the
query heads, and the key/value heads as tensor parallelism divides them). The
vocabulary is not a constraint: launchers pad it to a multiple of ``128 t`` (Megatron-LM's
``make_vocab_size_divisible_by``), and the cost model charges the padded rows as noise.

A :class:`ShardDims` is what a model tells the planner (which never sees the model itself: a
:class:`ir.Workload` carries it); :func:`layout_problem` is the rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ir.errors import IRError

__all__ = ["ShardDims", "layout_problem", "layouts_problem"]


@dataclass(frozen=True, slots=True)
class ShardDims:
    """The dimensions tensor and expert parallelism split, of one model.

    Attributes:
        heads: query heads of an attention layer (> 0).
        kv_heads: key/value heads (> 0, dividing ``heads``).
        widths: every MLP inner width tensor parallelism slices (the dense MLP's, each expert's,
            a second stream's), elements.
        experts: routed experts per mixture-of-experts layer (0: dense).
        model: the model's name, for messages.
        expert_width: each routed expert's inner width (0: dense, or not known), what expert
            tensor parallelism slices when it differs from tensor parallelism.
    """

    heads: int
    kv_heads: int
    widths: tuple[int, ...]
    experts: int = 0
    model: str = ""
    expert_width: int = 0

    def __post_init__(self) -> None:
        if self.heads < 1 or self.kv_heads < 1 or self.heads % self.kv_heads:
            raise IRError(f"ShardDims({self.model!r}): heads {self.heads} and kv_heads "
                          f"{self.kv_heads} must be positive, the second dividing the first")
        if any(w < 1 for w in self.widths) or self.experts < 0:
            raise IRError(f"ShardDims({self.model!r}): widths {self.widths} must be positive and "
                          f"experts {self.experts} at least 0")


def layout_problem(dims: ShardDims | None, tensor: int, expert: int = 1,
                   expert_tensor: int = 0, context: int = 1, context_method: str = "ring",
                   seq_len: int = 0) -> str | None:
    """Why a layout of ``tensor``-way tensor and ``expert``-way expert parallelism cannot run the
    model of ``dims`` (module docstring), as a phrase for a message; None when it can (and
    always for ``dims`` None: a workload built without its model's dimensions).

    ``expert_tensor`` (0: ``tensor``): the experts' own tensor degree under MoE parallel folding
    (:class:`ir.Layout`), which must divide the expert width instead of ``tensor``.
    ``context`` / ``context_method``: the context-parallel degree and method (:class:`ir.Layout`);
    ``seq_len`` (0: not checked) the tokens per sample it splits.

    Raises:
        IRError: ``tensor``, ``expert`` or ``context`` below 1.
    """
    if tensor < 1 or expert < 1 or context < 1:
        raise IRError(f"layout_problem: tensor {tensor}, expert {expert} and context {context} "
                      f"must be at least 1")
    chunks = context * (1 if context_method == "alltoall" else 2)
    if context > 1 and seq_len and seq_len % chunks:
        return (f"context parallel {context} ({context_method}) splits the sequence into "
                f"{chunks} chunks, which do not divide {seq_len} tokens")
    if dims is None:
        return None
    name = f"{dims.model}'s " if dims.model else ""
    if context > 1 and context_method == "alltoall":
        why = layout_problem(dims, tensor * context)
        if why:
            return f"all-to-all context parallel {context} x {why}"
    if dims.heads % tensor:
        return f"tensor parallel {tensor} does not divide {name}{dims.heads} attention heads"
    if tensor <= dims.kv_heads and dims.kv_heads % tensor:
        return (f"tensor parallel {tensor} does not divide {name}{dims.kv_heads} key/value heads")
    if tensor > dims.kv_heads and tensor % dims.kv_heads:
        return (f"tensor parallel {tensor} is not a multiple of {name}{dims.kv_heads} key/value "
                f"heads (each is replicated over tensor / kv_heads devices)")
    folded = expert_tensor not in (0, tensor) and expert > 1
    for w in dims.widths:
        if w % tensor and not (folded and w == dims.expert_width):
            return f"tensor parallel {tensor} does not divide {name}MLP width {w}"
    if folded and dims.expert_width and dims.expert_width % expert_tensor:
        return (f"expert tensor parallel {expert_tensor} does not divide {name}expert width "
                f"{dims.expert_width}")
    if expert > 1 and (dims.experts == 0 or dims.experts % expert):
        return f"expert parallel {expert} does not divide {name}{dims.experts} experts"
    return None


def layouts_problem(dims: ShardDims | None, layouts: Mapping[str, Any]) -> str | None:
    """The first mesh of ``layouts`` (mesh name -> :class:`ir.Layout`, in order) whose layout
    cannot run the model of ``dims`` (:func:`layout_problem`), as one line with the fix; None
    when every one can. What ``export`` and ``mpmd run`` say of a hand-edited plan."""
    for mesh, lay in layouts.items():
        why = layout_problem(dims, lay.tensor, lay.expert, lay.expert_tensor, lay.context,
                             lay.context_method)
        if why:
            return (f"mesh {mesh}'s layout cannot run: {why}; fix: re-plan (mpmd plan only picks "
                    f"layouts that run) or edit its tensor degree")
    return None
