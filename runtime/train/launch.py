"""``mpmd run PLAN --processes N`` on one host: start N worker processes and watch them.

:func:`launch` picks a free port on 127.0.0.1 for ``jax.distributed``'s coordinator, starts N
Python processes (``python -m runtime.train.launch --worker ...``), each running
:func:`runtime.train.process_run.run_worker` with its process id, and waits for all of them:

- a worker that exits non-zero stops the run: the others are killed and :class:`LaunchError` names
  the process and the last line of its error output;
- the whole run is bounded by ``timeout_s``; past it every worker is killed;
- workers die with the launcher (each sets ``PR_SET_PDEATHSIG`` on Linux; the launcher's
  ``finally`` kills and reaps whatever still runs), so no process outlives it;
- the coordinator binds 127.0.0.1 and gloo listens on the host name's address (127.0.0.1 here).

The process holding the loss prints each step's loss (relayed by the launcher);
process 0 writes the merged report (JSON) into a temporary folder the launcher reads back, and the
merged Perfetto trace where ``trace_path`` says. On several hosts, run the same command on each with
``--process-id`` and ``--coordinator`` instead (see the README); no launcher is involved.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from rich.console import Console

from compiler.distributed import assign_meshes
from compiler.errors import CompilerError
from runtime.train.join import JOIN_TIMEOUT_S
from runtime.train.process_run import (DistributedReport, ProcessRunError, print_distributed_report,
                                       run_worker)
from runtime.train.step import RunError, load_run_plan, run_cluster

#: default bound on a whole local multi-process run, s
DEFAULT_TIMEOUT_S = 900


class LaunchError(CompilerError):
    """A worker failed, or the run timed out; the message names the process and its error."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent(parent: int) -> None:
    """In a worker: be killed when the launcher ``parent`` dies (Linux ``PR_SET_PDEATHSIG``), and
    exit now if it already has. Set by the worker itself, first thing: a ``preexec_fn`` would run
    Python between fork and exec in the launcher, which JAX's threads make unsafe."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(3)


def _last_line(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no error output"
    return lines[-1] if lines else "no error output"


def launch(plan_path: str | Path, processes: int, *, steps: int = 3,
           cluster_path: str | Path | None = None, lr: float = 1e-3, seed: int = 0,
           model_overrides: Mapping[str, Any] | None = None,
           trace_path: str | Path | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
           console: Any = None, join_timeout_s: float = JOIN_TIMEOUT_S) -> DistributedReport:
    """Run a plan as ``processes`` local processes; see the module docstring. Each worker waits
    at most ``join_timeout_s`` for the others to join (:func:`runtime.train.join.roll_call`).

    Returns:
        The merged :class:`runtime.train.process_run.DistributedReport`.

    Raises:
        LaunchError: a worker failed (named, with its last error line) or the run timed out.
    """
    plan = load_run_plan(plan_path)   # bad plans and groupings fail here, once, not in N workers
    cpath = cluster_path or plan.cluster_path
    if not cpath:
        raise RunError("the plan names no cluster file; pass --cluster")
    assign_meshes(list(run_cluster(plan, cpath).meshes), processes)
    coordinator = f"127.0.0.1:{free_port()}"
    env = dict(os.environ)
    env["JAX_PLATFORMS"] = "cpu"
    root = str(Path(__file__).resolve().parents[2])   # the project, importable in the workers
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    with tempfile.TemporaryDirectory(prefix="mpmd-run-") as tmp:
        result = Path(tmp) / "report.json"
        spec = {"plan_path": str(Path(plan_path).resolve()), "processes": processes,
                "coordinator": coordinator, "steps": steps,
                "cluster_path": str(Path(cluster_path).resolve()) if cluster_path else None,
                "lr": lr, "seed": seed, "model_overrides": dict(model_overrides or {}),
                "trace_path": str(Path(trace_path).resolve()) if trace_path else None,
                "result_path": str(result), "launcher": os.getpid(),
                "join_timeout_s": min(join_timeout_s, timeout_s)}
        procs: list[subprocess.Popen] = []
        errs: list[Path] = []
        progress = _Progress([Path(tmp) / f"process{i}.out" for i in range(processes)], console)
        try:
            for i in range(processes):
                errs.append(Path(tmp) / f"process{i}.err")
                with open(errs[-1], "wb") as err, open(Path(tmp) / f"process{i}.out", "wb") as out:
                    procs.append(subprocess.Popen(
                        [sys.executable, "-m", "runtime.train.launch", "--worker",
                         json.dumps({**spec, "process_id": i})],
                        stdout=out, stderr=err, env=env, stdin=subprocess.DEVNULL))
            print(f"started {processes} processes on this host (coordinator {coordinator}); "
                  f"waiting up to {timeout_s:g} s for all of them to finish (--timeout)",
                  file=sys.stderr, flush=True)
            _wait(procs, errs, timeout_s, progress)
            progress()
        finally:
            _kill(procs)
        report = DistributedReport.from_json(json.loads(result.read_text()))
        # the workers read the resolved path; the report names the plan as the user gave it
        return dataclasses.replace(report, plan_path=str(plan_path))


class _Progress:
    """Relays the workers' ``step K: loss ...`` lines (printed by the process holding the loss) to
    the console as they are written."""

    def __init__(self, paths: Sequence[Path], console: Any) -> None:
        self.paths, self.console, self.pos = list(paths), console, [0] * len(paths)

    def __call__(self) -> None:
        if self.console is None:
            return
        for k, path in enumerate(self.paths):
            if not path.exists():
                continue
            with open(path, "rb") as f:
                f.seek(self.pos[k])
                data = f.read()
            cut = data.rfind(b"\n") + 1
            self.pos[k] += cut
            for line in data[:cut].decode(errors="replace").splitlines():
                if line.startswith("step "):
                    self.console.print(line, highlight=False)


def _wait(procs: Sequence[subprocess.Popen], errs: Sequence[Path], timeout_s: float,
          progress: _Progress | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if progress is not None:
            progress()
        codes = [p.poll() for p in procs]
        bad = [i for i, c in enumerate(codes) if c not in (None, 0)]
        if bad:
            i = bad[0]
            raise LaunchError(f"process {i} of {len(procs)} failed (exit {codes[i]}): "
                              f"{_last_line(errs[i])}")
        if all(c == 0 for c in codes):
            return
        if time.monotonic() > deadline:
            late = [i for i, c in enumerate(codes) if c is None]
            raise LaunchError(f"processes {late} did not finish within {timeout_s:g} s; raise "
                              f"--timeout or run fewer --steps")
        time.sleep(0.1)


def _kill(procs: Sequence[subprocess.Popen]) -> None:
    """Stop every worker still running (SIGTERM, then SIGKILL after 5 s) and reap them all."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + 5
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def run_processes(plan_path: str | Path, processes: int | None, process_id: int | None,
                  coordinator: str | None, *, steps: int, cluster_path: str | Path | None,
                  lr: float, timeout_s: float, trace_path: str | Path | None,
                  console: Any = None, join_timeout_s: float = JOIN_TIMEOUT_S
                  ) -> DistributedReport | None:
    """``mpmd run PLAN --processes N [--process-id I --coordinator HOST:PORT]``.

    Without ``process_id``: start all N processes on this host (:func:`runtime.train.launch.launch`)
    and print the merged report. With it: run process I only (one command per host, the same
    plan file on each); process 0 prints the report and writes the trace. Each process names on
    stderr the processes it waits for, for at most ``join_timeout_s`` seconds.

    Raises:
        ProcessRunError: ``--process-id`` and ``--coordinator`` not given together, or without
            ``--processes``; plus whatever :func:`run_worker` / ``launch`` raise.
    """
    if processes is None:
        raise ProcessRunError("--process-id and --coordinator need --processes N (the number of "
                              "processes of the run)")
    if (process_id is None) != (coordinator is None):
        raise ProcessRunError("give --process-id and --coordinator together (each host runs one "
                              "process), or neither to start all processes on this host")
    if process_id is None:
        report = launch(plan_path, processes, steps=steps, cluster_path=cluster_path, lr=lr,
                        trace_path=trace_path, timeout_s=timeout_s, console=console,
                        join_timeout_s=join_timeout_s)
    else:
        report = run_worker(plan_path, process_id=process_id, processes=processes,
                            coordinator=coordinator, steps=steps, cluster_path=cluster_path,
                            lr=lr, trace_path=trace_path, console=console,
                            join_timeout_s=join_timeout_s)
    if report is not None:
        print_distributed_report(report, console)
        if trace_path is not None:
            (console.print if console is not None else print)(f"wrote {trace_path}")
    return report


