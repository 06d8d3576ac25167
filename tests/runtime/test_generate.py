"""Tests of runtime.train.generate: forward-only (inference) DiT plans run through `mpmd run`."""

from __future__ import annotations

import io
import json

import jax.numpy as jnp
import numpy as np
import pytest
from click.testing import CliRunner
from rich.console import Console

from ir import Layout, Plan, StagePlan
from ir.plan_file import load_plan
from runtime.train.generate import (GenerateReport, check_forward_only, dit_inputs,
                                    euler_update, sigma_schedule, split_rows)
from runtime.train.step import RunError
from runtime.train.report import print_report
from runtime.train.run import run_plan
import zoo
from mpmd.cli.main import main
from simulator.schedules import generate

CLUSTER = "hardware_profiles/clusters/cpu4x2.yaml"


def test_sigma_schedule_is_linear_from_one_to_zero():
    np.testing.assert_array_equal(sigma_schedule(4), np.array([1.0, 0.75, 0.5, 0.25, 0.0],
                                                               np.float32))
    assert sigma_schedule(1).tolist() == [1.0, 0.0]
    with pytest.raises(ValueError, match="sampling steps 0 must be at least 1"):
        sigma_schedule(0)


def test_split_rows_takes_consecutive_rows():
    batch = {"a": np.arange(8), "b": np.arange(16).reshape(8, 2)}
    mbs = split_rows(batch, 4)
    assert [m["a"].tolist() for m in mbs] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert mbs[3]["b"].tolist() == [[12, 13], [14, 15]]
    with pytest.raises(RunError, match="batch 8 is not divisible by 3 microbatches"):
        split_rows(batch, 3)


def test_dit_inputs_stack_conditional_then_unconditional_and_euler_guides():
    z = jnp.ones((2, 1, 1, 2, 2))
    text = jnp.full((2, 3, 4), 5.0)
    b = dit_inputs(z, 0.75, text)
    assert b["latent"].shape == (4, 1, 1, 2, 2) and b["timestep"].tolist() == [0.75] * 4
    assert b["text"][:2].tolist() == text.tolist() and float(jnp.abs(b["text"][2:]).max()) == 0.0
    v = jnp.concatenate([jnp.full_like(z, 3.0), jnp.full_like(z, 1.0)])   # v_cond 3, v_uncond 1
    # z + dsigma * (v_u + s (v_c - v_u)) = 1 + 0.25 * (1 + 4.5 * 2) = 3.5
    np.testing.assert_array_equal(euler_update(z, v, 0.25, 4.5), np.full(z.shape, 3.5, np.float32))


def _plan(model: str, forward_only: bool) -> Plan:
    t = generate("gpipe", 2, 4, forward_only=forward_only)
    meshes = ("m0", "m1")
    n = len(zoo.layer_names(model))
    return Plan(model=model, cluster="cpu4x2",
                stages=(StagePlan(0, 0, n // 2, "m0"), StagePlan(1, n // 2, n, "m1")),
                layouts={m: Layout(2, 1) for m in meshes}, schedule=t, rank_mesh=meshes,
                merge_last_stage=False, global_batch=8, seq_len=40, cluster_path=CLUSTER)


def test_only_forward_only_plans_of_a_dit_generate():
    check_forward_only(_plan("mochi-dit-tiny", True), zoo.get_config("mochi-dit-tiny"))
    with pytest.raises(RunError, match="not forward-only"):
        check_forward_only(_plan("mochi-dit-tiny", False), zoo.get_config("mochi-dit-tiny"))
    with pytest.raises(RunError, match="not 'llama-tiny'"):
        check_forward_only(_plan("llama-tiny", True), zoo.get_config("llama-tiny"))
    odd = Plan(**{**{f: getattr(_plan("mochi-dit-tiny", True), f)
                     for f in Plan.__dataclass_fields__}, "global_batch": 7})
    with pytest.raises(RunError, match="global batch 7 must be videos x 2"):
        check_forward_only(odd, zoo.get_config("mochi-dit-tiny"))


@pytest.fixture(scope="module")
def planned(tmp_path_factory) -> str:
    """`mpmd plan --model mochi-dit-tiny --cluster cpu4x2.yaml --out d.json` (no restricting
    flags): the plan file's path."""
    out = tmp_path_factory.mktemp("dit") / "d.json"
    res = CliRunner().invoke(main, ["plan", "--model", "mochi-dit-tiny", "--cluster", CLUSTER,
                                    "--out", str(out)])
    assert res.exit_code == 0, res.output
    return str(out)


def test_planner_gives_a_forward_only_plan_over_two_meshes(planned):
    doc = json.load(open(planned))
    assert doc["schedule"]["forward_only"] is True and doc["global_batch"] == 8
    plan = load_plan(planned)
    assert len({s.mesh for s in plan.stages}) >= 2
    assert {f.kind for order in plan.schedule.order for f in order} == {"F"}


def test_forward_only_plan_generates_and_matches_jax_jit(planned):
    plan = load_plan(planned)
    report = run_plan(planned, model_overrides={"sampling_steps": 2}, simulate=False)
    assert isinstance(report, GenerateReport)
    assert report.latent_rel_error < 1e-5
    assert len(report.velocity_rel_errors) == 2 and max(report.velocity_rel_errors) < 1e-5
    assert report.order_mismatches == ()
    want = {m: tuple(str(f) for f in plan.schedule.order[r]) for r, m in enumerate(plan.rank_mesh)}
    assert {m: o for m, o in report.executed_order.items() if m in want} == want
    assert report.executables_ok and len(report.executables) >= 2
    cfg = zoo.get_config("mochi-dit-tiny")
    V = plan.global_batch // 2
    assert report.latents.shape == (V, cfg.latent_channels, cfg.latent_frames,
                                    cfg.latent_height, cfg.latent_width)
    assert bool(jnp.all(jnp.isfinite(report.latents)))
    buf = io.StringIO()
    print_report(report, Console(file=buf, width=200))
    text = buf.getvalue()
    assert "forward only" in text and "as planned" in text and "NO" not in text


def test_forward_only_plan_with_tensor_parallel_and_fsdp_matches_jax_jit():
    """The DiT over a tensor-parallel mesh (its MLPs column/row parallel) and an FSDP mesh."""
    from dataclasses import replace

    plan = replace(_plan("mochi-dit-tiny", True),
                   layouts={"m0": Layout(1, 2), "m1": Layout(2, 1, fsdp=True)})
    report = run_plan(plan, model_overrides={"sampling_steps": 2}, simulate=False)
    assert report.latent_rel_error < 1e-5 and max(report.velocity_rel_errors) < 1e-5
    assert report.order_mismatches == () and report.executables_ok
