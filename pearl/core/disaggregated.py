"""The disaggregated makespan: ``N_P`` prefill workers and ``N_D`` decode workers (a P:D split).

The split reads the prefill pool's view of the profile (``workload.prefill_pool_tokens``: a
prefill worker holds the prompts it prefilled, not the outputs decoded elsewhere). Per turn group
``s`` (``stages.Stages``), ``m = max(B_s / N_D, 1)`` trajectories per decode worker, of which at
most ``n_hi = min(m, m_cap)`` decode at once (``m_cap = max(H_max / K_seq, 1)``, ``stages.kv_slots``:
a decoding request holds its KV until its turn ends; the others wait for room), ``m_P = B_s /
N_P`` per prefill worker, ``P = P(x_s, c_s)``, ``X = X(x_s + c_s)`` (the whole context moves: the
decode worker needs every KV entry of the prompt), ``L = x + c + o / 2``; a fixed point in ``n``
and ``W`` (``C`` follows from them; solved as in "The iteration" below)::

    W      = W_closed(m_P, P, Z, c_s^2)        wait in one prefill worker's queue (``queueing``)
    Z      = max(C - W - P, X + D + e)         the rest of a trajectory's cycle
    n_s    = 1 + (m - 1) n / m                 the decode batch a decoding trajectory sees
    D      = o tau(n_s, L)                     decode runs alone: no interference
    C_lat  = W + P + X + D + e                 prefill path (with the transfer) + decode + env
    C_P    = B_s P / N_P                       the prefill pool at full capacity
    C_D    = (m o / n) tau(n, L)               the decode pool's throughput bound
    C      = max(C_lat, C_P, C_D)
    n      = clip(m D / C, 1, n_hi)

``n`` is the mean number of the worker's ``m`` trajectories decoding (Little's law), at most the
``n_hi`` its KV memory holds: past it the throughput bound ``C_D`` at ``n = n_hi`` sets the cycle,
and a turn waits for KV room as long as that bound exceeds its own path (a split past
``B K_seq <= N_D H_max`` is infeasible, below; ``n_hi`` makes its recorded prediction what such a
pool runs). A decoding
trajectory sees itself and each of the other ``m - 1`` decoding with probability ``n / m`` (the
inspection paradox, as in ``colocated``): its step runs at ``n_s >= n``. The pool's throughput
bound runs at the mean ``n``. Measured on the requests' time-weighted decode concurrency
(``TelemetryRecord.decode_concurrency``): Qwen3-8B 8P18D on 26 workers sees 2.2-2.8 sequences
where ``n`` is 2.0-2.5 (``make predictor-check``).

The iteration. Per candidate and group, each round evaluates the equations above at ``(n, W)``,
from ``n = n_hi``, ``W = 0``, which gives ``g = clip(m D / C, 1, n_hi)`` and ``W' = W_closed(m_P, P, Z,
c_s^2)``, and steps both unknowns::

    n <- clip(n + (g - n) / (1 - s), 1, n_hi) secant: s = (g - g_prev) / (n - n_prev) in [-50, 0.95]
                                             (s = 0 in the first round: the plain step)
    W <- max(W + (W' - W) / (1 - phi), 0)    Newton: phi = dW'/dW = -dW_closed/dZ where a throughput
                                             bound sets Z = C - W - P, else 0; phi <= 0.95

``dW_closed/dZ`` is the wait table's cell slope (``queueing.ClosedWait.with_slope``). Near a
saturated prefill queue ``phi`` nears 1 (a longer wait shortens the think time as much), where the
plain map ``W <- W'`` creeps and ``n <- (n + g) / 2`` halves its distance per round at best. The
rounds stop once every candidate's and group's steps, the estimates of their distance to the fixed
point, are within ``stages.TOLERANCE`` (``n`` relative to ``n``, ``W`` to ``C``), and the state is the
equations evaluated at the last ``(n, W)``; after ``stages.ROUNDS`` rounds a candidate still
farther is reported (``DisaggResult.converged``). Checked against thousands of plain damped rounds
at 2-40 workers (``tests/core/test_fixed_point.py``).

Batch start: every trajectory submits its first prompt at once, ``B / N_P`` per prefill worker::

    W_start = max(B / N_P - 1, 0) P_1 / 2

The makespan. While the profile holds no slowest paths, the stage sum of ``stages.Stages.path``::

    M_PD = f (sum_s w_s C_s + W_start)         (f = rho with a measured tail factor, else 1)

Once it holds the slowest observed trajectories ``j`` of the last windows (``tail_paths``,
``tail_history``; restated for the prefill pool, ``workload.prefill_pool_windows``), each path runs
through the split's per-stage state and ``W_start`` is added once::

    M_PD = sum_w omega_w max_{j in w} sum_{k <= K_j} T_jk + W_start
    T_jk = (W_s + P(x_jk, c_jk) + X(x_jk + c_jk) + o_jk tau(n_s, L_jk) + e_jk) C_s / C_lat,s

with ``omega_w`` the windows' EMA weights (``WorkloadProfile.tail_windows``) and ``s = s(t_jk)``
the stage the batch front is in when turn k *starts*, ``t_jk = sum_{i<k} T_ji``: the first stage
whose end ``E_s = sum_{s' <= s} T_s' C_s'`` is at or after ``t_jk`` (the last stage past the
front's end). A slow path lags the batch, so its late turns run with fewer trajectories left than
the turn number says. ``C_s / C_lat,s`` stretches a turn when a throughput bound sets the cycle.

Feasibility (``DisaggResult``):

* prefill capacity over the batch, against the decode side's pace::

      u_batch = sum_s T_s B_s P_s / (N_P sum_s T_s max(C_lat, C_D)_s) <= u_max

  (a transient overload in mid-batch stages builds a backlog the slack stages drain, and what it
  costs is already in the makespan, whose cycle is bounded below by ``C_P``; a pool that cannot
  keep up over the batch stays out);
* KV memory: ``B K_seq <= N_D H_max``;
* the prefill pool holds every running conversation's prefix: ``max_s B_s (x_s + c_s) <= N_P
  H_max`` (past it, an LRU prefix cache evicts prefixes about to be reused, each miss re-prefills a
  whole prompt on the pool, and the queue collapses: a risk a mean-value makespan does not
  predict, so it is a bound, not a term).

Modelling choices: one closed FCFS queue per prefill worker, the whole context transferred per
turn, ``u_max`` = ``policy.max_prefill_utilization``, the slowest ``profile.TAIL_PATHS`` paths of
each of ``TAIL_WINDOWS`` windows. Measure with ``make predictor-check``.

Evaluation: every candidate of a budget in one pass (arrays candidates x groups), with two exact
reductions, checked against the term-by-term evaluation (``makespan_reference``, relative 1e-9):

* the decode step on its memory branch, ``tau(n, L) = b0 + b_e f_E(n) + b2 n L``, wherever it is
  memory-bound over the whole range the batch can use, ``1 <= n <= B`` at every stage's and every
  slowest path's context: ``memory - compute = (b0 - a0) + b_e f_E(n) + n (b2 L - b1 - b3 L)`` is
  concave in ``n`` (``f_E`` is, ``b_e >= 0``), so checking ``n = 1`` and ``n = B`` decides it
  (``_memory_bound``);
* pools at least the batch behave alike: with ``N_D >= B`` every stage has ``m = 1``, with
  ``N_P >= B`` every stage has ``m_P <= 1`` (no queue, ``W = 0``) and ``C_P = B_s P / N_P <= P <
  C_lat`` does not bind, so the fixed point and the slowest paths run once per distinct
  ``(min(N_P, B), min(N_D, B))`` and the per-candidate terms (``W_start``, ``u_batch``, the
  memory bounds) are taken at the candidate's own pools. At 2048 workers and a batch of 64 that
  is ~130 evaluations instead of ~2,300.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pearl.core.hardware import HardwareProfile, decode_memory_bound, memory_fixed
from pearl.core.queueing import ClosedWait, prefill_service_scv
from pearl.core.stages import (
    F64,
    ROUNDS,
    SLOPE_MAX,
    TOLERANCE,
    Stages,
    distance,
    kv_slots,
    pool_tail,
    secant_step,
    stages,
)
from pearl.core.telemetry import Mode
from pearl.core.workload import TailArrays, WorkloadProfile


@dataclass(frozen=True, slots=True)
class DisaggResult:
    """Per candidate (shape (M,)): the predicted makespan and the feasibility bounds (module
    docstring)."""

    makespan_s: F64
    prefill_ok: npt.NDArray[np.bool_]
    kv_ok: npt.NDArray[np.bool_]
    #: ``u_batch`` of each candidate; ``prefill_ok = u_batch <= u_max``
    prefill_util: F64
    #: the prefill pool holds every running conversation's prefix
    cache_ok: npt.NDArray[np.bool_]
    #: ``max_s B_s (x_s + c_s)``: the prefix tokens the prefill pool must hold at the fullest stage
    cache_demand: float
    #: every stage's fixed point within ``stages.TOLERANCE`` (module docstring, "The iteration")
    converged: npt.NDArray[np.bool_]


def disaggregated_makespan(
    hw: HardwareProfile, wl: WorkloadProfile, batch: int, n_prefill: F64, n_decode: F64, u_max: float
) -> DisaggResult:
    """Predicted makespan (s) and feasibility for each (N_P, N_D) pair (shape (M,)); applies the
    prefill pool's view of ``wl`` (module docstring)."""
    st = stages(wl, Mode.DISAGGREGATED)
    npf_all = np.asarray(n_prefill, dtype=np.float64).reshape(-1, 1)
    nd_all = np.asarray(n_decode, dtype=np.float64).reshape(-1, 1)
    cap = max(float(batch), 1.0)
    inv: npt.NDArray[np.intp] | None = None
    npf, nd = npf_all, nd_all
    if npf_all.size and (float(npf_all.max()) > cap or float(nd_all.max()) > cap):
        keys = np.concatenate([np.minimum(npf_all, cap), np.minimum(nd_all, cap)], axis=1)
        uniq, inv = np.unique(keys, axis=0, return_inverse=True)
        npf, nd = uniq[:, :1], uniq[:, 1:]
        inv = inv.reshape(-1)
    terms = _stage_terms(hw, wl, batch)
    w, n, c_lat, c_cyc, c_d, within = _fixed_point(st, terms, npf, nd)
    converged = np.asarray(within.all(axis=1), dtype=np.bool_)
    tail = pool_tail(wl)
    paths = tail is not None and bool(st.turns.size)
    if tail is not None and paths:
        per = _slowest_path(hw, wl, st, tail, w, n, c_lat, c_cyc, _memory_bound(hw, wl, batch))
        factor = 1.0
    else:
        weights, factor = st.path(wl, batch)
        per = (weights * c_cyc).sum(axis=1)
    pace = (st.turns * np.maximum(c_lat, c_d)).sum(axis=1)
    if inv is not None:
        per, pace, converged = per[inv], pace[inv], converged[inv]
    start = np.maximum(batch / npf_all[:, 0] - 1.0, 0.0) * terms.half_first_prefill
    total: F64 = per + start if paths else factor * (per + start)
    kv_ok = (batch * wl.k_seq <= nd_all[:, 0] * hw.kv_capacity_tokens)
    held = terms.held
    cache_ok = held <= npf_all[:, 0] * hw.kv_capacity_tokens
    u_batch = terms.prefill_work / (npf_all[:, 0] * pace)
    return DisaggResult(total, u_batch <= u_max, kv_ok, u_batch, cache_ok, held, converged)


