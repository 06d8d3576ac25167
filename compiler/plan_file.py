"""Reading a plan file (``plan.json``, written by ``mpmd plan``) safely: the one function every
command that takes a plan uses (``mpmd simulate``, ``mpmd run``).

:func:`load_plan` reads the file through :func:`mpmd.files.read_json` (size, UTF-8, no binary
file, no ``NaN``/``Infinity``, bounded nesting), checks it against ``planner/plan.schema.json``
(read as data: the compiler does not import the planner; the predictions and solver record may
be absent, see :data:`OPTIONAL`), bounds its sizes (:data:`LIMITS`) and
checks that its schedule, stages and meshes agree, then converts it with
:func:`compiler.ir.plan_from_json`. A hand-edited or truncated plan gives one line naming the JSON
path of the bad value and the fix, never a ``KeyError`` or ``TypeError``.

``compiler/ir.py`` imports nothing from the project, so the guarded read lives here.
"""

from __future__ import annotations

import copy
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from compiler.ir import KINDS, IRError, Plan, plan_from_json
from hardware_profiles.loader import NAME_PATTERN
from mpmd.files import InputError, read_json

SCHEMA_PATH = Path(__file__).resolve().parents[1] / "planner" / "plan.schema.json"
"""The plan format's JSON Schema."""

FIX = "regenerate it with 'mpmd plan'"

LIMITS = {"global_batch": 2**24, "seq_len": 2**22, "microbatches": 2**16, "num_stages": 4096,
          "num_devices": 2**20, "data": 2**20, "tensor": 2**20}
"""Largest value accepted per plan field (samples, tokens, microbatches, stages, devices)."""


OPTIONAL = ("predicted", "solver")
"""Top-level records a plan may lack when read: the planner's predictions and solver record are
information, not inputs to a replay (a hand-written plan has none). When present, their values
must still have the schema's types."""


@lru_cache(maxsize=1)
def plan_schema() -> dict[str, Any]:
    """The plan JSON Schema (``planner/plan.schema.json``) as applied to a plan being read: the
    :data:`OPTIONAL` records and their keys are not required."""
    schema = copy.deepcopy(read_json(SCHEMA_PATH, "plan schema"))
    schema["required"] = [k for k in schema.get("required", []) if k not in OPTIONAL]
    for k in OPTIONAL:
        schema.get("properties", {}).get(k, {}).pop("required", None)
    return schema


def _json_path(parts: Any) -> str:
    out = ""
    for k in parts:
        out += f"[{k}]" if isinstance(k, int) else (f".{k}" if out else str(k))
    return out or "<top level>"


def _short(x: Any, limit: int = 60) -> str:
    r = repr(x)
    return r if len(r) <= limit else r[:limit - 3] + "..."


def check_schema(doc: Any, where: str) -> None:
    """Raise a one-line :class:`IRError` naming the JSON path of the first schema violation.

    Raises:
        IRError: ``doc`` does not match ``planner/plan.schema.json``.
    """
    import jsonschema

    validator = jsonschema.Draft202012Validator(plan_schema())
    err = jsonschema.exceptions.best_match(validator.iter_errors(doc))
    if err is None:
        return
    if err.validator == "required":
        what = err.message.split(" is a required property")[0]
        problem = f"lacks the key {what}"
    elif err.validator == "additionalProperties" and "were unexpected" in err.message:
        problem = "has an unexpected key"
    else:
        expected = err.validator_value if err.validator != "properties" else ""
        problem = (f"= {_short(err.instance)} fails '{err.validator}: "
                   f"{_short(expected, 40)}'")
    raise IRError(" ".join(f"{where}: plan field {_json_path(err.absolute_path)} {problem}; "
                           f"fix: {FIX}".split()))


