"""The fixed name lists the CLI offers as choices come from ``ir.vocab``, the one light module
the packages acting on them use too: the choices ``mpmd --help`` shows are the names the planner
and the launchers accept."""

from __future__ import annotations

import click

from ir import vocab
from mpmd.cli import export, plan


def _choices(command: click.Command, option: str) -> tuple[str, ...]:
    [param] = [p for p in command.params if p.name == option]
    assert isinstance(param.type, click.Choice)
    return tuple(param.type.choices)


def test_plan_objective_choices_are_the_planners_goals() -> None:
    from planner.objective import GOALS

    # plus latency: a video pipeline one video at a time, routed to planner.video (mpmd video)
    assert _choices(plan.plan_command, "objective") == (*vocab.GOALS, "latency")
    assert vocab.GOALS == GOALS == ("time", "cost")


def test_export_target_choices_are_the_launchers_targets() -> None:
    from launchers import TARGETS

    assert _choices(export.export, "target") == vocab.EXPORT_TARGETS == tuple(TARGETS) == (
        "megatron", "megatron-bridge", "torchtitan", "torchtitan@0.2", "maxtext")


def test_the_vocabulary_module_imports_nothing() -> None:
    """``ir.vocab`` must stay importable before anything heavy: its source imports only
    ``__future__``."""
    src = open(vocab.__file__).read()
    imports = [ln for ln in src.splitlines() if ln.startswith(("import ", "from "))]
    assert imports == ["from __future__ import annotations"]
