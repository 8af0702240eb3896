"""The makespan models' fixed points are solved, not approximated: on the Qwen3-8B and Qwen3-30B-A3B
profiles (first-principles and with a measured tail) at 1-40 workers, every split's and turn
group's state equals the limit of thousands of rounds of the ``disaggregated`` docstring's plain
damped map, and every colocated pool's makespan the one from its cycles found by bisection, within
``stages.TOLERANCE``; a candidate the round cap stops short is flagged, not returned silently.
Twelve damped rounds stopped on the cycle alone leave a split's ``n_s`` up to 7 % and its ``C_lat``
up to 100 % off at 2-40 workers (where a throughput bound sets the cycle, the prefill queue's wait
creeps towards its fixed point unseen), and a colocated pool's plain map can circle at a kink
without settling."""

from __future__ import annotations

import functools
from dataclasses import replace

import numpy as np
import pytest

from pearl.config import RunConfig
from pearl.core import disaggregated
from pearl.core.colocated import U_CAP_COLOCATED, colocated_evaluation
from pearl.core.decision import UNCONVERGED_MARGIN, Allocation, decide, mode_change_s
from pearl.core.disaggregated import _fixed_point, _stage_terms, disaggregated_makespan
from pearl.core.hardware import HardwareProfile
from pearl.core.queueing import ClosedWait, prefill_service_scv
from pearl.core.stages import TOLERANCE, stages
from pearl.core.telemetry import Mode
from pearl.core.workload import PathTurn, WorkloadProfile

Prof = tuple[HardwareProfile, WorkloadProfile]
F64 = np.typing.NDArray[np.float64]

#: the plain damped map runs until no value moves by more than this (relative) in a round
_STILL = 1e-13
#: the models' states against the plain map's (their unknowns within TOLERANCE of the fixed point)
_REL = 20.0 * TOLERANCE


def _with_tail(wl: WorkloadProfile) -> WorkloadProfile:
    """``wl`` with a measured tail factor and two windows of slowest paths (the profile's per-turn
    means, 5-10 % longer): the split then runs the paths through its stages."""
    turns = list(zip(wl.new_tokens, wl.cached_tokens, wl.output_tokens, wl.env_s, strict=True))
    paths = tuple(tuple(PathTurn(x * f, c, o * f, e) for x, c, o, e in turns[: len(turns) - j])
                  for j, f in enumerate((1.05, 1.1)))
    return replace(wl, tail_factor=1.2, tail_paths=paths, tail_history=(paths[1:],), tail_weights=(0.6, 0.4))


@pytest.fixture(scope="module", params=["8b-prior", "8b-tail", "30b-prior", "30b-tail"])
def prof(request: pytest.FixtureRequest, prof8b: Prof, prof30b: Prof) -> Prof:
    hw, wl = prof8b if request.param.startswith("8b") else prof30b
    return (hw, _with_tail(wl)) if request.param.endswith("tail") else (hw, wl)


def _split_by_plain_map(hw: HardwareProfile, wl: WorkloadProfile, batch: int, npf: F64, nd: F64
                        ) -> tuple[F64, F64, F64, F64]:
    """``disaggregated`` module docstring's equations iterated as a plain map, ``n`` halfway to its
    new value each round, until nothing moves: ``(W, n_s, C_lat, C)``."""
    st = stages(wl, Mode.DISAGGREGATED)
    bk, p, o, e = batch * st.alive, st.prefill(hw), st.o, st.e
    xf, ctx = hw.transfer_s(st.x + st.c), st.x + st.c + st.o / 2.0
    m = np.maximum(bk / nd, 1.0)
    n_hi = np.minimum(m, max(hw.kv_capacity_tokens / wl.k_seq, 1.0))
    wait = ClosedWait(bk / npf, p, prefill_service_scv(hw, wl))
    c_p = bk * p / npf
    n = n_hi + 0.0 * npf
    w = np.zeros_like(n)
    cyc = p + xf + o * hw.decode_step_s(n, ctx) + e
    for _ in range(100_000):
        n_s = 1.0 + (m - 1.0) * n / m
        d = o * hw.decode_step_s(n_s, ctx)
        before = np.stack([w, cyc, n])
        w = wait(np.maximum(cyc - w - p, xf + d + e))
        lat = w + p + xf + d + e
        cyc = np.maximum(np.maximum(lat, m * o * hw.decode_step_s(n, ctx) / n), c_p)
        n = 0.5 * n + 0.5 * np.minimum(np.maximum(m * d / cyc, 1.0), n_hi)
        if np.all(np.abs(np.stack([w, cyc, n]) - before) <= _STILL * np.stack([cyc, cyc, n])):
            break
    return w, 1.0 + (m - 1.0) * n / m, lat, cyc


@pytest.mark.parametrize("n_workers", [2, 4, 5, 6, 8, 12, 24, 40])
def test_the_split_fixed_point_is_the_plain_maps_limit(prof: Prof, n_workers: int) -> None:
    hw, wl = prof
    npf = np.arange(1.0, n_workers).reshape(-1, 1)
    nd = n_workers - npf
    w, n_s, lat, cyc, _c_d, within = _fixed_point(stages(wl, Mode.DISAGGREGATED), _stage_terms(hw, wl, 64), npf, nd)
    assert within.all()
    w_ref, n_ref, lat_ref, cyc_ref = _split_by_plain_map(hw, wl, 64, npf, nd)
    np.testing.assert_allclose(cyc, cyc_ref, rtol=_REL, atol=0.0)
    np.testing.assert_allclose(lat, lat_ref, rtol=_REL, atol=0.0)
    np.testing.assert_allclose(n_s, n_ref, rtol=_REL, atol=0.0)
    np.testing.assert_allclose(w, w_ref, rtol=0.0, atol=_REL * float(cyc_ref.min()))
    assert disaggregated_makespan(hw, wl, 64, npf[:, 0], nd[:, 0], 0.9).converged.all()


