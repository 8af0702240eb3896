"""The decision a run acts on: the decision engine's choice, then the policy's overrides and holds.

``decision.decide`` chooses the best allocation for a budget with hysteresis against the one in
force. A run may overrule it in four ways, applied in this order (the first two here):

========================  ========================================================================
rule                      effect
========================  ========================================================================
``allocation_overrides``  ``overrides[n]`` (a label: ``"coloc"``, ``"5P3D"``) replaces the target on
                          a budget of ``n`` workers; its makespan is that candidate's prediction
                          (NaN when the table has no such candidate); ``forced`` is cleared
``force_disaggregation``  a colocated target becomes the feasible split with the lowest predicted
                          makespan (colocation stays when no split is feasible)
schedule hold             ``outlook.hold_for_schedule`` (``weigh_pool_schedule``): a mode or ratio
                          switch whose saving over the pool changes known within the batch does
                          not clear its threshold keeps the current allocation, projected
switch hold               ``outlook.hold_switch``: a mode or ratio switch whose saving cannot pay
                          back before the budget is known to shrink keeps the current allocation,
                          projected onto the budget (``gate.switch_gate``)
========================  ========================================================================

``Decider`` binds the decision's inputs that stay fixed over one forecast (batch size, profiles,
policy) so that forecasting code asks "which allocation on ``n`` workers?" in one call.

Public names: ``Decider``, ``OverridePolicy``, ``apply_overrides``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from pearl.core.decision import Allocation, Decision, DecisionPolicy, Mode, decide
from pearl.core.profile import HardwareProfile, WorkloadProfile


class OverridePolicy(DecisionPolicy, Protocol):
    """The policy fields the decision, its overrides and the gates read (``PolicyConfig``)."""

    @property
    def gate_enabled(self) -> bool: ...
    @property
    def weigh_pool_schedule(self) -> bool: ...
    @property
    def gate_margin(self) -> float: ...
    @property
    def allocation_overrides(self) -> Mapping[int, str]: ...
    @property
    def force_disaggregation(self) -> bool: ...


def apply_overrides(d: Decision, policy: OverridePolicy, current: Allocation | None) -> Decision:
    """``d`` with the policy's ``allocation_overrides`` and ``force_disaggregation`` applied
    (module docstring); ``d`` itself when neither applies."""
    n = d.n_workers
    override = policy.allocation_overrides.get(n)
    if override is not None:
        target = Allocation.parse(override, n)
        idx = d.table.index_of(target)
        ms = d.table.candidate(idx).makespan_s if idx is not None else float("nan")
        return replace(d, target=target, predicted_makespan_s=ms, switched=target != current, forced=False,
                       reason=f"override: allocation_overrides[{n}] = {override}")
    if policy.force_disaggregation and d.target.mode is Mode.COLOCATED:
        splits = [c for c in d.candidates if c.allocation.mode is Mode.DISAGGREGATED and c.feasible]
        if splits:
            best = min(splits, key=lambda c: c.makespan_s)
            return replace(d, target=best.allocation, predicted_makespan_s=best.makespan_s,
                           switched=best.allocation != current,
                           reason=f"forced disaggregation: best feasible split {best.allocation.label}")
    return d


@dataclass(frozen=True, slots=True)
class Decider:
    """The decision with the policy's overrides, for a fixed batch size, profiles and policy."""

    batch_size: int
    hw: HardwareProfile
    wl: WorkloadProfile
    policy: OverridePolicy

    def decide(self, n: int, current: Allocation | None) -> Decision:
        """``decision.decide`` on ``n`` workers against ``current``, then ``apply_overrides``."""
        d = decide(n, self.batch_size, self.hw, self.wl, self.policy, current)
        return apply_overrides(d, self.policy, current)

    def fresh_makespan(self, n: int) -> float:
        """``M(n)``: the predicted makespan of a batch that starts on ``n`` workers and keeps them,
        chosen with no allocation in force (no hysteresis); ``math.inf`` below one worker."""
        if n < 1:
            return math.inf
        return self.decide(n, None).predicted_makespan_s

