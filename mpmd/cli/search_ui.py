"""``mpmd plan``'s search, interactively: progress on stderr and Ctrl-C.

- :class:`SearchProgress` is the planner's progress callback ``(done, total, best_s)``. On a
  terminal it is a transient rich progress bar (candidates done/total, best step time so far,
  elapsed); elsewhere (a pipe, a log file) it prints a plain line to stderr once the search has run
  :data:`DELAY_S` seconds, then at most every :data:`EVERY_S` seconds, and a heartbeat line at least
  every :data:`HEARTBEAT_S` seconds while a long candidate runs. Stdout is left alone.
- :class:`CtrlC` installs, for the duration of a ``with`` block, a SIGINT handler that sets a
  stop event on the first Ctrl-C (the planner then returns its best plan so far) and an abort
  flag on the second (the CLI then ends with nothing written); the previous handler is restored
  on exit.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:   # rich's progress bar loads only on a terminal
    from rich.progress import Progress, TaskID

DELAY_S = 3.0
"""Plain progress lines start once the search has run this long (short runs print none)."""
EVERY_S = 2.0
"""At most one plain progress line per this many seconds."""
HEARTBEAT_S = 10.0
"""A plain progress line at least this often, even while one candidate's solve runs long."""


class SearchProgress:
    """Progress of the planner's search, on ``console`` (a rich Console writing to stderr)."""

    def __init__(self, console: Any, label: str) -> None:
        self.console, self.label = console, label
        self.done, self.total = 0, 0
        self.best_s: float | None = None
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._last_line = -1e9
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        self._beat: threading.Thread | None = None

    def __enter__(self) -> "SearchProgress":
        self.t0 = time.monotonic()
        if self.console.is_terminal:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(TextColumn("[bold]planning[/] {task.description}"), BarColumn(),
                                 TextColumn("{task.fields[count]}"),
                                 TextColumn("best {task.fields[best]}"), TimeElapsedColumn(),
                                 console=self.console, transient=True)
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=None, count="", best="-")
        else:
            self._beat = threading.Thread(target=self._heartbeat, name="plan-progress", daemon=True)
            self._beat.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._closed.set()
        if self._bar is not None:
            self._bar.stop()
        if self._beat is not None:
            self._beat.join(timeout=1.0)

    def __call__(self, done: int, total: int, best_s: float | None) -> None:
        with self._lock:
            self.done, self.total, self.best_s = done, total, best_s
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=done, total=total,
                             count=f"{done}/{total} candidates",
                             best="-" if best_s is None else f"{best_s:.3f} s/step")
        elif time.monotonic() - self.t0 >= DELAY_S:
            self._line(min_gap=EVERY_S)

    def line(self) -> str:
        """The plain progress line, e.g. ``planning llama3-70b on c: 5/18 candidates, best
        75.338 s/step, 6 s elapsed``."""
        best = "none yet" if self.best_s is None else f"{self.best_s:.3f} s/step"
        return (f"planning {self.label}: {self.done}/{self.total} candidates, best {best}, "
                f"{time.monotonic() - self.t0:.0f} s elapsed")

    def _line(self, min_gap: float) -> None:
        with self._lock:
            now = time.monotonic()
            if self._closed.is_set() or not self.total or now - self._last_line < min_gap:
                return
            self._last_line = now
            self.console.print(self.line(), highlight=False, soft_wrap=True)
            self.console.file.flush()

    def _heartbeat(self) -> None:
        if self._closed.wait(DELAY_S):
            return
        self._line(min_gap=EVERY_S)
        while not self._closed.wait(1.0):
            self._line(min_gap=HEARTBEAT_S)


class Aborted(Exception):
    """Ctrl-C was pressed a second time: the command ends at once with nothing written."""


class CtrlC:
    """Ctrl-C for ``mpmd plan``, as a ``with`` block around the search and the output.

    Inside the block the first SIGINT sets :attr:`stop` (the planner returns its best plan so far)
    and, while :attr:`searching`, says so on stderr at once; the second sets :attr:`aborted`, and
    :meth:`check` (called after the search and before each output) raises :class:`Aborted`. The
    handler never raises: an exception landing at an arbitrary point could leave a solver thread
    running or a file half-handled; the planner already winds down within about 50 ms once
    :attr:`stop` is set. :meth:`committing` wraps the write: an abort before it writes nothing,
    one during or after it is ignored. The previous handler is restored on exit. Outside the main
    thread (where Python allows no signal handlers) nothing is installed.
    """

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.searching = True
        self.aborted = False
        self._armed = True
        self._installed = False
        self._old: Any = None

    def __enter__(self) -> "CtrlC":
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGINT, self._handler)
            self._installed = True
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._old)
            self._installed = False

    def _handler(self, signum: int, frame: Any) -> None:
        if not self._armed:
            return
        if self.stop.is_set():
            self.aborted = True
            return
        self.stop.set()
        if self.searching:   # os.write: no lock a print in progress could hold
            os.write(2, b"stopping the search (Ctrl-C again to abort, writing nothing) ...\n")

    def check(self) -> None:
        """Raise :class:`Aborted` once Ctrl-C was pressed twice."""
        if self.aborted:
            raise Aborted

    @contextmanager
    def committing(self) -> Iterator[None]:
        """:meth:`check`, then the block (the write); afterwards Ctrl-C is ignored."""
        self.check()
        yield
        self._armed = False
