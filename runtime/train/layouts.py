"""A plan's per-mesh layouts as JAX meshes and ``PartitionSpec`` s: what ``mpmd run`` compiles.

Each mesh of a plan has a :class:`~ir.Layout` (data x tensor, with or without FSDP, with
hybrid sharding ``hsdp``). :func:`layout_mesh` shapes the mesh's devices as the layout says, with
the axes

- ``"data"``: data parallel (the microbatch's batch dimension is split over it); with FSDP the
  parameters, gradients and Adam state are also sharded over it, and XLA's SPMD partitioner
  gathers them inside each fragment (ZeRO-3; Rajbhandari et al. 2020);
- ``"replica"`` (only when ``hsdp > 1``): the ``hsdp`` replicas of hybrid sharded data parallel;
  the batch is split over ``("replica", "data")``, the parameters over ``"data"`` only;
- ``"context"`` (only when ``context > 1``): context parallel (between the data axes and
  ``"model"``: Megatron-Core's ``tp-cp-ep-dp`` rank order, tensor innermost): each microbatch's
  sequence dimension is split over it (:func:`batch_spec`), the parameters are replicated over
  it (with FSDP, sharded over ``("data", "context")``, as torchtitan's ``dp_shard_cp``), and each
  layer's attention reaches the other tokens by the layout's ``context_method``
  (``zoo.context_parallel``, :mod:`runtime.train.context`);
- ``"expert"`` (only when ``expert > 1``): expert parallel: the batch is split over
  ``("data", "expert")`` and a mixture of experts' expert weights over ``"expert"``; the layer
  reshards its dispatch buffers to the experts' devices and back (``zoo.layers.moe_swiglu``'s
  sharding constraints), which XLA's partitioner makes two all-to-alls (the dispatch and combine);
- ``"model"``: Megatron-LM tensor parallel (Shoeybi et al. 2019, section 3): the attention's Q, K
  and V projections and the MLP's first matrices are column-parallel (output features split), the
  attention output and the MLP's last matrix row-parallel (input features split), the embedding
  table and the output head vocabulary-parallel. Norm weights are replicated over ``"model"``.

Only the placement is chosen here: XLA's SPMD partitioner inserts every collective (the
tensor-parallel all-reduces, the FSDP all-gathers and reduce-scatters, the data-parallel gradient
all-reduce) inside each fragment, and transfers between meshes of different layouts reshard with
``jax.device_put`` to the destination's ``NamedSharding``. An axis is only used on a dimension it
divides (and, for attention projections, on whole heads), else the dimension stays whole: the
program is correct for every layout, only the collectives change.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
from jax.sharding import Mesh, PartitionSpec

from hardware_profiles.types import Cluster
from ir import Layout, Plan
from zoo.config import ModelConfig
from zoo.context_parallel import CONTEXT_AXIS as CONTEXT
from zoo.layers import DATA_AXIS as DATA, EXPERT_AXIS as EXPERT

MODEL, REPLICA = "model", "replica"

_EXPERT_WEIGHTS = ("w_gate", "w_up", "w_down")
"""A mixture of experts' weights (zoo.decoder, ``[experts, ...]``): expert parallel splits
their first dimension over ``"expert"``; tensor parallel splits each expert's feature dimension
(the last of ``w_gate`` / ``w_up``, the middle of ``w_down``)."""

# Megatron tensor parallel for the zoo's decoder parameters (zoo.decoder): which dimension
# of a weight the "model" axis splits. "col": the output features (last dim), "row": the input
# features (first dim), "vocab": the vocabulary dimension; missing names are replicated over "model".
_COLUMN = {"wq": "q", "wk": "kv", "wv": "kv", "w_gate": "ffn", "w_up": "ffn", "w_in": "ffn",
           # multi-head latent attention's up-projections (per head) and shared experts
           "wq_b": "q", "wkv_b": "q", "ws_gate": "ffn", "ws_up": "ffn",
           # Mochi's asymmetric DiT block (zoo.mochi): both streams' SwiGLU MLPs; its
           # attention keeps a fused QKV and stays whole (its columns are not head-aligned)
           "mlp_x_gate": "ffn", "mlp_x_up": "ffn", "mlp_y_gate": "ffn", "mlp_y_up": "ffn"}
_COLUMN_BIAS = {"wq_b": "q", "wk_b": "kv", "wv_b": "kv", "w_in_b": "ffn"}
_ROW = {"wo": "q", "w_down": "ffn", "w_out": "ffn", "ws_down": "ffn", "mlp_x_down": "ffn",
        "mlp_y_down": "ffn"}


def too_few_devices(cluster: str, need: int, have: int) -> str:
    """The one-line error for a plan whose cluster has more devices than this host's JAX."""
    return (f"cluster {cluster!r} needs {need} devices and this host's JAX has {have} (mpmd run "
            f"gives it 8 CPU devices): the plan is for the cluster it names, not this host; fix: "
            f"plan for a cluster of at most {have} devices (mpmd calibrate writes "
            f"calibrated/cpu4x2.yaml) and run that, or run this plan where {need} devices are "
            f"(one process per host: --processes)")


