"""Each formula of the predictor's docstrings, computed independently by hand here (plain Python
floats, no numpy, no call into the function under test for an intermediate value), against the
code. A changed term (a dropped factor, a doubled wait) fails the test of its formula.

The makespan tests use one-turn (one-stage) profiles, where the docstrings' sums over turn
groups have one term and the fixed points can be written out as loops."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pytest

from pearl.core.colocated import U_CAP_COLOCATED, colocated_makespan
from pearl.core.disaggregated import disaggregated_makespan
from pearl.core.fitting import blend_tail_windows, first_window_alpha
from pearl.core.hardware import HardwareProfile
from pearl.core.makespan import batch_progress, compose_makespan, sticky_pool
from pearl.core.queueing import closed_queue_wait, prefill_service_scv
from pearl.core.request_decode_fit import _prefill_stall_shares
from pearl.core.stages import TOLERANCE, stages
from pearl.core.telemetry import Mode, TelemetryRecord
from pearl.core.workload import (
    PathTurn,
    WorkloadProfile,
    _survival,
    colocated_tokens,
    prefill_pool_tokens,
)

Prof = tuple[HardwareProfile, WorkloadProfile]


# ------------------------------------------------------------------------------ the cost surface
def _p(hw: HardwareProfile, x: float, c: float) -> float:
    return hw.a0 + hw.a1 * x + hw.a2 * x * (c + x / 2.0)


def _f_e(hw: HardwareProfile, n: float) -> float:
    if hw.experts_frac <= 0:
        return 0.0
    return hw.expert_floor + (1.0 - hw.expert_floor) * (1.0 - (1.0 - hw.experts_frac) ** n)


def _tau(hw: HardwareProfile, n: float, ctx: float) -> float:
    f_e = _f_e(hw, n)
    return max(hw.b0 + hw.b_e * f_e + hw.b2 * n * ctx, hw.a0 + n * (hw.b1 + hw.b3 * ctx))


def _x(hw: HardwareProfile, t: float) -> float:
    return hw.g0 + hw.g1 * t


@pytest.mark.parametrize("which", ["8b", "30b"])
def test_costs_are_the_docstring_formulas(which: str, prof8b: Prof, prof30b: Prof) -> None:
    """P(x, c) = a0 + a1 x + a2 x (c + x / 2); tau(n, L) = max(b0 + b_e f_E(n) + b2 n L, a0 + n (b1 +
    b3 L)), f_E(n) = f + (1 - f) (1 - (1 - k/E)^n); X(t) = g0 + g1 t; token counts clipped at 0."""
    hw = (prof8b if which == "8b" else prof30b)[0]
    assert hw.expert_floor == (0.165 if which == "30b" else 0.0)  # H200's kernel floor; dense: none
    for x, c in ((0.0, 0.0), (1.0, 0.0), (2500.0, 12000.0), (30000.0, 1.0)):
        assert hw.prefill_s(x, c) == pytest.approx(_p(hw, x, c), rel=1e-15)
        q = 0.7 * x * (c + x / 2.0)
        assert hw.prefill_s(x, c, q) == pytest.approx(hw.a0 + hw.a1 * x + hw.a2 * q, rel=1e-15)
    assert hw.prefill_s(-5.0, -3.0) == hw.a0
    for n in (1.0, 2.0, 7.5, 64.0, 1e5):
        assert hw.experts_touched(n) == pytest.approx(_f_e(hw, n), rel=1e-12, abs=0.0)
        for ctx in (100.0, 4000.0, 30000.0):
            assert hw.decode_step_s(n, ctx) == pytest.approx(_tau(hw, n, ctx), rel=1e-12)
            memory, compute = hw.decode_branches(n, ctx)
            assert memory == pytest.approx(hw.decode_fixed_s(n) + hw.decode_var_s(n, ctx), rel=1e-12)
            assert compute == pytest.approx(hw.a0 + n * (hw.b1 + hw.b3 * ctx), rel=1e-15)
            assert hw.decode_var_s(n, ctx) == pytest.approx(hw.b2 * n * ctx, rel=1e-15)
    for t in (0.0, 1.0, 20000.0):
        assert hw.transfer_s(t) == pytest.approx(_x(hw, t), rel=1e-15)
    assert hw.transfer_s(-1.0) == hw.g0


@pytest.mark.parametrize("which", ["8b", "30b"])
def test_every_cost_gives_the_same_value_for_a_scalar_and_an_array(which: str, prof8b: Prof, prof30b: Prof) -> None:
    """One formula per cost: the array form (the makespan models) is elementwise the scalar form
    (the fitting, the router, the sync stall), bit for bit where the operations are the same."""
    hw = (prof8b if which == "8b" else prof30b)[0]
    xs = np.array([[0.0, 1.0, 800.0, 2500.0, 30000.0, -4.0]])
    cs = np.array([[0.0, 3.0, 12000.0, 100.0, 1.0, 7.0]])
    ns = np.array([[1.0, 2.0, 9.5, 40.0, 1e5, 0.5]])
    qs = xs * (cs + xs / 2.0)
    pairs = list(zip(xs[0], cs[0], ns[0], qs[0], strict=True))
    assert list(hw.prefill_s(xs, cs)[0]) == [hw.prefill_s(float(x), float(c)) for x, c, _n, _q in pairs]
    assert list(hw.prefill_s(xs, cs, qs)[0]) == [hw.prefill_s(float(x), float(c), float(q)) for x, c, _n, q in pairs]
    assert list(hw.transfer_s(xs)[0]) == [hw.transfer_s(float(x)) for x, *_ in pairs]
    assert list(hw.decode_var_s(ns, cs)[0]) == [hw.decode_var_s(float(n), float(c)) for _x, c, n, _q in pairs]
    # the expert term goes through expm1 (numpy's for arrays, math's for floats)
    assert list(hw.experts_touched(ns)[0]) == pytest.approx([hw.experts_touched(float(n)) for *_, n, _q in pairs],
                                                            rel=1e-15)
    got = hw.decode_step_s(ns, cs)[0]
    assert list(got) == pytest.approx([hw.decode_step_s(float(n), float(c)) for _x, c, n, _q in pairs], rel=1e-15)
    slopes = hw.decode_slopes(cs)
    assert list(hw.decode_step_s(ns, cs, slopes)[0]) == list(got)
    assert list(hw.decode_fixed_s(ns)[0]) == pytest.approx([hw.decode_fixed_s(float(n)) for *_, n, _q in pairs],
                                                           rel=1e-15)
    assert isinstance(hw.prefill_s(10.0, 2.0), float) and isinstance(hw.decode_step_s(3.0, 100.0), float)


# ------------------------------------------------------------------------------ the views
def test_colocated_view_is_the_mixture_of_kept_and_moved_turns(prof8b: Prof) -> None:
    """x'_k = (1 - m) x_k + m (1 - h)(x_k + c_k), c'_k = (1 - m) c_k + m h (x_k + c_k),
    q'_k = (1 - m) x_k (c_k + x_k / 2) + m x^m (c^m + x^m / 2) for k >= 2; turn 1 as it is."""
    hw, _ = prof8b
    wl = WorkloadProfile((1.0, 0.8, 0.5), (3000.0, 900.0, 700.0), (0.0, 3100.0, 4200.0), (400.0,) * 3,
                         (1.0,) * 3, 6000.0, moved_share=0.3, moved_hit=0.4)
    v = colocated_tokens(wl)
    m, h = 0.3, 0.4
    assert (v.new[0], v.cached[0], v.quad[0] if v.quad else None) == (3000.0, 0.0, 3000.0 * 1500.0)
    for k in (1, 2):
        x, c = wl.new_tokens[k], wl.cached_tokens[k]
        xm, cm = (1 - h) * (x + c), h * (x + c)
        assert v.new[k] == pytest.approx((1 - m) * x + m * xm)
        assert v.cached[k] == pytest.approx((1 - m) * c + m * cm)
        assert v.quad is not None
        assert v.quad[k] == pytest.approx((1 - m) * x * (c + x / 2) + m * xm * (cm + xm / 2))
    st = stages(wl, Mode.COLOCATED, 3)
    for k in range(3):
        assert float(st.prefill(hw)[0, k]) == pytest.approx(hw.a0 + hw.a1 * v.new[k] + hw.a2 * v.quad[k])