@dataclass(frozen=True, slots=True)
class _StageTerms:
    """What the fixed point and the bounds read that does not depend on the candidate, per stage
    (shape (1, S)): ``B_s``, ``P``, ``X``, ``L``, the decode slopes, ``P + X + e``, ``X + e``; and
    ``sum_s T_s B_s P_s``, ``max_s B_s (x_s + c_s)``, ``P_1 / 2``, c_s^2, the memory-branch flag."""

    bk: F64
    p: F64
    xfer: F64
    ctx: F64
    slopes: tuple[F64, F64]
    fixed: F64
    rest: F64
    prefill_work: float
    held: float
    half_first_prefill: float
    scv: float
    memory: bool
    #: ``m_cap``: the trajectories one decode worker's KV memory holds at once (``stages.kv_slots``)
    m_cap: float
    hw: HardwareProfile


@functools.lru_cache(maxsize=64)
def _stage_terms(hw: HardwareProfile, wl: WorkloadProfile, batch: int) -> _StageTerms:
    """``_StageTerms`` of the prefill pool's stages (cached per profiles and batch)."""
    st = stages(wl, Mode.DISAGGREGATED)
    bk = batch * st.alive
    p = st.prefill(hw)
    xfer = hw.transfer_s(st.x + st.c)
    ctx = st.x + st.c + st.o / 2.0
    out = _StageTerms(
        bk, p, xfer, ctx, hw.decode_slopes(ctx), p + xfer + st.e, xfer + st.e,
        float((st.turns * bk * p).sum()), float((bk * (st.x + st.c)).max()) if st.x.size else 0.0,
        float(st.first_prefill(hw)) / 2.0, prefill_service_scv(hw, wl), _memory_bound(hw, wl, batch),
        kv_slots(hw, wl), hw)
    for a in (bk, p, xfer, ctx, *out.slopes, out.fixed, out.rest):
        a.setflags(write=False)
    return out


