"""The workload profile: per-turn statistics of a rollout batch, and the views each mode reads.

``WorkloadProfile`` (index ``k = 1..K``, stored at ``k - 1``):

* ``survival[k]`` S(k): the fraction of trajectories that reach turn k (the tail that makes the
  batch makespan a *last-trajectory* time);
* ``new_tokens[k]`` x_k, ``cached_tokens[k]`` c_k: the prompt tokens a turn prefills and finds in
  the prefix cache, on the *colocated basis* (the worker holds the conversation's whole context:
  the previous prompt and its output), for a turn that stays on its cache-holding worker;
* ``output_tokens[k]`` o_k, ``env_s[k]`` e_k: decoded tokens and environment seconds after the
  turn (means: the makespan is linear in both);
* ``k_seq`` K_seq: the mean final context of a trajectory, the per-trajectory KV footprint of the
  memory bound (the decode pool holds the whole batch's contexts at once, so ``B K_seq`` must fit,
  not B times the longest);
* ``tail_factor`` rho = E[max_i T_i] / E[T_i] of one batch's trajectory durations (None until
  whole trajectories were seen) and ``tail_by_load``, rho per colocated load (``tail_factor_at``);
* ``tail_paths``: the turns ``(x, c, o, e)`` of the last window's slowest whole trajectories,
  ``tail_history`` those of earlier windows and ``tail_weights`` their EMA weights
  (``tail_windows``): a P:D split's makespan runs them through its stages;
* ``moved_share`` m and ``moved_hit`` h: the share of colocated turns k >= 2 served away from the
  worker that holds their prefix, and the share of its prompt such a turn found cached where it
  ran (``colocated_tokens``).

Views (what each mode's makespan model prefills; applied by the makespan functions themselves,
``stages.stages``):

* ``colocated_tokens``: a colocated pool under the router's affinity, the moved turns included;
* ``prefill_pool_tokens`` / ``prefill_pool_windows``: a P:D split's prefill workers, which hold
  the prompts they prefilled but not the outputs decoded elsewhere.

The prior comes from the workload's distributions (``from_spec``); telemetry refits it
(``fitting.fit_workload``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

from pearl.core.hardware import ProfileError
from pearl.core.makespan_correction import MakespanCorrection
from pearl.core.telemetry import Rejections

#: windows of slowest paths a workload profile keeps (``fitting.blend_tail_windows``)
TAIL_WINDOWS = 4
#: how many of the slowest whole trajectories ``tail_paths`` keeps
TAIL_PATHS = 4
#: width of a ``tail_by_load`` bucket in log2 of the per-worker load (0.5: a factor of 1.41)
TAIL_LOAD_BUCKET = 0.5
#: windows a bucket needs before ``tail_factor_at`` uses it
TAIL_LOAD_MIN_WINDOWS = 2


class PathTurn(NamedTuple):
    """One turn of an observed trajectory: new prompt tokens, cached tokens, output tokens, env s."""

    x: float
    c: float
    o: float
    e: float


#: one slowest trajectory's turns in order, and the slowest few of one window
TailPath = tuple[PathTurn, ...]
TailPaths = tuple[TailPath, ...]


class LoadBucket(NamedTuple):
    """One ``tail_by_load`` entry: the bucket ``round(log2 m0 / TAIL_LOAD_BUCKET)``, the EMA of
    ``log2 m0`` and of rho over the windows filed in it, and how many windows those were."""

    bucket: int
    log_m0: float
    rho: float
    windows: int


class TailArrays(NamedTuple):
    """The slowest paths of every kept window as arrays, longest first (``tail_arrays``)."""

    #: (P, K, 4): path r's turns ``(x, c, o, e)``, zero past its end; rows sorted by length
    turns: npt.NDArray[np.float64]
    #: per turn index k, how many leading rows are still on their path
    n_live: tuple[int, ...]
    #: row of each path in the windows' order (``paths[i]`` is ``turns[rows[i]]``)
    rows: npt.NDArray[np.intp]
    #: ``(weight, paths in the window)`` per window, newest first
    windows: tuple[tuple[float, int], ...]


class TurnTokens(NamedTuple):
    """What one mode prefills per turn (index 0 = turn 1): ``x_k``, ``c_k`` and, where the turn is a
    mixture whose mean tokens do not give its mean bilinear prefill term, ``q_k = E[x (c + x / 2)]``
    (None: ``x_k (c_k + x_k / 2)``, ``HardwareProfile.prefill_s``)."""

    new: tuple[float, ...]
    cached: tuple[float, ...]
    quad: tuple[float, ...] | None


class _DistLike(Protocol):
    @property
    def mean(self) -> float: ...
    @property
    def cv(self) -> float: ...
    @property
    def min(self) -> float: ...
    @property
    def max(self) -> float: ...


class _WorkloadLike(Protocol):
    @property
    def max_trajectory_tokens(self) -> int: ...
    @property
    def turns(self) -> _DistLike: ...
    @property
    def system_prompt_tokens(self) -> int: ...
    @property
    def observation_tokens(self) -> _DistLike: ...
    @property
    def response_tokens(self) -> _DistLike: ...
    @property
    def env_step_s(self) -> _DistLike: ...
    @property
    def prefix_cache_hit(self) -> float: ...
    @property
    def test_run_prob(self) -> float: ...
    @property
    def test_run_s(self) -> _DistLike: ...


@dataclass(frozen=True, slots=True)
class WorkloadProfile:
    """Per-turn statistics of a rollout batch (index 0 = turn 1; module docstring)."""

    survival: tuple[float, ...]
    new_tokens: tuple[float, ...]
    cached_tokens: tuple[float, ...]
    output_tokens: tuple[float, ...]
    env_s: tuple[float, ...]
    k_seq: float
    samples: int = 0
    tail_factor: float | None = None
    tail_paths: TailPaths = ()
    moved_share: float = 0.0
    moved_hit: float = 0.0
    tail_by_load: tuple[LoadBucket, ...] = ()
    tail_history: tuple[TailPaths, ...] = ()
    tail_weights: tuple[float, ...] = ()
    #: telemetry the fits screened out, by reason (``telemetry.Rejections``; not compared or hashed)
    rejected: Rejections = field(default=Rejections(), compare=False)
    #: the closed loop on measured batch makespans (``makespan_correction``), applied by
    #: ``decision.evaluate_table`` on top of the models (not compared or hashed: the models'
    #: caches do not read it)
    correction: MakespanCorrection = field(default=MakespanCorrection(), compare=False, repr=False)
    #: the hash of the fields, derived once at construction (the makespan models' caches are keyed
    #: by the profile, and hashing its nested tuples costs tens of microseconds)
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        n = len(self.survival)
        lens = {len(self.new_tokens), len(self.cached_tokens), len(self.output_tokens), len(self.env_s)}
        if n == 0 or lens != {n}:
            raise ProfileError(f"workload profile arrays must be non-empty and equally long, got {n} and {lens}")
        object.__setattr__(self, "_hash", hash((
            self.survival, self.new_tokens, self.cached_tokens, self.output_tokens, self.env_s, self.k_seq,
            self.samples, self.tail_factor, self.tail_paths, self.moved_share, self.moved_hit, self.tail_by_load,
            self.tail_history, self.tail_weights)))

    def __hash__(self) -> int:
        return self._hash

    def physical(self) -> bool:
        """Every statistic finite and non-negative, survival and the move shares in [0, 1]: a
        profile the makespan models can run on (a refit that breaks it is not used,
        ``fitting.fit_workload``; the decision evaluates nothing on it)."""
        per_turn = (*self.new_tokens, *self.cached_tokens, *self.output_tokens, *self.env_s, self.k_seq,
                    1.0 if self.tail_factor is None else self.tail_factor)
        paths = (v for window in (self.tail_paths, *self.tail_history) for path in window for turn in path for v in turn)
        return (all(math.isfinite(v) and v >= 0.0 for v in per_turn)
                and all(0.0 <= v <= 1.0 + 1e-9 for v in (*self.survival, self.moved_share, self.moved_hit))
                and all(math.isfinite(v) and v >= 0.0 for v in paths))

    @property
    def max_turns(self) -> int:
        return len(self.survival)

    @property
    def mean_turns(self) -> float:
        """``sum_k S(k)``: the turns of the mean trajectory."""
        return sum(self.survival)

    def tail_windows(self) -> tuple[tuple[float, TailPaths], ...]:
        """``(weight, paths)`` per kept window, newest first: the windows' slowest paths with the
        EMA weights ``omega_w`` a P:D split's slowest-path makespan averages its per-window maxima
        with (``disaggregated.disaggregated_makespan``); one window of weight 1 while the weights do
        not match the windows (a profile built with paths but no history)."""
        if not self.tail_paths:
            return ()
        windows = (self.tail_paths, *self.tail_history)
        if len(self.tail_weights) != len(windows):
            return ((1.0, self.tail_paths),)
        return tuple(zip(self.tail_weights, windows, strict=True))

    @property
    def tail_varies_with_load(self) -> bool:
        """Whether ``tail_factor_at`` differs between loads (two buckets in use)."""
        return self.tail_factor is not None and sum(
            1 for t in self.tail_by_load if t[3] >= TAIL_LOAD_MIN_WINDOWS) >= 2

    def tail_factor_at(self, m0: npt.ArrayLike) -> npt.NDArray[np.float64] | None:
        """The tail factor ``rho`` of a colocated batch with ``m0 = B / N`` trajectories per worker
        (array in, array out; None while no tail factor has been measured).

        rho falls as the per-worker load grows: on a loaded worker a trajectory's turns are mostly
        the other trajectories' work (their decode tokens in every iteration, their prefill
        chunks), which is shared and averages out, so durations spread less and the slowest lies
        closer to the mean; on a lightly loaded worker a trajectory's own turn count, response
        lengths and test runs set its duration.

        Estimator: the buckets of ``tail_by_load`` seen in at least ``TAIL_LOAD_MIN_WINDOWS``
        windows, made non-increasing in ``m0`` (weighted pool-adjacent-violators, ``_non_increasing``:
        a single noisy bucket must not invert the mechanism), then piecewise linear in ``log2 m0``,
        flat beyond the outermost. Without such a bucket, ``tail_factor`` (the EMA over every
        window) at every load. No slope is assumed where nothing was observed."""
        if self.tail_factor is None:
            return None
        used = [(x, y, n) for _b, x, y, n in self.tail_by_load if n >= TAIL_LOAD_MIN_WINDOWS]
        if not used:
            return np.full(np.shape(m0), self.tail_factor, dtype=np.float64)
        xs, ys = _non_increasing(sorted(used))
        q = np.log2(np.maximum(np.asarray(m0, dtype=np.float64), 1e-9))
        return np.asarray(np.interp(q, xs, ys), dtype=np.float64)

    @staticmethod
    def from_spec(w: _WorkloadLike) -> WorkloadProfile:
        """The prior before any telemetry, derived from the workload distributions.

        Turns ~ lognormal(mean, cv) clipped to [min, max]; survival S(k) = P(turns >= k). Context
        at turn k: ``ctx_k = sys + (k - 1) (o + obs)``; turns stop once ``ctx_k + o`` would exceed
        the trajectory limit. Prompt tokens ``ctx_k``; cached ``h (ctx_k - obs)`` for k > 1
        (prefix-cache hit ratio h; turn 1 is uncached); output ``o``. Environment seconds after turn
        k: a test run (mean ``e_test``) instead of a tool call (mean ``e_tool``) with probability
        ``q_k``; the last turn of a trajectory always runs the tests::

            e_k = (1 - q_k) e_tool + q_k e_test,   q_k = h_k + (1 - h_k) p_test,
            h_k = (S(k) - S(k + 1)) / S(k)   (P(turn k is the last | it is reached))

        ``K_seq = min(limit, sys + sum_k S(k) (o + obs))``.
        """
        o = _clipped_mean(w.response_tokens)
        obs = _clipped_mean(w.observation_tokens)
        e = _clipped_mean(w.env_step_s)
        e_test = _clipped_mean(w.test_run_s)
        limit = float(w.max_trajectory_tokens)
        kmax_len = max(1, int((limit - w.system_prompt_tokens - o) // (o + obs)) + 1)
        kmax = max(1, min(int(w.turns.max), kmax_len))
        surv, new, cached, out, env = [], [], [], [], []
        for k in range(1, kmax + 1):
            s = _survival(w.turns, k)
            if s <= 1e-4:
                break
            ctx = w.system_prompt_tokens + (k - 1) * (o + obs)
            c = 0.0 if k == 1 else w.prefix_cache_hit * (ctx - obs)
            s_next = _survival(w.turns, k + 1) if k < kmax else 0.0
            h = (s - s_next) / s
            q = h + (1.0 - h) * w.test_run_prob
            surv.append(s)
            new.append(ctx - c)
            cached.append(c)
            out.append(o)
            env.append((1.0 - q) * e + q * e_test)
        kseq = min(limit, w.system_prompt_tokens + sum(surv) * (o + obs))
        return WorkloadProfile(tuple(surv), tuple(new), tuple(cached), tuple(out), tuple(env), kseq)


# ------------------------------------------------------------------------------------- views
def colocated_tokens(wl: WorkloadProfile) -> TurnTokens:
    """What a colocated pool under the router's affinity prefills per turn.

    ``c_k`` is what a turn finds when it stays on its cache-holding worker, but a share
    ``m = moved_share`` of the turns ``k >= 2`` runs elsewhere and finds only the share
    ``h = moved_hit`` of its prompt cached there: it prefills ``x^m_k = (1 - h)(x_k + c_k)`` against
    ``c^m_k = h (x_k + c_k)``. The view is the mixture (turn 1 has no earlier worker)::

        x'_k = (1 - m) x_k + m x^m_k,    c'_k = (1 - m) c_k + m c^m_k     (x' + c' = x + c)
        q'_k = (1 - m) x_k (c_k + x_k / 2) + m x^m_k (c^m_k + x^m_k / 2)

    The prefill is bilinear in the tokens, so the mixture's mean tokens do not give its mean
    prefill; the makespan model uses ``P = a0 + a1 x' + a2 q'`` (exact in the mixture). With
    ``m = 0`` the view is the profile's own tokens (``quad`` None). Modelling choice: ``m`` and
    ``h`` are one measured share each for every turn and pool size."""
    m = min(max(wl.moved_share, 0.0), 1.0)
    if m <= 0.0:
        return TurnTokens(wl.new_tokens, wl.cached_tokens, None)
    h = min(max(wl.moved_hit, 0.0), 1.0)
    xs, cs, qs = [], [], []
    for k, (x, c) in enumerate(zip(wl.new_tokens, wl.cached_tokens, strict=True)):
        q = x * (c + x / 2.0)
        if k == 0:
            xs.append(x)
            cs.append(c)
            qs.append(q)
            continue
        xm, cm = (1.0 - h) * (x + c), h * (x + c)
        xs.append((1.0 - m) * x + m * xm)
        cs.append((1.0 - m) * c + m * cm)
        qs.append((1.0 - m) * q + m * xm * (cm + xm / 2.0))
    return TurnTokens(tuple(xs), tuple(cs), tuple(qs))


def prefill_pool_tokens(wl: WorkloadProfile) -> TurnTokens:
    """What a P:D split's prefill workers prefill per turn.

    ``c_k`` is on the colocated basis (the worker holds the previous prompt *and* its output). A
    prefill worker holds only the prompts it prefilled: the previous output was decoded on a decode
    worker, whose KV is not sent back. With ``P_{k-1} = x_{k-1} + c_{k-1}`` the previous prompt and
    ``o_{k-1}`` its output, the cache hit scales with what is held::

        c^P_k = c_k P_{k-1} / (P_{k-1} + o_{k-1}),    x^P_k = x_k + c_k - c^P_k     (k >= 2)

    Exact for an ideal cache (``c_k = P_{k-1} + o_{k-1}`` gives ``c^P_k = P_{k-1}``) and for a
    proportional reuse; turn 1 as it is. Modelling choice: a hit ratio ``c_k / (P_{k-1} +
    o_{k-1})`` that does not depend on what is held."""
    turns = _pd_restate(list(zip(wl.new_tokens, wl.cached_tokens, wl.output_tokens, strict=True)))
    return TurnTokens(tuple(x for x, _c in turns), tuple(c for _x, c in turns), None)


def prefill_pool_windows(wl: WorkloadProfile) -> tuple[tuple[float, TailPaths], ...]:
    """``wl.tail_windows()`` with every path restated for the prefill pool, each turn from its own
    path's previous turn (``prefill_pool_tokens``)."""

    def restate(paths: TailPaths) -> TailPaths:
        return tuple(
            tuple(PathTurn(x, c, o, e) for (x, c), (_x, _c, o, e) in zip(_pd_restate([t[:3] for t in path]), path,
                                                                         strict=True))
            for path in paths)

    return tuple((wt, restate(ps)) for wt, ps in wl.tail_windows())


