"""The pass pipeline as data: its order in the docs, what a config runs, preconditions checked."""

from __future__ import annotations

import re
from pathlib import Path

import jax
import numpy as np
import pytest
from jax import lax
from jax.sharding import Mesh

from compiler.config import MpmdConfig
from compiler.driver import PIPELINE, PRECONDITIONS, default_pipeline, requirements, run_passes
from compiler.errors import VerificationError
from compiler.passes import absorb_inferred_fragments
from compiler.program import Eqn, MeshlessOp, Program, TensorType

DOCS = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
T = TensorType((4,), "float32")


def _doc_line(s) -> str:
    needs = [f"needs: {', '.join(s.requires)}"] if s.requires else []
    cond = [f"if {s.when_doc}"] if s.when_doc else []
    extra = "; ".join(needs + cond)
    return f"`{s.name}`" + (f" ({extra})" if extra else "")


def test_the_docs_list_the_pipeline_as_it_runs():
    text = DOCS.read_text()
    block = text[text.index("<!-- pipeline -->"):text.index("<!-- /pipeline -->")]
    listed = re.findall(r"^\s*\d+\. (.+)$", block, re.M)
    assert listed == [_doc_line(s) for s in PIPELINE]


def _topology():
    devs = np.array(jax.devices()[:2])
    return {"m1": Mesh(devs[:1], ("data",)), "m2": Mesh(devs[1:2], ("data",))}


def test_a_config_runs_the_passes_it_asks_for_in_pipeline_order():
    base = MpmdConfig(_topology())
    names = [n for n, _ in default_pipeline(base)]
    optional = {"transfer_aware_merge", "split_backward", "merge_forward_backward", "merge_rules",
                "split_transfer_independent"}
    assert names == [s.name for s in PIPELINE if s.name not in optional]
    all_on = MpmdConfig(_topology(), transfer_aware_merge=True, merge_forward_backward=True,
                        split_transfer_independent=True, split_backward=True,
                        merge_rules=lambda a, b: False)
    assert [n for n, _ in default_pipeline(all_on)] == [s.name for s in PIPELINE]


def _meshless_program() -> Program:
    op = MeshlessOp(Eqn(lax.add_p, {}, ("x", "x"), ("y",)))
    return Program(("m1", "m2"), ("x",), ("m1",), ("y",), ("m1",), (op,), {"x": T, "y": T})


def test_a_pass_given_a_program_it_cannot_take_is_refused_by_name():
    p = _meshless_program()
    assert not PRECONDITIONS["on meshes"](p) and PRECONDITIONS["loop-free"](p)
    assert requirements("absorb") == ("on meshes",)
    with pytest.raises(VerificationError, match="pass 'absorb' needs a program that is on meshes"):
        run_passes(p, [("absorb", absorb_inferred_fragments)], verify=True)


def test_a_pass_outside_the_pipeline_has_no_preconditions():
    p = _meshless_program()
    assert requirements("my_pass") == ()
    assert run_passes(p, [("my_pass", lambda q: q)], verify=True) == p
