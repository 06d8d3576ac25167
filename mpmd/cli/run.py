"""``mpmd run plan.json``: compile a plan and run it on this machine's JAX devices."""

from __future__ import annotations

import socket
import sys

import click

from mpmd.cli.common import console, err_console, guard
from mpmd.cli.params import MAX_STEPS, FiniteFloat, int_range

DEFAULT_STEPS = 10
"""``mpmd run --steps``' default: a first run (check (d) needs 10 steps: the median of the later
half leaves XLA:CPU's warm-up out)."""


def cpu_devices(n: int) -> None:
    """Give JAX ``n`` CPU devices (only before its backend starts; GPUs are used when present)."""
    import jax

    jax.config.update("jax_num_cpu_devices", n)


def _check_process_flags(processes: int | None, process_id: int | None,
                         coordinator: str | None) -> None:
    """Refuse a combination of ``--processes``, ``--process-id`` and ``--coordinator`` that no
    run can take, or a coordinator that is not ``HOST:PORT``, before JAX loads (the runtime checks
    the same for its API callers: :func:`runtime.train.launch.run_processes`,
    :func:`runtime.train.process_run.start_distributed`).

    Raises:
        click.UsageError: one line naming the flag and the fix.
    """
    if processes is None:
        raise click.UsageError("--process-id and --coordinator need --processes N (the number of "
                               "processes of the run)")
    if (process_id is None) != (coordinator is None):
        raise click.UsageError("give --process-id and --coordinator together (each host runs one "
                               "process), or neither to start all processes on this host")
    if coordinator is not None:
        host, _, port = coordinator.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise click.UsageError(f"--coordinator {coordinator!r} is not HOST:PORT; pass e.g. "
                                   f"10.0.0.1:1234 (the host of process 0 and a free port)")
        try:     # here, before JAX loads; runtime.train.join checks the same for API callers
            socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as e:
            raise click.UsageError(f"--coordinator {coordinator}: host {host!r} does not resolve "
                                   f"on this machine ({getattr(e, 'strerror', None) or e}); pass "
                                   f"process 0's IP address or a name this host resolves") from None


@click.command()
@click.argument("plan_path", metavar="PLAN.json", type=click.Path(dir_okay=False))
@click.option("--steps", type=int_range(1, MAX_STEPS), default=DEFAULT_STEPS, show_default=True,
              help="Training steps to run. The default is sized for a first run: the README's "
                   "llama-tiny plan on cpu4x2 took 2.7 minutes, compiling included, on a 2-core "
                   "machine with other work beside it; the timing check (d) takes the median of "
                   "the later half, so fewer than 10 steps leave XLA's warm-up in it.")
@click.option("--cluster", "cluster_path", type=click.Path(dir_okay=False), default=None,
              help="Cluster YAML (default: the plan's).")
@click.option("--check-every", type=int_range(1, MAX_STEPS), default=1, show_default=True,
              help="Compare loss and gradients with jax.jit every N steps.")
@click.option("--lr", type=FiniteFloat(min=0.0, min_open=True, max=1e3), default=1e-3,
              show_default=True, help="Adam learning rate.")
@click.option("--processes", type=int_range(1, 4096), default=None,
              help="Run as N processes (one per mesh, or per group of meshes) on "
                   "jax.distributed; without --process-id, all N start on this host. Checks "
                   "the order; the jax.jit comparison needs one process.")
@click.option("--process-id", type=int_range(0, 4095), default=None,
              help="Run only process I of --processes N (one per host); needs --coordinator.")
@click.option("--coordinator", default=None, metavar="HOST:PORT",
              help="Process 0's address for jax.distributed (with --process-id).")
@click.option("--timeout", "timeout_s", type=int_range(10, 86400), default=900,
              show_default=True, help="Bound on a local --processes run, in seconds.")
@click.option("--join-timeout", "join_timeout_s", type=int_range(1, 86400), default=120,
              show_default=True,
              help="With --processes: seconds each process waits for the others to join (it "
                   "names them on stderr while it waits), then fails in one line.")
@click.option("--trace", "trace_path", type=click.Path(), default=None,
              help="Write the last step's measured timeline (all processes merged) as a "
                   "Perfetto/Chrome trace.")