@functools.lru_cache(maxsize=64)
def _memory_bound(hw: HardwareProfile, wl: WorkloadProfile, batch: int) -> bool:
    """Whether ``tau(n, L)`` is on the roofline's memory branch for every ``1 <= n <= B`` at every
    stage's context and every live slowest-path turn's (module docstring, "Evaluation")."""
    st = stages(wl, Mode.DISAGGREGATED)
    ctx = [(st.x + st.c + st.o / 2.0).reshape(-1)] + [turn[2].reshape(-1) for turn in _path_turns(hw, wl)]
    return decode_memory_bound(hw, np.concatenate(ctx), float(batch))


def _fixed_point(st: Stages, terms: _StageTerms, npf: F64, nd: F64, rounds: int = ROUNDS
                 ) -> tuple[F64, F64, F64, F64, F64, npt.NDArray[np.bool_]]:
    """The fixed point of the module docstring per candidate and stage: ``(W, n_s, C_lat, C, C_D)``,
    shape (M, S) each (``n_s``: the decode batch a decoding trajectory sees), and whether each came
    within ``stages.TOLERANCE`` (module docstring, "The iteration"). A (candidate, stage) that has
    is held from then on, so that its state does not depend on the other candidates evaluated with
    it."""
    hw, bk, ctx, slopes = terms.hw, terms.bk, terms.ctx, terms.slopes
    m = np.maximum(bk / nd, 1.0)
    prefill_wait = ClosedWait(bk / npf, terms.p, terms.scv)
    c_p = bk * terms.p / npf  # B_s P / N_P: the pool at full capacity
    shape = c_p.shape

    def full(a: F64) -> F64:  # the loop's operands at one shape: a broadcast costs more than the arithmetic
        out = np.empty(shape)
        out[...] = a  # ~0.5 us, np.broadcast_to(a, shape).copy() ~3 us
        return out

    # rest = X + e, a turn's time away from the prefill worker besides decode; fixed = P + X + e
    p, o, rest, fixed, m = full(terms.p), full(st.o), full(terms.rest), full(terms.fixed), full(m)
    n_hi = np.minimum(m, terms.m_cap)  # the decode concurrency the worker's KV memory holds
    m_o = m * o
    others = (m - 1.0) / m  # the share of a worker's m trajectories that are not this one
    one, slope_floor = np.ones(shape), np.full(shape, -SLOPE_MAX)
    both = np.empty((2, *shape))  # (n, n_s): the decode step at both in one evaluation
    n, n_s = both[0], both[1]
    n[...] = n_hi
    if terms.memory:
        fixed_s, kv = memory_fixed(hw), np.empty(both.shape)
        kv[...] = slopes[0]

        def tau_at(nn: F64) -> F64:
            out: F64 = fixed_s(nn) + nn * kv
            return out
    else:
        def tau_at(nn: F64) -> F64:
            out: F64 = hw.decode_step_s(nn, ctx, slopes)
            return out
    w = np.zeros(shape)
    done = np.zeros(shape, dtype=bool)  # within TOLERANCE: held from then on
    n_prev: F64 | None = None
    g_prev: F64 | None = None
    for _ in range(rounds):
        np.multiply(others, n, out=n_s)
        np.add(n_s, one, out=n_s)
        tau = tau_at(both)
        d = o * tau[1]  # at the batch a decoding trajectory sees
        c_d = m_o * tau[0] / n
        bound = np.maximum(c_d, c_p)  # the throughput bounds
        z_min = rest + d
        z_bound = bound - p - w  # Z where a bound sets the cycle: C - W - P
        w_new, dw_dz = prefill_wait.with_slope(np.maximum(z_bound, z_min))
        c_lat = w_new + fixed + d
        c_cyc = np.maximum(c_lat, bound)
        g = np.minimum(np.maximum(m * d / c_cyc, one), n_hi)
        # Newton on W - W_closed(Z(W)): dZ/dW = -1 where a bound sets Z, else 0 (dW/dz <= 0)
        lean = np.maximum(dw_dz, slope_floor)
        np.putmask(lean, z_bound <= z_min, 0.0)
        step_w = (w_new - w) / (one + lean)
        step_n = secant_step(n, g, n_prev, g_prev)
        done |= distance(step_n, n, step_w, c_cyc) <= TOLERANCE
        if np.count_nonzero(done) == done.size:
            break
        np.putmask(step_w, done, 0.0)
        np.putmask(step_n, done, 0.0)
        w = np.maximum(w + step_w, 0.0)
        n_prev, g_prev = n.copy(), g
        n += step_n
        np.minimum(np.maximum(n, one, out=n), n_hi, out=n)
    return w_new, n_s, c_lat, c_cyc, c_d, done


