"""One small what-if run shared by the report tests: llama3-8b on two small clusters (one mixed H100 + p150b) plus one that
cannot hold it (1 H100).

The planner budget (30 s, the CLI's default) is what makes the run the same on any machine: every
CP-SAT solve ends OPTIMAL or INFEASIBLE well inside its share of the deterministic budget, and
the whole search takes about 5 s of wall time on the 2-core development VM, so the wall-clock limit
never cuts it. With 2 s, the mixed cluster's search stopped after 4 of 6 candidates on that VM,
where the clock ran out: the plan depended on the machine's speed and load."""

import pytest

SMALL_OPTIONS = ("loudbox_p150bx8", "h100x16_p150bx32", "h100x1")
SMALL = {"global_batch": 16, "seq_len": 2048, "tokens": 1e10, "deadline_days": 20.0,
         "time_limit_s": 30.0}


@pytest.fixture(scope="session")
def small_spec():
    """(options, keyword arguments) of the shared run."""
    return SMALL_OPTIONS, dict(SMALL)


@pytest.fixture(scope="session")
def small_df():
    from reports import whatif

    return whatif("llama3-8b", SMALL_OPTIONS, **SMALL)


@pytest.fixture(scope="session")
def small_report(small_df, tmp_path_factory):
    from reports.render import write_report

    return write_report(small_df, tmp_path_factory.mktemp("whatif") / "small")
