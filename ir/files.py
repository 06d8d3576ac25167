"""The one place the tool reads a user's file and writes an output.

Every file the tool reads (cluster and device YAML, what-if examples and sweep specs, plan JSON, the
validation and measurement CSVs) goes through :func:`read_text`, and then :func:`read_yaml`,
:func:`read_json` or :func:`read_csv_table` (:func:`read_csv_rows`); every output path is checked
by :func:`check_output` before the command's work and written by :func:`write_atomic`. Hostile
input (a binary file, a file that is not UTF-8, a 100 000-level nesting, a YAML alias bomb,
``.inf``/``NaN``, a huge file, a directory, a device file) raises :class:`InputError`: one line
naming the path, what was wrong and the fix, raised before any output is written and, for
nesting and aliases, while the document is being composed (so it fails in milliseconds, never
with ``RecursionError``); so does an output path that cannot be written.

Limits (module constants): :data:`MAX_TEXT_BYTES` (32 MiB) for YAML and JSON, :data:`MAX_CSV_BYTES`
(128 MiB) for CSV, :data:`MAX_DEPTH` (32) nesting levels, :data:`MAX_ALIASES` (100) YAML aliases
expanding to at most :data:`MAX_EXPANDED` (100 000) values.
The bundled files nest at most 6 levels and use no aliases.

Layering: a leaf module. It imports no project package, so every package (``hardware_profiles``
included) may import it; ``mpmd/__init__.py`` stays import-free.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

import yaml

__all__ = ["InputError", "MAX_ALIASES", "MAX_CSV_BYTES", "MAX_DEPTH", "MAX_EXPANDED", "MAX_TEXT_BYTES",
           "NAME_PATTERN", "check_finite", "check_output", "read_csv_rows", "read_csv_table", "read_json",
           "read_text", "read_yaml", "write_atomic"]

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$"
"""Cluster, mesh, device and host names: letters, digits and ``_ . + -`` (a name appears in link
names ``a<->b``, in knobs ``MESH=2``/``MESH@1.5`` and in printed tables, so it holds none of
``< > = @ [ ]``, spaces or control characters)."""

MAX_TEXT_BYTES = 32 * 2**20
"""Largest YAML or JSON file read, bytes (the bundled ones are under 100 KB; a plan under 1 MB)."""

MAX_CSV_BYTES = 128 * 2**20
"""Largest CSV file read, bytes."""

MAX_DEPTH = 32
"""Deepest nesting of mappings and lists accepted in YAML and JSON."""

MAX_ALIASES = 100
"""Most YAML aliases (``*name``) in one document."""

MAX_EXPANDED = 100_000
"""Most values a YAML document that uses aliases may expand to (a "billion laughs" bomb nests
9 aliases 9 deep: 81 aliases, 9**9 values)."""


class InputError(ValueError):
    """A file the tool cannot use: one line naming the path, what is wrong and the fix."""


def _one_line(text: str, limit: int = 300) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[:limit - 3] + "..."


def _short(value: Any, limit: int = 60) -> str:
    r = repr(value)
    return r if len(r) <= limit else r[:limit - 3] + "..."


# ----------------------------------------------------------------------------- bytes
def read_text(path: str | Path, what: str, *, max_bytes: int = MAX_TEXT_BYTES) -> str:
    """The text of the regular file ``path``, strictly UTF-8 (a leading BOM is dropped).

    Args:
        path: the file.
        what: what the file should be, for messages (``"cluster"``, ``"plan JSON"``).
        max_bytes: the largest size accepted, bytes.

    Raises:
        InputError: missing file, a directory, not a regular file (a device or a pipe), unreadable,
            over ``max_bytes``, a NUL byte (a binary file), or bytes that are not UTF-8 (the offset
            of the first bad byte is named).
    """
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise InputError(f"{p}: {what} file not found; fix: check the path") from None
    except (OSError, ValueError) as e:
        reason = getattr(e, "strerror", None) or str(e)
        raise InputError(_one_line(f"{p}: cannot read the {what} file ({reason}); fix: check the path")) from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"{p}: is a directory, not a {what} file; fix: give the path of the file")
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{p}: is not a regular file (a device, pipe or socket); fix: give a {what} file")
    if st.st_size > max_bytes:
        raise InputError(f"{p}: {what} file is {st.st_size} bytes, over the {max_bytes}-byte limit; "
                         f"fix: give the right file (a {what} file is far smaller)")
    try:
        with open(p, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise InputError(_one_line(f"{p}: cannot read the {what} file ({e.strerror}); "
                                   f"fix: check its permissions")) from None
    if len(data) > max_bytes:
        raise InputError(f"{p}: {what} file is over the {max_bytes}-byte limit; fix: give the right file")
    nul = data.find(b"\x00")
    if nul >= 0:
        raise InputError(f"{p}: {what} file has a NUL byte at offset {nul}: a binary file, not text; "
                         f"fix: give the {what} as UTF-8 text")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{p}: {what} file is not UTF-8 (byte 0x{data[e.start]:02x} at offset "
                         f"{e.start}); fix: save it as UTF-8 text") from None
    return text[1:] if text.startswith("\ufeff") else text


# ----------------------------------------------------------------------------- structure checks
def _key_path(parts: list[Any]) -> str:
    out = ""
    for k in parts:
        out += f"[{k}]" if isinstance(k, int) else (f".{k}" if out else str(k))
    return out or "<top level>"


def check_finite(data: Any, where: str, fix: str = "use a finite number") -> None:
    """Raise :class:`InputError` at the first non-finite float (``inf``, ``nan``) in ``data``.

    Walks mappings and lists iteratively (no recursion) and names the key path, e.g.
    ``meshes[0].intra_link.bandwidth_gb_per_s``. ``where`` prefixes the message (the file).
    """
    stack: list[tuple[Any, list[Any]]] = [(data, [])]
    seen: set[int] = set()
    while stack:
        x, keys = stack.pop()
        if isinstance(x, float):
            if not math.isfinite(x):
                raise InputError(f"{where}: {_key_path(keys)} = {x!r} is not a finite number; fix: {fix}")
        elif isinstance(x, (dict, list)):
            if id(x) in seen:          # shared by a YAML alias: checked once
                continue
            seen.add(id(x))
            items = x.items() if isinstance(x, dict) else enumerate(x)
            stack.extend((v, keys + [k]) for k, v in reversed(list(items)))
            if isinstance(x, dict):
                for k in x:
                    if isinstance(k, float) and not math.isfinite(k):
                        raise InputError(f"{where}: key {k!r} under {_key_path(keys)} is not a "
                                         f"finite number; fix: {fix}")


def _expanded_size(data: Any, limit: int) -> int:
    """Values in ``data`` counting every alias expansion, stopping once over ``limit``."""
    n, stack = 0, [data]
    while stack and n <= limit:
        x = stack.pop()
        n += 1
        if isinstance(x, dict):
            stack.extend(x.keys())
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    return n


def _depth_error(where: str, what: str, at: str) -> InputError:
    return InputError(f"{where}: {what} nests deeper than {MAX_DEPTH} levels{at}; "
                      f"fix: give a real {what} file (they nest a few levels)")


# ----------------------------------------------------------------------------- YAML
# PyYAML ships no type stubs (types-PyYAML is not a dependency), so SafeLoader is Any here
class _Limited(yaml.SafeLoader):  # type: ignore[misc]
    """SafeLoader that bounds nesting depth and alias count while composing the node graph,
    and refuses an alias to a node that is still open (a self-containing structure)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0
        self._open: set[str] = set()

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise _LimitHit("aliases", event.start_mark)
            if event.anchor in self._open:
                raise _LimitHit("recursive", event.start_mark, event.anchor)
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _LimitHit("depth", event.start_mark)
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            self._open.add(anchor)
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1
            if anchor is not None:
                self._open.discard(anchor)


