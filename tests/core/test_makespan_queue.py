"""The prefill pool's wait: one closed FCFS queue per prefill worker (queueing.closed_queue_wait)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from pearl.core.profile import HardwareProfile, WorkloadProfile
from pearl.core.queueing import closed_queue_wait, prefill_service_scv


def _repairman_wait(k: int, p: float, z: float) -> float:
    """Exact mean wait of the machine-repairman model (k sources, think time z, one exponential
    server with mean service p): p_0 = 1 / sum_j k! / (k - j)! (p / z)^j, X = (1 - p_0) / p,
    R = k / X - z, W = R - p."""
    terms = [math.factorial(k) / math.factorial(k - j) * (p / z) ** j for j in range(k + 1)]
    x = (1.0 - 1.0 / sum(terms)) / p
    return k / x - z - p


def _exact_wait(m: int, p: float, z: float, cs2: float) -> float:
    """The mean value analysis recursion of ``closed_queue_wait``, run for one integer m."""
    q = u = 0.0
    r = p
    for k in range(1, m + 1):
        r = p + p * (q - u) + u * p * (1.0 + cs2) / 2.0
        x = k / (r + z)
        q, u = x * r, x * p
    return r - p


def _w(m: float, p: float, z: float, cs2: float) -> float:
    return float(closed_queue_wait(np.array([m]), np.array([p]), np.array([z]), cs2)[0])


@pytest.mark.parametrize(("k", "p", "z"), [(2, 1.0, 5.0), (6, 1.2, 10.0), (9, 1.5, 12.0), (20, 1.0, 8.0)])
def test_exponential_service_is_the_exact_repairman_model(k: int, p: float, z: float) -> None:
    assert _exact_wait(k, p, z, 1.0) == pytest.approx(_repairman_wait(k, p, z), rel=1e-9)
    assert _w(k, p, z, 1.0) == pytest.approx(_repairman_wait(k, p, z), rel=1e-3)  # the table's interpolation


def test_table_interpolation_is_within_a_tenth_of_a_percent() -> None:
    rng = np.random.default_rng(0)
    m = rng.integers(1, 70, 400)
    p = rng.uniform(0.2, 3.0, 400)
    z = p * np.exp(rng.uniform(np.log(0.5), np.log(200.0), 400))
    for cs2 in (0.0, 0.13, 1.0):
        got = closed_queue_wait(m.astype(float), p, z, cs2)
        want = np.array([_exact_wait(int(mi), pi, zi, cs2) for mi, pi, zi in zip(m, p, z, strict=True)])
        assert np.all(np.abs(got - want) <= 1e-3 * want + 1e-9)


def test_limits_and_shape() -> None:
    assert _w(1.0, 1.0, 5.0, 0.0) == 0.0  # alone on the worker: nothing ahead
    assert _w(0.4, 1.0, 5.0, 0.0) == 0.0
    # saturated: the worker serves one prefill per p, so a cycle is m p (R + z = m p); with
    # deterministic service the residual correction leaves it short by under one service (C_P
    # covers that)
    m, p, z = 64.0, 1.0, 10.0
    assert _w(m, p, z, 1.0) + p + z == pytest.approx(m * p, rel=1e-4)
    assert m * p - p <= _w(m, p, z, 0.0) + p + z <= m * p
    # less variable service waits less; more trajectories per worker wait more; fractional m
    # lies between its neighbours
    assert _w(9, 1.2, 12.0, 0.0) < _w(9, 1.2, 12.0, 0.13) < _w(9, 1.2, 12.0, 1.0)
    ws = [_w(m, 1.2, 12.0, 0.13) for m in (3.0, 3.5, 4.0, 8.0)]
    assert ws == sorted(ws) and ws[0] < ws[1] < ws[2]
    # vectorised: one call over (candidates x stages) equals element-wise calls
    mm, pp, zz = np.array([[2.0, 7.3], [15.5, 1.0]]), np.array([[1.0, 1.4]]), np.array([[9.0, 11.0], [6.0, 3.0]])
    both = closed_queue_wait(mm, pp, zz, 0.2)
    for i in range(2):
        for j in range(2):
            assert both[i, j] == pytest.approx(_w(mm[i, j], pp[0, j], zz[i, j], 0.2), rel=1e-12)


def test_service_scv_is_that_of_the_turn_mixture(prof8b: tuple[HardwareProfile, WorkloadProfile]) -> None:
    hw, wl = prof8b
    k = wl.max_turns
    same = replace(wl, new_tokens=(2000.0,) * k, cached_tokens=(0.0,) * k)
    assert prefill_service_scv(hw, same) == pytest.approx(0.0, abs=1e-12)
    # two equally likely prefill times a and b: c_s^2 = ((a - b) / (a + b))^2
    two = replace(wl, survival=(1.0, 1.0) + (0.0,) * (k - 2), new_tokens=(1000.0, 8000.0) + (0.0,) * (k - 2),
                  cached_tokens=(0.0,) * k)
    a, b = hw.prefill_s(1000.0, 0.0), hw.prefill_s(8000.0, 0.0)
    assert prefill_service_scv(hw, two) == pytest.approx(((a - b) / (a + b)) ** 2)
