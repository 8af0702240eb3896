"""The reference evaluation of a budget's P:D splits, term by term (``reference_table``).

``disaggregated.disaggregated_makespan`` evaluates the model of the ``disaggregated`` module
docstring over every candidate at once, with two exact reductions (a decode step on the
roofline's memory branch wherever the whole batch range is memory-bound; candidates whose pools
are at least the batch evaluated once). This module evaluates the same equations without either:
every candidate, the decode step as the roofline's ``max`` of both branches at every use, solved
by the same iteration (``disaggregated`` module docstring, "The iteration": each candidate and
group is held once within ``stages.TOLERANCE``, so its rounds do not depend on the others). It is
the yardstick of the fast evaluation: ``tests/core/test_fast_evaluation.py`` asserts that both
give the same predictions (relative 1e-9) and the same feasibility over many budgets and fitted
profiles, and ``benchmarks/bench_decision.py`` (``make bench``) times ``decide`` + ``plan`` on both
in one run. The equations, symbols and modelling choices: ``disaggregated`` module docstring.
"""

from __future__ import annotations

import functools

import numpy as np

from pearl.core.decision import CandidateTable, DecisionPolicy, evaluate_table
from pearl.core.disaggregated import DisaggResult
from pearl.core.hardware import HardwareProfile
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


def reference_table(
    n_workers: int, batch: int, hw: HardwareProfile, wl: WorkloadProfile, policy: DecisionPolicy,
    coloc_workers: float | None = None,
) -> CandidateTable:
    """``decision.evaluate_table`` with the splits evaluated by ``reference_disaggregated_makespan``
    (a ``decision.TableFn``: ``decide(..., evaluator=reference_table)``)."""
    return evaluate_table(n_workers, batch, hw, wl, policy, coloc_workers, reference_disaggregated_makespan)


def reference_disaggregated_makespan(
    hw: HardwareProfile, wl: WorkloadProfile, batch: int, n_prefill: F64, n_decode: F64, u_max: float
) -> DisaggResult:
    """Predicted makespan (s) and feasibility for each (N_P, N_D) pair (shape (M,)); applies the
    prefill pool's view of ``wl`` (module docstring)."""
    st = stages(wl, Mode.DISAGGREGATED)
    npf = n_prefill.reshape(-1, 1).astype(np.float64)
    nd = n_decode.reshape(-1, 1).astype(np.float64)
    bk = batch * st.alive
    m = np.maximum(bk / nd, 1.0)
    p = st.prefill(hw)
    xfer = hw.transfer_s(st.x + st.c)
    ctx = st.x + st.c + st.o / 2.0
    slopes = hw.decode_slopes(ctx)
    prefill_wait = ClosedWait(bk / npf, p, prefill_service_scv(hw, wl))
    c_p = bk * p / npf  # B_s P / N_P: the pool at full capacity
    fixed = p + xfer + st.e
    rest = xfer + st.e  # a turn's time away from the prefill worker, besides decode
    n_hi = np.minimum(m, kv_slots(hw, wl))  # the decode concurrency a decode worker's KV memory holds
    n = n_hi + 0.0 * npf
    w = np.zeros_like(n)
    active = np.ones(n.shape, dtype=bool)
    n_prev: F64 | None = None
    g_prev: F64 | None = None
    for _ in range(ROUNDS):
        n_s = 1.0 + (m - 1.0) * n / m  # the batch a decoding trajectory sees
        d = st.o * hw.decode_step_s(n_s, ctx, slopes)
        c_d = m * st.o * hw.decode_step_s(n, ctx, slopes) / n
        z_bound = np.maximum(c_d, c_p) - p - w  # the rest of the cycle where a bound sets it: C - W - P
        z_min = rest + d
        w_new, dw_dz = prefill_wait.with_slope(np.maximum(z_bound, z_min))
        c_lat = w_new + fixed + d
        c_cyc = np.maximum(np.maximum(c_lat, c_d), c_p)
        g = np.minimum(np.maximum(m * d / c_cyc, 1.0), n_hi)  # clip to [1, n_hi]
        slope = np.where(z_bound > z_min, -dw_dz, 0.0)  # dW_closed(Z(W)) / dW
        step_w = (w_new - w) / (1.0 - np.minimum(slope, SLOPE_MAX))
        step_n = secant_step(n, g, n_prev, g_prev)
        active = active & ~(distance(step_n, n, step_w, c_cyc) <= TOLERANCE)  # once within, held there
        if not active.any():
            break
        w = np.maximum(w + np.where(active, step_w, 0.0), 0.0)
        n_prev, g_prev = n, g
        n = np.minimum(np.maximum(n + np.where(active, step_n, 0.0), 1.0), n_hi)
    w = w_new
    kv_ok = (batch * wl.k_seq <= nd[:, 0] * hw.kv_capacity_tokens)
    held = float((bk * (st.x + st.c)).max())  # max_s B_s (x_s + c_s): the prefixes the prefill pool holds
    cache_ok = held <= npf[:, 0] * hw.kv_capacity_tokens
    start = np.maximum(batch / npf[:, 0] - 1.0, 0.0) * st.first_prefill(hw) / 2.0
    total: F64
    tail = pool_tail(wl)
    if tail is not None and st.turns.size:
        total = _slowest_path(hw, wl, st, tail, w, n_s, c_lat, c_cyc) + start
    else:
        weights, factor = st.path(wl, batch)
        total = factor * ((weights * c_cyc).sum(axis=1) + start)
    u_batch = (st.turns * bk * p).sum(axis=1) / (npf[:, 0] * (st.turns * np.maximum(c_lat, c_d)).sum(axis=1))
    prefill_ok = u_batch <= u_max
    converged = np.asarray(~active.any(axis=1), dtype=np.bool_)
    return DisaggResult(total, prefill_ok, kv_ok, u_batch, cache_ok, held, converged)


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


