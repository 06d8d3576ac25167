"""Property: whatever a bundled input file is mutated into, the matching command either succeeds
with a valid output or fails with one line (exit 2). Never a traceback, exit 1, a half-written
output or a temporary file left behind.

Mutations: byte flips, truncation, deleted / duplicated / swapped lines, inserted bytes, a number
replaced by a huge, negative, non-finite or non-numeric value, a number replaced by a deep
nesting. Targets and commands (in-process, ``click.testing.CliRunner``):

- cluster YAML (``hardware_profiles/clusters``): ``mpmd plan --model llama-tiny --cluster F ...``;
- device profile (``hardware_profiles/devices``), named by path from a two-mesh cluster: the same;
- plan JSON (one made per module by ``mpmd plan`` on cpu4x2): ``mpmd simulate F --trace T``;
- what-if example (``reports/examples``): ``mpmd whatif --example F``, with the planning stage
  (``reports.whatif``) replaced by a stub once every input is read and checked;
- validation CSV: ``mpmd validate --csv F``, with ``row_setup`` stubbed once the rows are loaded
  (a full validation takes minutes).

The default run is small (``MAX_EXAMPLES`` per target, derandomized: reproducible); the ``slow``
variant runs ``SLOW_EXAMPLES`` per target.
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from mpmd.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
CLUSTERS = sorted((ROOT / "hardware_profiles" / "clusters").glob("*.yaml"))
DEVICES = sorted((ROOT / "hardware_profiles" / "devices").glob("*.yaml"))
EXAMPLES = sorted((ROOT / "reports" / "examples").glob("*.yaml"))
CSV = ROOT / "reports" / "validation" / "published_training.csv"

MAX_EXAMPLES = 30
SLOW_EXAMPLES = 2000

NUMBER = re.compile(rb"(?<![\w.])-?\d+(\.\d+)?([eE][-+]?\d+)?(?![\w.])")
REPLACEMENTS = [b"1e308", b"1.0e+999", b"1000000000000", b"99999999999999999999999", b"-1", b"-1.0e+9",
                b"0", b"0.0", b"1e-300", b"1.0e-300", b".inf", b"-.inf", b".nan", b"inf", b"nan", b"NaN",
                b"Infinity", b"-Infinity", b"abc", b'"x"', b"true", b"null", b"[]", b"{}", b"''",
                b"[/]", b"=@", b"9" * 5000]


class Reached(Exception):
    """The stubbed stage was reached: every input was read and accepted."""


def _stub(*args, **kwargs):
    raise Reached


@st.composite
def mutated(draw, data: bytes) -> bytes:
    """One or two mutations of ``data``."""
    for _ in range(draw(st.integers(1, 2))):
        kind = draw(st.sampled_from(["flip", "truncate", "delete line", "duplicate line",
                                     "swap lines", "insert", "number", "number", "number", "nest"]))
        n = len(data)
        if kind == "flip" and n:
            i = draw(st.integers(0, n - 1))
            data = data[:i] + bytes([draw(st.integers(0, 255))]) + data[i + 1:]
        elif kind == "truncate":
            data = data[:draw(st.integers(0, n))]
        elif kind == "insert":
            i = draw(st.integers(0, n))
            data = data[:i] + draw(st.binary(min_size=1, max_size=8)) + data[i:]
        elif kind in ("delete line", "duplicate line", "swap lines"):
            lines = data.splitlines(keepends=True)
            if not lines:
                continue
            i = draw(st.integers(0, len(lines) - 1))
            if kind == "delete line":
                del lines[i]
            elif kind == "duplicate line":
                lines.insert(i, lines[i])
            else:
                j = draw(st.integers(0, len(lines) - 1))
                lines[i], lines[j] = lines[j], lines[i]
            data = b"".join(lines)
        else:
            spans = [m.span() for m in NUMBER.finditer(data)]
            if not spans:
                continue
            a, b = spans[draw(st.integers(0, len(spans) - 1))]
            if kind == "number":
                new = draw(st.sampled_from(REPLACEMENTS))
            else:
                depth = draw(st.sampled_from([33, 1000, 100_000]))
                new = b"[" * depth + b"]" * depth
            data = data[:a] + new + data[b:]
    return data


def check(res, outs: list[Path], out_dir: Path, *, valid=None, stubbed: bool = False) -> str:
    """The property. Returns the outcome: "ok", "error" or "reached"."""
    leftovers = [p.name for p in out_dir.iterdir() if p.name.startswith(".")]
    assert not leftovers, leftovers
    if stubbed and isinstance(res.exception, Reached):
        assert not any(p.exists() for p in outs)
        return "reached"
    assert "Traceback" not in res.output, res.output
    if res.exit_code == 0:
        if valid is not None:
            valid()
        return "ok"
    assert res.exit_code == 2, (res.exit_code, repr(res.exception), res.output[-2000:])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output[-2000:]
    assert not any(p.exists() for p in outs), outs
    return "error"


def plan_args(cluster: Path, out: Path) -> list[str]:
    return ["plan", "--model", "llama-tiny", "--cluster", str(cluster), "--global-batch", "8",
            "--time-limit", "1", "--out", str(out)]


def valid_plan(out: Path):
    def f() -> None:
        from mpmd.cli.output import validate_plan_json

        validate_plan_json(json.loads(out.read_text()))
    return f


@pytest.fixture(scope="module")
def plan_json(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("plan") / "plan.json"
    args = plan_args(ROOT / "hardware_profiles" / "clusters" / "cpu4x2.yaml", out)
    args[args.index("--time-limit") + 1] = "2"
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    return out


# ----------------------------------------------------------------------------- one run per target
def run_cluster(draw) -> str:
    src = draw(st.sampled_from(CLUSTERS))
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        f = d / src.name
        f.write_bytes(draw(mutated(src.read_bytes())))
        out_dir = d / "out"
        out_dir.mkdir()
        out = out_dir / "plan.json"
        res = CliRunner().invoke(main, plan_args(f, out))
        return check(res, [out], out_dir, valid=valid_plan(out))


TWO_MESHES = ("name: c\nmeshes:\n  - {{name: a, device: {dev}, num_devices: 8}}\n"
              "  - {{name: b, device: {dev}, num_devices: 8}}\n"
              "links:\n  - {{between: [a, b], bandwidth_gb_per_s: 50, latency_us: 5}}\n")


def run_device(draw) -> str:
    src = draw(st.sampled_from(DEVICES))
    with tempfile.TemporaryDirectory() as d:      # a fresh path: the loader caches by path
        d = Path(d)
        (d / src.name).write_bytes(draw(mutated(src.read_bytes())))
        cluster = d / "c.yaml"
        cluster.write_text(TWO_MESHES.format(dev=src.name))
        out_dir = d / "out"
        out_dir.mkdir()
        out = out_dir / "plan.json"
        res = CliRunner().invoke(main, plan_args(cluster, out))
        return check(res, [out], out_dir, valid=valid_plan(out))


def run_plan(draw, plan_json: Path) -> str:
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        f = d / "plan.json"
        f.write_bytes(draw(mutated(plan_json.read_bytes())))
        out_dir = d / "out"
        out_dir.mkdir()
        trace = out_dir / "trace.json"
        res = CliRunner().invoke(main, ["simulate", str(f), "--trace", str(trace)])
        return check(res, [trace], out_dir, valid=lambda: json.loads(trace.read_text())["traceEvents"])


def run_example(draw, monkeypatch) -> str:
    import reports

    src = draw(st.sampled_from(EXAMPLES))
    with tempfile.TemporaryDirectory() as d, monkeypatch.context() as mp:
        mp.setattr(reports, "whatif", _stub)
        d = Path(d)
        f = d / src.name
        f.write_bytes(draw(mutated(src.read_bytes())))
        out_dir = d / "out"
        out_dir.mkdir()
        stem = out_dir / "report"
        outs = [stem.with_suffix(s) for s in (".html", ".csv", ".md", ".png")]
        res = CliRunner().invoke(main, ["whatif", "--example", str(f), "--out", str(stem),
                                        "--no-screenshot"])
        return check(res, outs, out_dir, stubbed=True)


def run_csv(draw, monkeypatch) -> str:
    from simulator import validate as V

    with tempfile.TemporaryDirectory() as d, monkeypatch.context() as mp:
        mp.setattr(V, "row_setup", _stub)
        d = Path(d)
        f = d / "v.csv"
        f.write_bytes(draw(mutated(CSV.read_bytes())))
        out_dir = d / "out"
        out_dir.mkdir()
        out = out_dir / "validation.md"
        res = CliRunner().invoke(main, ["validate", "--csv", str(f), "--out", str(out)])
        return check(res, [out], out_dir, stubbed=True)


TARGETS = ["cluster", "device", "plan", "example", "csv"]


def one(target: str, data, plan_json: Path, monkeypatch) -> str:
    """Run one mutant of ``target``; its outcome is a hypothesis event (see
    ``--hypothesis-show-statistics``)."""
    draw = data.draw
    if target == "cluster":
        outcome = run_cluster(draw)
    elif target == "device":
        outcome = run_device(draw)
    elif target == "plan":
        outcome = run_plan(draw, plan_json)
    elif target == "example":
        outcome = run_example(draw, monkeypatch)
    else:
        outcome = run_csv(draw, monkeypatch)
    event(f"outcome: {outcome}")
    return outcome


SETTINGS = dict(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])


@pytest.mark.parametrize("target", TARGETS)
@settings(max_examples=MAX_EXAMPLES, **SETTINGS)
@given(data=st.data())
def test_mutated_input_gives_output_or_one_line(target, data, plan_json, monkeypatch):
    one(target, data, plan_json, monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
@settings(max_examples=SLOW_EXAMPLES, **SETTINGS)
@given(data=st.data())
def test_mutated_input_many(target, data, plan_json, monkeypatch):
    one(target, data, plan_json, monkeypatch)


def test_mutations_reach_both_outcomes(plan_json, monkeypatch):
    """The property is not vacuous: with no mutation the commands succeed (or reach the stub),
    and a known-bad mutation fails with one line."""
    class Fixed:
        def __init__(self, values):
            self.values = list(values)

        def draw(self, strategy):
            return self.values.pop(0)

    src = (ROOT / "hardware_profiles" / "clusters" / "cpu4x2.yaml").read_bytes()  # plans in 1 s
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        (d / "out").mkdir()
        f = d / "c.yaml"
        for data, want in ((src, "ok"), (src.replace(b"num_devices: 2", b"num_devices: .inf", 1), "error")):
            f.write_bytes(data)
            out = d / "out" / "plan.json"
            res = CliRunner().invoke(main, plan_args(f, out))
            assert check(res, [out], d / "out", valid=valid_plan(out)) == want
            out.unlink(missing_ok=True)
    assert run_csv(Fixed([CSV.read_bytes()]).draw, monkeypatch) == "reached"
    assert run_example(Fixed([EXAMPLES[0], EXAMPLES[0].read_bytes()]).draw, monkeypatch) == "reached"
    assert run_plan(Fixed([plan_json.read_bytes()]).draw, plan_json) == "ok"
