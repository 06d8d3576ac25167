"""The mixture-of-experts token path fitted per device kind on its published MoE runs
(``mpmd validate --fit-moe``, :mod:`mpmd.cli.validate_moe`): seconds per routed (token, expert,
hidden) element, per routed (token, expert) pair, and per routed pair of the host-synchronised
dropless all-to-all dispatch only (``DeviceProfile.dropless_routing_pair``): the terms of
:func:`simulator.cost_model.token_path_time` and :func:`simulator.cost_model.layer_time`'s
routing-pair charge. Each row is simulated at four points (:func:`token_path_slopes`), the three
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


TOKEN_PATH_PROBE = (100e-12, 100e-9, 100e-9)
"""The (seconds per routed element, per routed pair, per dropless routed pair) at which
:func:`token_path_slopes` probes each row's step time: one probe per term, the others at 0."""


@dataclass(frozen=True, slots=True)
class TokenPathFit:
    """A kind's mixture-of-experts token path, fitted on its MoE rows (:func:`fit_token_path`):
    ``seconds`` per routed (token, expert, hidden) element (``DeviceProfile.routed_element``,
    :func:`simulator.cost_model.token_path_time`) and ``pair_seconds`` per routed (token, expert)
    pair, forward and backward together (``DeviceProfile.forward_routing_pair`` /
    ``backward_routing_pair``: :func:`with_token_path`); the rows' MAPE at them (simulated) and
    at 0 (the model without either term), the rows and the simulations run;
    ``dropless_seconds`` per routed pair of a dropless dispatch on top
    (``DeviceProfile.dropless_routing_pair``)."""

    seconds: float
    mape: float
    mape_without: float
    rows: int
    evaluations: int
    pair_seconds: float = 0.0
    dropless_seconds: float = 0.0


def with_token_path(device: DeviceProfile, element_s: float, pair_s: float,
                    dropless_s: float | None = None) -> DeviceProfile:
    """``device`` charging ``element_s`` per routed element and ``pair_s`` per routed pair
    (forward and backward together), the pair's time split as the token path's:
    :data:`simulator.cost_model.TOKEN_PATH_FORWARD_SHARE` in the forward, the rest in the
    input gradient; and ``dropless_s`` per routed pair of a dropless dispatch on top
    (``DeviceProfile.dropless_routing_pair``; None: the device's own)."""
    from simulator.cost_model import TOKEN_PATH_FORWARD_SHARE as F

    return replace(device, routed_element=element_s, forward_routing_pair=pair_s * F,
                   backward_routing_pair=pair_s * (1.0 - F),
                   dropless_routing_pair=(device.dropless_routing_pair if dropless_s is None
                                          else dropless_s))


@dataclass(frozen=True, slots=True)
class TokenPathSlopes:
    """One MoE row's step time without the token path (``step_s``, host offload included) and
    its growth per second of ``routed_element`` (``per_element``), of the per-pair time
    (``per_pair``) and of the dropless per-pair time (``per_dropless``: 0 for a token-dropping
    row), s/s: measured by simulating the row at :data:`TOKEN_PATH_PROBE`."""

    setup: Setup
    step_s: float
    per_element: float
    per_pair: float
    per_dropless: float = 0.0

    def predicted(self, element_s: float, pair_s: float, peak: float,
                  dropless_s: float = 0.0) -> float:
        """The row's metric at (``element_s``, ``pair_s``, ``dropless_s``) on the linear model
        of its step."""
        t = (self.step_s + element_s * self.per_element + pair_s * self.per_pair
             + dropless_s * self.per_dropless)
        return metric_from_step(self.setup.row, t, peak)


def token_path_slopes(setups: Sequence[Setup], device: DeviceProfile,
                      step_fn: StepFn | None = None) -> tuple[TokenPathSlopes, ...]:
    """:class:`TokenPathSlopes` of each of ``setups`` on ``device`` (four simulations a row;
    the fourth only where some row is dropless). The terms add to every MoE layer's forward and
    input-gradient fragment times, so a row's step is linear in them wherever its critical path
    does not change (checked by :func:`fit_token_path`, which simulates the fitted point)."""
    evaluate, step_fn = _v().evaluate, step_fn or _v().sim_step
    d0 = with_token_path(device, 0.0, 0.0, 0.0)
    pe, pp, pd = TOKEN_PATH_PROBE
    base = evaluate(setups, d0, step_fn)
    elem = evaluate(setups, with_token_path(device, pe, 0.0, 0.0), step_fn)
    pair = evaluate(setups, with_token_path(device, 0.0, pp, 0.0), step_fn)
    drop = (evaluate(setups, with_token_path(device, 0.0, 0.0, pd), step_fn)
            if any(not tokendrop(s) for s in setups) else base)
    return tuple(TokenPathSlopes(b.setup, b.step_s, (e.step_s - b.step_s) / pe,
                                 (q.step_s - b.step_s) / pp, (x.step_s - b.step_s) / pd)
                 for b, e, q, x in zip(base, elem, pair, drop))


def tokendrop(setup: Setup) -> bool:
    """Whether ``setup``'s plan dispatches tokens with a capacity (every mesh ``tokendrop``)."""
    return all(lay.expert_dispatch == "tokendrop" for lay in setup.plan.layouts.values())