def test_prefill_pool_view_scales_the_hit_by_what_the_prefill_worker_holds() -> None:
    """c^P_k = c_k P_{k-1} / (P_{k-1} + o_{k-1}), x^P_k = x_k + c_k - c^P_k (k >= 2); turn 1 as it is."""
    wl = WorkloadProfile((1.0, 0.9, 0.5), (3000.0, 900.0, 700.0), (0.0, 3100.0, 4200.0), (400.0, 300.0, 200.0),
                         (1.0,) * 3, 6000.0)
    v = prefill_pool_tokens(wl)
    assert (v.new[0], v.cached[0], v.quad) == (3000.0, 0.0, None)
    for k in (1, 2):
        prev = wl.new_tokens[k - 1] + wl.cached_tokens[k - 1]
        cp = wl.cached_tokens[k] * prev / (prev + wl.output_tokens[k - 1])
        assert v.cached[k] == pytest.approx(cp)
        assert v.new[k] == pytest.approx(wl.new_tokens[k] + wl.cached_tokens[k] - cp)


def test_turn_groups_are_survival_weighted_means_and_reach_weights() -> None:
    """B_s / B = sum_{k in s} S(k) / T_s, y_s = sum S(k) y_k / sum S(k); reach R_k = 1 - (1 - S(k))^B,
    mean path sum_{k in s} S(k)."""
    s = (1.0, 0.9, 0.6, 0.2)
    wl = WorkloadProfile(s, (100.0, 200.0, 300.0, 400.0), (0.0, 50.0, 60.0, 70.0), (10.0, 20.0, 30.0, 40.0),
                         (1.0, 2.0, 3.0, 4.0), 900.0)
    st = stages(wl, Mode.COLOCATED, 2)
    assert list(st.turns[0]) == [2.0, 2.0]
    assert list(st.alive[0]) == pytest.approx([(1.0 + 0.9) / 2, (0.6 + 0.2) / 2])
    assert float(st.x[0, 0]) == pytest.approx((1.0 * 100 + 0.9 * 200) / 1.9)
    assert float(st.e[0, 1]) == pytest.approx((0.6 * 3 + 0.2 * 4) / 0.8)
    assert list(st.mean_path()[0]) == pytest.approx([1.9, 0.8])
    b = 5
    assert list(st.reach(b)[0]) == pytest.approx([(1 - 0.0**b) + (1 - 0.1**b), (1 - 0.4**b) + (1 - 0.8**b)])
    assert st.path(wl, b)[1] == 1.0 and st.path(replace(wl, tail_factor=1.2), b)[1] == 1.2


