"""Invariants PEARL must keep under any fault; checked by the chaos runner after every event.

Each check reads the running system (controller, chaos engine, delivered batches) without
changing it and appends a ``Violation`` naming the invariant and what broke:

==========================  =======================================================================
invariant                   check
==========================  =======================================================================
``trajectory_lost``         every rollout batch handed to the trainer holds ``batch_size`` completed
                            trajectories (the pipeline drops failed ones: a failure is a loss); at
                            the end of the quiet phase no trajectory is stuck
``trajectory_duplicated``   no trajectory id is delivered to the trainer twice
``token_generated_twice``   every response token at absolute position ``q`` of trajectory ``c`` is
                            the token the engine generates there (``EmulatedEngine.token_at``: the
                            emulator's tokens are a function of conversation and position), so a
                            token generated twice (a continuation that did not start after the
                            kept prefix) shifts every later position and is caught exactly
``partial_output_dropped``  every attempt of a turn starts with the prompt plus *all* tokens the
                            runtime already received for that turn (a partial output returned by
                            an abort or carried by ``EngineDeadError`` is never thrown away)
``gpu_double_bound``        no GPU is bound to two workers in the state table, nor held by two live
                            engine servers
``partial_expansion``       every dispatchable worker is ``active`` in the state; no member of an
                            expansion group that is preparing, failed or cancelled is dispatchable
``borrow_not_returned``     when ``TrainingStarted`` is acknowledged, no overlap GPU is lent and no
                            overlap worker is active or draining
``predictor_bad_time``      every telemetry record reaching the Runtime Tracker, and every EMA cost,
                            is finite and non-negative
``event_applied_twice``     a repeated admin event id is answered ``duplicate`` and changes nothing
``unexpected_error``        an admin event raised something other than the documented errors
==========================  =======================================================================
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

from pearl.core.profile import TelemetryRecord
from pearl.core.state import WorkerStatus, Zone
from pearl.core.trajectory import TrajectoryRecord, TrajectoryStatus
from pearl.reliability.faults import ChaosEngine
from pearl.runtime.rebuilder import GroupStatus


@dataclass(frozen=True, slots=True)
class Violation:
    invariant: str
    t: float
    detail: str

    def to_dict(self) -> dict[str, object]:
        return {"invariant": self.invariant, "t": round(self.t, 3), "detail": self.detail}


class InvariantChecker:
    """Collects violations; ``ctrl`` is a ``pearl.runtime.controller.Controller``."""

    def __init__(self, ctrl: Any, engine: ChaosEngine, batch_size: int,
                 token_at: Callable[[str, int], int] | None = None) -> None:
        self.ctrl = ctrl
        self.engine = engine
        self.batch_size = batch_size
        self.token_at = token_at
        self.violations: list[Violation] = []
        self.delivered: set[str] = set()
        self.checks = 0
        self.telemetry_records = 0
        self.trajectories_checked = 0

    def violation(self, invariant: str, detail: str) -> None:
        self.violations.append(Violation(invariant, self.ctrl.clock.now(), detail))

    # ------------------------------------------------------------------ the whole system, now
    def check(self, where: str) -> None:
        self.checks += 1
        self._gpu_binding(where)
        self._no_partial_expansion(where)
        self._costs(where)

    def _gpu_binding(self, where: str) -> None:
        state = self.ctrl.executor.state
        owner: dict[str, str] = {}
        for w in state.workers.values():
            for g in w.gpus:
                if g in owner:
                    self.violation("gpu_double_bound", f"{where}: GPU {g} bound to {owner[g]} and {w.worker_id}")
                owner[g] = w.worker_id
        held: dict[str, str] = {}
        for wid, devs in self.engine.devices.items():
            for d in devs:
                if d in held:
                    self.violation("gpu_double_bound", f"{where}: device {d} held by live servers {held[d]} and {wid}")
                held[d] = wid
        while self.engine.device_conflicts:
            self.violation("gpu_double_bound", f"{where}: {self.engine.device_conflicts.pop()}")

    def _no_partial_expansion(self, where: str) -> None:
        state = self.ctrl.executor.state
        dispatchable = set(self.ctrl.pipeline.router.workers)
        for wid in dispatchable:
            w = state.workers.get(wid)
            if w is None or w.status is not WorkerStatus.ACTIVE:
                status = "absent" if w is None else w.status.value
                self.violation("partial_expansion", f"{where}: worker {wid} is dispatchable but {status} in the state")
        latest: dict[str, str] = {}  # worker id -> the latest group that prepared it (ids can recur)
        for grp in self.ctrl.rebuilder.groups.values():
            for m in grp.members:
                latest[m] = grp.group_id
        for grp in self.ctrl.rebuilder.groups.values():
            if grp.status in (GroupStatus.PREPARING, GroupStatus.READY, GroupStatus.FAILED, GroupStatus.CANCELLED):
                visible = sorted(m for m in set(grp.members) & dispatchable if latest[m] == grp.group_id)
                if visible:
                    self.violation("partial_expansion",
                            f"{where}: group {grp.group_id} is {grp.status.value} but {visible} are dispatchable")

    def _costs(self, where: str) -> None:
        costs = self.ctrl.elastic.costs
        for f in fields(costs):
            v = getattr(costs, f.name)
            if isinstance(v, float) and f.name != "alpha" and not (math.isfinite(v) and v >= 0):
                self.violation("predictor_bad_time", f"{where}: cost model {f.name}={v}")

    # ------------------------------------------------------------------ hooks
    def telemetry(self, rec: TelemetryRecord) -> None:
        """Called for every record the Runtime Tracker receives."""
        self.telemetry_records += 1
        for name in ("queue_s", "prefill_s", "transfer_s", "decode_s", "env_s", "decode_concurrency"):
            v = getattr(rec, name)
            if not (math.isfinite(v) and v >= 0):
                self.violation("predictor_bad_time", f"telemetry {rec.traj_id} turn {rec.turn}: {name}={v}")

    def borrowed_returned(self, step: int) -> None:
        """Called when ``TrainingStarted(step)`` has been acknowledged."""
        state = self.ctrl.executor.state
        lent = sorted(g for g, gpu in state.gpus.items() if gpu.zone is Zone.OVERLAP and gpu.lent)
        busy = sorted(w.worker_id for w in state.workers.values()
                      if state.zone_of(w) is Zone.OVERLAP and w.status in (WorkerStatus.ACTIVE, WorkerStatus.DRAINING))
        if lent or busy:
            self.violation("borrow_not_returned", f"training step {step} started with lent GPUs {lent}, serving {busy}")
        overlap_dispatchable = sorted(w for w in self.ctrl.pipeline.router.workers
                                      if w in state.workers and state.zone_of(state.workers[w]) is Zone.OVERLAP)
        if overlap_dispatchable:
            self.violation("borrow_not_returned", f"training step {step} started; {overlap_dispatchable} still dispatchable")

    def batch(self, records: Sequence[TrajectoryRecord]) -> None:
        """Called for every batch the trainer takes."""
        if len(records) != self.batch_size:
            self.violation("trajectory_lost", f"batch of {len(records)} trajectories, expected {self.batch_size}")
        for r in records:
            if r.traj_id in self.delivered:
                self.violation("trajectory_duplicated", f"{r.traj_id} delivered to the trainer twice")
            self.delivered.add(r.traj_id)
            if r.status is not TrajectoryStatus.COMPLETED:
                self.violation("trajectory_lost", f"{r.traj_id} delivered with status {r.status.value}")
            self.trajectory(r)

    def trajectory(self, r: TrajectoryRecord) -> None:
        self.trajectories_checked += 1
        q = 0
        for s in r.segments:
            if s.trained and self.token_at is not None:
                for i, tok in enumerate(s.token_ids):
                    exp = self.token_at(r.traj_id, q + i)
                    if tok != exp:
                        self.violation("token_generated_twice",
                                f"{r.traj_id} turn {s.turn}: token at position {q + i} is {tok}, the engine "
                                f"generates {exp} there (a prefix was generated twice or skipped)")
                        break
            q += len(s.token_ids)
        turns = {s.turn for s in r.segments if s.trained}
        for turn in turns:
            self._attempts(r, turn)

    def _attempts(self, r: TrajectoryRecord, turn: int) -> None:
        atts = self.engine.attempts.get((r.traj_id, turn), [])
        if not atts:
            return
        base = atts[0].input_len
        got = 0
        for a in atts:
            if a.input_len != base + got:
                self.violation("partial_output_dropped",
                        f"{a.rid}: attempt starts at {a.input_len} tokens, expected prompt {base} + {got} "
                        "tokens already received")
                return
            if a.returned_tokens:
                got += len(a.output_ids)
        kept = sum(len(s.token_ids) for s in r.segments if s.trained and s.turn == turn)
        if kept != got:
            self.violation("partial_output_dropped",
                    f"{r.traj_id} turn {turn}: the engine returned {got} tokens, the trajectory kept {kept}")

    def to_dict(self, limit: int = 5) -> dict[str, object]:
        by: dict[str, int] = {}
        for v in self.violations:
            by[v.invariant] = by.get(v.invariant, 0) + 1
        return {"count": len(self.violations), "by_invariant": by,
                "first": [v.to_dict() for v in self.violations[:limit]]}
