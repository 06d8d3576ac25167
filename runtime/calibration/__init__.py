"""Calibration of this machine's JAX devices: time real fragments, links and collectives, fit a
device profile to them and write it (with the cluster of local meshes) as YAML.

``measure.py`` (the timings and ``mpmd calibrate``), ``fit.py`` (the roofline and additive
fragment models and their fits), ``files.py`` (the profile and cluster YAML).
"""

from runtime.calibration.files import (CLUSTER_FILE, DEFAULT_OUT, DEVICE_FILE, cluster_yaml,
                                       device_yaml, profile_paths, write_profiles)
from runtime.calibration.fit import (Calibration, CalibrationError, FragmentTiming, HostInfo,
                                     fit_calibration, model_seconds, read_host)
from runtime.calibration.measure import calibrate, calibrate_command, print_calibration

__all__ = ["CLUSTER_FILE", "DEFAULT_OUT", "DEVICE_FILE", "Calibration", "CalibrationError",
           "FragmentTiming", "HostInfo", "calibrate", "calibrate_command", "cluster_yaml",
           "device_yaml", "fit_calibration", "model_seconds", "print_calibration", "profile_paths",
           "read_host", "write_profiles"]