# ------------------------------------------------------------------------------ colocation
#: the models solve their fixed points to ``stages.TOLERANCE`` (relative, on every unknown); the
#: hand loops below iterate the docstring's plain damped map until nothing moves
_ROUNDS = 200_000
_REL = 10.0 * TOLERANCE


def _still(now: tuple[float, ...], before: tuple[float, ...]) -> bool:
    return all(abs(a - b) <= 1e-14 * abs(a) for a, b in zip(now, before, strict=True))


def _bisect(f: Callable[[float], float], lo: float, hi: float) -> float:
    """The root of a function that is <= 0 at ``lo`` and >= 0 at ``hi``, by bisection to machine
    precision (the colocated fixed point in plain Python: its plain map can circle at a kink)."""
    if f(lo) >= 0.0:
        return lo
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if f(mid) < 0.0 else (lo, mid)
        if hi - lo <= 1e-15 * hi:
            break
    return 0.5 * (lo + hi)


def _coloc_by_hand(hw: HardwareProfile, x: float, c: float, o: float, e: float, k_seq: float, batch: int,
                   n_workers: float, rho: float | None, with_start: bool = True) -> float:
    """``colocated`` module docstring, one turn group (B_s = B), the fixed point as a loop."""
    m0 = max(batch / n_workers, 1.0)
    m = max(1.0 + (m0 - 1.0) * (batch - 1.0) / max(batch - 1.0, 1.0), 1.0)
    n_hi = min(m, max(hw.kv_capacity_tokens / max(k_seq, 1.0), 1.0))  # m_cap = H_max / K_seq
    p = _p(hw, x, c)
    ctx = x + c + o / 2.0
    cap = m * p + (m / n_hi) * o * _tau(hw, n_hi, ctx)

    def cycle(n: float) -> float:  # C = max(C_lat(C), C_cap) at this n: C minus its right side rises with C
        n_s = 1.0 + (m - 1.0) * n / m

        def excess(cyc: float) -> float:
            u = min(m * p / cyc, U_CAP_COLOCATED)
            d = o * _tau(hw, n_s, ctx) / (1.0 - u * (m - 1.0) / m)
            return cyc - max(u * p / (2.0 * (1.0 - u)) + p + d + e, cap)
        return _bisect(excess, cap, 1e6 * cap)

    def excess_n(n: float) -> float:  # n - g(n), g = clip(m D / C, 1, n_hi): <= 0 at n = 1, >= 0 at n_hi
        cyc = cycle(n)
        u = min(m * p / cyc, U_CAP_COLOCATED)
        d = o * _tau(hw, 1.0 + (m - 1.0) * n / m, ctx) / (1.0 - u * (m - 1.0) / m)
        return n - min(max(m * d / cyc, 1.0), n_hi)
    cyc = cycle(_bisect(excess_n, 1.0, n_hi))
    w_start = max(m0 - 1.0, 0.0) * p / 2.0 if with_start else 0.0
    reach = 1.0  # R_1 = 1 - (1 - S(1))^B with S(1) = 1
    if rho is None:
        return reach * cyc + w_start
    return rho * (1.0 * cyc + w_start)  # mean path S(1) = 1; W_start inside the bracket


