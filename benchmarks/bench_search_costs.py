"""The search budget's nominal costs against the CPU time they stand for (``planner.budget.COSTS``).

Runs three searches at the default ``--time-limit`` (Llama 3 8B on 64 H100 node groups, on a
two-kind H100 + A100 cluster, Llama 3 70B on 256 H100) and prints, per unit of work, the process
CPU seconds it took beside its nominal cost: ``python benchmarks/bench_search_costs.py``. When a
cost model change makes the measured figure exceed the nominal one, re-measure and update
``COSTS``, or the wall clock (not the work budget) ends searches and plans depend on the load.
"""
import sys, time, tempfile, collections
from pathlib import Path
from zoo.costing import workload
from hardware_profiles import load_cluster, CLUSTERS_DIR
import planner.candidate as C, planner.budget as B
from planner.budget import _fragments, COSTS
from simulator.schedules import ADAPTIVE_SCHEDULES
tally = collections.defaultdict(lambda: [0.0, 0.0, 0])
oe = C._evaluate
def ev(w, lc, a, sched, m, v, opts):
    t = time.process_time(); r = oe(w, lc, a, sched, m, v, opts); dt = time.process_time() - t
    k = "adaptive" if sched in ADAPTIVE_SCHEDULES else "fragment"
    x = tally[k]; x[0] += dt; x[1] += _fragments(r[0]); x[2] += 1
    return r
C._evaluate = ev
so = C.solve_outcome
def sol(*a, **k):
    t = time.process_time(); out = so(*a, **k); dt = time.process_time() - t
    x = tally["cpsat"]; x[0] += dt; x[1] += out.deterministic_s; x[2] += 1
    return out
C.solve_outcome = sol
roots = []
orig = B.Budget.__init__
def init(self, *a, **k):
    orig(self, *a, **k)
    if self.parent is None: roots.append(self)
B.Budget.__init__ = init
from planner import PlanOptions, plan


def _two_kinds(folder: Path) -> Path:
    p = folder / "two.yaml"
    p.write_text("""name: two
node_groups:
- {name: h100, device: h100-sxm, nodes: 2, devices_per_node: 8, scale_out_link: {latency_us: 5, source: bench}}
- {name: a100, device: a100-80gb-sxm, nodes: 2, devices_per_node: 8, scale_out_link: {latency_us: 5, source: bench}}
group_links:
- {between: [h100, a100], bandwidth_gbit_per_s: 800, latency_us: 20, source: bench}
""")
    return p

cases = [("llama3-8b", 64, CLUSTERS_DIR / "h100x64_nodes.yaml"), ("llama3-8b", 64, _two_kinds(Path(tempfile.mkdtemp()))),
         ("llama3-70b", 256, CLUSTERS_DIR / "h100x256_nodes.yaml")]
for model, gb, path in cases:
    w = workload(model, gb, 4096)
    c = load_cluster(path)
    t = time.process_time()
    r = plan(w, c, PlanOptions(time_limit_s=30))
    print(path.name, "wall", round(time.process_time() - t, 1), "nominal", round(roots[-1].used, 1), "step", round(r.prediction.step_time_s, 4))
for k, (dt, n, calls) in tally.items():
    nominal = COSTS[k] + (COSTS["fragment"] if k == "adaptive" else 0.0)   # adaptive: on top
    print(f"{k:9s} CPU {dt:6.2f} s over {n:10.1f} units ({calls} calls): {dt / max(n, 1e-9):.2e} s "
          f"per unit, nominal {nominal:.2e}")
