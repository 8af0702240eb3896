"""What the decision engine knows about the hardware and the workload: the predictor's inputs.

This module names them for the rest of PEARL; each lives in its own module:

* ``hardware.HardwareProfile``: the cost surface of one worker (prefill, decode step, KV transfer);
* ``workload.WorkloadProfile``: per-turn statistics of a rollout batch and the views each mode reads;
* ``telemetry.TelemetryRecord``: one served request as measured; ``telemetry.IterationRecord``: one
  engine iteration (or span of iterations at one batch); ``telemetry.Rejections``: what was screened out;
* ``fitting.fit_hardware`` / ``fitting.fit_workload``: the profiles refitted from a telemetry window
  (the decode step from iteration records: ``iteration_fit``).

The makespan models that read them: ``colocated``, ``disaggregated`` (with ``queueing``), over the
turn groups of ``stages``; the decision: ``decision``. The model as a whole: ``docs/predictor.md``.
"""

from __future__ import annotations

from pearl.core.fitting import first_window_alpha, fit_hardware, fit_workload
from pearl.core.hardware import HardwareProfile, ProfileError
from pearl.core.telemetry import IterationRecord, Mode, Rejection, Rejections, TelemetryRecord
from pearl.core.workload import TAIL_PATHS, TAIL_WINDOWS, LoadBucket, PathTurn, TailPath, TailPaths, WorkloadProfile

__all__ = [
    "TAIL_PATHS",
    "TAIL_WINDOWS",
    "HardwareProfile",
    "IterationRecord",
    "LoadBucket",
    "Mode",
    "PathTurn",
    "ProfileError",
    "Rejection",
    "Rejections",
    "TailPath",
    "TailPaths",
    "TelemetryRecord",
    "WorkloadProfile",
    "first_window_alpha",
    "fit_hardware",
    "fit_workload",
]
