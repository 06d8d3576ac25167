"""The IR's one exception: a malformed value (the message names the field and the bad value)."""

from __future__ import annotations


class IRError(ValueError):
    """A value of the IR is malformed (the message names the field and the bad value)."""
