"""Cost a whole plan: every fragment, stage boundary, end-of-step op and memory term.

:class:`PlanCosts` is the one place where a :class:`~ir.Plan`, its
:class:`~ir.Workload` and the :class:`~hardware_profiles.types.Cluster` meet the cost model.
The planner replays it analytically (its prediction) and the simulator lowers it into a
:class:`~simulator.program.SimProgram` (its discrete-event replay); both read the same numbers, so a
disagreement between them is a modelling difference (contention, streams), never a costing one.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from ir import FragmentRef, Plan, Workload
from ir.schedule import FragmentKind
from hardware_profiles.types import Cluster, MeshSpec, straggler_factor, straggler_hosts
from simulator import cost_model as cm
from simulator.schedules import KINDS as SCHEDULE_KINDS


class CostError(ValueError):
    """A plan does not match its workload or cluster (the message names the bad value)."""


@dataclass(frozen=True)
class PlanCosts:
    """All costs of ``plan`` for ``workload`` on ``cluster`` (seconds, bytes per device)."""

    plan: Plan
    workload: Workload
    cluster: Cluster

    def __post_init__(self) -> None:
        for st in self.plan.stages:
            if st.mesh not in self.cluster.meshes:
                raise CostError(f"plan stage {st.index} names mesh {st.mesh!r}, which cluster "
                                f"{self.cluster.name!r} lacks (meshes: {list(self.cluster.meshes)}); "
                                f"re-plan for this cluster")
            if not 0 <= st.first < st.last <= len(self.workload.layers):
                raise CostError(f"plan stage {st.index} covers layers [{st.first}, {st.last}) but "
                                f"model {self.workload.model!r} has {len(self.workload.layers)}")
        for m, lay in self.plan.layouts.items():
            mesh = self.cluster.meshes.get(m)
            if mesh is None:
                raise CostError(f"plan layout names mesh {m!r}, not in cluster {self.cluster.name!r}")
            if lay.devices != mesh.num_devices:
                raise CostError(f"plan layout {lay} on mesh {m!r} uses {lay.devices} "
                                f"devices, the mesh has {mesh.num_devices}")

    # ------------------------------------------------------------------ shapes
    @cached_property
    def samples(self) -> float:
        """Samples per microbatch."""
        return self.plan.global_batch / self.plan.microbatches

    @cached_property
    def dtype(self) -> str:
        return cm.compute_dtype(self.workload)

    def stage_mesh(self, stage: int) -> MeshSpec:
        return self.cluster.meshes[self.plan.stages[stage].mesh]

    def rank_mesh(self, rank: int) -> str:
        return self.plan.rank_mesh[rank]

    def recompute(self, mesh: str) -> bool:
        return bool(self.plan.recompute.get(mesh, False)) and self.workload.training

    @property
    def last_stage(self) -> int:
        return len(self.plan.stages) - 1

    # ------------------------------------------------------------------ compute
    @cached_property
    def _stage_kind_time(self) -> dict[tuple[int, str], float]:
        out: dict[tuple[int, str], float] = {}
        split = self.plan.schedule.split_backward
        for st in self.plan.stages:
            mesh = self.cluster.meshes[st.mesh]
            lay = self.plan.layouts[st.mesh]
            rc = self.recompute(st.mesh)
            for kind in FragmentKind:
                out[(st.index, kind)] = sum(
                    cm.layer_time(self.workload.layer(i), kind, self.samples, mesh, lay,
                                  self.dtype, split_backward=split, recompute=rc,
                                  seq_len=self.workload.seq_len, alltoall_hidden=self.alltoall_hidden,
                                  precision=self.workload.precision)
                    for i in range(st.first, st.last)) + self.fsdp_exposed(st.index, kind)
        return out

    @cached_property
    def alltoall_hidden(self) -> bool:
        """Whether the plan's schedule hides a mixture of experts' all-to-alls under another
        microbatch's compute (``ScheduleKind.hides_alltoall``: DualPipe); False for a table whose
        name is no known schedule."""
        got = SCHEDULE_KINDS.get(self.plan.schedule.name)
        return bool(got and got.hides_alltoall)

    def expert_alltoall(self) -> dict[str, tuple[float, float]]:
        """Per mesh with expert parallelism, ``(bytes, seconds)`` of one step's mixture-of-experts
        all-to-alls, as the fragments are charged them (``cost_model.expert_alltoall``): every
        microbatch's dispatch and combine in each forward and their transposes in each backward,
        bytes summed over the mesh's devices; seconds per device, before any hiding under
        compute (:attr:`alltoall_hidden`). Empty for a plan without expert parallelism."""
        out: dict[str, tuple[float, float]] = {}
        M = self.plan.microbatches
        for st in self.plan.stages:
            lay = self.plan.layouts[st.mesh]
            if lay.expert <= 1:
                continue
            mesh = self.cluster.meshes[st.mesh]
            per_dev = self.samples / lay.replicas
            nbytes = seconds = 0.0
            for i in range(st.first, st.last):
                c = self.workload.layer(i)
                if c.alltoall_bytes_per_sample <= 0:
                    continue
                # dispatch + combine in F, their transposes in B, on every device of the mesh
                nbytes += 4 * cm.expert_alltoall_bytes(c, per_dev, lay) * mesh.num_devices
                seconds += sum(cm.expert_alltoall(c, k, per_dev, mesh, lay)
                               for k in (FragmentKind.F, FragmentKind.B))
            b, t = out.get(st.mesh, (0.0, 0.0))
            out[st.mesh] = (b + nbytes * M, t + seconds * M)
        return {m: v for m, v in out.items() if v[0] > 0}

    def fsdp_exposed(self, stage: int, kind: str) -> float:
        """Seconds of stage ``stage``'s FSDP gathers and reduce-scatters that prefetching cannot
        hide in one ``kind`` fragment (the first gather, the last reduce-scatter:
        :func:`simulator.cost_model.fsdp_exposed`); with full recomputation the backward's
        rerun forward exposes its own first gather too. 0 without fsdp."""
        if not self.workload.training and kind != FragmentKind.F:
            return 0.0
        st = self.plan.stages[stage]
        mesh, lay = self.cluster.meshes[st.mesh], self.plan.layouts[st.mesh]
        split = self.plan.schedule.split_backward
        out = cm.fsdp_exposed(self.workload, st.first, st.last, kind, mesh, lay, split)
        if kind == FragmentKind.B and self.recompute(st.mesh):
            out += cm.fsdp_exposed(self.workload, st.first, st.last, FragmentKind.F, mesh, lay)
        return out

    def _microbatch_grad_sync(self, ref: FragmentRef) -> float:
        """The data-parallel gradient all-reduce a backward pays when ``plan.grad_sync`` is
        ``"microbatch"`` (on the fragment that computes weight gradients: W when split, else B)."""
        if self.plan.grad_sync != "microbatch" or not self.workload.training:
            return 0.0
        if ref.kind != (FragmentKind.W if self.plan.schedule.split_backward else FragmentKind.B):
            return 0.0
        st = self.plan.stages[ref.stage]
        lay = self.plan.layouts[st.mesh]
        if lay.fsdp or lay.replicas <= 1:
            return 0.0
        params = sum(self.workload.layer(i).param_count for i in range(st.first, st.last))
        mesh = self.cluster.meshes[st.mesh]
        return cm.collective(mesh, "all_reduce", params * cm.grad_bytes(lay) / lay.tensor,
                             lay.replicas, lay.tensor)

    @cached_property
    def _memo(self) -> dict:
        """Per-instance caches of the pure per-(stage, kind) and per-boundary costs below."""
        return {}

    def fragment_time(self, ref: FragmentRef) -> float:
        """Seconds of fragment ``ref`` on its stage's mesh, dispatch overhead included (the same for
        every microbatch, so computed once per stage and kind).

        When the last stage's F and B are merged, the pair pays one dispatch (on the F). On a
        cluster with ``p2p="blocking"`` the fragment also holds its mesh's compute stream while it
        sends its output to the next stage (F: stage + 1, B: stage - 1; see :meth:`send_time`).
        """
        key = ("t", ref.stage, ref.kind)
        got = self._memo.get(key)
        if got is None:
            base = self._stage_kind_time[(ref.stage, ref.kind)] + self._microbatch_grad_sync(ref)
            merged_b = (self.plan.merge_last_stage and ref.kind == FragmentKind.B
                        and ref.stage == self.last_stage)
            got = (base + (0.0 if merged_b else cm.fragment_overhead(self.stage_mesh(ref.stage)))
                   + self.send_time(ref))
            self._memo[key] = got
        return got

    @property
    def blocking_p2p(self) -> bool:
        """True when the cluster's point-to-point transfers block the sender's compute stream."""
        return self.cluster.p2p == "blocking"

    def send_time(self, ref: FragmentRef) -> float:
        """Seconds fragment ``ref`` spends sending its result on its compute stream: the
        transfer to the next stage of its direction (F: stage + 1, B: stage - 1) when the cluster's
        ``p2p`` is ``"blocking"`` and that stage is on another mesh, else 0."""
        if not self.blocking_p2p or ref.kind not in (FragmentKind.F, FragmentKind.B):
            return 0.0
        dst = ref.stage + (1 if ref.kind == FragmentKind.F else -1)
        if not 0 <= dst < len(self.plan.stages):
            return 0.0
        b = self._transfer(ref.stage, dst)
        return 0.0 if b is None else b[2]

    def recv_time(self, ref: FragmentRef) -> float:
        """Seconds fragment ``ref``'s compute stream spends receiving its input before it starts:
        on a cluster with ``p2p="blocking"``, the transfer from the stage its input comes from
        (F: stage - 1, B: stage + 1) when that stage is on another mesh, else 0. A blocking receive
        is a kernel on the receiver's compute stream too (NCCL ``recv``; Megatron-LM with
        ``--no-overlap-p2p-communication`` waits on its batched ``isend``/``irecv`` before the next
        compute), so the fragment starts no earlier than its rank's previous fragment's end plus
        this. The sender's side is :meth:`send_time`."""
        if not self.blocking_p2p or ref.kind not in (FragmentKind.F, FragmentKind.B):
            return 0.0
        src = ref.stage + (-1 if ref.kind == FragmentKind.F else 1)
        if not 0 <= src < len(self.plan.stages):
            return 0.0
        b = self._transfer(src, ref.stage)
        return 0.0 if b is None else b[2]

    def fragment_flops(self, ref: FragmentRef) -> float:
        """Model FLOP of fragment ``ref`` (all devices of its mesh together)."""
        st = self.plan.stages[ref.stage]
        total = 0.0
        for i in range(st.first, st.last):
            c = self.workload.layer(i)
            if ref.kind == FragmentKind.F:
                total += c.fwd_flops_per_sample
            elif ref.kind == FragmentKind.W:
                total += c.bwd_flops_per_sample - c.bwd_input_flops_per_sample
            else:
                total += (c.bwd_input_flops_per_sample if self.plan.schedule.split_backward
                          else c.bwd_flops_per_sample)
        return total * self.samples

    # ------------------------------------------------------------------ transfers
    def boundary(self, src_stage: int, dst_stage: int) -> tuple[str, float, float] | None:
        """(link name, bytes, seconds) of the activation (or its gradient) crossing from
        ``src_stage`` to ``dst_stage``, or None when both run on the same mesh. With blocking
        point-to-point (``cluster.p2p == "blocking"``) the seconds are 0: the sending fragment
        already holds its compute stream for the transfer (:meth:`send_time`), so the value has
        arrived when that fragment ends."""
        x = self._transfer(src_stage, dst_stage)
        if x is None or not self.blocking_p2p:
            return x
        return x[0], x[1], 0.0

    def _transfer(self, src_stage: int, dst_stage: int) -> tuple[str, float, float] | None:
        key = ("x", src_stage, dst_stage)
        if key not in self._memo:
            self._memo[key] = self._transfer_uncached(src_stage, dst_stage)
        return self._memo[key]

    def _transfer_uncached(self, src_stage: int, dst_stage: int) -> tuple[str, float, float] | None:
        a, b = self.plan.stages[src_stage].mesh, self.plan.stages[dst_stage].mesh
        if a == b:
            return None
        boundary_layer = self.plan.stages[min(src_stage, dst_stage)].last - 1
        nbytes = self.workload.layer(boundary_layer).activation_bytes_per_sample * self.samples
        ln = self.cluster.link_between(a, b)
        return ln.name, nbytes, cm.transfer_time(nbytes, ln.link)

    # ------------------------------------------------------------------ end of step
    def _mesh_layers(self, mesh: str) -> list[tuple[int, int]]:
        return [(s.first, s.last) for s in self.plan.stages if s.mesh == mesh]

    def tail(self, mesh: str) -> tuple[tuple[str, float], ...]:
        """The end-of-step compute-stream ops of ``mesh``: (kind, seconds) for the gradient sync
        point (``"allreduce"``: it waits for the mesh's gradient buckets, :meth:`grad_buckets`,
        and for the plan's slowest host, :meth:`straggler_wait`) and the optimizer step (empty
        for forward-only workloads)."""
        if not self.workload.training:
            return ()
        spec, lay = self.cluster.meshes[mesh], self.plan.layouts[mesh]
        opt = sum(cm.optimizer_time(self.workload, a, b, spec, lay) for a, b in self._mesh_layers(mesh))
        return (("allreduce", self.straggler_wait(mesh)), ("optimizer", opt))

    @cached_property
    def hosts(self) -> int:
        """Independent straggler units the plan's devices form: per mesh, its nodes when it spans
        several (``MeshSpec.devices_per_node``), else its devices over its device's
        ``lockstep_devices`` (rounded up), summed over the plan's meshes."""
        return straggler_hosts(self.cluster.meshes[m] for m in dict.fromkeys(self.plan.rank_mesh))

    def straggler_wait(self, mesh: str) -> float:
        """Seconds ``mesh`` waits at the gradient sync for the plan's slowest host: its compute
        per step (the fragments of its pipeline rank) x (:func:`straggler_factor` - 1) over
        :attr:`hosts` with its device's ``sync_jitter``. 0 with no jitter or on one host."""
        f = straggler_factor(self.hosts, self.cluster.meshes[mesh].device.sync_jitter) - 1.0
        if f <= 0:
            return 0.0
        key = ("s", mesh)
        if key not in self._memo:
            busy = 0.0
            for rank, m in enumerate(self.plan.rank_mesh):
                if m == mesh:
                    busy += sum(self.fragment_time(ref) for ref in self.plan.schedule.order[rank])
            self._memo[key] = busy * f
        return self._memo[key]

    def last_backward(self, stage: int) -> FragmentRef:
        """The fragment that finishes stage ``stage``'s weight gradients: the W (split backward)
        or B of its last microbatch in its rank's order."""
        kind = FragmentKind.W if self.plan.schedule.split_backward else FragmentKind.B
        rank = self.plan.schedule.stage_rank[stage]
        return [f for f in self.plan.schedule.order[rank] if f.kind == kind and f.stage == stage][-1]

    def grad_buckets(self, stage: int) -> tuple[tuple[str, str, float, float, float], ...]:
        """Stage ``stage``'s gradient-sync buckets on its mesh's collective stream, in backward
        order (last layer first): (name, collective, per-device bytes, seconds, ready fraction).
        One bucket per layer (:func:`simulator.cost_model.layer_grad_sync`), ready once that
        fraction of :meth:`last_backward` has run (all at its end, fraction 1, when the mesh's
        device syncs ``after_backward``: ``DeviceProfile.grad_sync_overlap``) (the backward visits layers last to first; the
        fraction is the layer-time share of the fragment's duration). Empty for inference, a
        data degree of 1, fsdp without hsdp, or ``plan.grad_sync == "microbatch"``."""
        key = ("g", stage)
        if key in self._memo:
            return self._memo[key]
        out: list[tuple[str, str, float, float, float]] = []
        st = self.plan.stages[stage]
        if self.workload.training and self.plan.grad_sync != "microbatch":
            mesh, lay = self.cluster.meshes[st.mesh], self.plan.layouts[st.mesh]
            ref = self.last_backward(stage)
            total = self.fragment_time(ref)
            split = self.plan.schedule.split_backward
            after = mesh.device.grad_sync_overlap == "after_backward"
            done = 0.0
            for i in reversed(range(st.first, st.last)):
                c = self.workload.layer(i)
                done += cm.layer_time(c, ref.kind, self.samples, mesh, lay, self.dtype,
                                      split_backward=split, recompute=self.recompute(st.mesh),
                                      seq_len=self.workload.seq_len,
                                      alltoall_hidden=self.alltoall_hidden,
                                      precision=self.workload.precision)
                x = cm.layer_grad_sync(c, mesh, lay)
                if x is not None and x[2] > 0:
                    frac = 1.0 if after or total <= 0 else min(1.0, done / total)
                    tag = "RS" if x[0] == "reduce_scatter" else "AR"
                    out.append((f"{tag}{stage}.L{i}", x[0], x[1], x[2], frac))
        self._memo[key] = tuple(out)
        return self._memo[key]

    def param_gather(self, mesh: str) -> float:
        """Seconds of ``mesh``'s parameter all-gather after its optimizer step
        (:func:`simulator.cost_model.param_gather_time`; 0 for inference)."""
        if not self.workload.training or self.plan.grad_sync == "microbatch":
            return 0.0
        spec, lay = self.cluster.meshes[mesh], self.plan.layouts[mesh]
        return sum(cm.param_gather_time(self.workload, a, b, spec, lay)
                   for a, b in self._mesh_layers(mesh))

    # ------------------------------------------------------------------ memory
    def stage_memory(self, stage: int) -> cm.StageMemory:
        key = ("m", stage)
        if key not in self._memo:
            self._memo[key] = self._stage_memory(stage)
        return self._memo[key]

    def _stage_memory(self, stage: int) -> cm.StageMemory:
        st = self.plan.stages[stage]
        return cm.stage_memory(self.workload, st.first, st.last, self.plan.layouts[st.mesh],
                               self.samples, self.recompute(st.mesh))

    def static_bytes(self, mesh: str) -> float:
        """Per-device static bytes of ``mesh``: weights, gradients, optimizer state of its stages."""
        return sum(self.stage_memory(s.index).static_bytes for s in self.plan.stages if s.mesh == mesh)

    def residual_bytes(self, ref: FragmentRef) -> float:
        """Per-device bytes a forward of ``ref.stage`` keeps until its backward (0 for inference)."""
        return self.stage_memory(ref.stage).residual_bytes_per_microbatch

    def working_bytes(self, mesh: str) -> float:
        """Per-device transient bytes of ``mesh``: the largest working set of its stages (see
        :attr:`simulator.cost_model.StageMemory.working_bytes`)."""
        return max(self.stage_memory(s.index).working_bytes
                   for s in self.plan.stages if s.mesh == mesh)

    def capacity(self, mesh: str) -> float:
        return self.cluster.meshes[mesh].device.memory_bytes

    # ------------------------------------------------------------------ bounds
    @cached_property
    def peak_flops(self) -> float:
        """The cluster's summed dense peak FLOP/s at the precision the plan computes in: each
        device's own rate for the workload's compute dtype (:meth:`Cluster.peak_flops`: an fp32
        model's TF32 rate on an A100, its FP32 rate on a V100), the denominator of MFU and of the
        roofline bound. Every FLOP the cost model charges runs at most that device's peak, so MFU
        is at most 1 and the roofline bound at most the step. Under a low-precision recipe each
        device's peak for the recipe's format (:func:`simulator.cost_model.peak_rate`).

        Raises:
            ProfileError: a device of the cluster has no rate for the compute dtype.
        """
        return sum(cm.peak_rate(s.device, self.workload) * s.num_devices
                   for s in self.cluster.meshes.values())

    def roofline_step_time(self) -> float:
        """Lower bound: the step's model FLOP over the cluster's summed dense peak FLOP/s
        (:attr:`peak_flops`)."""
        return self.workload.step_flops / self.peak_flops