@pytest.mark.parametrize(("n_workers", "rho"), [(8.0, None), (4.0, None), (16.0, 1.3), (2.0, 1.15), (64.0, None)])
def test_colocated_makespan_is_the_docstring_fixed_point(prof8b: Prof, n_workers: float, rho: float | None) -> None:
    """u, n_s, D (with the other trajectories' stall ``(m - 1) / m``), W, C_lat, C_cap, C, n; then
    M = sum_s w_s C_s + W_start, or rho (...) with a measured tail factor."""
    hw, _ = prof8b
    x, c, o, e, k_seq = 9000.0, 3000.0, 600.0, 2.0, 30000.0
    wl = WorkloadProfile((1.0,), (x,), (c,), (o,), (e,), k_seq, tail_factor=rho)
    got = float(colocated_makespan(hw, wl, 64, np.array([n_workers]))[0])
    assert got == pytest.approx(_coloc_by_hand(hw, x, c, o, e, k_seq, 64, n_workers, rho), rel=_REL)


def test_colocated_batch_start_waits_half_the_queued_prefills(prof8b: Prof) -> None:
    """W_start = max(m0 - 1, 0) P_1 / 2: the makespan of B trajectories on N workers exceeds the
    same batch's cycles by exactly that wait (prior form, one turn group)."""
    hw, _ = prof8b
    x, c, o, e = 20000.0, 0.0, 50.0, 1.0
    wl = WorkloadProfile((1.0,), (x,), (c,), (o,), (e,), 1000.0)
    one = float(colocated_makespan(hw, wl, 64, np.array([64.0]))[0])  # m0 = 1: no start wait
    many = float(colocated_makespan(hw, wl, 64, np.array([8.0]))[0])
    cycles = _coloc_by_hand(hw, x, c, o, e, 1000.0, 64, 8.0, None, with_start=False)
    assert many - cycles == pytest.approx((8.0 - 1.0) * _p(hw, x, c) / 2.0, abs=_REL * many)
    assert one == pytest.approx(_coloc_by_hand(hw, x, c, o, e, 1000.0, 64, 64.0, None), rel=_REL)


