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

A batch over which the budget changed (a grant, a reclaim, a borrow and its return) ran several
configurations ``c_i``, each for ``dt_i`` seconds of its measured makespan ``M = sum_i dt_i``. It
measures something else: besides the models, the runtime's own work inside the batch (a lent
worker activating while the pool already counts it, the requests a return aborts and
re-prefills), which a colocated and a split pool pay alike. So the correction has two terms::

    x(c) = s(N_c) + m(c)

``m`` per mode (the anchors above, ``f`` and ``N``): the models' own error, measured by the
batches that ran one configuration throughout, ``z = log(M / M_model)``. ``s`` shared by both
modes (anchors in ``N`` only): what a batch whose pool changed shows beyond the corrected models.
If it ran each ``c_i`` at ``phi`` times its corrected model ``M_model(c_i) e^x(c_i)``, it ends
when ``sum_i dt_i / (phi M_model(c_i) e^x(c_i)) = 1``::

    phi = sum_i dt_i / (M_model(c_i) e^x(c_i)),   nu = log phi,   w_i = dt_i / (M_model(c_i) e^x(c_i) phi)

and the shared anchor at each ``N_i`` takes the target ``s(N_i) + nu`` with noise ``R / w_i``
(the share of the batch's work done there). Only ``s`` takes it: such a batch ran one mode
throughout (a batch that changed mode is not taken: its re-roling is in no model), and nothing
in it tells that mode's own error from the runtime's work. In an elastic run nearly every batch
is one, run by the incumbent; giving any share of ``nu`` to the incumbent's ``m`` would move it
against every mode that did not run, so the borrow cycle's overhead would read as a saving of
each alternative, and the decision would switch to it on the strength of the overhead alone.
The cost of that choice, written down: in an elastic run a mode whose own model is off learns it
only from batches on a fixed pool; until then its error is shared with the other mode through
``s``, and neither is ranked ahead for it.

A mode no batch has measured yet borrows the measured mode's own term, ``m(c) = m_other`` (at
its anchors' mean prefill fraction), until a batch of its own runs: the two models share the cost
surface and the workload profile their error most likely comes from, and a mode ranked on its
bare model against an incumbent corrected by its own measurements would read the incumbent's
measured shortfall as a saving of the mode nobody measured. Once it runs, its own anchors take
over.

The factor applied is ``exp(x)`` clipped to ``[1 / MAX_FACTOR, MAX_FACTOR]``. ``Q``, ``R`` and the
prior variance ``P0`` are modelling choices (below): a batch's makespan varies ~3-8 % from seed
to seed (``R``, docs/predictor.md), and the correction should follow a change of workload within a
few batches (``Q``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

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


def _where(n_workers: int, n_prefill: int | None) -> tuple[str, float]:
    """A configuration's anchor set and prefill fraction ``f`` (colocation: 0)."""
    if n_prefill is None:
        return "colocated", 0.0
    return "split", n_prefill / max(n_workers, 1)


@dataclass(frozen=True, slots=True)
class MakespanCorrection:
    """The anchors of the closed loop (module docstring): each mode's own term and the term both
    share; the empty one corrects nothing."""

    colocated: tuple[Anchor, ...] = ()
    split: tuple[Anchor, ...] = ()
    shared: tuple[Anchor, ...] = ()
    batches: int = 0

    def _x(self, kind: str, n_workers: float, f: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """One anchor set's estimate at ``(f, N)``, unclipped (module docstring)."""
        anchors: tuple[Anchor, ...] = getattr(self, kind)
        if not anchors:
            return np.zeros_like(f)
        arr = np.asarray([a[:4] for a in anchors], dtype=np.float64)
        df = f[:, None] - arr[None, :, 0]
        dn = math.log2(max(n_workers, 1.0)) - arr[None, :, 1]
        rho = _rho(df, dn)
        exact = (np.abs(df) < 1e-9) & (np.abs(dn) < 1e-9)
        x: npt.NDArray[np.float64] = (rho * arr[None, :, 2]).sum(axis=1) / (1.0 + rho.sum(axis=1))
        hit = exact.any(axis=1)
        if hit.any():
            x = np.where(hit, (exact * arr[None, :, 2]).sum(axis=1), x)
        return x

    def _own(self, kind: str, n_workers: float, f: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """A mode's own term ``m``; a mode no batch has measured yet takes the other mode's (at
        its anchors' mean prefill fraction) until one does (module docstring)."""
        if getattr(self, kind):
            return self._x(kind, n_workers, f)
        other = "split" if kind == "colocated" else "colocated"
        anchors: tuple[Anchor, ...] = getattr(self, other)
        if not anchors:
            return np.zeros_like(f)
        at = np.full(1, sum(a[0] for a in anchors) / len(anchors))
        return np.full_like(f, float(self._x(other, n_workers, at)[0]))

    def _terms(self, n_workers: int, n_prefill: int | None) -> tuple[str, float, float, float]:
        """A configuration's anchor set, prefill fraction and two terms ``s(N)``, ``m(c)``."""
        kind, f = _where(n_workers, n_prefill)
        s_n = float(self._x("shared", float(n_workers), np.zeros(1))[0])
        return kind, f, s_n, float(self._x(kind, float(n_workers), np.array([f]))[0])

    def log_factors(self, n_workers: float, n_prefill: npt.NDArray[np.float64] | None) -> npt.NDArray[np.float64]:
        """``x(c) = s(N) + m(c)`` for colocation on ``n_workers`` (``n_prefill`` None) or for
        each split ``(n_prefill, n_workers - n_prefill)``; shape (1,) or (M,)."""
        x = self._x("shared", n_workers, np.zeros(1))
        if n_prefill is None:
            x = x + self._own("colocated", n_workers, np.zeros(1))
        else:
            f = np.asarray(n_prefill, dtype=np.float64) / max(n_workers, 1.0)
            x = x + self._own("split", n_workers, f)
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
        return self.observe_pieces([(n_workers, n_prefill, measured_s, model_s)])

    def observe_pieces(self, pieces: Sequence[tuple[int, int | None, float, float]]) -> MakespanCorrection:
        """The loop after one batch that ran configurations ``(n_workers, n_prefill, dt_i,
        model_s_i)`` in turn: ``dt_i`` seconds of the batch under each, whose models' uncorrected
        makespan is ``model_s_i`` (module docstring: one configuration corrects its mode's term,
        several the shared term by ``nu``, ``w_i``); unchanged if a piece has no positive finite time
        and makespan."""
        if not pieces or not all(math.isfinite(dt) and math.isfinite(m) and dt > 0 and m > 0
                                 for _n, _p, dt, m in pieces):
            return self
        done: dict[tuple[int, int | None], float] = {}
        for n, n_p, dt, m in pieces:
            done[(n, n_p)] = done.get((n, n_p), 0.0) + dt / m
        if len(done) == 1:
            ((c, ratio),) = done.items()
            kind, f = _where(*c)
            out = self._drift(kind)._measure(kind, c[0], f, math.log(ratio), R)
        else:  # the pool changed: one innovation nu, taken by the shared term of each piece's budget
            terms = {c: self._terms(*c) for c in done}  # (kind, f, s(N), m(c)) before this batch
            corrected = {c: w / math.exp(terms[c][2] + terms[c][3]) for c, w in done.items()}
            phi = sum(corrected.values())
            nu = math.log(phi)
            out = self._drift("shared")
            for kind in {terms[c][0] for c in done}:
                out = out._drift(kind)
            for c, w in sorted(corrected.items(), key=lambda kv: -kv[1]):
                out = out._measure("shared", c[0], 0.0, terms[c][2] + nu, R * phi / w)
        return replace(out, batches=self.batches + 1)

    def _drift(self, kind: str) -> MakespanCorrection:
        """Every anchor of a set drifts by ``Q``: one batch has passed."""
        anchors: tuple[Anchor, ...] = getattr(self, kind)
        return self._with(kind, tuple((f, ln, x, p + Q, seen) for f, ln, x, p, seen in anchors))

    def _measure(self, kind: str, n_workers: int, f: float, z: float, r: float) -> MakespanCorrection:
        """One Kalman update of the anchor at ``(f, N)`` of a set (and its neighbours) by the
        measurement ``z`` of noise ``r``."""
        ln = math.log2(max(n_workers, 1))
        anchors = list(getattr(self, kind))
        idx = next((i for i, a in enumerate(anchors) if abs(a[0] - f) < 1e-9 and abs(a[1] - ln) < 1e-9), None)
        if idx is None:  # a new anchor starts from its neighbours' estimate
            x0 = float(self._x(kind, float(n_workers), np.array([f]))[0])
            anchors.append((f, ln, x0, P0 + Q, self.batches))
            idx = len(anchors) - 1
        out: list[Anchor] = []
        for i, (fa, la, x, p, seen) in enumerate(anchors):
            if i == idx:
                k = p / (p + r)
                out.append((fa, la, x + k * (z - x), (1.0 - k) * p, self.batches + 1))
            else:
                rho = float(_rho(np.asarray(fa - f), np.asarray(la - ln)))
                out.append((fa, la, x + rho * p / (p + r) * (z - x), p, seen))
        out = sorted(out, key=lambda a: -a[4])[:MAX_ANCHORS]
        return self._with(kind, tuple(sorted(out)))

    def _with(self, kind: str, anchors: tuple[Anchor, ...]) -> MakespanCorrection:
        if kind == "colocated":
            return replace(self, colocated=anchors)
        if kind == "split":
            return replace(self, split=anchors)
        return replace(self, shared=anchors)