def check_sizes(doc: dict[str, Any], where: str) -> None:
    """Bound the plan's sizes (:data:`LIMITS`), check its names (:data:`NAME_PATTERN`) and that its
    parts agree: every stage's mesh is under ``meshes``, ranks and stages of the schedule exist, layer ranges are ordered.

    Raises:
        IRError: a value over its limit or an inconsistent reference, named by its JSON path.
    """
    def bad(path: str, value: Any, fix: str) -> IRError:
        return IRError(f"{where}: plan field {path} = {_short(value)}; fix: {fix}")

    for path, value in [("model", doc["model"]), ("cluster", doc["cluster"])] + [
            (f"meshes.{_short(m, 40)}", m) for m in doc["meshes"]]:
        if not re.match(NAME_PATTERN, value) or len(value) > 200:
            raise bad(path, value, f"names use letters, digits and _ . + - only ({FIX})")
    s = doc["schedule"]
    for path, value, key in (("global_batch", doc["global_batch"], "global_batch"),
                             ("seq_len", doc["seq_len"], "seq_len"),
                             ("schedule.microbatches", s["microbatches"], "microbatches"),
                             ("schedule.num_stages", s["num_stages"], "num_stages")):
        if value > LIMITS[key]:
            raise bad(path, value, f"use at most {LIMITS[key]} ({FIX})")
    for m, v in doc["meshes"].items():
        for path, value, key in ((f"meshes.{m}.num_devices", v["num_devices"], "num_devices"),
                                 (f"meshes.{m}.layout.data", v["layout"]["data"], "data"),
                                 (f"meshes.{m}.layout.tensor", v["layout"]["tensor"], "tensor")):
            if value > LIMITS[key]:
                raise bad(path, value, f"use at most {LIMITS[key]} ({FIX})")
        lay = v["layout"]
        if lay["data"] * lay["tensor"] != v["num_devices"]:
            raise bad(f"meshes.{m}.layout", lay, f"data x tensor must equal num_devices "
                      f"{v['num_devices']} ({FIX})")
    ranks, stages = doc["rank_mesh"], s["num_stages"]
    if len(s["stage_rank"]) != stages:
        raise bad("schedule.stage_rank", s["stage_rank"], f"give one rank per stage ({stages}; {FIX})")
    for i, r in enumerate(s["stage_rank"]):
        if r >= len(ranks):
            raise bad(f"schedule.stage_rank[{i}]", r, f"name a rank below {len(ranks)} ({FIX})")
    if len(doc["stages"]) != stages:
        raise bad("stages", f"{len(doc['stages'])} entries", f"give schedule.num_stages = {stages} "
                  f"stages ({FIX})")
    meshes = set(doc["meshes"])
    for r, m in enumerate(ranks):
        if m not in meshes:
            raise bad(f"rank_mesh[{r}]", m, f"name a mesh under 'meshes' {sorted(meshes)} ({FIX})")
    prev = 0
    for i, st in enumerate(doc["stages"]):
        first, last = st["layers"]
        if st["index"] != i or first != prev or last <= first:
            raise bad(f"stages[{i}]", st, f"stages must be numbered 0.. and cover consecutive, "
                      f"non-empty layer ranges [first, last) ({FIX})")
        rank_of = ranks[int(s["stage_rank"][i])]      # the schema's integers may be written 2.0
        if st["mesh"] != rank_of:
            raise bad(f"stages[{i}].mesh", st["mesh"], f"use the mesh of its rank, {rank_of!r} ({FIX})")
        prev = last
    for m, frags in s["order"].items():
        for j, f in enumerate(frags):
            if f["stage"] >= stages or f["microbatch"] >= s["microbatches"] or f["kind"] not in KINDS:
                raise bad(f"schedule.order.{m}[{j}]", f, f"name a stage below {stages} and a "
                          f"microbatch below {s['microbatches']} ({FIX})")


def plan_from_doc(doc: Any, where: str = "plan") -> Plan:
    """A :class:`Plan` from a parsed plan JSON document, checked (schema, sizes, references).

    Raises:
        IRError: one line naming the JSON path of the first bad value and the fix.
    """
    if not isinstance(doc, dict):
        raise IRError(f"{where}: top level is {type(doc).__name__}, not a plan object; fix: {FIX}")
    check_schema(doc, where)
    check_sizes(doc, where)
    try:
        return plan_from_json(doc)
    except IRError as e:
        raise IRError(f"{where}: {str(e).splitlines()[0]}") from None
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise IRError(" ".join(f"{where}: plan has a malformed value ({type(e).__name__}: {e}); "
                               f"fix: {FIX}".split())[:300]) from None


def load_plan(path: str | Path) -> Plan:
    """Read and check the plan file ``path`` (see the module docstring).

    Raises:
        mpmd.files.InputError: missing, unreadable, binary, non-UTF-8, malformed or non-finite JSON.
        IRError: a plan that breaks the schema, is over a size limit or is inconsistent.
    """
    doc = read_json(path, "plan JSON", fix=FIX)
    return plan_from_doc(doc, str(path))


__all__ = ["FIX", "LIMITS", "SCHEMA_PATH", "InputError", "check_schema", "check_sizes",
           "load_plan", "plan_from_doc", "plan_schema"]
