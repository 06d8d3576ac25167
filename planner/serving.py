"""Serving plans: how to deploy a decoder on a cluster's node groups to serve a request mix within
service-level objectives, colocated or with prefill and decode disaggregated across device kinds.

The space is small (kinds x tensor-parallel degrees x batch sizes x prefill/decode pairings:
hundreds of candidates), so it is searched exhaustively on the analytic steady state of
:mod:`simulator.serving_cost`, and each family's best is then replayed in the discrete-event
simulator (:func:`simulator.serving.simulate_serving`, Poisson arrivals) at its claimed rate, which
is lowered until the simulated p-th percentile TTFT and TPOT meet the objectives.

Steady state of one replica (``tp`` devices, at most ``B`` requests, prompt ``P``, output ``O``):

- colocated (continuous batching, Orca / Sarathi-Serve): a step decodes ``d = B`` requests and
  prefills the ``r = B / (O - 1)`` prompts that replace the finished ones (at most the chunk budget);
  it takes ``T = load_cost(d + r P tokens)``; TPOT ~ ``T``; TTFT ~ the prompt's steps,
  ``ceil(r P / chunk) T``, plus half a step of waiting; the replica serves ``r / T`` requests/s;
- disaggregated (DistServe, Splitwise): a prefill replica runs prefill-only steps of ``k`` prompts
  (``k P <= chunk``): ``k / T_p`` requests/s, TTFT ~ ``1.5 T_p``; a decode replica decodes ``B``
  requests per step: ``B / ((O - 1) T_d)`` requests/s, TPOT ~ ``T_d`` (+ the KV transfer spread over
  the output); prefill and decode replicas are counted so neither starves the other.

Cost: the devices a plan uses, at their kinds' price per device-hour (low end) and board power,
over the output tokens it serves: $/M tokens and kWh/M tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, cast

from hardware_profiles.types import Cluster, Link, MeshSpec, NodeGroup
from ir import BatchStep, InferenceModel, RequestMix, ServiceObjectives, layout_problem
from planner.errors import PlannerError
from simulator.program import SimError
from simulator.serving import ReplicaSpec, ServingResult, simulate_serving
from simulator.serving_cost import Replica, kv_transfer_time, steady_cost, step_time, tp_span

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
"""Largest running batches (``max_batch``) the search tries per replica."""

CHUNK_TOKENS = 8192
"""Prefill tokens per step (vLLM / TensorRT-LLM ``max_num_batched_tokens`` scale)."""

MAX_REQUESTS = 20000
"""Most requests one simulated check serves."""

DERATE = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3)
"""Fractions of a plan's analytic rate the simulator check tries, highest first."""


@dataclass(frozen=True, slots=True)
class Pool:
    """Replicas of one kind with one role.

    Attributes:
        group: the node group (device kind) they run on.
        role: ``"both"`` (colocated), ``"prefill"`` or ``"decode"``.
        tp: devices per replica (tensor parallel).
        replicas: how many.
        max_batch: most requests a replica runs at once.
        precision: the weight precision (``zoo.inference``).
    """

    group: str
    device: str
    role: str
    tp: int
    replicas: int
    max_batch: int
    precision: str

    @property
    def devices(self) -> int:
        return self.tp * self.replicas


@dataclass(frozen=True, slots=True)
class ServingPlan:
    """A deployment and what it serves.

    Attributes:
        family: ``"colocated <kind>"``, ``"colocated all kinds"`` or ``"disaggregated <A> -> <B>"``.
        pools: its replica pools.
        rate_per_s: requests/s it sustains within the objectives (simulated when ``checked``).
        output_tokens_per_s: output tokens/s at that rate.
        ttft_s / tpot_s: at the objectives' percentile (simulated when ``checked``, else the
            analytic steady state), s.
        usd_per_m_tokens / kwh_per_m_tokens: the used devices' cost per million output tokens (None
            when a kind has no price).
        checked: whether the discrete-event simulator confirmed it.
        note: why a family could not meet the objectives, when it could not.
    """

    family: str
    pools: tuple[Pool, ...]
    rate_per_s: float
    output_tokens_per_s: float
    ttft_s: float
    tpot_s: float
    usd_per_m_tokens: float | None
    kwh_per_m_tokens: float
    checked: bool = False
    note: str = ""
    result: ServingResult | None = field(default=None, compare=False, repr=False)

    @property
    def devices(self) -> int:
        return sum(p.devices for p in self.pools)


