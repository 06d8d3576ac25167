"""Reading a plan file (``plan.json``, written by ``mpmd plan``) safely: the one function every
command that takes a plan uses (``mpmd simulate``, ``mpmd run``).

:func:`load_plan` reads the file through :func:`ir.files.read_json` (size, UTF-8, no binary
file, no ``NaN``/``Infinity``, bounded nesting), checks it against ``ir/plan.schema.json``
(read as data: the compiler does not import the planner; the predictions and solver record may
be absent, see :data:`OPTIONAL`), bounds its sizes (:data:`LIMITS`) and
checks that its schedule, stages, meshes and carving agree, then converts it with
:func:`ir.plan_from_json`. A document with ``parts`` is a data-parallel plan: each part is
checked as a plan, then the parts against each other (same model and sequence length, batch
shares summing to the global batch, disjoint meshes and node groups), and it is converted with
:func:`ir.data_parallel_from_json`. A hand-edited or truncated plan gives one line naming
the JSON path of the bad value and the fix, never a ``KeyError`` or ``TypeError``.

``ir/`` imports nothing from the project, so the guarded read lives here.
"""

from __future__ import annotations

import copy
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from ir import KINDS, DataParallelPlan, IRError, Plan, data_parallel_from_json, plan_from_json
from ir.files import NAME_PATTERN, InputError, read_json
import jsonschema

Bad = Callable[[str, Any, str], IRError]
"""How a check names a bad value: ``bad(path, value, fix)`` is the one-line error to raise."""

SCHEMA_PATH = Path(__file__).resolve().parent / "plan.schema.json"
"""The plan format's JSON Schema."""

FIX = "regenerate it with 'mpmd plan'"

LIMITS = {"global_batch": 2**24, "seq_len": 2**22, "microbatches": 2**16, "num_stages": 4096,
          "num_devices": 2**20, "data": 2**20, "tensor": 2**20, "context": 2**20, "nodes": 2**20, "parts": 64,
          "reason": 2000, "link": 500}
"""Largest value accepted per plan field (samples, tokens, microbatches, stages, devices, carved
nodes, parts of a data-parallel plan, characters of its reason and sync link)."""


OPTIONAL = ("predicted", "solver")
"""Top-level records a plan may lack when read: the planner's predictions and solver record are
information, not inputs to a replay (a hand-written plan has none). When present, their values
must still have the schema's types."""


