"""Who a multi-process ``mpmd run`` waits for: a roll call on the coordinator's port before
``jax.distributed`` starts.

``jax.distributed.initialize`` waits silently for every process and, when one never comes (or the
coordinator's host cannot be reached), aborts the whole Python process after its timeout with a
C++ stack trace (``DEADLINE_EXCEEDED ... RegisterTask``, exit 134). So before it, the processes
meet on the same ``HOST:PORT`` over plain TCP (:func:`roll_call`):

- process 0 listens there, says which processes it waits for and names each one as it joins;
- every other process says it waits for process 0, connects (retrying until process 0 listens),
  sends ``JOIN <id> <processes>`` and waits for process 0's ``GO``, sent once all have joined;
  then it closes first (so no socket of process 0 lingers on the port), and process 0 closes its
  listener and starts ``jax.distributed``'s coordinator on the same port;
- a process that waits past ``timeout_s``, a coordinator host that does not resolve, a duplicate
  id or a different process count ends in one :class:`ProcessRunError` line naming the processes
  and the fix (``mpmd run`` prints it and exits 2).
"""

from __future__ import annotations

import select
import socket
import sys
import time
from typing import Callable

from compiler.errors import CompilerError

#: seconds a process waits for all processes to join before failing (``mpmd run --join-timeout``)
JOIN_TIMEOUT_S = 120
#: seconds process 0 gives a joined peer to answer and to close after ``GO``
PEER_REPLY_S = 5.0


class ProcessRunError(CompilerError):
    """A multi-process run cannot start or proceed (bad coordinator, process id, grouping, a
    process that never joined)."""


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def split_coordinator(coordinator: str) -> tuple[str, int]:
    """``HOST:PORT`` as (host, port); ``[::1]:6000`` gives ``("::1", 6000)``.

    Raises:
        ProcessRunError: not ``HOST:PORT`` with a port in 1..65535."""
    host, _, port = coordinator.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ProcessRunError(f"--coordinator {coordinator!r} is not HOST:PORT; pass e.g. "
                              f"10.0.0.1:1234 (the host of process 0 and a free port)")
    return host.strip("[]"), int(port)


def resolve_coordinator(coordinator: str) -> tuple[str, int, str]:
    """(host, port, the first address it resolves to).

    Raises:
        ProcessRunError: malformed, or the host does not resolve on this machine."""
    host, port = split_coordinator(coordinator)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise ProcessRunError(f"--coordinator {coordinator}: host {host!r} does not resolve on this "
                              f"machine ({getattr(e, 'strerror', None) or e}); pass process 0's IP "
                              f"address or a name this host resolves") from None
    return host, port, str(infos[0][4][0])


def roll_call(coordinator: str, processes: int, process_id: int, timeout_s: float, *,
              loopback: bool = False, say: Callable[[str], None] = _stderr) -> None:
    """Wait until all ``processes`` have joined at ``coordinator``; see the module docstring.

    ``say`` prints the progress lines (default: stderr). With ``loopback`` process 0 listens on
    127.0.0.1 only.

    Raises:
        ProcessRunError: a process did not join within ``timeout_s`` (named), the coordinator's
            host does not resolve, or the processes disagree (a duplicate id, another count).
    """
    if not 0 <= process_id < processes:
        raise ProcessRunError(f"--process-id {process_id} is outside 0..{processes - 1}; give each "
                              f"process a distinct id below --processes {processes}")
    host, port, addr = resolve_coordinator(coordinator)
    if processes == 1:
        return
    if process_id == 0:
        _host_call(host, port, processes, timeout_s, loopback, say)
    else:
        _join(host, port, addr, processes, process_id, timeout_s, say)


def _ids(ids: list[int]) -> str:
    return ", ".join(map(str, ids))


