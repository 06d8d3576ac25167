"""The mixture-of-experts token path fitted per device kind on its published MoE runs
(``mpmd validate --fit-moe``, :mod:`mpmd.cli.validate_moe`): seconds per routed (token, expert,
hidden) element and per routed (token, expert) pair, the two terms of
:func:`simulator.cost_model.token_path_time` and :func:`simulator.cost_model.layer_time`'s
routing-pair charge. Each row is simulated at three points (:func:`token_path_slopes`), the two
figures are fitted on the rows' linear models of their step (:func:`fit_token_path`) and the
result is checked by simulating the fitted point; :func:`token_path_loso` fits on all sources
but one and scores the one left out. Re-exported by :mod:`simulator.validate`."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from hardware_profiles.types import DeviceProfile
from simulator.validation_rows import metric_from_step
from simulator.validation_setup import Setup, StepFn


def _v():
    """simulator.validate, imported on first use."""
    import simulator.validate as V
    return V

__all__ = ["TOKEN_PATH_PROBE", "TokenPathFit", "TokenPathSlopes", "fit_token_path",
           "token_path_loso", "token_path_slopes", "with_token_path"]


TOKEN_PATH_PROBE = (100e-12, 100e-9)
"""The (seconds per routed element, seconds per routed pair) at which :func:`token_path_slopes`
probes each row's step time: one probe per term, each with the other at 0."""


@dataclass(frozen=True, slots=True)
class TokenPathFit:
    """A kind's mixture-of-experts token path, fitted on its MoE rows (:func:`fit_token_path`):
    ``seconds`` per routed (token, expert, hidden) element (``DeviceProfile.routed_element``,
    :func:`simulator.cost_model.token_path_time`) and ``pair_seconds`` per routed (token, expert)
    pair, forward and backward together (``DeviceProfile.forward_routing_pair`` /
    ``backward_routing_pair``: :func:`with_token_path`); the rows' MAPE at them (simulated) and
    at 0 (the model without either term), the rows and the simulations run."""

    seconds: float
    mape: float
    mape_without: float
    rows: int
    evaluations: int
    pair_seconds: float = 0.0


def with_token_path(device: DeviceProfile, element_s: float, pair_s: float) -> DeviceProfile:
    """``device`` charging ``element_s`` per routed element and ``pair_s`` per routed pair
    (forward and backward together), the pair's time split as the token path's:
    :data:`simulator.cost_model.TOKEN_PATH_FORWARD_SHARE` in the forward, the rest in the
    input gradient."""
    from simulator.cost_model import TOKEN_PATH_FORWARD_SHARE as F

    return replace(device, routed_element=element_s, forward_routing_pair=pair_s * F,
                   backward_routing_pair=pair_s * (1.0 - F))


@dataclass(frozen=True, slots=True)
class TokenPathSlopes:
    """One MoE row's step time without the token path (``step_s``, host offload included) and
    its growth per second of ``routed_element`` (``per_element``) and of the per-pair time
    (``per_pair``), s/s: measured by simulating the row at :data:`TOKEN_PATH_PROBE`."""

    setup: Setup
    step_s: float
    per_element: float
    per_pair: float

    def predicted(self, element_s: float, pair_s: float, peak: float) -> float:
        """The row's metric at (``element_s``, ``pair_s``) on the linear model of its step."""
        t = self.step_s + element_s * self.per_element + pair_s * self.per_pair
        return metric_from_step(self.setup.row, t, peak)


def token_path_slopes(setups: Sequence[Setup], device: DeviceProfile,
                      step_fn: StepFn | None = None) -> tuple[TokenPathSlopes, ...]:
    """:class:`TokenPathSlopes` of each of ``setups`` on ``device`` (three simulations a row).
    Both terms add to every MoE layer's forward and input-gradient fragment times, so a row's
    step is linear in them wherever its critical path does not change (checked by
    :func:`fit_token_path`, which simulates the fitted point)."""
    evaluate, step_fn = _v().evaluate, step_fn or _v().sim_step
    d0 = with_token_path(device, 0.0, 0.0)
    pe, pp = TOKEN_PATH_PROBE
    base = evaluate(setups, d0, step_fn)
    elem = evaluate(setups, with_token_path(device, pe, 0.0), step_fn)
    pair = evaluate(setups, with_token_path(device, 0.0, pp), step_fn)
    return tuple(TokenPathSlopes(b.setup, b.step_s, (e.step_s - b.step_s) / pe,
                                 (q.step_s - b.step_s) / pp)
                 for b, e, q in zip(base, elem, pair))


