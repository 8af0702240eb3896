"""The decode step fitted from request records (``fitting.fit_hardware`` when no role of the
iteration-sample store has enough samples, ``iteration_fit``).

Two scales ``s_f`` (on ``b0, b_e``) and ``s_v`` (on ``b1, b2, b3``) by least squares on
the per-token decode time of the memory branch::

    y = decode_s / o = s_f (b0 + b_e f_E(n)) + s_v b2 n L,      L = prompt + o / 2

over the records within 5x of the median ratio ``y / tau`` that are disaggregated (stall-free:
the split between the two parts is identified by the spread of the decode batch ``n`` alone, and
colocated records carry the stall correction's residuals, correlated with ``n``) and whose prior
step is memory-bound (a compute-bound record would need a third scale). With fewer than 3 such
records, or a singular or non-positive solution, the colocated records give the split
(``_colocated_scales``): within a group of one worker and one decode batch the stall error is a
shared multiplier, so the slope / intercept of ``y / xf`` against ``xv / xf`` is the ratio
``q = s_v / s_f`` free of it (weighted median over the groups), and ``s_f = median(y / (xf + q
xv))``; without such a group, one common scale ``s_f = s_v`` = the median ratio over all
records. A colocated record's decode time includes the prefill chunks of the other requests
that stalled its batch; the colocated model adds that interference itself
(``D = o tau / (1 - u (m - 1) / m)``), so its ``y`` is the stall-free time::

    y = decode_s / o (1 - u_w (n - 1) / n),     u_w = sum_r P(x_r, c_r) / sum_r (decode_s_r / n_r)

with ``u_w`` the worker's prefill share in the window (``_prefill_stall_shares``, clipped to
[0, 0.95], ``P`` with the refitted prefill scale).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from statistics import fmean, median

from pearl.core.hardware import HardwareProfile
from pearl.core.telemetry import Mode, TelemetryRecord

#: the least records of one (worker, decode batch) group the colocated decode split is read from
MIN_GROUP_RECORDS = 8


def _blend(s: float, alpha: float) -> float:
    """The applied scale ``k = 1 + alpha (s - 1)``."""
    return 1.0 + alpha * (s - 1.0)


def _fit_decode(prior: HardwareProfile, out: HardwareProfile, recs: Sequence[TelemetryRecord],
                alpha: float) -> HardwareProfile:
    """Two scales (fixed per step, per sequence) by least squares, else one (module docstring)."""
    dec = [r for r in recs if r.decode_s > 0 and r.output_tokens > 0]
    if not dec:
        return out
    n = [max(r.decode_concurrency, 1.0) for r in dec]
    ys = _stall_free_decode(out, dec, n)
    ctx = [r.prompt_tokens + r.output_tokens / 2.0 for r in dec]
    xf = [prior.decode_fixed_s(ni) for ni in n]
    xv = [prior.decode_var_s(ni, ci) for ni, ci in zip(n, ctx, strict=True)]
    ratio = [y / prior.decode_step_s(ni, ci) for y, ni, ci in zip(ys, n, ctx, strict=True)]
    med = median(ratio)
    free = _two_scale_records(prior, dec, n, ctx, ratio, med)
    sf, sv = _lsq2([xf[i] for i in free], [xv[i] for i in free], [ys[i] for i in free])
    if sf is None or sv is None:
        sf, sv = _colocated_scales(prior, dec, n, ctx, ys, xf, xv, ratio, med)
    kf, kv = _blend(sf, alpha), _blend(sv, alpha)
    return replace(out, b0=out.b0 * kf, b_e=out.b_e * kf, b1=out.b1 * kv, b2=out.b2 * kv, b3=out.b3 * kv)


def _two_scale_records(prior: HardwareProfile, dec: Sequence[TelemetryRecord], n: Sequence[float],
                       ctx: Sequence[float], ratio: Sequence[float], med: float) -> list[int]:
    """The records the two decode scales are fitted on: within 5x of the median ratio,
    disaggregated (stall-free) and on the prior's memory branch."""
    return [i for i, q in enumerate(ratio) if med / 5.0 <= q <= med * 5.0
            and dec[i].mode is not Mode.COLOCATED and _memory_bound(prior, n[i], ctx[i])]


