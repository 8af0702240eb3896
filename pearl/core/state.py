"""The unified GPU-worker-role state (paper Sec. 4.4.1).

One frozen value records every rollout-capable GPU, every worker with its *fixed* GPU binding, its
role and its activity status. Every component (decision engine, planner, rebuilder, toggle manager,
admin API) reads the same value; every change produces a new value through one of the methods
below, and every new value is checked against the invariants before it is returned.

Zones (where a GPU comes from):

- ``reserved``    dedicated rollout GPUs, always ours;
- ``preemptible`` spot / elastic GPUs that join and leave (inter-scale elasticity);
- ``overlap``     training GPUs that rollout may borrow between updates (intra-scale elasticity).

Worker life cycle (one table, ``WORKER_TRANSITIONS``)::

    initializing --admit--> active --drain--> draining --drained--> inactive
         |                    ^                   |                     |
         |                    +----undrain--------+                     |
         |                    +----------------activate-----------------+
         +--park--> inactive                      (inactive: process kept, serves nothing)

Removal (``remove_worker``) is legal from every status: a reclaimed GPU takes its worker with it.

Invariants (checked on every change, ``StateError`` names what broke):

1. a GPU is bound to at most one worker;
2. a worker's GPUs exist in the table and lie in one zone and on one node;
3. an overlap worker is ``active`` or ``draining`` only while every one of its GPUs is lent to
   rollout by the trainer (``Gpu.lent``);
4. a worker's GPU binding never changes (a new binding is a new worker).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import MappingProxyType


class StateError(ValueError):
    """An illegal change to the GPU-worker-role state; the message names what and why."""


class Zone(StrEnum):
    RESERVED = "reserved"
    PREEMPTIBLE = "preemptible"
    OVERLAP = "overlap"


class Role(StrEnum):
    COLOCATED = "colocated"
    PREFILL = "prefill"
    DECODE = "decode"


class WorkerStatus(StrEnum):
    INITIALIZING = "initializing"
    ACTIVE = "active"
    DRAINING = "draining"
    INACTIVE = "inactive"


#: The one table of legal worker status transitions (``remove_worker`` is legal from any status).
WORKER_TRANSITIONS: Mapping[WorkerStatus, frozenset[WorkerStatus]] = MappingProxyType(
    {
        WorkerStatus.INITIALIZING: frozenset({WorkerStatus.ACTIVE, WorkerStatus.INACTIVE}),
        WorkerStatus.ACTIVE: frozenset({WorkerStatus.DRAINING}),
        WorkerStatus.DRAINING: frozenset({WorkerStatus.INACTIVE, WorkerStatus.ACTIVE}),
        WorkerStatus.INACTIVE: frozenset({WorkerStatus.ACTIVE, WorkerStatus.INITIALIZING}),
    }
)

#: Statuses in which a worker may change role: it must not be serving.
ROLE_CHANGE_STATUSES = frozenset({WorkerStatus.INACTIVE, WorkerStatus.DRAINING, WorkerStatus.INITIALIZING})


def check_transition(old: WorkerStatus, new: WorkerStatus) -> None:
    """Raise ``StateError`` naming both states unless ``old -> new`` is in the table."""
    if new not in WORKER_TRANSITIONS[old]:
        allowed = ", ".join(sorted(s.value for s in WORKER_TRANSITIONS[old])) or "nothing"
        raise StateError(f"illegal worker transition {old.value} -> {new.value} (from {old.value}: {allowed})")


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU the rollout side may use.

    ``lent`` only matters in the overlap zone: True while the trainer has handed the GPU to rollout.
    ``instance_id`` is the cloud instance the GPU came with (maps cloud reclaim notices to GPUs).
    """

    gpu_id: str
    zone: Zone
    node: str = "node0"
    instance_id: str | None = None
    lent: bool = False


@dataclass(frozen=True, slots=True)
class Worker:
    """One inference server process, bound for life to ``gpus`` (several GPUs = tensor parallel)."""

    worker_id: str
    gpus: tuple[str, ...]
    role: Role
    status: WorkerStatus

    @property
    def serving(self) -> bool:
        return self.status is WorkerStatus.ACTIVE


