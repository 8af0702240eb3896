"""PD Decision Engine (paper Sec. 4.3): choose colocation or a P:D split for the current budget.

``decide(n_workers, batch, hw, wl, policy, current)``:

1. Enumerate colocation on all ``N`` workers and every disaggregated split ``(N_P, N_D)`` with
   ``N_P + N_D = N``, ``N_P >= min_prefill_workers``, ``N_D >= min_decode_workers``. Splits that
   leave workers idle are not enumerated (modelling choice: a split uses the whole budget). A
   colocated pool may do better on fewer workers where the tail factor grows with the pool
   (``WorkloadProfile.tail_varies_with_load``); colocation is then predicted as the minimum over
   every smaller pool (``colocated.colocated_makespan_idle_bound``).
2. Predict each candidate's batch makespan (``colocated.colocated_makespan``,
   ``disaggregated.disaggregated_makespan``; each applies its own view of ``wl``) and mark the
   infeasible splits: prefill capacity ``u_batch <= u_max``, KV memory ``B K_seq <= N_D H_max``
   and the prefill pool's prefix cache ``max_s B_s (x_s + c_s) <= N_P H_max``
   (``disaggregated`` module docstring, "Feasibility").
3. Best = the feasible candidate with the minimum predicted makespan (ties: colocation first, then
   fewer prefill workers: deterministic).
4. Hysteresis against the current allocation (mode-dependent)::

       saving = (M_current - M_best) / M_current
       switch mode       only if saving > policy.mode_switch_threshold + T_mode / M_current
       switch P:D ratio  only if saving > policy.ratio_switch_threshold
       T_mode = t_role + (B / N) P(K_seq / 2, 0)                          (mode_change_s)

   A mode change re-roles every worker: each stops its requests, flushes its prefix cache and
   takes its new role (``t_role``, ``policy.role_switch_s``), and each of its ~``B / N``
   trajectories prefills its context (``K_seq / 2`` on average) once more. That cost, as a share
   of the current makespan, is charged on top of the mode threshold (a margin against prediction
   noise, like the ratio threshold), so the switching is cost-aware (paper Sec. 4.3.2): on
   H200 at 8-16 workers the charge is 1.2-3.1 % of a batch (Qwen3-30B-A3B / Qwen3-8B).

   When the budget changed (a grant, a reclaim, a borrow) the current allocation does not fit
   ``N`` any more; it is *projected* onto N: colocation stays colocation, a split keeps its
   prefill fraction ``N_P / (N_P + N_D)`` (rounded, clamped to the legal range). Hysteresis then
   compares against the projection.
5. Forced switch: if the current (projected) allocation is infeasible, the best feasible candidate
   is taken whatever its saving. If no disaggregated split is feasible, colocation is always
   available (it has no prefill-capacity constraint; KV overflow only queues trajectories).
6. In-flight placement (optional ``coloc_workers``): on a mid-batch growth the in-flight batch
   cannot use the whole colocated pool (the router's conversation affinity,
   ``makespan.sticky_pool``: ``n_eff = A / min(A / n_p, A / N + s (N - n_p) / N)``), while a P:D
   split's decode workers are chosen by least load. A caller that knows the placement passes
   ``coloc_workers = n_eff`` and colocation is predicted on ``n_eff`` workers; the splits keep
   their fresh-batch prediction (modelling choice: the re-prefill of a mode switch mid-batch is
   not charged; the mode-switch hysteresis stands for it). Default ``None``: the whole pool.

7. Never on a broken prediction: a candidate whose predicted makespan is NaN, infinite or not
   positive is infeasible ("prediction ... is not a positive number"); if the current
   allocation's prediction is such, it is held (no saving can be measured against it); if no
   candidate has a valid prediction, the current allocation (projected) is held, colocation
   without one. The profiles' screened-out telemetry is in ``to_dict`` (``telemetry_rejected``).

8. Extrapolation: once the decode step is fitted from iteration telemetry it is known over a
   range of decode batches and contexts (``HardwareProfile.decode_measured``, ``iteration_fit``).
   A candidate whose decode batch ``max(B / N_D, 1)`` (colocated ``max(B / N, 1)``) or longest
   stage context lies outside that range by more than ``EXTRAPOLATION_SLACK`` is ``extrapolated``
   (its record says so), and a switch to it from a candidate that is not must show
   ``EXTRAPOLATION_MARGIN`` more saving.

9. Closed loop: once batches have finished, every prediction is multiplied by the measured /
   predicted correction of its configuration and its neighbours (``WorkloadProfile.correction``,
   ``makespan_correction``), fed by the runtime after each batch with the configurations it ran
   and for how long (a borrow, a return, a grant or a reclaim mid-batch changes the pool; a batch
   that changed mode is not taken: ``RuntimeTracker.observe_batch``): a term per mode from
   batches on one configuration, and a term both modes share from batches whose pool changed.
   ``colocated_curve`` is the model's, uncorrected.

10. Convergence: each model's fixed point is solved until every unknown is within
   ``stages.TOLERANCE`` (relative) of it, in ``stages.ROUNDS`` rounds at most (``stages`` module
   docstring). A candidate whose fixed point is not that close by then keeps its last iterate as
   its prediction and says so (``converged: false`` in its record); ``make bench`` and
   ``tests/core/test_fixed_point.py`` measure the rounds and the distance. Like an extrapolated
   one (8.), a switch to such a candidate from one that converged must show ``UNCONVERGED_MARGIN``
   more saving.

The returned ``Decision`` carries every candidate's prediction and a human-readable reason, and
(``colocated_curve``, in ``to_dict`` as ``colocated_by_workers``) the colocated prediction at every
smaller pool: an in-flight batch that a mid-batch growth left on fewer workers than the pool runs
at ``1 / M_coloc(n_eff)`` (``makespan.sticky_pool``); the replay's piecewise predictor error uses it.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol

import numpy as np
import numpy.typing as npt

from pearl.core.colocated import (
    colocated_evaluation,
    colocated_idle_bound_evaluation,
    colocated_makespan,
    colocated_makespan_idle_bound,
)
from pearl.core.disaggregated import DisaggResult, disaggregated_makespan
from pearl.core.hardware import HardwareProfile
from pearl.core.stages import stages
from pearl.core.telemetry import Mode
from pearl.core.workload import WorkloadProfile

__all__ = ["Allocation", "Candidate", "CandidateTable", "Decision", "DecisionError", "DecisionPolicy", "Mode", "SplitsFn",
           "TableFn", "decide", "evaluate", "evaluate_table", "mode_change_s", "model_makespan", "project",
           "switch_threshold"]


#: how far (relative) past the decode step's fitted range a candidate may run before it is
#: ``extrapolated`` (module docstring, 8.)
EXTRAPOLATION_SLACK = 0.25
#: the extra predicted saving a switch to an extrapolated candidate must show (module docstring, 8.)
EXTRAPOLATION_MARGIN = 0.03
#: the extra predicted saving a switch to a candidate whose fixed point did not converge must show
#: (module docstring, 10.)
UNCONVERGED_MARGIN = 0.03


class DecisionError(ValueError):
    """A decision could not be made (e.g. a budget of 0 workers); the message says why."""


class DecisionPolicy(Protocol):
    """The policy fields the decision reads (``PolicyConfig``)."""

    @property
    def mode_switch_threshold(self) -> float: ...
    @property
    def role_switch_s(self) -> float: ...
    @property
    def ratio_switch_threshold(self) -> float: ...
    @property
    def allow_disaggregation(self) -> bool: ...
    @property
    def min_prefill_workers(self) -> int: ...
    @property
    def min_decode_workers(self) -> int: ...
    @property
    def max_prefill_utilization(self) -> float: ...


class SplitsFn(Protocol):
    """Evaluates every split of a budget: ``disaggregated.disaggregated_makespan`` (one pass) or
    ``makespan_reference.reference_disaggregated_makespan`` (term by term)."""

    def __call__(self, hw: HardwareProfile, wl: WorkloadProfile, batch: int, n_prefill: npt.NDArray[np.float64],
                 n_decode: npt.NDArray[np.float64], u_max: float) -> DisaggResult: ...


class TableFn(Protocol):
    """Evaluates every candidate of a budget (``evaluate_table`` or
    ``makespan_reference.reference_table``)."""

    def __call__(self, n_workers: int, batch: int, hw: HardwareProfile, wl: WorkloadProfile,
                 policy: DecisionPolicy, coloc_workers: float | None = None) -> CandidateTable: ...


@dataclass(frozen=True, slots=True)
class Allocation:
    """A target role allocation: colocation on ``n_colocated`` workers, or ``n_prefill`` P + ``n_decode`` D."""

    mode: Mode
    n_prefill: int = 0
    n_decode: int = 0
    n_colocated: int = 0

    def __post_init__(self) -> None:
        if min(self.n_prefill, self.n_decode, self.n_colocated) < 0:
            raise DecisionError(f"negative worker count in {self!r}")
        if self.mode is Mode.COLOCATED and (self.n_prefill or self.n_decode):
            raise DecisionError("a colocated allocation has no prefill/decode workers")
        if self.mode is Mode.DISAGGREGATED and (self.n_colocated or not (self.n_prefill and self.n_decode)):
            raise DecisionError(
                f"a disaggregated allocation needs >= 1 prefill and >= 1 decode worker, got "
                f"{self.n_prefill}P{self.n_decode}D"
            )

    @staticmethod
    def colocated(n: int) -> Allocation:
        return Allocation(Mode.COLOCATED, n_colocated=n)

    @staticmethod
    def disaggregated(n_prefill: int, n_decode: int) -> Allocation:
        return Allocation(Mode.DISAGGREGATED, n_prefill=n_prefill, n_decode=n_decode)

    @staticmethod
    def parse(text: str, n_workers: int) -> Allocation:
        """``coloc`` / ``colocated`` (all ``n_workers``), ``P:D`` or ``4P4D``."""
        t = text.strip().lower()
        if t in ("coloc", "colocated", "c"):
            return Allocation.colocated(n_workers)
        m = re.fullmatch(r"(\d+)\s*(?::|p)\s*(\d+)\s*d?", t)
        if not m:
            raise DecisionError(f"cannot parse allocation {text!r}: use 'coloc', 'P:D' (e.g. 4:4) or '4P4D'")
        return Allocation.disaggregated(int(m.group(1)), int(m.group(2)))

    @property
    def n_workers(self) -> int:
        return self.n_colocated + self.n_prefill + self.n_decode

    @property
    def label(self) -> str:
        return "coloc" if self.mode is Mode.COLOCATED else f"{self.n_prefill}P{self.n_decode}D"

    def to_dict(self) -> dict[str, object]:
        return {
            "mode": self.mode.value,
            "n_prefill": self.n_prefill,
            "n_decode": self.n_decode,
            "n_colocated": self.n_colocated,
            "label": self.label,
        }


@dataclass(frozen=True, slots=True)
class Candidate:
    allocation: Allocation
    makespan_s: float
    feasible: bool
    reason: str = ""
    #: its decode batch or context lies outside the range the decode step was fitted on (8.)
    extrapolated: bool = False
    #: its fixed point came within ``stages.TOLERANCE`` in ``stages.ROUNDS`` rounds (10.)
    converged: bool = True

    def to_dict(self) -> dict[str, object]:
        return {
            "label": self.allocation.label,
            "mode": self.allocation.mode.value,
            "n_prefill": self.allocation.n_prefill,
            "n_decode": self.allocation.n_decode,
            "predicted_makespan_s": round(self.makespan_s, 4),
            "feasible": self.feasible,
            "reason": self.reason,
            "extrapolated": self.extrapolated,
            "converged": self.converged,
        }


@dataclass(frozen=True, slots=True)
class CandidateTable:
    """Every candidate of one evaluation as arrays (materialised into ``Candidate`` s on demand:
    at 2048 workers building 2048 objects would cost more than predicting them)."""

    n_workers: int
    batch: int
    coloc_s: float
    n_prefill: npt.NDArray[np.int64]
    makespan_s: npt.NDArray[np.float64]
    prefill_ok: npt.NDArray[np.bool_]
    kv_ok: npt.NDArray[np.bool_]
    kv_demand: float
    kv_capacity: float
    #: the prefill pool holds every running conversation's prefix (``makespan.DisaggResult``)
    cache_ok: npt.NDArray[np.bool_]
    cache_demand: float
    #: per split, and colocation: predicted outside the decode step's fitted range (8.; None: none)
    extrapolated: npt.NDArray[np.bool_] | None = None
    coloc_extrapolated: bool = False
    #: per split, and colocation: the fixed point came within ``stages.TOLERANCE`` (10.; None: all)
    converged: npt.NDArray[np.bool_] | None = None
    coloc_converged: bool = True
    #: per split: its prediction is a positive finite number (module docstring, 7.)
    valid: npt.NDArray[np.bool_] = field(init=False)
    #: per split: every feasibility bound holds (``makespan`` module docstring, "Feasibility") and
    #: the prediction is valid
    feasible: npt.NDArray[np.bool_] = field(init=False)
    #: colocation's prediction is a positive finite number
    coloc_valid: bool = field(init=False)

    def __post_init__(self) -> None:
        valid = np.isfinite(self.makespan_s) & (self.makespan_s > 0)
        object.__setattr__(self, "valid", valid)
        object.__setattr__(self, "feasible", self.prefill_ok & self.kv_ok & self.cache_ok & valid)
        object.__setattr__(self, "coloc_valid", bool(math.isfinite(self.coloc_s) and self.coloc_s > 0))

    def __len__(self) -> int:
        return 1 + len(self.n_prefill)

    def _reason(self, i: int) -> str:
        reasons = []
        if not self.valid[i]:
            reasons.append(f"prediction {self.makespan_s[i]} s is not a positive number")
        if not self.prefill_ok[i]:
            reasons.append("prefill capacity exceeded")
        if not self.kv_ok[i]:
            n_d = self.n_workers - int(self.n_prefill[i])
            reasons.append(f"KV memory: B*K_seq={self.kv_demand:.0f} > N_D*H_max={n_d * self.kv_capacity:.0f}")
        if not self.cache_ok[i]:
            n_p = int(self.n_prefill[i])
            reasons.append(f"prefix cache: max B_s*prompt_s={self.cache_demand:.0f} > N_P*H_max={n_p * self.kv_capacity:.0f}")
        return "; ".join(reasons)

    def candidate(self, i: int) -> Candidate:
        """Index 0 is colocation; index 1 + j the j-th split."""
        if i == 0:
            ok = self.coloc_valid
            return Candidate(Allocation.colocated(self.n_workers), self.coloc_s, ok,
                             "" if ok else f"prediction {self.coloc_s} s is not a positive number",
                             self.coloc_extrapolated, self.coloc_converged)
        j = i - 1
        p = int(self.n_prefill[j])
        ok = bool(self.feasible[j])
        return Candidate(Allocation.disaggregated(p, self.n_workers - p), float(self.makespan_s[j]), ok,
                         "" if ok else self._reason(j),
                         bool(self.extrapolated[j]) if self.extrapolated is not None else False,
                         bool(self.converged[j]) if self.converged is not None else True)

    def all(self) -> tuple[Candidate, ...]:
        return tuple(self.candidate(i) for i in range(len(self)))

    def index_of(self, a: Allocation) -> int | None:
        if a.n_workers != self.n_workers:
            return None
        if a.mode is Mode.COLOCATED:
            return 0
        if not len(self.n_prefill):
            return None
        j = a.n_prefill - int(self.n_prefill[0])
        return 1 + j if 0 <= j < len(self.n_prefill) else None

    def best_index(self) -> int | None:
        """The feasible minimum; ties: colocation first, then fewer prefill workers. None when no
        candidate has a valid prediction (module docstring, 7.)."""
        best: int | None = 0 if self.coloc_valid else None
        best_s = self.coloc_s if self.coloc_valid else math.inf
        if len(self.n_prefill):
            ok = self.feasible
            if ok.any():
                masked = np.where(ok, self.makespan_s, np.inf)
                j = int(np.argmin(masked))
                if masked[j] < best_s:
                    best = 1 + j
        return best


@dataclass(frozen=True)
class Decision:
    target: Allocation
    current: Allocation | None
    table: CandidateTable = field(repr=False)
    switched: bool
    forced: bool
    reason: str
    predicted_makespan_s: float
    best: Allocation
    n_workers: int
    batch: int
    #: the profiles the decision was made with (for ``colocated_curve``; not compared)
    hw: HardwareProfile | None = field(default=None, repr=False, compare=False)
    wl: WorkloadProfile | None = field(default=None, repr=False, compare=False)

    @cached_property
    def candidates(self) -> tuple[Candidate, ...]:
        return self.table.all()

    @cached_property
    def colocated_curve(self) -> tuple[float, ...]:
        """Predicted colocated makespan on ``n = 1 .. n_workers`` workers under this decision's
        profiles (entry ``n - 1``), for an in-flight batch that runs on fewer workers than the
        pool: after a mid-batch growth its rate is ``1 / M_coloc(n_eff)`` with ``n_eff`` from
        ``makespan.sticky_pool`` (interpolate linearly in ``1 / n`` between entries). Empty
        without profiles."""
        if self.hw is None or self.wl is None or self.n_workers < 1:
            return ()
        ns = np.arange(1, self.n_workers + 1, dtype=np.float64)
        # a pool may leave workers idle: the curve never rises (``colocated_makespan_idle_bound``)
        ms = np.minimum.accumulate(colocated_makespan(self.hw, self.wl, self.batch, ns))
        return tuple(round(float(x), 2) for x in ms)

    def to_dict(self) -> dict[str, object]:
        return {
            "mode": self.target.mode.value,
            "n_prefill": self.target.n_prefill,
            "n_decode": self.target.n_decode,
            "n_colocated": self.target.n_colocated,
            "label": self.target.label,
            "predicted_makespan_s": round(self.predicted_makespan_s, 4),
            "best": self.best.label,
            "current": None if self.current is None else self.current.label,
            "switched": self.switched,
            "forced": self.forced,
            "reason": self.reason,
            "n_workers": self.n_workers,
            "batch": self.batch,
            "candidates": [c.to_dict() for c in self.candidates],
            "colocated_by_workers": list(self.colocated_curve),
            "telemetry_rejected": {
                "hardware": {} if self.hw is None else self.hw.rejected.to_dict(),
                "workload": {} if self.wl is None else self.wl.rejected.to_dict(),
            },
        }


def project(current: Allocation, n_workers: int, policy: DecisionPolicy) -> Allocation:
    """Map ``current`` onto a budget of ``n_workers`` keeping its mode and prefill fraction."""
    if current.mode is Mode.COLOCATED or not policy.allow_disaggregation:
        return Allocation.colocated(n_workers)
    lo, hi = policy.min_prefill_workers, n_workers - policy.min_decode_workers
    if hi < lo:
        return Allocation.colocated(n_workers)
    if current.n_workers == n_workers:
        return current
    frac = current.n_prefill / current.n_workers
    n_p = int(min(max(round(frac * n_workers), lo), hi))
    return Allocation.disaggregated(n_p, n_workers - n_p)


def evaluate_table(
    n_workers: int, batch: int, hw: HardwareProfile, wl: WorkloadProfile, policy: DecisionPolicy,
    coloc_workers: float | None = None, splits: SplitsFn = disaggregated_makespan,
) -> CandidateTable:
    """Every candidate for ``n_workers`` as arrays (module docstring, 1.-2.). ``coloc_workers``:
    evaluate colocation on this effective pool instead of ``n_workers`` (module docstring, 6.);
    ``splits``: the evaluation of the splits (one pass, or the term-by-term reference)."""
    if not _physical(hw, wl):  # NaN or negative coefficients: no prediction (module docstring, 7.)
        return _unpredicted_table(n_workers, batch, hw, wl, policy)
    n_co = n_workers if coloc_workers is None else min(max(coloc_workers, 1.0), float(n_workers))
    coloc_fn = colocated_idle_bound_evaluation if wl.tail_varies_with_load else colocated_evaluation
    co = coloc_fn(hw, wl, batch, np.array([n_co], dtype=np.float64))
    coloc, coloc_conv = float(co.makespan_s[0]), bool(co.converged[0])
    lo, hi = policy.min_prefill_workers, n_workers - policy.min_decode_workers
    if policy.allow_disaggregation and hi >= lo:
        n_p = np.arange(lo, hi + 1, dtype=np.int64)
        res = splits(hw, wl, batch, n_p.astype(np.float64), (n_workers - n_p).astype(np.float64),
                                     policy.max_prefill_utilization)
        ms, pok, kok, cok, held = res.makespan_s, res.prefill_ok, res.kv_ok, res.cache_ok, res.cache_demand
        conv = res.converged
    else:
        n_p = np.zeros(0, dtype=np.int64)
        ms, pok, kok, cok, held = np.zeros(0), np.zeros(0, dtype=bool), np.zeros(0, dtype=bool), np.zeros(0, dtype=bool), 0.0
        conv = np.zeros(0, dtype=bool)
    if wl.correction.batches:  # the closed loop on measured makespans (module docstring, 9.)
        coloc *= float(np.exp(wl.correction.log_factors(float(n_workers), None)[0]))
        if n_p.size:
            ms = ms * np.exp(wl.correction.log_factors(float(n_workers), n_p.astype(np.float64)))
    ext, coloc_ext = _extrapolated(hw, wl, batch, n_co, (n_workers - n_p).astype(np.float64))
    return CandidateTable(n_workers, batch, coloc, n_p, ms, pok, kok, batch * wl.k_seq, hw.kv_capacity_tokens, cok, held,
                          ext, coloc_ext, conv, coloc_conv)


def _extrapolated(hw: HardwareProfile, wl: WorkloadProfile, batch: int, n_coloc: float, n_decode: npt.NDArray[np.float64]
                  ) -> tuple[npt.NDArray[np.bool_] | None, bool]:
    """Per split and for colocation: whether the decode batch it reaches, ``max(B / N_D, 1)``
    (``max(B / N, 1)`` colocated), or the longest stage context lies outside the fitted range
    ``hw.decode_measured`` by more than ``EXTRAPOLATION_SLACK`` (module docstring, 8.)."""
    box = hw.decode_measured
    if len(box) != 4:
        return None, False
    n_lo, n_hi, _l_lo, l_hi = box
    k = 1.0 + EXTRAPOLATION_SLACK

    def outside(ns: npt.NDArray[np.float64], mode: Mode) -> npt.NDArray[np.bool_]:
        st = stages(wl, mode)
        long_ctx = bool(st.x.size) and float((st.x + st.c + st.o / 2.0).max()) > l_hi * k
        flags: npt.NDArray[np.bool_] = (ns > n_hi * k) | (ns < n_lo / k) | long_ctx
        return flags

    splits = outside(np.maximum(batch / np.maximum(n_decode, 1.0), 1.0), Mode.DISAGGREGATED)
    coloc = outside(np.array([max(batch / max(n_coloc, 1.0), 1.0)]), Mode.COLOCATED)
    return splits, bool(coloc[0])


@functools.lru_cache(maxsize=64)
def _physical(hw: HardwareProfile, wl: WorkloadProfile) -> bool:
    """Both profiles can be evaluated (``HardwareProfile.physical``, ``WorkloadProfile.physical``;
    cached per profiles)."""
    return hw.physical() and wl.physical()


def _unpredicted_table(n_workers: int, batch: int, hw: HardwareProfile, wl: WorkloadProfile,
                       policy: DecisionPolicy) -> CandidateTable:
    """Every candidate predicted NaN: the table of profiles the models cannot run on."""
    lo, hi = policy.min_prefill_workers, n_workers - policy.min_decode_workers
    n_p = np.arange(lo, hi + 1, dtype=np.int64) if policy.allow_disaggregation and hi >= lo else np.zeros(0, np.int64)
    ones = np.ones(n_p.size, dtype=bool)
    return CandidateTable(n_workers, batch, math.nan, n_p, np.full(n_p.size, math.nan), ones, ones,
                          batch * wl.k_seq, hw.kv_capacity_tokens, ones, math.nan)


def evaluate(
    n_workers: int, batch: int, hw: HardwareProfile, wl: WorkloadProfile, policy: DecisionPolicy
) -> tuple[Candidate, ...]:
    """Every candidate allocation for ``n_workers`` with its prediction (colocation first)."""
    return evaluate_table(n_workers, batch, hw, wl, policy).all()


def decide(
    n_workers: int,
    batch: int,
    hw: HardwareProfile,
    wl: WorkloadProfile,
    policy: DecisionPolicy,
    current: Allocation | None = None,
    coloc_workers: float | None = None,
    evaluator: TableFn = evaluate_table,
) -> Decision:
    """Choose the target allocation (see module docstring; ``coloc_workers``: 6.; ``evaluate``: the
    candidates' evaluation (``evaluator``), ``evaluate_table`` unless a benchmark or test compares another)."""
    if n_workers < 1:
        raise DecisionError(f"budget of {n_workers} workers: need at least 1 rollout worker to decide")
    if batch < 1:
        raise DecisionError(f"batch size {batch}: need at least 1 trajectory")
    table = evaluator(n_workers, batch, hw, wl, policy, coloc_workers)
    best_i = table.best_index()
    if best_i is None:
        return _no_valid_prediction(table, current, policy, hw, wl)
    best = table.candidate(best_i)

    def done(target: Candidate, switched: bool, forced: bool, reason: str) -> Decision:
        return Decision(
            target.allocation, current, table, switched, forced, reason, target.makespan_s,
            best.allocation, n_workers, batch, hw, wl,
        )

    if current is None:
        return done(best, True, False, f"initial: {best.allocation.label} has the lowest predicted makespan "
                                       f"({best.makespan_s:.1f} s)")
    proj = project(current, n_workers, policy)
    idx = table.index_of(proj)
    cur = None if idx is None else table.candidate(idx)
    if cur is not None and not (math.isfinite(cur.makespan_s) and cur.makespan_s > 0):
        changed = proj != current
        return done(cur, changed, False, f"hold {cur.allocation.label}: its prediction ({cur.makespan_s} s) is not a "
                                         "positive number, no saving can be measured against it")
    if cur is None or not cur.feasible:
        why = "not allowed by policy" if cur is None else cur.reason
        return done(best, True, True, f"forced: current {proj.label} is infeasible ({why}); "
                                      f"switching to {best.allocation.label}")
    if best.allocation == cur.allocation:
        changed = proj != current
        return done(cur, changed, False, f"keep {cur.allocation.label}: already the best "
                                         f"({cur.makespan_s:.1f} s)" + (" (rescaled to the new budget)" if changed else ""))
    saving = (cur.makespan_s - best.makespan_s) / cur.makespan_s if cur.makespan_s > 0 else 0.0
    mode_change = best.allocation.mode is not cur.allocation.mode
    threshold, why = switch_threshold(cur, best, cur.makespan_s, n_workers, batch, hw, wl, policy)
    if saving > threshold:
        return done(best, True, False, f"switch {'mode' if mode_change else 'ratio'} {cur.allocation.label} -> "
                                       f"{best.allocation.label}: predicted saving {saving:.1%} > {why}")
    changed = proj != current
    return done(cur, changed, False, f"hold {cur.allocation.label}: {best.allocation.label} would save only "
                                     f"{saving:.1%} <= {why}")


def switch_threshold(cur: Candidate, best: Candidate, makespan_s: float, n_workers: int, batch: int,
                     hw: HardwareProfile, wl: WorkloadProfile, policy: DecisionPolicy) -> tuple[float, str]:
    """The saving a switch from ``cur`` to ``best`` must exceed (module docstring, 4., 8., 10.) and
    its wording: ``mode_switch_threshold + T_mode / M`` for a change of mode (``M`` =
    ``makespan_s``, the makespan the switch is weighed against), ``ratio_switch_threshold``
    otherwise; plus ``EXTRAPOLATION_MARGIN`` when only ``best`` is extrapolated and
    ``UNCONVERGED_MARGIN`` when only ``best``'s fixed point did not converge."""
    if best.allocation.mode is not cur.allocation.mode:
        charge = mode_change_s(n_workers, batch, hw, wl, policy.role_switch_s) / makespan_s if makespan_s > 0 else 0.0
        threshold = policy.mode_switch_threshold + charge
        why = f"mode threshold {threshold:.1%} ({policy.mode_switch_threshold:.1%} + switch cost {charge:.1%})"
    else:
        threshold = policy.ratio_switch_threshold
        why = f"ratio threshold {threshold:.1%}"
    if best.extrapolated and not cur.extrapolated:
        threshold += EXTRAPOLATION_MARGIN
        why += f" + {EXTRAPOLATION_MARGIN:.1%}: {best.allocation.label} is extrapolated"
    if not best.converged and cur.converged:
        threshold += UNCONVERGED_MARGIN
        why += f" + {UNCONVERGED_MARGIN:.1%}: {best.allocation.label}'s fixed point did not converge"
    return threshold, why


def _no_valid_prediction(table: CandidateTable, current: Allocation | None, policy: DecisionPolicy,
                         hw: HardwareProfile, wl: WorkloadProfile) -> Decision:
    """No candidate has a positive finite prediction: keep the current allocation (projected onto
    the budget), or colocation without one, and say so (module docstring, 7.)."""
    n = table.n_workers
    target = Allocation.colocated(n) if current is None else project(current, n, policy)
    idx = table.index_of(target)
    pred = math.nan if idx is None else table.candidate(idx).makespan_s
    return Decision(target, current, table, target != current, False,
                    f"hold {target.label}: no candidate has a positive finite predicted makespan "
                    "(the profiles gave NaN or non-positive predictions)", pred, target, n, table.batch, hw, wl)


def model_makespan(allocation: Allocation, batch: int, hw: HardwareProfile, wl: WorkloadProfile) -> float:
    """The models' fresh-batch prediction for one allocation, without the closed loop's correction
    (what ``evaluate_table`` predicts for it before step 9; NaN on profiles it cannot run on)."""
    if not _physical(hw, wl) or allocation.n_workers < 1:
        return math.nan
    if allocation.mode is Mode.COLOCATED:
        fn = colocated_makespan_idle_bound if wl.tail_varies_with_load else colocated_makespan
        return float(fn(hw, wl, batch, np.array([float(allocation.n_colocated)]))[0])
    res = disaggregated_makespan(hw, wl, batch, np.array([float(allocation.n_prefill)]),
                                 np.array([float(allocation.n_decode)]), 1.0)
    return float(res.makespan_s[0])


def mode_change_s(n_workers: int, batch: int, hw: HardwareProfile, wl: WorkloadProfile, role_switch_s: float) -> float:
    """``T_mode = t_role + (B / N) P(K_seq / 2, 0)``: the seconds of pool time a change of PD mode
    costs on ``N`` workers (module docstring, 4.)."""
    return role_switch_s + (batch / max(n_workers, 1)) * float(hw.prefill_s(wl.k_seq / 2.0, 0.0))
