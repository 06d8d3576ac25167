"""The printed program read back (``compiler.parse``): every program of a whole compile, at every
pass, prints the same after parsing; a pass run on the parsed program gives the program it gives
on the traced one; bad text is one line naming the line."""

from __future__ import annotations

import jax
import pytest

from compiler.config import MpmdConfig
from compiler.driver import PIPELINE, default_pipeline, run_passes
from compiler.frontend import jit
from compiler.parse import OpaquePrimitive, ParseError, parse_program
from compiler.program import Program, print_program
from compiler.verify import verify
from tests.compiler.test_frontend import SCHEDULES, STEP, config, data


@pytest.fixture(scope="module")
def histories():
    from jax.sharding import Mesh
    d = jax.devices()
    topology = {"m1": Mesh(d[0:2], ("x",)), "m2": Mesh(d[2:4], ("x",))}
    params, xs, ys = data()
    out = {}
    for name in ("1f1b", "zb-h1"):
        lowered = jit(STEP, config(topology, name), verify=True).lower(params, xs, ys)
        out[name] = (topology, lowered.history)
    return out


def test_every_program_of_a_compile_prints_the_same_after_parsing(histories):
    seen = 0
    for name, (topology, history) in histories.items():
        for pass_name, p in history:
            text = print_program(p)
            q = parse_program(text, meshes=p.meshes)
            assert print_program(q) == text, f"{name}, after {pass_name}"
            assert q.meshes == p.meshes and q.inputs == tuple(f"arg{i}" for i in range(len(p.inputs)))
            seen += 1
    assert seen == sum(len(h) for _, h in histories.values()) >= 40


def test_each_pass_gives_the_same_program_on_parsed_input(histories):
    """Lit-style: text in, one pass, text out, with no pass before it run on the text."""
    topology, history = histories["zb-h1"]
    cfg = config(topology, "zb-h1")
    passes = dict(default_pipeline(cfg))
    before = [p for _, p in [("trace", None)] + history][:-1]
    checked = []
    for (name, after), prev in zip(history, before):
        if prev is None or name in ("sharding",):   # sharding reads jax meshes' devices: not text
            continue
        q = parse_program(print_program(prev), meshes=prev.meshes)
        verify(q)
        got = run_passes(q, [(name, passes[name])], verify=True)
        assert print_program(got) == print_program(after), name
        checked.append(name)
    assert {"merge_stages", "schedule", "split_backward", "merge_transfers", "absorb"} <= set(checked)


def test_a_program_with_an_unknown_primitive_prints_as_read():
    text = """\
func @main(%arg0: f32[4]@m1) -> f32[4]@m2[{"x"}] {
  %0 = fragment<mesh="m1", origin=["l1"], stage=0, call_counter=0> (%arg0) (%a0: f32[4]) {
    %b0 = my_custom_op[k=3 tag=hello] %a0, 2.0:f32 : f32[4]
    return %b0
  } : (f32[4]@m1) -> f32[4]@m1
  %1 = transfer %0 : f32[4]@m1 -> f32[4]@m2[{"x"}]
  return %1
}
"""
    p = parse_program(text)
    assert print_program(p) == text
    assert p.meshes == ("m1", "m2") and p.output_meshes == ("m2",)
    frag = p.ops[0]
    assert isinstance(frag.body[0].prim, OpaquePrimitive)
    assert frag.body[0].params == {"k": 3, "tag": "hello"}
    assert p.specs == {"v1": (("x",),)}
    assert isinstance(p, Program)


@pytest.mark.parametrize("text, needle", [
    ("nonsense", "line 1: a printed program starts with 'func @main"),
    ("func @main(%arg0: f32[4]) -> f32[4] {\n  return %3\n}\n", "%3 is used before it is defined"),
    ("func @main(%arg0: f32[4]) -> f32[4] {\n  %0 = transfer %arg0 : q -> f32[4]@m2\n"
     "  return %0\n}\n", "'q' is not a type like f32[2]"),
    ("func @main(%arg0: f32[4]) -> f32[4] {\n  %0 = mul %arg0, %arg0 : f32[4]\n",
     "the text ends inside a block"),
])
def test_bad_text_is_one_line_naming_where(text, needle):
    with pytest.raises(ParseError, match=None) as e:
        parse_program(text)
    assert needle in str(e.value) and "\n" not in str(e.value)