class _LimitHit(Exception):
    def __init__(self, kind: str, mark: Any, anchor: str | None = None) -> None:
        super().__init__(kind)
        self.kind, self.mark, self.anchor = kind, mark, anchor


def _at(mark: Any) -> str:
    return f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""


def read_yaml(path: str | Path, what: str, *, max_bytes: int = MAX_TEXT_BYTES) -> Any:
    """The parsed YAML document in ``path`` (safe types only: mappings, lists, scalars).

    Raises:
        InputError: any :func:`read_text` failure; malformed YAML (line and column named); nesting
            deeper than :data:`MAX_DEPTH`; more than :data:`MAX_ALIASES` aliases, an alias to
            the node containing it, or aliases expanding to over :data:`MAX_EXPANDED` values; a tag a safe loader refuses; a non-finite float anywhere
            (``.inf``, ``.nan``, ``1.0e+999``; the key path is named); an integer too long to read.
            The caller checks the document's shape (e.g. that it is a mapping).
    """
    p = Path(path)
    text = read_text(p, what, max_bytes=max_bytes)
    loader = None
    try:
        loader = _Limited(text)   # its reader already refuses control characters
        data = loader.get_single_data()
    except _LimitHit as e:
        if e.kind == "depth":
            raise _depth_error(str(p), what, _at(e.mark)) from None
        if e.kind == "aliases":
            raise InputError(f"{p}: {what} uses more than {MAX_ALIASES} YAML aliases{_at(e.mark)}; "
                             f"fix: write the values out instead of '*alias' references") from None
        raise InputError(f"{p}: {what} alias *{e.anchor}{_at(e.mark)} refers to a node that "
                         f"contains it; fix: remove the self-reference") from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        problem = e.problem or e.context or "invalid syntax"
        raise InputError(_one_line(f"{p}: malformed YAML{_at(mark)} ({problem}); "
                                   f"fix: correct the YAML syntax")) from None
    except yaml.YAMLError as e:   # ReaderError (control characters) and the like
        raise InputError(_one_line(f"{p}: malformed YAML ({e}); fix: correct the YAML syntax")) from None
    except (ValueError, OverflowError, TypeError, RecursionError) as e:
        raise InputError(_one_line(f"{p}: {what} has a value that cannot be read ({e}); "
                                   f"fix: correct that value")) from None
    finally:
        if loader is not None:
            loader.dispose()
    if loader._aliases and _expanded_size(data, MAX_EXPANDED) > MAX_EXPANDED:
        raise InputError(f"{p}: {what} expands to more than {MAX_EXPANDED} values through its "
                         f"{loader._aliases} YAML aliases (an alias bomb); fix: write the values out")
    check_finite(data, str(p))
    return data