def _slowest_path(hw: HardwareProfile, wl: WorkloadProfile, st: Stages, tail: TailArrays,
                  w: F64, n: F64, c_lat: F64, c_cyc: F64) -> F64:
    """``sum_w omega_w max_{j in w} sum_k T_jk`` over the kept windows' slowest trajectories ``j``
    (module docstring), per candidate; ``tail`` is ``pool_tail(wl)``; ``w``, ``n``, ``c_lat``,
    ``c_cyc`` are the per-stage states, shape (M, S). Every path of every window advances together: arrays (paths, candidates),
    longest path first (``workload.TailArrays``), so that turn k updates the leading rows still on
    their paths."""
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
    ef = hw.decode_experts_s(nf) if hw.experts_frac > 0.0 else None  # per (candidate, stage)
    idx = np.broadcast_to((rows * n_stages)[None, :], t.shape).copy()
    # each path's current stage's (E_s, n, W, C / C_lat, b_e f_E(n)), shape (paths, candidates):
    # gathered once, then again only where a stage advanced (a path changes stage a few times)
    sources = (fe, nf, wf, sf) if ef is None else (fe, nf, wf, sf, ef)
    held = [src[idx] for src in sources]
    flat_idx, flat_held = idx.reshape(-1), [h.reshape(-1) for h in held]
    live = -1
    for lv, fixed, ctx, kv, cp, o in _path_turns(hw, wl):
        if lv != live:  # the leading rows still on their paths: views, written through
            live = lv
            ix, tk = idx[:lv], t[:lv]
            now = [h[:lv] for h in held]
            bound, n_at, w_at, s_at = now[:4]
            e_at = now[4] if ef is not None else None
        for _ in range(n_stages):
            adv = bound < tk
            moved_n = np.count_nonzero(adv)
            if not moved_n:
                break
            ix += adv
            if moved_n * 8 < adv.size:
                moved = np.flatnonzero(adv)  # flat positions: the leading rows are a prefix of the arrays
                at = flat_idx[moved]
                for src, h in zip(sources, flat_held, strict=True):
                    h[moved] = src[at]
            else:
                for src, h in zip(sources, now, strict=True):
                    h[...] = src[ix]
        tau = hw.decode_step_s(n_at, ctx, (kv, cp), e_at)
        tk += (w_at + fixed + o * tau) * s_at
    by_path = t[tail.rows]
    total = np.zeros(m_cand, dtype=np.float64)
    i = 0
    for weight, count in tail.windows:
        total = total + weight * by_path[i : i + count].max(axis=0)
        i += count
    return total