@guard
def run(plan_path: str, steps: int, cluster_path: str | None, check_every: int, lr: float,
        processes: int | None, process_id: int | None, coordinator: str | None,
        timeout_s: int, join_timeout_s: int, trace_path: str | None) -> None:
    """Compile PLAN.json into per-mesh programs and run real training steps on shipped text.

    A forward-only (inference) plan of a DiT generates from noise instead: the model's
    sampling steps, each one run of the program, checked against jax.jit. A data-parallel plan
    runs its pipelines on their batch shares and all-reduces their gradients.

    Checks: (a) loss and gradients against jax.jit, (b) the executed order against the plan,
    (c) executables against fragment bodies, (d) the measured step against the simulated one.
    Exit status 1 when (a), (b) or (c) fails; a miss of (d), which depends on this machine's load
    and calibration, prints one line starting "warning: check (d) failed" with its likely causes
    and fixes, and exits 0. Exit status 2: bad input, or a process of a --processes run that
    failed or never joined."""
    # the input first, before JAX loads: a trace path that cannot be written, bad process
    # flags, a missing or malformed plan file or a missing cluster file is refused in ~0.2 s
    from hardware_profiles.paths import resolve_cluster_path
    from ir.files import check_output
    from ir.plan_file import load_plan

    if trace_path and not process_id:      # process 0 (or every local process) writes it
        check_output(trace_path, "trace")
    multi = processes is not None or process_id is not None or coordinator is not None
    if multi:
        _check_process_flags(processes, process_id, coordinator)
    plan = load_plan(plan_path)                               # InputError / IRError
    if cluster_path or plan.cluster_path:
        resolve_cluster_path(cluster_path or plan.cluster_path)   # ProfileError: no such file
    from zoo.config import get_config
    from zoo.model_files import plan_model

    cfg = get_config(plan_model(plan.model, plan.model_config), seq_len=plan.seq_len)  # ZooError
    if process_id is None:               # every process of the run on this host
        from runtime.train.host_memory import check_host_memory

        check_host_memory(cfg, plan.global_batch)                  # RunError: it cannot hold it
    if multi:
        from runtime.train.launch import run_processes

        report = run_processes(plan_path, processes, process_id, coordinator, steps=steps,
                               cluster_path=cluster_path, lr=lr, timeout_s=timeout_s,
                               trace_path=trace_path, console=console,
                               join_timeout_s=join_timeout_s)
        if report is not None and report.order_mismatches:
            _fail(["(b) executed order differs from the plan: "
                   + "; ".join(report.order_mismatches)])
        return
    cpu_devices(8)
    from ir import DataParallelPlan
    from runtime.train.serve_run import decode_plan, is_decoder_plan, print_decode_report

    # forward-only decoder (never a data-parallel plan): greedy decoding with a KV cache
    if not isinstance(plan, DataParallelPlan) and is_decoder_plan(plan):
        return print_decode_report(decode_plan(plan, cluster_path=cluster_path), console)
    from runtime.train.generate import GenerateReport
    from runtime.train.report import RunReport, cpu_sample, other_cores
    from runtime.train.run import print_report, run_plan

    start = cpu_sample()
    run_report = run_plan(plan, steps=steps, cluster_path=cluster_path,
                          check_every=check_every, lr=lr, console=console)
    print_report(run_report, console=console,
                 cluster_path=cluster_path or plan.cluster_path or None,
                 others=other_cores(start, cpu_sample()))
    failed = run_report.failed_checks if isinstance(run_report, RunReport) else ()
    if trace_path is None:
        if failed:
            _fail(failed)
        return
    if isinstance(run_report, GenerateReport):
        # a generation run (a forward-only DiT plan) records no step timeline
        console.print("no trace written: a generation run records no step timeline", highlight=False)
    elif run_report.timelines:
        from simulator.trace import write_chrome_trace

        write_chrome_trace(run_report.timelines[-1], trace_path)
    if failed:
        _fail(failed)


def _fail(failed: "list[str] | tuple[str, ...]") -> None:
    """One line per failed correctness check on stderr, then exit status 1."""
    for line in failed:
        err_console.print(f"error: check {line}", highlight=False, soft_wrap=True, markup=False)
    sys.exit(1)
