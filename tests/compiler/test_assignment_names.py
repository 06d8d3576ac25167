"""Names in an MpmdConfig are checked: a computation the step does not have, or a mesh the topology
lacks, is refused in one line naming the unknown name, the closest known names and the fix (before:
a mistyped computation name was ignored and the piece placed by mesh inference)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from compiler.config import FragmentPattern, MpmdConfig
from compiler.errors import CompilerError, ConfigError, did_you_mean
from compiler.frontend import jit
from compiler.named import named_computation
from compiler.program import Fragment

EMBED = named_computation(lambda w, x: jnp.tanh(x @ w), name="embed")
BLOCK = named_computation(lambda w, h: jnp.tanh(h @ w), name="block")
HEAD = named_computation(lambda w, h: jnp.clip(h @ w, -1.0, 1.0), name="head")


def step(ws, x):
    h = EMBED(ws[0], x)
    h = BLOCK(ws[1], h)
    return jnp.sum(HEAD(ws[2], h) ** 2)


ARGS = ([jnp.eye(4)] * 3, jnp.ones((2, 4)))


def topology():
    d = jax.devices()
    return {"mesh0": Mesh(np.array(d[:1]), ("x",)), "mesh1": Mesh(np.array(d[1:2]), ("x",))}


def refused(cfg: MpmdConfig) -> str:
    with pytest.raises(ConfigError) as e:
        jit(step, cfg).lower(*ARGS)
    assert isinstance(e.value, CompilerError)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_correct_names_lower_and_place_every_piece():
    cfg = MpmdConfig(topology=topology(),
                     assignment={"embed": "mesh0", "block": "mesh1", "head": "mesh1"})
    lowered = jit(step, cfg).lower(*ARGS)
    placed = {o.name: f.mesh for f in lowered.program.ops if isinstance(f, Fragment)
              for o in f.origin}
    assert placed == {"embed": "mesh0", "block": "mesh1", "head": "mesh1"}


def test_mistyped_assignment_name_is_refused():
    cfg = MpmdConfig(topology=topology(),
                     assignment={"embed": "mesh0", "blok": "mesh1", "head": "mesh1"})
    msg = refused(cfg)
    assert msg == ("MpmdConfig.assignment names computation 'blok', which the program does not "
                   "have; did you mean 'block'? (known: 'block', 'embed', 'head'); fix the name "
                   "in 'assignment' or label that piece with named_computation(fn, name='blok')")


def test_mistyped_stage_assignment_and_loop_iteration_names_are_refused():
    cfg = MpmdConfig(topology=topology(), stage_assignment={"embed": 0, "block": 1, "haed": 1},
                     stage_mesh={0: "mesh0", 1: "mesh1"})
    msg = refused(cfg)
    assert msg.startswith("MpmdConfig.stage_assignment names computation 'haed'")
    assert "did you mean 'head'?" in msg
    cfg = MpmdConfig(topology=topology(), assignment={"embed": "mesh0", "blocks[0]": "mesh1"})
    msg = refused(cfg)
    assert "computation 'blocks[0]'" in msg and "did you mean 'block'?" in msg


def test_mistyped_name_in_merge_rules_is_refused():
    cfg = MpmdConfig(topology=topology(), assignment={"embed": "mesh0", "block": "mesh1"},
                     merge_rules=[(FragmentPattern(name="blck"), FragmentPattern(name="head"))])
    msg = refused(cfg)
    assert msg.startswith("MpmdConfig.merge_rules names computation 'blck'")
    assert "did you mean 'block'?" in msg


def test_jnp_internal_jits_do_not_count_as_known_labels():
    # jnp.clip traces as a jit named 'clip': it is not offered as a suggestion
    cfg = MpmdConfig(topology=topology(), assignment={"clop": "mesh0"})
    msg = refused(cfg)
    assert "(known: 'block', 'embed', 'head')" in msg and "'clip'" not in msg


@pytest.mark.parametrize("kwargs, start", [
    ({"assignment": {"embed": "mesh2"}},
     "named computation 'embed' is assigned to mesh 'mesh2', which is not in the topology; did "
     "you mean 'mesh0' or 'mesh1'? (known: 'mesh0', 'mesh1'); fix 'assignment'"),
    ({"stage_assignment": {"embed": 0}, "stage_mesh": {0: "msh0"}},
     "stage 0 is assigned to mesh 'msh0', which is not in the topology; did you mean 'mesh0'"),
    ({"input_meshes": {0: "Mesh1"}}, "input_meshes[0] is mesh 'Mesh1', which is not in the "
                                     "topology; did you mean 'mesh1'"),
    ({"output_meshes": {0: "mesh-1"}}, "output_meshes[0] is mesh 'mesh-1'"),
    ({"merge_rules": [(FragmentPattern(mesh="mesh9"), FragmentPattern(mesh="mesh0"))]},
     "a FragmentPattern in 'merge_rules' names mesh 'mesh9', which is not in the topology; did "
     "you mean 'mesh0' or 'mesh1'?"),
])
def test_unknown_mesh_names_are_refused_with_the_closest(kwargs, start):
    with pytest.raises(ConfigError) as e:
        MpmdConfig(topology=topology(), **kwargs)
    assert str(e.value).startswith(start)
    assert "\n" not in str(e.value)


def test_did_you_mean_lists_at_most_twelve_known_names():
    names = [f"block{i}" for i in range(20)]
    assert did_you_mean("blok3", names).startswith("did you mean 'block3'? (known: 'block0', ")
    assert did_you_mean("block_3", names).startswith("did you mean 'block3'? ")
    assert did_you_mean("zzz", names).endswith("'block10', 'block11', ... (20 in all))")
    assert did_you_mean("zzz", []) == "(known: none)"