def _surrogate_fit(slopes: Sequence[TokenPathSlopes], peak: float,
                   bounds_ps: tuple[float, float], bounds_ns: tuple[float, float],
                   bounds_dropless_ns: tuple[float, float] = (0.0, 0.0)
                   ) -> tuple[float, float, float]:
    """(ps per element, ns per pair, ns per dropless pair) minimising the rows' MAPE on their
    linear models: a grid (50 steps of each range), then Nelder-Mead from its best point,
    clipped to the bounds, rounded to 0.1. ``bounds_dropless_ns`` (0, 0): the third held at 0
    (no row is dropless, or the caller fits two)."""
    import numpy as np
    from scipy.optimize import minimize

    step = np.array([s.step_s for s in slopes])
    de = np.array([s.per_element for s in slopes]) * 1e-12
    dp = np.array([s.per_pair for s in slopes]) * 1e-9
    dd = np.array([s.per_dropless for s in slopes]) * 1e-9
    value = np.array([s.setup.row.value for s in slopes])
    base = np.array([metric_from_step(s.setup.row, s.step_s, peak) for s in slopes])
    inverse = np.array([s.setup.row.metric != "iteration_s" for s in slopes])
    bounds = (bounds_ps, bounds_ns, bounds_dropless_ns)

    def err(a, p, q):   # MAPE, %, for arrays of a (ps), p and q (ns) broadcast against the rows
        t = (step + np.asarray(a)[..., None] * de + np.asarray(p)[..., None] * dp
             + np.asarray(q)[..., None] * dd)
        metric = np.where(inverse, base * step / t, t)
        return np.mean(np.abs(metric - value) / np.abs(value), axis=-1) * 100.0

    axes = [np.linspace(lo, hi, 51) if hi > lo else np.array([lo]) for lo, hi in bounds]
    grid = err(axes[0][:, None, None], axes[1][None, :, None], axes[2][None, None, :])
    i, j, k = np.unravel_index(np.argmin(grid), grid.shape)
    start = np.array([axes[0][i], axes[1][j], axes[2][k]])

    def clip(x):
        return tuple(min(max(float(v), lo), hi) for v, (lo, hi) in zip(x, bounds))

    res = minimize(lambda x: float(err(*clip(x))), start, method="Nelder-Mead",
                   options={"xatol": 0.05, "fatol": 1e-6})
    best = clip(res.x) if res.fun < grid[i, j, k] else tuple(float(v) for v in start)
    a, p, q = (round(v, 1) for v in best)
    return a, p, q


def _dropless_bounds(slopes: Sequence[TokenPathSlopes], bounds_ns: tuple[float, float]
                     ) -> tuple[float, float]:
    """The dropless figure's range: ``bounds_ns`` where the rows hold both runs that pay it (the
    host-synchronised all-to-all dispatch) and runs that do not (token-dropping, DeepEP/HybridEP):
    only then can the two per-pair figures be told apart; else (0, 0)."""
    drop = [s.per_dropless == 0.0 for s in slopes]
    return bounds_ns if any(drop) and not all(drop) else (0.0, 0.0)


def fit_token_path(setups: Sequence[Setup], device: DeviceProfile, step_fn: StepFn | None = None,
                   *, bounds_ps: tuple[float, float] = (0.0, 200.0),
                   bounds_ns: tuple[float, float] = (0.0, 1000.0),
                   slopes: Sequence[TokenPathSlopes] | None = None) -> TokenPathFit:
    """Fit ``device``'s token path on ``setups`` (mixture-of-experts rows), everything else of
    the profile held (its dense and format fits first): the time per routed element in
    ``bounds_ps`` picoseconds, per routed pair and per routed pair of a dropless dispatch on top
    in ``bounds_ns`` nanoseconds (the last only where the rows hold both token-dropping and
    dropless runs, else 0) that minimise the rows' mean absolute percentage error on each row's
    linear model of its step (:func:`token_path_slopes`; ``slopes`` when the caller has them),
    rounded to 0.1; the MAPE reported is the simulated one at that point. Three values for all
    rows, no per-row tuning."""
    V = _v()
    step_fn = step_fn or V.sim_step
    slopes = tuple(slopes) if slopes is not None else token_path_slopes(setups, device, step_fn)
    peak = device.peak("bf16")
    a, p, q = _surrogate_fit(slopes, peak, bounds_ps, bounds_ns, _dropless_bounds(slopes, bounds_ns))
    runs = [s.setup for s in slopes]
    at = V.mape(V.evaluate(runs, with_token_path(device, a * 1e-12, p * 1e-9, q * 1e-9), step_fn))
    without = V.mape([V.RowResult(s.setup, s.step_s, metric_from_step(s.setup.row, s.step_s, peak))
                    for s in slopes])
    return TokenPathFit(a * 1e-12, at, without, len(runs), 5 * len(runs), p * 1e-9, q * 1e-9)


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
        a, p, q = _surrogate_fit(train, peak, (0.0, 200.0), (0.0, 1000.0),
                                 _dropless_bounds(train, (0.0, 1000.0)))
        test = [s.setup for s in slopes if s.setup.row.source == src]
        err = V.mape(V.evaluate(test, with_token_path(device, a * 1e-12, p * 1e-9, q * 1e-9),
                                step_fn))
        f = TokenPathFit(a * 1e-12, float("nan"), float("nan"), len(train), 0, p * 1e-9, q * 1e-9)
        out[src] = (f, err)
    return out
