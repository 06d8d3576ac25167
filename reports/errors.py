"""The base error of ``reports``."""


class ReportError(ValueError):
    """A bad what-if input (option, sweep spec, price, example name); one line naming the fix."""
