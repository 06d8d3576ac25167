"""The compiler on training steps with their optimizer inside: executables, lowering and step time
against ``jax.jit`` (issue 49, item 1).

Two steps, each split by ``named_computation`` over 4 meshes of 2 CPU devices, 1F1B schedule:

- **GPT**: a 4-block pre-LayerNorm decoder (causal attention, GELU MLP) with tied embeddings (the
  token embedding on the first mesh is the output projection on the last), 2 microbatches; the
  update is optax ``chain(clip_by_global_norm(1.0), adamw(3e-4, weight_decay=0.1,
  mask=<kernels only>))`` with an L2 term ``1e-4 * sum(w**2)`` on the loss (when optax is not
  installed, a hand-written transform with the same arithmetic stands in, and the table says so).
- **ResNet**: a 4-stage residual CNN (conv, per-batch normalisation, ReLU, a residual add per stage,
  a pooled linear head on the last stage), 2 microbatches, SGD with momentum 0.9 and an L2 term.

Each step is measured three ways: without the update (loss and gradients only), with it, and with
``jax.jit`` of the whole step. Columns: executables (unique compiled fragment bodies), calls and
transfers per step, lowering seconds (``compiler.jit(...).lower``), first-call seconds (XLA
compiling the executables), step milliseconds (median of ``--repeats`` calls after one warm-up,
with ``compiler.runtime``; the three timings below taken in turn within each repeat) twice: from the host arrays every call (each argument copied to its
mesh each time) and with the arguments already on the step's input shardings, where a training
loop's parameters and optimizer state are after its first step (the step returns them on exactly
those shardings; checked), then ``jax.jit``'s step on the same host arrays, and the largest
relative error against ``jax.jit`` over every result leaf. The runtime, unrecorded on CPU, makes
the gradient accumulators' zeros on the first call only and batches the sends held until read,
each batch one direct batched copy (``compiler/runtime.py``); every fragment still runs on both
devices of its mesh, replicated, as
the meshes of the issue are given (no ``in_specs``): sharding each microbatch over a mesh's 2
devices was measured no faster (23.0 ms sharded against 23.2 ms replicated, ``jax.jit`` 5.3 ms,
in one process at load 2.4-4.1, before that runtime change) and lowers in 20 s (the sharding pass
compiles each sharded fragment body to read its results' shardings): at this size a step's time
is the fixed cost of each call and copy of a 2-device CPU mesh, not arithmetic. One more row
measures the GPT step with its update on 4 meshes of 1 CPU device each (the same program, each
fragment computed once instead of on both devices of its mesh), to show that cost; the issue's
configuration stays the 2-device one.

Usage:
    python benchmarks/bench_compiler_optimizer.py            # about 1-2 minutes on 2 cores
    python benchmarks/bench_compiler_optimizer.py --repeats 40

Prints a Markdown table (``markdown()`` returns it).
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

import compiler  # noqa: E402
from compiler import MpmdConfig, named_computation  # noqa: E402
from compiler.exported import Call, Send  # noqa: E402
from compiler.runtime import run_program  # noqa: E402
from simulator.schedules import one_f_one_b  # noqa: E402

try:  # optax is optional: the project's machines may not have it
    import optax  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - depends on the machine
    optax = None

MESHES = 4
MICROBATCHES = 2
L2 = 1e-4


def topology(per_mesh: int = 2) -> dict[str, Mesh]:
    """``MESHES`` meshes of ``per_mesh`` CPU devices (2: the issue's configuration)."""
    d = jax.devices()
    return {f"m{i}": Mesh(np.array(d[per_mesh * i:per_mesh * (i + 1)]), ("data",))
            for i in range(MESHES)}


def schedule(topo: dict[str, Mesh], microbatches: int) -> dict:
    table = one_f_one_b(num_ranks=len(topo), microbatches=microbatches)
    return {m: table.order[r] for r, m in enumerate(topo)}


# --------------------------------------------------------------------------- optimizers


def _kernel_mask(params):
    """True for weight matrices (ndim >= 2), False for biases, norms' scales and offsets."""
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def _adamw_by_hand(lr, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.1, clip=1.0):
    """optax.chain(clip_by_global_norm(clip), adamw(lr, b1, b2, eps, weight_decay, mask)) by hand."""
    def init(params):
        z = jax.tree.map(jnp.zeros_like, params)
        return (jnp.zeros((), jnp.int32), z, jax.tree.map(jnp.zeros_like, params))

    def update(grads, state, params):
        count, mu, nu = state
        norm = jnp.sqrt(sum(jnp.sum(g ** 2) for g in jax.tree.leaves(grads)))
        scale = jnp.where(norm < clip, 1.0, clip / norm)
        grads = jax.tree.map(lambda g: g * scale, grads)
        mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, mu, grads)
        nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, nu, grads)
        count = count + 1
        mhat = jax.tree.map(lambda m: m / (1 - b1 ** count), mu)
        vhat = jax.tree.map(lambda v: v / (1 - b2 ** count), nu)
        mask = _kernel_mask(params)
        upd = jax.tree.map(lambda m, v, p, k: -lr * (m / (jnp.sqrt(v) + eps)
                                                    + (weight_decay * p if k else 0.0)),
                           mhat, vhat, params, mask)
        return upd, (count, mu, nu)

    return init, update