def _pd_restate(turns: Sequence[tuple[float, float, float]]) -> list[tuple[float, float]]:
    """``(x^P, c^P)`` per turn from the turns' colocated ``(x, c, o)`` in order
    (``prefill_pool_tokens``); the first turn as it is."""
    out = [(x, c) for x, c, _o in turns[:1]]
    for (px, pc, po), (x, c, _o) in itertools.pairwise(turns):
        held = px + pc + po  # P_{k-1} = x + c is the same prompt on either basis
        c_p = c * max(px + pc, 0.0) / held if held > 0 and c > 0 else c
        out.append((x + c - c_p, c_p))
    return out


def tail_arrays(windows: tuple[tuple[float, TailPaths], ...]) -> TailArrays | None:
    """``windows``' paths as arrays (``TailArrays``), longest first; None without paths."""
    paths = [path for _wt, ps in windows for path in ps]
    if not paths:
        return None
    order = sorted(range(len(paths)), key=lambda i: -len(paths[i]))
    k_max = len(paths[order[0]])
    turns = np.zeros((len(paths), k_max, 4), dtype=np.float64)
    rows = np.empty(len(paths), dtype=np.intp)
    for r, i in enumerate(order):
        turns[r, : len(paths[i])] = paths[i]
        rows[i] = r
    lengths = np.sort(np.array([len(p) for p in paths]))
    n_live = tuple(int(v) for v in len(paths) - np.searchsorted(lengths, np.arange(k_max), side="right"))
    return TailArrays(np.maximum(turns, 0.0), n_live, rows, tuple((wt, len(ps)) for wt, ps in windows))


