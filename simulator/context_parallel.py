"""Context parallelism's exchange: what a layer's attention sends when each sequence is split over
``Layout.context`` devices.

Every other term of a layer is token-local, so the cost model charges it on the device's
``1 / context`` of the tokens (:func:`simulator.cost_model.layer_time` divides the samples it
costs by ``data x context``). What is left is how the attention of the local queries reaches the
keys and values of the whole sequence, over the ``context`` devices of a group (stride
``tensor``: the context ranks sit between the tensor and the data ranks, Megatron-Core's
``tp-cp-ep-dp`` order), by the layout's ``context_method``:

- ``"ring"`` (Liu et al. 2023, "Ring Attention with Blockwise Transformers"; Megatron-Core /
  Transformer Engine ``p2p``): the key/value chunks pass around the group in ``context - 1``
  point-to-point steps, each overlapped with the attention block of the chunk already held. The
  traffic is a ring all-gather's (every device receives the other ``context - 1`` chunks), run
  beside the attention core (:func:`simulator.cost_model.overlapped`), so only what the core
  cannot hide is charged. The backward passes the keys and values again and their gradients back:
  twice the traffic, beside the backward's core.
- ``"allgather"`` (Dubey et al. 2024, "The Llama 3 Herd of Models", sec. 3.3.2; Megatron-Core
  ``all_gather``): the whole sequence's keys and values all-gathered before the attention, on the
  critical path; the backward gathers them again and reduce-scatters their gradients.
- ``"alltoall"`` (Jacobs et al. 2023, "DeepSpeed Ulysses"; Megatron-Core ``a2a``): queries, keys
  and values all-to-all'ed from sequence-split to head-split before the attention core and its
  output back after, on the critical path; the backward runs the transposes.

The causal split is the zig-zag one (chunks ``i`` and ``2c - 1 - i`` on device ``i``: Megatron-
Core, torchtitan), so each device does ``1 / context`` of the attention work and no device waits
on another's larger share.
"""

from __future__ import annotations

from ir import LayerCost, Layout
from ir.schedule import FragmentKind
from hardware_profiles.collectives import span_collective
from hardware_profiles.types import MeshSpec


def _collective(mesh: MeshSpec, op: str, nbytes: float, group: int, stride: int) -> float:
    if group <= 1 or nbytes <= 0:
        return 0.0
    return span_collective(op, nbytes, mesh.collective_span(group, stride))


def context_kv_bytes(cost: LayerCost, local_samples: float, layout: Layout) -> float:
    """Bytes of the whole sequence's keys and values a device's attention needs for its
    ``local_samples`` sample-shares (``samples / (data x context)``), its tensor-parallel share of
    the heads: ``context_kv_bytes_per_sample x local_samples x context / tensor``."""
    return (cost.context_kv_bytes_per_sample * local_samples * layout.context
            / layout.tensor)


def context_exchange(cost: LayerCost, kind: str, local_samples: float, mesh: MeshSpec,
                     layout: Layout) -> tuple[float, float]:
    """``(bytes, seconds)`` of a layer's context-parallel exchange in a fragment of ``kind`` on one
    device, before any hiding under the attention core: the bytes the device sends and the
    collectives' seconds (module docstring; ``local_samples``: the device's sample-shares of
    the microbatch, ``samples / (data x context)``, each a ``1 / context`` slice of a sequence).
    ``(0, 0)`` for ``context`` 1, a weight-gradient fragment (``W``) or a layer without
    attention."""
    c, t = layout.context, layout.tensor
    if c <= 1 or kind == FragmentKind.W or cost.context_kv_bytes_per_sample <= 0:
        return 0.0, 0.0
    backward = kind == FragmentKind.B
    if layout.context_method == "alltoall":
        # q, k, v in (one fused all-to-all of their bytes) and the output back; the same in the
        # backward's input gradient
        qkvo = cost.context_qkvo_bytes_per_sample * local_samples / t
        kv = cost.context_kv_bytes_per_sample * local_samples / t
        q = (qkvo - kv) / 2.0
        seconds = (_collective(mesh, "all_to_all", q + kv, c, t)
                   + _collective(mesh, "all_to_all", q, c, t))
        return qkvo * (c - 1) / c, seconds
    kv_full = context_kv_bytes(cost, local_samples, layout)
    sent = kv_full * (c - 1) / c
    gather = _collective(mesh, "all_gather", kv_full, c, t)
    if layout.context_method == "allgather":
        if backward:
            return 2.0 * sent, gather + _collective(mesh, "reduce_scatter", kv_full, c, t)
        return sent, gather
    # ring: the backward passes the keys and values again and their gradients back
    return (2.0 * sent, 2.0 * gather) if backward else (sent, gather)


def context_parallel_comm(cost: LayerCost, kind: str, local_samples: float, mesh: MeshSpec,
                          layout: Layout, attention_s: float, interference: float) -> float:
    """Seconds a layer's context-parallel exchange adds to a fragment of ``kind`` on one device:
    :func:`context_exchange`'s seconds, of which a ring's run beside the attention core
    (``attention_s`` seconds of it on the device in this fragment) and cost only what it cannot
    hide (:func:`simulator.cost_model.overlapped`'s rule, with the device's
    ``comm_interference`` as ``interference``); the other methods' are on the critical path."""
    _, comm = context_exchange(cost, kind, local_samples, mesh, layout)
    if layout.context_method != "ring" or comm <= 0:
        return comm
    return max(attention_s + interference * min(attention_s, comm), comm) - attention_s


def context_working_bytes(cost: LayerCost, local_samples: float, layout: Layout) -> float:
    """Transient bytes the exchange adds to a layer's activation while it runs (the cost model's
    working set holds two of these, as it holds two activations: one in use, one arriving): the
    gathered keys and values of the whole sequence (``"allgather"``), a key/value chunk
    (``"ring"``), the head-split queries, keys and values (``"alltoall"``: as many bytes as the
    local ones). 0 for ``context`` 1."""
    if layout.context <= 1:
        return 0.0
    if layout.context_method == "allgather":
        return context_kv_bytes(cost, local_samples, layout)
    if layout.context_method == "ring":
        return cost.context_kv_bytes_per_sample * local_samples / layout.tensor
    return cost.context_qkvo_bytes_per_sample * local_samples / layout.tensor
