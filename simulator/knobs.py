"""What-if knobs for a simulation: jitter, stragglers, degraded and failed links or meshes."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Mapping

from simulator.program import SimError, SimProgram


@dataclass(frozen=True, slots=True)
class Knobs:
    """Perturbations applied by :func:`simulator.engine.simulate`.

    Attributes:
        seed: seed of the jitter draws (same seed, same program: same timeline).
        jitter: relative sigma of a mean-1 lognormal multiplier ``exp(sigma*z - sigma^2/2)``,
            z ~ N(0, 1), drawn once per compute op in op-id order (transfers are not jittered).
        stragglers: mesh -> slowdown factor (>= 1 slows the mesh: every op's duration is multiplied).
        degraded_links: link -> bandwidth multiplier in (0, 1]; a transfer's whole duration
            (latency included) is divided by it.
        failed_links: link -> time (s) it fails. The step fails then if the link still has a
            transfer running or waiting to run.
        failed_meshes: mesh -> time (s) it fails. The step fails then if the mesh still has an op,
            a send or a receive left.

    Raises:
        SimError: a negative jitter, a straggler factor <= 0, a link factor outside (0, 1], or a
            negative failure time.
    """

    seed: int = 0
    jitter: float = 0.0
    stragglers: Mapping[str, float] = field(default_factory=dict)
    degraded_links: Mapping[str, float] = field(default_factory=dict)
    failed_links: Mapping[str, float] = field(default_factory=dict)
    failed_meshes: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.jitter >= 0:
            raise SimError(f"Knobs.jitter={self.jitter!r} must be >= 0 (a relative sigma, e.g. 0.05)")
        for m, f in self.stragglers.items():
            if not f > 0:
                raise SimError(f"Knobs.stragglers[{m!r}]={f!r} must be > 0 (2.0 = twice as slow)")
        for ln, f in self.degraded_links.items():
            if not 0 < f <= 1:
                raise SimError(f"Knobs.degraded_links[{ln!r}]={f!r} must be in (0, 1] "
                               f"(a bandwidth multiplier)")
        for what, d in (("failed_links", self.failed_links), ("failed_meshes", self.failed_meshes)):
            for k, t in d.items():
                if not t >= 0:
                    raise SimError(f"Knobs.{what}[{k!r}]={t!r} must be a time >= 0 s")

    def op_durations(self, program: SimProgram) -> list[float]:
        """Per-op durations after jitter and stragglers (s), indexed by op id."""
        base = [op.duration_s * self.stragglers.get(op.mesh, 1.0) for op in program.ops]
        if self.jitter > 0:
            rng = random.Random(self.seed)
            s = self.jitter
            shift = -0.5 * s * s
            base = [d * math.exp(s * rng.gauss(0.0, 1.0) + shift) for d in base]
        return base

    def transfer_durations(self, program: SimProgram) -> list[float]:
        """Per-transfer durations after link degradation (s), indexed by transfer id."""
        dl = self.degraded_links
        if not dl:
            return [t.duration_s for t in program.transfers]
        return [t.duration_s / dl.get(t.link, 1.0) for t in program.transfers]
