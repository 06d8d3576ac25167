"""Run a CP-SAT solve in a helper thread so the caller's signal handlers keep running and a
``stop`` event (Ctrl-C) can end it with ``CpSolver.StopSearch()``, never leaving CP-SAT running at
interpreter exit (:func:`run_solver`)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, cast

from ortools.sat.python import cp_model

if TYPE_CHECKING:
    from ortools.sat.python.cp_model_helper import CpSolverStatus


def run_solver(solver: cp_model.CpSolver, model: cp_model.CpModel, stop: threading.Event | None
               ) -> tuple[CpSolverStatus, bool]:
    """(status, stopped): ``solver.Solve(model)`` in a helper thread, polled every 50 ms for
    ``stop``.

    ``StopSearch`` is repeated at every poll while ``stop`` is set (it does nothing before CP-SAT
    has begun the solve). An exception in the waiting thread (a KeyboardInterrupt), wherever it
    lands, cancels a solve not yet begun or stops a running one and waits for it before
    propagating: a solver thread still inside CP-SAT at interpreter exit aborts the process
    ("terminate called without an active exception"). Completion is tracked with the thread's own
    event, not ``Thread.join``/``is_alive``: on Python 3.11 a KeyboardInterrupt inside a timed
    ``join`` can mark a running thread as stopped (``Thread._wait_for_tstate_lock``).
    """
    box: list[CpSolverStatus | BaseException | None] = []
    began, cancel, done = threading.Event(), threading.Event(), threading.Event()

    def target() -> None:
        began.set()
        try:
            box.append(None if cancel.is_set() else solver.Solve(model))
        except BaseException as e:   # re-raised in the caller's thread
            box.append(e)
        finally:
            done.set()

    th = threading.Thread(target=target, name="cp-sat", daemon=True)
    started = stopped = False
    try:
        th.start()
        started = True
        while not done.wait(0.05):
            if stop is not None and stop.is_set():
                solver.StopSearch()
                stopped = True
    finally:
        cancel.set()   # a thread that has not reached the solve yet now skips it
        # if start() itself was interrupted the thread may or may not exist: one that exists
        # announces itself within moments
        if not done.is_set() and (started or began.wait(5.0)):
            while True:
                try:
                    solver.StopSearch()
                    if done.wait(0.01):
                        break
                except BaseException:   # a further interrupt: end the solve first
                    pass
    if isinstance(box[0], BaseException):
        raise box[0]
    # not None: a solve cancelled before it began was interrupted, and that raised above
    return cast("CpSolverStatus", box[0]), stopped
