"""The zoo's one base error (a leaf module: :mod:`zoo.schema` and :mod:`zoo.config` both raise it)."""

from __future__ import annotations

__all__ = ["ZooError"]


class ZooError(ValueError):
    """An unknown model name or a bad model description (the message names it and the fix)."""
