"""Prometheus metrics of the admin API and the controller it fronts (``GET /metrics``).

One ``CollectorRegistry`` per app (no process-global registry: two apps in one process, as in the
tests, must not collide). Two kinds of series:

- request metrics the app updates as it serves: ``pearl_admin_requests_total{route,method,status}``,
  ``pearl_admin_request_seconds{route}`` (histogram), ``pearl_admin_events_total{kind,result}``
  with result in applied|duplicate|rejected;
- controller gauges read from the ``ControlPlane`` at scrape time (a custom collector, so a scrape
  always shows the current table): GPUs per zone, workers per role and status (every pair, 0
  included), rollout progress in base units (``pearl_throughput_trajectories_per_second``). The
  train step and weight version come from the controller, which a restart resumes at the
  journaled version (``pearl.serve.build_controller``), so they do not fall back to 0.
"""

from __future__ import annotations

import math
from collections import Counter as _Count
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from pearl.core.state import Role, WorkerStatus
from pearl.runtime.control import ControlPlane

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class ControlPlaneCollector(Collector):
    """Reads the table and progress at scrape time."""

    def __init__(self, control: ControlPlane) -> None:
        self._control = control

    def collect(self) -> Iterator[Any]:
        state = self._control.state_dict()
        gpus = GaugeMetricFamily("pearl_gpus", "rollout-capable GPUs by zone", labels=["zone"])
        zones = _Count(str(g.get("zone")) for g in state.get("gpus", []))
        for zone in ("reserved", "preemptible", "overlap"):
            gpus.add_metric([zone], zones.get(zone, 0))
        yield gpus
        lent = GaugeMetricFamily("pearl_overlap_gpus_lent", "training GPUs lent to rollout")
        lent.add_metric([], sum(1 for g in state.get("gpus", []) if g.get("lent")))
        yield lent
        workers = GaugeMetricFamily("pearl_workers", "workers by role and status", labels=["role", "status"])
        per = _Count((str(w.get("role")), str(w.get("status"))) for w in state.get("workers", []))
        # every (role, status) pair is exported, 0 included: a series that vanishes at 0 reads as
        # "no data" in an alert, not as "no worker"
        for key in sorted(set(per) | {(r.value, st.value) for r in Role for st in WorkerStatus}):
            workers.add_metric(list(key), per.get(key, 0))
        yield workers
        version = GaugeMetricFamily("pearl_state_version", "GPU-worker-role table version")
        version.add_metric([], float(state.get("version", 0)))
        yield version

        p = self._control.progress()
        for name, doc, value in (
            ("pearl_rollout_step", "rollout steps completed", p.rollout_step),
            ("pearl_train_step", "training steps completed", p.train_step),
            ("pearl_weight_version", "latest weight version", p.weight_version),
            ("pearl_trajectories_in_flight", "trajectories being rolled out", p.trajectories_in_flight),
            ("pearl_throughput_trajectories_per_second", "completed trajectories per second (base unit)",
             p.throughput_traj_per_h / 3600.0),
            ("pearl_uptime_seconds", "controller uptime", p.uptime_s),
        ):
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], _finite(value))
            yield g
        for name, doc, value in (
            ("pearl_trajectories_completed", "trajectories completed", p.trajectories_completed),
            ("pearl_trajectories_interrupted", "trajectory interruptions (resumed elsewhere)", p.trajectories_interrupted),
            ("pearl_trajectories_lost", "trajectories lost", p.trajectories_lost),
            ("pearl_tokens_generated", "tokens generated", p.tokens_generated),
        ):
            c = CounterMetricFamily(name, doc)
            c.add_metric([], _finite(value))
            yield c


class AdminMetrics:
    """The registry of one admin app."""

    def __init__(self, control: ControlPlane) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter(
            "pearl_admin_requests",
            "admin API requests",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "pearl_admin_request_seconds",
            "admin API request latency",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.events = Counter(
            "pearl_admin_events", "elastic events received", ["kind", "result"], registry=self.registry
        )
        self.registry.register(ControlPlaneCollector(control))

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _finite(x: float) -> float:
    return float(x) if math.isfinite(float(x)) else 0.0
