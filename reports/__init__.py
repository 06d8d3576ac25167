"""What-if reports for hardware purchasing: plan every option, replay it, cost it, render it.

``reports.whatif(model, options=[...]) -> pandas.DataFrame`` is the API; ``mpmd whatif`` the CLI.
"""

from reports.errors import ReportError
from reports.recommend import pareto_front, recommendation
from reports.spec import EXAMPLES_DIR, Option, list_examples, load_example
from reports.sweep import SweepSpec
from reports.sweep import generate as generate_sweep
from reports.sweep import parse_spec as parse_sweep
from reports.whatif import whatif

__all__ = [
    "EXAMPLES_DIR",
    "Option",
    "ReportError",
    "SweepSpec",
    "generate_sweep",
    "list_examples",
    "load_example",
    "pareto_front",
    "parse_sweep",
    "recommendation",
    "whatif",
]