def test_kv_overflow_caps_the_colocated_concurrency(prof8b: Prof) -> None:
    """n_hi = min(m, H_max / K_seq): at most n_hi run at once, the busy time C_cap = m P + (m / n_hi) o
    tau(n_hi, L); past it the makespan grows with the trajectories a worker holds."""
    hw, _ = prof8b
    k_seq = hw.kv_capacity_tokens / 4.0  # 4 trajectories fit a worker, 8 are assigned
    wl = WorkloadProfile((1.0,), (2000.0,), (0.0,), (300.0,), (1.0,), k_seq)
    got = float(colocated_makespan(hw, wl, 64, np.array([8.0]))[0])
    assert got == pytest.approx(_coloc_by_hand(hw, 2000.0, 0.0, 300.0, 1.0, k_seq, 64, 8.0, None), rel=_REL)
    roomy = float(colocated_makespan(hw, replace(wl, k_seq=hw.kv_capacity_tokens / 8.0), 64, np.array([8.0]))[0])
    assert got > 1.25 * roomy  # 4 at a time, each decode batch paying the weights again, against 8 at once


# ------------------------------------------------------------------------------ disaggregation
def _disagg_by_hand(hw: HardwareProfile, x: float, c: float, o: float, e: float, batch: int, n_p: float,
                    n_d: float, k_seq: float = 0.0) -> tuple[float, float, float, float, float, float]:
    """``disaggregated`` module docstring, one turn group: (C, C_lat, C_D, W, n, W_start)."""
    m = max(batch / n_d, 1.0)
    n_hi = min(m, max(hw.kv_capacity_tokens / k_seq, 1.0)) if k_seq > 0 else m  # m_cap = H_max / K_seq
    m_p = batch / n_p
    p = _p(hw, x, c)
    xf = _x(hw, x + c)
    ctx = x + c + o / 2.0
    n = n_hi
    cyc = p + xf + o * _tau(hw, n, ctx) + e
    c_p = batch * p / n_p
    w = 0.0
    lat = c_d = cyc
    for _ in range(_ROUNDS):  # damped plain iteration, to machine precision
        tau = _tau(hw, n, ctx)
        d = o * _tau(hw, 1.0 + (m - 1.0) * n / m, ctx)  # the batch a decoding trajectory sees
        z = max(cyc - w - p, xf + e + d)
        prev = (cyc, lat, n)
        w = float(closed_queue_wait(np.array([m_p]), np.array([p]), np.array([z]), 0.0)[0])  # c_s^2 = 0: one turn
        lat = w + p + xf + e + d
        c_d = m * o * tau / n
        cyc = max(lat, c_d, c_p)
        n = 0.5 * n + 0.5 * min(max(m * d / cyc, 1.0), n_hi)
        if _still((cyc, lat, n), prev):
            break
    return cyc, lat, c_d, w, 1.0 + (m - 1.0) * n / m, max(batch / n_p - 1.0, 0.0) * p / 2.0


