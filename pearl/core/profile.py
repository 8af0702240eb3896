"""Runtime profiles: what the decision engine knows about the hardware and the workload.

Two frozen values feed the makespan models (``makespan.py``):

``HardwareProfile`` — per-worker cost functions (one worker = ``tp`` GPUs):

* prefill of ``x`` new tokens on top of ``c`` cached tokens (compute-bound)::

      P(x, c) = a0 + a1 * x + a2 * x * (c + x / 2)

  ``a1 = 2 * N_active / F`` (2 FLOPs per active parameter per token), ``a2 = 4 * n_layers *
  n_heads * head_dim / F`` (QK^T and AV over the causal context), ``F = tp * peak * MFU``,
  ``a0`` the per-iteration overhead.
* one decode iteration of a batch of ``n`` sequences of mean context ``L``, a roofline (the
  slower of the memory reads and the compute binds; they overlap)::

      tau(n, L) = max( b0 + b_e * f_E(n) + b2 * n * L,     memory: weights, experts, KV reads
                       a0 + n * (b1 + b3 * L) )             compute: matmuls, attention
      f_E(n)    = 1 - (1 - k/E)^n        (fraction of routed experts touched by n tokens; 0 if dense)

  ``b0 = W_dense / BW + overhead`` (non-expert weights read once per step), ``b_e = W_experts /
  BW`` (MoE: a larger batch reads more experts), ``b2 = kv_bytes_per_token / BW`` (KV read),
  ``BW = tp * HBM * efficiency``; ``b1 = 2 * N_active / F`` (matmul compute per token), ``b3 = 4 *
  n_layers * n_heads * head_dim / F`` (attention compute per token of context), ``a0`` the
  per-iteration overhead (the prefill's). Below the ridge (``n`` up to hundreds of sequences on
  the configured models and GPUs) decode is memory-bound and ``tau = b0 + b_e f_E(n) + b2 n L``.
  Why a roofline (session 12, measured): the first version *added* the matmul compute, ``tau =
  b0 + b_e f_E(n) + b1 n + b2 n L``, as if compute and memory reads never overlapped. One
  colocated batch calibrates one common decode scale (below) at the colocated batch size, so the
  extra ``b1 n`` slope over-predicted the larger batches of a P:D split's decode pool: fitted on
  12 colocated workers (Qwen3-8B, H200, ``paper`` workload; n ~ 5), the step was 2-5 % slow at
  n = 9-12 against the emulator's iteration cost, and the splits' mean signed makespan error grew
  with the prefill workers (over 6 paired seeds: 4P8D +0.2 %, 5P7D +0.9 %, 6P6D +1.5 %), so the
  engine chose one prefill worker short of the best split. With the roofline: -0.3 / -0.0 / +0.3 %.
* KV transfer of ``t`` tokens from a prefill to a decode worker::

      X(t) = g0 + g1 * t,  g1 = kv_bytes_per_token / interconnect_bandwidth

* ``kv_capacity_tokens`` H_max: ``(tp * memory * utilisation - weights) / kv_bytes_per_token``.

``WorkloadProfile`` — per-turn statistics of a rollout batch, index ``k = 1..K``:
``survival[k]`` (fraction of trajectories that reach turn k: the tail that makes the batch
makespan a *last-trajectory* time), ``new_tokens[k]`` (prompt tokens not in the prefix cache),
``cached_tokens[k]``, ``output_tokens[k]``, ``env_s[k]`` (environment time after the turn), and
``k_seq`` (per-trajectory KV footprint K_seq of the paper's memory constraint) and, once
telemetry has seen whole trajectories, ``tail_factor`` (slowest / mean trajectory duration in a
batch: how far the batch's last trajectory lies above the mean one, ``makespan.py``) and
``tail_paths`` (the turns ``(x, c, o, e)`` of the window's 4 slowest whole trajectories, which
``makespan.py`` runs through a P:D split's per-stage state; earlier windows' in
``tail_history``, EMA-weighted by ``tail_weights``: ``_blend_tail_windows``) and
``tail_by_load`` (the tail factor per colocated load, below). Modelling choice:
K_seq is the *mean* final context of a trajectory, not a high quantile — the decode pool holds the
whole batch's contexts at once, so the sum over the batch (B * mean) is what must fit; a quantile
would count every trajectory as the longest one.

Fitting (``fit_hardware`` / ``fit_workload``) from ``TelemetryRecord`` s. Modelling choice (the
paper does not specify the estimator): the *shape* of each cost function comes from first
principles above and telemetry calibrates its *scale*, robustly:

* prefill: one scale, the service-time ratio of the uncontended requests (``_service_scale``:
  median of observed / predicted within 25 % of its lower decile; a request's measured prefill
  also spans the chunks of the requests batched with it, which the makespan model adds itself);
* transfer: one scale, the median of observed / predicted (immune to outliers);
* decode: two scales (fixed per-step part, per-sequence part) by least squares on the per-token
  decode time ``decode_s / output_tokens = s_f * (b0 + b_e f_E(n)) + s_v * b2 n L`` (the memory
  branch) after dropping records outside 5x the median ratio, over the *disaggregated* records
  whose prior step is memory-bound only (the per-sequence scale also scales the compute branch's
  ``b1``, ``b3``: a compute-bound record would need a third scale, and none of the configured
  models reaches the ridge); with
  fewer than 3 of them, or a singular or negative solution, one common scale ``s_f = s_v`` = the
  median ratio of observed / prior per-token time over all records. Why (session 2 fix): the
  split between the two parts is identified only by the spread of the decode batch ``n``;
  colocated records have ``n <= B / N`` and carry the stall correction below, whose per-worker
  mean leaves residuals correlated with ``n``. Fitted on one colocated batch (Qwen3-8B, 8
  workers) the two-scale solution was ``s_f = 0.84, s_v = 1.23`` where the emulator's truth is
  ~1.0 / ~0.95 (its median ratio: 0.99), so the decode pool's larger batches (n ~ 14) were
  predicted 7-12 % too slow and every P:D split's makespan 7-20 % too long. A colocated record's decode time includes the prefill chunks of the other
  requests that stalled its batch; the makespan model adds that interference itself (``D = o
  tau / (1 - u_oth)``), so the fit uses the stall-free time ``decode_s (1 - u_w (n - 1) / n)``
  with ``u_w`` the worker's prefill share estimated from the same window
  (``_prefill_stall_shares``). (Session 2 fix: fitting on the raw time counted the interference
  twice and made the colocated prediction 10-15 % too slow per turn in the emulator.)
* cached tokens (session 4): from the turns that stayed on their cache-holding worker; the share
  of colocated turns that did not (``moved_share``: cost-aware router moves, interruptions) is
  kept apart with the share of its prompt a moved turn found cached (``moved_hit``, session
  13), and ``WorkloadProfile.colocated_view`` charges those turns the rest of their prompt. A
  P:D split's prefill pool keeps conversations, so its model takes the kept share. (Fitted on
  one cost-routed colocated batch, 8 workers, Qwen3-8B: colocation predicted 419 s for 426 s
  measured and the splits 2-3 % slow when one share counted both; with the split 426.5 s.)
  Session 11: ``cached_tokens`` is on the colocated basis (the worker holds the previous prompt
  and its output); a turn served disaggregated found only the previous prompt on its prefill
  worker and is restated (``_colocated_basis``), and the P:D model reads the prefill pool's
  share through ``WorkloadProfile.prefill_pool_view``.
* the new fit is blended with the previous profile by an EMA of weight ``alpha`` (the workload is
  not assumed stationary, paper Sec. 5); the first window replaces the prior's guess
  (``first_window_alpha``, session 13); records with NaN, infinite or negative values are
  ignored; an empty window returns the previous profile unchanged.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from statistics import fmean, median
from typing import NamedTuple, Protocol

import numpy as np
import numpy.typing as npt


class _ModelLike(Protocol):
    @property
    def n_layers(self) -> int: ...
    @property
    def n_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def total_params_b(self) -> float: ...
    @property
    def active_params_b(self) -> float: ...
    @property
    def n_experts(self) -> int: ...
    @property
    def experts_per_token(self) -> int: ...
    @property
    def expert_params_b(self) -> float: ...
    @property
    def dtype_bytes(self) -> int: ...
    @property
    def kv_bytes_per_token(self) -> int: ...


class _HardwareLike(Protocol):
    @property
    def memory_gb(self) -> float: ...
    @property
    def hbm_bandwidth_tbs(self) -> float: ...
    @property
    def bf16_tflops(self) -> float: ...
    @property
    def interconnect_gbs(self) -> float: ...
    @property
    def interconnect_latency_s(self) -> float: ...
    @property
    def memory_utilization(self) -> float: ...
    @property
    def prefill_mfu(self) -> float: ...
    @property
    def decode_bw_efficiency(self) -> float: ...
    @property
    def step_overhead_s(self) -> float: ...


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


class ProfileError(ValueError):
    """A profile could not be built (e.g. a hardware that cannot hold the model's weights)."""


# ----------------------------------------------------------------------------------- telemetry
@dataclass(frozen=True, slots=True)
class TelemetryRecord:
    """One request (one turn of one trajectory) as measured by the engine and the pipeline."""

    traj_id: str
    turn: int
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    queue_s: float = 0.0
    prefill_s: float = 0.0
    transfer_s: float = 0.0
    decode_s: float = 0.0
    env_s: float = 0.0
    decode_concurrency: float = 1.0
    mode: str = "colocated"
    worker_id: str = ""
    final: bool = False  # the trajectory ended after this turn
    #: the turn was served by a worker other than the one that served the trajectory's previous
    #: turn (a cost-aware or slack move, an interruption): its prefix cache was elsewhere
    moved: bool = False

    def valid(self) -> bool:
        nums = (self.queue_s, self.prefill_s, self.transfer_s, self.decode_s, self.env_s, self.decode_concurrency)
        if any(not math.isfinite(v) or v < 0 for v in nums):
            return False
        return self.prompt_tokens >= 0 and 0 <= self.cached_tokens <= self.prompt_tokens and self.output_tokens >= 0


# ------------------------------------------------------------------------------------ hardware
@dataclass(frozen=True, slots=True)
class HardwareProfile:
    """Per-worker cost coefficients (see module docstring for the formulas)."""

    a0: float
    a1: float
    a2: float
    b0: float
    b_e: float
    b1: float
    b2: float
    g0: float
    g1: float
    experts_frac: float  # k / E (0 for dense models)
    kv_capacity_tokens: float  # H_max
    b3: float = 0.0  # decode attention compute per sequence per token of context (roofline's compute branch)
    samples: int = 0  # telemetry records the fit has seen

    @staticmethod
    def from_specs(model: _ModelLike, hw: _HardwareLike, tp_size: int = 1) -> HardwareProfile:
        flops = tp_size * hw.bf16_tflops * 1e12 * hw.prefill_mfu
        bw = tp_size * hw.hbm_bandwidth_tbs * 1e12 * hw.decode_bw_efficiency
        total_w = model.total_params_b * 1e9 * model.dtype_bytes
        expert_w = model.expert_params_b * 1e9 * model.dtype_bytes if model.n_experts else 0.0
        dense_w = total_w - expert_w
        kvb = model.kv_bytes_per_token
        mem = tp_size * hw.memory_gb * 1e9 * hw.memory_utilization
        if mem <= total_w:
            raise ProfileError(
                f"weights ({total_w / 1e9:.1f} GB) do not fit in {tp_size} x {hw.memory_gb} GB x "
                f"{hw.memory_utilization} usable memory"
            )
        return HardwareProfile(
            a0=hw.step_overhead_s,
            a1=2.0 * model.active_params_b * 1e9 / flops,
            a2=4.0 * model.n_layers * model.n_heads * model.head_dim / flops,
            b0=dense_w / bw + hw.step_overhead_s,
            b_e=expert_w / bw,
            b1=2.0 * model.active_params_b * 1e9 / flops,
            b2=kvb / bw,
            b3=4.0 * model.n_layers * model.n_heads * model.head_dim / flops,
            g0=hw.interconnect_latency_s,
            g1=kvb / (hw.interconnect_gbs * 1e9),
            experts_frac=(model.experts_per_token / model.n_experts) if model.n_experts else 0.0,
            kv_capacity_tokens=(mem - total_w) / kvb,
        )

    # cost functions ------------------------------------------------------------------------
    def prefill_s(self, new_tokens: float, cached_tokens: float) -> float:
        """P(x, c) = a0 + a1 x + a2 x (c + x/2)."""
        x = max(new_tokens, 0.0)
        return self.a0 + self.a1 * x + self.a2 * x * (max(cached_tokens, 0.0) + x / 2.0)

    def experts_touched(self, batch: float) -> float:
        """f_E(n) = 1 - (1 - k/E)^n; 0 for dense models."""
        if self.experts_frac <= 0.0:
            return 0.0
        return 1.0 - math.pow(1.0 - self.experts_frac, max(batch, 0.0))

    def decode_fixed_s(self, batch: float) -> float:
        return self.b0 + self.b_e * self.experts_touched(batch)

    def decode_var_s(self, batch: float, context: float) -> float:
        """The memory branch's per-sequence part: KV reads, b2 n L."""
        return self.b2 * batch * context

    def decode_compute_s(self, batch: float, context: float) -> float:
        """The roofline's compute branch: a0 + n (b1 + b3 L)."""
        return self.a0 + batch * (self.b1 + self.b3 * context)

    def decode_step_s(self, batch: float, context: float) -> float:
        """tau(n, L) = max(b0 + b_e f_E(n) + b2 n L, a0 + n (b1 + b3 L)) (module docstring)."""
        return max(self.decode_fixed_s(batch) + self.decode_var_s(batch, context), self.decode_compute_s(batch, context))

    def transfer_s(self, tokens: float) -> float:
        """X(t) = g0 + g1 t."""
        return self.g0 + self.g1 * max(tokens, 0.0)


def _robust_scale(observed: Sequence[float], predicted: Sequence[float]) -> float | None:
    ratios = [o / p for o, p in zip(observed, predicted, strict=True) if p > 0 and o > 0]
    if not ratios:
        return None
    return median(ratios)


#: ``_service_scale``: the low quantile that marks an uncontended request, and the band above it
#: whose median is taken (robust to timing jitter of either sign)
SERVICE_QUANTILE = 0.1
SERVICE_BAND = 1.25


def _service_scale(observed: Sequence[float], predicted: Sequence[float]) -> float | None:
    """Scale of a *service* time from response times that include sharing: the median of the
    ratios ``observed / predicted`` within ``SERVICE_BAND`` of their ``SERVICE_QUANTILE`` (the
    requests that ran without others' chunks in their iterations). Why (session 4): a prefill
    worker batches the chunks of every queued request into each iteration, so a request's
    measured prefill spans the others' compute too. On a PD prefill pool (Qwen3-8B, 3-4 prefill
    workers, emulator) the ratios have a floor of 1.004 and a median of 1.2-1.7 (colocated: median
    1.008); the median made every split's prefill 20-46 % slow after one PD batch, and forced PD
    chose 5P3D over the better 4P4D on 8 GPUs and lost 11 % to colocation (Fig. 7). The makespan
    model adds the sharing itself (prefill pool queue, colocated stalls: ``makespan.py``)."""
    ratios = sorted(o / p for o, p in zip(observed, predicted, strict=True) if p > 0 and o > 0)
    if not ratios:
        return None
    lo = ratios[int(SERVICE_QUANTILE * (len(ratios) - 1))]
    return median([r for r in ratios if r <= lo * SERVICE_BAND])


def first_window_alpha(samples: int, alpha: float) -> float:
    """The EMA weight of a window for what the prior only guesses: 1 while the profile has seen
    no telemetry (``samples == 0``), else ``alpha`` (session 13). Used for every hardware scale
    (the prior's MFU and bandwidth efficiencies, ``HardwareProfile.from_specs``) and for the
    cache and router statistics of the workload: each turn's cached share of its prompt, the
    moved share and what a moved turn finds (``prefix_cache_hit`` and a zero moved share are
    placeholders: what a turn finds cached is the engine's and the router's doing). The
    workload's own distributions (turns, prompt, output and environment time per turn), which
    the config states, blend with ``alpha`` from the first window on.

    Why: blending half of the prior into the first fit kept half of its error. On the
    ``qwen3-8b-h200`` config's own workload the emulator caches whole prefixes where the prior
    assumes a 0.4 hit ratio; fitted on one colocated batch of 4 workers (seed 0), colocation
    was predicted 20.6 % slow with the blend, 6.3 % with this rule and 1.9 % with every
    statistic taken from the first window; every P:D split, whose prefill runs apart from
    decode, moved by a few percent only, so the blend had made the splits look better than
    they were (over 4 seeds, with ``moved_hit``: colocation +21.9 -> +4.8 % at 4 workers,
    +11.1 -> +3.5 % at 8, +7.6 -> +4.0 % at 20). Why not the workload's
    distributions too (measured, ``paper`` preset, whose prior is the emulator's own
    distributions, Table 2 at 12 workers, 8 seeds): with the first window replacing them as
    well, a single batch's turn counts and lengths carried their sampling noise into the
    decision (4P8D chosen on 5 of 8 seeds where 5P7D is best); blended, 5P7D on 5 of 8."""
    return 1.0 if samples <= 0 else alpha


def fit_hardware(prior: HardwareProfile, records: Sequence[TelemetryRecord], alpha: float = 0.5) -> HardwareProfile:
    """Calibrate ``prior``'s scales on telemetry (module docstring); EMA-blend with weight ``alpha``
    (weight 1 on the first window: ``first_window_alpha``)."""
    recs = [r for r in records if r.valid()]
    if not recs:
        return prior
    alpha = first_window_alpha(prior.samples, alpha)
    out = prior
    # prefill: one scale on (a0, a1, a2), from the uncontended requests (``_service_scale``)
    pre = [r for r in recs if r.prefill_s > 0 and r.prompt_tokens > r.cached_tokens]
    s = _service_scale(
        [r.prefill_s for r in pre], [prior.prefill_s(r.prompt_tokens - r.cached_tokens, r.cached_tokens) for r in pre]
    )
    if s is not None:
        k = 1.0 + alpha * (s - 1.0)
        out = replace(out, a0=out.a0 * k, a1=out.a1 * k, a2=out.a2 * k)
    # transfer: one robust scale on (g0, g1)
    tr = [r for r in recs if r.transfer_s > 0 and r.mode == "disaggregated"]
    s = _robust_scale([r.transfer_s for r in tr], [prior.transfer_s(r.prompt_tokens) for r in tr])
    if s is not None:
        k = 1.0 + alpha * (s - 1.0)
        out = replace(out, g0=out.g0 * k, g1=out.g1 * k)
    # decode: two scales (fixed per step, per sequence) by least squares
    dec = [r for r in recs if r.decode_s > 0 and r.output_tokens > 0]
    if dec:
        n = [max(r.decode_concurrency, 1.0) for r in dec]
        stall = _prefill_stall_shares(out, dec)
        ys = [r.decode_s / r.output_tokens * (1.0 - stall.get(r.worker_id, 0.0) * (ni - 1.0) / ni)
              if r.mode == "colocated" else r.decode_s / r.output_tokens for r, ni in zip(dec, n, strict=True)]
        ctx = [r.prompt_tokens + r.output_tokens / 2.0 for r in dec]
        xf = [prior.decode_fixed_s(ni) for ni in n]
        xv = [prior.decode_var_s(ni, ci) for ni, ci in zip(n, ctx, strict=True)]
        tau = [prior.decode_step_s(ni, ci) for ni, ci in zip(n, ctx, strict=True)]
        ratio = [y / t for y, t in zip(ys, tau, strict=True)]
        med = median(ratio)
        keep = [i for i, q in enumerate(ratio) if med / 5.0 <= q <= med * 5.0]
        # two scales only from stall-free (disaggregated) records on the memory branch; colocated
        # ones calibrate one common scale (module docstring: the split is not identified by
        # colocated telemetry)
        free = [i for i in keep if dec[i].mode != "colocated" and xf[i] + xv[i] >= tau[i]]
        sf, sv = _lsq2([xf[i] for i in free], [xv[i] for i in free], [ys[i] for i in free])
        if sf is None or sv is None:
            sf = sv = med
        kf = 1.0 + alpha * (sf - 1.0)
        kv = 1.0 + alpha * (sv - 1.0)
        out = replace(out, b0=out.b0 * kf, b_e=out.b_e * kf, b1=out.b1 * kv, b2=out.b2 * kv, b3=out.b3 * kv)
    return replace(out, samples=prior.samples + len(recs))


def _prefill_stall_shares(hw: HardwareProfile, recs: Sequence[TelemetryRecord]) -> dict[str, float]:
    """Per colocated worker: the share ``u_w`` of its time spent in prefill, from the window alone::

        u_w = sum_r P(x_r, c_r) / sum_r (decode_s_r / n_r)     (records r served by worker w)

    ``decode_s_r / n_r`` is r's share of the worker's decode wall time (n_r requests decode at
    once), and that wall time includes every prefill chunk that stalled the batch, so the ratio is
    the prefill share of the worker's serving time. Clipped to [0, 0.95]."""
    pre: dict[str, float] = defaultdict(float)
    wall: dict[str, float] = defaultdict(float)
    for r in recs:
        if r.mode != "colocated" or not r.worker_id:
            continue
        pre[r.worker_id] += hw.prefill_s(r.prompt_tokens - r.cached_tokens, r.cached_tokens)
        wall[r.worker_id] += r.decode_s / max(r.decode_concurrency, 1.0)
    return {w: min(max(pre[w] / t, 0.0), 0.95) for w, t in wall.items() if t > 0}


def _lsq2(x1: Sequence[float], x2: Sequence[float], y: Sequence[float]) -> tuple[float | None, float | None]:
    """Least squares y ~ s1 x1 + s2 x2 (no intercept); (None, None) if singular or non-positive."""
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


# ------------------------------------------------------------------------------------ workload
#: one slowest trajectory's turns ``(x, c, o, e)`` in order, and the slowest few of one window
TailPath = tuple[tuple[float, float, float, float], ...]
TailPaths = tuple[TailPath, ...]


class TailArrays(NamedTuple):
    """The slowest paths of every kept window, longest first (``WorkloadProfile.tail_arrays``)."""

    #: (P, K, 4): path r's turns ``(x, c, o, e)``, zero past its end; rows sorted by length
    turns: npt.NDArray[np.float64]
    #: per turn index k, how many leading rows are still on their path
    n_live: tuple[int, ...]
    #: row of each path in the windows' order (``paths[i]`` is ``turns[rows[i]]``)
    rows: npt.NDArray[np.intp]
    #: ``(weight, paths in the window)`` per window, newest first
    windows: tuple[tuple[float, int], ...]


def _tail_arrays(windows: tuple[tuple[float, TailPaths], ...]
                 ) -> TailArrays:
    paths = [path for _wt, ps in windows for path in ps]
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


@dataclass(frozen=True, slots=True)
class WorkloadProfile:
    """Per-turn statistics of a rollout batch (index 0 = turn 1). See module docstring."""

    survival: tuple[float, ...]
    new_tokens: tuple[float, ...]
    cached_tokens: tuple[float, ...]
    output_tokens: tuple[float, ...]
    env_s: tuple[float, ...]
    k_seq: float
    samples: int = 0
    tail_factor: float | None = None  # slowest / mean duration of whole trajectories (None: not observed yet)
    #: the slowest whole trajectories of the last window, each as its turns' (x, c, o, e): new
    #: prompt tokens, cached tokens, output tokens, env seconds (``makespan.py``: slowest path)
    tail_paths: TailPaths = ()
    #: fraction of colocated turns (k >= 2) served away from the worker that holds their prefix
    #: cache (cost-aware moves, interruptions): ``colocated_view``
    moved_share: float = 0.0
    #: the share of its prompt a moved colocated turn found cached where it ran (token-weighted;
    #: its own earlier prefix from a previous visit, the GRPO group's shared prompt):
    #: ``colocated_view``
    moved_hit: float = 0.0
    #: the tail factor per colocated load (session 9): ``(bucket, log2 m0, rho, windows)`` per
    #: load bucket seen, ``m0`` = trajectories per worker, both EMA-blended; ``tail_factor_at``
    tail_by_load: tuple[tuple[int, float, float, int], ...] = ()
    #: the slowest paths of earlier windows, newest first (at most ``TAIL_WINDOWS - 1``), and the
    #: EMA weights of ``(tail_paths, *tail_history)`` (session 13; ``tail_windows``)
    tail_history: tuple[TailPaths, ...] = ()
    tail_weights: tuple[float, ...] = ()
    #: per turn, the mean of the prefill's bilinear term ``x (c + x / 2)`` where the turn is a
    #: mixture whose mean tokens do not give it (``colocated_view``); () = ``x_k (c_k + x_k / 2)``
    prefill_quad: tuple[float, ...] = ()
    #: memo of ``tail_arrays`` (not part of the profile's value)
    _tail_memo: TailArrays | None = field(default=None, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        n = len(self.survival)
        lens = {len(self.new_tokens), len(self.cached_tokens), len(self.output_tokens), len(self.env_s)}
        if n == 0 or lens != {n}:
            raise ProfileError(f"workload profile arrays must be non-empty and equally long, got {n} and {lens}")
        if self.prefill_quad and len(self.prefill_quad) != n:
            raise ProfileError(f"prefill_quad has {len(self.prefill_quad)} turns, the profile {n}")

    def prefill_quads(self) -> tuple[float, ...]:
        """Per turn, the mean bilinear prefill term ``E[x (c + x / 2)]`` (``prefill_quad``, or
        from the mean tokens); ``P_k = a0 + a1 x_k + a2 q_k``."""
        if self.prefill_quad:
            return self.prefill_quad
        return tuple(x * (c + x / 2.0) for x, c in zip(self.new_tokens, self.cached_tokens, strict=True))

    @property
    def max_turns(self) -> int:
        return len(self.survival)

    def tail_arrays(self) -> TailArrays | None:
        """The kept windows' slowest paths as arrays (``TailArrays``), built once per profile;
        None without paths."""
        if self._tail_memo is None and self.tail_paths:
            object.__setattr__(self, "_tail_memo", _tail_arrays(self.tail_windows()))
        return self._tail_memo

    def tail_windows(self) -> tuple[tuple[float, TailPaths], ...]:
        """``(weight, paths)`` per kept window, newest first: the windows' slowest paths with the
        EMA weights a P:D split's slowest-path makespan averages its per-window maxima with
        (``makespan.disaggregated_makespan``); one window of weight 1 before any history."""
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
        (array in, array out; None while no tail factor has been measured: ``tail_factor``).

        Measured (session 9, emulator, ``paper`` workload, B = 64, fixed colocated pools, mean of
        8 batches each): rho falls as the per-worker load grows,

            m0 = B / N           16     8      4      2.7    2
            Qwen3-30B-A3B        1.123  1.145  1.199  1.248  1.268   (sd 0.02 -> 0.09)
            Qwen3-8B             1.134  1.157  1.189  1.210  1.238   (sd 0.02 -> 0.07)

        Why: a trajectory's turns on a loaded worker are mostly the *other* trajectories' work
        (their decode tokens in every iteration, their prefill chunks), which is shared and
        averages out, so durations spread less and the slowest lies closer to the mean; on a
        lightly loaded worker a trajectory's own turn count, response lengths and test runs set
        its duration. One ``tail_factor`` for every pool size put an elastic run's predictions
        out by the difference: on Qwen3-30B-A3B (segment like-12) the windows on 4 workers
        (1.10-1.13) pulled the EMA to 1.11-1.15 while the 16-worker windows ran at 1.16-1.33.

        Estimator: the buckets of ``tail_by_load`` seen in at least ``TAIL_LOAD_MIN_WINDOWS``
        windows (one window's rho is the max over one batch: sd up to 0.09 at B = 64), made
        non-increasing in ``m0`` (weighted pool-adjacent-violators: the mechanism above; a single
        noisy bucket must not invert it), then piecewise linear in ``log2 m0``, flat beyond the
        outermost. Without such a bucket, ``tail_factor`` (the EMA over every window). Modelling
        choices: no slope is assumed where nothing was observed, so with one load seen (a fixed
        pool) every pool size gets that load's rho, as before session 9; the table above is not
        built in."""
        if self.tail_factor is None:
            return None
        used = [(x, y, n) for _b, x, y, n in self.tail_by_load if n >= TAIL_LOAD_MIN_WINDOWS]
        if not used:
            return np.full(np.shape(m0), self.tail_factor, dtype=np.float64)
        xs, ys = _non_increasing(sorted(used))
        q = np.log2(np.maximum(np.asarray(m0, dtype=np.float64), 1e-9))
        return np.asarray(np.interp(q, xs, ys), dtype=np.float64)

    def prefill_pool_view(self) -> WorkloadProfile:
        """The per-turn tokens a P:D split's prefill workers prefill (session 11).

        ``cached_tokens`` is on the colocated basis: a colocated worker holds a conversation's
        whole context, the previous turn's prompt *and* its output (``fit_workload`` restates
        turns served disaggregated on this basis). A prefill worker holds only the prompts it
        prefilled: the previous output was decoded on a decode worker, whose KV is not sent back
        (SGLang's PD prefill server caches the prompt in its radix tree; the emulator does the
        same, ``pearl/engines/emulated.py``). With ``P_{k-1} = x_{k-1} + c_{k-1}`` the previous
        turn's prompt and ``o_{k-1}`` its output, the cache hit scales with what is held::

            c^P_k = c_k P_{k-1} / (P_{k-1} + o_{k-1}),    x^P_k = x_k + c_k - c^P_k     (k >= 2)

        Exact for an ideal cache (``c_k = P_{k-1} + o_{k-1}`` gives ``c^P_k = P_{k-1}``: the
        prefill pool recomputes the previous output and the new observation) and for the
        emulator's proportional reuse; turn 1 and the slowest paths' first turns are uncached.
        The slowest observed paths (``tail_paths``) are restated the same way, each from its own
        previous turn. Modelling choice: a hit ratio ``c_k / (P_{k-1} + o_{k-1})`` that does not
        depend on what is held (an LRU cache that evicts by recency would keep the newest part).
        """
        return _prefill_pool_view(self)

    def colocated_view(self) -> WorkloadProfile:
        """The per-turn tokens a colocated pool under the router's affinity actually prefills:
        ``cached_tokens`` is what a turn finds when it stays on its cache-holding worker
        (``fit_workload``), but a share ``m = moved_share`` of colocated turns runs elsewhere and
        finds only the share ``h = moved_hit`` of its prompt cached there. With ``x_k + c_k`` the
        prompt, a moved turn prefills ``x^m_k = (1 - h)(x_k + c_k)`` against ``c^m_k = h (x_k +
        c_k)``, and the view is the mixture::

            x'_k = (1 - m) x_k + m x^m_k,    c'_k = (1 - m) c_k + m c^m_k     (x' + c' = x + c)

        for turns ``k >= 2`` (turn 1 has no earlier worker). A P:D split's prefill pool keeps
        conversations (slack rule only) and uses the profile as is. Modelling choice: ``m`` and
        ``h`` are one measured share each for every turn and pool size.

        The prefill time is bilinear in the tokens, ``P(x, c) = a0 + a1 x + a2 x (c + x / 2)``,
        so the mean tokens of the mixture do not give its mean prefill. The view keeps the
        mixture's mean bilinear term (session 13)::

            q'_k = (1 - m) x_k (c_k + x_k / 2) + m x^m_k (c^m_k + x^m_k / 2)

        and the makespan model uses ``P = a0 + a1 x' + a2 q'`` (``makespan.Stages``); the linear
        term is exact with ``x'``.

        Why (session 13, measured on the emulator, the ``qwen3-8b-h200`` config's own workload, 4
        colocated workers, one batch): the cost-aware router balanced 16 trajectories a worker
        by moving 31 % of the turns on a fixed pool, and a moved turn found ~half its prompt
        cached where it ran (an earlier visit), so it took 0.65 s of prefill at 17K tokens, not
        the 1.3 s of a whole prompt. Charged its whole prompt through ``P(x', c')``, the later
        turn groups got 0.41-0.90 s of prefill for the 0.17-0.30 s they took, and through the
        worker's prefill share ``u`` every decode stalled 30-50 % where it stalled 20-30 %:
        colocation was predicted 8-23 % slow (the splits within 1 %), and PEARL took P:D splits
        that ran slower."""
        m = min(max(self.moved_share, 0.0), 1.0)
        if m <= 0.0:
            return self
        h = min(max(self.moved_hit, 0.0), 1.0)
        xs, cs, qs = [], [], []
        for k, (q, x, c) in enumerate(zip(self.prefill_quads(), self.new_tokens, self.cached_tokens, strict=True)):
            if k == 0:  # turn 1 has no earlier worker to move from (the share is of turns k >= 2)
                xs.append(x)
                cs.append(c)
                qs.append(q)
                continue
            xm, cm = (1.0 - h) * (x + c), h * (x + c)
            xs.append((1.0 - m) * x + m * xm)
            cs.append((1.0 - m) * c + m * cm)
            qs.append((1.0 - m) * q + m * xm * (cm + xm / 2.0))
        return replace(self, new_tokens=tuple(xs), cached_tokens=tuple(cs), moved_share=0.0, moved_hit=0.0,
                       prefill_quad=tuple(qs))

    @property
    def mean_turns(self) -> float:
        return sum(self.survival)

    @staticmethod
    def from_spec(w: _WorkloadLike) -> WorkloadProfile:
        """The prior before any telemetry, derived from the workload distributions.

        Turns ~ lognormal(mean, cv) clipped to [min, max]; survival S(k) = P(turns >= k). Context
        at turn k: ``ctx_k = sys + (k - 1) * (o + obs)``; turns stop once ``ctx_k + o`` would
        exceed the trajectory limit. Prompt tokens ``ctx_k``; cached ``h * (ctx_k - obs)`` for
        k > 1 (prefix-cache hit ratio h; turn 1 is uncached); output ``o``. Environment seconds
        after turn k: a test run (mean ``e_test``) instead of a tool call (mean ``e_tool``) with
        probability ``q_k``; the last turn of a trajectory always runs the tests::

            e_k = (1 - q_k) e_tool + q_k e_test,   q_k = h_k + (1 - h_k) p_test,
            h_k = (S(k) - S(k + 1)) / S(k)   (P(turn k is the last | it is reached))

        (Session 2: the first prior used ``e_tool`` alone and missed the tests, about 10 s per
        trajectory on the ``paper`` workload.)
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
        # K_seq: expected final context of a trajectory, E[ctx at its last turn] + o
        kseq = min(limit, w.system_prompt_tokens + sum(surv) * (o + obs))
        return WorkloadProfile(tuple(surv), tuple(new), tuple(cached), tuple(out), tuple(env), kseq)


def _pd_restate(turns: Sequence[tuple[float, float, float]]) -> list[tuple[float, float]]:
    """``(x^P, c^P)`` per turn from the turns' colocated ``(x, c, o)`` in order: each turn's cache
    hit scaled by the previous turn's prompt over its prompt + output
    (``WorkloadProfile.prefill_pool_view``); the first turn as it is."""
    out = [(x, c) for x, c, _o in turns[:1]]
    for (px, pc, po), (x, c, _o) in itertools.pairwise(turns):
        held = px + pc + po  # P_{k-1} = x + c is the same prompt on either basis
        c_p = c * max(px + pc, 0.0) / held if held > 0 and c > 0 else c
        out.append((x + c - c_p, c_p))
    return out


@functools.lru_cache(maxsize=64)
def _prefill_pool_view(wl: WorkloadProfile) -> WorkloadProfile:
    turns = _pd_restate(list(zip(wl.new_tokens, wl.cached_tokens, wl.output_tokens, strict=True)))

    def restate(paths: TailPaths) -> TailPaths:
        return tuple(
            tuple((x, c, o, e) for (x, c), (_x, _c, o, e) in zip(_pd_restate([t[:3] for t in path]), path, strict=True))
            for path in paths)

    return replace(wl, new_tokens=tuple(x for x, _c in turns), cached_tokens=tuple(c for _x, c in turns),
                   tail_paths=restate(wl.tail_paths), tail_history=tuple(restate(h) for h in wl.tail_history),
                   prefill_quad=())


def _colocated_basis(recs: Sequence[TelemetryRecord]) -> list[TelemetryRecord]:
    """Turns served disaggregated restated on the colocated basis of ``cached_tokens`` (what a
    worker holding the whole context would have found, ``WorkloadProfile.prefill_pool_view``):
    ``c = c^P (P_{k-1} + o_{k-1}) / P_{k-1}`` from the trajectory's previous turn in the window,
    capped at the prompt. A turn whose previous turn is not in the window is kept as measured
    (modelling choice: rare, the window holds whole rollout steps)."""
    by_turn = {(r.traj_id, r.turn): r for r in recs}
    out: list[TelemetryRecord] = []
    for r in recs:
        prev = by_turn.get((r.traj_id, r.turn - 1)) if r.mode == "disaggregated" and r.cached_tokens > 0 else None
        if prev is not None and prev.prompt_tokens > 0:
            c = r.cached_tokens * (prev.prompt_tokens + prev.output_tokens) / prev.prompt_tokens
            r = replace(r, cached_tokens=min(round(c), r.prompt_tokens))
        out.append(r)
    return out


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


def fit_workload(prior: WorkloadProfile, records: Sequence[TelemetryRecord], alpha: float = 0.5) -> WorkloadProfile:
    """EMA-blend per-turn statistics observed in ``records`` into ``prior``.

    Survival is estimated from trajectories that ended (a record with ``final=True`` gives the
    trajectory's number of turns); per-turn token and env values are the arithmetic means of each
    turn's records (invalid records are dropped first); ``tail_factor`` from the trajectories seen whole
    (``_tail_factor``), EMA-blended once a previous estimate exists. Turns never observed keep the prior's values; an empty or
    invalid window returns ``prior`` unchanged. The first window (``prior.samples == 0``) replaces
    what it observes (``first_window_alpha``).
    """
    recs = _colocated_basis([r for r in records if r.valid() and r.turn >= 1])
    if not recs:
        return prior
    # the cache and the router's statistics start from the first window; the workload's own
    # distributions blend with the configured prior from the start (``first_window_alpha``)
    alpha_c = first_window_alpha(prior.samples, alpha)
    first = prior.samples <= 0
    by_turn: dict[int, list[TelemetryRecord]] = defaultdict(list)
    for r in recs:
        by_turn[r.turn].append(r)
    final_turns = [r.turn for r in recs if r.final]
    kmax = max(prior.max_turns, max(by_turn), max(final_turns, default=0))

    def ext(xs: tuple[float, ...]) -> list[float]:
        return list(xs) + [xs[-1]] * (kmax - len(xs))

    surv = ext(prior.survival)
    if len(prior.survival) < kmax:
        surv[len(prior.survival):] = [0.0] * (kmax - len(prior.survival))
    new, cached, out, env = ext(prior.new_tokens), ext(prior.cached_tokens), ext(prior.output_tokens), ext(prior.env_s)
    # Means, not medians (session 2 fix): the makespan is a sum of per-turn costs that are linear
    # in o and e, so it needs E[o] and E[e]; both are right-skewed (lognormal response lengths,
    # rare long test runs), and the median under-stated them (env by ~40 % on the ``paper``
    # workload: tool calls of median 0.7 s, mean 1.2 s with the test runs), which made the
    # predicted makespan 3-8 % too short.
    # Cached tokens from the turns that stayed on their cache-holding worker (session 4): with
    # cost-aware affinity (``affinity.py``) colocated turns move when that pays, and a moved turn
    # finds no cache; counting those made the profile's cached share ~20 % lower than a PD prefill
    # pool (which keeps conversations) gets, and every P:D split's prediction 4-9 % slow (Table 2,
    # 8 GPUs). ``cached[k]`` is what affinity gives; ``new[k]`` = mean prompt - ``cached[k]``. The
    # colocated model thus assumes a balanced pool *with* the cache kept - what the cost rule
    # trades towards (it moves a turn only when the move's latency, re-prefill included, is lower).
    for k, rs in by_turn.items():
        i = k - 1
        kept = [r for r in rs if not r.moved] or rs
        c_k = fmean([r.cached_tokens for r in kept])
        p_k = fmean([r.prompt_tokens for r in rs])
        if first and p_k > 0:
            # the first window: the prompt blends, its cached share is the window's
            prompt = new[i] + cached[i] + alpha * (p_k - new[i] - cached[i])
            cached[i] = prompt * min(c_k / p_k, 1.0)
            new[i] = prompt - cached[i]
        else:
            new[i] += alpha * (max(p_k - c_k, 0.0) - new[i])
            cached[i] += alpha * (c_k - cached[i])
        out[i] += alpha * (fmean([r.output_tokens for r in rs]) - out[i])
        env[i] += alpha * (fmean([r.env_s for r in rs]) - env[i])
    kseq = prior.k_seq
    if final_turns:
        n = len(final_turns)
        obs_surv = [sum(1 for t in final_turns if t >= k) / n for k in range(1, kmax + 1)]
        surv = [s + alpha * (o - s) for s, o in zip(surv, obs_surv, strict=True)]
        ends = [r.prompt_tokens + r.output_tokens for r in recs if r.final]
        kseq += alpha * (sum(ends) / len(ends) - kseq)
    # trim the tail where no trajectory survives
    last = max((i for i, s in enumerate(surv) if s > 1e-4), default=0)
    sl = slice(0, last + 1)
    later = [r for r in recs if r.turn > 1 and r.mode == "colocated"]
    moved_share, moved_hit = prior.moved_share, prior.moved_hit
    if later:
        moved_share += alpha_c * (sum(r.moved for r in later) / len(later) - moved_share)
        moved = [r for r in later if r.moved]
        prompt = sum(r.prompt_tokens for r in moved)
        if prompt > 0:
            moved_hit += alpha_c * (min(sum(r.cached_tokens for r in moved) / prompt, 1.0) - moved_hit)
    tf_obs = _tail_factor(recs)
    tf = tf_obs
    if tf is not None and prior.tail_factor is not None:
        tf = prior.tail_factor + alpha * (tf - prior.tail_factor)
    by_load = prior.tail_by_load
    m0 = _colocated_load(recs)
    if tf_obs is not None and m0 is not None:
        by_load = _blend_tail_by_load(by_load, math.log2(m0), tf_obs, alpha)
    paths, history, weights = _blend_tail_windows(prior, _tail_paths(recs, _kept_share(by_turn)), alpha)
    return WorkloadProfile(
        tuple(surv[sl]), tuple(new[sl]), tuple(cached[sl]), tuple(out[sl]), tuple(env[sl]), kseq,
        samples=prior.samples + len(recs), tail_factor=tf if tf is not None else prior.tail_factor,
        tail_paths=paths, moved_share=moved_share, moved_hit=moved_hit, tail_by_load=by_load,
        tail_history=history, tail_weights=weights,
    )


#: windows of slowest paths a workload profile keeps (``_blend_tail_windows``)
TAIL_WINDOWS = 4


def _blend_tail_windows(
    prior: WorkloadProfile, paths: TailPaths, alpha: float
) -> tuple[TailPaths, tuple[TailPaths, ...], tuple[float, ...]]:
    """The new window's slowest ``paths`` in front of the prior's kept windows, and their weights.

    A P:D split's makespan is the slowest observed path run through the split's stages
    (``makespan.py``), an estimate of ``E[max_i T_i]`` over one batch. One window's slowest
    trajectories are a single draw of that maximum, and on a heavy-tailed workload it swings
    batch to batch (session 13, measured: the ``qwen3-8b-h200`` config's own workload, rho
    1.7-2.3, on the `make simulate` segment: the best split on 20 workers predicted 277-411 s
    from one refit to the next while colocation, whose ``rho`` is EMA-blended, moved 299-388 s;
    PEARL switched mode on the difference, 5 switches, and ran 1.3 % fewer batches an hour than
    without splits). So the split's estimate is blended like ``rho``: the EMA over windows of
    the per-window maximum, truncated at ``TAIL_WINDOWS`` windows::

        M_PD = sum_w omega_w max_{j in w} T_j,  omega_w = alpha (1 - alpha)^w  (w = 0 newest),
        the oldest kept window carrying the rest, (1 - alpha)^(W - 1), so sum_w omega_w = 1

    (``W`` windows kept). A window without enough whole trajectories adds none and leaves the
    weights as they were. Modelling choice: the paths are the workload's (tokens and environment
    time per turn), not the allocation's, so windows served by other pools or modes are pooled
    as they are; a window's maximum is taken per candidate allocation before averaging, since
    which path is slowest depends on the allocation."""
    if not paths:
        return prior.tail_paths, prior.tail_history, prior.tail_weights
    if not prior.tail_paths:
        return paths, (), (1.0,)
    history = (prior.tail_paths, *prior.tail_history)[: TAIL_WINDOWS - 1]
    n = 1 + len(history)
    weights = (*(alpha * (1.0 - alpha) ** i for i in range(n - 1)), (1.0 - alpha) ** (n - 1))
    return paths, history, weights


#: width of a ``tail_by_load`` bucket in log2 of the per-worker load (0.5: a factor of 1.41)
TAIL_LOAD_BUCKET = 0.5
#: windows a bucket needs before ``tail_factor_at`` uses it
TAIL_LOAD_MIN_WINDOWS = 2
#: a window's colocated share of records below which it does not update ``tail_by_load``
TAIL_LOAD_MIN_COLOCATED = 0.8


def _colocated_load(recs: Sequence[TelemetryRecord]) -> float | None:
    """Trajectories per worker ``m0 = A / N_eff`` of a colocated window: ``A`` the distinct
    trajectories its colocated records belong to (about B: the query side is ``B / N``),
    ``N_eff = (sum_w n_w)^2 / sum_w n_w^2`` the participation ratio of the workers' turn counts
    ``n_w`` (= N for a balanced pool; a worker that served few turns - a pool grown for the tail,
    a worker that left early - counts for its share). None if under ``TAIL_LOAD_MIN_COLOCATED``
    of the records are colocated (a P:D split's tail is modelled by its slowest paths, not rho),
    a record lacks its worker, or too few trajectories were seen whole (no rho to file)."""
    if len(_durations(recs)) < MIN_TRAJECTORIES_FOR_TAIL or not recs:
        return None
    coloc = [r for r in recs if r.mode == "colocated"]
    if len(coloc) < TAIL_LOAD_MIN_COLOCATED * len(recs) or any(not r.worker_id for r in coloc):
        return None
    per: dict[str, int] = defaultdict(int)
    for r in coloc:
        per[r.worker_id] += 1
    n_eff = sum(per.values()) ** 2 / sum(v * v for v in per.values())
    return max(len({r.traj_id for r in coloc}) / n_eff, 1.0)


def _blend_tail_by_load(table: tuple[tuple[int, float, float, int], ...], log_m0: float, rho: float,
                        alpha: float) -> tuple[tuple[int, float, float, int], ...]:
    """EMA-blend one window's ``(log2 m0, rho)`` into its bucket (a new bucket takes it as is) and
    count the window."""
    b = round(log_m0 / TAIL_LOAD_BUCKET)
    out = {k: (x, y, n) for k, x, y, n in table}
    if b in out:
        x, y, n = out[b]
        out[b] = (x + alpha * (log_m0 - x), y + alpha * (rho - y), n + 1)
    else:
        out[b] = (log_m0, rho, 1)
    return tuple(sorted((k, x, y, n) for k, (x, y, n) in out.items()))


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


def _kept_share(by_turn: dict[int, list[TelemetryRecord]]) -> dict[int, float]:
    """Per turn, the cached share of the prompt over the turns that stayed on their cache-holding
    worker (``fit_workload``); turns with no such record are absent."""
    out: dict[int, float] = {}
    for k, rs in by_turn.items():
        kept = [r for r in rs if not r.moved]
        prompt = sum(r.prompt_tokens for r in kept)
        if kept and prompt > 0:
            out[k] = sum(r.cached_tokens for r in kept) / prompt
    return out


#: fewest whole trajectories in a window for a tail-factor estimate
MIN_TRAJECTORIES_FOR_TAIL = 8


#: how many of the slowest whole trajectories ``tail_paths`` keeps
TAIL_PATHS = 4


def _durations(recs: Sequence[TelemetryRecord]) -> dict[str, float]:
    """Duration (queue + prefill + transfer + decode + env s) of every trajectory seen whole in
    the window (a record of turn 1 and a ``final`` record)."""
    dur: dict[str, float] = defaultdict(float)
    first: set[str] = set()
    done: set[str] = set()
    for r in recs:
        dur[r.traj_id] += r.queue_s + r.prefill_s + r.transfer_s + r.decode_s + r.env_s
        if r.turn == 1:
            first.add(r.traj_id)
        if r.final:
            done.add(r.traj_id)
    return {t: dur[t] for t in first & done}


def _tail_paths(recs: Sequence[TelemetryRecord], kept_share: dict[int, float] | None = None
                ) -> TailPaths:
    """The ``TAIL_PATHS`` slowest whole trajectories of the window, each as its turns' (new
    prompt tokens, cached tokens, output tokens, env s) in turn order; () with fewer than
    ``MIN_TRAJECTORIES_FOR_TAIL`` whole trajectories. Modelling choice: the slowest trajectory
    under another allocation is taken to be among the slowest observed ones (their turn counts
    and token paths make them slow; the allocation changes how fast each turn runs). A turn that
    ``moved`` found no cache where it ran; its split is the turn's kept cached share
    (``kept_share[k]``, ``c = share * prompt``), as under affinity."""
    share = kept_share or {}

    def split(r: TelemetryRecord) -> tuple[float, float]:
        if r.moved and r.turn in share:
            c = min(share[r.turn] * r.prompt_tokens, float(r.prompt_tokens))
            return float(r.prompt_tokens) - c, c
        return float(r.prompt_tokens - r.cached_tokens), float(r.cached_tokens)

    dur = _durations(recs)
    if len(dur) < MIN_TRAJECTORIES_FOR_TAIL:
        return ()
    slow = set(sorted(dur, key=lambda t: (-dur[t], t))[:TAIL_PATHS])
    turns: dict[str, list[TelemetryRecord]] = defaultdict(list)
    for r in recs:
        if r.traj_id in slow:
            turns[r.traj_id].append(r)
    return tuple(
        tuple((*split(r), float(r.output_tokens), r.env_s) for r in sorted(turns[t], key=lambda r: r.turn))
        for t in sorted(slow, key=lambda t: (-dur[t], t))
    )


def _tail_factor(recs: Sequence[TelemetryRecord]) -> float | None:
    """max / mean of the durations of the trajectories seen whole in the window (a record of turn
    1 and a ``final`` record), duration = sum over its turns of queue + prefill + transfer + decode
    + env seconds; None with fewer than ``MIN_TRAJECTORIES_FOR_TAIL`` of them. The window is one
    rollout step, i.e. about one batch of B trajectories, so the ratio estimates
    E[slowest of B] / E[one trajectory] for the configured B. (An empirical ratio rather than a
    Gaussian extreme-value term: with a binding token limit the durations are left-skewed - short
    trajectories end early, long ones hit the cap - and the emulator's cv of ~0.17 with a
    max / mean of ~1.18 at B = 64 fits no normal tail.)"""
    xs = list(_durations(recs).values())
    if len(xs) < MIN_TRAJECTORIES_FOR_TAIL:
        return None
    m = sum(xs) / len(xs)
    return max(xs) / m if m > 0 else None
