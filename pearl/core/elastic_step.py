"""One elastic step: what the Elastic Scheduler acts on, as pure functions of frozen data.

The scheduler (``pearl.runtime.elastic``) gathers a ``PoolOutlook`` (``pearl.core.outlook``) and
the ``ClusterState``, calls one function here and applies what it returns; nothing here reads a
clock or changes state.

Re-plan (``replan_step``). The rollout budget ``G`` is every GPU rollout may use now
(``rollout_budget``: GPUs of existing workers, free reserved GPUs, lent overlap GPUs; not
preemptible GPUs that are free: declined or still preparing), ``N = slots(G)`` the workers it
holds (live workers on it plus free TP groups). The target is decided once, in this order:

1. ``decision.decide(N, B, hw, wl, policy, current)``: the best allocation with hysteresis
   against the one in force (at a fresh start, against colocation: the engine's default mode);
2. ``override.apply_overrides``: ``allocation_overrides[N]``, then ``force_disaggregation``;
2b. ``outlook.hold_for_schedule``: a switch is weighed again over the pool changes known to come
   within the batch (a running training step's overlap GPUs coming back, a reclaim, an expansion;
   at a batch boundary the lent GPUs the step takes back), and the allocation in force (projected
   onto ``N``) is kept unless the switch still clears its threshold;
3. the plan for that target (``planner.plan``: minimal-change steps), whose re-roled serving
   workers ``k`` of the ``n`` serving on ``G`` are the switch's cost;
4. ``outlook.hold_switch`` with ``stalled_fraction = k / n``: a switch that cannot pay back
   before the budget is known to shrink keeps the allocation in force (projected onto ``N``),
   and the plan is made again for it.

Gates (``expansion_step``, ``borrow_step``) share one preamble (``gate_makespans``): the fresh
makespans ``M(n_now)`` and ``M(n_with)`` (``Decider.fresh_makespan``; an infinite ``M(n_now)``, no
worker now, is weighed as ``1e12`` s so any growth is a speedup), then the gate of
``pearl.core.gate`` with the measured cost EMAs of the outlook (``PoolOutlook.costs``, seeded from
the policy's priors: ``costs_from_policy``).

Expansion: the candidate GPU groups join a budget of ``n_now`` workers plus ``pending`` workers of
groups already preparing; the new workers' roles are the ADD steps of the plan for the target on
``N_with = n_now + pending + len(groups)`` (decided against the allocation in force); that plan's
REMOVE / DEACTIVATE / CHANGE_ROLE steps on serving workers are the stall the gate charges
(``k / n_now``). Borrow: the window is the trainer's ``expected_idle_s`` when given, else the
running batch's remaining time ``R`` (``outlook.remaining_s``).

What a re-plan changed is counted by ``switch_kind``: a mode switch, or a ratio switch (a split whose
prefill fraction is not the one in force; a budget change alone keeps it, ``decision.project``).

Public names: ``rollout_budget``, ``slots``, ``ReplanStep``, ``replan_step``, ``switch_kind``, ``gate_makespans``,
``ExpansionStep``, ``expansion_step``, ``BorrowStep``, ``borrow_step``, ``costs_from_policy``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence, Set
from dataclasses import dataclass
from typing import Protocol

from pearl.core.decision import Allocation, Decision, DecisionPolicy, project
from pearl.core.gate import CostModel, GateDecision, borrow_gate, expansion_gate
from pearl.core.outlook import PoolOutlook, ScheduleHold, SwitchHold, hold_for_schedule, hold_switch, remaining_s
from pearl.core.planner import Plan, PlanError, StepKind, free_groups, plan
from pearl.core.state import ClusterState, Role, WorkerStatus, Zone
from pearl.core.telemetry import Mode

#: EMA weight of an observed preemptible GPU lifetime (grant to reclaim notice) in ``T_life``
LIFETIME_EMA_ALPHA = 0.3
#: the makespan an empty pool is weighed at by the gates (any growth from nothing is a speedup)
NO_WORKERS_MAKESPAN_S = 1e12


class CostPriors(Protocol):
    """The policy fields that seed the cost EMAs (``PolicyConfig``)."""

    @property
    def initial_activation_s(self) -> float: ...
    @property
    def initial_deactivation_s(self) -> float: ...
    @property
    def initial_expansion_prep_s(self) -> float: ...
    @property
    def initial_expansion_final_s(self) -> float: ...
    @property
    def initial_weight_sync_s(self) -> float: ...
    @property
    def cost_ema_alpha(self) -> float: ...


def costs_from_policy(policy: CostPriors) -> CostModel:
    """The cost EMAs before any observation: the policy's priors, EMA weight ``cost_ema_alpha``."""
    return CostModel(activation_s=policy.initial_activation_s, deactivation_s=policy.initial_deactivation_s,
                     expansion_prep_s=policy.initial_expansion_prep_s,
                     expansion_final_s=policy.initial_expansion_final_s,
                     weight_sync_s=policy.initial_weight_sync_s, alpha=policy.cost_ema_alpha)


