"""The decode step fitted from per-iteration telemetry, where it is measured.

An engine that exposes its iterations (the emulator: every decode span; ``IterationRecord``)
gives one sample per decode span: its batch ``n``, mean context per sequence ``L``
(``IterationRecord.mean_context``) and seconds per iteration ``y = wall / steps``. A decode
iteration runs no prefill chunk (the engine prefills in iterations of their own), so ``y`` is the
stall-free step the makespan models charge: unlike the per-request fit
(``request_decode_fit``), it needs no correction for the other requests' prefills.

The samples live on the hardware profile (``HardwareProfile.decode_samples``, a
``telemetry.DecodeSamples`` store: per role, buckets of one octave of batch and half an octave of
context, each keeping its newest samples), and the fit reads the whole store::

    y_i = s_f F(n_i) + s_v V(n_i, L_i),    F = b0 + b_e f_E(n),    V = b2 n L

the memory branch's two parts on the profile's own coefficients, by weighted least squares (each
sample weighted ``1 / |its bucket|``: every covered operating region counts the same) over the
samples on the profile's memory branch. The role: the decode workers' samples once the store holds
``MIN_SAMPLES`` of them in ``MIN_BUCKETS`` buckets (a split runs: fit where the decode pool
runs), else the colocated workers'. ``b0, b_e`` scale by ``s_f``, ``b1, b2, b3`` by ``s_v``; with
too little spread to tell the two apart (a singular system), one common scale, the weighted mean
of ``y / tau``. Physical constraints: ``s_f > 0`` and ``s_v > 0``, finite; a fit that breaks them
is rejected (``non_physical_fit``) and the previous coefficients kept.

The range of the samples used, ``(n_lo, n_hi, L_lo, L_hi)``, is kept on the profile
(``decode_measured``): a candidate whose decode batch or context lies outside it by more than
``decision.EXTRAPOLATION_SLACK`` is ``extrapolated`` and the hysteresis demands more of it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from pearl.core.hardware import HardwareProfile
from pearl.core.telemetry import IterationRecord, Rejection

#: samples (and buckets) a role needs before its decode step is fitted from them
MIN_SAMPLES = 16
MIN_BUCKETS = 2
ROLES = ("decode", "colocated")


def with_samples(hw: HardwareProfile, iterations: Sequence[IterationRecord]) -> tuple[HardwareProfile, Counter[Rejection]]:
    """``hw`` with the decode spans of ``iterations`` in its sample store, and the screened-out
    records by reason."""
    store, why = hw.decode_samples.add(iterations)
    return replace(hw, decode_samples=store), why


def refit_decode(hw: HardwareProfile) -> tuple[HardwareProfile, bool] | None:
    """The decode step of ``hw`` refitted on its sample store (module docstring): ``(profile,
    physical)``; None when no role has enough samples. When the fit is not physical, ``hw`` is
    returned unchanged with ``False``."""
    store = hw.decode_samples
    pts: list[tuple[tuple[float, float, float], float]] = []
    for role in ROLES:
        pts = store.of_role(role)
        if len(pts) >= MIN_SAMPLES and store.n_buckets(role) >= MIN_BUCKETS:
            break
    else:
        return None
    rows = []
    for (n, ctx, y), wgt in pts:
        memory, compute = hw.decode_branches(n, ctx)
        if memory >= compute and y > 0:
            rows.append((hw.decode_fixed_s(n), hw.decode_var_s(n, ctx), y, wgt, n, ctx))
    if len(rows) < MIN_SAMPLES:
        return None
    s11 = sum(w * f * f for f, _v, _y, w, _n, _c in rows)
    s22 = sum(w * v * v for _f, v, _y, w, _n, _c in rows)
    s12 = sum(w * f * v for f, v, _y, w, _n, _c in rows)
    s1y = sum(w * f * y for f, _v, y, w, _n, _c in rows)
    s2y = sum(w * v * y for _f, v, y, w, _n, _c in rows)
    det = s11 * s22 - s12 * s12
    if det > 1e-9 * s11 * s22:
        sf, sv = (s1y * s22 - s2y * s12) / det, (s2y * s11 - s1y * s12) / det
    else:  # no spread between the two parts: one common scale
        sf = sv = sum(w * y / (f + v) for f, v, y, w, _n, _c in rows) / sum(w for *_r, w, _n, _c in rows)
    if not (math.isfinite(sf) and math.isfinite(sv) and sf > 0.0 and sv > 0.0):
        return hw, False
    ns = [r[4] for r in rows]
    cs = [r[5] for r in rows]
    out = replace(hw, b0=hw.b0 * sf, b_e=hw.b_e * sf, b1=hw.b1 * sv, b2=hw.b2 * sv, b3=hw.b3 * sv,
                  decode_measured=(min(ns), max(ns), min(cs), max(cs)))
    return out, out.physical()