def serving_groups(cluster: Cluster) -> dict[str, NodeGroup]:
    """The cluster's node groups: as written, as a mesh list of whole nodes describes them
    (:func:`hardware_profiles.carve.node_groups_of`), or, for other mesh lists, one group per set
    of alike meshes (same device, node size and links; a mesh is one node unless it gives
    ``devices_per_node``), named after the first."""
    from hardware_profiles.carve import node_groups_of

    if cluster.groups:
        return dict(cluster.groups)
    described = node_groups_of(cluster)
    if described is not None and described.groups:
        return dict(described.groups)
    alike: dict[tuple[str, int, Link, Link | None, float | None, float | None],
                list[tuple[str, MeshSpec]]] = {}
    for name, m in cluster.meshes.items():
        per = m.devices_per_node or m.num_devices
        key = (m.device.name, per, m.intra_link, m.scale_out_link, m.price_per_device_hour,
               m.power_watts_per_device)
        alike.setdefault(key, []).append((name, m))
    out = {}
    for (_, per, intra, so, price, power), meshes in alike.items():
        name, m = meshes[0]
        so = so or Link(m.device.scale_out_bandwidth, 10e-6, "the device profile's scale-out NIC")
        nodes = sum(x.num_devices for _, x in meshes) // per
        out[name] = NodeGroup(name=name, device=m.device, nodes=nodes, devices_per_node=per,
                              intra_link=intra, scale_out_link=so, price_per_device_hour=price,
                              power_watts_per_device=power)
    return out


def tp_degrees(group: NodeGroup, model: InferenceModel | None = None) -> list[int]:
    """Tensor-parallel degrees tried on ``group``: divisors of a node's devices, then whole nodes
    (1, 2, 4, ... nodes) up to the group; with ``model``, only those that can serve it
    (:func:`ir.shards.layout_problem`: dividing its heads and MLP widths)."""
    n = group.devices_per_node
    out = [d for d in range(1, n + 1) if n % d == 0]
    k = 2
    while k * n <= group.num_devices and k <= 8:
        out.append(k * n)
        k *= 2
    return [t for t in out if model is None or layout_problem(model.shards, t) is None]


@dataclass(frozen=True, slots=True)
class _Option:
    replica: Replica
    group: NodeGroup
    role: str
    max_batch: int
    rate: float          # requests/s per replica
    ttft: float
    tpot: float


def _colocated(rep: Replica, mix: RequestMix, group: NodeGroup) -> list[_Option]:
    p, o = mix.prompt_tokens, mix.output_tokens
    cap = rep.kv_capacity_tokens // (p + o)
    out = []
    for b in BATCHES:
        if b > cap:
            break
        r = min(b / max(1, o - 1), CHUNK_TOKENS / p)
        t = steady_cost(rep, p, o, r).total_s
        ttft = (math.ceil(max(1.0, r) * p / CHUNK_TOKENS) + 0.5) * t
        out.append(_Option(rep, group, "both", b, r / t, ttft, t))
    return out


def _prefill(rep: Replica, mix: RequestMix, group: NodeGroup) -> list[_Option]:
    p = mix.prompt_tokens
    out = []
    for k in (1, 2, 4, 8, 16):
        if k * p > max(CHUNK_TOKENS, p) or k * p > rep.kv_capacity_tokens:
            break
        t = step_time(rep, BatchStep(prefill=((0, p),) * k))
        out.append(_Option(rep, group, "prefill", k, k / t, 1.5 * t, 0.0))
    return out