def layout_axes(layout: Layout) -> dict[str, int]:
    """The mesh axes (name -> size, in device order) of ``layout``: ``{"data": d, "model": t}``,
    ``{"replica": hsdp, "data": d / hsdp, "model": t}`` with hybrid sharding, or
    ``{"data": d / e, "expert": e, "model": t}`` with expert parallelism; with context
    parallelism (``context`` = c > 1) ``{..., "context": c, "model": t}`` (the context axis
    right outside ``"model"``).

    Raises:
        ValueError: a layout with MoE parallel folding (``layout.folded``): the runtime splits
            the experts over the data axis only."""
    if layout.expert > 1 and layout.folded:
        raise ValueError(f"layout {layout}: MoE parallel folding (expert tensor parallel "
                         f"{layout.etp} != tensor {layout.tensor}) is planned and exported, not run "
                         f"by mpmd run, whose experts split the data axis; fix: run a plan whose "
                         f"expert degree divides its data degree with expert_tensor left out")
    cp = {CONTEXT: layout.context} if layout.context > 1 else {}
    if layout.hsdp > 1:
        return {REPLICA: layout.hsdp, DATA: layout.data // layout.hsdp, **cp, MODEL: layout.tensor}
    if layout.expert > 1:
        return {DATA: layout.data // layout.expert, EXPERT: layout.expert, **cp,
                MODEL: layout.tensor}
    return {DATA: layout.data, **cp, MODEL: layout.tensor}


def plan_mesh_axes(plan: Plan, cluster: Cluster) -> dict[str, dict[str, int]]:
    """Mesh name -> :func:`layout_axes` of the plan's layout for it (a mesh the plan leaves idle:
    one ``data`` axis over all its devices)."""
    return {name: layout_axes(plan.layouts.get(name, Layout(spec.num_devices, 1)))
            for name, spec in cluster.meshes.items()}


def layout_mesh(devices: Sequence[Any], layout: Layout) -> Mesh:
    """The ``jax.sharding.Mesh`` of ``devices`` shaped as ``layout``: axes ``("data", "model")`` of
    sizes ``(data, tensor)``, or ``("replica", "data", "model")`` of sizes
    ``(hsdp, data / hsdp, tensor)`` for hybrid sharding, with ``"context"`` before ``"model"``
    for context parallelism (:func:`layout_axes`).

    Raises:
        ValueError: ``len(devices) != layout.devices``.
    """
    devs = np.array(list(devices))
    if devs.size != layout.devices:
        raise ValueError(f"layout {layout} needs {layout.devices} devices, got "
                         f"{devs.size}")
    axes = layout_axes(layout)
    return Mesh(devs.reshape(tuple(axes.values())), tuple(axes))


def batch_spec(layout: Layout) -> PartitionSpec:
    """The spec of a microbatch array ``[b, s, ...]``: the batch split over every data axis, and
    with context parallelism the sequence over ``"context"``."""
    if layout.hsdp > 1:
        rows: Any = (REPLICA, DATA)
    else:
        rows = (DATA, EXPERT) if layout.expert > 1 else DATA
    return PartitionSpec(rows, CONTEXT) if layout.context > 1 else PartitionSpec(rows)


def _tp_dim(cfg: ModelConfig, name: str, shape: tuple[int, ...], tensor: int) -> int | None:
    """The dimension of parameter ``name`` that tensor parallel splits, or None (replicated)."""
    if tensor <= 1:
        return None
    heads = {"q": cfg.heads, "kv": cfg.kv_heads, "ffn": None}
    def whole(kind: str, n: int) -> bool:   # whole heads per device, and divisible features
        return n % tensor == 0 and (heads[kind] is None or heads[kind] % tensor == 0)
    if name in _COLUMN and whole(_COLUMN[name], shape[-1]):
        return len(shape) - 1
    if name in _COLUMN_BIAS and whole(_COLUMN_BIAS[name], shape[0]):
        return 0
    if name in _ROW and whole(_ROW[name], shape[0]):
        return 0
    if name == "tok" and shape[0] % tensor == 0:     # embedding [vocab, h]
        return 0
    if name == "out" and shape[-1] % tensor == 0:    # head [h, vocab]
        return len(shape) - 1
    return None


def param_spec(cfg: ModelConfig, name: str, shape: tuple[int, ...], layout: Layout) -> PartitionSpec:
    """The ``PartitionSpec`` of one parameter (see the module docstring).

    Tensor parallel takes its Megatron dimension first (decoders: attention and MLP; Mochi's DiT:
    the MLPs); FSDP then shards the largest other dimension that ``layout.shard`` divides (over
    ``"data"``, and ``"context"`` too with context parallelism). 0-d parameters are replicated.
    """
    dims: list[str | None] = [None] * len(shape)
    if name in _EXPERT_WEIGHTS and len(shape) == 3:       # [experts, ...] of a mixture of experts
        if layout.expert > 1 and shape[0] % layout.expert == 0:
            dims[0] = EXPERT
        f = 2 if name != "w_down" else 1
        if layout.tensor > 1 and shape[f] % layout.tensor == 0:
            dims[f] = MODEL
        tp = None
    else:
        tp = _tp_dim(cfg, name, shape, layout.tensor)
    if tp is not None:
        dims[tp] = MODEL
    if layout.fsdp and layout.shard > 1:
        free = [d for d in range(len(shape)) if dims[d] is None and shape[d] % layout.shard == 0]
        if free:
            dims[max(free, key=lambda d: (shape[d], -d))] = \
                (DATA, CONTEXT) if layout.context > 1 else DATA
    while dims and dims[-1] is None:
        dims.pop()
    return PartitionSpec(*dims)


def layer_meshes(plan: Plan, layer_names: Sequence[str]) -> dict[str, str]:
    """Layer name -> the mesh of the stage that holds it."""
    out = {}
    for st in plan.stages:
        for i in range(st.first, st.last):
            out[layer_names[i]] = st.mesh
    return out


def param_specs(cfg: ModelConfig, plan: Plan, params: Mapping[str, Any],
                layer_names: Sequence[str]) -> dict[str, Any]:
    """The zoo parameter pytree (``{"embed", "blocks": [...], "head"}``) with each leaf replaced
    by its ``PartitionSpec`` under the layout of the mesh its layer is placed on."""
    where = layer_meshes(plan, layer_names)

    def layer(name: str, p: Mapping[str, Any]) -> dict[str, PartitionSpec]:
        lay = plan.layouts[where[name]]
        return {k: param_spec(cfg, k, tuple(v.shape), lay) for k, v in p.items()}
    return {"embed": layer("embed", params["embed"]),
            "blocks": [layer(f"block{i}", b) for i, b in enumerate(params["blocks"])],
            "head": layer("head", params["head"])}


def topology_for_plan(plan: Plan, cluster: Cluster, devices: Sequence[Any]) -> dict[str, Mesh]:
    """Mesh name -> ``Mesh`` over consecutive ``devices`` in the cluster's mesh order, each shaped
    by the plan's layout for it (meshes the plan leaves idle keep one ``data`` axis).

    Raises:
        ValueError: fewer devices than the cluster has, or a layout whose size is not its mesh's.
    """
    devices = list(devices)
    if len(devices) < cluster.num_devices:
        raise ValueError(too_few_devices(cluster.name, cluster.num_devices, len(devices)))
    out, i = {}, 0
    for name, spec in cluster.meshes.items():
        devs = devices[i:i + spec.num_devices]
        i += spec.num_devices
        lay = plan.layouts.get(name, Layout(data=spec.num_devices, tensor=1))
        if lay.devices != spec.num_devices:
            raise ValueError(f"mesh {name!r} has {spec.num_devices} devices but the plan's layout "
                             f"{lay} needs {lay.devices}; use the plan's cluster")
        out[name] = layout_mesh(devs, lay)
    return out