# ----------------------------------------------------------------------------- JSON
def _reject_constant(name: str) -> Any:
    raise _NonFinite(name)


def _finite_float(text: str) -> float:
    x = float(text)
    if not math.isfinite(x):
        raise _NonFinite(text)
    return x


class _NonFinite(Exception):
    pass


def _json_depth(data: Any) -> int:
    depth, stack = 0, [(data, 1)]
    while stack:
        x, d = stack.pop()
        if isinstance(x, (dict, list)):
            depth = max(depth, d)
            if depth > MAX_DEPTH:
                return depth
            stack.extend((v, d + 1) for v in (x.values() if isinstance(x, dict) else x))
    return depth


def read_json(path: str | Path, what: str, *, fix: str = "correct the JSON",
              max_bytes: int = MAX_TEXT_BYTES) -> Any:
    """The parsed JSON document in ``path``.

    Args:
        fix: the advice given when the content is wrong (e.g. "regenerate it with 'mpmd plan'").

    Raises:
        InputError: any :func:`read_text` failure; malformed JSON (line and column named);
            ``NaN``, ``Infinity`` or a number that overflows to infinity (``1e999``); nesting
            deeper than :data:`MAX_DEPTH`; an integer too long to read.
    """
    p = Path(path)
    text = read_text(p, what, max_bytes=max_bytes)
    try:
        data = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except _NonFinite as e:
        raise InputError(_one_line(f"{p}: {what} holds the non-finite number {e.args[0]}; fix: {fix}")) from None
    except json.JSONDecodeError as e:
        raise InputError(_one_line(f"{p}: malformed JSON at line {e.lineno}, column {e.colno} "
                                   f"({e.msg}); fix: {fix}")) from None
    except RecursionError:
        raise _depth_error(str(p), what, "") from None
    except (ValueError, OverflowError) as e:
        raise InputError(_one_line(f"{p}: {what} has a value that cannot be read ({e}); fix: {fix}")) from None
    if _json_depth(data) > MAX_DEPTH:
        raise _depth_error(str(p), what, "")
    return data


