"""simulator.scale_fit: scale groups and the per-device throughput their drops compare."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator import validate as V
from simulator.scale_fit import per_device
from mpmd.cli.validate import model_fill

CSV = Path(__file__).resolve().parents[2] / "reports" / "validation" / "published_training.csv"


def test_an_iteration_time_becomes_samples_per_device_per_second():
    rows = [r for r in V.load_rows(CSV, fill=model_fill(CSV)) if r.source == "dgxc-h100" and r.model == "gpt3-175B"
            and r.precision == "bf16"]
    small, big = sorted(rows, key=lambda r: r.gpus)[:2]
    assert (small.gpus, small.global_batch, big.gpus, big.global_batch) == (128, 256, 512, 1024)
    assert per_device(small, small.value) == pytest.approx(256 / (8.91 * 128), rel=1e-12)
    # weak scaling: 4x the devices and the batch, 8.91 s -> 9.09 s per step is a 2.0% drop
    drop = 1 - per_device(big, big.value) / per_device(small, small.value)
    assert drop == pytest.approx(1 - 8.91 / 9.09, rel=1e-12)
    tok = next(r for r in V.load_rows(CSV, fill=model_fill(CSV)) if r.metric == "tokens_per_gpu_s")
    assert per_device(tok, 123.0) == 123.0


def test_a_scale_group_never_mixes_eager_and_compiled_runs():
    """torchtitan's H100 table has eager, torch.compile and torch.compile + Float8 rows at 8 and
    128 GPUs: a drop is measured within one way of running, never from an eager row to a
    compiled one, nor from a BF16 row to an FP8 one."""
    from simulator.scale_fit import scale_groups
    from simulator.validation_setup import eager

    rows = [r for r in V.load_rows(CSV, fill=model_fill(CSV)) if r.source == "torchtitan-h100"]
    assert len(rows) == 6
    setups = [V.row_setup(r, lambda r: _workload()) for r in rows]
    groups = scale_groups(setups)
    assert len(groups) == 3
    for g in groups.values():
        assert [s.row.gpus for s in g] == [8, 128]
        assert len({(eager(s.row)[0], s.row.precision) for s in g}) == 1


def _workload():
    from ir import LayerCost, Workload

    def lc(name):
        return LayerCost(name=name, fwd_flops_per_sample=1e9, bwd_flops_per_sample=2e9,
                         bwd_input_flops_per_sample=1e9, fwd_bytes_fixed=0.0, fwd_bytes_per_sample=1e6,
                         bwd_bytes_fixed=0.0, bwd_bytes_per_sample=2e6, param_count=1000,
                         param_bytes=2000.0, activation_bytes_per_sample=1e4,
                         residual_bytes_per_sample=1e5, tp_allreduce_bytes_per_sample=0.0)

    return Workload(model="fake", layers=("embed",) + ("decoder_block",) * 32 + ("head",),
                    costs={n: lc(n) for n in ("embed", "decoder_block", "head")},
                    seq_len=8192, global_batch=16)
