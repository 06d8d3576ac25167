"""A plan's token dispatch and all-to-all overlap in each target: a dropless plan (the cost
model's default) writes no capacity factor (Megatron-Core's dropless default; Bridge's ``null``;
MaxText's ``-1``), a token-dropping one its capacity with the padding, and the interleaved
schedule with the MoE all-to-all overlap Megatron-Core's two flags."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ir.plan_file import load_plan
from launchers import export_plan

PLAN = Path(__file__).resolve().parent / "data" / "qwen3-235b-a22b-expert-parallel.json"


def _plan(dispatch: str, schedule: str | None = None):
    p = load_plan(PLAN)
    p = dataclasses.replace(p, layouts={m: dataclasses.replace(lay, expert_dispatch=dispatch)
                                        for m, lay in p.layouts.items()})
    if schedule:
        p = dataclasses.replace(p, schedule=dataclasses.replace(p.schedule, name=schedule))
    return p


def _text(plan, target: str, out: Path) -> str:
    return "\n".join(f.text for f in export_plan(plan, target, out, source="test"))


def _notes(plan, target: str, out: Path) -> str:
    return "\n".join(n for f in export_plan(plan, target, out, source="test") for n in f.notes)


def test_dropless_plans_write_no_capacity(tmp_path):
    meg = _text(_plan("alltoall"), "megatron", tmp_path / "a.args")
    assert "--moe-expert-capacity-factor" not in meg and "--moe-pad-expert-input" not in meg
    assert "--overlap-moe-expert-parallel-comm" not in meg
    bridge = _text(_plan("alltoall"), "megatron-bridge", tmp_path / "a.overrides")
    assert "model.moe_expert_capacity_factor=null" in bridge
    assert "moe_pad_expert_input_to_capacity" not in bridge


def test_token_dropping_plans_write_their_capacity_and_padding(tmp_path):
    meg = _text(_plan("tokendrop"), "megatron", tmp_path / "t.args")
    assert "--moe-expert-capacity-factor 1.0" in meg
    assert "--moe-pad-expert-input-to-capacity" in meg
    bridge = _text(_plan("tokendrop"), "megatron-bridge", tmp_path / "t.overrides")
    assert "model.moe_expert_capacity_factor=1.0" in bridge
    assert "model.moe_pad_expert_input_to_capacity=true" in bridge.lower()


def test_the_all_to_all_overlap_schedule_sets_megatrons_flags(tmp_path):
    plan = _plan("alltoall", "interleaved-1f1b-a2a")
    meg = _text(plan, "megatron", tmp_path / "o.args")
    assert "--overlap-moe-expert-parallel-comm" in meg and "--delay-wgrad-compute" in meg
    bridge = _text(plan, "megatron-bridge", tmp_path / "o.overrides")
    assert "comm_overlap.overlap_moe_expert_parallel_comm=true" in bridge.lower()
    assert "comm_overlap.delay_wgrad_compute=true" in bridge.lower()


def test_maxtext_capacity_follows_the_dispatch():
    """A model MaxText ships (Qwen3-235B: ``model_name``) keeps base.yml's dropless ``-1`` unless
    the plan drops tokens; a model written out key by key says which."""
    from launchers import part_views
    from launchers.maxtext import _model

    named = {d: _model(part_views(_plan(d))[0], []) for d in ("alltoall", "tokendrop")}
    assert "capacity_factor" not in named["alltoall"]
    assert named["tokendrop"]["capacity_factor"] == 1.0
    v = part_views(_plan("alltoall"))[0]
    own = dataclasses.replace(v, model=dataclasses.replace(v.model, name="my-moe"))
    assert _model(own, [])["capacity_factor"] == -1.0


def test_a_token_dropping_plan_round_trips_through_the_plan_file():
    import json

    from ir.plan_file import check_schema
    from ir.plan_json import any_plan_to_json, plan_from_json

    doc = any_plan_to_json(_plan("tokendrop"))
    doc = json.loads(doc) if isinstance(doc, str) else doc
    check_schema(doc, "plan")                       # the schema names the value
    back = plan_from_json(doc)
    assert {lay.expert_dispatch for lay in back.layouts.values()} == {"tokendrop"}
    assert "dp8xtp4-ep2-tokendrop" in {str(lay) for lay in back.layouts.values()}


def test_a_bf16_gradient_reduction_is_asked_for_in_every_target(tmp_path):
    """``Layout.grad_reduce="bf16"``: Megatron-LM's ``--grad-reduce-in-bf16``, Megatron-Bridge's
    ``ddp.grad_reduce_in_fp32=false``, torchtitan's ``mixed_precision_reduce``; an fp32 plan
    writes none of them (each stack's default)."""
    p = load_plan(PLAN)
    bf16 = dataclasses.replace(p, layouts={m: dataclasses.replace(lay, grad_reduce="bf16")
                                           for m, lay in p.layouts.items()})
    assert "--grad-reduce-in-bf16" in _text(bf16, "megatron", tmp_path / "b.args")
    assert "--grad-reduce-in-bf16" not in _text(p, "megatron", tmp_path / "f.args")
    assert "ddp.grad_reduce_in_fp32=false" in _text(bf16, "megatron-bridge",
                                                   tmp_path / "b.overrides").lower()
    assert "grad_reduce_in_fp32" not in _text(p, "megatron-bridge", tmp_path / "f.overrides")
    titan = _text(bf16, "torchtitan", tmp_path / "b.toml")
    assert "mixed_precision_reduce" in titan and "bfloat16" in titan
    assert "mixed_precision_reduce" not in _text(p, "torchtitan", tmp_path / "f.toml")


def test_low_precision_optimizer_state_is_asked_for_in_every_target(tmp_path):
    """``Layout.optimizer_state``: bf16 moments are Megatron-LM's precision-aware optimizer flags,
    Megatron-Bridge's ``optimizer.*`` fields and MaxText's ``mu_dtype`` (with a note: its second
    moment stays float32); bf16 state with no master copy is MaxText's ``weight_dtype`` and a note
    in Megatron (it keeps an fp32 master copy); torchtitan notes what it cannot set; an fp32 plan
    writes none of it; the plan JSON keeps the state."""
    from ir.plan_json import plan_from_json, plan_to_json

    p = load_plan(PLAN)

    def state(s: str):
        return dataclasses.replace(p, layouts={m: dataclasses.replace(lay, optimizer_state=s)
                                               for m, lay in p.layouts.items()})

    moments, bf16 = state("bf16-moments"), state("bf16")
    meg = _text(moments, "megatron", tmp_path / "m.args")
    assert "--use-precision-aware-optimizer" in meg and "--exp-avg-dtype bf16" in meg
    assert "--exp-avg-sq-dtype bf16" in meg
    assert "fp32 master" not in _notes(moments, "megatron", tmp_path / "m.args")
    assert "keeps fp32 master weights" in _notes(bf16, "megatron", tmp_path / "b.args")
    assert "precision-aware" not in _text(p, "megatron", tmp_path / "f.args")
    bridge = _text(moments, "megatron-bridge", tmp_path / "m.overrides")
    assert "optimizer.use_precision_aware_optimizer=true" in bridge.lower()
    assert "optimizer.exp_avg_dtype=torch.bfloat16" in bridge
    assert "optimizer.exp_avg_sq_dtype=torch.bfloat16" in bridge
    assert "optimizer." not in _text(p, "megatron-bridge", tmp_path / "f.overrides")
    dense = load_plan(PLAN.parent / "llama3-70b-h100x128.json")     # MaxText's even stages
    mx_moments, mx_bf16 = (dataclasses.replace(dense, layouts={
        m: dataclasses.replace(lay, optimizer_state=s) for m, lay in dense.layouts.items()})
        for s in ("bf16-moments", "bf16"))
    assert "mu_dtype: bfloat16" in _text(mx_moments, "maxtext", tmp_path / "m.yml")
    assert "second moment in weight_dtype" in _notes(mx_moments, "maxtext", tmp_path / "n.yml")
    assert "weight_dtype: bfloat16" in _text(mx_bf16, "maxtext", tmp_path / "b.yml")
    assert "_dtype: bfloat16" not in _text(dense, "maxtext", tmp_path / "f.yml")
    assert "bf16-moments optimizer state is not asked for" in _notes(moments, "torchtitan",
                                                                    tmp_path / "m.toml")
    back = plan_from_json(plan_to_json(moments))
    assert {lay.optimizer_state for lay in back.layouts.values()} == {"bf16-moments"}
    assert "optimizer_state" not in str(plan_to_json(p))


def test_a_latent_moe_plan_writes_megatrons_latent_size(tmp_path):
    """A LatentMoE model (``moe_latent``: Nemotron 3 Super's ``--moe-latent-size``) with two
    passes of a repeated multi-token-prediction module planned and exported: Megatron-LM's
    arguments carry the latent width beside the experts' and the module's passes and layers."""
    import yaml
    from click.testing import CliRunner

    from mpmd.cli.main import main

    root = Path(__file__).resolve().parents[2]
    spec = yaml.safe_load((root / "zoo" / "configs" / "tiny-hybrid.yaml").read_text())
    spec.update(name="tiny-latent", moe_latent=16, mtp_layers=2, mtp_pattern="*E")
    (tmp_path / "tiny-latent.yaml").write_text(yaml.safe_dump(spec))
    res = CliRunner().invoke(main, ["plan", "--model", str(tmp_path / "tiny-latent.yaml"),
                                    "--cluster", str(root / "hardware_profiles" / "clusters" / "h100x1.yaml"),
                                    "--global-batch", "8", "--time-limit", "5",
                                    "--out", str(tmp_path / "p.json")])
    assert res.exit_code == 0, res.output[-2000:]
    plan = load_plan(tmp_path / "p.json")
    assert plan.model_config is not None and plan.model_config["moe_latent"] == 16
    meg = _text(plan, "megatron", tmp_path / "p.args")
    assert "--moe-latent-size 16" in meg and "--num-experts 4" in meg
    assert "--mtp-num-layers 2" in meg and "--mtp-hybrid-override-pattern '*E'" in meg
    assert "--mtp-use-repeated-layer" in meg
