"""The closed loop on the makespan: each finished batch's measured makespan corrects the model's
prediction for the configuration that ran it, and, through a shared kernel, its neighbours'.

The models (``colocated``, ``disaggregated``) predict from fitted costs; what they leave out (a
kernel the cost surface does not have, an interference it does not model) shows as a ratio of
measured to predicted makespan that persists from batch to batch for one configuration. Like the
observed / predicted correction factors of NVIDIA Dynamo's planner and llm-d's online Kalman
tuning, ``MakespanCorrection`` tracks that ratio per configuration and the decision multiplies its
predictions by it.

Configurations: colocation on ``N`` workers, or a split with prefill fraction ``f = N_P / N``; a
configuration observed is an *anchor* ``a`` with ``x_a`` = the log of the correction and its
variance ``P_a``. Per finished batch that ran one configuration ``c`` from start to end, with
``M`` its measured makespan and ``M_model`` the models' prediction for ``c`` on the profiles
*refit with that batch's telemetry* (so the loop learns what refitting the costs does not
explain, and a first batch predicted on the data-sheet prior is not corrected twice), a scalar
Kalman filter in log space (random walk)::

    P_a <- P_a + Q                                  every anchor of the mode: the drift of a batch
    z    = log(M / M_model)                         the measured log-ratio
    K    = P_c / (P_c + R),   x_c <- x_c + K (z - x_c),   P_c <- (1 - K) P_c

and the other anchors ``b`` of the same mode share it: ``x_b <- x_b + rho(b, c) K_b (z - x_b)``
with ``K_b = P_b / (P_b + R)``, where::

    rho(a, b) = exp(-((f_a - f_b) / H_F)^2 / 2 - (log2 N_a - log2 N_b)^2 / 2)

(colocation: ``f = 0``). A configuration without an anchor starts from its neighbours' estimate::

    x(c) = sum_a rho(c, a) x_a / (1 + sum_a rho(c, a))      (shrunk towards 0 where none is near)

The factor applied is ``exp(x)`` clipped to ``[1 / MAX_FACTOR, MAX_FACTOR]``. ``Q``, ``R`` and the
prior variance ``P0`` are modelling choices (below): a batch's makespan varies ~3-8 % from seed
to seed (``R``, docs/predictor.md), and the correction should follow a change of workload within a
few batches (``Q``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

#: measurement noise (variance of log M / M_pred of one batch: ~6 % standard deviation)
R = 0.06**2
#: drift per batch (variance): a correction older than ~10 batches is half forgotten
Q = 0.02**2
#: the prior variance of a new anchor's correction (~10 %)
P0 = 0.10**2
#: the kernel's width in prefill fraction
H_F = 0.15
#: the largest correction applied either way
MAX_FACTOR = 2.0
#: anchors kept per mode (the least recently observed are dropped)
MAX_ANCHORS = 32

#: one anchor: ``(f, log2 N, x, P, last batch observed)``
Anchor = tuple[float, float, float, float, int]


def _rho(df: npt.NDArray[np.float64], dn: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """The kernel at differences ``df`` of prefill fraction and ``dn`` of log2 N (module docstring)."""
    out: npt.NDArray[np.float64] = np.exp(-0.5 * (df / H_F) ** 2 - 0.5 * dn**2)
    return out


@dataclass(frozen=True, slots=True)
class MakespanCorrection:
    """Per mode, the anchors of the closed loop (module docstring); the empty one corrects nothing."""

    colocated: tuple[Anchor, ...] = ()
    split: tuple[Anchor, ...] = ()
    batches: int = 0

    def _anchors(self, split: bool) -> tuple[Anchor, ...]:
        return self.split if split else self.colocated

    def log_factors(self, n_workers: float, n_prefill: npt.NDArray[np.float64] | None) -> npt.NDArray[np.float64]:
        """``x(c)`` for colocation on ``n_workers`` (``n_prefill`` None) or for each split
        ``(n_prefill, n_workers - n_prefill)``; shape (1,) or (M,)."""
        split = n_prefill is not None
        f = np.zeros(1) if n_prefill is None else np.asarray(n_prefill, dtype=np.float64) / max(n_workers, 1.0)
        anchors = self._anchors(split)
        if not anchors:
            return np.zeros_like(f)
        arr = np.asarray([a[:4] for a in anchors], dtype=np.float64)
        df = f[:, None] - arr[None, :, 0]
        dn = math.log2(max(n_workers, 1.0)) - arr[None, :, 1]
        rho = _rho(df, dn)
        exact = (np.abs(df) < 1e-9) & (np.abs(dn) < 1e-9)
        x = (rho * arr[None, :, 2]).sum(axis=1) / (1.0 + rho.sum(axis=1))
        hit = exact.any(axis=1)
        if hit.any():
            x = np.where(hit, (exact * arr[None, :, 2]).sum(axis=1), x)
        lim = math.log(MAX_FACTOR)
        out: npt.NDArray[np.float64] = np.clip(x, -lim, lim)
        return out

    def factor(self, n_workers: int, n_prefill: int | None = None) -> float:
        """``exp(x(c))`` of one configuration (``n_prefill`` None: colocation)."""
        arr = None if n_prefill is None else np.array([float(n_prefill)])
        return float(np.exp(self.log_factors(float(n_workers), arr)[0]))

    def observe(self, n_workers: int, n_prefill: int | None, model_s: float, measured_s: float) -> MakespanCorrection:
        """The loop after one batch that ran one configuration throughout (module docstring):
        ``model_s`` the models' uncorrected prediction on the refit profiles; unchanged if either
        makespan is not a positive finite number."""
        if not (math.isfinite(model_s) and math.isfinite(measured_s) and model_s > 0 and measured_s > 0):
            return self
        split = n_prefill is not None
        f = 0.0 if n_prefill is None else n_prefill / max(n_workers, 1)
        ln = math.log2(max(n_workers, 1))
        z = math.log(measured_s / model_s)
        anchors = list(self._anchors(split))
        idx = next((i for i, a in enumerate(anchors) if abs(a[0] - f) < 1e-9 and abs(a[1] - ln) < 1e-9), None)
        if idx is None:  # a new anchor starts from its neighbours' estimate
            x0 = float(self.log_factors(float(n_workers), None if n_prefill is None else np.array([float(n_prefill)]))[0])
            anchors.append((f, ln, x0, P0, self.batches))
            idx = len(anchors) - 1
        out: list[Anchor] = []
        for i, (fa, la, x, p, seen) in enumerate(anchors):
            p = p + Q
            if i == idx:
                k = p / (p + R)
                out.append((fa, la, x + k * (z - x), (1.0 - k) * p, self.batches + 1))
            else:
                rho = float(_rho(np.asarray(fa - f), np.asarray(la - ln)))
                out.append((fa, la, x + rho * p / (p + R) * (z - x), p, seen))
        out = sorted(out, key=lambda a: -a[4])[:MAX_ANCHORS]
        kept = tuple(sorted(out))
        if split:
            return MakespanCorrection(self.colocated, kept, self.batches + 1)
        return MakespanCorrection(kept, self.split, self.batches + 1)
