"""The evaluated systems as policies over the one runtime (paper Sec. 6.1).

Every system runs the same Pipeline Scheduler, Elastic Scheduler, Rebuilder and Toggle Manager; a
system is only (a) which elastic events it is told about and (b) ``PolicySpec`` knobs::

    system      rollout pool                     preemptible  borrow training GPUs  PD mode       gates
    roll        reserved GPUs, fixed             no           no                    colocated     -
    roll-large  a fixed pool of N GPUs           no           no                    colocated     -
                (N = 14 / 10 / 12 in the paper: reserved + the segment's mean preemptible)
    rlboost+    reserved + every grant at once   yes          yes, ungated          colocated     off
    pearl       reserved + gated expansion       yes          yes, gated            adaptive      on
    oracle      PEARL that knows the whole trace and the measured makespan of every candidate
                allocation, with a per-interval plan (``pearl/sim/oracle.py``), paying every
                transition cost through the same runtime. Its hindsight replaces PEARL's gates
                (``gate_enabled`` off): grants that cannot pay back their expansion are dropped
                from its events, and it borrows every idle training window (measured: a borrowed
                budget's best makespan is always below the base budget's, and ungated borrowing
                was never slower than gated in the replays, e.g. RLBoost+ vs pearl-coloc)

Ablation variants (Fig. 7, fixed pool of ``N`` GPUs, no preemptible GPUs)::

    roll            colocated, no borrowing
    +pd             PD disaggregation forced (the decision engine picks the ratio)
    +pd+toggle      + borrowing idle training GPUs, ungated
    +pd+toggle+gate + the benefit gate   (= PEARL on a fixed pool)

Public names: ``SystemSpec``, ``SYSTEMS``, ``system``, ``parse_systems``, ``ABLATION``,
``apply_system``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pearl.config import RunConfig


class UnknownSystemError(ValueError):
    """Unknown system name (the message lists the known ones)."""


@dataclass(frozen=True)
class SystemSpec:
    name: str
    description: str
    use_preemptible: bool
    borrow_enabled: bool
    allow_disaggregation: bool
    gate_enabled: bool
    force_disaggregation: bool = False
    fixed_pool: int | None = None  # roll-large: total rollout GPUs (reserved zone), no preemptible
    oracle: bool = False
    policy_extra: dict[str, Any] = field(default_factory=dict)


SYSTEMS: dict[str, SystemSpec] = {
    s.name: s
    for s in (
        SystemSpec("roll", "ROLL: fixed reserved pool, colocated, no elasticity", False, False, False, False),
        SystemSpec("roll-large", "ROLL-Large: a larger fixed pool (reserved + mean preemptible)", False, False,
                   False, False, fixed_pool=-1),
        SystemSpec("rlboost+", "RLBoost+: every preemptible GPU as it comes, ungated borrowing, colocated",
                   True, True, False, False),
        SystemSpec("pearl", "PEARL: gated elasticity + borrowing + adaptive PD", True, True, True, True),
        SystemSpec("pearl-coloc", "PEARL without PD disaggregation (ablation: gates only)", True, True, False, True),
        SystemSpec("pearl-nogate", "PEARL without the gates (ablation: adaptive PD, ungated)", True, True, True,
                   False),
        SystemSpec("oracle", "hindsight oracle: whole trace + measured allocations, planned per interval",
                   True, True, True, False, oracle=True),
    )
}

#: Fig. 7 ladder on a fixed pool: name -> (force_disaggregation, borrow, gate)
ABLATION: dict[str, SystemSpec] = {
    s.name: s
    for s in (
        SystemSpec("roll", "ROLL", False, False, False, False),
        SystemSpec("+pd", "+ PD disaggregation", False, False, True, False, force_disaggregation=True),
        SystemSpec("+pd+toggle", "+ ungated toggle", False, True, True, False, force_disaggregation=True),
        SystemSpec("+pd+toggle+gate", "+ gate", False, True, True, True, force_disaggregation=True),
    )
}


def system(name: str) -> SystemSpec:
    try:
        return SYSTEMS[name]
    except KeyError:
        raise UnknownSystemError(f"unknown system {name!r}; known: {', '.join(SYSTEMS)}") from None


def parse_systems(text: str) -> list[SystemSpec]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise UnknownSystemError(f"no system named in {text!r}; known: {', '.join(SYSTEMS)}")
    return [system(n) for n in names]


def apply_system(cfg: RunConfig, spec: SystemSpec, fixed_pool: int | None = None,
                 allocation_overrides: dict[int, str] | None = None) -> RunConfig:
    """The run config this system runs under: its policy knobs and, for fixed pools, the cluster.

    A fixed pool of ``n`` GPUs is ``n`` reserved GPUs and no preemptible ones (``roll-large``;
    ``fixed_pool`` must then be given, e.g. reserved + the segment's mean preemptible GPUs).
    """
    policy = cfg.policy.model_copy(update={
        "use_preemptible": spec.use_preemptible,
        "borrow_enabled": spec.borrow_enabled,
        "allow_disaggregation": spec.allow_disaggregation,
        "gate_enabled": spec.gate_enabled,
        "force_disaggregation": spec.force_disaggregation,
        "allocation_overrides": dict(allocation_overrides or {}),
        **spec.policy_extra,
    })
    update: dict[str, Any] = {"policy": policy}
    if spec.fixed_pool is not None:
        n = fixed_pool if fixed_pool is not None else spec.fixed_pool
        if n is None or n < 1:
            raise UnknownSystemError(f"system {spec.name!r} needs a fixed pool size >= 1, got {n}")
        update["cluster"] = cfg.cluster.model_copy(update={"reserved_gpus": n, "max_preemptible_gpus": 0})
    return cfg.model_copy(update=update)
