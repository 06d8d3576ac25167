"""Tests of zoo.kv_decode (greedy decoding with a KV cache) and runtime.train.serve_run (its prefill
and decode compiled as MPMD programs from a forward-only plan, run by `mpmd run`)."""

from __future__ import annotations

import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from click.testing import CliRunner
from rich.console import Console

import zoo
from ir import Layout, Plan, StagePlan
from ir.plan_file import load_plan
from mpmd.cli.main import main
from runtime.train import serve_run
from runtime.train.serve_run import (DecodeReport, check_decoder_plan, decode_plan,
                                     is_decoder_plan, print_decode_report)
from runtime.train.step import RunError
from simulator.schedules import generate
from zoo import decoder, kv_decode
from zoo.config import ZooError
from zoo.model_files import plan_model

CLUSTER = "hardware_profiles/clusters/cpu4x2.yaml"
SPEC = """family: llama
layers: 8
hidden: 512
heads: 8
kv_heads: 8
ffn: 1536
vocab: 256
seq_len: 128
dtype: float32
training: false
"""
"""llama-tiny's fields (``zoo.get_config("llama-tiny")``) as an inference model, so the planner
gives it the forward-only schedule."""


# ----------------------------------------------------------------------------- plain JAX
def test_prefill_is_the_zoo_block_and_decode_reproduces_it_position_by_position():
    cfg = zoo.get_config("llama-tiny", kv_heads=2)          # grouped-query: 4 queries per KV head
    p = zoo.init_params(cfg, jax.random.PRNGKey(0))["blocks"][0]
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 12, cfg.hidden), jnp.float32)
    full = decoder.block_fn(cfg)(p, x)
    y, k, v = kv_decode.block_prefill_fn(cfg, 16)(p, x[:, :5])
    assert k.shape == v.shape == (2, 16, 2, cfg.head_dim)
    np.testing.assert_allclose(y, full[:, :5], atol=1e-5)
    assert float(jnp.abs(k[:, 5:]).max()) == 0.0             # positions not yet written
    dec = jax.jit(kv_decode.block_decode_fn(cfg))
    for pos in range(5, 12):
        y1, k, v = dec(p, x[:, pos:pos + 1], k, v, jnp.int32(pos))
        np.testing.assert_allclose(y1[:, 0], full[:, pos], atol=1e-5)
    assert float(jnp.abs(k[:, 12:]).max()) == 0.0 and float(jnp.abs(k[:, 11]).min()) >= 0.0


@pytest.mark.parametrize("kv_heads", [8, 2])
def test_cached_greedy_decoding_equals_greedy_of_the_full_forward(kv_heads):
    """32 new tokens after the prefill's: the same tokens as re-running the zoo's forward on the
    growing sequence, and logits equal to float tolerance at every step."""
    cfg = zoo.get_config("llama-tiny", kv_heads=kv_heads)
    params = zoo.init_params(cfg, jax.random.PRNGKey(0))
    prompt = jax.random.randint(jax.random.PRNGKey(1), (2, 8), 0, cfg.vocab, jnp.int32)
    toks, logits = jax.jit(kv_decode.greedy_decode(cfg, 32, 48))(params, prompt)
    ref_toks, ref_logits = jax.jit(kv_decode.greedy_reference(cfg, 32))(params, prompt)
    assert toks.shape == (2, 33) and logits.shape == (2, 33, cfg.vocab)
    np.testing.assert_array_equal(toks, ref_toks)
    np.testing.assert_allclose(logits, ref_logits, atol=1e-4)
    assert len(set(np.asarray(toks).ravel().tolist())) > 2   # not one token repeated


def test_only_dense_llama_decoders_decode_with_a_cache():
    kv_decode.check_decoder("llama-tiny")
    with pytest.raises(ZooError, match="not 'mochi-dit-tiny'"):
        kv_decode.check_decoder("mochi-dit-tiny")
    with pytest.raises(ZooError, match="exceed the cache length 10"):
        cfg = zoo.get_config("llama-tiny", layers=1)
        jax.eval_shape(kv_decode.greedy_decode(cfg, 4, 10), zoo.param_shapes(cfg),
                       jax.ShapeDtypeStruct((1, 8), jnp.int32))