def _colocated_scales(prior: HardwareProfile, dec: Sequence[TelemetryRecord], n: Sequence[float],
                      ctx: Sequence[float], ys: Sequence[float], xf: Sequence[float], xv: Sequence[float],
                      ratio: Sequence[float], med: float) -> tuple[float, float]:
    """The two decode scales from colocated records (module docstring): the per-sequence share
    ``q = s_v / s_f`` within the groups of one worker and one decode batch, then the level.

    A colocated record's stall-free time carries its worker's prefill-stall error, a multiplier
    ``(1 + e_g)`` shared by the records of a group ``g`` = (worker, ``round(n)``) and independent
    of their contexts, so within a group ``y_i / xf_i = A_g + B_g (xv_i / xf_i)`` with
    ``A_g = (1 + e_g) s_f`` and ``B_g = (1 + e_g) s_v``; the ratio ``q_g = B_g / A_g`` is free of the
    error. ``q`` is the weighted median of ``q_g`` (weight ``|g| var(xv / xf)``) over the groups with
    at least ``MIN_GROUP_RECORDS`` memory-bound records within 5x of the median ratio, and::

        s_f = median_i( y_i / (xf_i + q xv_i) ),     s_v = q s_f

    Without such a group, or with a non-positive ``q``: one common scale, the median ratio."""
    groups: dict[tuple[str, int], list[int]] = defaultdict(list)
    for i, r in enumerate(dec):
        if (r.mode is Mode.COLOCATED and r.worker_id and med / 5.0 <= ratio[i] <= med * 5.0
                and _memory_bound(prior, n[i], ctx[i])):
            groups[(r.worker_id, round(n[i]))].append(i)
    shares: list[tuple[float, float]] = []
    for idx in groups.values():
        if len(idx) < MIN_GROUP_RECORDS:
            continue
        fit = _line([xv[i] / xf[i] for i in idx], [ys[i] / xf[i] for i in idx])
        if fit is not None and fit[0] > 0:
            shares.append((fit[1] / fit[0], fit[2]))
    q = _weighted_median(shares)
    if q is None or q <= 0:
        return med, med
    level = median(y / (f + q * v) for y, f, v in zip(ys, xf, xv, strict=True))
    return level, q * level


def _line(x: Sequence[float], y: Sequence[float]) -> tuple[float, float, float] | None:
    """Ordinary least squares ``y = A + B x``: ``(A, B, |x| var(x))``; None if ``x`` has no spread."""
    mx, my = fmean(x), fmean(y)
    sxx = sum((a - mx) ** 2 for a in x)
    if sxx <= 1e-12 * max(mx * mx, 1e-300) * len(x):
        return None
    b = sum((a - mx) * (c - my) for a, c in zip(x, y, strict=True)) / sxx
    return my - b * mx, b, sxx


def _weighted_median(pairs: Sequence[tuple[float, float]]) -> float | None:
    """The value at half of the total weight of ``(value, weight)`` pairs; None without weight."""
    pts = sorted(p for p in pairs if p[1] > 0 and math.isfinite(p[0]))
    total = sum(w for _, w in pts)
    if total <= 0:
        return None
    acc = 0.0
    for v, w in pts:
        acc += w
        if acc >= total / 2.0:
            return v
    return pts[-1][0]


def _memory_bound(hw: HardwareProfile, batch: float, context: float) -> bool:
    """Whether the decode step at ``(n, L)`` is on the roofline's memory branch."""
    memory, compute = hw.decode_branches(batch, context)
    return memory >= compute


def _stall_free_decode(hw: HardwareProfile, dec: Sequence[TelemetryRecord], n: Sequence[float]) -> list[float]:
    """Per record, the per-token decode time ``y`` (colocated: without the other requests'
    prefill stalls, module docstring)."""
    stall = _prefill_stall_shares(hw, dec)
    return [r.decode_s / r.output_tokens * (1.0 - stall.get(r.worker_id, 0.0) * (ni - 1.0) / ni)
            if r.mode is Mode.COLOCATED else r.decode_s / r.output_tokens for r, ni in zip(dec, n, strict=True)]


def _prefill_stall_shares(hw: HardwareProfile, recs: Sequence[TelemetryRecord]) -> dict[str, float]:
    """Per colocated worker: the share ``u_w`` of its time spent in prefill, from the window alone::

        u_w = sum_r P(x_r, c_r) / sum_r (decode_s_r / n_r)     (records r served by worker w)

    ``decode_s_r / n_r`` is r's share of the worker's decode wall time (n_r requests decode at
    once), and that wall time includes every prefill chunk that stalled the batch, so the ratio is
    the prefill share of the worker's serving time. Clipped to [0, 0.95]."""
    pre: dict[str, float] = defaultdict(float)
    wall: dict[str, float] = defaultdict(float)
    for r in recs:
        if r.mode is not Mode.COLOCATED or not r.worker_id:
            continue
        pre[r.worker_id] += hw.prefill_s(r.prompt_tokens - r.cached_tokens, r.cached_tokens)
        wall[r.worker_id] += r.decode_s / max(r.decode_concurrency, 1.0)
    return {w: min(max(pre[w] / t, 0.0), 0.95) for w, t in wall.items() if t > 0}


def _lsq2(x1: Sequence[float], x2: Sequence[float], y: Sequence[float]) -> tuple[float | None, float | None]:
    """Least squares y ~ s1 x1 + s2 x2 (no intercept); (None, None) with fewer than 3 points, or
    if singular or non-positive."""
    s11 = sum(a * a for a in x1)
    s22 = sum(b * b for b in x2)
    s12 = sum(a * b for a, b in zip(x1, x2, strict=True))
    s1y = sum(a * c for a, c in zip(x1, y, strict=True))
    s2y = sum(b * c for b, c in zip(x2, y, strict=True))
    det = s11 * s22 - s12 * s12
    if len(y) < 3 or det <= 1e-12 * max(s11 * s22, 1e-300):
        return None, None
    a = (s1y * s22 - s2y * s12) / det
    b = (s2y * s11 - s1y * s12) / det
    if a <= 0 or b <= 0:
        return None, None
    return a, b