@lru_cache(maxsize=1)
def plan_schema() -> dict[str, Any]:
    """The plan JSON Schema (``ir/plan.schema.json``) as applied to a plan being read: the
    :data:`OPTIONAL` records and their keys are not required."""
    schema: dict[str, Any] = copy.deepcopy(read_json(SCHEMA_PATH, "plan schema"))
    defs = schema.get("$defs", {})
    if "plan_fields" in defs:
        # a pipeline plan is read as its fields alone (the strict 'plan' also requires OPTIONAL)
        schema["else"] = {"$ref": "#/$defs/plan_fields"}
        dp = defs.get("data_parallel_plan", {})
        dp["required"] = [k for k in dp.get("required", []) if k not in OPTIONAL]
        return schema
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
        IRError: ``doc`` does not match ``ir/plan.schema.json``.
    """
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


def check_sizes(doc: dict[str, Any], where: str, prefix: str = "") -> None:
    """Bound the plan's sizes (:data:`LIMITS`), check its names (:data:`NAME_PATTERN`) and that its
    parts agree: every stage's mesh is under ``meshes``, ranks and stages of the schedule exist,
    layer ranges are ordered, the carving shapes each node group once and names every mesh.

    Args:
        prefix: JSON path of ``doc`` inside the file (``"parts[1]."`` for a part of a
            data-parallel plan), prepended to the paths in messages.

    Raises:
        IRError: a value over its limit or an inconsistent reference, named by its JSON path.
    """
    def bad(path: str, value: Any, fix: str) -> IRError:
        return IRError(f"{where}: plan field {prefix}{path} = {_short(value)}; fix: {fix}")

    for path, value in [("model", doc["model"]), ("cluster", doc["cluster"])] + [
            (f"meshes.{_short(m, 40)}", m) for m in doc["meshes"]]:
        if not re.match(NAME_PATTERN, value) or len(value) > 200:
            raise bad(path, value, f"names use letters, digits and _ . + - only ({FIX})")
    check_cluster_path(doc, bad)
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
                                 (f"meshes.{m}.layout.tensor", v["layout"]["tensor"], "tensor"),
                                 (f"meshes.{m}.layout.context", v["layout"].get("context", 1),
                                  "context")):
            if value > LIMITS[key]:
                raise bad(path, value, f"use at most {LIMITS[key]} ({FIX})")
        lay = v["layout"]
        if lay["data"] * lay.get("context", 1) * lay["tensor"] != v["num_devices"]:
            raise bad(f"meshes.{m}.layout", lay, f"data x context x tensor must equal num_devices "
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
    check_carving(doc, bad)


def check_cluster_path(doc: dict[str, Any], bad: Bad) -> None:
    """``cluster_path``: a path the file system can look up (at most 4096 bytes, each part at most
    255), so that a mangled path is a one-line plan error, not an OS error on reading it."""
    path = doc.get("cluster_path", "")
    try:
        raw = path.encode("utf-8")
    except UnicodeEncodeError:                   # a lone surrogate, written as \ud800 in JSON
        raw = b"\x00"
    if len(raw) > 4096 or any(len(x) > 255 for x in raw.split(b"/")) or b"\x00" in raw:
        raise bad("cluster_path", path, f"give the cluster file's path (at most 4096 bytes, 255 per "
                  f"file or folder name, no NUL) ({FIX})")


def check_carving(doc: dict[str, Any], bad: Bad) -> None:
    """The plan's ``carving`` (node groups cut into meshes) and ``schedules`` (candidate table):
    names, sizes, one shape per group, ``nodes`` a multiple of ``nodes_per_mesh``, every mesh of the
    plan one the carving makes (``{group}.{j}``, ``j`` below the group's mesh count)."""
    carved: set[str] = set()
    groups: set[str] = set()
    for i, c in enumerate(doc.get("carving", [])):
        g = c["group"]
        if not re.match(NAME_PATTERN, g) or len(g) > 200:
            raise bad(f"carving[{i}].group", g, f"names use letters, digits and _ . + - only ({FIX})")
        if g in groups:
            raise bad(f"carving[{i}].group", g, f"shape each node group once ({FIX})")
        groups.add(g)
        n, per, split = c["nodes"], c.get("nodes_per_mesh", 1), c.get("meshes_per_node", 1)
        for key, value in (("nodes", n), ("nodes_per_mesh", per), ("meshes_per_node", split)):
            if value > LIMITS["nodes"]:
                raise bad(f"carving[{i}].{key}", value, f"use at most {LIMITS['nodes']} ({FIX})")
        if n % per:
            raise bad(f"carving[{i}].nodes", n, f"use a multiple of nodes_per_mesh {per} ({FIX})")
        if n // per * split > LIMITS["num_stages"]:
            raise bad(f"carving[{i}]", c, f"carve at most {LIMITS['num_stages']} meshes per group ({FIX})")
        carved.update(f"{g}.{j}" for j in range(n // per * split))
    if groups:
        for m in doc["meshes"]:
            if m not in carved:
                raise bad(f"meshes.{_short(m, 40)}", m, f"the carving makes meshes "
                          f"{_short(sorted(carved), 80)}; use one of them ({FIX})")
    for i, c in enumerate(doc.get("schedules", [])):
        if c["microbatches"] > LIMITS["microbatches"]:
            raise bad(f"schedules[{i}].microbatches", c["microbatches"],
                      f"use at most {LIMITS['microbatches']} ({FIX})")
        if len(c["schedule"]) > 200:
            raise bad(f"schedules[{i}].schedule", c["schedule"], f"use a schedule name ({FIX})")


SYNC_LINK_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.+-]*(<->[A-Za-z0-9][A-Za-z0-9_.+-]*)?$"
"""A data-parallel plan's ``sync.link``: ``A<->B`` between two meshes or two node groups (the
planner names the groups of the parts, ``h100<->tpu``, joined by ``+`` for a part of several), or
empty when there is nothing to sync (forward only)."""


def check_data_parallel(doc: dict[str, Any], where: str) -> None:
    """Check a data-parallel plan document after its schema: the top level's names and sizes, every
    part as a plan (:func:`check_sizes`), and the parts against each other: the same model and
    sequence length, batch shares summing to ``global_batch``, no mesh or node group in two parts.

    Raises:
        IRError: the first bad value, named by its JSON path.
    """
    def bad(path: str, value: Any, fix: str) -> IRError:
        return IRError(f"{where}: plan field {path} = {_short(value)}; fix: {fix}")

    for path, value in (("model", doc["model"]), ("cluster", doc["cluster"])):
        if not re.match(NAME_PATTERN, value) or len(value) > 200:
            raise bad(path, value, f"names use letters, digits and _ . + - only ({FIX})")
    for key in ("global_batch", "seq_len"):
        if doc[key] > LIMITS[key]:
            raise bad(key, doc[key], f"use at most {LIMITS[key]} ({FIX})")
    check_cluster_path(doc, bad)
    parts = doc["parts"]
    if len(parts) > LIMITS["parts"]:
        raise bad("parts", f"{len(parts)} parts", f"use at most {LIMITS['parts']} ({FIX})")
    link = doc["sync"]["link"]
    if len(link) > LIMITS["link"] or not (link == "" or re.match(SYNC_LINK_PATTERN, link)):
        raise bad("sync.link", link, f"name a link A<->B between two meshes or node groups ({FIX})")
    if len(doc.get("reason", "")) > LIMITS["reason"]:
        raise bad("reason", doc["reason"], f"use at most {LIMITS['reason']} characters ({FIX})")
    meshes: dict[str, int] = {}
    groups: dict[str, int] = {}
    for i, part in enumerate(parts):
        check_sizes(part, where, prefix=f"parts[{i}].")
        for key in ("model", "seq_len"):
            if part[key] != doc[key]:
                raise bad(f"parts[{i}].{key}", part[key], f"every part runs the plan's {key} "
                          f"{doc[key]!r} ({FIX})")
        for m in part["meshes"]:
            if m in meshes:
                raise bad(f"parts[{i}].meshes.{_short(m, 40)}", m, f"mesh {m!r} is already in "
                          f"parts[{meshes[m]}]; give each part its own meshes ({FIX})")
            meshes[m] = i
        for j, c in enumerate(part.get("carving", [])):
            if c["group"] in groups:
                raise bad(f"parts[{i}].carving[{j}].group", c["group"], f"node group "
                          f"{c['group']!r} is already carved by parts[{groups[c['group']]}]; give "
                          f"each part its own node groups ({FIX})")
            groups[c["group"]] = i
    shares = [p["global_batch"] for p in parts]
    if sum(shares) != doc["global_batch"]:
        raise bad("global_batch", doc["global_batch"], f"the parts' batch shares {_short(shares, 40)} "
                  f"sum to {sum(shares)}; make them sum to the global batch ({FIX})")


def plan_from_doc(doc: Any, where: str = "plan") -> Plan | DataParallelPlan:
    """A :class:`Plan` (or, for a document with ``parts``, a :class:`DataParallelPlan`) from a
    parsed plan JSON document, checked (schema, sizes, references).

    Raises:
        IRError: one line naming the JSON path of the first bad value and the fix.
    """
    if not isinstance(doc, dict):
        raise IRError(f"{where}: top level is {type(doc).__name__}, not a plan object; fix: {FIX}")
    check_schema(doc, where)
    data_parallel = "parts" in doc
    if data_parallel:
        check_data_parallel(doc, where)
    else:
        check_sizes(doc, where)
    try:
        return data_parallel_from_json(doc) if data_parallel else plan_from_json(doc)
    except IRError as e:
        raise IRError(f"{where}: {str(e).splitlines()[0]}") from None
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise IRError(" ".join(f"{where}: plan has a malformed value ({type(e).__name__}: {e}); "
                               f"fix: {FIX}".split())[:300]) from None


def load_plan(path: str | Path) -> Plan | DataParallelPlan:
    """Read and check the plan file ``path`` (see the module docstring): a :class:`Plan`, or a
    :class:`DataParallelPlan` when the file has ``parts``.

    Raises:
        ir.files.InputError: missing, unreadable, binary, non-UTF-8, malformed or non-finite JSON.
        IRError: a plan that breaks the schema, is over a size limit or is inconsistent.
    """
    doc = read_json(path, "plan JSON", fix=FIX)
    return plan_from_doc(doc, str(path))


__all__ = ["FIX", "LIMITS", "SCHEMA_PATH", "InputError", "check_carving", "check_data_parallel",
           "check_schema", "check_sizes", "load_plan", "plan_from_doc", "plan_schema"]