def gpt_optimizer(lr: float = 3e-4):
    """``(init, update, label)``: optax's clip + masked AdamW, or the same by hand."""
    if optax is not None:
        tx = optax.chain(optax.clip_by_global_norm(1.0),
                         optax.adamw(lr, weight_decay=0.1, mask=_kernel_mask))
        return tx.init, tx.update, "optax clip_by_global_norm + adamw(mask)"
    init, update = _adamw_by_hand(lr)
    return init, update, "hand-written clip + masked AdamW (optax not installed)"


def sgd_momentum(lr: float = 0.05, momentum: float = 0.9):
    if optax is not None:
        tx = optax.sgd(lr, momentum=momentum, nesterov=True)
        return tx.init, tx.update, "optax sgd(nesterov)"

    def init(params):
        return jax.tree.map(jnp.zeros_like, params)

    def update(grads, state, params=None):
        state = jax.tree.map(lambda t, g: momentum * t + g, state, grads)
        upd = jax.tree.map(lambda t, g: -lr * (g + momentum * t), state, grads)
        return upd, state

    return init, update, "hand-written SGD-Nesterov (optax not installed)"


def apply_updates(params, updates):
    return jax.tree.map(lambda p, u: (p + u).astype(p.dtype), params, updates)


def l2(params) -> jax.Array:
    return L2 * sum(jnp.sum(p ** 2) for p in jax.tree.leaves(params) if p.ndim >= 2)


# --------------------------------------------------------------------------- GPT


GPT = dict(vocab=96, d=32, heads=4, seq=16, batch=4, blocks=MESHES)


def _ln(p, x):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / jnp.sqrt(v + 1e-5) * p["g"] + p["b"]


