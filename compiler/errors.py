"""Errors of the MPMD compiler: one base class, one subclass per kind of mistake.

Messages are one line, name the offending value (fragment, mesh, value) and say how to fix it.
"""

from __future__ import annotations


class CompilerError(Exception):
    """Base class of every error the MPMD compiler raises."""


class ConfigError(CompilerError):
    """The :class:`compiler.config.MpmdConfig` is inconsistent (e.g. names an unknown mesh)."""


class AssignmentError(CompilerError):
    """A named computation, input or output cannot be assigned to a mesh."""


class InferenceError(CompilerError):
    """Mesh inference failed, e.g. a transfer is needed while transfer inference is off."""


class ScheduleError(CompilerError):
    """A schedule does not match the program (unknown stage/microbatch, missing fragment, cycle)."""


class MergeError(CompilerError):
    """A merge rule or stage merge cannot be applied (it would create a cycle)."""


class VerificationError(CompilerError):
    """The IR verifier found a malformed program (the message names the value and the op)."""


def did_you_mean(value: str, known: "list[str] | tuple[str, ...] | set[str]", *,
                 listed: int = 12) -> str:
    """``"did you mean 'x'? (known: 'a', 'b', ...)"`` for an unknown ``value`` among ``known``.

    The closest names come from :func:`difflib.get_close_matches` (cutoff 0.6; only those tied
    for the best score, in natural order); the known names
    are listed in natural order (``block2`` before ``block10``), the first ``listed`` of them, then how many there are in all.
    """
    import difflib
    import re

    names = sorted(set(known), key=lambda n: [int(t) if t.isdigit() else t
                                              for t in re.split(r"(\d+)", n)])
    close = difflib.get_close_matches(value, names, n=3)
    if close:  # only the best-scoring ones: 'layer_3' suggests 'layer3', not 'layer2' too
        score = {c: difflib.SequenceMatcher(None, value, c).ratio() for c in close}
        close = [c for c in names if c in score and score[c] == max(score.values())]
    shown = ", ".join(repr(n) for n in names[:listed])
    if len(names) > listed:
        shown += f", ... ({len(names)} in all)"
    hint = ("did you mean " + " or ".join(repr(c) for c in close) + "? ") if close else ""
    return f"{hint}(known: {shown or 'none'})"
