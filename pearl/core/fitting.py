"""Fitting the profiles to telemetry: ``fit_hardware`` and ``fit_workload``.

The *shape* of each cost comes from first principles (``hardware``) and telemetry calibrates its
*scale*, robustly; the workload's per-turn statistics are measured directly. Each fit takes one
window of ``TelemetryRecord`` s and EMA-blends it into the previous profile with weight ``alpha``
(the workload is not assumed stationary, paper Sec. 5)::

    theta' = theta + alpha_w (theta_window - theta),    alpha_w = first_window_alpha(samples, alpha)

Screening (``telemetry`` module docstring, the table of reasons): records with NaN, infinite or
negative values or impossible token counts are dropped; the hardware fit also drops a request that
computed tokens in no time; each dropped record is counted by reason on the returned profile
(``rejected``). A refit whose coefficients or statistics come out negative or non-finite is not
used: the previous profile is returned with ``non_physical_fit`` counted. A window with no usable
record returns the previous profile (with the window's rejections counted, if any).

Hardware (``fit_hardware``), each scale ``k = 1 + alpha_w (s - 1)`` on the prior's coefficients:

* prefill: one scale ``s`` on ``(a0, a1, a2)``, the service-time ratio of the uncontended requests
  (``_service_scale``): a prefill worker batches the chunks of every queued request into each
  iteration, so a request's measured prefill also spans the others' compute, which the makespan
  models add themselves (the prefill queue, the colocated stall);
* transfer: one scale on ``(g0, g1)``, the median of observed / predicted over the disaggregated
  records;
* decode, from iteration records where the engine gives them (``iterations``): the window's
  records join the profile's sample store and, once a role holds enough samples, the two scales
  are fitted on the store (``iteration_fit``: stall-free iterations, bucketed retirement,
  non-negative scales); otherwise from the requests, as follows;
* decode, from the requests (``request_decode_fit``): two scales on the memory branch's fixed
  and per-sequence parts, by least squares on the stall-free per-token decode time.

Workload (``fit_workload``):

* per turn k, the means over the window's records of the prompt, output tokens and environment
  seconds (the makespan is linear in o and e, so it needs E[o] and E[e]); the cached tokens over
  the turns that stayed on their cache-holding worker (``moved`` records apart), on the colocated
  basis (``_colocated_basis``); ``x_k`` = mean prompt - ``c_k``;
* ``moved_share``: the share of colocated records of turns k >= 2 that moved; ``moved_hit``: the
  share of the moved turns' prompt tokens they found cached;
* survival from the trajectories that ended (a ``final`` record gives the trajectory's turn count);
  ``K_seq`` the mean final context ``prompt + output`` of those records;
* ``tail_factor`` rho = max / mean duration of the trajectories seen whole (``_tail_factor``), and
  its entry in ``tail_by_load`` at the window's colocated load (``_colocated_load``);
* ``tail_paths``: the window's slowest whole trajectories (``_tail_paths``), kept over
  ``TAIL_WINDOWS`` windows with EMA weights (``blend_tail_windows``).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from statistics import fmean, median

from pearl.core.hardware import HardwareProfile
from pearl.core.iteration_fit import refit_decode, with_samples
from pearl.core.request_decode_fit import _blend, _fit_decode
from pearl.core.telemetry import IterationRecord, Mode, Rejection, TelemetryRecord
from pearl.core.workload import (
    TAIL_LOAD_BUCKET,
    TAIL_PATHS,
    TAIL_WINDOWS,
    LoadBucket,
    PathTurn,
    TailPaths,
    WorkloadProfile,
)

#: ``_service_scale``: the low quantile that marks an uncontended request, and the band above it
#: whose median is taken (robust to timing jitter of either sign)
SERVICE_QUANTILE = 0.1
SERVICE_BAND = 1.25
#: fewest whole trajectories in a window for a tail-factor estimate or slowest paths
MIN_TRAJECTORIES_FOR_TAIL = 8
#: a window's colocated share of records below which it does not update ``tail_by_load``
TAIL_LOAD_MIN_COLOCATED = 0.8


def first_window_alpha(samples: int, alpha: float) -> float:
    """The EMA weight of a window for what the prior only guesses: 1 while the profile has seen no
    telemetry (``samples == 0``), else ``alpha``.

    Used for every hardware scale (the prior's MFU and bandwidth efficiencies are data-sheet
    guesses) and for the cache and router statistics of the workload: each turn's cached share of
    its prompt, ``moved_share`` and ``moved_hit`` (the prior's ``prefix_cache_hit`` and a zero
    moved share are placeholders: what a turn finds cached is the engine's and the router's doing).
    The workload's own distributions (turns, prompt, output and environment time per turn), which
    the config states, blend with ``alpha`` from the first window on: a single batch's turn counts
    and lengths carry sampling noise."""
    return 1.0 if samples <= 0 else alpha


# ------------------------------------------------------------------------------------ hardware
def fit_hardware(prior: HardwareProfile, records: Sequence[TelemetryRecord], alpha: float = 0.5,
                 iterations: Sequence[IterationRecord] = ()) -> HardwareProfile:
    """Calibrate ``prior``'s scales on telemetry (module docstring); EMA weight ``alpha`` (1 on the
    first window: ``first_window_alpha``). ``iterations``: the window's iteration records; they join
    the profile's decode-sample store, and once a role holds enough samples the decode step is
    fitted on the store (``iteration_fit``) instead of on the requests. Where a worker that served
    requests in the window (a record's ``worker_id``) logged no iteration, the window's iterations
    are not used (``silent_worker``, counted once per such worker): the store and the decode step
    fitted on it stay as they were."""
    why: Counter[Rejection] = Counter()
    recs: list[TelemetryRecord] = []
    for r in records:
        bad = r.timing_rejection()
        if bad is None:
            recs.append(r)
        else:
            why[bad] += 1
    base = prior
    silent = {r.worker_id for r in recs if r.worker_id} - {it.worker_id for it in iterations} if iterations else set()
    if silent:  # a worker served requests but logged no iteration: the window's iterations are incomplete
        why[Rejection.SILENT_WORKER] += len(silent)
    elif iterations:
        base, why_it = with_samples(prior, iterations)
        why.update(why_it)
    refit = refit_decode(base) if base.decode_samples.buckets else None
    if not recs and refit is None:
        return replace(base, rejected=prior.rejected.plus(why)) if why or iterations else prior
    alpha = first_window_alpha(prior.samples, alpha)
    try:
        out = _fit_prefill(base, recs, alpha)
        out = _fit_transfer(base, out, recs, alpha)
        if refit is None:
            out = _fit_decode(base, out, recs, alpha)
        elif refit[1]:
            fit = refit[0]
            out = replace(out, b0=fit.b0, b_e=fit.b_e, b1=fit.b1, b2=fit.b2, b3=fit.b3, decode_measured=fit.decode_measured)
        else:
            why[Rejection.NON_PHYSICAL_FIT] += 1  # the decode step keeps its previous coefficients
    except (OverflowError, ZeroDivisionError):  # finite records whose sums overflow: no fit
        out = replace(base, a0=math.nan)
    if not out.physical():
        why[Rejection.NON_PHYSICAL_FIT] += 1
        return replace(base, rejected=prior.rejected.plus(why))
    return replace(out, samples=prior.samples + len(recs), rejected=prior.rejected.plus(why))


def _fit_prefill(prior: HardwareProfile, recs: Sequence[TelemetryRecord], alpha: float) -> HardwareProfile:
    """One scale on ``(a0, a1, a2)`` from the uncontended requests (``_service_scale``)."""
    pre = [r for r in recs if r.prefill_s > 0 and r.prompt_tokens > r.cached_tokens]
    s = _service_scale(
        [r.prefill_s for r in pre], [prior.prefill_s(r.prompt_tokens - r.cached_tokens, r.cached_tokens) for r in pre]
    )
    if s is None:
        return prior
    k = _blend(s, alpha)
    return replace(prior, a0=prior.a0 * k, a1=prior.a1 * k, a2=prior.a2 * k)


def _fit_transfer(prior: HardwareProfile, out: HardwareProfile, recs: Sequence[TelemetryRecord],
                  alpha: float) -> HardwareProfile:
    """One robust scale on ``(g0, g1)`` over the disaggregated records' transfers."""
    tr = [r for r in recs if r.transfer_s > 0 and r.mode is Mode.DISAGGREGATED]
    s = _robust_scale([r.transfer_s for r in tr], [prior.transfer_s(r.prompt_tokens) for r in tr])
    if s is None:
        return out
    k = _blend(s, alpha)
    return replace(out, g0=out.g0 * k, g1=out.g1 * k)


def _robust_scale(observed: Sequence[float], predicted: Sequence[float]) -> float | None:
    """The median of ``observed / predicted`` over the positive pairs; None without one."""
    ratios = [o / p for o, p in zip(observed, predicted, strict=True) if p > 0 and o > 0]
    if not ratios:
        return None
    return median(ratios)


def _service_scale(observed: Sequence[float], predicted: Sequence[float]) -> float | None:
    """Scale of a *service* time from response times that include sharing: the median of the
    ratios ``observed / predicted`` within ``SERVICE_BAND`` of their ``SERVICE_QUANTILE`` (the
    requests that ran without others' chunks in their iterations); None without a ratio."""
    ratios = sorted(o / p for o, p in zip(observed, predicted, strict=True) if p > 0 and o > 0)
    if not ratios:
        return None
    lo = ratios[int(SERVICE_QUANTILE * (len(ratios) - 1))]
    return median([r for r in ratios if r <= lo * SERVICE_BAND])


# ------------------------------------------------------------------------------------ workload
@dataclass(frozen=True, slots=True)
class _Window:
    """One window's records, grouped as the workload fit reads them."""

    recs: list[TelemetryRecord]
    by_turn: dict[int, list[TelemetryRecord]]
    final_turns: list[int]

    @staticmethod
    def of(recs: list[TelemetryRecord]) -> _Window:
        by_turn: dict[int, list[TelemetryRecord]] = defaultdict(list)
        for r in recs:
            by_turn[r.turn].append(r)
        return _Window(recs, by_turn, [r.turn for r in recs if r.final])


def fit_workload(prior: WorkloadProfile, records: Sequence[TelemetryRecord], alpha: float = 0.5,
                 serving: Collection[str] = ()) -> WorkloadProfile:
    """EMA-blend the per-turn statistics observed in ``records`` into ``prior`` (module docstring).

    Invalid records and records of turn < 1 (counted as ``bad_tokens``) are dropped first; an empty
    window returns ``prior`` (with its rejections counted). ``serving``: the workers that served
    during the window, where the caller knows them; one that reported nothing is counted
    (``silent_worker``) and the window's tail statistics (``tail_factor``, ``tail_by_load``,
    ``tail_paths``) are not used, since its trajectories and its share of the load are missing.
    A fit with a negative or non-finite statistic returns ``prior`` (``non_physical_fit``). Turns the window did not observe keep the prior's values (a turn past the prior's
    last takes the prior's last values, at survival 0). On the first window (``prior.samples ==
    0``) each observed turn's cached *share* of its prompt, ``moved_share`` and ``moved_hit`` are
    the window's (``first_window_alpha``); the prompt, output and environment per turn, the
    survival and ``K_seq`` blend with ``alpha``; ``tail_factor`` is the window's where the prior has
    none and blends with ``alpha`` after. The tail is trimmed past the last turn with S(k) > 1e-4.
    """
    why: Counter[Rejection] = Counter()
    good: list[TelemetryRecord] = []
    for r in records:
        bad = r.rejection() or (None if r.turn >= 1 else Rejection.BAD_TOKENS)
        if bad is None:
            good.append(r)
        else:
            why[bad] += 1
    recs = _colocated_basis(good)
    silent = set(serving) - {r.worker_id for r in recs}
    if silent:
        why[Rejection.SILENT_WORKER] += len(silent)
    if not recs:
        return replace(prior, rejected=prior.rejected.plus(why)) if why else prior
    try:
        fit = _fit_workload_window(prior, recs, alpha, bool(silent))
    except (OverflowError, ZeroDivisionError):  # finite records whose sums overflow: no fit
        fit = None
    if fit is None:
        why[Rejection.NON_PHYSICAL_FIT] += 1
        return replace(prior, rejected=prior.rejected.plus(why))
    return replace(fit, rejected=prior.rejected.plus(why))


def _fit_workload_window(prior: WorkloadProfile, recs: list[TelemetryRecord], alpha: float,
                         silent: bool) -> WorkloadProfile | None:
    """``fit_workload`` on screened records; None if a statistic comes out negative or non-finite."""
    win = _Window.of(recs)
    alpha_c = first_window_alpha(prior.samples, alpha)
    kmax = max(prior.max_turns, max(win.by_turn), max(win.final_turns, default=0))
    new, cached, out, env = _blend_turns(prior, win, kmax, alpha, first=prior.samples <= 0)
    surv, kseq = _blend_survival(prior, win, kmax, alpha)
    last = max((i for i, s in enumerate(surv) if s > 1e-4), default=0)
    sl = slice(0, last + 1)
    moved_share, moved_hit = _blend_moves(prior, win, alpha_c)
    if silent:
        tf, by_load = prior.tail_factor, prior.tail_by_load
        paths, history, weights = prior.tail_paths, prior.tail_history, prior.tail_weights
    else:
        tf, by_load = _blend_tail_factor(prior, win, alpha)
        paths, history, weights = blend_tail_windows(prior, _tail_paths(recs, _kept_share(win.by_turn)), alpha)
    fit = WorkloadProfile(
        tuple(surv[sl]), tuple(new[sl]), tuple(cached[sl]), tuple(out[sl]), tuple(env[sl]), kseq,
        samples=prior.samples + len(recs), tail_factor=tf, tail_paths=paths, moved_share=moved_share,
        moved_hit=moved_hit, tail_by_load=by_load, tail_history=history, tail_weights=weights,
        correction=prior.correction,
    )
    return fit if fit.physical() else None


def _extended(xs: tuple[float, ...], kmax: int) -> list[float]:
    """``xs`` continued to ``kmax`` turns with its last value."""
    return list(xs) + [xs[-1]] * (kmax - len(xs))


def _blend_turns(prior: WorkloadProfile, win: _Window, kmax: int, alpha: float, first: bool
                 ) -> tuple[list[float], list[float], list[float], list[float]]:
    """Per turn ``(x_k, c_k, o_k, e_k)``: the prior's, with each observed turn's means blended in.
    ``c_k`` from the turns that stayed on their cache-holding worker (all of the turn's records if
    none did); on the first window the prompt blends and its cached share is the window's."""
    new, cached = _extended(prior.new_tokens, kmax), _extended(prior.cached_tokens, kmax)
    out, env = _extended(prior.output_tokens, kmax), _extended(prior.env_s, kmax)
    for k, rs in win.by_turn.items():
        i = k - 1
        kept = [r for r in rs if not r.moved] or rs
        c_k = fmean([r.cached_tokens for r in kept])
        p_k = fmean([r.prompt_tokens for r in rs])
        if first and p_k > 0:
            prompt = new[i] + cached[i] + alpha * (p_k - new[i] - cached[i])
            cached[i] = prompt * min(c_k / p_k, 1.0)
            new[i] = prompt - cached[i]
        else:
            new[i] += alpha * (max(p_k - c_k, 0.0) - new[i])
            cached[i] += alpha * (c_k - cached[i])
        out[i] += alpha * (fmean([r.output_tokens for r in rs]) - out[i])
        env[i] += alpha * (fmean([r.env_s for r in rs]) - env[i])
    return new, cached, out, env


def _blend_survival(prior: WorkloadProfile, win: _Window, kmax: int, alpha: float) -> tuple[list[float], float]:
    """``(S(k) for k = 1..kmax, K_seq)``: the observed survival ``#{ended at >= k} / #ended`` and
    the mean final context blended into the prior's (unchanged without a ``final`` record)."""
    surv = list(prior.survival) + [0.0] * (kmax - len(prior.survival))
    kseq = prior.k_seq
    if win.final_turns:
        n = len(win.final_turns)
        obs = [sum(1 for t in win.final_turns if t >= k) / n for k in range(1, kmax + 1)]
        surv = [s + alpha * (o - s) for s, o in zip(surv, obs, strict=True)]
        ends = [r.prompt_tokens + r.output_tokens for r in win.recs if r.final]
        kseq += alpha * (sum(ends) / len(ends) - kseq)
    return surv, kseq


def _blend_moves(prior: WorkloadProfile, win: _Window, alpha: float) -> tuple[float, float]:
    """``(moved_share, moved_hit)`` blended over the colocated records of turns k >= 2."""
    moved_share, moved_hit = prior.moved_share, prior.moved_hit
    later = [r for r in win.recs if r.turn > 1 and r.mode is Mode.COLOCATED]
    if not later:
        return moved_share, moved_hit
    moved_share += alpha * (sum(r.moved for r in later) / len(later) - moved_share)
    moved = [r for r in later if r.moved]
    prompt = sum(r.prompt_tokens for r in moved)
    if prompt > 0:
        moved_hit += alpha * (min(sum(r.cached_tokens for r in moved) / prompt, 1.0) - moved_hit)
    return moved_share, moved_hit


def _blend_tail_factor(prior: WorkloadProfile, win: _Window, alpha: float
                       ) -> tuple[float | None, tuple[LoadBucket, ...]]:
    """``(tail_factor, tail_by_load)``: the window's rho blended into the prior's (taken as is
    where the prior has none), and filed at the window's colocated load."""
    tf_obs = _tail_factor(win.recs)
    if tf_obs is None:
        return prior.tail_factor, prior.tail_by_load
    tf = tf_obs if prior.tail_factor is None else prior.tail_factor + alpha * (tf_obs - prior.tail_factor)
    m0 = _colocated_load(win.recs)
    if m0 is None:
        return tf, prior.tail_by_load
    return tf, _blend_tail_by_load(prior.tail_by_load, math.log2(m0), tf_obs, alpha)


def blend_tail_windows(
    prior: WorkloadProfile, paths: TailPaths, alpha: float
) -> tuple[TailPaths, tuple[TailPaths, ...], tuple[float, ...]]:
    """The new window's slowest ``paths`` in front of the prior's kept windows, and their weights.

    One window's slowest trajectories are a single draw of the batch maximum ``E[max_i T_i]``,
    which swings batch to batch on a heavy-tailed workload, so a split's estimate is blended like
    ``rho``: the EMA over windows of the per-window maximum, truncated at ``TAIL_WINDOWS``::

        M_PD = sum_w omega_w max_{j in w} T_j,   omega_w = alpha (1 - alpha)^w  (w = 0 newest),
        the oldest kept window carrying the rest, (1 - alpha)^(W - 1), so sum_w omega_w = 1

    (``W`` windows kept). A window without enough whole trajectories adds none and leaves the
    weights as they were. Modelling choice: the paths are the workload's (tokens and environment
    time per turn), not the allocation's, so windows served by other pools or modes are pooled as
    they are; a window's maximum is taken per candidate allocation before averaging
    (``disaggregated``), since which path is slowest depends on the allocation."""
    if not paths:
        return prior.tail_paths, prior.tail_history, prior.tail_weights
    if not prior.tail_paths:
        return paths, (), (1.0,)
    history = (prior.tail_paths, *prior.tail_history)[: TAIL_WINDOWS - 1]
    n = 1 + len(history)
    weights = (*(alpha * (1.0 - alpha) ** i for i in range(n - 1)), (1.0 - alpha) ** (n - 1))
    return paths, history, weights


def _colocated_load(recs: Sequence[TelemetryRecord]) -> float | None:
    """Trajectories per worker ``m0 = max(A / N_eff, 1)`` of a colocated window: ``A`` the distinct
    trajectories its colocated records belong to, ``N_eff = (sum_w n_w)^2 / sum_w n_w^2`` the
    participation ratio of the workers' turn counts ``n_w`` (= N for a balanced pool; a worker that
    served few turns counts for its share). None if under ``TAIL_LOAD_MIN_COLOCATED`` of the
    records are colocated (a P:D split's tail is modelled by its slowest paths, not rho), a
    colocated record lacks its worker, or too few trajectories were seen whole."""
    if not recs or len(_durations(recs)) < MIN_TRAJECTORIES_FOR_TAIL:
        return None
    coloc = [r for r in recs if r.mode is Mode.COLOCATED]
    if len(coloc) < TAIL_LOAD_MIN_COLOCATED * len(recs) or any(not r.worker_id for r in coloc):
        return None
    per: dict[str, int] = defaultdict(int)
    for r in coloc:
        per[r.worker_id] += 1
    n_eff = sum(per.values()) ** 2 / sum(v * v for v in per.values())
    return max(len({r.traj_id for r in coloc}) / n_eff, 1.0)


def _blend_tail_by_load(table: tuple[LoadBucket, ...], log_m0: float, rho: float,
                        alpha: float) -> tuple[LoadBucket, ...]:
    """EMA-blend one window's ``(log2 m0, rho)`` into its bucket (a new bucket takes it as is) and
    count the window."""
    b = round(log_m0 / TAIL_LOAD_BUCKET)
    out = {k: (x, y, n) for k, x, y, n in table}
    if b in out:
        x, y, n = out[b]
        out[b] = (x + alpha * (log_m0 - x), y + alpha * (rho - y), n + 1)
    else:
        out[b] = (log_m0, rho, 1)
    return tuple(LoadBucket(k, x, y, n) for k, (x, y, n) in sorted(out.items()))


def _kept_share(by_turn: dict[int, list[TelemetryRecord]]) -> dict[int, float]:
    """Per turn, the cached share of the prompt over the turns that stayed on their cache-holding
    worker; turns with no such record are absent."""
    out: dict[int, float] = {}
    for k, rs in by_turn.items():
        kept = [r for r in rs if not r.moved]
        prompt = sum(r.prompt_tokens for r in kept)
        if kept and prompt > 0:
            out[k] = sum(r.cached_tokens for r in kept) / prompt
    return out


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


def _tail_paths(recs: Sequence[TelemetryRecord], kept_share: dict[int, float]) -> TailPaths:
    """The ``TAIL_PATHS`` slowest whole trajectories of the window, slowest first, each as its
    turns' ``PathTurn(x, c, o, e)`` in turn order; () with fewer than ``MIN_TRAJECTORIES_FOR_TAIL``
    whole trajectories. A turn that ``moved`` found no cache where it ran; its split is the turn's
    kept cached share (``c = kept_share[k] * prompt``), as under affinity. Modelling choice: the
    slowest trajectory under another allocation is among the slowest observed ones (their turn
    counts and token paths make them slow; the allocation changes how fast each turn runs)."""

    def turn(r: TelemetryRecord) -> PathTurn:
        if r.moved and r.turn in kept_share:
            c = min(kept_share[r.turn] * r.prompt_tokens, float(r.prompt_tokens))
            return PathTurn(float(r.prompt_tokens) - c, c, float(r.output_tokens), r.env_s)
        return PathTurn(float(r.prompt_tokens - r.cached_tokens), float(r.cached_tokens), float(r.output_tokens), r.env_s)

    dur = _durations(recs)
    if len(dur) < MIN_TRAJECTORIES_FOR_TAIL:
        return ()
    order = sorted(dur, key=lambda t: (-dur[t], t))[:TAIL_PATHS]
    slow = set(order)
    turns: dict[str, list[TelemetryRecord]] = defaultdict(list)
    for r in recs:
        if r.traj_id in slow:
            turns[r.traj_id].append(r)
    return tuple(tuple(turn(r) for r in sorted(turns[t], key=lambda r: r.turn)) for t in order)


def _tail_factor(recs: Sequence[TelemetryRecord]) -> float | None:
    """``rho = max / mean`` of the durations of the trajectories seen whole in the window
    (``_durations``); None with fewer than ``MIN_TRAJECTORIES_FOR_TAIL`` of them or a zero mean.
    The window is one rollout step, about one batch of B trajectories, so the ratio estimates
    ``E[slowest of B] / E[one trajectory]`` for the configured B. An empirical ratio rather than a
    Gaussian extreme-value term: with a binding token limit the durations are left-skewed (short
    trajectories end early, long ones hit the cap)."""
    xs = list(_durations(recs).values())
    if len(xs) < MIN_TRAJECTORIES_FOR_TAIL:
        return None
    m = sum(xs) / len(xs)
    return max(xs) / m if m > 0 else None


def _colocated_basis(recs: Sequence[TelemetryRecord]) -> list[TelemetryRecord]:
    """Turns served disaggregated restated on the colocated basis of ``cached_tokens`` (what a
    worker holding the whole context would have found, ``workload.prefill_pool_tokens``)::

        c = min(round(c^P (P_{k-1} + o_{k-1}) / P_{k-1}), prompt)

    from the trajectory's previous turn in the window. A turn whose previous turn is not in the
    window is kept as measured (modelling choice: rare, the window holds whole rollout steps)."""
    by_turn = {(r.traj_id, r.turn): r for r in recs}
    out: list[TelemetryRecord] = []
    for r in recs:
        prev = by_turn.get((r.traj_id, r.turn - 1)) if r.mode is Mode.DISAGGREGATED and r.cached_tokens > 0 else None
        if prev is not None and prev.prompt_tokens > 0:
            c = r.cached_tokens * (prev.prompt_tokens + prev.output_tokens) / prev.prompt_tokens
            r = replace(r, cached_tokens=min(round(c), r.prompt_tokens))
        out.append(r)
    return out