def _block(p, x):
    B, T, D = x.shape
    H = GPT["heads"]
    h = _ln(p["ln1"], x)
    qkv = h @ p["qkv"] + p["qkv_b"]
    q, k, v = jnp.split(qkv, 3, axis=-1)
    q, k, v = (t.reshape(B, T, H, D // H).transpose(0, 2, 1, 3) for t in (q, k, v))
    att = (q @ k.transpose(0, 1, 3, 2)) / np.sqrt(D // H)
    att = jnp.where(jnp.tril(jnp.ones((T, T), bool)), att, -1e9)
    y = (jax.nn.softmax(att, -1) @ v).transpose(0, 2, 1, 3).reshape(B, T, D)
    x = x + y @ p["proj"]
    h = _ln(p["ln2"], x)
    return x + jax.nn.gelu(h @ p["fc"] + p["fc_b"]) @ p["out"]


def _embed(p, tok):
    return p["wte"][tok] + p["wpe"][None, :tok.shape[1]]


def _head(p, wte, x, tgt):
    logits = _ln(p["lnf"], x) @ wte.T
    lp = jax.nn.log_softmax(logits, -1)
    return -jnp.take_along_axis(lp, tgt[..., None], -1).mean()


EMBED = named_computation(_embed, name="embed")
BLOCKS = [named_computation(_block, name=f"block{i}") for i in range(GPT["blocks"])]
HEAD = named_computation(_head, name="head")


def gpt_params(key):
    V, D, T = GPT["vocab"], GPT["d"], GPT["seq"]
    ks = iter(jax.random.split(key, 64))
    n = lambda *s: jax.random.normal(next(ks), s) * 0.02  # noqa: E731
    ln = lambda: {"g": jnp.ones(D), "b": jnp.zeros(D)}  # noqa: E731
    return {"embed": {"wte": n(V, D), "wpe": n(T, D)},
            "blocks": [{"ln1": ln(), "qkv": n(D, 3 * D), "qkv_b": jnp.zeros(3 * D),
                        "proj": n(D, D), "ln2": ln(), "fc": n(D, 4 * D), "fc_b": jnp.zeros(4 * D),
                        "out": n(4 * D, D)} for _ in range(GPT["blocks"])],
            "head": {"lnf": ln()}}


def gpt_loss(params, toks, tgts):
    tot = 0.0
    for tok, tgt in zip(toks, tgts):
        x = EMBED(params["embed"], tok)
        for i, blk in enumerate(BLOCKS):
            x = blk(params["blocks"][i], x)
        tot = tot + HEAD(params["head"], params["embed"]["wte"], x, tgt)
    return tot / len(toks) + l2(params)


def gpt_data(key, microbatches=MICROBATCHES):
    B, T, V = GPT["batch"], GPT["seq"], GPT["vocab"]
    toks = [jax.random.randint(jax.random.fold_in(key, m), (B, T), 0, V) for m in range(microbatches)]
    tgts = [jnp.roll(t, -1, axis=1) for t in toks]
    return toks, tgts


def gpt_assignment() -> dict[str, str]:
    a = {f"block{i}": f"m{i}" for i in range(GPT["blocks"])}
    a.update(embed="m0", head=f"m{MESHES - 1}")
    return a


# --------------------------------------------------------------------------- ResNet


RES = dict(channels=8, size=8, batch=4, classes=10, stages=MESHES)


def _norm(x):
    m = x.mean((0, 1, 2), keepdims=True)
    v = ((x - m) ** 2).mean((0, 1, 2), keepdims=True)
    return (x - m) / jnp.sqrt(v + 1e-5)


def _conv(w, x):
    return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))


def _stage(p, x):
    h = jax.nn.relu(_norm(_conv(p["w1"], x)) * p["g1"] + p["b1"])
    h = _norm(_conv(p["w2"], h)) * p["g2"] + p["b2"]
    return jax.nn.relu(x + h)


def _res_head(p, x, y):
    logits = x.mean((1, 2)) @ p["w"] + p["b"]
    return -jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], -1).mean()


STAGES = [named_computation(_stage, name=f"stage{i}") for i in range(RES["stages"])]
RES_HEAD = named_computation(_res_head, name="res_head")


def res_params(key):
    C = RES["channels"]
    ks = iter(jax.random.split(key, 32))
    n = lambda *s: jax.random.normal(next(ks), s) * 0.1  # noqa: E731
    return {"stages": [{"w1": n(3, 3, C, C), "g1": jnp.ones(C), "b1": jnp.zeros(C),
                        "w2": n(3, 3, C, C), "g2": jnp.ones(C), "b2": jnp.zeros(C)}
                       for _ in range(RES["stages"])],
            "head": {"w": n(C, RES["classes"]), "b": jnp.zeros(RES["classes"])}}


def res_loss(params, xs, ys):
    tot = 0.0
    for x, y in zip(xs, ys):
        for i, st in enumerate(STAGES):
            x = st(params["stages"][i], x)
        tot = tot + RES_HEAD(params["head"], x, y)
    return tot / len(xs) + l2(params)


