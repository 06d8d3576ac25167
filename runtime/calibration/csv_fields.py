"""The measurement CSVs ``mpmd validate --layers`` and ``--serving`` read (layer timings, serving
step timings, published serving rows): each file through the tool's guarded reader
(:func:`ir.files.read_csv_table`: size, UTF-8, no binary file, CSV syntax), each field through one
of the checks below. A bad field is one line naming the file, the line, the column, the value and
the fix (:class:`~runtime.calibration.fit.CalibrationError`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from ir.files import read_csv_table
from runtime.calibration.fit import CalibrationError

Row = Mapping[str | None, Any]
"""A row as ``csv.DictReader`` gives it (a missing field is None, extra fields under None)."""


def read_records(path: str | Path, what: str, columns: Sequence[str], fix: str
                 ) -> list[tuple[int, Row]]:
    """(line, row) of every row of the CSV ``path``, whose header holds ``columns`` and whose
    rows hold as many fields as the header.

    Args:
        what: the kind of file, for messages (``"layer-timing CSV"``).
        fix: how to make a good file, for messages (``"write it with benchmarks/..."``).

    Raises:
        ir.files.InputError: the file cannot be read (missing, binary, not UTF-8, too large,
            malformed CSV).
        CalibrationError: the header lacks a column of ``columns``; a row has more fields than
            the header (a row with fewer leaves its last columns empty).
    """
    header, rows = read_csv_table(path, what)
    missing = [c for c in columns if c not in header]
    if missing:
        raise CalibrationError(f"{path}: {what} lacks column(s) {', '.join(missing)}; fix: {fix} "
                               f"(columns {', '.join(columns)})")
    for line, row in rows:
        if row.get(None):
            raise CalibrationError(f"{path}: line {line}: {len(header) + len(row[None])} fields, "
                                   f"more than the {len(header)} columns; fix: quote a value "
                                   f"that holds a comma, or {fix}")
    return rows


def text(row: Row, column: str) -> str:
    """The field, stripped ("" when the row is short)."""
    return str(row.get(column) or "").strip()


def _bad(where: str, column: str, value: str, want: str, fix: str) -> CalibrationError:
    shown = value if len(value) <= 40 else value[:37] + "..."
    return CalibrationError(f"{where}: column {column!r} = {shown!r} is not {want}; fix: {fix}")


def number(where: str, row: Row, column: str, fix: str, *, required: bool = True) -> float:
    """The field as a positive finite number; 0.0 when empty and not ``required``.

    Args:
        where: ``FILE: line N``, the start of a message.

    Raises:
        CalibrationError: empty (when required), not a number, NaN, infinite, zero or negative.
    """
    v = text(row, column)
    if not v and not required:
        return 0.0
    try:
        x = float(v)
    except ValueError:
        x = math.nan
    if not (math.isfinite(x) and x > 0):
        raise _bad(where, column, v, "a positive finite number", fix)
    return x


def count(where: str, row: Row, column: str, most: int, fix: str, *,
          required: bool = True) -> int:
    """The field as an integer from 1 to ``most`` (``8`` or ``8.0``); 0 when empty and not
    ``required``.

    Raises:
        CalibrationError: empty (when required), not a whole number, or out of range.
    """
    v = text(row, column)
    if not v and not required:
        return 0
    try:
        x = float(v)
    except ValueError:
        x = math.nan
    if not (math.isfinite(x) and x == int(x) and 1 <= x <= most):
        raise _bad(where, column, v, f"an integer from 1 to {most}", fix)
    return int(x)


def choice(where: str, row: Row, column: str, allowed: Sequence[str]) -> str:
    """The field, one of ``allowed`` (listed in the message).

    Raises:
        CalibrationError: any other value.
    """
    v = text(row, column)
    if v not in allowed:
        shown = ", ".join(repr(a) if not a else a for a in allowed)
        raise _bad(where, column, v, f"one of {shown}", f"use one of {shown}")
    return v
