"""Minimal-change transition plans (paper Sec. 4.4.2).

``plan(state, target, rollout_gpus, tp_size)`` turns a target allocation into the smallest set of
worker changes that realises it on the current GPU-worker-role state. Both executors (the
Inter-Scale Cluster Rebuilder and the Intra-Scale Toggle Manager) and every engine consume the same
``Plan`` format.

Slots. ``rollout_gpus`` are the GPUs rollout may use after the change. A worker is a *slot* if all
its GPUs are in the set; free GPUs in the set are grouped (per node, ``tp_size`` at a time, in id
order) into new-worker slots. Workers with a GPU outside the set leave: ``REMOVE`` (reserved /
preemptible: the process goes) or ``DEACTIVATE`` (overlap: the process is retained, paper Sec. 4.6).

Cost of each slot (one unit per worker change):

==================  =========================  =============================
slot                used with role r            not used
==================  =========================  =============================
live worker, role q  0 if q = r, else 1         1 (REMOVE / DEACTIVATE)
                     (CHANGE_ROLE)
parked               1 (ACTIVATE) + [q != r]    0
new GPUs             1 (ADD)                    0
==================  =========================  =============================

("live" = active or initializing; "parked" = inactive or draining: a draining worker is already
leaving, so using it again costs an ACTIVATE, and leaving it alone lets it finish draining.) Minimisation, per role r with target count t_r:

1. keep live workers in their role: ``k_r = min(t_r, live_r)`` (each saves one change);
2. leftover live workers fill remaining deficits at no extra cost (using one in another role costs
   1, leaving it unused also costs 1) — first the deficits that parked workers of the same role
   cannot cover;
3. then parked workers of the same role (cost 1), then new GPUs (cost 1), then parked workers of
   another role (cost 2);
4. everything left over is not used.

The property test (``tests/core/test_planner.py``) checks this greedy against brute force over all
assignments on small clusters.

Steps are ordered: REMOVE, DEACTIVATE (urgent: free GPUs first), CHANGE_ROLE, ACTIVATE, ADD.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from pearl.core.decision import Allocation, Mode
from pearl.core.state import ClusterState, Role, StateError, Worker, WorkerStatus, Zone


class PlanError(ValueError):
    """The target cannot be reached; the message names the shortfall."""


class StepKind(StrEnum):
    REMOVE = "remove"
    DEACTIVATE = "deactivate"
    CHANGE_ROLE = "change_role"
    ACTIVATE = "activate"
    ADD = "add"


_ORDER = {StepKind.REMOVE: 0, StepKind.DEACTIVATE: 1, StepKind.CHANGE_ROLE: 2, StepKind.ACTIVATE: 3, StepKind.ADD: 4}
_LIVE = (WorkerStatus.ACTIVE, WorkerStatus.INITIALIZING)


@dataclass(frozen=True, slots=True)
class PlanStep:
    kind: StepKind
    worker_id: str
    gpus: tuple[str, ...]
    role: Role
    prev_role: Role | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind.value,
            "worker_id": self.worker_id,
            "gpus": list(self.gpus),
            "role": self.role.value,
            "prev_role": None if self.prev_role is None else self.prev_role.value,
        }


@dataclass(frozen=True, slots=True)
class Plan:
    steps: tuple[PlanStep, ...]
    target: Allocation
    base_version: int = 0

    @property
    def n_changes(self) -> int:
        """Worker changes: every step counts one (an activation with a new role counts two)."""
        return len(self.steps)

    @property
    def empty(self) -> bool:
        return not self.steps

    def of_kind(self, *kinds: StepKind) -> tuple[PlanStep, ...]:
        return tuple(s for s in self.steps if s.kind in kinds)

    def to_dict(self) -> dict[str, object]:
        counts: dict[str, int] = defaultdict(int)
        for s in self.steps:
            counts[s.kind.value] += 1
        return {
            "target": self.target.to_dict(),
            "n_changes": self.n_changes,
            "counts": dict(counts),
            "base_version": self.base_version,
            "steps": [s.to_dict() for s in self.steps],
        }


def target_roles(target: Allocation) -> dict[Role, int]:
    if target.mode is Mode.COLOCATED:
        return {Role.COLOCATED: target.n_colocated, Role.PREFILL: 0, Role.DECODE: 0}
    return {Role.COLOCATED: 0, Role.PREFILL: target.n_prefill, Role.DECODE: target.n_decode}


def new_worker_id(gpus: tuple[str, ...], version: int) -> str:
    return f"w-{gpus[0]}-{version}"


def free_groups(state: ClusterState, rollout_gpus: Iterable[str], tp_size: int) -> list[tuple[str, ...]]:
    """Unbound GPUs of ``rollout_gpus`` grouped per node (and zone) into ``tp_size`` groups, id order."""
    by_node: dict[tuple[str, Zone], list[str]] = defaultdict(list)
    for g in sorted(set(rollout_gpus)):
        if state.owner_of(g) is None:
            gpu = state.gpu(g)
            by_node[(gpu.node, gpu.zone)].append(g)
    groups: list[tuple[str, ...]] = []
    for key in sorted(by_node):
        ids = by_node[key]
        for i in range(0, len(ids) - tp_size + 1, tp_size):
            groups.append(tuple(ids[i : i + tp_size]))
    return groups


def plan(state: ClusterState, target: Allocation, rollout_gpus: Iterable[str], tp_size: int = 1) -> Plan:
    """The minimal-change plan from ``state`` to ``target`` using only ``rollout_gpus``."""
    if tp_size < 1:
        raise PlanError(f"tp_size={tp_size}: must be >= 1")
    pool = frozenset(rollout_gpus)
    unknown = sorted(g for g in pool if g not in state.gpus)
    if unknown:
        raise PlanError(f"rollout GPUs not in the cluster state: {unknown[:5]}")
    steps: list[PlanStep] = []
    live: dict[Role, list[Worker]] = defaultdict(list)
    parked: dict[Role, list[Worker]] = defaultdict(list)
    for w in sorted(state.workers.values(), key=lambda w: w.worker_id):
        inside = all(g in pool for g in w.gpus)
        if not inside:
            if w.status in _LIVE:
                zone = state.zone_of(w)
                kind = StepKind.DEACTIVATE if zone is Zone.OVERLAP else StepKind.REMOVE
                steps.append(PlanStep(kind, w.worker_id, w.gpus, w.role))
            elif state.zone_of(w) is not Zone.OVERLAP:
                steps.append(PlanStep(StepKind.REMOVE, w.worker_id, w.gpus, w.role))
            continue
        (live if w.status in _LIVE else parked)[w.role].append(w)
    new_slots = free_groups(state, pool, tp_size)
    want = target_roles(target)
    n_slots = sum(len(v) for v in live.values()) + sum(len(v) for v in parked.values()) + len(new_slots)
    if target.n_workers > n_slots:
        raise PlanError(
            f"target {target.label} needs {target.n_workers} workers but only {n_slots} fit on the "
            f"{len(pool)} rollout GPUs (tp_size={tp_size})"
        )
    roles = [Role.COLOCATED, Role.PREFILL, Role.DECODE]
    # 1. live workers keep their role up to the target count
    deficit = {r: want[r] for r in roles}
    leftover_live: list[Worker] = []
    for r in roles:
        keep = live[r][: deficit[r]]
        deficit[r] -= len(keep)
        leftover_live.extend(live[r][len(keep) :])
    # 2. leftover live workers fill deficits parked same-role workers cannot cover, then the rest
    uncovered = {r: max(0, deficit[r] - len(parked[r])) for r in roles}
    leftover_live.sort(key=lambda w: w.worker_id)
    for pass_uncovered in (True, False):
        for r in roles:
            while leftover_live and deficit[r] > 0 and (uncovered[r] > 0 or not pass_uncovered):
                w = leftover_live.pop(0)
                steps.append(PlanStep(StepKind.CHANGE_ROLE, w.worker_id, w.gpus, r, w.role))
                deficit[r] -= 1
                uncovered[r] = max(0, uncovered[r] - 1)
    for w in leftover_live:
        zone = state.zone_of(w)
        kind = StepKind.DEACTIVATE if zone is Zone.OVERLAP else StepKind.REMOVE
        steps.append(PlanStep(kind, w.worker_id, w.gpus, w.role))
    # 3. parked same role, then new GPUs, then parked other role
    parked_left: list[Worker] = []
    for r in roles:
        use = parked[r][: deficit[r]]
        for w in use:
            steps.append(PlanStep(StepKind.ACTIVATE, w.worker_id, w.gpus, r))
        deficit[r] -= len(use)
        parked_left.extend(parked[r][len(use) :])
    for r in roles:
        while deficit[r] > 0 and new_slots:
            g = new_slots.pop(0)
            steps.append(PlanStep(StepKind.ADD, new_worker_id(g, state.version), g, r))
            deficit[r] -= 1
    parked_left.sort(key=lambda w: w.worker_id)
    for r in roles:
        while deficit[r] > 0 and parked_left:
            w = parked_left.pop(0)
            steps.append(PlanStep(StepKind.ACTIVATE, w.worker_id, w.gpus, r))
            steps.append(PlanStep(StepKind.CHANGE_ROLE, w.worker_id, w.gpus, r, w.role))
            deficit[r] -= 1
    if any(deficit.values()):  # unreachable given the slot count check; kept as a guard
        raise PlanError(f"could not fill roles {({r.value: d for r, d in deficit.items() if d})}")
    steps.sort(key=lambda s: (_ORDER[s.kind], s.worker_id))
    return Plan(tuple(steps), target, state.version)


def apply_plan(state: ClusterState, p: Plan) -> ClusterState:
    """The table after ``p`` has been executed (ADDed workers are ``initializing``; deactivated are
    ``inactive``; activated and role-changed workers ``active``). Raises PlanError if ``p`` was
    made against another state version or no longer fits it."""
    if p.base_version != state.version:
        raise PlanError(f"plan was made for state version {p.base_version}, state is at {state.version}")
    workers = dict(state.workers)
    try:
        for s in p.steps:
            if s.kind is StepKind.REMOVE:
                workers.pop(s.worker_id)
            elif s.kind is StepKind.DEACTIVATE:
                workers[s.worker_id] = _with(workers[s.worker_id], status=WorkerStatus.INACTIVE)
            elif s.kind is StepKind.ACTIVATE:
                workers[s.worker_id] = _with(workers[s.worker_id], status=WorkerStatus.ACTIVE)
            elif s.kind is StepKind.CHANGE_ROLE:
                workers[s.worker_id] = _with(workers[s.worker_id], role=s.role)
            elif s.kind is StepKind.ADD:
                workers[s.worker_id] = Worker(s.worker_id, s.gpus, s.role, WorkerStatus.INITIALIZING)
        return ClusterState.build(state.gpus.values(), workers.values(), state.version + 1)
    except (KeyError, StateError) as e:
        raise PlanError(f"plan does not apply to state version {state.version}: {e}") from None


def _with(w: Worker, *, status: WorkerStatus | None = None, role: Role | None = None) -> Worker:
    return Worker(w.worker_id, w.gpus, role if role is not None else w.role, status if status is not None else w.status)