def rollout_budget(state: ClusterState) -> frozenset[str]:
    """``G``: GPUs rollout may use now (module docstring)."""
    out = set()
    for g, gpu in state.gpus.items():
        if gpu.zone is Zone.OVERLAP:
            if gpu.lent:
                out.add(g)
        elif state.owner_of(g) is not None or gpu.zone is Zone.RESERVED:
            out.add(g)
    return frozenset(out)


def slots(state: ClusterState, budget: frozenset[str], tp_size: int) -> int:
    """``N``: live workers entirely on ``budget`` plus its free groups of ``tp_size`` GPUs."""
    live = sum(1 for w in state.workers.values() if all(g in budget for g in w.gpus))
    return live + len(free_groups(state, budget, tp_size))


def active_steps(state: ClusterState, p: Plan, *kinds: StepKind) -> set[str]:
    """Workers serving now (ACTIVE) that ``p`` acts on with a step of one of ``kinds``."""
    return {s.worker_id for s in p.of_kind(*kinds)
            if s.worker_id in state.workers and state.workers[s.worker_id].status is WorkerStatus.ACTIVE}


@dataclass(frozen=True, slots=True)
class ReplanStep:
    """``replan_step``'s answer: the ``decision`` to act on, its ``plan``, the switch gate's answer
    (``switch.decision is decision``), the ``wish``: the decision before the holds (steps 1-2), and
    the ``schedule`` hold's answer (step 2b)."""

    decision: Decision
    plan: Plan
    switch: SwitchHold
    wish: Decision
    schedule: ScheduleHold


def replan_step(o: PoolOutlook, state: ClusterState, budget: frozenset[str], tp_size: int,
                batch_boundary: bool) -> ReplanStep:
    """Decide, override, hold over the batch's pool schedule, plan and hold on ``budget`` (module
    docstring, steps 1-4). ``batch_boundary``: a rollout batch has just ended, so a training step
    starts now (``outlook.hold_s``; the schedule's ``trainer_waits``). Raises ``DecisionError`` /
    ``PlanError`` when no allocation or plan exists."""
    n = slots(state, budget, tp_size)
    # a fresh start (no allocation in force) is held against colocation, the engine's default: a
    # split must clear the mode threshold on the prior as any mode switch does on telemetry
    wish = o.decider.decide(n, o.allocation if o.allocation is not None else Allocation.colocated(n))
    sched = hold_for_schedule(o, wish, batch_boundary)
    d = sched.decision
    p = plan(state, d.target, budget, tp_size)
    serving = sum(1 for wk in state.workers.values()
                  if wk.status is WorkerStatus.ACTIVE and all(g in budget for g in wk.gpus))
    roled = active_steps(state, p, StepKind.CHANGE_ROLE)
    held = hold_switch(o, d, batch_boundary, len(roled) / max(serving, 1))
    if held.decision is not d:
        p = plan(state, held.decision.target, budget, tp_size)
    return ReplanStep(held.decision, p, held, wish, sched)