@pytest.mark.parametrize(("n_p", "n_d"), [(3.0, 5.0), (1.0, 7.0), (6.0, 2.0), (12.0, 12.0)])
def test_disaggregated_makespan_and_feasibility_are_the_docstring_formulas(prof8b: Prof, n_p: float, n_d: float
                                                                           ) -> None:
    """W (closed queue), Z, D, C_lat, C_P, C_D, C, n; M_PD = C + W_start (no slowest paths, prior
    weights: R_1 = 1); u_batch = B P / (N_P max(C_lat, C_D)); B K_seq <= N_D H_max; B (x + c) <= N_P H_max."""
    hw, _ = prof8b
    x, c, o, e, k_seq = 6000.0, 2000.0, 500.0, 1.5, 20000.0
    wl = WorkloadProfile((1.0,), (x,), (c,), (o,), (e,), k_seq)
    res = disaggregated_makespan(hw, wl, 64, np.array([n_p]), np.array([n_d]), 0.95)
    cyc, lat, c_d, _w, _n, start = _disagg_by_hand(hw, x, c, o, e, 64, n_p, n_d, k_seq)
    assert float(res.makespan_s[0]) == pytest.approx(cyc + start, rel=_REL)
    u_batch = 64 * _p(hw, x, c) / (n_p * max(lat, c_d))
    assert float(res.prefill_util[0]) == pytest.approx(u_batch, rel=_REL)
    assert bool(res.prefill_ok[0]) == (u_batch <= 0.95)
    assert bool(res.kv_ok[0]) == (64 * k_seq <= n_d * hw.kv_capacity_tokens)
    assert res.cache_demand == pytest.approx(64 * (x + c))
    assert bool(res.cache_ok[0]) == (64 * (x + c) <= n_p * hw.kv_capacity_tokens)


def test_a_split_past_its_decode_workers_kv_caps_their_concurrency(prof8b: Prof) -> None:
    """n_hi = min(m, H_max / K_seq) per decode worker: n <= n_hi and the throughput bound C_D = (m o /
    n) tau(n, L) at it; such a split is infeasible by KV memory and predicted slower than one with room."""
    hw, _ = prof8b
    x, c, o, e = 6000.0, 2000.0, 500.0, 1.5
    k_seq = hw.kv_capacity_tokens / 4.0  # 4 trajectories fit a decode worker, 32 are assigned
    wl = WorkloadProfile((1.0,), (x,), (c,), (o,), (e,), k_seq)
    res = disaggregated_makespan(hw, wl, 64, np.array([6.0]), np.array([2.0]), 0.95)
    cyc, _lat, c_d, _w, n_s, start = _disagg_by_hand(hw, x, c, o, e, 64, 6.0, 2.0, k_seq)
    assert float(res.makespan_s[0]) == pytest.approx(cyc + start, rel=_REL)
    assert cyc == pytest.approx(c_d) and n_s <= 1.0 + 31.0 * 4.0 / 32.0 + 1e-9  # the KV-bound decode sets the cycle
    assert not bool(res.kv_ok[0])
    roomy = disaggregated_makespan(hw, replace(wl, k_seq=hw.kv_capacity_tokens / 32.0), 64, np.array([6.0]),
                                   np.array([2.0]), 0.95)
    assert bool(roomy.kv_ok[0]) and float(roomy.makespan_s[0]) < float(res.makespan_s[0])


def test_split_with_slowest_paths_adds_the_batch_start_wait_once(prof8b: Prof) -> None:
    """M_PD = sum_w omega_w max_{j in w} sum_k T_jk + W_start, T_jk = (W + P(x_jk, c_jk) + X(x_jk +
    c_jk) + o_jk tau(n, L_jk) + e_jk) C / C_lat (one stage: every turn runs in it)."""
    hw, _ = prof8b
    x, c, o, e = 6000.0, 2000.0, 500.0, 1.5
    path_a = (PathTurn(4000.0, 0.0, 300.0, 1.0), PathTurn(9000.0, 0.0, 900.0, 3.0))
    path_b = (PathTurn(5000.0, 0.0, 400.0, 2.0),) * 3
    path_c = (PathTurn(8000.0, 0.0, 1200.0, 1.0),)
    wl = WorkloadProfile((1.0,), (x,), (c,), (o,), (e,), 20000.0, tail_factor=1.4, tail_paths=(path_a, path_b),
                         tail_history=((path_c,),), tail_weights=(0.6, 0.4))
    n_p, n_d = 3.0, 5.0
    cyc, lat, _c_d, w, n, start = _disagg_by_hand(hw, x, c, o, e, 64, n_p, n_d)

    def path_time(path: tuple[PathTurn, ...]) -> float:
        return sum((w + _p(hw, t.x, t.c) + _x(hw, t.x + t.c) + t.o * _tau(hw, n, t.x + t.c + t.o / 2) + t.e)
                   * cyc / lat for t in path)

    want = 0.6 * max(path_time(path_a), path_time(path_b)) + 0.4 * path_time(path_c) + start
    got = float(disaggregated_makespan(hw, wl, 64, np.array([n_p]), np.array([n_d]), 0.95).makespan_s[0])
    assert got == pytest.approx(want, rel=_REL)