def _coloc_by_bisection(hw: HardwareProfile, wl: WorkloadProfile, batch: int, nw: F64) -> F64:
    """``colocated`` module docstring's ``C`` per pool and group, by bisection: for a given ``n``,
    ``C - max(C_lat(C), C_cap)`` rises with ``C``; then ``n - clip(m D / C(n), 1, n_hi)`` is <= 0 at
    ``n = 1`` and >= 0 at ``n = n_hi`` (the plain map can circle at the kinks instead)."""
    st = stages(wl, Mode.COLOCATED)
    bk, p, o, e = batch * st.alive, st.prefill(hw), st.o, st.e
    ctx = st.x + st.c + st.o / 2.0
    m0 = np.maximum(batch / nw, 1.0)
    m = np.maximum(1.0 + (m0 - 1.0) * (bk - 1.0) / (batch - 1.0), 1.0)
    n_hi = np.minimum(m, max(hw.kv_capacity_tokens / wl.k_seq, 1.0))
    cap = m * p + (m / n_hi) * o * hw.decode_step_s(n_hi, ctx)

    def decode(n: F64, cyc: F64) -> F64:
        u = np.minimum(m * p / cyc, U_CAP_COLOCATED)
        return o * hw.decode_step_s(1.0 + (m - 1.0) * n / m, ctx) / (1.0 - u * (m - 1.0) / m), u

    def cycle(n: F64) -> F64:
        lo, hi = cap.copy(), 1e6 * cap
        for _ in range(80):
            mid = 0.5 * (lo + hi)
            d, u = decode(n, mid)
            low = mid < np.maximum(u * p / (2.0 * (1.0 - u)) + p + d + e, cap)
            lo, hi = np.where(low, mid, lo), np.where(low, hi, mid)
        return 0.5 * (lo + hi)

    lo_n, hi_n = np.ones_like(m), n_hi.copy()
    for _ in range(60):
        mid = 0.5 * (lo_n + hi_n)
        cyc = cycle(mid)
        low = mid < np.minimum(np.maximum(m * decode(mid, cyc)[0] / cyc, 1.0), n_hi)
        lo_n, hi_n = np.where(low, mid, lo_n), np.where(low, hi_n, mid)
    return cycle(0.5 * (lo_n + hi_n))


def test_the_colocated_fixed_point_is_the_bisections(prof: Prof) -> None:
    """The prior form's makespan, ``sum_s w_s C_s + W_start`` with the reach weights, from
    the bisection's cycles equals the model's at every pool of 1-40 workers."""
    hw, wl = prof
    wl = replace(wl, tail_factor=None, tail_paths=(), tail_history=(), tail_weights=())
    nw = np.arange(1.0, 41.0).reshape(-1, 1)
    got = colocated_evaluation(hw, wl, 64, nw[:, 0])
    assert got.converged.all()
    st = stages(wl, Mode.COLOCATED)
    want = (st.reach(64) * _coloc_by_bisection(hw, wl, 64, nw)).sum(axis=1)
    want += np.maximum(64 / nw[:, 0] - 1.0, 0.0) * st.first_prefill(hw) / 2.0
    np.testing.assert_allclose(got.makespan_s, want, rtol=_REL, atol=0.0)


def test_a_candidate_the_round_cap_stops_short_says_so(prof8b: Prof, cfg8b: RunConfig,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    hw, wl = prof8b
    full = decide(8, 64, hw, wl, cfg8b.policy)
    assert all(c.converged for c in full.candidates)
    monkeypatch.setattr(disaggregated, "_fixed_point", functools.partial(_fixed_point, rounds=1))
    short = decide(8, 64, hw, wl, cfg8b.policy)
    flags = [c["converged"] for c in short.to_dict()["candidates"]]  # type: ignore[union-attr]
    assert flags[0] is True and not all(flags[1:])
    low = colocated_evaluation(hw, wl, 64, np.array([4.0, 8.0]), rounds=1)
    assert not low.converged.any()


def test_a_switch_to_a_candidate_that_did_not_converge_needs_more_saving(prof8b: Prof, cfg8b: RunConfig,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """From colocation (converged) to a split stopped short by the round cap: the mode threshold
    plus ``UNCONVERGED_MARGIN``, and the reason says why; the same split converged needs none."""
    hw, wl = prof8b
    coloc = Allocation.colocated(8)
    with monkeypatch.context() as m:
        m.setattr(disaggregated, "_fixed_point", functools.partial(_fixed_point, rounds=3))
        d = decide(8, 64, hw, wl, cfg8b.policy, coloc)
        best = next(c for c in d.candidates if c.allocation == d.best)
        cur = d.candidates[0]
        assert cur.allocation == coloc and cur.converged
        assert best.allocation.mode is Mode.DISAGGREGATED and not best.converged
        saving = (cur.makespan_s - best.makespan_s) / cur.makespan_s
        charge = mode_change_s(8, 64, hw, wl, cfg8b.policy.role_switch_s) / cur.makespan_s
        pol = cfg8b.policy.model_copy(update={"mode_switch_threshold": saving - charge - UNCONVERGED_MARGIN / 2})
        held = decide(8, 64, hw, wl, pol, coloc)
        assert held.target == coloc
        assert f"{best.allocation.label}'s fixed point did not converge" in held.reason
    moved = decide(8, 64, hw, wl, pol, coloc)  # converged: the mode threshold alone
    assert moved.target == best.allocation and all(c.converged for c in moved.candidates)
