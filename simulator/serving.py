"""LLM serving over time: requests on replicas that run continuous batching, colocated or
disaggregated, replayed as a simpy discrete-event simulation into latency percentiles, throughput
and a :class:`ir.Timeline` (open it with :func:`simulator.trace.write_chrome_trace`).

Model (times in seconds, lengths and KV-cache sizes in tokens):

- Arrivals: Poisson at ``RequestMix.rate_per_s`` (exponential gaps), or, when the rate is 0, a
  closed loop of ``RequestMix.concurrency`` users, each sending its next request the instant its
  previous one finishes. Lengths are ``mean * uniform(1 - spread, 1 + spread)``, rounded, >= 1.
  All draws come from ``numpy.random.default_rng(seed)``: same inputs, same result.
- Routing: a request goes to the replica of its role with the fewest requests routed to it and not
  yet gone (ties: the lowest index), among those whose KV capacity can hold it at all.
- Continuous batching (iteration-level scheduling; Yu et al. 2022, "Orca", OSDI): a replica runs
  one forward step at a time; requests join and leave at step boundaries. A step carries one token
  of every running decode plus prefill chunks.
- Chunked prefill (Agrawal et al. 2024, "Sarathi-Serve", OSDI): a step's prefill tokens are at most
  ``chunk_tokens``; a longer prompt is split over steps while the decodes ride along.
- Admission (first come first served, as vLLM's scheduler): partly prefilled requests continue
  first, then waiting ones in arrival order; a request is admitted when its first chunk is
  scheduled, if the admitted requests stay <= ``max_batch`` and the reserved KV tokens <=
  ``kv_capacity_tokens``. The first request that does not fit blocks those behind it. KV is
  reserved for prompt + output at admission (Orca's reservation; no preemption, where vLLM
  allocates pages on demand and preempts) and freed when the request finishes.
- Disaggregated (Zhong et al. 2024, "DistServe", OSDI): prefill replicas run prefill-only steps and
  reserve the prompt's KV. At the end of its prefill a request has its first token; it is routed to
  a decode replica, which admits it (``max_batch``, prompt + output reserved) in the order the
  prefills end; then its KV cache moves over one of ``kv_links`` transfer slots
  (``kv_transfer(prompt)`` seconds), the prefill replica frees it, and the request decodes. The KV
  cache stays on the prefill replica until the decode replica has room for it (DistServe's pull),
  so a full decode side pushes back on the prefill side. A one-token request finishes at its
  prefill.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import simpy

from ir import BatchStep, RequestMix, Timeline, TimelineEvent
from simulator.program import SimError

ROLES = ("both", "prefill", "decode")
"""Replica roles: ``both`` (colocated prefill and decode), ``prefill`` or ``decode``."""


@dataclass(frozen=True, slots=True)
class ReplicaSpec:
    """One serving replica (a group of devices running one model copy).

    Attributes:
        name: e.g. ``"h100x8-tp8#0"``; the trace's mesh (track ``"<name>/compute"``).
        step_cost: seconds one forward step of this batch takes (> 0).
        kv_capacity_tokens: KV-cache tokens the replica's memory holds, all requests together.
        max_batch: most requests admitted at once (decode slots; prefilling ones count too).
        chunk_tokens: prefill tokens per step (chunked prefill); a longer prompt is split.
        role: one of :data:`ROLES`.
    """

    name: str
    step_cost: Callable[[BatchStep], float]
    kv_capacity_tokens: int
    max_batch: int
    chunk_tokens: int
    role: str = "both"

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise SimError(f"replica {self.name!r}: unknown role {self.role!r}; fix: one of "
                           f"{', '.join(ROLES)}")
        if min(self.kv_capacity_tokens, self.max_batch, self.chunk_tokens) < 1:
            raise SimError(f"replica {self.name!r}: KV capacity {self.kv_capacity_tokens} tokens, "
                           f"max batch {self.max_batch}, chunk {self.chunk_tokens} tokens; "
                           "fix: all must be >= 1")


@dataclass(frozen=True, slots=True)
class ServingResult:
    """What a simulated serving run measured (the ``warmup`` first requests left out).

    Attributes:
        requests: finished requests counted.
        duration_s: first counted arrival to last counted finish, s.
        output_tokens_per_s: counted output tokens / ``duration_s``, tokens/s.
        ttft_p50_s / ttft_p99_s: time to first token (arrival to the end of the prefill), s.
        tpot_p50_s / tpot_p99_s: time per output token of a request, ``(finish - first token) /
            (output - 1)``, s; NaN when no counted request has two output tokens.
        mean_decode_batch: mean decoding requests per step, over the steps (of every replica) that
            decode and start at or after the first counted arrival.
        timeline: one event per step per replica (kind ``prefill``, ``decode`` or ``mixed``, track
            ``"<replica>/compute"``, name like ``"P2+D31"``: 2 prefill chunks, 31 decodes; stage is
            the replica's index, microbatch the step's), KV transfers (kind ``transfer``, name
            ``"KV<request>"``) on ``"link:kv<slot>"`` with their bytes.
        ttft_s: TTFT of each counted request, arrival order, s.
        tpot_s: TPOT of each counted request with >= 2 output tokens, arrival order, s.
    """

    requests: int
    duration_s: float
    output_tokens_per_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    tpot_p99_s: float
    mean_decode_batch: float
    timeline: Timeline
    ttft_s: tuple[float, ...]
    tpot_s: tuple[float, ...]

    def percentile(self, which: str, p: float) -> float:
        """The ``p``-th percentile (0..100, linear interpolation) of ``"ttft"`` or ``"tpot"``, s."""
        if which not in ("ttft", "tpot") or not 0.0 <= p <= 100.0:
            raise SimError(f"bad percentile request ({which!r}, {p}); fix: 'ttft' or 'tpot' and "
                           "a percentile in [0, 100]")
        return _pct(self.ttft_s if which == "ttft" else self.tpot_s, p)


def _pct(values: Sequence[float], p: float) -> float:
    return float(np.percentile(values, p)) if values else math.nan


class _Req:
    __slots__ = ("id", "prompt", "output", "arrival", "prefilled", "generated", "first_s",
                 "finish_s", "home")

    def __init__(self, i: int, prompt: int, output: int) -> None:
        self.id, self.prompt, self.output = i, prompt, output
        self.arrival = self.first_s = self.finish_s = math.nan
        self.prefilled = self.generated = 0
        self.home: _Replica | None = None      # the prefill replica holding its KV (disaggregated)


class _Replica:
    """One replica's queues and books: ``admitted`` counts against ``max_batch``, ``reserved`` KV
    tokens against the capacity, ``load`` is the router's count (routed and not yet gone)."""

    def __init__(self, index: int, spec: ReplicaSpec) -> None:
        self.index, self.spec = index, spec
        self.waiting: deque[_Req] = deque()
        self.prefilling: list[_Req] = []
        self.decoding: list[_Req] = []
        self.admitted = self.reserved = self.load = self.steps = 0
        self.wake: simpy.Event | None = None

    def need(self, req: _Req) -> int:
        """KV tokens ``req`` reserves here."""
        return req.prompt if self.spec.role == "prefill" else req.prompt + req.output

    def fits(self, req: _Req) -> bool:
        return (self.admitted < self.spec.max_batch
                and self.reserved + self.need(req) <= self.spec.kv_capacity_tokens)