def switch_kind(current: Allocation | None, target: Allocation, policy: DecisionPolicy) -> str | None:
    """``"mode_switch"`` when ``target``'s mode is not ``current``'s; ``"ratio_switch"`` when both are
    splits and ``target`` is not ``current`` projected onto ``target``'s budget (a grant or a borrow
    that also changes the P:D is a ratio switch; the projection alone is not); else None."""
    if current is None or target == current:
        return None
    if target.mode is not current.mode:
        return "mode_switch"
    if target.mode is Mode.DISAGGREGATED and target != project(current, target.n_workers, policy):
        return "ratio_switch"
    return None


def gate_makespans(o: PoolOutlook, n_now: int, n_with: int) -> tuple[float, float]:
    """Every gate's preamble: ``(M(n_now), M(n_with))``, an infinite ``M(n_now)`` as ``1e12`` s."""
    m_now, m_with = o.decider.fresh_makespan(n_now), o.decider.fresh_makespan(n_with)
    return (m_now if math.isfinite(m_now) else NO_WORKERS_MAKESPAN_S), m_with


@dataclass(frozen=True, slots=True)
class ExpansionStep:
    """``expansion_step``'s answer: the ``gate`` (None when no plan could be made: ``error``) and
    the ``members`` to prepare (worker -> GPUs, role; empty when declined or nothing to add)."""

    gpus: frozenset[str]
    gate: GateDecision | None = None
    members: dict[str, tuple[tuple[str, ...], Role]] | None = None
    error: str = ""


def expansion_step(o: PoolOutlook, state: ClusterState, budget: frozenset[str],
                   groups: Sequence[tuple[str, ...]], preparing: Set[str], pending: int, tp_size: int,
                   expected_lifetime_s: float) -> ExpansionStep:
    """Admit the free preemptible ``groups`` or not (module docstring): ``preparing`` GPUs and
    ``pending`` workers belong to groups already preparing; ``expected_lifetime_s`` = ``T_life``."""
    n_now = slots(state, budget, tp_size)
    n_base = n_now + pending
    n_with = n_base + len(groups)
    m_now, m_with = gate_makespans(o, n_base, n_with)
    target = o.decider.decide(n_with, o.allocation).target
    new_gpus = frozenset(g for gs in groups for g in gs)
    try:
        p = plan(state, target, budget | new_gpus | preparing, tp_size)
    except PlanError as e:
        return ExpansionStep(new_gpus, error=str(e))
    stalled = active_steps(state, p, StepKind.REMOVE, StepKind.DEACTIVATE, StepKind.CHANGE_ROLE)
    gate = expansion_gate(m_now, m_with, expected_lifetime_s, o.costs, o.decider.policy,
                          stalled_fraction=len(stalled) / max(n_now, 1))
    members = ({s.worker_id: (s.gpus, s.role) for s in p.of_kind(StepKind.ADD) if set(s.gpus) <= new_gpus}
               if gate.admit else {})
    return ExpansionStep(new_gpus, gate, members)


@dataclass(frozen=True, slots=True)
class BorrowStep:
    """``borrow_step``'s answer: the borrow ``gate`` and the ``window`` it weighed."""

    gate: GateDecision
    window_s: float


def borrow_step(o: PoolOutlook, n_now: int, n_with: int, expected_idle_s: float | None) -> BorrowStep:
    """Lend the overlap GPUs (``n_with - n_now`` more workers) or not (module docstring)."""
    m_now, m_with = gate_makespans(o, n_now, n_with)
    remaining = remaining_s(o)
    window = expected_idle_s if expected_idle_s is not None else remaining
    return BorrowStep(borrow_gate(m_now, m_with, window, remaining, o.costs, o.decider.policy), window)