@dataclass(frozen=True, slots=True)
class ClusterState:
    """Frozen GPU-worker-role table. Build with ``ClusterState.build``; change with the methods.

    ``gpus`` and ``workers`` are read-only mappings keyed by id. ``version`` counts changes, so a
    consumer can tell whether the value it planned against is still current.
    """

    gpus: Mapping[str, Gpu]
    workers: Mapping[str, Worker]
    version: int = 0
    _owner: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    # ---------------------------------------------------------------- construction
    @staticmethod
    def build(gpus: Iterable[Gpu] = (), workers: Iterable[Worker] = (), version: int = 0) -> ClusterState:
        gmap: dict[str, Gpu] = {}
        for g in gpus:
            if g.gpu_id in gmap:
                raise StateError(f"GPU {g.gpu_id!r} listed twice")
            gmap[g.gpu_id] = g
        wmap: dict[str, Worker] = {}
        for w in workers:
            if w.worker_id in wmap:
                raise StateError(f"worker {w.worker_id!r} listed twice")
            wmap[w.worker_id] = w
        return ClusterState._checked(gmap, wmap, version)

    @staticmethod
    def _checked(gmap: dict[str, Gpu], wmap: dict[str, Worker], version: int) -> ClusterState:
        owner: dict[str, str] = {}
        for w in wmap.values():
            if not w.gpus:
                raise StateError(f"worker {w.worker_id!r} is bound to no GPU")
            zones: set[Zone] = set()
            nodes: set[str] = set()
            for gid in w.gpus:
                g = gmap.get(gid)
                if g is None:
                    raise StateError(f"worker {w.worker_id!r} is bound to unknown GPU {gid!r}")
                if gid in owner:
                    raise StateError(f"GPU {gid!r} bound twice: to {owner[gid]!r} and {w.worker_id!r}")
                owner[gid] = w.worker_id
                zones.add(g.zone)
                nodes.add(g.node)
            if len(zones) > 1 or len(nodes) > 1:
                raise StateError(
                    f"worker {w.worker_id!r} spans zones {sorted(zones)} / nodes {sorted(nodes)}; "
                    "a worker's GPUs must share one zone and one node"
                )
            if (
                zones == {Zone.OVERLAP}
                and w.status in (WorkerStatus.ACTIVE, WorkerStatus.DRAINING)
                and not all(gmap[gid].lent for gid in w.gpus)
            ):
                raise StateError(
                    f"overlap worker {w.worker_id!r} is {w.status.value} but its GPUs are not all lent "
                    "by the trainer"
                )
        return ClusterState(MappingProxyType(gmap), MappingProxyType(wmap), version, MappingProxyType(owner))

    def _next(self, gmap: dict[str, Gpu], wmap: dict[str, Worker]) -> ClusterState:
        return ClusterState._checked(gmap, wmap, self.version + 1)

    # ---------------------------------------------------------------- queries
    def owner_of(self, gpu_id: str) -> str | None:
        """The worker bound to ``gpu_id``, or None."""
        return self._owner.get(gpu_id)

    def worker(self, worker_id: str) -> Worker:
        try:
            return self.workers[worker_id]
        except KeyError:
            raise StateError(f"unknown worker {worker_id!r}") from None

    def gpu(self, gpu_id: str) -> Gpu:
        try:
            return self.gpus[gpu_id]
        except KeyError:
            raise StateError(f"unknown GPU {gpu_id!r}") from None

    def zone_of(self, worker: Worker) -> Zone:
        return self.gpus[worker.gpus[0]].zone

    def free_gpus(self, zones: Iterable[Zone] | None = None) -> tuple[str, ...]:
        """GPUs bound to no worker (optionally only in ``zones``), in id order."""
        zs = set(zones) if zones is not None else None
        return tuple(
            sorted(g for g, gpu in self.gpus.items() if g not in self._owner and (zs is None or gpu.zone in zs))
        )

    def active_workers(self, role: Role | None = None) -> tuple[Worker, ...]:
        return tuple(
            w
            for w in sorted(self.workers.values(), key=lambda w: w.worker_id)
            if w.status is WorkerStatus.ACTIVE and (role is None or w.role is role)
        )

    def count(self, status: WorkerStatus, role: Role | None = None) -> int:
        return sum(1 for w in self.workers.values() if w.status is status and (role is None or w.role is role))

    def gpus_of_instance(self, instance_id: str) -> tuple[str, ...]:
        return tuple(sorted(g for g, gpu in self.gpus.items() if gpu.instance_id == instance_id))

    # ---------------------------------------------------------------- GPU membership
    def add_gpus(self, gpus: Iterable[Gpu]) -> ClusterState:
        gmap = dict(self.gpus)
        for g in gpus:
            if g.gpu_id in gmap:
                raise StateError(f"GPU {g.gpu_id!r} is already in the cluster (zone {gmap[g.gpu_id].zone.value})")
            gmap[g.gpu_id] = g
        return self._next(gmap, dict(self.workers))

    def remove_gpus(self, gpu_ids: Iterable[str]) -> ClusterState:
        """Remove GPUs; workers bound to any of them are removed with them (a reclaim is not optional)."""
        ids = set(gpu_ids)
        for gid in ids:
            self.gpu(gid)
        gmap = {g: gpu for g, gpu in self.gpus.items() if g not in ids}
        wmap = {w: wk for w, wk in self.workers.items() if not ids.intersection(wk.gpus)}
        return self._next(gmap, wmap)

    def set_lent(self, gpu_ids: Iterable[str], lent: bool) -> ClusterState:
        """Mark overlap GPUs as lent to rollout (True) or returned to training (False)."""
        gmap = dict(self.gpus)
        for gid in gpu_ids:
            g = self.gpu(gid)
            if g.zone is not Zone.OVERLAP:
                raise StateError(f"GPU {gid!r} is in zone {g.zone.value}; only overlap GPUs are lent")
            gmap[gid] = replace(g, lent=lent)
        return self._next(gmap, dict(self.workers))

    # ---------------------------------------------------------------- workers
    def add_worker(self, worker: Worker) -> ClusterState:
        if worker.worker_id in self.workers:
            raise StateError(f"worker {worker.worker_id!r} already exists")
        if worker.status not in (WorkerStatus.INITIALIZING, WorkerStatus.INACTIVE):
            raise StateError(
                f"new worker {worker.worker_id!r} must start initializing or inactive, not {worker.status.value}"
            )
        wmap = dict(self.workers)
        wmap[worker.worker_id] = worker
        return self._next(dict(self.gpus), wmap)

    def remove_worker(self, worker_id: str) -> ClusterState:
        self.worker(worker_id)
        wmap = {w: wk for w, wk in self.workers.items() if w != worker_id}
        return self._next(dict(self.gpus), wmap)

    def set_status(self, worker_id: str, status: WorkerStatus) -> ClusterState:
        w = self.worker(worker_id)
        if w.status is status:
            return self
        try:
            check_transition(w.status, status)
        except StateError as e:
            raise StateError(f"worker {worker_id!r}: {e}") from None
        wmap = dict(self.workers)
        wmap[worker_id] = replace(w, status=status)
        return self._next(dict(self.gpus), wmap)

    def set_role(self, worker_id: str, role: Role) -> ClusterState:
        w = self.worker(worker_id)
        if w.role is role:
            return self
        if w.status not in ROLE_CHANGE_STATUSES:
            raise StateError(
                f"worker {worker_id!r} is {w.status.value}; drain it before changing role "
                f"{w.role.value} -> {role.value}"
            )
        wmap = dict(self.workers)
        wmap[worker_id] = replace(w, role=role)
        return self._next(dict(self.gpus), wmap)

    # ---------------------------------------------------------------- serialization
    def to_dict(self) -> dict[str, object]:
        return {
            "version": self.version,
            "gpus": [
                {"gpu_id": g.gpu_id, "zone": g.zone.value, "node": g.node, "instance_id": g.instance_id, "lent": g.lent}
                for g in sorted(self.gpus.values(), key=lambda g: g.gpu_id)
            ],
            "workers": [
                {"worker_id": w.worker_id, "gpus": list(w.gpus), "role": w.role.value, "status": w.status.value}
                for w in sorted(self.workers.values(), key=lambda w: w.worker_id)
            ],
        }

    @staticmethod
    def from_dict(data: Mapping[str, object]) -> ClusterState:
        """Parse the ``to_dict`` shape; errors name the entry and field that was wrong."""
        if not isinstance(data, Mapping):
            raise StateError(f"cluster state must be a JSON object, got {type(data).__name__}")
        gpus_raw = data.get("gpus", [])
        workers_raw = data.get("workers", [])
        if not isinstance(gpus_raw, list) or not isinstance(workers_raw, list):
            raise StateError("cluster state needs lists 'gpus' and 'workers'")
        gpus: list[Gpu] = []
        for i, g in enumerate(gpus_raw):
            try:
                gpus.append(
                    Gpu(
                        gpu_id=str(g["gpu_id"]),
                        zone=Zone(g.get("zone", "reserved")),
                        node=str(g.get("node", "node0")),
                        instance_id=None if g.get("instance_id") is None else str(g["instance_id"]),
                        lent=bool(g.get("lent", False)),
                    )
                )
            except (KeyError, ValueError, TypeError, AttributeError) as e:
                raise StateError(f"gpus[{i}]: {e!r} (need gpu_id, zone in reserved|preemptible|overlap)") from None
        workers: list[Worker] = []
        for i, w in enumerate(workers_raw):
            try:
                workers.append(
                    Worker(
                        worker_id=str(w["worker_id"]),
                        gpus=tuple(str(x) for x in w["gpus"]),
                        role=Role(w.get("role", "colocated")),
                        status=WorkerStatus(w.get("status", "active")),
                    )
                )
            except (KeyError, ValueError, TypeError, AttributeError) as e:
                raise StateError(
                    f"workers[{i}]: {e!r} (need worker_id, gpus, role in colocated|prefill|decode, "
                    "status in initializing|active|draining|inactive)"
                ) from None
        version = data.get("version", 0)
        return ClusterState.build(gpus, workers, int(version) if isinstance(version, int) else 0)
