"""Pieces of a layer that production stacks run as one fused kernel, costed as that kernel.

A zoo layer is written in plain JAX, so its trace charges every intermediate of a chunked scan
(Mamba-2's SSD, Gated DeltaNet's delta rule), a causal convolution or a gated norm as HBM
traffic and as a primitive op. Production runs each as one kernel (``mamba_ssm``'s
``mamba_chunk_scan_combined`` and ``causal_conv1d``, flash-linear-attention's
``chunk_gated_delta_rule``, the fused gated RMSNorm), which keeps its intermediates on chip.
:func:`correction` turns the traced figures of such pieces into the kernels': HBM bytes become
the kernel's I/O, the unfused traffic leaves the "other" bytes, the primitive ops count one
launch, and a scan's FLOP move to the attention-kernel figures (they run at the device's
fused-kernel rate and stay in BF16 under every precision recipe, as the attention core's do).
The layer wraps each piece in ``jax.checkpoint`` so its backward keeps only the piece's inputs
and recomputes the rest, as those kernels' backwards do.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import jax

from zoo.tracing import nbytes, trace_costs, vjp_parts

__all__ = ["Piece", "correction"]

Piece = tuple[Callable[..., Any], tuple[jax.ShapeDtypeStruct, ...], bool]
"""``(function, its inputs, whether it is a scan whose FLOP run at the fused-kernel rate)``."""


def correction(pieces: Iterable[Piece], training: bool) -> dict[str, float]:
    """The corrections to a traced layer's probe figures (:mod:`zoo.costing`'s keys:
    ``fwd_bytes``, ``fwd_other``, ``fwd_ops``, ``attn_fwd_flops`` and the ``bwd_*`` /
    ``bwdx_other`` ones), summed over ``pieces``: each piece's forward HBM bytes become its
    inputs and output, its backward's the inputs, the output, its gradient and the input
    gradients; its unfused traffic is removed from the other bytes (all of the backward's is
    input-gradient work: the pieces hold no weights, or are charged as if they did not); its
    primitive ops become one; a scan's FLOP are added to the attention-kernel figures."""
    fix: dict[str, float] = {}

    def add(key: str, value: float) -> None:
        fix[key] = fix.get(key, 0.0) + value

    for fn, ins, scan in pieces:
        out = float(nbytes(jax.eval_shape(fn, *ins)))
        flops, plain, other, ops = trace_costs(fn, *ins)
        add("fwd_bytes", nbytes(ins) + out - plain)
        add("fwd_other", -other)
        add("fwd_ops", 1.0 - ops)
        if scan:
            add("attn_fwd_flops", flops)
        if not training:
            continue
        bwd_fn, leaves, ct = vjp_parts(lambda p, *a: fn(*a), {}, ins, (), True)
        flops, plain, other, ops = trace_costs(bwd_fn, leaves, ct)
        add("bwd_bytes", 2.0 * nbytes(ins) + out - plain)
        add("bwd_other", -other)
        add("bwdx_other", -other)
        add("bwd_ops", 1.0 - ops)
        if scan:
            add("attn_bwd_flops", flops)
    return fix