# ------------------------------------------------------------------------------- distributions
def _non_increasing(pts: Sequence[tuple[float, float, int]]) -> tuple[list[float], list[float]]:
    """Weighted pool-adjacent-violators fit of ``(x, y, weight)`` sorted by x: the closest
    (least squares) non-increasing y. Returns (xs, fitted ys)."""
    blocks: list[list[float]] = []  # [sum w*y, sum w, count]
    for _x, y, w in pts:
        blocks.append([w * y, float(w), 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] < blocks[-1][0] / blocks[-1][1]:
            sy, sw, c = blocks.pop()
            blocks[-1][0] += sy
            blocks[-1][1] += sw
            blocks[-1][2] += c
    ys = [b[0] / b[1] for b in blocks for _ in range(int(b[2]))]
    return [p[0] for p in pts], ys


def _lognormal_params(d: _DistLike) -> tuple[float, float]:
    s2 = math.log(1.0 + d.cv * d.cv)
    return math.log(d.mean) - s2 / 2.0, math.sqrt(s2)


def _survival(d: _DistLike, k: int) -> float:
    """P(X >= k) for X ~ lognormal(mean, cv) clipped to [min, max] (cv = 0: a constant)."""
    if k <= d.min:
        return 1.0
    if k > d.max:
        return 0.0
    if d.cv == 0:
        return 1.0 if d.mean >= k else 0.0
    mu, sigma = _lognormal_params(d)
    z = (math.log(k - 0.5) - mu) / sigma  # continuity correction: turns are integers
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def _clipped_mean(d: _DistLike, n: int = 64) -> float:
    """Mean of the clipped lognormal by quadrature over n quantiles (deterministic)."""
    if d.cv == 0:
        return min(max(d.mean, d.min), d.max)
    mu, sigma = _lognormal_params(d)
    total = 0.0
    for i in range(n):
        p = (i + 0.5) / n
        x = math.exp(mu + sigma * _norm_ppf(p))
        total += min(max(x, d.min), d.max)
    return total / n


def _norm_ppf(p: float) -> float:
    """Inverse standard normal CDF (Acklam's rational approximation, |error| < 1.2e-9)."""
    a = (-3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02, 1.383577518672690e02,
         -3.066479806614716e01, 2.506628277459239e00)
    b = (-5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02, 6.680131188771972e01,
         -1.328068155288572e01)
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00, -2.549732539343734e00,
         4.374664141464968e00, 2.938163982698783e00)
    dd = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00, 3.754408661907416e00)
    lo = 0.02425
    if p < lo:
        q = math.sqrt(-2 * math.log(p))
        return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / (
            (((dd[0] * q + dd[1]) * q + dd[2]) * q + dd[3]) * q + 1)
    if p > 1 - lo:
        return -_norm_ppf(1 - p)
    q = p - 0.5
    r = q * q
    return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q / (
        ((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)