def _host_call(host: str, port: int, processes: int, timeout_s: float, loopback: bool,
               say: Callable[[str], None]) -> None:
    """Process 0: accept ``JOIN`` lines until every process has joined, then ``GO`` to all."""
    where = f"{host}:{port}"
    try:
        if loopback:
            srv = socket.create_server(("127.0.0.1", port))
        elif socket.has_dualstack_ipv6():
            srv = socket.create_server(("::", port), family=socket.AF_INET6, dualstack_ipv6=True)
        else:
            srv = socket.create_server(("", port))
    except OSError as e:
        raise ProcessRunError(f"process 0 cannot listen on port {port} ({e.strerror or e}); pass "
                              f"a free port in --coordinator {where}") from None
    waiting = list(range(1, processes))
    peers: dict[int, socket.socket] = {}
    say(f"process 0 of {processes}: waiting up to {timeout_s:g} s at {where} for process"
        f"{'es' * (len(waiting) > 1)} {_ids(waiting)} (started with --processes {processes} "
        f"--process-id I --coordinator {where})")
    deadline = time.monotonic() + timeout_s
    try:
        with srv:
            while waiting:
                left = deadline - time.monotonic()
                if left <= 0:
                    _tell(peers, f"ERR process 0 gave up: process{'es' * (len(waiting) > 1)} "
                                 f"{_ids(waiting)} did not join within {timeout_s:g} s")
                    them = "them" if len(waiting) > 1 else "it"
                    raise ProcessRunError(
                        f"process 0 of {processes}: process{'es' * (len(waiting) > 1)} "
                        f"{_ids(waiting)} did not join at {where} within {timeout_s:g} s; start "
                        f"{them} with --processes {processes} --process-id I --coordinator {where} "
                        f"(the same plan), or raise --join-timeout")
                if not select.select([srv], [], [], min(left, 0.5))[0]:
                    continue
                conn, peer_addr = srv.accept()
                got = _hello(conn, processes)
                if isinstance(got, str):          # a refusal: tell that process, keep waiting
                    _send(conn, f"ERR {got}")
                    conn.close()
                    continue
                if got in peers:
                    _send(conn, f"ERR process id {got} has already joined (from another host); "
                                f"give each process a distinct --process-id")
                    conn.close()
                    continue
                peers[got] = conn
                waiting.remove(got)
                say(f"process {got} joined from {str(peer_addr[0]).removeprefix('::ffff:')}" + (
                    f"; waiting for {_ids(waiting)}" if waiting else f": all {processes} "
                                                                     f"processes joined"))
            _tell(peers, "GO")
            for conn in peers.values():           # the peer closes first: no lingering port
                conn.settimeout(PEER_REPLY_S)
                try:
                    conn.recv(1)
                except OSError:
                    pass
    finally:
        for conn in peers.values():
            conn.close()


def _hello(conn: socket.socket, processes: int) -> int | str:
    """A peer's ``JOIN <id> <processes>``: its id, or why it is refused (a string)."""
    conn.settimeout(PEER_REPLY_S)
    try:
        words = conn.makefile("r").readline().split()
    except (OSError, UnicodeDecodeError):
        return "no JOIN line"
    if len(words) != 3 or words[0] != "JOIN" or not words[1].isdigit() or not words[2].isdigit():
        return "not a JOIN line of mpmd run"
    pid, n = int(words[1]), int(words[2])
    if n != processes:
        return (f"process 0 runs --processes {processes}, process {pid} passed --processes {n}; "
                f"give every process the same count")
    if not 0 < pid < processes:
        return f"--process-id {pid} is outside 1..{processes - 1}"
    return pid


def _send(conn: socket.socket, line: str) -> None:
    try:
        conn.sendall((line + "\n").encode())
    except OSError:
        pass


def _tell(peers: dict[int, socket.socket], line: str) -> None:
    for conn in peers.values():
        _send(conn, line)


def _join(host: str, port: int, addr: str, processes: int, process_id: int, timeout_s: float,
          say: Callable[[str], None]) -> None:
    """A process other than 0: connect to process 0 (retrying), send ``JOIN``, await ``GO``."""
    where = f"{host}:{port}" + (f" ({addr})" if addr != host else "")
    say(f"process {process_id} of {processes}: waiting up to {timeout_s:g} s for process 0 at "
        f"{where}")
    deadline = time.monotonic() + timeout_s
    conn = None
    while conn is None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ProcessRunError(
                f"process {process_id} of {processes}: process 0 did not answer at {where} within "
                f"{timeout_s:g} s; start process 0 there (--process-id 0, the same --coordinator), "
                f"check that its port is reachable from here, or raise --join-timeout")
        try:
            conn = socket.create_connection((host, port), timeout=min(left, PEER_REPLY_S))
        except OSError:
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    with conn:
        _send(conn, f"JOIN {process_id} {processes}")
        say(f"process {process_id}: reached process 0; waiting for the others to join")
        # process 0 answers by its own deadline, at most timeout_s from now
        conn.settimeout(timeout_s + PEER_REPLY_S)
        try:
            line = conn.makefile("r").readline().strip()
        except (OSError, UnicodeDecodeError):
            line = ""
        if line == "GO":
            return
        if line.startswith("ERR "):
            raise ProcessRunError(f"process {process_id} of {processes}: {line[4:]}")
        raise ProcessRunError(f"process {process_id} of {processes}: process 0 at {where} closed "
                              f"the connection before every process joined; see its output")
