"""Cost-aware gates (paper Sec. 4.6 and 4.1.2): borrow training GPUs / accept an expansion only if
the predicted saving exceeds the cost of the transition.

Costs are estimated online by an exponential moving average of observed transitions (paper Sec. 5:
"EMAs estimate switching costs"), seeded with priors from the config (paper Table 3)::

    c <- c + alpha * (observed - c)       (NaN, infinite and negative observations are ignored)

Borrow gate. Rollout currently predicts batch makespan ``M_0``; with the borrowed workers it would
be ``M_1 < M_0``, i.e. it runs ``r = M_0 / M_1`` times faster. Training is idle for a window ``W``
(until the next update needs its GPUs; the batch's remaining time when the trainer gave none).
The batch has ``R`` seconds of work left at the current speed. Borrowing starts with an
activation of ``c_a`` seconds, during which the batch goes on at the current speed on the workers
it has; the borrowed workers then serve until the batch is done or the window closes. The return
starts when the training step does (``ElasticScheduler._on_training_started``) and the step waits
the ``c_d`` it takes::

    T_useful = min(W - c_a, (R - c_a) / r)    seconds the borrowed workers actually serve
    saving   = T_useful * (r - 1)             rollout seconds saved (in current-speed seconds)
    cost     = c_d                            the return: the training step waits for it
    admit  iff  T_useful > 0  and  saving > margin * cost

Check, batch-bound case: without borrowing the batch ends ``R`` from now, with it
``c_a + (R - c_a) / r`` from now, earlier by ``(R - c_a)(1 - 1/r) = T_useful (r - 1)``.
Window-bound: the borrowed workers serve ``W - c_a`` seconds at ``r - 1`` extra speed.

The activation is paid inside the saving, as the ``c_a`` seconds the borrowed workers do not
serve: what it costs the batch is ``c_a (1 - 1/r)`` seconds (batch-bound) or ``c_a (r - 1)``
(window-bound), not ``c_a``; the return's ``c_d`` is paid by the training step, not taken off the
window. Not modelled, on either side:
the requests that the return interrupts resume with a re-prefill on the dedicated workers (about
1 s of GPU work each, docs/EXPERIMENTS.md Table 3).

Expansion gate. Preemptible GPUs expected to live ``T_life`` seconds. Preparation (background:
start, load) ``c_p`` and finalisation ``c_f`` (the new workers' weight sync, the re-plan,
admission) both delay the new workers, so they serve ``T_useful``. What the expansion costs the
workers already serving is the re-plan at admission: an existing worker that the plan removes,
deactivates or gives a new role (``k`` of the ``n`` serving now) stops serving for about a
finalisation (drain, relaunch in its new role, weight load) and its in-flight requests resume
elsewhere::

    T_useful = T_life - c_p - c_f
    saving   = T_useful * (r - 1)             rollout seconds saved (in current-speed seconds)
    cost     = c_f * k / n                    the serving pool's stall (pool-seconds / n)
    admit  iff  T_useful > 0  and  saving > margin * cost

A growth that keeps every serving worker's role (colocation growing, a split growing on the
new GPUs only) costs the serving pool nothing: the new workers are staged off the serving path
(``ClusterRebuilder.stage``) and admitted at once, so only ``T_useful > 0`` and ``r > 1`` gate it.
Modelling choice: the re-roled worker's downtime is priced at the finalisation EMA ``c_f`` (one
relaunch and weight load, as finalising a new worker is); the re-prefill of its aborted requests
(about 1 s of GPU work each, Table 3) is not charged. ``c_f`` is taken off ``T_useful`` and is
not charged again as a cost for a pure growth (that would count it twice).

Switch gate (paper Sec. 4.3.2: "cost-aware switching ... suppress transitions with
insufficient expected benefit"). The decision engine's hysteresis compares fresh-batch makespans
on the budget in force, as if that budget held. When it is known to change soon (lent training
GPUs leave when the next training step starts; a reclaim notice is due) a mode or ratio switch
pays only until then. A switch re-roles ``k`` of the ``n`` active serving workers (drain,
relaunch in the new role, weight load: about a finalisation ``c_f`` each), and the new roles
serve after that::

    T_useful = T_hold - c_f                   seconds the new allocation serves before the budget changes
    saving   = T_useful * (r - 1)             rollout seconds saved, r = M_current / M_new
    cost     = c_f * k / n                    the serving pool's stall (pool-seconds / n)
    admit  iff  T_hold infinite (nothing known), or T_useful > 0 and saving > margin * cost

Why: a split chosen on a borrowed pool seconds before the trainer takes the lent GPUs back is
projected onto the reserved workers, where it can be infeasible and force colocation again: two
mode switches, each re-roling the serving workers, for seconds of the split. Modelling choices: ``T_hold`` is the
first known shrink of the budget (a grant's regrowth does not end a switch's payback); a forced
switch (the current allocation is infeasible on the new budget) is never gated. The decision
engine's hysteresis prices the same re-roling once more, from the predictor's own terms and as a
share of one batch (``decision.mode_change_s``: role change plus each trajectory's re-prefill);
this gate is the one that knows the budget's end, so it prices from observed finalisations (``c_f``)
against the seconds the switch can serve. Both must admit a non-forced switch.

With ``policy.gate_enabled = False`` every gate admits whenever ``r > 1`` (the "ungated toggle" of
the paper's ablation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Protocol


class CostKind(StrEnum):
    ACTIVATION = "activation"
    DEACTIVATION = "deactivation"
    EXPANSION_PREP = "expansion_prep"
    EXPANSION_FINAL = "expansion_final"
    WEIGHT_SYNC = "weight_sync"  # the pause of an in-place weight sync (batch-start prediction)


class _GatePolicy(Protocol):
    @property
    def gate_enabled(self) -> bool: ...
    @property
    def gate_margin(self) -> float: ...


@dataclass(frozen=True, slots=True)
class CostModel:
    """EMA estimates (seconds) of transition costs; ``observe`` returns an updated copy."""

    activation_s: float = 6.0
    deactivation_s: float = 3.8
    expansion_prep_s: float = 61.0
    expansion_final_s: float = 14.0
    weight_sync_s: float = 2.0
    alpha: float = 0.3
    observations: int = 0

    def observe(self, kind: CostKind | str, seconds: float) -> CostModel:
        if not math.isfinite(seconds) or seconds < 0:
            return self
        field = f"{CostKind(kind).value}_s"
        old = float(getattr(self, field))
        return replace(self, **{field: old + self.alpha * (seconds - old)}, observations=self.observations + 1)

    def to_dict(self) -> dict[str, float]:
        return {
            "activation_s": round(self.activation_s, 3),
            "deactivation_s": round(self.deactivation_s, 3),
            "expansion_prep_s": round(self.expansion_prep_s, 3),
            "expansion_final_s": round(self.expansion_final_s, 3),
            "weight_sync_s": round(self.weight_sync_s, 3),
        }


class GateOutcome(StrEnum):
    """Why a gate decided as it did (``GateDecision.outcome``; counted per system by the replay)."""

    ADMITTED = "admitted"                    # saving > margin x cost
    UNGATED = "ungated"                      # gate disabled, a speedup predicted
    NO_SPEEDUP = "no_speedup"                # r <= 1
    WINDOW_TOO_SHORT = "window_too_short"    # borrow: W <= c_a
    BATCH_ENDS_FIRST = "batch_ends_first"    # borrow: R <= c_a
    LIFETIME_TOO_SHORT = "lifetime_too_short"  # expansion: T_life <= c_p + c_f
    SAVING_BELOW_COST = "saving_below_cost"  # saving <= margin x cost
    SAVING_BELOW_THRESHOLD = "saving_below_threshold"  # schedule hold: saving over the batch <= threshold


@dataclass(frozen=True, slots=True)
class GateDecision:
    admit: bool
    saving_s: float
    cost_s: float
    useful_s: float
    reason: str
    outcome: GateOutcome

    def to_dict(self) -> dict[str, object]:
        return {
            "admit": self.admit,
            "outcome": self.outcome.value,
            "saving_s": round(self.saving_s, 3),
            "cost_s": round(self.cost_s, 3),
            "useful_s": round(self.useful_s, 3),
            "reason": self.reason,
        }


def _speedup(makespan_now_s: float, makespan_with_s: float) -> float:
    if not (math.isfinite(makespan_now_s) and math.isfinite(makespan_with_s)) or makespan_with_s <= 0:
        return 1.0
    return makespan_now_s / makespan_with_s


def _unweighed(r: float, saving: float, cost: float, useful: float, policy: _GatePolicy,
               what: str) -> GateDecision | None:
    """The verdicts every gate shares before weighing: no speedup declines, a disabled gate admits."""
    if r <= 1.0:
        return GateDecision(False, 0.0, cost, useful, f"no speedup predicted (r={r:.3f})", GateOutcome.NO_SPEEDUP)
    if not policy.gate_enabled:
        return GateDecision(True, saving, cost, useful, f"gate disabled: {what} (r={r:.3f})", GateOutcome.UNGATED)
    return None


def _weigh(saving: float, cost: float, useful: float, policy: _GatePolicy, cost_name: str,
           detail: str) -> GateDecision:
    """admit iff saving > margin x cost (every gate's last step)."""
    admit = saving > policy.gate_margin * cost
    cmp = ">" if admit else "<="
    return GateDecision(admit, saving, cost, useful,
                        f"saving {saving:.1f} s {cmp} {policy.gate_margin:g} x {cost_name} {cost:.1f} s ({detail})",
                        GateOutcome.ADMITTED if admit else GateOutcome.SAVING_BELOW_COST)


def borrow_gate(
    makespan_now_s: float,
    makespan_with_s: float,
    window_s: float,
    remaining_s: float,
    costs: CostModel,
    policy: _GatePolicy,
) -> GateDecision:
    """Admit borrowing overlap GPUs for an idle training window (module docstring)."""
    r = _speedup(makespan_now_s, makespan_with_s)
    c_a, cost = costs.activation_s, costs.deactivation_s
    remaining = max(remaining_s, 0.0)
    by_window = window_s - c_a
    by_batch = (remaining - c_a) / r if r > 0 else 0.0
    useful = min(by_window, by_batch)
    saving = max(useful, 0.0) * (r - 1.0)
    if (early := _unweighed(r, saving, cost, useful, policy, "borrow")) is not None:
        return early
    if remaining <= c_a:
        return GateDecision(False, 0.0, cost, useful,
                            f"batch done ({remaining:.1f} s left) before the activation ({c_a:.1f} s) ends",
                            GateOutcome.BATCH_ENDS_FIRST)
    if by_window <= 0:
        return GateDecision(False, 0.0, cost, useful,
                            f"window {window_s:.1f} s too short for the activation {c_a:.1f} s",
                            GateOutcome.WINDOW_TOO_SHORT)
    return _weigh(saving, cost, useful, policy, "return",
                  f"r={r:.3f}, serving {useful:.1f} s after a {c_a:.1f} s activation")


def expansion_gate(
    makespan_now_s: float,
    makespan_with_s: float,
    expected_lifetime_s: float,
    costs: CostModel,
    policy: _GatePolicy,
    stalled_fraction: float = 0.0,
) -> GateDecision:
    """Admit preparing an expansion onto newly granted preemptible GPUs (module docstring).
    ``stalled_fraction`` = ``k / n``: the share of the serving workers that the admission's re-plan
    removes, deactivates or re-roles (clamped to [0, 1])."""
    if not math.isfinite(stalled_fraction):
        raise ValueError(f"stalled_fraction must be finite, got {stalled_fraction!r}")
    r = _speedup(makespan_now_s, makespan_with_s)
    cost = costs.expansion_final_s * min(max(stalled_fraction, 0.0), 1.0)
    useful = expected_lifetime_s - costs.expansion_prep_s - costs.expansion_final_s
    saving = max(useful, 0.0) * (r - 1.0)
    if (early := _unweighed(r, saving, cost, useful, policy, "expand")) is not None:
        return early
    if useful <= 0:
        return GateDecision(False, 0.0, cost, useful,
                            f"expected lifetime {expected_lifetime_s:.0f} s shorter than preparation + "
                            f"finalisation {costs.expansion_prep_s + costs.expansion_final_s:.0f} s",
                            GateOutcome.LIFETIME_TOO_SHORT)
    return _weigh(saving, cost, useful, policy, "cost",
                  f"r={r:.3f}, {stalled_fraction:.0%} of the serving workers re-planned")


def switch_gate(
    makespan_current_s: float,
    makespan_new_s: float,
    hold_s: float,
    costs: CostModel,
    policy: _GatePolicy,
    stalled_fraction: float = 1.0,
) -> GateDecision:
    """Admit a mode or ratio switch whose budget holds ``hold_s`` seconds (``math.inf``: no change
    known) (module docstring). ``stalled_fraction`` = ``k / n``: the share of the serving workers
    the switch re-roles (clamped to [0, 1])."""
    if not math.isfinite(stalled_fraction):
        raise ValueError(f"stalled_fraction must be finite, got {stalled_fraction!r}")
    if math.isnan(hold_s):
        raise ValueError("hold_s must be a number of seconds or math.inf, got NaN")
    r = _speedup(makespan_current_s, makespan_new_s)
    cost = costs.expansion_final_s * min(max(stalled_fraction, 0.0), 1.0)
    useful = hold_s - costs.expansion_final_s
    saving = max(useful, 0.0) * (r - 1.0)
    if (early := _unweighed(r, saving, cost, useful, policy, "switch")) is not None:
        return early
    if math.isinf(hold_s):
        return GateDecision(True, math.inf, cost, math.inf, f"budget holds: switch (r={r:.3f})", GateOutcome.ADMITTED)
    if useful <= 0:
        return GateDecision(False, 0.0, cost, useful,
                            f"budget changes in {hold_s:.1f} s, before the re-roled workers serve "
                            f"({costs.expansion_final_s:.1f} s)", GateOutcome.WINDOW_TOO_SHORT)
    return _weigh(saving, cost, useful, policy, "cost",
                  f"r={r:.3f}, budget holds {hold_s:.1f} s, {stalled_fraction:.0%} of the serving workers re-roled")