def _surrogate_fit(slopes: Sequence[TokenPathSlopes], peak: float,
                   bounds_ps: tuple[float, float], bounds_ns: tuple[float, float]
                   ) -> tuple[float, float]:
    """(ps per element, ns per pair) minimising the rows' MAPE on their linear models: a grid
    (1 ps x 2 ns), then Nelder-Mead from its best point, clipped to the bounds, rounded to 0.1."""
    import numpy as np
    from scipy.optimize import minimize

    step = np.array([s.step_s for s in slopes])
    de = np.array([s.per_element for s in slopes]) * 1e-12
    dp = np.array([s.per_pair for s in slopes]) * 1e-9
    value = np.array([s.setup.row.value for s in slopes])
    base = np.array([metric_from_step(s.setup.row, s.step_s, peak) for s in slopes])
    inverse = np.array([s.setup.row.metric != "iteration_s" for s in slopes])

    def err(a, p):   # MAPE, %, for arrays of a (ps) and p (ns) broadcast against the rows
        t = step + np.asarray(a)[..., None] * de + np.asarray(p)[..., None] * dp
        metric = np.where(inverse, base * step / t, t)
        return np.mean(np.abs(metric - value) / np.abs(value), axis=-1) * 100.0

    ga = np.arange(bounds_ps[0], bounds_ps[1] + 1e-9, 1.0)
    gp = np.arange(bounds_ns[0], bounds_ns[1] + 1e-9, 2.0)
    grid = err(ga[:, None], gp[None, :])
    i, j = np.unravel_index(np.argmin(grid), grid.shape)

    def clip(x):
        return (min(max(float(x[0]), bounds_ps[0]), bounds_ps[1]),
                min(max(float(x[1]), bounds_ns[0]), bounds_ns[1]))

    res = minimize(lambda x: float(err(*clip(x))), np.array([ga[i], gp[j]]),
                   method="Nelder-Mead", options={"xatol": 0.05, "fatol": 1e-6})
    a, p = clip(res.x) if res.fun < grid[i, j] else (float(ga[i]), float(gp[j]))
    return round(a, 1), round(p, 1)


def fit_token_path(setups: Sequence[Setup], device: DeviceProfile, step_fn: StepFn | None = None,
                   *, bounds_ps: tuple[float, float] = (0.0, 200.0),
                   bounds_ns: tuple[float, float] = (0.0, 1000.0),
                   slopes: Sequence[TokenPathSlopes] | None = None) -> TokenPathFit:
    """Fit ``device``'s token path on ``setups`` (mixture-of-experts rows), everything else of
    the profile held (its dense and format fits first): the time per routed element in
    ``bounds_ps`` picoseconds and per routed pair in ``bounds_ns`` nanoseconds that minimise the
    rows' mean absolute percentage error on each row's linear model of its step
    (:func:`token_path_slopes`; ``slopes`` when the caller has them), rounded to 0.1; the MAPE
    reported is the simulated one at that point. Two values for all rows, no per-row tuning."""
    V = _v()
    step_fn = step_fn or V.sim_step
    slopes = tuple(slopes) if slopes is not None else token_path_slopes(setups, device, step_fn)
    peak = device.peak("bf16")
    a, p = _surrogate_fit(slopes, peak, bounds_ps, bounds_ns)
    runs = [s.setup for s in slopes]
    at = V.mape(V.evaluate(runs, with_token_path(device, a * 1e-12, p * 1e-9), step_fn))
    without = V.mape([V.RowResult(s.setup, s.step_s, metric_from_step(s.setup.row, s.step_s, peak))
                    for s in slopes])
    return TokenPathFit(a * 1e-12, at, without, len(runs), 4 * len(runs), p * 1e-9)


def token_path_loso(setups: Sequence[Setup], device: DeviceProfile, step_fn: StepFn | None = None,
                    slopes: Sequence[TokenPathSlopes] | None = None
                    ) -> dict[str, tuple[TokenPathFit, float]]:
    """For each source of ``setups``: :func:`fit_token_path` on the other sources (on their
    linear models, ``slopes`` or :func:`token_path_slopes`), then the simulated MAPE on the
    held-out one, %. Empty with fewer than two sources."""
    slopes = tuple(slopes) if slopes is not None else token_path_slopes(setups, device, step_fn)
    V = _v()
    step_fn = step_fn or V.sim_step
    sources = list(dict.fromkeys(s.setup.row.source for s in slopes))
    out: dict[str, tuple[TokenPathFit, float]] = {}
    peak = device.peak("bf16")
    for src in sources if len(sources) > 1 else []:
        train = [s for s in slopes if s.setup.row.source != src]
        a, p = _surrogate_fit(train, peak, (0.0, 200.0), (0.0, 1000.0))
        test = [s.setup for s in slopes if s.setup.row.source == src]
        err = V.mape(V.evaluate(test, with_token_path(device, a * 1e-12, p * 1e-9), step_fn))
        f = TokenPathFit(a * 1e-12, float("nan"), float("nan"), len(train), 0, p * 1e-9)
        out[src] = (f, err)
    return out