@functools.lru_cache(maxsize=64)
def _path_turns(hw: HardwareProfile, wl: WorkloadProfile) -> tuple[tuple[int, F64, F64, F64, F64, F64], ...]:
    """Per turn k of the slowest paths, what does not depend on the candidate, for the rows still
    on their paths (shape (live rows, 1) each): ``(rows, P + X + e, L, b2 L, b1 + b3 L, o)`` with
    ``L = x + c + o / 2`` (cached per profiles: the decision asks for it at every evaluation)."""
    tail = pool_tail(wl)
    if tail is None:
        return ()
    x, c, o, e = (tail.turns[:, :, j] for j in range(4))  # (P, K) each
    fixed = hw.prefill_s(x, c) + hw.transfer_s(x + c) + e
    ctx = x + c + o / 2.0
    kv, cp = hw.decode_slopes(ctx)  # (P, K) each
    out: list[tuple[int, F64, F64, F64, F64, F64]] = []
    for k, lv in enumerate(tail.n_live):
        f_k, l_k, kv_k, cp_k, o_k = (np.ascontiguousarray(a[:lv, k : k + 1]) for a in (fixed, ctx, kv, cp, o))
        for col in (f_k, l_k, kv_k, cp_k, o_k):
            col.setflags(write=False)
        out.append((lv, f_k, l_k, kv_k, cp_k, o_k))
    return tuple(out)