def _decode(rep: Replica, mix: RequestMix, group: NodeGroup, transfer: float) -> list[_Option]:
    p, o = mix.prompt_tokens, mix.output_tokens
    cap = rep.kv_capacity_tokens // (p + o)
    out = []
    for b in BATCHES:
        if b > cap or o < 2:
            break
        t = step_time(rep, BatchStep(decode=(p + o // 2,) * b))
        tpot = t + transfer / max(1, o - 1)
        out.append(_Option(rep, group, "decode", b, b / ((o - 1) * t), 0.0, tpot))
    return out


def _replica(model: InferenceModel, group: NodeGroup, tp: int) -> Replica | None:
    rep = Replica(model, group.device, tp, tp_span(group, tp))
    try:
        rep.check_fits()
    except SimError:
        return None
    return rep


def _cost(pools: list[tuple[NodeGroup, int]], tokens_per_s: float) -> tuple[float | None, float]:
    usd: float | None = 0.0
    watts = 0.0
    for g, n in pools:
        price = g.price_per_device_hour
        if price is None and g.device.price_per_hour is not None:
            price = g.device.price_per_hour[0]
        usd = None if price is None or usd is None else usd + price * n
        watts += (g.power_watts_per_device or g.device.tdp_watts) * n
    per_m_h = 1e6 / (tokens_per_s * 3600.0)
    return (None if usd is None else usd * per_m_h), watts / 1000.0 * per_m_h


def _meets(op: _Option, slo: ServiceObjectives) -> bool:
    return op.ttft <= slo.ttft_s and op.tpot <= slo.tpot_s


def _miss(family: str, opts: list[_Option], slo: ServiceObjectives) -> ServingPlan:
    """A family none of whose candidates meets ``slo``: its note names the best it reaches."""
    if not opts:
        note = "the model does not fit (weights and one request's KV cache) at any degree"
    else:
        t = min(opts, key=lambda o: o.tpot)
        f = min(opts, key=lambda o: o.ttft)
        parts = []
        if any(o.tpot > 0 for o in opts):
            parts.append(f"best TPOT {t.tpot * 1e3:.0f} ms (tp{t.replica.tp}, batch "
                         f"{t.max_batch})")
        if any(o.ttft > 0 for o in opts):
            parts.append(f"best TTFT {f.ttft:.2f} s (tp{f.replica.tp})")
        side = {"prefill": "its prefill side ", "decode": "its decode side "}.get(opts[0].role, "")
        note = f"{side}misses the objectives at every degree and batch: {', '.join(parts)}"
    return ServingPlan(family, (), 0.0, 0.0, math.inf, math.inf, None, math.inf, note=note)


def _best(opts: list[_Option], devices: int,
                    slo: ServiceObjectives | None = None) -> _Option | None:
    """The option (meeting ``slo`` when given) serving the most requests/s from ``devices``."""
    best = None
    for op in opts:
        if slo is not None and not _meets(op, slo):
            continue
        n = devices // op.replica.tp
        if n >= 1 and (best is None or n * op.rate > (devices // best.replica.tp) * best.rate):
            best = op
    return best


def plan_serving(model: InferenceModel | dict[str, InferenceModel], cluster: Cluster,
                 mix: RequestMix, slo: ServiceObjectives, *, check: bool = True,
                 requests: int = 300, seed: int = 0) -> list[ServingPlan]:
    """The best plan of each family on ``cluster`` (sorted: lowest $/M tokens first, then highest
    throughput), each using every device it can of the kinds it names.

    ``model`` is one :class:`ir.InferenceModel`, or one per node group name (a precision per kind).

    Raises:
        PlannerError: no family meets the objectives (one line naming what each reaches).
    """
    groups = serving_groups(cluster)
    models = model if isinstance(model, dict) else {g: model for g in groups}
    colo: dict[str, list[_Option]] = {}
    pre: dict[str, list[_Option]] = {}
    dec: dict[str, list[tuple[_Option, str]]] = {}
    for name, g in groups.items():
        colo[name], pre[name] = [], []
        for tp in tp_degrees(g, models[name]):
            rep = _replica(models[name], g, tp)
            if rep is None:
                continue
            colo[name] += _colocated(rep, mix, g)
            pre[name] += _prefill(rep, mix, g)
    plans: list[ServingPlan] = []
    for name, g in groups.items():
        family = f"colocated {g.device.name}"
        op = _best(colo[name], g.num_devices, slo)
        plans.append(_colocated_plan(family, [op], [g], mix, models) if op
                     else _miss(family, colo[name], slo))
    if len(groups) > 1:
        ops = [(_best(colo[n], g.num_devices, slo), g) for n, g in groups.items()]
        if all(o for o, _ in ops):
            plans.append(_colocated_plan("colocated, every kind", [cast(_Option, o) for o, _ in ops],
                                         [g for _, g in ops], mix, models))
        for a, ga in groups.items():
            for b, gb in groups.items():
                if a == b:
                    continue
                family = f"disaggregated {ga.device.name} -> {gb.device.name}"
                link = _link(cluster, ga, gb)
                transfer = kv_transfer_time(models[b], mix.prompt_tokens, link)
                decs = []
                for tp in tp_degrees(gb, models[b]):
                    rep = _replica(models[b], gb, tp)
                    if rep is not None:
                        decs += _decode(rep, mix, gb, transfer)
                p_op = _best(pre[a], ga.num_devices, slo)
                d_op = _best(decs, gb.num_devices, slo)
                if p_op and d_op:
                    plans.append(_disaggregated_plan(p_op, d_op, ga, gb, mix, models, transfer,
                                                     link))
                else:
                    plans.append(_miss(family, pre[a] if not p_op else decs, slo))
    if not any(p.pools for p in plans):
        worst = "; ".join(f"{p.family}: {p.note}" for p in plans)
        raise PlannerError(f"no deployment meets TTFT {slo.ttft_s:g} s and TPOT {slo.tpot_s:g} s "
                           f"for {mix.prompt_tokens}+{mix.output_tokens}-token requests ({worst}); "
                           "fix: relax --ttft / --tpot, shorten the requests or add devices")
    if check:
        plans = [_checked(p, mix, slo, models, cluster, requests, seed) if p.pools else p
                 for p in plans]
    return sorted(plans, key=_rank)


def _rank(p: ServingPlan) -> tuple[bool, float, float]:
    ok = p.rate_per_s > 0
    cost = p.usd_per_m_tokens if p.usd_per_m_tokens is not None else math.inf
    return (not ok, cost, -p.output_tokens_per_s)


def _link(cluster: Cluster, a: NodeGroup, b: NodeGroup) -> Link:
    """The link one request's KV cache crosses from group ``a`` to ``b``: one device's scale-out
    NIC at the slower end, capped by the cluster's link between the two (a ``group_links`` entry,
    or the link between two listed meshes) when it gives one."""
    bw = min(a.scale_out_link.bandwidth, b.scale_out_link.bandwidth)
    lat = max(a.scale_out_link.latency, b.scale_out_link.latency)
    caps = [gl.link for gl in cluster.group_links if {gl.a, gl.b} == {a.name, b.name}]
    if not caps and a.name in cluster.meshes and b.name in cluster.meshes:
        try:
            caps.append(cluster.link_between(a.name, b.name).link)
        except ValueError:
            pass
    for c in caps:
        bw, lat = min(bw, c.bandwidth), max(lat, c.latency)
    return Link(bw, lat)


def _pools(ops: list[_Option], groups: list[NodeGroup], models: Mapping[str, InferenceModel]
           ) -> tuple[Pool, ...]:
    return tuple(Pool(g.name, g.device.name, op.role, op.replica.tp,
                      g.num_devices // op.replica.tp, op.max_batch,
                      models[g.name].weight_format) for op, g in zip(ops, groups))


def _colocated_plan(family: str, ops: list[_Option], groups: list[NodeGroup], mix: RequestMix,
                    models: Mapping[str, InferenceModel]) -> ServingPlan:
    pools = _pools(ops, groups, models)
    rate = sum(p.replicas * op.rate for p, op in zip(pools, ops))
    tokens = rate * mix.output_tokens
    usd, kwh = _cost([(g, p.devices) for g, p in zip(groups, pools)], tokens)
    return ServingPlan(family, pools, rate, tokens, max(op.ttft for op in ops),
                       max(op.tpot for op in ops), usd, kwh)


def _disaggregated_plan(p_op: _Option, d_op: _Option, ga: NodeGroup, gb: NodeGroup,
                        mix: RequestMix, models: Mapping[str, InferenceModel], transfer: float,
                        link: Link) -> ServingPlan:
    n_p = ga.num_devices // p_op.replica.tp
    n_d = gb.num_devices // d_op.replica.tp
    rate = min(n_p * p_op.rate, n_d * d_op.rate)
    # use only the replicas the slower side needs of the faster one
    n_p = min(n_p, math.ceil(rate / p_op.rate))
    n_d = min(n_d, math.ceil(rate / d_op.rate))
    pools = (Pool(ga.name, ga.device.name, "prefill", p_op.replica.tp, n_p, p_op.max_batch,
                  models[ga.name].weight_format),
             Pool(gb.name, gb.device.name, "decode", d_op.replica.tp, n_d, d_op.max_batch,
                  models[gb.name].weight_format))
    tokens = rate * mix.output_tokens
    usd, kwh = _cost([(ga, pools[0].devices), (gb, pools[1].devices)], tokens)
    return ServingPlan(f"disaggregated {ga.device.name} -> {gb.device.name}", pools, rate, tokens,
                       p_op.ttft, d_op.tpot, usd, kwh,
                       note=f"KV cache {transfer * 1e3:.1f} ms per request over "
                            f"{link.bandwidth * 8 / 1e9:.0f} Gb/s")


def replica_specs(plan: ServingPlan, cluster: Cluster, models: Mapping[str, InferenceModel]
                  ) -> list[ReplicaSpec]:
    """The plan's replicas as the discrete-event simulator's :class:`ReplicaSpec` s."""
    groups = serving_groups(cluster)
    specs = []
    for pool in plan.pools:
        g = groups[pool.group]
        rep = Replica(models[pool.group], g.device, pool.tp, tp_span(g, pool.tp))
        for i in range(pool.replicas):
            specs.append(ReplicaSpec(
                name=f"{pool.device}-tp{pool.tp}-{pool.role}#{i}",
                # (the lambda's default binds this replica: mypy cannot infer it against the field)
                step_cost=cast("Callable[[BatchStep], float]", lambda s, rep=rep: step_time(rep, s)),
                kv_capacity_tokens=rep.kv_capacity_tokens, max_batch=pool.max_batch,
                chunk_tokens=CHUNK_TOKENS, role=pool.role))
    return specs


def _checked(plan: ServingPlan, mix: RequestMix, slo: ServiceObjectives,
             models: Mapping[str, InferenceModel],
             cluster: Cluster, requests: int, seed: int) -> ServingPlan:
    """``plan`` replayed in the discrete-event simulator at its analytic rate, lowered through
    :data:`DERATE` until the simulated percentiles meet the objectives."""
    import dataclasses

    specs = replica_specs(plan, cluster, models)
    # enough requests to fill the plan: three times its steady-state concurrency (Little's law)
    resident = plan.rate_per_s * (plan.ttft_s + mix.output_tokens * plan.tpot_s)
    requests = int(min(MAX_REQUESTS, max(requests, 3 * resident)))
    transfer = None
    kv_bytes = 0.0
    if any(s.role == "decode" for s in specs):
        groups = serving_groups(cluster)
        pre, dec = (groups[p.group] for p in plan.pools)
        link = _link(cluster, pre, dec)
        m = models[dec.name]
        transfer = lambda n, m=m, link=link: kv_transfer_time(m, n, link)   # noqa: E731
        kv_bytes = m.kv_bytes_per_token
    last = None
    for f in DERATE:
        rate = plan.rate_per_s * f
        load = dataclasses.replace(mix, rate_per_s=rate)
        res = simulate_serving(load, specs, requests=requests, seed=seed, kv_transfer=transfer,
                               kv_bytes_per_token=kv_bytes, warmup=requests // 10,
                               kv_links=max(1, len(specs)))
        ttft = res.percentile("ttft", slo.percentile)
        tpot = res.percentile("tpot", slo.percentile) if mix.output_tokens > 1 else 0.0
        last = (rate, res, ttft, tpot)
        if ttft <= slo.ttft_s and tpot <= slo.tpot_s:
            break
    assert last is not None            # DERATE is not empty
    rate, res, ttft, tpot = last
    ok = ttft <= slo.ttft_s and tpot <= slo.tpot_s
    groups = serving_groups(cluster)
    tokens = rate * mix.output_tokens
    usd, kwh = _cost([(groups[p.group], p.devices) for p in plan.pools], tokens)
    note = plan.note
    if not ok:
        note = (f"{note}; " if note else "") + (
            f"simulated p{slo.percentile:g} TTFT {ttft:.2f} s / TPOT {tpot * 1e3:.0f} ms miss "
            f"the objectives even at {DERATE[-1]:.0%} of the analytic rate")
    return dataclasses.replace(plan, rate_per_s=rate if ok else 0.0,
                               output_tokens_per_s=tokens if ok else 0.0, ttft_s=ttft,
                               tpot_s=tpot, usd_per_m_tokens=usd if ok else None,
                               kwh_per_m_tokens=kwh, checked=True, note=note, result=res)
