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