@functools.lru_cache(maxsize=64)
def _path_weights(hw: HardwareProfile, wl: WorkloadProfile) -> tuple[F64, ...]:
    """Per turn k of the slowest paths, for the memory branch: ``(1, P + X + e, o, o b2 L)`` of the
    rows still on their paths, shape (live rows, 4, 1): the turn's time is this vector's product
    with the stage's ``(C/C_lat W, C/C_lat, C/C_lat F_s, C/C_lat n)`` (``_slowest_path``; cached)."""
    out: list[F64] = []
    for lv, fixed, _ctx, kv, _cp, o in _path_turns(hw, wl):
        vec = np.stack([np.ones(lv), fixed[:, 0], o[:, 0], (o * kv)[:, 0]], axis=1)[:, :, None]
        vec.setflags(write=False)
        out.append(vec)
    return tuple(out)


def _slowest_path(hw: HardwareProfile, wl: WorkloadProfile, st: Stages, tail: TailArrays,
                  w: F64, n: F64, c_lat: F64, c_cyc: F64, memory_bound: bool) -> F64:
    """``sum_w omega_w max_{j in w} sum_k T_jk`` over the kept windows' slowest trajectories ``j``
    (module docstring), per candidate; ``tail`` is ``pool_tail(wl)``; ``w``, ``n``, ``c_lat``,
    ``c_cyc`` are the per-stage states, shape (M, S). Every path of every window advances together:
    arrays (paths, candidates), longest path first (``workload.TailArrays``), so that turn k
    updates the leading rows still on their paths. With ``memory_bound`` the step is ``tau = F_s +
    n_s b2 L`` with ``F_s = b0 + b_e f_E(n_s)`` held per stage (``_memory_bound``), and a turn's
    time ``(W_s + P + X + e + o tau) C_s / C_lat,s`` is one product of the stage's vector with the
    turn's (``_path_weights``)."""
    m_cand, n_stages = w.shape
    rows = np.arange(m_cand)
    front_end = np.cumsum(st.turns * c_cyc, axis=1)  # E_s, (M, S)
    stretch = c_cyc / c_lat
    t = np.zeros((tail.turns.shape[0], m_cand), dtype=np.float64)
    # flat (candidate, stage) index of each path's current stage; a path's time only grows, so its
    # stage only advances: s = #{s' : E_s' < t}, clipped to the last stage (whose end reads as +inf)
    fe = front_end.copy()
    fe[:, -1] = np.inf
    fe, nf, wf, sf = fe.ravel(), n.ravel(), w.ravel(), stretch.ravel()
    if memory_bound:  # per (candidate, stage): the vector the turn's weights multiply
        state = np.stack((sf * wf, sf, sf * memory_fixed(hw)(nf), sf * nf), axis=1)
    elif hw.experts_frac > 0.0:
        state = np.stack((nf, wf, sf, hw.decode_experts_s(nf)), axis=1)
    else:
        state = np.stack((nf, wf, sf), axis=1)
    idx = np.broadcast_to((rows * n_stages)[None, :], t.shape).copy()
    # each path's current stage's E_s and state, shape (paths, candidates) and (paths, candidates,
    # columns): gathered once, then again only where a stage advanced (a path changes stage a few
    # times in a batch)
    held_fe, held = fe[idx], state.take(idx, axis=0)
    flat_idx, flat_fe, flat_held = idx.reshape(-1), held_fe.reshape(-1), held.reshape(-1, state.shape[1])
    weights = _path_weights(hw, wl) if memory_bound else None
    live = -1
    for k, (lv, fixed, ctx, kv, cp, o) in enumerate(_path_turns(hw, wl)):
        if lv != live:  # the leading rows still on their paths: views, written through
            live = lv
            ix, tk, bound, now = idx[:lv], t[:lv], held_fe[:lv], held[:lv]
        for _ in range(n_stages):
            adv = bound < tk
            moved_n = np.count_nonzero(adv)
            if not moved_n:
                break
            ix += adv
            if moved_n * 8 < adv.size:
                moved = np.flatnonzero(adv)  # flat positions: the leading rows are a prefix of the arrays
                at = flat_idx[moved]
                flat_fe[moved] = fe[at]
                flat_held[moved] = state.take(at, axis=0)
            else:
                bound[...] = fe[ix]
                now[...] = state.take(ix, axis=0)
        if weights is not None:
            tk += (now @ weights[k])[:, :, 0]
        else:
            n_at, w_at, s_at = now[:, :, 0], now[:, :, 1], now[:, :, 2]
            tau = hw.decode_step_s(n_at, ctx, (kv, cp), now[:, :, 3] if now.shape[2] > 3 else None)
            tk += (w_at + fixed + o * tau) * s_at
    by_path = t[tail.rows]
    total = np.zeros(m_cand, dtype=np.float64)
    i = 0
    for weight, count in tail.windows:
        total = total + weight * by_path[i : i + count].max(axis=0)
        i += count
    return total