def res_data(key, microbatches=MICROBATCHES):
    B, S, C = RES["batch"], RES["size"], RES["channels"]
    xs = [jax.random.normal(jax.random.fold_in(key, m), (B, S, S, C)) for m in range(microbatches)]
    ys = [jax.random.randint(jax.random.fold_in(key, 50 + m), (B,), 0, RES["classes"])
          for m in range(microbatches)]
    return xs, ys


def res_assignment() -> dict[str, str]:
    a = {f"stage{i}": f"m{i}" for i in range(RES["stages"])}
    a["res_head"] = f"m{MESHES - 1}"
    return a


# --------------------------------------------------------------------------- steps


def grad_step(loss_fn):
    def step(params, opt_state, *batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, *batch)
        return loss, grads
    return step


def train_step(loss_fn, update):
    def step(params, opt_state, *batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, *batch)
        updates, opt_state = update(grads, opt_state, params)
        return loss, apply_updates(params, updates), opt_state
    return step


def case(name: str):
    """``(loss_fn, params, opt_init, opt_update, batch, assignment, optimizer label)``."""
    key = jax.random.PRNGKey(0)
    if name == "gpt":
        init, update, label = gpt_optimizer()
        return gpt_loss, gpt_params(key), init, update, gpt_data(key), gpt_assignment(), label
    init, update, label = sgd_momentum()
    return res_loss, res_params(key), init, update, res_data(key), res_assignment(), label


def counts(lowered) -> tuple[int, int, int]:
    """(executables, calls, transfers) of one step."""
    steps = [s for p in lowered.exported.programs.values() for s in p.steps]
    return (len(lowered.exported.executables), sum(isinstance(s, Call) for s in steps),
            sum(isinstance(s, Send) for s in steps))


def _executor(exported, flat):
    return run_program(exported, flat, record=False).outputs


def _block_all(x):
    for leaf in jax.tree.leaves(x):
        leaf.block_until_ready()
    return x


def _interleaved_ms(calls, repeats: int) -> list[float]:
    """Median milliseconds of each ``(fn, args)``, timed in turn within each repeat (one warm-up
    each first), so that a load change on the shared machine hits all of them alike."""
    for fn, args in calls:
        _block_all(fn(*args))
    ts: list[list[float]] = [[] for _ in calls]
    for _ in range(repeats):
        for k, (fn, args) in enumerate(calls):
            t0 = time.perf_counter()
            _block_all(fn(*args))
            ts[k].append(time.perf_counter() - t0)
    return [1e3 * float(np.median(t)) for t in ts]


def _max_rel(got, want) -> float:
    """The largest ``max|got - want| / max|want|`` over result leaves."""
    worst = 0.0
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if a.size:
            worst = max(worst, float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30)))
    return worst


def measure(name: str, with_update: bool, repeats: int = 20, per_mesh: int = 2) -> dict:
    """One row: see the module docstring (``per_mesh``: CPU devices per mesh)."""
    loss_fn, params, init, update, batch, assignment, label = case(name)
    topo = topology(per_mesh)
    config = MpmdConfig(topology=topo, assignment=assignment,
                        schedule=schedule(topo, MICROBATCHES), microbatches=MICROBATCHES)
    step = train_step(loss_fn, update) if with_update else grad_step(loss_fn)
    opt_state = init(params)
    args = (params, opt_state, *batch)
    t0 = time.perf_counter()
    lowered = compiler.jit(step, config).lower(*args)
    lower_s = time.perf_counter() - t0
    compiled = lowered.compile(executor=_executor)
    t0 = time.perf_counter()
    got = _block_all(compiled(*args))
    first_s = time.perf_counter() - t0
    ref = jax.jit(step)
    want = _block_all(ref(*args))
    exe, calls, sends = counts(lowered)
    resident = _resident(lowered, args, got if with_update else None)
    host_ms, step_ms, jit_ms = _interleaved_ms(
        [(compiled, args), (compiled, resident), (ref, args)], repeats)
    return {"model": name if per_mesh == 2 else f"{name}, 4 meshes x {per_mesh} device",
            "update": label if with_update else "none (loss and gradients)",
            "executables": exe, "calls": calls, "transfers": sends, "lower_s": lower_s,
            "first_call_s": first_s, "host_ms": host_ms, "step_ms": step_ms, "jit_ms": jit_ms,
            "max_rel_err": _max_rel(got, want)}