class _Run:
    """State of one simulation (one-shot)."""

    def __init__(self, mix: RequestMix, replicas: Sequence[ReplicaSpec], requests: int, seed: int,
                 kv_transfer: Callable[[int], float] | None, kv_links: int,
                 kv_bytes_per_token: float) -> None:
        self.env = simpy.Environment()
        self.mix, self.kv_transfer, self.kv_bytes = mix, kv_transfer, kv_bytes_per_token
        rng = np.random.default_rng(seed)
        self.gaps = rng.exponential(1.0 / mix.rate_per_s, requests) if mix.rate_per_s > 0 else None
        lens = [np.maximum(1, np.rint(m * rng.uniform(1 - mix.spread, 1 + mix.spread, requests)))
                for m in (mix.prompt_tokens, mix.output_tokens)]
        self.reqs = [_Req(i, int(p), int(o)) for i, (p, o) in enumerate(zip(*lens))]
        reps = [_Replica(i, s) for i, s in enumerate(replicas)]
        self.disagg = replicas[0].role != "both"
        self.front = [r for r in reps if r.spec.role in ("both", "prefill")]
        self.back = [r for r in reps if r.spec.role == "decode"]
        self.links = simpy.Resource(self.env, capacity=kv_links)
        self.free_slots = set(range(kv_links))
        self.next = 0
        self.events: list[TimelineEvent] = []
        self.decode_batches: list[tuple[float, int]] = []
        for req in self.reqs:
            self._check_fits(req)
        for rep in reps:
            self.env.process(self._loop(rep))

    def _check_fits(self, req: _Req) -> None:
        pools = [(self.front, self.front[0].need(req))]
        if self.disagg and req.output > 1:
            pools.append((self.back, req.prompt + req.output))
        for pool, need in pools:
            cap = max(r.spec.kv_capacity_tokens for r in pool)
            if need > cap:
                raise SimError(f"request {req.id} (prompt {req.prompt} + output {req.output} "
                               f"tokens) needs {need} KV tokens but the largest "
                               f"{pool[0].spec.role!r} replica holds {cap}; fix: more devices "
                               "per replica (more KV memory) or shorter requests")

    @staticmethod
    def _route(pool: list[_Replica], req: _Req) -> _Replica:
        ok = [r for r in pool if r.need(req) <= r.spec.kv_capacity_tokens]
        rep = min(ok, key=lambda r: (r.load, r.index))
        rep.load += 1
        return rep

    @staticmethod
    def _poke(rep: _Replica) -> None:
        if rep.wake is not None and not rep.wake.triggered:
            rep.wake.succeed()

    def run(self) -> None:
        if self.gaps is None:
            for _ in range(min(self.mix.concurrency, len(self.reqs))):
                self._arrive()
        else:
            self.env.process(self._poisson())
        self.env.run()
        stuck = [r.id for r in self.reqs if math.isnan(r.finish_s)]
        if stuck:   # not reachable when the checks above hold; kept as a guard
            raise SimError(f"{len(stuck)} requests never finished (first: {stuck[0]}); "
                           "fix: report this as a simulator bug")

    def _poisson(self):
        for gap in self.gaps:
            yield self.env.timeout(float(gap))
            self._arrive()

    def _arrive(self) -> None:
        req = self.reqs[self.next]
        self.next += 1
        req.arrival = float(self.env.now)
        rep = self._route(self.front, req)
        rep.waiting.append(req)
        self._poke(rep)

    def _form(self, rep: _Replica) -> tuple[list[_Req], list[tuple[_Req, int, int]]]:
        """The next step's decodes and prefill chunks ``(request, start, length)``; admits."""
        decodes = list(rep.decoding)
        chunks: list[tuple[_Req, int, int]] = []
        if rep.spec.role == "decode":
            return decodes, chunks
        budget = rep.spec.chunk_tokens
        for req in rep.prefilling:
            if budget == 0:
                break
            n = min(req.prompt - req.prefilled, budget)
            chunks.append((req, req.prefilled, n))
            budget -= n
        while budget and rep.waiting and rep.fits(rep.waiting[0]):
            req = rep.waiting.popleft()
            rep.admitted += 1
            rep.reserved += rep.need(req)
            rep.prefilling.append(req)
            n = min(req.prompt, budget)
            chunks.append((req, 0, n))
            budget -= n
        return decodes, chunks

    def _loop(self, rep: _Replica):
        env, spec = self.env, rep.spec
        while True:
            decodes, chunks = self._form(rep)
            if not decodes and not chunks:
                rep.wake = env.event()
                yield rep.wake
                rep.wake = None
                continue
            step = BatchStep(prefill=tuple((s, n) for _, s, n in chunks),
                             decode=tuple(r.prompt + r.generated for r in decodes))
            cost = float(spec.step_cost(step))
            if not math.isfinite(cost) or cost <= 0:
                raise SimError(f"replica {spec.name!r}: step_cost returned {cost} s for {step}; "
                               "fix: a step cost must be a finite number of seconds > 0")
            start = float(env.now)
            yield env.timeout(cost)
            self._record(rep, start, len(chunks), len(decodes))
            for req in decodes:
                req.generated += 1
                if req.generated == req.output:
                    self._finish(req, rep)
            rep.decoding = [r for r in rep.decoding if r.generated < r.output]
            for req, _, n in chunks:
                req.prefilled += n
                if req.prefilled == req.prompt:
                    self._prefilled(req, rep)
            rep.prefilling = [r for r in rep.prefilling if r.prefilled < r.prompt]

    def _record(self, rep: _Replica, start: float, nprefill: int, ndecode: int) -> None:
        name = "+".join(f"{k}{n}" for k, n in (("P", nprefill), ("D", ndecode)) if n)
        kind = "mixed" if nprefill and ndecode else ("prefill" if nprefill else "decode")
        self.events.append(TimelineEvent(name, kind, f"{rep.spec.name}/compute", rep.spec.name,
                                         rep.index, rep.steps, start, self.env.now))
        rep.steps += 1
        if ndecode:
            self.decode_batches.append((start, ndecode))

    def _prefilled(self, req: _Req, rep: _Replica) -> None:
        """``req``'s prompt is done on ``rep``: its first token; then decode, hand off or finish."""
        req.generated, req.first_s = 1, self.env.now
        if req.output == 1:
            self._finish(req, rep)
        elif not self.disagg:
            rep.decoding.append(req)
        else:
            rep.admitted -= 1          # it leaves the prefill batch; its KV stays until moved
            req.home = rep
            dst = self._route(self.back, req)
            dst.waiting.append(req)
            self._admit_handoffs(dst)

    def _admit_handoffs(self, dst: _Replica) -> None:
        """Admit handed-off requests on ``dst`` first come first served; each moves its KV."""
        while dst.waiting and dst.fits(dst.waiting[0]):
            req = dst.waiting.popleft()
            dst.admitted += 1
            dst.reserved += dst.need(req)
            self.env.process(self._move_kv(req, dst))

    def _move_kv(self, req: _Req, dst: _Replica):
        env = self.env
        with self.links.request() as got:
            yield got
            slot = min(self.free_slots)
            self.free_slots.remove(slot)
            start = float(env.now)
            assert self.kv_transfer is not None   # a disaggregated run has one (checked on entry)
            seconds = float(self.kv_transfer(req.prompt))
            if not math.isfinite(seconds) or seconds < 0:
                raise SimError(f"kv_transfer({req.prompt}) returned {seconds} s; fix: a finite "
                               "number of seconds >= 0")
            yield env.timeout(seconds)
            self.free_slots.add(slot)
        src = req.home
        assert src is not None                  # set when its prefill ended, before the handoff
        self.events.append(TimelineEvent(f"KV{req.id}", "transfer", f"link:kv{slot}",
                                         src.spec.name, src.index, req.id, start, env.now,
                                         req.prompt * self.kv_bytes))
        src.reserved -= src.need(req)
        src.load -= 1
        self._poke(src)
        dst.decoding.append(req)
        self._poke(dst)

    def _finish(self, req: _Req, rep: _Replica) -> None:
        req.finish_s = self.env.now
        rep.admitted -= 1
        rep.reserved -= rep.need(req)
        rep.load -= 1
        if rep.spec.role == "decode":
            self._admit_handoffs(rep)
        if self.gaps is None and self.next < len(self.reqs):
            self._arrive()

    def result(self, warmup: int) -> ServingResult:
        counted = self.reqs[warmup:]
        t0 = min(r.arrival for r in counted)
        duration = max(r.finish_s for r in counted) - t0
        ttft = tuple(r.first_s - r.arrival for r in counted)
        tpot = tuple((r.finish_s - r.first_s) / (r.output - 1) for r in counted if r.output > 1)
        batches = [n for s, n in self.decode_batches if s >= t0]
        return ServingResult(
            requests=len(counted), duration_s=duration,
            output_tokens_per_s=sum(r.output for r in counted) / duration,
            ttft_p50_s=_pct(ttft, 50), ttft_p99_s=_pct(ttft, 99),
            tpot_p50_s=_pct(tpot, 50), tpot_p99_s=_pct(tpot, 99),
            mean_decode_batch=float(np.mean(batches)) if batches else 0.0,
            timeline=Timeline(events=tuple(self.events)), ttft_s=ttft, tpot_s=tpot)