def _plan(model: str, forward_only: bool, *, layouts=None, microbatches: int = 2,
          model_config=None) -> Plan:
    t = generate("gpipe", 2, microbatches, forward_only=forward_only)
    n = len(zoo.layer_names("llama-tiny" if model_config else model))
    return Plan(model=model, cluster="cpu4x2",
                stages=(StagePlan(0, 0, n // 2, "m0"), StagePlan(1, n // 2, n, "m1")),
                layouts=layouts or {"m0": Layout(2, 1), "m1": Layout(2, 1)}, schedule=t,
                rank_mesh=("m0", "m1"), merge_last_stage=False, global_batch=4, seq_len=1,
                cluster_path=CLUSTER, model_config=model_config or {})


def test_which_plans_decode():
    assert is_decoder_plan(_plan("llama-tiny", True))
    assert not is_decoder_plan(_plan("llama-tiny", False))
    assert not is_decoder_plan(_plan("mochi-dit-tiny", True))
    with pytest.raises(RunError, match="not forward-only"):
        check_decoder_plan(_plan("llama-tiny", False), zoo.get_config("llama-tiny"))
    with pytest.raises(RunError, match="dense Llama-family"):
        check_decoder_plan(_plan("mochi-dit-tiny", True), zoo.get_config("mochi-dit-tiny"))


# ----------------------------------------------------------------------------- MPMD
@pytest.fixture(scope="module")
def planned(tmp_path_factory) -> str:
    """`mpmd plan --model llama-tiny-serve.yaml --cluster cpu4x2.yaml --global-batch 4 --seq-len 1`:
    llama-tiny as an inference model, planned for a decode step; the plan file's path."""
    d = tmp_path_factory.mktemp("serve")
    (d / "llama-tiny-serve.yaml").write_text(SPEC)
    out = d / "p.json"
    res = CliRunner().invoke(main, ["plan", "--model", str(d / "llama-tiny-serve.yaml"),
                                    "--cluster", CLUSTER, "--global-batch", "4", "--seq-len", "1",
                                    "--out", str(out)])
    assert res.exit_code == 0, res.output
    return str(out)


@pytest.fixture(scope="module")
def served(planned) -> DecodeReport:
    return decode_plan(planned)


@pytest.mark.slow
def test_planner_gives_the_decoder_a_forward_only_plan_over_meshes(planned):
    plan = load_plan(planned)
    assert plan.schedule.forward_only and is_decoder_plan(plan)
    assert len({s.mesh for s in plan.stages}) >= 2
    cfg = plan_model(plan.model, plan.model_config)
    assert (cfg.family, cfg.layers, cfg.hidden, cfg.training) == ("llama", 8, 512, False)


@pytest.mark.slow
def test_mpmd_greedy_decoding_equals_jax_jit_for_32_tokens(served, planned):
    plan = load_plan(planned)
    r = served
    assert r.tokens.shape == (plan.global_batch, 33) and len(r.decode_times_s) == 32
    np.testing.assert_array_equal(r.tokens, r.reference_tokens)    # one jax.jit, cached
    np.testing.assert_array_equal(r.tokens, r.recompute_tokens)    # jax.jit, no cache
    assert r.tokens_match and r.logits_rel_error < 1e-5 and r.recompute_logits_rel_error < 1e-5
    assert r.order_mismatches == () and r.executables_ok
    assert r.cache_placement_errors == ()
    assert 0 < r.measured_decode_s < r.prefill_s * 10 and r.simulated_decode_s > 0


@pytest.mark.slow
def test_tensor_parallel_and_fsdp_meshes_decode_the_same_tokens():
    """Two microbatches of two rows over a tensor-parallel mesh (caches split by KV head) and an
    FSDP mesh (caches split by row)."""
    spec = {f: getattr(zoo.get_config("llama-tiny"), f) for f in
            ("family", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len",
             "dtype")}
    plan = _plan("llama-tiny-serve", True, layouts={"m0": Layout(1, 2),
                                                    "m1": Layout(2, 1, fsdp=True)},
                 model_config={**spec, "name": "llama-tiny-serve", "training": False})
    r = decode_plan(plan, new_tokens=4, simulate=False)
    assert r.tokens_match and r.logits_rel_error < 1e-5
    assert r.order_mismatches == () and r.executables_ok and r.cache_placement_errors == ()


@pytest.mark.slow
def test_mpmd_run_dispatches_a_decoder_plan_to_greedy_decoding(planned, monkeypatch):
    real = serve_run.decode_plan
    monkeypatch.setattr(serve_run, "decode_plan",
                        lambda plan, **kw: real(plan, new_tokens=2, simulate=False, **kw))
    res = CliRunner().invoke(main, ["run", planned])
    assert res.exit_code == 0, res.output
    assert "greedy decoding, KV cache" in res.output and "as planned" in res.output
    assert "NO" not in res.output


@pytest.mark.slow
def test_print_serve_report(served):
    buf = io.StringIO()
    print_decode_report(served, Console(file=buf, width=200))
    text = buf.getvalue()
    assert "33 x 4 tokens" in text and "NO" not in text and "decode step" in text

