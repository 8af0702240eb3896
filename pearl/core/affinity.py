"""Cost-aware conversation affinity: keep a turn on the worker that holds its prefix cache, or
move it to a less loaded one.

A multi-turn trajectory's next turn normally goes back to the worker that served its previous
turn: that worker's prefix cache holds the conversation, so only the new tokens are prefilled.
When the pool grows mid-batch (preemptible GPUs admitted, training GPUs borrowed) the old workers
keep their trajectories and the new ones stay nearly idle; a fixed load slack (SGLang's
cache-aware router's balance threshold, ``Router.affinity_slack``) lets that imbalance persist
(``makespan.sticky_pool``: the new workers fill only to within the slack of the old ones). The
decision below moves a turn when what it saves in decode exceeds what it pays in prefill.

One colocated turn with prompt context ``L`` tokens, of which ``c`` are in the preferred worker's
prefix cache, and ``o`` expected output tokens; the preferred worker has ``n_p`` in-flight
requests, the least-loaded one ``n_b < n_p``::

    stay:  T_s = P(L - c, c) + o * tau(n_p + 1, L + o / 2)
    move:  T_m = P(L, 0)     + o * tau(n_b + 1, L + o / 2)
    gain   G   = T_s - T_m                      move iff G > 0

with ``P`` the prefill cost and ``tau(n, L)`` one decode iteration of ``n`` sequences of mean
context ``L`` (``hardware.HardwareProfile``: ``P(x, c) = a0 + a1 x + a2 x (c + x / 2)``, ``tau = b0 +
b_e f_E(n) + b2 n L`` below the roofline's ridge). For a dense model ``G = o (n_p - n_b) b2 (L + o/2) -
[P(L, 0) - P(L - c, c)]``: the decode saving grows with the load gap and the turn's length, the
cost with the cached prefix.

Modelling choices (the paper does not route turns; these are made here):

* **Per-turn latency, greedy.** The batch makespan is the slowest trajectory's chain of turn
  latencies, so each turn minimises its own latency. The effect on the other sequences of both
  workers (one fewer / one more in their decode batch) is not counted: for a memory-bound decode
  it is the same ``b2 L`` per step on both sides and cancels to first order.
* **In-flight requests stand for the decode batch.** ``n`` is the router's load (requests routed
  and not yet finished on that worker, prefilling ones included); the router sees no engine's
  internal batch.
* **Every sequence at the turn's own context.** ``tau`` takes the batch's mean context; the
  turn's own ``L + o / 2`` stands for it (a trajectory's neighbours in one batch are at similar
  depths: the batch starts together).
* **Cached share and output from telemetry.** ``c = h_k L`` with ``h_k`` the cached share of the
  prompt at turn ``k`` in the workload profile (``cached_tokens[k] / (new_tokens[k] +
  cached_tokens[k])``; what the engines report), ``o = output_tokens[k]``. A run whose engine
  caches the whole conversation (``h`` near 1) moves turns only across large load gaps; one whose
  cache rarely holds (``h`` small) balances almost freely.
* **Prefill-only pairing is unchanged.** A PD turn keeps the load-slack rule for its prefill
  worker (its decode worker is always the least loaded; decode holds no prefix cache).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pearl.core.hardware import HardwareProfile
from pearl.core.workload import WorkloadProfile

__all__ = ["TurnCost", "effective_slack", "move_gain_s", "turn_cost", "typical_turn"]


@dataclass(frozen=True, slots=True)
class TurnCost:
    """What one turn's routing needs to know: context ``L``, its cached part ``c`` on the preferred
    worker, expected output ``o`` (tokens)."""

    context: float
    cached: float
    output: float


def turn_cost(workload: WorkloadProfile, turn: int, context: int) -> TurnCost:
    """``TurnCost`` of turn ``turn`` (1-based) with ``context`` prompt tokens, from the profile's
    cached share and mean output at that turn (the last profiled turn beyond the profile)."""
    k = min(max(turn, 1), workload.max_turns) - 1
    x, c = workload.new_tokens[k], workload.cached_tokens[k]
    share = c / (x + c) if x + c > 0 else 0.0
    ctx = float(max(context, 0))
    return TurnCost(context=ctx, cached=min(max(share, 0.0), 1.0) * ctx, output=max(workload.output_tokens[k], 0.0))


def move_gain_s(hw: HardwareProfile, turn: TurnCost, n_prefer: int, n_best: int) -> float:
    """``G = T_s - T_m`` (module docstring): seconds the turn saves by leaving the worker with
    ``n_prefer`` in-flight requests for one with ``n_best``; positive means move."""
    mid = turn.context + turn.output / 2.0
    stay = hw.prefill_s(turn.context - turn.cached, turn.cached) + turn.output * hw.decode_step_s(n_prefer + 1, mid)
    move = hw.prefill_s(turn.context, 0.0) + turn.output * hw.decode_step_s(n_best + 1, mid)
    return stay - move


def typical_turn(workload: WorkloadProfile) -> TurnCost:
    """The profile's middle turn (``k = ceil(mean turns / 2)``) at its mean context ``x_k + c_k``:
    the turn the effective slack below is quoted for."""
    k = max(1, min(math.ceil(workload.mean_turns / 2), workload.max_turns))
    return turn_cost(workload, k, round(workload.new_tokens[k - 1] + workload.cached_tokens[k - 1]))


def effective_slack(hw: HardwareProfile, turn: TurnCost, slack: int) -> int:
    """The load gap the cost rule tolerates for ``turn``: the number of gaps ``d = 1..slack`` at
    which ``G(d, 0) <= 0`` (``G`` grows with the gap, so these are the smallest ones). 0 = a turn
    leaves at any gap; ``slack`` = the rule never moves it before the plain slack would. Used to
    model where an in-flight batch sits after a pool change (``makespan.sticky_pool``'s ``s``)."""
    return sum(1 for d in range(1, max(slack, 0) + 1) if move_gain_s(hw, turn, d, 0) <= 0.0)