def _resident(lowered, args, outs):
    """``args`` placed on the compiled step's input shardings, where a training loop's state is
    after its first step. With ``outs`` (a training step's ``(loss, params, opt_state)``), checks
    that the step returns the parameters and optimizer state on exactly those shardings.

    Raises:
        AssertionError: a returned parameter or state leaf is on another sharding.
    """
    flat, tree = jax.tree.flatten(args)
    shs = list(lowered.input_shardings)
    if outs is not None:
        state = jax.tree.leaves((outs[1], outs[2]))
        assert all(x.sharding == s for x, s in zip(state, shs)), "state not returned in place"
    return jax.tree.unflatten(tree, jax.device_put(flat, shs))


def markdown(repeats: int = 20) -> str:
    load0 = os.getloadavg()[0]
    rows = [measure(m, u, repeats) for m in ("gpt", "resnet") for u in (False, True)]
    one = measure("gpt", True, repeats, per_mesh=1)  # the same step, one device per mesh
    rows.insert(2, one)
    load1 = os.getloadavg()[0]
    head = ("| model | update | executables | calls | transfers | lowering (s) | first call (s) "
            "| step, host arrays (ms) | step, state resident (ms) | jax.jit step (ms) "
            "| resident / jax.jit | max rel. error vs jax.jit |\n"
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    body = "".join(
        f"| {r['model']} | {r['update']} | {r['executables']} | {r['calls']} | {r['transfers']} "
        f"| {r['lower_s']:.2f} | {r['first_call_s']:.2f} | {r['host_ms']:.1f} | {r['step_ms']:.1f} "
        f"| {r['jit_ms']:.1f} | {r['step_ms'] / r['jit_ms']:.1f}x | {r['max_rel_err']:.1e} |\n"
        for r in rows)
    gpt = next(r for r in rows if r["model"] == "gpt" and not r["update"].startswith("none"))
    bare = next(r for r in rows if r["model"] == "gpt" and r["update"].startswith("none"))
    notes = (
        f"\nLoad average (1 min) {load0:.1f} at the start and {load1:.1f} at the end on "
        f"{os.cpu_count()} cores shared with other jobs: times move by 2-3x between runs; "
        "compare a row's columns with each other. \"State resident\" is a training loop's "
        "step: parameters and optimizer state already where the compiled step returns them "
        "(checked), so only the step runs; \"host arrays\" also copies every argument to its "
        "mesh each call (jax.jit reads them where they are). Targets (issue 49): executables "
        f"at most (without the update + one per mesh) = {bare['executables']} + {MESHES} = "
        f"{bare['executables'] + MESHES} for GPT, here {gpt['executables']}; lowering under "
        f"10 s, here {gpt['lower_s']:.2f} s; a step under 3x jax.jit's, here "
        f"{gpt['step_ms'] / gpt['jit_ms']:.1f}x resident and "
        f"{gpt['host_ms'] / gpt['jit_ms']:.1f}x from host arrays; with one CPU device per mesh "
        f"(the row \"{one['model']}\", every fragment computed once instead of on both "
        f"devices of its mesh) {one['step_ms'] / one['jit_ms']:.1f}x resident.\n")
    return (f"4 meshes x 2 CPU devices, {MICROBATCHES} microbatches, 1F1B; "
            f"{os.cpu_count()} cores.\n\n" + head + body + notes)


def main(argv: list[str] | None = None) -> None:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--only", choices=("gpt", "resnet"))
    a = ap.parse_args(argv)
    if a.only:
        for u in (False, True):
            print(measure(a.only, u, a.repeats))
        return
    print(markdown(a.repeats))


if __name__ == "__main__":
    main()