# ----------------------------------------------------------------------------- CSV
def read_csv_table(path: str | Path, what: str, *, max_bytes: int = MAX_CSV_BYTES
                   ) -> tuple[tuple[str, ...], list[tuple[int, dict[str, Any]]]]:
    """The header of a CSV file and its rows, each with the line it ends on (blank lines are
    skipped, so that is the line a message should name) and as a dict (``csv.DictReader``: missing
    trailing fields are ``None``, extra fields go under the key ``None``). Values stay strings; the
    caller converts them and checks numbers are finite.

    Raises:
        InputError: any :func:`read_text` failure; no header line; a CSV syntax error (line named).
    """
    p = Path(path)
    text = read_text(p, what, max_bytes=max_bytes)
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        header = tuple(reader.fieldnames or ())
        if not header:
            raise InputError(f"{p}: {what} file has no header line; fix: start it with the column names")
        return header, [(reader.line_num, row) for row in reader]
    except csv.Error as e:
        raise InputError(_one_line(f"{p}: malformed CSV at line {reader.line_num + 1} ({e}); "
                                   f"fix: correct that line")) from None


def read_csv_rows(path: str | Path, what: str, *, max_bytes: int = MAX_CSV_BYTES) -> list[dict[str, Any]]:
    """The rows of a CSV file with a header line, as dicts (:func:`read_csv_table` without the
    header and line numbers).

    Raises:
        InputError: see :func:`read_csv_table`.
    """
    return [row for _, row in read_csv_table(path, what, max_bytes=max_bytes)[1]]


# ----------------------------------------------------------------------------- output
def _nearest_existing(path: Path) -> Path:
    """``path`` or its closest ancestor that exists (``os.path.exists``: a path below a file or
    below a folder that cannot be searched does not)."""
    while not os.path.exists(path) and path != path.parent:
        path = path.parent
    return path


def _output_problem(path: Path, folder: bool) -> str | None:
    """Why :func:`write_atomic` could not write ``path`` (a file, or with ``folder`` a folder to
    write files into), or None; creates nothing."""
    try:
        st: os.stat_result | None = path.stat()
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        st = None       # the folders above say why (below a file, or not searchable)
    except (OSError, ValueError) as e:
        return getattr(e, "strerror", None) or str(e)
    if st is not None and folder:
        if not stat.S_ISDIR(st.st_mode):
            return "it is a file, not a folder"
        if not os.access(path, os.W_OK | os.X_OK):
            return "the folder is not writable"
        return None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            return "it is a directory"
        if not stat.S_ISREG(st.st_mode):
            return "it is not a regular file (a device, pipe or socket)"
        if not os.access(path, os.W_OK):
            return "the file is not writable"
    # the folder the file goes in: write_atomic makes the missing ones below the nearest existing
    home = _nearest_existing(Path(os.path.abspath(path if folder else path.parent)))
    if not home.is_dir():
        return f"{home} is a file, not a folder"
    if not os.access(home, os.W_OK | os.X_OK):
        return f"folder {home} is not writable"
    return None


def check_output(path: str | Path, what: str, *, folder: bool = False) -> Path:
    """``path`` as a :class:`~pathlib.Path`, once it is clear :func:`write_atomic` can write
    there: called by every command before its work, so a bad output path fails in milliseconds,
    not after the computation. Nothing is created.

    Args:
        path: the output file (with ``folder``: the folder the outputs go in).
        what: what is written there, for messages (``"plan JSON"``, ``"trace"``).
        folder: ``path`` is a folder to write files into (made if missing), not a file.

    Raises:
        InputError: one line, ``PATH: cannot write the WHAT there (REASON); fix: ...``, when the
            path is an existing directory (a file output) or an existing file (a folder output),
            is not a regular file or not writable, lies below a file, or its nearest existing
            folder is not writable.
    """
    p = Path(path)
    reason = _output_problem(p, folder)
    if reason is not None:
        raise InputError(_one_line(f"{p}: cannot write the {what} there ({reason}); "
                                   f"fix: give a path in a folder you can write"))
    return p


def write_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same folder and a rename, so a
    reader never sees a half-written file and a failure leaves no file behind.

    Raises:
        OSError: the folder cannot be created or written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)   # mkstemp makes 0600; give the file the usual permissions
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