def test_prefill_service_scv_is_that_of_the_turn_mixture(prof8b: Prof) -> None:
    """c_s^2 = sum_k w_k (P_k - P_bar)^2 / P_bar^2, w_k = S(k) / sum S, P_k in the pool's view."""
    hw, _ = prof8b
    wl = WorkloadProfile((1.0, 0.7, 0.2), (3000.0, 900.0, 700.0), (0.0, 3100.0, 4200.0), (400.0,) * 3,
                         (1.0,) * 3, 6000.0)
    v = prefill_pool_tokens(wl)
    pk = [_p(hw, x, c) for x, c in zip(v.new, v.cached, strict=True)]
    wk = [s / sum(wl.survival) for s in wl.survival]
    mean = sum(w * p for w, p in zip(wk, pk, strict=True))
    want = sum(w * (p - mean) ** 2 for w, p in zip(wk, pk, strict=True)) / mean**2
    assert prefill_service_scv(hw, wl) == pytest.approx(want, rel=1e-12)


# ------------------------------------------------------------------------------ over time
def test_composed_makespan_and_progress_are_linear_within_each_allocation() -> None:
    """M_hat = t_j + (1 - sum_{i<j} (t_{i+1} - t_i) / M_i) M_j; p(t) = sum_i max(min(t_{i+1}, t) - t_i, 0) / M_i."""
    sched = [(0.0, 100.0), (20.0, 50.0), (40.0, 200.0)]
    # 20 / 100 + 20 / 50 = 0.6 done at t = 40; the rest at 1 / 200: 0.4 * 200 = 80 s more
    assert compose_makespan(sched) == pytest.approx(40.0 + 80.0)
    assert compose_makespan([(0.0, 100.0), (90.0, 10.0)]) == pytest.approx(90.0 + 0.1 * 10.0)
    assert batch_progress(sched, 30.0) == pytest.approx(0.2 + 10.0 / 50.0)
    assert batch_progress(sched, 140.0) == pytest.approx(0.6 + 100.0 / 200.0)


def test_sticky_pool_is_the_balance_point_of_the_slack() -> None:
    """m_old = min(A / n_p, A / N + s (N - n_p) / N), n_eff = A / m_old; a shrink gives N."""
    a, n_p, n, s = 64.0, 4.0, 20.0, 2.0
    m_old = min(a / n_p, a / n + s * (n - n_p) / n)
    assert sticky_pool(a, n_p, n, s) == pytest.approx(a / m_old)
    assert sticky_pool(a, 16.0, 32.0, 4.0) == pytest.approx(16.0)  # m_old = min(4, 2 + 2) = 4
    assert sticky_pool(a, 8.0, 4.0, 2.0) == 4.0


# ------------------------------------------------------------------------------ the fitting
def test_first_window_replaces_and_later_windows_blend() -> None:
    """alpha_w = 1 while samples == 0, else alpha; omega_w = alpha (1 - alpha)^w, the oldest the rest."""
    assert first_window_alpha(0, 0.3) == 1.0 and first_window_alpha(5, 0.3) == 0.3
    path = (PathTurn(1.0, 0.0, 1.0, 1.0),)
    wl = WorkloadProfile((1.0,), (1.0,), (0.0,), (1.0,), (1.0,), 10.0, tail_paths=((path,)), tail_weights=(1.0,))
    paths, hist, weights = blend_tail_windows(wl, (path, path), 0.3)
    assert paths == (path, path) and hist == (wl.tail_paths,)
    assert weights == pytest.approx((0.3, 0.7))
    wl3 = replace(wl, tail_history=((path,), (path,)), tail_weights=(0.3, 0.21, 0.49))
    assert blend_tail_windows(wl3, (path,), 0.3)[2] == pytest.approx((0.3, 0.3 * 0.7, 0.3 * 0.49, 0.7**3))


