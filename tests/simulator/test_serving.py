"""The serving simulation: continuous batching, chunked prefill, admission limits, disaggregation,
against timings worked out by hand, plus invariants over random deployments."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ir import BatchStep, RequestMix
from simulator import ReplicaSpec, SimError, simulate_serving, to_chrome_trace

STEP = 0.01


def const(step: BatchStep) -> float:
    return STEP


class Recorder:
    """A step cost that records the batches it prices: ``base + per_token * tokens``."""

    def __init__(self, base: float = STEP, per_token: float = 0.0) -> None:
        self.base, self.per_token = base, per_token
        self.steps: list[BatchStep] = []

    def __call__(self, step: BatchStep) -> float:
        self.steps.append(step)
        return self.base + self.per_token * step.tokens


def one(cost=const, kv=100_000, batch=64, chunk=100, role="both", name="r0") -> ReplicaSpec:
    return ReplicaSpec(name, cost, kv, batch, chunk, role)


def test_one_request_at_a_time_is_exact():
    # prompt 10 in one chunk (0.01 s, first token), then 4 decode steps: finish at 0.05 s.
    r = simulate_serving(RequestMix(10, 5), [one()], requests=3)
    assert r.requests == 3
    assert r.ttft_s == pytest.approx((STEP,) * 3)
    assert r.tpot_s == pytest.approx((STEP,) * 3)
    assert (r.ttft_p50_s, r.ttft_p99_s, r.tpot_p50_s, r.tpot_p99_s) == pytest.approx((STEP,) * 4)
    assert r.duration_s == pytest.approx(0.15)
    assert r.output_tokens_per_s == pytest.approx(5 / 0.05)
    assert r.mean_decode_batch == 1.0
    evs = r.timeline.events
    assert [e.name for e in evs] == ["P1", "D1", "D1", "D1", "D1"] * 3
    assert [e.kind for e in evs[:2]] == ["prefill", "decode"]
    assert {e.track for e in evs} == {"r0/compute"}
    assert [e.microbatch for e in evs] == list(range(15))
    assert evs[-1].end_s == pytest.approx(0.15)


def test_chunked_prefill_takes_three_steps():
    rec = Recorder()
    r = simulate_serving(RequestMix(250, 1), [one(rec)], requests=1)
    assert rec.steps == [BatchStep(prefill=((0, 100),)), BatchStep(prefill=((100, 100),)),
                         BatchStep(prefill=((200, 50),))]
    assert r.ttft_s == pytest.approx((0.03,))
    assert r.tpot_s == () and math.isnan(r.tpot_p99_s) and r.mean_decode_batch == 0.0


def test_chunks_and_decodes_share_steps():
    # Two users, prompt 150, chunk 100, output 2:
    #   step 0: r0 [0,100)                        step 1: r0 [100,150) + r1 [0,50) -> r0's token
    #   step 2: r1 [50,150) + r0 decodes (151)    -> r0 done, r1's first token
    #   step 3: r1 decodes (151)                  -> r1 done
    rec = Recorder()
    r = simulate_serving(RequestMix(150, 2, concurrency=2), [one(rec)], requests=2)
    assert rec.steps == [BatchStep(prefill=((0, 100),)),
                         BatchStep(prefill=((100, 50), (0, 50))),
                         BatchStep(prefill=((50, 100),), decode=(151,)),
                         BatchStep(decode=(151,))]
    assert [e.name for e in r.timeline.events] == ["P1", "P2", "P1+D1", "D1"]
    assert r.timeline.events[2].kind == "mixed"
    assert r.ttft_s == pytest.approx((0.02, 0.03))
    assert r.tpot_s == pytest.approx((0.01, 0.01))


def test_more_load_more_waiting():
    def cost(step: BatchStep) -> float:
        return 0.005 + 2e-5 * step.tokens + 1e-7 * step.kv_tokens_read

    def at(rate: float):
        return simulate_serving(RequestMix(500, 100, rate_per_s=rate, spread=0.5),
                                [one(cost, kv=200_000, batch=64, chunk=512)], requests=300)

    light, heavy = at(5.0), at(60.0)
    for r in (light, heavy):
        assert r.requests == 300
        assert r.ttft_p99_s >= r.ttft_p50_s > 0 and r.tpot_p99_s >= r.tpot_p50_s > 0
        assert r.ttft_p99_s == pytest.approx(r.percentile("ttft", 99))
    assert heavy.ttft_p99_s > 10 * light.ttft_p99_s
    assert heavy.mean_decode_batch > light.mean_decode_batch
    assert heavy.output_tokens_per_s > light.output_tokens_per_s


def test_max_batch_is_respected():
    rec = Recorder()
    simulate_serving(RequestMix(10, 5, concurrency=10), [one(rec, batch=4)], requests=40)
    sizes = [len(s.prefill) + len(s.decode) for s in rec.steps]
    assert max(sizes) == 4
    assert rec.steps[0] == BatchStep(prefill=((0, 10),) * 4)   # 4 admitted, 6 wait


def test_kv_capacity_is_respected():
    rec = Recorder()
    simulate_serving(RequestMix(10, 5, concurrency=10), [one(rec, kv=45, batch=10)],
                     requests=40)   # room for 3 reservations of 10 + 5 tokens
    assert max(len(s.prefill) + len(s.decode) for s in rec.steps) == 3
    assert all(s.kv_tokens_read <= 45 for s in rec.steps)


def test_a_request_that_never_fits_is_refused():
    with pytest.raises(SimError, match=r"needs 15 KV tokens but the largest 'both' replica "
                                       r"holds 14; fix: more devices"):
        simulate_serving(RequestMix(10, 5), [one(kv=14)], requests=1)


def test_router_balances_and_skips_replicas_too_small():
    r = simulate_serving(RequestMix(10, 5, concurrency=2),
                         [one(name="a"), one(name="b")], requests=2)
    assert {e.track for e in r.timeline.events if e.start_s == 0} == {"a/compute", "b/compute"}
    r = simulate_serving(RequestMix(10, 5, concurrency=2),
                         [one(kv=10, name="small"), one(name="big")], requests=2)
    assert {e.mesh for e in r.timeline.events} == {"big"}


def disagg(links: int = 1, prefills: int = 1, **kw):
    reps = [one(name=f"p{i}", role="prefill") for i in range(prefills)]
    reps.append(one(name="d", role="decode"))
    return simulate_serving(RequestMix(10, 3, concurrency=prefills), reps,
                            kv_transfer=lambda n: 0.0005 * n, kv_links=links,
                            kv_bytes_per_token=2.0, **kw)


def test_disaggregated_ttft_excludes_the_transfer():
    # prefill 0.01 s (first token) -> KV 10 tokens x 0.5 ms = 5 ms -> decodes end at 0.025, 0.035.
    r = disagg(requests=3)
    assert r.ttft_s == pytest.approx((0.01,) * 3)
    assert r.tpot_s == pytest.approx(((0.035 - 0.01) / 2,) * 3)
    links = [e for e in r.timeline.events if e.track.startswith("link:")]
    assert [(e.name, e.track, e.kind, e.bytes, e.mesh) for e in links] == \
        [(f"KV{i}", "link:kv0", "transfer", 20.0, "p0") for i in range(3)]
    assert (links[0].start_s, links[0].end_s) == pytest.approx((0.01, 0.015))
    first_decode = next(e for e in r.timeline.events if e.track == "d/compute")
    assert first_decode.start_s == pytest.approx(0.015) and first_decode.kind == "decode"
    assert {e.kind for e in r.timeline.events if e.track == "p0/compute"} == {"prefill"}
    procs = {e["args"]["name"] for e in to_chrome_trace(r.timeline)["traceEvents"]
             if e["name"] == "process_name"}
    assert procs == {"p0", "d", "link:kv0"}


def test_kv_links_limit_concurrent_transfers():
    def spans(links):
        r = disagg(links=links, prefills=2, requests=2)
        return sorted((e.track, round(e.start_s, 9), round(e.end_s, 9))
                      for e in r.timeline.events if e.kind == "transfer")
    assert spans(1) == [("link:kv0", 0.01, 0.015), ("link:kv0", 0.015, 0.02)]
    assert spans(2) == [("link:kv0", 0.01, 0.015), ("link:kv1", 0.01, 0.015)]


def test_a_full_decode_side_holds_kv_on_the_prefill_side():
    # The prefill replica holds one prompt's KV (10 tokens), the decode replica one request; the
    # KV stays on the prefill side until the decode side admits it and the 5 ms transfer ends.
    #   r0: prefill [0, .01], KV [.01, .015], decodes to .035
    #   r1: waits for r0's KV to leave; prefill [.015, .025]; decode side full until .035;
    #       KV [.035, .04], decodes to .06
    #   r2: sent at .035 (r0 done); r1's KV still on the prefill side until .04; prefill
    #       [.04, .05]; decode side full until .06; KV [.06, .065], decodes to .085
    reps = [one(kv=10, name="p", role="prefill"), one(batch=1, name="d", role="decode")]
    r = simulate_serving(RequestMix(10, 3, concurrency=2), reps, requests=3,
                         kv_transfer=lambda n: 0.005)
    assert r.ttft_s == pytest.approx((0.01, 0.025, 0.015))
    assert r.tpot_s == pytest.approx((0.0125, 0.0175, 0.0175))
    assert sorted((round(e.start_s, 9), round(e.end_s, 9)) for e in r.timeline.events
                  if e.kind == "transfer") == [(0.01, 0.015), (0.035, 0.04), (0.06, 0.065)]


def test_one_token_requests_finish_at_the_prefill():
    r = simulate_serving(RequestMix(10, 1), [one(name="p", role="prefill"),
                                             one(name="d", role="decode")],
                         requests=2, kv_transfer=lambda n: 1.0)
    assert r.ttft_s == pytest.approx((0.01, 0.01)) and r.duration_s == pytest.approx(0.02)
    assert {e.mesh for e in r.timeline.events} == {"p"}


def test_warmup_is_left_out():
    r = simulate_serving(RequestMix(10, 5), [one()], requests=4, warmup=2)
    assert r.requests == 2 and len(r.ttft_s) == 2
    assert r.duration_s == pytest.approx(0.1) and r.output_tokens_per_s == pytest.approx(100.0)


def test_same_seed_same_result():
    def run(seed):
        return simulate_serving(RequestMix(300, 50, rate_per_s=30.0, spread=0.5),
                                [one(Recorder(0.004, 1e-5), name="a"),
                                 one(Recorder(0.004, 1e-5), name="b")], requests=60, seed=seed)
    assert run(3) == run(3)
    assert run(3).ttft_s != run(4).ttft_s


@pytest.mark.parametrize("call, message", [
    (lambda: simulate_serving(RequestMix(10, 5), []), "no replicas"),
    (lambda: one(kv=0), "must be >= 1"),
    (lambda: one(role="both-ish"), "unknown role"),
    (lambda: simulate_serving(RequestMix(10, 5), [one(name="a"), one(name="a")]), "repeat"),
    (lambda: simulate_serving(RequestMix(10, 5), [one()], requests=2, warmup=2), "warmup"),
    (lambda: simulate_serving(RequestMix(10, 5), [one(), one(name="d", role="decode")],
                              kv_transfer=lambda n: 0.0), "mix colocated"),
    (lambda: simulate_serving(RequestMix(10, 5), [one(role="prefill"),
                                                  one(name="d", role="decode")]),
     "kv_transfer None"),
    (lambda: simulate_serving(RequestMix(10, 5), [one(role="prefill")], kv_transfer=lambda n: 0.0),
     "needs a 'prefill' and a 'decode'"),
    (lambda: simulate_serving(RequestMix(10, 5), [one()], kv_transfer=lambda n: 0.0),
     "colocated"),
    (lambda: simulate_serving(RequestMix(10, 5), [one(lambda s: 0.0)]), "step_cost returned 0.0"),
    (lambda: simulate_serving(RequestMix(10, 5), [one()]).percentile("itl", 50), "bad percentile"),
])
def test_bad_inputs_fail_in_one_line(call, message):
    with pytest.raises(SimError, match=message) as err:
        call()
    assert "\n" not in str(err.value) and "fix:" in str(err.value)


@st.composite
def deployments(draw):
    prompt, output = draw(st.integers(1, 300)), draw(st.integers(1, 12))
    split = draw(st.booleans())
    roles = ["prefill", "decode"] if split else ["both"]
    reps = []
    for i in range(draw(st.integers(1, 2)) * len(roles)):
        role = roles[i % len(roles)]
        need = prompt if role == "prefill" else prompt + output
        reps.append(ReplicaSpec(f"r{i}", Recorder(draw(st.sampled_from((0.002, 0.01))), 1e-5),
                                need * draw(st.integers(1, 6)), draw(st.integers(1, 8)),
                                draw(st.integers(1, 400)), role))
    rate = draw(st.sampled_from((0.0, 20.0, 200.0)))
    mix = RequestMix(prompt, output, rate_per_s=rate, concurrency=draw(st.integers(1, 12)))
    kv = (lambda n: 1e-5 * n) if split else None
    return mix, reps, kv, draw(st.integers(1, 25)), draw(st.integers(1, 3))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(deployments())
def test_invariants(case):
    mix, reps, kv, n, links = case
    r = simulate_serving(mix, reps, requests=n, kv_transfer=kv, kv_links=links)
    assert r.requests == n and len(r.ttft_s) == n
    steps = [s for rep in reps for s in rep.step_cost.steps]
    # tokens are conserved: every prompt token is prefilled once, every later token decoded once
    assert sum(c for s in steps for _, c in s.prefill) == n * mix.prompt_tokens
    assert sum(len(s.decode) for s in steps) == n * (mix.output_tokens - 1)
    for rep in reps:
        for s in rep.step_cost.steps:
            assert 0 < len(s.prefill) + len(s.decode) <= rep.max_batch
            assert sum(c for _, c in s.prefill) <= rep.chunk_tokens
            assert s.kv_tokens_read <= rep.kv_capacity_tokens
            if rep.role == "decode":
                assert not s.prefill
            if rep.role == "prefill":
                assert not s.decode
    fastest = min(rep.step_cost.base for rep in reps)
    front = [rep for rep in reps if rep.role != "decode"]
    prefill_steps = min(math.ceil(mix.prompt_tokens / rep.chunk_tokens) for rep in front)
    assert min(r.ttft_s) >= prefill_steps * fastest - 1e-12
    assert all(t >= fastest - 1e-12 for t in r.tpot_s)
    transfers = [e for e in r.timeline.events if e.kind == "transfer"]
    assert len(transfers) == (n if kv and mix.output_tokens > 1 else 0)
    for t in {e.start_s for e in transfers}:   # never more transfers at once than links
        assert sum(e.start_s <= t < e.end_s for e in transfers) <= links
