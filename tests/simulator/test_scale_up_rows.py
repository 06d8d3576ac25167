"""A validation row's scale-up domain: the ``scale_up_domain`` column, else the device profile's
(72 GPUs on one NVLink fabric in a GB200 NVL72 rack), else one host of 8."""

from __future__ import annotations

import dataclasses

from hardware_profiles import load_device
from simulator import validate as V
from simulator.validation_setup import node_devices


def _row(**kw) -> V.Row:
    base = dict(source="t", model="m", layers=8, hidden=1024, heads=8, seq_len=1024, vocab=None,
                device="gb200", gpus=128, tp=1, pp=2, dp=64, global_batch=128, micro_batch=1,
                microbatches=2, schedule="1f1b", metric="iteration_s", value=1.0)
    base.update(kw)
    return V.Row(**base)


def test_the_domain_comes_from_the_row_else_the_profile():
    gb200, h100 = load_device("gb200"), load_device("h100-sxm")
    assert gb200.scale_up_domain == 72 and h100.scale_up_domain is None
    assert node_devices(_row(), gb200) == 72
    assert node_devices(_row(device="h100-sxm"), h100) == 8
    assert node_devices(_row(scale_up_domain=36), gb200) == 36
    assert node_devices(_row(devices_per_node=4), gb200) == 4      # the row's own hosts
    assert _row(scale_up_domain=36, devices_per_node=4).node_size == 36


def test_a_stage_inside_the_rack_never_crosses_the_network():
    gb200 = load_device("gb200")
    rack = V.build_cluster(_row(), gb200)
    assert all(m.scale_out_link is None for m in rack.meshes.values())     # 64 GPUs: one fabric
    hosts = V.build_cluster(dataclasses.replace(_row(), devices_per_node=8), gb200)
    assert all(m.devices_per_node == 8 and m.scale_out_link is not None
               for m in hosts.meshes.values())


def test_the_dispatcher_column_names_megatrons_dispatchers():
    import pytest

    from ir import Layout
    from simulator.validation_rows import ValidationError, parse_row

    d = dict(source="t", model="m", layers="8", hidden="1024", heads="8", seq_len="1024",
             device="gb200", gpus="16", tp="1", pp="1", dp="16", global_batch="16",
             metric="iteration_s", value="1.0", ep="16", dispatcher="HybridEP",
             model_config="deepseek-v3")
    from hardware_profiles import known_device_ids

    known = list(known_device_ids())
    r = parse_row(d, 2, known)
    assert r.dispatcher == "deepep"
    assert V.row_layout(r) == Layout(16, 1, expert=16, expert_tensor=1, expert_dispatch="deepep")
    # blank: HybridEP on a GB200 NVL72 rack (HYBRIDEP_DEVICES); elsewhere DeepEP where the expert
    # group leaves the 8-GPU host on a Hopper or later part, else Megatron-Core's default
    blank = dataclasses.replace(r, dispatcher=None)
    assert V.row_layout(blank).expert_dispatch == "deepep"
    assert V.row_layout(dataclasses.replace(blank, device="h100-sxm")).expert_dispatch == "deepep"
    inside = dataclasses.replace(blank, device="h100-sxm", ep=8, dp=16)
    assert V.row_layout(inside).expert_dispatch == "alltoall"                  # 8 of 8: one host
    assert V.row_layout(dataclasses.replace(inside, etp=2)).expert_dispatch == "deepep"   # 8 x 2
    assert V.row_layout(dataclasses.replace(blank, device="a100-80gb-sxm")
                        ).expert_dispatch == "alltoall"                        # no DeepEP before Hopper
    assert V.row_layout(dataclasses.replace(blank, device="h100-sxm", scale_up_domain=16)
                        ).expert_dispatch == "alltoall"                        # a 16-GPU NVLink domain
    with pytest.raises(ValidationError, match=r"^row 2: dispatcher 'nccl' unknown; fix: use one "
                                              r"of alltoall, deepep, hybridep, flex"):
        parse_row({**d, "dispatcher": "nccl"}, 2, known)


def test_a_blank_tp_overlap_is_what_nvidias_dense_recipes_run():
    from simulator.validation_setup import default_tp_overlap, row_setup
    from mpmd.cli.validate import workload_for

    dense = _row(tp=4, dp=16, microbatches=8, device="h100-sxm")
    assert default_tp_overlap(dense) and V.row_layout(dense).tp_overlap
    assert V.row_layout(dataclasses.replace(dense, device="gb200")).tp_overlap
    # stated 0, tensor parallel 1, a TPU, or expert parallelism: collectives on the critical path
    assert not V.row_layout(dataclasses.replace(dense, tp_overlap=False)).tp_overlap
    assert not V.row_layout(dataclasses.replace(dense, tp=1, dp=64)).tp_overlap
    assert not V.row_layout(dataclasses.replace(dense, device="tpu-v5p")).tp_overlap
    assert not default_tp_overlap(dataclasses.replace(dense, ep=8))
    # the assumption is printed
    notes = row_setup(dense, workload_for).assumptions
    assert ("tp_overlap 1 (not published: Megatron-Bridge's TP communication overlap, on in "
            "NVIDIA's dense recipes)") in notes