def simulate_serving(mix: RequestMix, replicas: Sequence[ReplicaSpec], *, requests: int = 200,
                     seed: int = 0, kv_transfer: Callable[[int], float] | None = None,
                     kv_links: int = 1, kv_bytes_per_token: float = 0.0,
                     warmup: int = 0) -> ServingResult:
    """Serve ``requests`` requests of ``mix`` on ``replicas`` (see the module docstring).

    Args:
        mix: lengths and load (Poisson rate, or a closed loop of ``concurrency`` users).
        replicas: all ``both`` (colocated), or ``prefill`` and ``decode`` (disaggregated, at least
            one of each).
        requests: requests that arrive; the run ends when all have finished.
        seed: seed of every random draw (gaps, lengths).
        kv_transfer: seconds to move a prompt's KV cache of ``n`` tokens from its prefill replica
            to its decode replica (disaggregated only; required there).
        kv_links: KV transfers that can run at once.
        kv_bytes_per_token: KV-cache bytes per token (``InferenceModel.kv_bytes_per_token``), only
            to label the trace's transfers with their bytes.
        warmup: the first requests (by arrival) left out of the statistics.

    Raises:
        SimError: bad inputs, a request no replica's KV capacity can hold, or a step cost that is
            not a positive number of seconds (one line each, with the fix).
    """
    if not replicas:
        raise SimError("no replicas to serve on; fix: pass at least one ReplicaSpec")
    names = [r.name for r in replicas]
    if len(set(names)) != len(names):
        raise SimError(f"replica names repeat ({', '.join(names)}); fix: give each a unique name")
    if requests < 1 or not 0 <= warmup < requests or kv_links < 1 or kv_bytes_per_token < 0:
        raise SimError(f"bad run: {requests} requests, warmup {warmup}, {kv_links} KV links, "
                       f"{kv_bytes_per_token} KV bytes/token; fix: requests >= 1, "
                       "0 <= warmup < requests, kv_links >= 1, bytes >= 0")
    roles = {r.role for r in replicas}
    if "both" in roles and len(roles) > 1:
        raise SimError(f"replica roles {sorted(roles)} mix colocated ('both') with disaggregated "
                       "ones; fix: all 'both', or only 'prefill' and 'decode'")
    if "both" in roles and kv_transfer is not None:
        raise SimError("kv_transfer given for colocated replicas; fix: drop it, or use "
                       "'prefill' and 'decode' replicas")
    if "both" not in roles and (roles != {"prefill", "decode"} or kv_transfer is None):
        raise SimError(f"disaggregated serving needs a 'prefill' and a 'decode' replica and a "
                       f"kv_transfer cost; got roles {sorted(roles)}, kv_transfer "
                       f"{'set' if kv_transfer else 'None'}; fix: add what is missing")
    run = _Run(mix, replicas, requests, seed, kv_transfer, kv_links, kv_bytes_per_token)
    run.run()
    return run.result(warmup)
