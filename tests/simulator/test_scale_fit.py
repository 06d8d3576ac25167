"""simulator.scale_fit: scale groups and the per-device throughput their drops compare."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator import validate as V
from simulator.scale_fit import per_device

CSV = Path(__file__).resolve().parents[2] / "reports" / "validation" / "published_training.csv"


def test_an_iteration_time_becomes_samples_per_device_per_second():
    rows = [r for r in V.load_rows(CSV) if r.source == "dgxc-h100" and r.model == "gpt3-175B"]
    small, big = sorted(rows, key=lambda r: r.gpus)[:2]
    assert (small.gpus, small.global_batch, big.gpus, big.global_batch) == (128, 256, 512, 1024)
    assert per_device(small, small.value) == pytest.approx(256 / (8.91 * 128), rel=1e-12)
    # weak scaling: 4x the devices and the batch, 8.91 s -> 9.09 s per step is a 2.0% drop
    drop = 1 - per_device(big, big.value) / per_device(small, small.value)
    assert drop == pytest.approx(1 - 8.91 / 9.09, rel=1e-12)
    tok = next(r for r in V.load_rows(CSV) if r.metric == "tokens_per_gpu_s")
    assert per_device(tok, 123.0) == 123.0