def _worker_main(argv: Sequence[str]) -> int:
    """``python -m runtime.train.launch --worker JSON``: one worker; its last stderr line is its
    error, for the launcher."""
    import traceback

    if len(argv) != 2 or argv[0] != "--worker":
        print("usage: python -m runtime.train.launch --worker JSON (started by 'mpmd run "
              "--processes N')", file=sys.stderr)
        return 2
    spec = json.loads(argv[1])
    _die_with_parent(spec["launcher"])
    sys.stdout.reconfigure(line_buffering=True)   # the launcher relays progress lines as they come
    try:
        console = Console(width=None if sys.stdout.isatty() else 120)

        run_worker(spec["plan_path"], process_id=spec["process_id"], processes=spec["processes"],
                   coordinator=spec["coordinator"], steps=spec["steps"],
                   cluster_path=spec["cluster_path"], lr=spec["lr"], seed=spec["seed"],
                   model_overrides=spec["model_overrides"], trace_path=spec["trace_path"],
                   result_path=spec["result_path"], loopback=True, console=console,
                   join_timeout_s=spec.get("join_timeout_s", JOIN_TIMEOUT_S))
    except Exception as e:  # noqa: BLE001 - reported to the launcher as one line
        traceback.print_exc(file=sys.stderr)
        msg = str(e).splitlines()[0] if str(e) else ""
        print(f"{type(e).__name__}: {msg}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(2)   # now: a normal exit could wait on jax.distributed's peers
    return 0


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1:]))
