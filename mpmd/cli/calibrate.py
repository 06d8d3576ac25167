"""``mpmd calibrate``: time fragments on this machine's CPU devices and write the CPU device
profile (and a cluster of it) that ``mpmd run``'s runs are simulated with."""

from __future__ import annotations

import click

from ir.files import check_output
from mpmd.cli.common import console, guard
from mpmd.cli.run import cpu_devices


@click.command()
@click.option("--out", default="calibrated", show_default=True,
              type=click.Path(),
              help="Folder for cpu-host.yaml and cpu4x2.yaml (the cluster names its device "
                   "'cpu-host.yaml', beside it).")
@click.option("--repeats", type=click.IntRange(min=1, max=1000), default=5, show_default=True,
              help="Timed runs per measurement (the median is kept).")
@click.option("--device-out", type=click.Path(), default=None,
              help="Write the device profile here instead of OUT/cpu-host.yaml.")
@click.option("--cluster-out", type=click.Path(), default=None,
              help="Write the cluster here instead of OUT/cpu4x2.yaml (it names the device "
                   "by its path relative to this file).")
@guard
def calibrate(out: str, repeats: int, device_out: str | None, cluster_out: str | None) -> None:
    """Time fragments on this machine's CPU devices; write OUT/cpu-host.yaml and OUT/cpu4x2.yaml.

    Then plan on the calibrated cluster: mpmd plan ... --cluster OUT/cpu4x2.yaml."""
    # the outputs before JAX loads (the files inside OUT are checked again before measuring)
    if not (device_out and cluster_out):
        check_output(out, "calibrated profiles", folder=True)
    for path, what in ((device_out, "device profile"), (cluster_out, "cluster file")):
        if path:
            check_output(path, what)
    cpu_devices(8)
    from runtime.calibration.measure import calibrate_command

    calibrate_command(out, device_out=device_out, cluster_out=cluster_out, repeats=repeats,
                      console=console)
