"""Bubble-aware makespan models for a rollout batch (paper Sec. 4.2 and 4.3.1).

The batch makespan is the completion time of the *last* of the ``B`` trajectories. A trajectory
is a sequence of turns; turn ``k`` is prefill -> decode -> environment step. The tail of the batch
matters: as trajectories finish, fewer remain, decode batches shrink and GPUs idle (bubbles).
So the makespan is a sum over turns of a per-turn *cycle time* ``C_k`` computed at the number of
trajectories still alive at that turn, each turn weighted by the probability that the batch's
longest trajectory still runs it::

    M = sum_k R_k C_k( B_k ),  B_k = B * S(k),  R_k = 1 - (1 - S(k))^B
        (S: survival of the workload profile; R_k: P(at least one of B trajectories reaches turn k))

so ``sum_k R_k = E[max turns over the batch]``. This is the *prior* form, used until telemetry has
seen whole trajectories. Once the workload profile carries the observed ratio of the slowest to
the mean trajectory duration in a batch (``tail_factor``, fitted by ``fit_workload`` from whole
trajectories in the window), the makespan is the mean trajectory duration scaled by it::

    M = rho(B / N) T_mean,   T_mean = sum_k S(k) C_k( B_k ),   rho = E[max_i T_i] / E[T_i]  (measured)

(``rho`` at the pool's load ``B / N`` trajectories per worker, ``WorkloadProfile.tail_factor_at``:
session 9 measured it falling from 1.24-1.27 at 2 per worker to 1.12-1.13 at 16.)

Why (formula change, session 2): the first version weighted every turn with ``S(k) > 1e-4`` by 1,
i.e. the batch was assumed to contain a trajectory that runs the profile's *maximal* number of
turns, each at the mean per-turn cost. With a trajectory token limit that binds (the ``paper``
workload: most trajectories end at 32K tokens), the trajectories that run the most turns are those
with *short* turns, so that path overestimates the slowest trajectory: measured on the emulator
(colocated, 8 workers, B = 64, Qwen3-8B), the per-turn cycles C_k were within a few % of the
observed turn times, yet the old sum was +8.5 % above the observed makespan (the slowest
trajectory ran 15-18 of a possible 19 turns). The reach weights alone remove ~2 points; the
measured tail factor removes the rest. Modelling choice: rho is treated as a property of the
workload and B, carried over unchanged to every colocated candidate; disaggregated candidates
use the slowest observed paths instead once the profile has them (below).

Disaggregation's tail (session 2, second round): ``rho`` is measured where PEARL mostly runs,
in colocation, whose sticky workers let trajectories' decode speeds differ; a disaggregated
decode pool batches every trajectory together and evens them out (emulator, Qwen3-8B: rho
1.18-1.24 colocated vs 1.14-1.20 for P:D splits), so carrying rho over made every split 1-9 %
too slow. When the workload profile holds the turn paths of the slowest observed trajectories
(``tail_paths``, ``fit_workload``), a split's makespan is instead the slowest of those paths run
through the split's per-stage state::

    M_PD = max_j sum_{k <= K_j} T_jk + W_start
    T_jk = (W_s + P(x_jk, c_jk) + X(x_jk + c_jk) + o_jk tau(n_s, L_jk) + e_jk) C_s / C_lat,s

(``W_s``, ``n_s``, ``C_s``, ``C_lat,s`` from the fixed point below; the ratio stretches a turn
when a throughput bound, not latency, sets the stage's cycle; ``L_jk = x_jk + c_jk + o_jk / 2``).
``s = s(t_jk)`` is the stage the batch is in when turn k *starts*, ``t_jk = sum_{i<k} T_ji``: the
stage whose end time on the batch front, ``E_s = sum_{s' <= s} T_s' C_s'`` (``T_s`` turns in
group s), is the first at or after ``t_jk`` (the last stage past the front's end). Why by time,
not by turn number (session 5, measured): a slow path lags the batch, so its late turns run when
fewer trajectories are left than the turn number says - smaller decode batches, shorter prefill
queues. Indexed by turn number, the slowest paths were charged the crowded mid-batch state for
those turns and every split came out too slow on the seeds where the slowest trajectory lagged
most (emulator, Qwen3-8B, 8 paired seeds x 6 budgets, 816 split runs: median |error| 3.3 % ->
2.1 %; on 8 workers the best split 3P5D was predicted 4-9 % slow and lost to colocation).
Colocation keeps ``rho T_mean``: there the measured ratio *is* the
mechanism (a modelled slowest path missed ~3.5 % of it on 8 workers: the sticky workers'
uneven load). Modelling choice: the paths are the observed slowest 4 (``profile.TAIL_PATHS``).
One window's slowest paths are one draw of the batch maximum, so (session 13) the split's
makespan averages the per-window maxima of the last ``profile.TAIL_WINDOWS`` windows with EMA
weights, as ``rho`` is blended (``profile._blend_tail_windows``)::

    M_PD = sum_w omega_w max_{j in w} sum_{k <= K_j} T_jk + W_start

Turns are compressed into at most ``STAGES`` consecutive groups (per-group means) so that every
candidate allocation is evaluated at once with numpy (vectorised over candidates x stages).

Per-turn quantities (workload profile): x new prompt tokens, c cached tokens, o output tokens,
e environment seconds, L = x + c + o/2 mean decode context. They are per-turn *means* (the
cycle is linear in o and e, so the sum over turns needs E[o], E[e]); e includes the test runs
(rare, long) and the final turn's test. (Session 2 fix, in ``profile.py``: the fit used per-turn
medians and the prior left out the tests; on the ``paper`` workload that made e ~40 % and o a
few % too small and the colocated makespan 3-8 % too short, more so at small B / N where the
cycle is shorter and env a larger share of it. Qwen3-8B, B = 64, measured 430 s on 8 workers
and 278 s on 24: predicted 417 s and 256 s before, 431 s and 276 s after, together with the
one-scale decode fit for colocated telemetry in ``profile.fit_hardware``.) Hardware (``HardwareProfile``):
P = P(x, c) prefill time, tau(n, L) decode iteration time at batch n, X = X(x + c) KV transfer
of the whole context (the decode worker needs every KV entry of the prompt), H_max KV tokens per
worker, K_seq KV footprint of one trajectory.

Colocation (N workers; prefill and decode serialise on the same GPUs). Routing keeps a trajectory
on its worker (prefix cache affinity) and admission starts balanced, B / N per worker; the
survivors at turn k are a uniformly random subset, so a surviving trajectory shares its worker
with (size-biased, hypergeometric)::

    m = 1 + (B / N - 1) (B_k - 1) / (B - 1)        (>= 1; = B / N while all are alive)

trajectories, not the balanced B_k / N (session 2: the balanced tail under-predicted the last
turns by ~20 % on the emulator). Unknowns: the decode concurrency n and the cycle C, found by
fixed-point iteration (damped, ``ITERATIONS`` rounds)::

    u     = min(m P / C, u_cap)                prefill share of the worker's time
    n_s   = 1 + (m - 1) n / m                  the decode batch a decoding trajectory sees
    D     = o tau(n_s, L) / (1 - u (m - 1) / m)  decode of o tokens, stalled by the *other*
                                               trajectories' prefills (own prefill precedes it)
    W     = u P / (2 (1 - u))                  wait for other trajectories' prefills (M/D/1)
    C_lat = W + P + D + e                      one trajectory's own turn (env included)
    C_cap = m P + o tau(m, L)                  the worker's least busy time per turn of all m
                                               trajectories (every decode iteration batches all m)
    C     = max(C_lat, C_cap)
    n     = clip(m D / C, 1, m)                Little's law: env steps and prefill reduce the
                                               number of trajectories decoding at once

Why ``n_s`` and not ``n`` (session 12, measured): ``n`` is the time-average number of the
worker's ``m`` trajectories in decode, but a trajectory that decodes sees itself plus each of the
other ``m - 1``, decoding with probability ``n / m`` (the inspection paradox: the batch is
size-biased). On the emulator (Qwen3-8B, 12 colocated workers, 4 batches) the requests' observed
decode concurrency per turn group was 4.79 / 4.75 / 4.66 / 3.94 where the model's ``n`` was
4.60 / 4.59 / 4.53 / 3.79 and ``n_s`` gives 4.74 / 4.73 / 4.68 / 3.98. With the roofline decode
step (``profile.py``, session 12) colocation had been predicted 2.4 % fast over 6 seeds; with
``n_s``, 1.6 %. Not applied to a P:D split's decode pool, whose workers take each turn by least
load (no fixed population per worker): there the observed concurrency was at or below ``n``.

(Session 2 fixes, measured on the emulator: the decode stall counts only the *other*
trajectories' prefills, ``(m - 1) / m``; and the capacity bound uses the fullest batch ``tau(m)``.
The first version used ``(m o / n) tau(n)`` with the Little's-law ``n``, which is inconsistent
with ``D`` by one prefill per cycle (``C_cap = C + P`` at the fixed point), so the iteration
drifted upward by ~P per round and the result depended on ``ITERATIONS``: +9 % on Qwen3-8B.)

Batch start: all B trajectories submit their first prompt at once, so the first turn also waits
for the prefills queued ahead of it on its worker (colocation, m_0 = B / N per worker) or in the
prefill pool (disaggregation, B / N_P per prefill worker); the mean wait, added once::

    W_start = max(m_0 - 1, 0) P_1 / 2,      P_1 = P(x_1, c_1)   (the first turn's prefill)

KV memory: at most m_cap = H_max / K_seq trajectories fit on a worker; if m > m_cap the rest wait
(the cycle is scaled by m / m_cap).

Disaggregation (N_P prefill workers, N_D decode workers with m = max(B_k / N_D, 1) trajectories
each; m_P = B_k / N_P trajectories per prefill worker). Its x and c are the prefill pool's
(``WorkloadProfile.prefill_pool_view``, session 11): a prefill worker holds the prompts it
prefilled but not the outputs decoded elsewhere, so it recomputes the previous turn's output::

    W      = W_closed(m_P, P, Z, c_s^2)        wait in one prefill worker's queue (below)
    Z      = C - W - P                         the rest of a trajectory's cycle (>= X + D + e)
    D      = o tau(n, L)                       no interference: decode runs alone
    C_lat  = W + P + X + D + e                 prefill path (incl. KV transfer) + decode + env
    C_P    = B_k P / N_P                       prefill path throughput bound (the pool at full use)
    C_D    = (m o / n) tau(n, L)               decode path throughput bound
    C      = max(C_lat, C_P, C_D)              the longer path dominates, env time on top of the
                                               latency path (paper: "max of the prefill and
                                               decode paths plus environment time")
    n      = clip(m D / C, 1, m)

The prefill pool's wait (session 8, measured). The router keeps a trajectory on the prefill worker
that holds its prefix unless that worker's load exceeds the least loaded one's by the affinity
slack (``pipeline.Router``), so the pool is N_P queues of about m_P trajectories each, not one
pooled queue; and each queue is fed by a *closed* population: a trajectory that waits submits
nothing else, so a long queue slows its own arrivals. ``W_closed`` is therefore exact mean value
analysis of one FCFS queue (service P, squared coefficient of variation c_s^2) with m_P customers
whose think time is Z (``closed_queue_wait``; c_s^2 of the turn mixture,
``prefill_service_scv``). Measured on the emulator (Qwen3-8B, ``paper`` workload, B = 64; 14 P:D
splits on 8-28 workers, turn groups 1-5, 70 points; the wait is a request's admission-to-first-
token span minus its prefill GPU work alone): mean |error| per turn 0.6 s for the first model (a
pooled M/M/c queue, Sakasegawa's approximation, which put the 8-prefill-worker splits at 26-28
workers 3.8-3.9 % too fast and the 11-prefill ones 1.8-2.0 %), 1.2 s for one open M/D/1 queue per
worker, 0.23 s for the closed queue (c_s^2 = 0: -0.22 s bias; c_s^2 = 1: +0.41 s; the mixture's
0.12-0.14 lies between; c_s^2 = 0.25 would fit best, 0.14 s, but it is a fit to these points, not
a measured property of the workload, so the mixture's is used). Over every split of 6 budgets x 6
paired seeds (648 runs), the median |error| of the predicted makespan went from 1.95 % to 1.37 %,
and the mean errors of the 6-12-prefill-worker splits at 24-28 workers from -1.3 .. -3.9 % to
-0.4 .. -1.8 %. With the closed queue the pool's saturation is in W (X(m_P) <= 1 / P, up to the
approximation noted in ``closed_queue_wait``), so ``C_P`` is the pool's full capacity; the first
model needed the planning
headroom ``u_max`` in ``C_P`` too (its open-queue W diverges at u = 1), which put 3P5D on 8 workers
(mid-batch u ~ 0.95) 3 % too slow. ``u_max`` stays in the feasibility check below. What is left:
colocation is predicted 1-2 % fast and the saturated splits (2 prefill workers, u_batch near 1)
~7 % fast.

Feasibility of a disaggregated split (paper Sec. 4.2):

* enough prefill capacity for the batch's token workload: the prefill pool keeps up with what the
  decode side can absorb, *over the batch*::

      u_batch = sum_s T_s B_s P_s / (N_P sum_s T_s max(C_lat, C_D)_s) <= u_max

  (``T_s`` turns in group s, ``B_s`` its survivors: the batch's prefill work over the time its
  turns take at the decode side's pace; a weighted mean of the per-stage utilisations
  ``B_s P_s / (N_P max(C_lat, C_D)_s)`` with weights ``T_s max(C_lat, C_D)_s``). Why over the
  batch and not at every stage (session 5, measured on the emulator, Qwen3-8B, ``paper``
  workload): the first version required each stage's utilisation to be <= u_max. That rejected
  3P5D on 8 workers in 8 of 8 seeds, because the mid-batch stages (58-64 trajectories still
  running, the longest prompts) reach u ~ 1.0-1.05. Yet 3P5D was the fastest allocation the
  emulator measured on all 8 seeds (1.9 % ahead of 4P4D and 4.5 % ahead of colocation, mean of 8
  paired seeds), at u_batch ~ 0.9: a transient overload builds a backlog that the slack stages
  drain, and what it costs is already in the makespan, whose cycle is bounded below by ``C_P``
  at every stage. A pool that cannot keep up over the batch stays out (1P7D on 8 workers). Slow
  splits that do keep up with their decode side pass and are left to the makespan, which ranks
  them last: 2P6D on 8 workers (586 s measured vs 426 s colocated). (1P3D on 4 workers passed
  with the first prefill model and ran under ``force_disaggregation``, 1,375 s measured against
  670 s colocated. With the closed queue (session 8) its one prefill worker's stages run at u = 1,
  ``u_batch`` exceeds ``u_max`` and it stays out, like 1P7D.) Not chosen (session 5, with the
  ``C_P = B_s P_s / (N_P u_max)`` of the first prefill model): the check against the predicted
  makespan, ``sum_s T_s B_s P_s / N_P <= u_max M_PD``, was vacuous, because that bound stretched
  ``M_PD`` until the ratio sat just under ``u_max`` for every split (0.946 at 1P7D, B = 1024).
  Modelling choice: ``u_max`` = ``policy.max_prefill_utilization`` (0.95), the planning headroom;
* KV memory: ``B * K_seq <= N_D * H_max``.
* The prefill pool holds every running conversation's prefix (session 13)::

      max_s B_s (x_s + c_s) <= N_P * H_max

  (``B_s / N_P`` conversations per prefill worker, each leaving its prompt ``x_s + c_s`` in the
  worker's prefix cache of ``H_max`` tokens). Why, measured on the emulator (the
  ``qwen3-8b-h200`` config's own workload, B = 64, 1P3D on 4 workers, 4 seeds): one prefill
  worker holds all 64 conversations, and from turn ~11 (~13K-token prompts, 57 conversations:
  740K tokens against 749K) its LRU cache evicted prefixes that were about to be reused. Each
  miss is a whole re-prefill on the one worker, the queue grows, queued prompts take more of the
  memory, and more prefixes go: on one seed the hit share fell 0.93 -> 0.78 -> 0.54 -> 0.31 ->
  0.23 over turns 11-25, prefill spans reached 30-37 s a turn, and that seed's batch took ~600 s.
  Over the 4 seeds 1P3D ran 494 s against 407 s colocated while the makespan model (which
  holds every prefix) predicted it 14 % fast and the engine chose it; 1P7D on 8 workers the
  same (364 s measured, 9 % fast). A split past the bound can run well on a lucky seed (378 s
  and 409 s on two of the four), which is why it is a feasibility bound rather than a makespan
  term: what it risks is the collapse, which a mean-value model does not predict. Modelling
  choice: a conversation's held prefix counted at its current prompt; no margin.

In-flight batch after a pool change (session 3, ``sticky_pool``). Every formula above is for a
*fresh* batch, admitted balanced over the pool. An elastic run changes the pool *mid-batch*
(PEARL: every batch starts with the borrowed training GPUs, returns them ~4 s later when the
trainer starts, and gets them back ~175 s later; grants and reclaims land anywhere). A shrink
resumes the removed workers' trajectories on the survivors by least load, so the batch is again
balanced over the smaller pool. A *growth* is not balanced: the router keeps a trajectory on the
worker that holds its prefix cache unless that worker's load exceeds the least loaded one's by
more than the affinity slack ``s`` (``pipeline.Router``), so the new workers only fill up to
within ``s`` of the old ones. With ``A`` trajectories alive on ``n_p`` placed workers (``A / n_p``
each) and the pool grown to ``N > n_p``, the balance point ``m_old - m_new = s``,
``n_p m_old + (N - n_p) m_new = A`` gives::

    m_old = min( A / n_p,  A / N + s (N - n_p) / N )      trajectories per old worker
    n_eff = A / m_old                                     (n_p <= n_eff <= N)

and the batch's slowest trajectory sits on an old worker (the most loaded), so the rest of the
batch runs like a colocated pool of ``n_eff`` workers: its rate is ``1 / M_coloc(n_eff)``; a
shrink gives ``n_eff = N``. Measured (emulator, Qwen3-8B volatile segment, batch of 64 on 4
reserved workers while the 16 borrowed GPUs are away, then 20 workers): the reserved workers keep
6 trajectories each after the borrowed GPUs return (the formula: 6.4), the returned workers get
2.4-2.6; with 16 placed workers grown to 32, ``m_old = min(4, 2 + 4 * 16/32) = 4``: the returned
GPUs get nothing for the rest of the batch (measured: none of them served a turn). Modelling
choices: ``s`` counts trajectories although the router counts requests in flight (a trajectory in
an environment step holds none; env is ~7 % of a turn on the ``paper`` workload), ``A`` is the
trajectories alive at the change, and the placement is reset by a mode switch (a P:D split's
decode pool is chosen by least load, without affinity) and by the next batch.

Modelling choices the paper leaves open, made here: M/D/1 wait for colocated prefill (prefill
chunks are near-deterministic), one closed FCFS queue per prefill worker for the pool, full
context transfer per turn, u_cap = 0.95 for colocation, ``STAGES`` = 8 and ``ITERATIONS`` = 12
(at most; iteration stops once no cycle time moves by more than 1e-4 relative in a round, from
the second round on).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pearl.core.profile import HardwareProfile, TailArrays, WorkloadProfile

STAGES = 8
ITERATIONS = 12
#: ``colocated_makespan_idle_bound`` checks every whole pool up to this size (then a geometric grid)
IDLE_BOUND_EXACT = 64.0
U_CAP_COLOCATED = 0.95

F64 = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Stages:
    """Turn groups: ``turns[s]`` turns whose per-turn means are the other arrays (shape (1, S));
    ``surv[s]`` the survival S(k) of each turn of group s (for the reach weights ``R_k``)."""

    turns: F64
    alive: F64
    x: F64
    c: F64
    o: F64
    e: F64
    surv: tuple[tuple[float, ...], ...] = ()
    #: the group's mean bilinear prefill term ``E[x (c + x / 2)]`` (``WorkloadProfile.prefill_quad``);
    #: None: from the group's mean tokens, ``x (c + x / 2)``
    q: F64 | None = None

    def path(self, wl: WorkloadProfile, batch: int) -> tuple[F64, float]:
        """(per-group turn weights, factor): the makespan is ``factor * sum(weights * C)``.
        With ``wl.tail_factor``: weights = sum of S(k) over the group (the mean trajectory),
        factor = rho (``colocated_makespan`` replaces it with rho at each pool's load,
        ``WorkloadProfile.tail_factor_at``); without: the reach weights R_k and factor 1 (module
        docstring)."""
        if wl.tail_factor is None or not self.surv:
            return self.reach(batch), 1.0
        return self.mean_path(), max(wl.tail_factor, 1.0)

    def mean_path(self) -> F64:
        """Per group: sum over its turns of S(k), the turns the mean trajectory runs in it (the
        group's turn count without a survival); shape (1, S)."""
        if not self.surv:
            return self.turns
        return np.asarray([sum(g) for g in self.surv], dtype=np.float64).reshape(1, -1)

    def reach(self, batch: int) -> F64:
        """Per group: sum over its turns of R_k = 1 - (1 - S(k))^B (expected turns of the batch's
        longest trajectory in this group); shape (1, S)."""
        if not self.surv:
            return self.turns
        r = [sum(1.0 - (1.0 - min(max(sk, 0.0), 1.0)) ** batch for sk in group) for group in self.surv]
        return np.asarray(r, dtype=np.float64).reshape(1, -1)

    @staticmethod
    def of(wl: WorkloadProfile, stages: int = STAGES) -> Stages:
        """Compress ``wl``'s turns into at most ``stages`` groups (cached per profile value)."""
        return _stages_cached(wl, stages)

    @staticmethod
    def _build(wl: WorkloadProfile, stages: int) -> Stages:
        k = wl.max_turns
        edges = np.linspace(0, k, min(stages, k) + 1).round().astype(int)
        cols: list[list[float]] = [[], [], [], [], [], []]
        groups: list[tuple[float, ...]] = []
        surv = np.asarray(wl.survival)
        arrays = [np.asarray(a, dtype=np.float64) for a in (wl.new_tokens, wl.cached_tokens, wl.output_tokens, wl.env_s)]
        quad = np.asarray(wl.prefill_quad, dtype=np.float64) if wl.prefill_quad else None
        qs: list[float] = []
        for lo, hi in itertools.pairwise(edges.tolist()):
            if hi <= lo:
                continue
            w = surv[lo:hi]
            wsum = float(w.sum())
            if wsum <= 0:
                continue
            # turns in this group, counted for the last trajectory: each turn is on its path
            cols[0].append(float(hi - lo))
            groups.append(tuple(float(v) for v in w))
            cols[1].append(wsum / (hi - lo))
            for j, a in enumerate(arrays):
                cols[2 + j].append(float((a[lo:hi] * w).sum() / wsum))
            if quad is not None:
                qs.append(float((quad[lo:hi] * w).sum() / wsum))
        t, alive, x, c, o, e = (np.asarray(col, dtype=np.float64).reshape(1, -1) for col in cols)
        q = np.asarray(qs, dtype=np.float64).reshape(1, -1) if quad is not None else None
        return Stages(t, alive, x, c, o, e, tuple(groups), q)

    def prefill(self, hw: HardwareProfile) -> F64:
        """Per group ``P = a0 + a1 x + a2 q`` (``q`` = ``x (c + x / 2)`` unless the profile
        carries the mixture's own term, ``WorkloadProfile.colocated_view``)."""
        if self.q is None:
            return _prefill(hw, self.x, self.c)
        out: F64 = hw.a0 + hw.a1 * self.x + hw.a2 * self.q
        return out


@functools.lru_cache(maxsize=64)
def _stages_cached(wl: WorkloadProfile, stages: int) -> Stages:
    return Stages._build(wl, stages)


def _tau(hw: HardwareProfile, n: F64, ctx: F64) -> F64:
    """tau(n, L) = max(b0 + b_e (1 - (1 - k/E)^n) + b2 n L, a0 + n (b1 + b3 L)) (the roofline of
    ``HardwareProfile.decode_step_s``), with (1-k/E)^n = exp(n log(1-k/E))."""
    memory = hw.b0 + n * (hw.b2 * ctx)
    if hw.experts_frac > 0:
        memory = memory + hw.b_e * -np.expm1(n * math.log1p(-hw.experts_frac))
    out: F64 = np.maximum(memory, hw.a0 + n * (hw.b1 + hw.b3 * ctx))
    return out


def _prefill(hw: HardwareProfile, x: F64, c: F64) -> F64:
    return hw.a0 + hw.a1 * x + hw.a2 * x * (c + x / 2.0)


def _first_prefill(hw: HardwareProfile, wl: WorkloadProfile) -> float:
    """P_1: prefill of the first turn (nothing cached yet)."""
    if wl.prefill_quad:
        return hw.a0 + hw.a1 * max(wl.new_tokens[0], 0.0) + hw.a2 * wl.prefill_quad[0]
    return hw.prefill_s(wl.new_tokens[0], wl.cached_tokens[0])


def _converged(prev: F64, cur: F64, rtol: float = 1e-4) -> bool:
    """Stop early once no cycle time moved by more than ``rtol`` (relative) in one round. The
    fixed points ask from their second round on (session 12): the first round's cycle can equal
    the initial guess while ``n`` has moved (no prefill: both are computed at ``n = m``).
    Checking ``n`` too in every round gave the same Table 2 and cost ~10 % of ``decide`` (0.92 ->
    1.00 ms at 32 GPUs)."""
    return bool((np.abs(cur - prev) <= rtol * cur).all())


def prefill_service_scv(hw: HardwareProfile, wl: WorkloadProfile) -> float:
    """Squared coefficient of variation of one prefill's service time, over the turn mixture::

        c_s^2 = sum_k w_k (P_k - P_bar)^2 / P_bar^2,   P_k = P(x_k, c_k),  w_k = S(k) / sum_j S(j),
        P_bar = sum_k w_k P_k

    A prefill worker's queue holds turns of every index at once (the trajectories desynchronise
    within a few turns), so the spread that matters is that between turns; within one turn index
    it is small (emulator, Qwen3-8B ``paper`` workload: c_s^2 0.01-0.03 per turn group, 0.12-0.14
    over the mixture, both measured on the requests' GPU work alone)."""
    s = np.asarray(wl.survival, dtype=np.float64)
    if s.size == 0 or s.sum() <= 0:
        return 0.0
    x = np.asarray(wl.new_tokens, dtype=np.float64)
    q = np.asarray(wl.prefill_quad, dtype=np.float64) if wl.prefill_quad else x * (np.asarray(wl.cached_tokens) + x / 2.0)
    pk = hw.a0 + hw.a1 * x + hw.a2 * q
    wk = s / s.sum()
    mean = float((wk * pk).sum())
    return float((wk * (pk - mean) ** 2).sum() / mean**2) if mean > 0 else 0.0


#: think-to-service ratios z / p of the wait table (log grid, 160 points per decade); outside it
#: the ratio is clipped (below 1e-3 the queue is saturated, above 1e4 it is empty)
_RATIO_GRID = np.geomspace(1e-3, 1e4, 1121)
_LOG_RATIO = np.log(_RATIO_GRID)


def _closed_wait_table(k_max: int, cs2: float) -> F64:
    """``T[k, j]`` = W / p with ``k`` customers and z / p = ``_RATIO_GRID[j]`` (k = 0 .. k_max):
    the exact recursion of ``closed_queue_wait`` in units of p (cached as ``_closed_wait_cells``)."""
    r = _RATIO_GRID
    h = (1.0 + cs2) / 2.0 - 1.0
    table = np.zeros((k_max + 1, r.size), dtype=np.float64)
    q = np.zeros_like(r)
    u = np.zeros_like(r)
    for k in range(1, k_max + 1):
        big_r = 1.0 + q + u * h
        x = k / (big_r + r)
        q, u = x * big_r, x
        table[k] = big_r - 1.0
    return table


@functools.lru_cache(maxsize=4)
def _closed_wait_cells(k_max: int, cs2: float) -> F64:
    """The table as bilinear cells, one gather per lookup: row ``k * (G - 1) + j`` holds
    ``(T[k, j], T[k, j+1] - T[k, j], T[k+1, j], T[k+1, j+1] - T[k+1, j])`` (k < k_max)."""
    t = _closed_wait_table(k_max, cs2)
    lo, hi = t[:-1], t[1:]
    cells = np.stack([lo[:, :-1], np.diff(lo, axis=1), hi[:, :-1], np.diff(hi, axis=1)], axis=-1)
    out: F64 = np.ascontiguousarray(cells.reshape(-1, 4))
    out.setflags(write=False)
    return out


def closed_queue_wait(m: F64, p: F64, z: F64, cs2: float) -> F64:
    """Mean wait W (s) in one prefill worker's FCFS queue fed by ``m`` trajectories (module
    docstring, "the prefill pool's wait"): mean value analysis of a closed network of one queue
    (service ``p``, squared coefficient of variation ``cs2``) and one delay station (``z``), with
    the residual-service correction for non-exponential FCFS service::

        R(k) = p + p (Q(k-1) - U(k-1)) + U(k-1) p (1 + c_s^2) / 2,   X(k) = k / (R(k) + z),
        Q(k) = X(k) R(k),  U(k) = X(k) p,                             W = R(m) - p

    for k = 1 .. m (R(1) = p, nothing queued); exact for exponential service (c_s^2 = 1, the
    machine-repairman model). With c_s^2 < 1 the correction is an approximation that lets the
    throughput X(m) exceed 1 / p slightly near saturation (R + z up to one service short of
    m p); ``C_P`` bounds the cycle there. W / p depends on m and z / p only, so the recursion runs
    once per (max m, c_s^2) on a log grid of z / p (``_closed_wait_table``, cached) and each call
    interpolates: linearly in m between floor(m) and floor(m) + 1 (``m < 1`` waits 0) and
    linearly in log(z / p). Why a table (session 8, ``make bench``): the recursion inside the
    fixed point cost ceil(max m) + 1 vectorised steps per round, 5x the decision's latency
    (B = 64: 65 steps x 12 rounds); the table's interpolation error is under 0.1 % of W
    (``tests/core/test_makespan_queue.py``); its memory is 32 k_max (G - 1) bytes, G = 1121, k_max
    the power of two above max m (B = 64: k_max = 128, 4.6 MB; at most 4 cached). The arrays
    broadcast together."""
    return _ClosedWait(m, p, cs2)(np.asarray(z, dtype=np.float64))


class _ClosedWait:
    """``closed_queue_wait`` with ``m``, ``p`` and c_s^2 fixed and ``z`` free: the fixed point of
    ``disaggregated_makespan`` calls it with a new ``z`` every round, so the table lookup in m is
    done once (flat indices into the table) and a call is ~15 small numpy operations."""

    __slots__ = ("base", "cells", "logp", "w_hi", "w_lo", "width")

    def __init__(self, m: F64, p: F64, cs2: float) -> None:
        m, p = np.broadcast_arrays(np.asarray(m, dtype=np.float64), np.asarray(p, dtype=np.float64))
        need = math.ceil(float(np.max(m))) + 1 if m.size else 2
        k_max = max(16, 1 << (need - 1).bit_length())  # a power of two: few distinct tables
        self.cells = _closed_wait_cells(k_max, round(float(cs2), 3))
        lo = np.clip(np.floor(m), 1, k_max - 1).astype(np.intp)
        self.width = _RATIO_GRID.size - 1
        self.base = lo * self.width
        fm = np.clip(m - lo, 0.0, 1.0)
        scale = np.where(m < 1.0, 0.0, p)  # W = p x (W / p); m < 1 waits 0
        self.w_lo, self.w_hi = (1.0 - fm) * scale, fm * scale  # the weights of rows floor(m), floor(m) + 1
        self.logp = np.log(np.maximum(p, 1e-300)) + _LOG_RATIO[0]

    def __call__(self, z: F64) -> F64:
        """W for think times ``z`` (a zero think time reads as the grid's smallest ratio)."""
        pos = (np.log(np.maximum(z, 1e-300)) - self.logp) * (1.0 / (_LOG_RATIO[1] - _LOG_RATIO[0]))
        pos = np.minimum(np.maximum(pos, 0.0), self.width - 1e-6)
        j = pos.astype(np.intp)  # floor: pos >= 0
        fj = pos - j
        g = self.cells[self.base + j]  # one gather: the cell's corners and slopes
        w: F64 = (g[..., 0] + fj * g[..., 1]) * self.w_lo + (g[..., 2] + fj * g[..., 3]) * self.w_hi
        return w  # >= 0: the table is, and the weights are


def colocated_makespan(hw: HardwareProfile, st: Stages, wl: WorkloadProfile, batch: int, n_workers: F64) -> F64:
    """Predicted makespan (s) for colocation on each entry of ``n_workers`` (shape (M,))."""
    nw = n_workers.reshape(-1, 1).astype(np.float64)
    bk = batch * st.alive
    m0 = np.maximum(batch / nw, 1.0)
    m = np.maximum(1.0 + (m0 - 1.0) * (bk - 1.0) / max(batch - 1.0, 1.0), 1.0)
    m_cap = max(hw.kv_capacity_tokens / max(wl.k_seq, 1.0), 1.0)
    waves = np.maximum(m / m_cap, 1.0)
    m = np.minimum(m, m_cap)
    p = st.prefill(hw)
    ctx = st.x + st.c + st.o / 2.0
    n = m.copy()
    c_cyc = p + st.o * _tau(hw, n, ctx) + st.e
    c_cap = m * p + st.o * _tau(hw, m, ctx)
    for rnd in range(ITERATIONS):
        tau = _tau(hw, 1.0 + (m - 1.0) * n / m, ctx)  # the batch a decoding trajectory sees
        u = np.minimum(m * p / c_cyc, U_CAP_COLOCATED)
        d = st.o * tau / (1.0 - u * (m - 1.0) / m)
        w = u * p / (2.0 * (1.0 - u))
        c_lat = w + p + d + st.e
        prev, c_cyc = c_cyc, np.maximum(c_lat, c_cap)
        n = 0.5 * n + 0.5 * np.minimum(np.maximum(m * d / c_cyc, 1.0), m)  # clip to [1, m]
        if rnd > 0 and _converged(prev, c_cyc):
            break
    weights, rho0 = st.path(wl, batch)
    rho = wl.tail_factor_at(batch / nw[:, 0]) if st.surv else None
    # the measured form (``Stages.path``) takes rho at each candidate pool's load
    factor: F64 | float = np.maximum(rho, 1.0) if rho is not None else rho0
    start = np.maximum(m0[:, 0] - 1.0, 0.0) * _first_prefill(hw, wl) / 2.0
    total: F64 = factor * ((weights * c_cyc * waves).sum(axis=1) + start)
    return total


def colocated_makespan_idle_bound(hw: HardwareProfile, st: Stages, wl: WorkloadProfile, batch: int,
                                  n_workers: F64) -> F64:
    """``colocated_makespan`` bounded by every smaller pool's: a colocated pool may leave workers
    idle, so ``M*(N) = min_{1 <= n <= N} M(n)`` (over every whole pool up to ``IDLE_BOUND_EXACT``
    workers, 16 pools per octave above, and ``N`` itself: exact below 64 workers). Why (session
    9): with the tail factor read at each pool's load (``WorkloadProfile.tail_factor_at``) a
    bigger pool has a larger ``rho``; where the mean trajectory has flattened out (the latency
    floor) ``rho(B/N) T_mean(N)`` can rise with ``N``, and the gates would read adding workers as
    a slowdown. On profiles fitted from telemetry the measured loads gave a decreasing curve
    (Qwen3-30B-A3B, 4-40 workers); the bound is for noisy or extrapolated tables. Only needed
    when ``wl.tail_varies_with_load`` (else ``rho`` is one number and the curve decreases by
    itself); ``decide`` applies it then. The grid's running minimum is cached per profiles and
    pool size (the runtime asks for many pool sizes between two refits)."""
    n = np.maximum(np.asarray(n_workers, dtype=np.float64).reshape(-1), 1.0)
    grid, best = _idle_bound_curve(hw, wl, batch, 1 << max(math.ceil(math.log2(float(n.max()))), 0))
    idx = np.searchsorted(grid, n, side="right") - 1  # grid[0] = 1 <= n
    out: F64 = np.minimum(best[idx], colocated_makespan(hw, st, wl, batch, n))
    return out


@functools.lru_cache(maxsize=32)
def _idle_bound_curve(hw: HardwareProfile, wl: WorkloadProfile, batch: int, top: int) -> tuple[F64, F64]:
    """(grid of pools 1..top, running minimum of the colocated makespan over it)."""
    ints = np.arange(1.0, min(float(top), IDLE_BOUND_EXACT) + 1.0)
    octaves = math.log2(max(top / IDLE_BOUND_EXACT, 1.0))
    geo = IDLE_BOUND_EXACT * 2.0 ** np.linspace(0.0, octaves, int(16 * octaves) + 1) if octaves > 0 else ints[:0]
    grid = np.unique(np.concatenate([ints, geo]))
    best = np.minimum.accumulate(colocated_makespan(hw, Stages.of(wl), wl, batch, grid))
    grid.setflags(write=False)
    best.setflags(write=False)
    return grid, best


@dataclass(frozen=True, slots=True)
class DisaggResult:
    makespan_s: F64
    prefill_ok: npt.NDArray[np.bool_]
    kv_ok: npt.NDArray[np.bool_]
    #: ``u_batch`` of each candidate (module docstring, "Feasibility"); ``prefill_ok = u_batch <= u_max``
    prefill_util: F64
    #: the prefill pool holds every running conversation's prefix (module docstring, "Feasibility")
    cache_ok: npt.NDArray[np.bool_]
    #: ``max_s B_s (x_s + c_s)``: the prefix tokens the prefill pool must hold at the fullest stage
    cache_demand: float


def disaggregated_makespan(
    hw: HardwareProfile, st: Stages, wl: WorkloadProfile, batch: int, n_prefill: F64, n_decode: F64, u_max: float
) -> DisaggResult:
    """Predicted makespan (s) and feasibility for each (N_P, N_D) pair (shape (M,))."""
    npf = n_prefill.reshape(-1, 1).astype(np.float64)
    nd = n_decode.reshape(-1, 1).astype(np.float64)
    bk = batch * st.alive
    m = np.maximum(bk / nd, 1.0)
    p = st.prefill(hw)
    xfer = hw.g0 + hw.g1 * (st.x + st.c)
    ctx = st.x + st.c + st.o / 2.0
    n = m.copy()
    c_cyc = p + xfer + st.o * _tau(hw, n, ctx) + st.e
    # the prefill pool's wait: trajectories per prefill worker B_k / N_P, service P
    prefill_wait = _ClosedWait(bk / npf, p, prefill_service_scv(hw, wl))
    c_p = bk * p / npf  # B_k P / N_P: the pool at full capacity
    fixed = p + xfer + st.e
    rest = xfer + st.e  # a turn's time away from the prefill worker, besides decode
    m_o = m * st.o
    c_lat = c_cyc
    c_d = c_cyc
    w = np.zeros_like(c_cyc)
    for rnd in range(ITERATIONS):
        tau = _tau(hw, n, ctx)
        d = st.o * tau
        z = np.maximum(c_cyc - w - p, rest + d)  # the rest of a trajectory's cycle (> 0)
        w = prefill_wait(z)
        c_lat = w + fixed + d
        c_d = m_o * tau / n
        prev, c_cyc = c_cyc, np.maximum(np.maximum(c_lat, c_d), c_p)
        n = 0.5 * n + 0.5 * np.minimum(np.maximum(m * d / c_cyc, 1.0), m)  # clip to [1, m]
        if rnd > 0 and _converged(prev, c_cyc):
            break
    kv_ok = (batch * wl.k_seq <= nd[:, 0] * hw.kv_capacity_tokens)
    held = float((bk * (st.x + st.c)).max())  # max_s B_s (x_s + c_s): the prefixes the prefill pool holds
    cache_ok = held <= npf[:, 0] * hw.kv_capacity_tokens
    start = np.maximum(batch / npf[:, 0] - 1.0, 0.0) * _first_prefill(hw, wl) / 2.0
    total: F64
    tail = wl.tail_arrays()
    if tail is not None and st.turns.size:
        total = _slowest_path_disagg(hw, st, tail, w, n, c_lat, c_cyc) + start
    else:
        weights, factor = st.path(wl, batch)
        total = factor * ((weights * c_cyc).sum(axis=1) + start)
    # batch-level prefill utilisation against the decode side's pace (module docstring, "Feasibility")
    u_batch = (st.turns * bk * p).sum(axis=1) / (npf[:, 0] * (st.turns * np.maximum(c_lat, c_d)).sum(axis=1))
    prefill_ok = u_batch <= u_max
    return DisaggResult(total, prefill_ok, kv_ok, u_batch, cache_ok, held)


def _slowest_path_disagg(hw: HardwareProfile, st: Stages, tail: TailArrays,
                         w: F64, n: F64, c_lat: F64, c_cyc: F64) -> F64:
    """``sum_w omega_w max_{j in w} sum_k T_jk`` over the kept windows' slowest trajectories ``j``
    (module docstring; ``profile._blend_tail_windows``), per candidate; ``w``, ``n``, ``c_lat``,
    ``c_cyc`` are the per-stage states, shape (M, S). Turn k of a path runs in the stage the batch
    front has reached when the turn starts. Every path of every window advances together: arrays
    (paths, candidates), longest path first (``WorkloadProfile.tail_arrays``), so that turn k
    updates the leading rows still on their paths."""
    m_cand, n_stages = w.shape
    rows = np.arange(m_cand)
    front_end = np.cumsum(st.turns * c_cyc, axis=1)  # E_s, (M, S)
    stretch = c_cyc / c_lat
    x, c, o, e = (tail.turns[:, :, j] for j in range(4))  # (P, K) each
    fixed = _prefill(hw, x, c) + hw.g0 + hw.g1 * (x + c) + e
    ctx = x + c + o / 2.0
    t = np.zeros((x.shape[0], m_cand), dtype=np.float64)
    # flat (candidate, stage) index of each path's current stage; a path's time only grows, so its
    # stage only advances: s = #{s' : E_s' < t}, clipped to the last stage (whose end reads as +inf)
    fe = front_end.copy()
    fe[:, -1] = np.inf
    fe, nf, wf, sf = fe.ravel(), n.ravel(), w.ravel(), stretch.ravel()
    idx = np.broadcast_to((rows * n_stages)[None, :], t.shape).copy()
    for k, lv in enumerate(tail.n_live):
        ix, tk = idx[:lv], t[:lv]
        for _ in range(n_stages):
            adv = fe[ix] < tk
            if not adv.any():
                break
            ix += adv
        tau = _tau(hw, nf[ix], ctx[:lv, k : k + 1])
        tk += (wf[ix] + fixed[:lv, k : k + 1] + o[:lv, k : k + 1] * tau) * sf[ix]
    by_path = t[tail.rows]
    total = np.zeros(m_cand, dtype=np.float64)
    i = 0
    for weight, count in tail.windows:
        total = total + weight * by_path[i : i + count].max(axis=0)
        i += count
    return total


def compose_makespan(schedule: Sequence[tuple[float, float]]) -> float:
    """Makespan of a batch served by a sequence of allocations: ``schedule`` = ``(t_i, M_i)``,
    the offset from the batch's start at which the allocation with (fresh-batch or placed)
    makespan ``M_i`` takes over (``t_0 = 0``, increasing); the last one holds until the end. The
    batch progresses at ``1 / M_i`` while allocation i is in force::

        M_hat = t_j + (1 - sum_{i<j} (t_{i+1} - t_i) / M_i) M_j    (j: where progress reaches 1)

    Modelling choice: progress is linear in time within an allocation (a batch's tail is slower
    per trajectory, so this is an approximation). For the runtime: at a batch's start the borrow /
    return schedule is known (the overlap GPUs return when the trainer starts, come back after
    its step), so a batch-start prediction can compose it with ``sticky_pool`` for the return."""
    if not schedule:
        raise ValueError("compose_makespan: empty schedule; give at least (0, M_0)")
    prog = 0.0
    for (t, m), (t_next, _m) in itertools.pairwise(schedule):
        if m <= 0 or t_next < t:
            raise ValueError(f"compose_makespan: bad segment (t={t}, M={m}, next t={t_next}): "
                             "need M > 0 and increasing offsets")
        if prog + (t_next - t) / m >= 1.0:
            return t + (1.0 - prog) * m
        prog += (t_next - t) / m
    t, m = schedule[-1]
    if m <= 0:
        raise ValueError(f"compose_makespan: bad segment (t={t}, M={m}): need M > 0")
    return t + (1.0 - prog) * m


def batch_progress(schedule: Sequence[tuple[float, float]], t: float) -> float:
    """Share of a batch done by offset ``t`` under ``schedule`` (``(t_i, M_i)`` as in
    ``compose_makespan``, the last allocation holding on), at ``1 / M_i`` within each::

        p(t) = sum_i max(min(t_{i+1}, t) - t_i, 0) / M_i

    Not capped at 1 (an overrun reads > 1). An allocation whose ``M_i`` is not a positive finite
    number (no decision) adds nothing. The runtime's borrow gate reads its remaining time from it
    (``ElasticScheduler.remaining_s``), and the batch-start prediction its replay of that gate."""
    prog = 0.0
    for (t0, m0), (t1, _m1) in itertools.pairwise([*schedule, (math.inf, 0.0)]):
        if math.isfinite(m0) and m0 > 0:
            prog += max(min(t1, t) - t0, 0.0) / m0
    return prog


def sync_stall_s(hw: HardwareProfile, wl: WorkloadProfile, batch: int, progress: float, per_worker_div: float,
                 pause_s: float, disaggregated: bool = False) -> float:
    """Delay a weight sync adds to the slowest trajectory of a batch it lands in (session 10).

    A sync after a training step (``PipelineScheduler.sync_weights``) pauses dispatch, aborts every
    request in flight and loads the new weights, which flushes the prefix caches. Each trajectory
    alive then pays one extra prefill: one caught decoding (share ``f`` of a turn) resumes with its
    whole context re-prefilled, one in its prefill or environment step finds its cache empty at
    its next turn. At the batch stage ``s`` the sync lands in (``progress`` of the batch, read on
    the mean trajectory's turns), with ``m`` trajectories per worker::

        E_s   = f P(L_s, 0) + (1 - f) (P(x_s + c_s, 0) - P(x_s, c_s))   extra prefill per trajectory
        f     = o_s tau(m, L_s) / (P(x_s, c_s) + o_s tau(m, L_s) + e_s)  share of a turn decoding
        Delta = pause + m E_s                       colocated: prefill runs ahead of decode, so the
                                                    slowest trajectory waits out its worker's burst
        Delta = pause + (m + 1) / 2 E_s             disaggregated: its re-prefill queues in the
                                                    middle of its prefill worker's burst

    ``m = max(B_s / per_worker_div, 1)`` (``per_worker_div``: the colocated pool, or the prefill
    pool), ``L_s = x_s + c_s + o_s / 2``, ``pause`` the measured pause (EMA of
    ``sync_weights`` spans). Measured on the emulator (16 fixed colocated workers, ``paper``
    workload, B = 64, one hour of the volatile segment with the trainer: 13 / 11 batches, against
    the same run with the sync skipped): the sync cost 5.4 s per batch on Qwen3-30B-A3B and 6.7 s
    on Qwen3-8B (2.0 / 2.1 % of the makespan); this formula gives 6.1 s (the sync at ~74 % of
    the batch) and 6.6 s (~50 %) on the profiles those runs fitted.
    Modelling choices: the burst is charged whole to the slowest trajectory (colocated), the
    stage is read by turns, not time, and the stall is not stretched by the tail factor."""
    st = Stages.of(wl)
    w = st.mean_path()[0]
    if w.size == 0 or float(w.sum()) <= 0:
        return max(pause_s, 0.0)
    cum = np.cumsum(w) / float(w.sum())
    s = int(min(np.searchsorted(cum, min(max(progress, 0.0), 1.0)), w.size - 1))
    x, c, o, e = (float(a[0, s]) for a in (st.x, st.c, st.o, st.e))
    m = max(batch * float(st.alive[0, s]) / max(per_worker_div, 1e-9), 1.0)
    ctx = x + c + o / 2.0
    p = hw.prefill_s(x, c)
    dec = o * hw.decode_step_s(m, ctx)
    f = dec / max(p + dec + e, 1e-9)
    extra = f * hw.prefill_s(ctx, 0.0) + (1.0 - f) * max(hw.prefill_s(x + c, 0.0) - p, 0.0)
    share = (m + 1.0) / 2.0 if disaggregated else m
    return max(pause_s, 0.0) + share * extra


def sticky_pool(alive: float, n_placed: float, n_workers: float, slack: float) -> float:
    """Effective colocated pool ``n_eff`` of an in-flight batch whose ``alive`` trajectories sit
    balanced on ``n_placed`` workers when the pool becomes ``n_workers`` (module docstring,
    "In-flight batch after a pool change"): ``n_workers`` on a shrink, else ``alive / m_old`` with
    ``m_old = min(alive / n_placed, alive / N + slack (N - n_placed) / N)``."""
    if n_workers <= 0 or alive <= 0:
        return float(max(n_workers, 0))
    if n_placed <= 0 or n_workers <= n_placed:
        return float(n_workers)
    m_old = min(alive / n_placed, alive / n_workers + max(slack, 0.0) * (n_workers - n_placed) / n_workers)
    return float(min(max(alive / m_old, n_placed), n_workers))
