"""hardware_profiles.calibration: a profile is calibrated when its matmul efficiency's origin
starts with "fitted" (``mpmd validate --fit``) or "measured" (``mpmd calibrate``), else a prior."""

from dataclasses import replace

import pytest
from rich.console import Console

import hardware_profiles
from hardware_profiles import (
    PRIOR_UNCERTAINTY,
    calibration_origin,
    calibration_status,
    calibration_summary,
    is_calibrated,
    load_device,
    profiles_rows,
    profiles_table,
)

FITTED = ("fitted by `mpmd validate --fit` over the 6 h100-sxm rows of the published-training CSV "
          "(sources: torchtitan, Megatron-LM), minimising the mean absolute percentage error of the "
          "simulated metric (scipy bounded search over matmul efficiency for each "
          "elementwise-traffic fraction): MAPE 4.1%, 0 zero-bubble groups ranked wrongly (fitted)")
MEASURED = ("measured 2026-11-22 on this machine (2 cores shared by 8 JAX CPU devices) by mpmd "
            "calibrate (runtime.calibration.measure.calibrate_command): achievable 121.37 GFLOP/s per device "
            "fitted (least squares in seconds, relative rms error 0.038) to 18 fragments")
PRIOR = "prior: same GH100 compute die and clocks as H100 SXM, so the H100 prior (0.62) is reused"


def with_origin(origin, name="blackhole-p150b"):
    d = load_device(name)
    sources = {k: v for k, v in d.sources.items() if k != "matmul_efficiency"}
    if origin is not None:
        sources["matmul_efficiency"] = origin
    return replace(d, sources=sources)


def test_bundled_profiles():
    assert calibration_status(load_device("a100-80gb-sxm")) == "calibrated"
    assert calibration_status(load_device("cpu-host")) == "calibrated"
    for name in ("b200", "h800-sxm", "l40s", "gaudi3", "mi300x"):
        assert calibration_status(load_device(name)) == "prior", name
    # fitted on NVIDIA DeepLearningExamples' BERT-Large steps (issue 45; the V100s as one part)
    for name in ("a100-40gb-sxm", "v100-sxm2-16gb", "v100-sxm2-32gb"):
        assert calibration_status(load_device(name)) == "calibrated", name
        assert "validate --fit --hold-elementwise" in load_device(name).sources["matmul_efficiency"]
    # fitted on the published tt-metal serving rows (mpmd validate --serving --fit), by chip
    for name in ("blackhole-p100a", "blackhole-p150a", "blackhole-p150b", "wormhole-n150",
                 "wormhole-n300"):
        assert calibration_status(load_device(name)) == "calibrated", name
        assert "validate --serving --fit" in load_device(name).sources["matmul_efficiency"]
    # fitted on their published rows since the calibration CSV gained them (PaLM, tpu-recipes)
    for name in ("h100-sxm", "tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e"):
        assert calibration_status(load_device(name)) == "calibrated", name
    # the H100's fit times a GEMM ratio measured on one H100 and one H200 (reports/validation/device)
    assert calibration_status(load_device("h200-sxm")) == "calibrated"


@pytest.mark.parametrize("origin, status", [
    (FITTED, "calibrated"), (MEASURED, "calibrated"), (PRIOR, "prior"),
    ("  'Fitted by hand-run script'", "calibrated"), ("MEASURED on a DGX", "calibrated"),
    ("tenstorrent/tt-metal tech_reports/GEMM_FLOPS/GEMM_FLOPS.md: P150 ...", "prior"),
    ("prior from public GEMM measurements: measured ...", "prior"), ("", "prior"), (None, "prior")])
def test_status_follows_the_origins_first_word(origin, status):
    d = with_origin(origin)
    assert calibration_status(d) == status
    assert is_calibrated(d) == (status == "calibrated")


def test_origin_summaries():
    assert calibration_origin(with_origin(FITTED)) == "fitted by `mpmd validate --fit` on 6 rows (MAPE 4.1%)"
    assert calibration_origin(with_origin(MEASURED)) == (
        "measured by mpmd calibrate on 2026-11-22 (relative rms error 0.038)")
    assert calibration_origin(with_origin(PRIOR)) == "prior: never fitted to a measured run"
    assert calibration_origin(with_origin(None)) == "prior: never fitted to a measured run"
    # a calibrated origin of another shape: its first clause, at most 80 characters
    assert calibration_origin(with_origin("fitted to MLPerf: 0.7")) == "fitted to MLPerf"
    long = calibration_origin(with_origin("fitted " + "x" * 200))
    assert len(long) == 80 and long.endswith("...")


def test_summary_line():
    a, b = with_origin(FITTED, "h100-sxm"), with_origin(PRIOR, "blackhole-p150b")
    assert calibration_summary([a, b, a]) == (
        "h100-sxm calibrated (fitted by `mpmd validate --fit` on 6 rows, MAPE 4.1%); "
        "blackhole-p150b prior (never fitted: predictions may be off by +/-20%)")
    assert calibration_summary([]) == ""


def test_prior_uncertainty_is_twenty_percent_and_re_exported():
    assert PRIOR_UNCERTAINTY == 0.20
    for name in ("PRIOR_UNCERTAINTY", "calibration_origin", "calibration_status",
                 "calibration_summary", "is_calibrated"):
        assert name in hardware_profiles.__all__


def test_profiles_table_has_an_efficiency_column():
    rows = {r[0]: r for r in profiles_rows()}
    assert rows["a100-80gb-sxm"][-1] == "calibrated"
    assert rows["blackhole-p150b"][-1] == "calibrated"
    assert rows["b200"][-1] == "prior"
    assert rows["cpu-host"][-1] == "calibrated"
    table = profiles_table()
    assert table.columns[-1].header == "efficiency"
    console = Console(width=120, record=True)
    console.print(table)
    text = console.export_text()
    assert max(len(ln) for ln in text.splitlines()) <= 120
    line = next(ln for ln in text.splitlines() if "a100-80gb-sxm" in ln)
    assert line.rstrip().endswith("│ calibrated │") and "1.4-1.8" in line