def test_prefill_stall_share_is_prefill_over_the_workers_decode_wall_time(prof8b: Prof) -> None:
    """u_w = sum_r P(x_r, c_r) / sum_r (decode_s_r / n_r), clipped to [0, 0.95]."""
    hw, _ = prof8b
    recs = [TelemetryRecord("a", 1, 4000, 1000, 100, decode_s=2.0, decode_concurrency=4.0, worker_id="w0"),
            TelemetryRecord("b", 2, 9000, 8000, 100, decode_s=3.0, decode_concurrency=2.0, worker_id="w0"),
            TelemetryRecord("c", 1, 500, 0, 100, decode_s=0.001, decode_concurrency=1.0, worker_id="w1"),
            TelemetryRecord("d", 1, 500, 0, 100, decode_s=1.0, mode="disaggregated", worker_id="w2")]
    u = _prefill_stall_shares(hw, recs)
    assert u["w0"] == pytest.approx((_p(hw, 3000, 1000) + _p(hw, 1000, 8000)) / (2.0 / 4.0 + 3.0 / 2.0))
    assert u["w1"] == 0.95 and "w2" not in u


# ------------------------------------------------------------------------------ the prior
@dataclass(frozen=True)
class _Dist:
    mean: float
    cv: float
    min: float
    max: float


@dataclass(frozen=True)
class _Spec:
    max_trajectory_tokens: int = 32768
    turns: _Dist = _Dist(8.0, 0.5, 1.0, 20.0)
    system_prompt_tokens: int = 2000
    observation_tokens: _Dist = _Dist(300.0, 0.0, 300.0, 300.0)
    response_tokens: _Dist = _Dist(500.0, 0.0, 500.0, 500.0)
    env_step_s: _Dist = _Dist(1.0, 0.0, 1.0, 1.0)
    prefix_cache_hit: float = 0.6
    test_run_prob: float = 0.1
    test_run_s: _Dist = _Dist(10.0, 0.0, 10.0, 10.0)


def test_prior_turns_context_cache_env_and_kseq_are_the_docstring_formulas() -> None:
    """ctx_k = sys + (k - 1)(o + obs); cached h (ctx_k - obs) for k > 1; e_k = (1 - q_k) e_tool + q_k
    e_test, q_k = h_k + (1 - h_k) p_test, h_k = (S(k) - S(k + 1)) / S(k); K_seq = min(limit, sys +
    sum_k S(k)(o + obs))."""
    spec = _Spec()
    wl = WorkloadProfile.from_spec(spec)
    o, obs = 500.0, 300.0
    for i in range(wl.max_turns):
        k = i + 1
        ctx = 2000 + (k - 1) * (o + obs)
        c = 0.0 if k == 1 else 0.6 * (ctx - obs)
        assert wl.cached_tokens[i] == pytest.approx(c) and wl.new_tokens[i] == pytest.approx(ctx - c)
        s, s_next = _survival(spec.turns, k), _survival(spec.turns, k + 1)
        assert wl.survival[i] == pytest.approx(s)
        h = (s - s_next) / s
        q = h + (1 - h) * 0.1
        assert wl.env_s[i] == pytest.approx((1 - q) * 1.0 + q * 10.0)
    assert wl.k_seq == pytest.approx(min(32768, 2000 + sum(wl.survival) * (o + obs)))
    # S(k) = P(turns >= k) of the clipped lognormal, with the continuity correction k - 0.5
    mu = math.log(8.0) - math.log(1.25) / 2
    z = (math.log(3 - 0.5) - mu) / math.sqrt(math.log(1.25))
    assert wl.survival[2] == pytest.approx(0.5 * math.erfc(z / math.sqrt(2)))
