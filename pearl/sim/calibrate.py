"""Fit the emulator's free constants to the paper's single-system measurements.

``python -m pearl calibrate`` measures, for a set of constants (``EmulatorPhysics`` /
``WorkloadMeans``, ``pearl/engines/emulated_physics.py``), one rollout batch of the ``paper``
workload on fixed pools (``simulate.measure_makespan``: colocation and P:D splits) for ``S``
paired workload seeds (the same seeds for every set of constants), and scores the in-sample
targets by weighted least squares on makespan *ratios*:

    loss(theta) = sum_t w_t ((y_t(theta) - y*_t) / sigma_t)^2

``y_t`` a target's measured quantity (a ratio of makespans averaged over the seeds, or a share;
each batch with the trainer's weight update landing ``train.step_time_s`` into it, as in the
asynchronous steady state: the update flushes every prefix cache),
``y*_t`` the paper's value, ``sigma_t`` its tolerance (half the paper's range where it gives one,
else 2 points; one batch's noise is 3-8 %, so ``S >= 8`` puts the mean's noise near 1-2 %).
Rank targets (the best split at a batch size) score ``max(0, ln(M_target / M_best)) / sigma``.

The targets (``TARGETS``; docs/paper.md):

* Sec. 2.1 ``rollout-share``: 8B, ROLL's 4 colocated GPUs, ``M / (M + T_train)`` = 81.8 %
  (rollout-bound synchronous step, ``T_train`` = 163.8 s);
* Sec. 3.1 ``gpus-16-24``, ``gpus-24-32``: 8B colocated, ``M(24) / M(16)`` = 1 - 10.3 %,
  ``M(32) / M(24)`` = 1 - 8.9 %; ``unlimited``: ``M(64) / T_train`` = 216.3 / 163.8;
* Sec. 3.2 ``prefill-share``: 30B-A3B colocated on 8 GPUs, prefill's share of busy time 26.48 %;
  ``prompt-token-share``: the same run, prompt tokens (computed or served from the prefix cache)
  over all tokens, 96.68 % ("prefill processes 96.68 % of tokens": a prompt's cached tokens are
  processed by the prefill batch that serves it);
* Sec. 3.3 ``bs32``, ``bs96``: 30B-A3B on 8 GPUs, best split's throughput over colocation
  ``M_coloc / M_best - 1`` = +9.7 % / -6.1 %; ``bs48-4P4D``, ``bs64-5P3D``: those splits are the best;
* Fig. 7 ``+PD`` column, ``fig7-<model>-<n>``: best split over colocation on n = 4, 8, 12, 16 GPUs,
  -20.6 % / -30.9 % at 4 (8B / 30B-A3B), +12.8..15.3 % / +7.8..8.9 % at 8-16 (the midpoint,
  sigma half the range plus 1 point).

Table 3 is not a target: its reconfiguration times are ``EmulatorSpec`` ranges set to the table
itself, and no constant here moves them.

Search: a coarse grid (``grid`` levels per fitted constant: the centres of ``grid`` equal cells
of its bounds), then coordinate
local search from the best grid point (each constant stepped by half a cell, halved
after a round without improvement, ``local_rounds`` rounds), each point scored on the same seeds;
the winner is scored again on ``final_seeds`` seeds, and every target's residual is written into
``configs/emulator/<model>-h200.yaml`` (``fit``) with the constants. Cost: one point is about
(number of pools x allocations) x seeds batches of ~0.4 CPU s; ``--targets``, ``--seeds``,
``--grid``, ``--params`` and ``--local-rounds`` bound it, and ``--evaluate`` scores the files
as they are (no search).

Public names: ``Target``, ``TARGETS``, ``Param``, ``PARAMS``, ``evaluate``, ``calibrate``,
``CalibrationError``.
"""

from __future__ import annotations

import functools
import itertools
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pearl.config import load_config
from pearl.engines.emulated import EmulatedEngine
from pearl.engines.emulated_physics import (
    EmulatorPhysics,
    PhysicsFile,
    WorkloadMeans,
    load_physics,
    min_memory_utilization,
    physics_file,
)
from pearl.sim.presets import load_preset_config
from pearl.sim.simulate import measure_makespan

MODELS = {"8b": "qwen3-8b-h200", "30b": "qwen3-30b-a3b-h200"}
T_TRAIN_S = 163.8  # Sec. 3.1: a training step, Qwen3-8B


class CalibrationError(ValueError):
    """Bad calibration input (unknown target or constant, too few seeds, empty grid)."""


# ------------------------------------------------------------------------------ measurements
#: the P:D splits scored per pool size (the best of them is "the best split"): every split of 4 GPUs,
#: 2P6D .. 5P3D of 8 (where the best split of batch 32-96 lies), two prefill shares (1/3, 1/2) of 12 and 16
SPLITS: dict[int, tuple[int, ...]] = {4: (1, 2, 3), 8: (2, 3, 4, 5), 12: (4, 6), 16: (5, 8)}


@dataclass(frozen=True)
class Key:
    model: str
    n: int
    label: str
    batch: int = 64


#: the phase-split shares a run keeps besides its makespan (``EmulatedEngine.phase_split``)
SHARES = ("prefill_time_share", "prompt_token_share")
Runs = dict[tuple[Key, int], tuple[float, ...]]  # (key, seed) -> (makespan, *SHARES)


def _split_labels(n: int) -> list[str]:
    return [f"{p}P{n - p}D" for p in SPLITS.get(n, tuple(range(1, n)))]


# ------------------------------------------------------------------------------ targets
@dataclass(frozen=True)
class Target:
    name: str
    section: str
    paper: float
    sigma: float
    allocations: Callable[[], list[Key]]
    value: Callable[[Callable[[Key], list[float]], Callable[[Key, str], list[float]]], float]
    weight: float = 1.0
    rank: bool = False  # value is ln(M_target / M_best) >= 0, scored one-sided

    def residual(self, y: float) -> float:
        if self.rank:
            return max(0.0, y) / self.sigma
        return (y - self.paper) / self.sigma


def _paired(ms: Callable[[Key], list[float]], a: Key, b: Key) -> float:
    """mean over seeds of M_a / M_b"""
    return statistics.fmean(x / y for x, y in zip(ms(a), ms(b), strict=True))


def _best_gain(model: str, n: int, batch: int = 64) -> tuple[Callable[[], list[Key]], Callable[..., float]]:
    coloc = Key(model, n, "coloc", batch)
    splits = [Key(model, n, lab, batch) for lab in _split_labels(n)]

    def keys() -> list[Key]:
        return [coloc, *splits]

    def value(ms: Callable[[Key], list[float]], _ps: Callable[[Key, str], list[float]]) -> float:
        # the best split per seed (the engine's pick is the predictor's business, not the physics')
        per_seed = [min(col) for col in zip(*(ms(k) for k in splits), strict=True)]
        return statistics.fmean(c / b - 1.0 for c, b in zip(ms(coloc), per_seed, strict=True))

    return keys, value


def _is_best(model: str, n: int, label: str, batch: int) -> tuple[Callable[[], list[Key]], Callable[..., float]]:
    splits = [Key(model, n, lab, batch) for lab in _split_labels(n)]
    target = Key(model, n, label, batch)

    def value(ms: Callable[[Key], list[float]], _ps: Callable[[Key, str], list[float]]) -> float:
        means = {k: statistics.fmean(ms(k)) for k in splits}
        return math.log(means[target] / min(means.values()))

    return lambda: splits, value


def _targets() -> list[Target]:
    out: list[Target] = []
    c4, c16, c24, c32, c64 = (Key("8b", n, "coloc") for n in (4, 16, 24, 32, 64))
    out.append(Target("rollout-share", "Sec. 2.1", 0.818, 0.02, lambda: [c4],
                      lambda ms, _ps: statistics.fmean(m / (m + T_TRAIN_S) for m in ms(c4))))
    out.append(Target("gpus-16-24", "Sec. 3.1", 1 - 0.103, 0.02, lambda: [c16, c24],
                      lambda ms, _ps: _paired(ms, c24, c16)))
    out.append(Target("gpus-24-32", "Sec. 3.1", 1 - 0.089, 0.02, lambda: [c24, c32],
                      lambda ms, _ps: _paired(ms, c32, c24)))
    out.append(Target("unlimited", "Sec. 3.1", 216.3 / T_TRAIN_S, 0.05, lambda: [c64],
                      lambda ms, _ps: statistics.fmean(ms(c64)) / T_TRAIN_S))
    p8 = Key("30b", 8, "coloc")
    out.append(Target("prefill-share", "Sec. 3.2", 0.2648, 0.01, lambda: [p8],
                      lambda _ms, ps: statistics.fmean(ps(p8, "prefill_time_share"))))
    out.append(Target("prompt-token-share", "Sec. 3.2", 0.9668, 0.005, lambda: [p8],
                      lambda _ms, ps: statistics.fmean(ps(p8, "prompt_token_share"))))
    for batch, paper in ((32, 0.097), (96, -0.061)):
        keys, value = _best_gain("30b", 8, batch)
        out.append(Target(f"bs{batch}", "Sec. 3.3", paper, 0.02, keys, value))
    for batch, label in ((48, "4P4D"), (64, "5P3D")):
        keys, value = _is_best("30b", 8, label, batch)
        out.append(Target(f"bs{batch}-{label}", "Sec. 3.3", 0.0, 0.02, keys, value, rank=True))
    for model, at4, lo, hi in (("8b", -0.206, 0.128, 0.153), ("30b", -0.309, 0.078, 0.089)):
        for n in (4, 8, 12, 16):
            keys, value = _best_gain(model, n)
            paper, sigma = (at4, 0.02) if n == 4 else ((lo + hi) / 2, (hi - lo) / 2 + 0.01)
            out.append(Target(f"fig7-{model}-{n}", "Fig. 7 +PD", paper, sigma, keys, value))
    return out


TARGETS: list[Target] = _targets()


#: the paper's colocated single-system figures (Sec. 2.1, 3.1, 3.2): ``--targets colocated``; with the
#: measured kernel tables the fit sees these only, so every P:D figure is out of sample
COLOCATED = ("rollout-share", "gpus-16-24", "gpus-24-32", "unlimited", "prefill-share", "prompt-token-share")


def select_targets(spec: str | None) -> list[Target]:
    """``spec``: comma list of target names or prefixes (``fig7``, ``bs``; ``colocated`` for
    ``COLOCATED``), or None for all."""
    if not spec:
        return list(TARGETS)
    want = [s.strip() for s in spec.split(",") if s.strip()]
    want = [n for w in want for n in (COLOCATED if w == "colocated" else (w,))]
    out = [t for t in TARGETS if any(t.name == w or t.name.startswith(w) for w in want)]
    bad = [w for w in want if not any(t.name == w or t.name.startswith(w) for t in TARGETS)]
    if bad or not out:
        raise CalibrationError(f"unknown targets {bad or spec!r}; known: {', '.join(t.name for t in TARGETS)}")
    return out


# ------------------------------------------------------------------------------ constants
@dataclass(frozen=True)
class Param:
    name: str
    section: str  # "engine" (EmulatorPhysics) or "workload" (WorkloadMeans)
    lo: float
    hi: float


def _bounds(section: str, name: str) -> tuple[float, float]:
    model = EmulatorPhysics if section == "engine" else WorkloadMeans
    lo = hi = None
    for m in model.model_fields[name].metadata:
        lo = getattr(m, "ge", lo)
        hi = getattr(m, "le", hi)
    assert lo is not None and hi is not None, name
    return float(lo), float(hi)


#: the constants the fit may move (every EmulatorPhysics field but the MoE kernel curve, which is
#: fitted to kernel tables, and every workload mean), with their bounds from the pydantic fields
PARAMS: dict[str, Param] = {
    name: Param(name, section, *_bounds(section, name))
    for section, names in (
        ("engine", ("host_cpu_factor", "launch_per_layer_s", "kv_read_efficiency", "weight_read_efficiency",
                    "decode_step_s", "prefill_forward_s", "prefill_mfu", "memory_utilization")),
        ("workload", ("response_tokens", "observation_tokens", "env_step_s")),
    )
    for name in names
}


#: constants of the datasheet formulas only (emulator.costs: datasheet); the measured kernel tables
#: cover what they stand for, so a fit on the database's costs cannot move them
DATASHEET_PARAMS = ("kv_read_efficiency", "weight_read_efficiency", "decode_step_s", "prefill_forward_s", "prefill_mfu")


@functools.lru_cache(maxsize=8)
def _memory_floor(model_cfg: str) -> float:
    """The least memory utilisation at which 5P3D holds batch 64 at the trajectory limit (Sec. 3.3),
    rounded up to the third decimal (the precision a physics file states it in)."""
    cfg = load_preset_config(model_cfg, "paper")
    m = cfg.model
    floor = min_memory_utilization(m.total_params_b * 1e9 * m.dtype_bytes, m.kv_bytes_per_token, cfg.hardware.memory_gb,
                                   64, cfg.workload.max_trajectory_tokens, 3, cfg.cluster.tp_size)
    return math.ceil(1000 * floor - 1e-9) / 1000


@functools.lru_cache(maxsize=8)
def _config_memory(model_cfg: str) -> float:
    """The run config's memory utilisation (what a physics file without the constant emulates)."""
    return load_config(model_cfg).hardware.memory_utilization


Theta = dict[str, float]


def _apply(base: PhysicsFile, theta: Mapping[str, float], model_cfg: str) -> tuple[EmulatorPhysics, WorkloadMeans]:
    eng = {k: v for k, v in theta.items() if PARAMS[k].section == "engine"}
    wl = {k: v for k, v in theta.items() if PARAMS[k].section == "workload"}
    # the floor holds for the effective value: fitted, the file's, or else the run config's
    floor = _memory_floor(model_cfg)
    mem = eng.get("memory_utilization", base.engine.memory_utilization)
    if mem is None:
        mem = _config_memory(model_cfg)
    if mem < floor or "memory_utilization" in eng:
        eng["memory_utilization"] = min(max(mem, floor), PARAMS["memory_utilization"].hi)
    return base.engine.model_copy(update=eng), base.workload.model_copy(update=wl)


# ------------------------------------------------------------------------------ evaluation
@dataclass
class Evaluation:
    theta: Theta
    loss: float
    values: dict[str, float]
    residuals: dict[str, float]
    batches: int
    wall_s: float
    runs: Runs = field(default_factory=dict, repr=False)


def _measure(model: str, base: PhysicsFile, theta: Theta, key: Key, seed: int) -> tuple[float, ...]:
    """One batch of ``key`` on ``seed``, with the trainer's weight update landing ``train.step_time_s``
    into it (the asynchronous steady state: the previous batch's step ends then): its makespan and
    ``SHARES``."""
    cfg_name = MODELS[model]
    phys, means = _apply(base, theta, cfg_name)
    cfg = load_preset_config(cfg_name, "paper", {"workload.seed": seed, "workload.batch_size": key.batch}, means)
    engines: list[EmulatedEngine] = []
    m, _ = measure_makespan(cfg, key.n, key.label, 1, physics=phys, engines=engines, sync_at_s=cfg.train.step_time_s)
    split = engines[0].phase_split()
    return (m, *(split[k] for k in SHARES))


def _measure_job(job: tuple[str, PhysicsFile, Theta, Key, int]) -> tuple[float, ...]:
    return _measure(*job)


def evaluate(theta: Theta, targets: Sequence[Target], seeds: int, bases: Mapping[str, PhysicsFile] | None = None,
             progress: Callable[[str], None] | None = None, pool: Executor | None = None) -> Evaluation:
    """Score ``theta`` (constants over the physics files) on ``targets`` with seeds 0..seeds-1;
    ``pool`` runs the batches in worker processes (same results: every batch is seeded)."""
    if seeds < 1:
        raise CalibrationError(f"seeds={seeds}: need at least 1")
    bases = bases or {m: _load(m) for m in MODELS}
    t0 = time.perf_counter()
    keys = sorted({k for t in targets for k in t.allocations()}, key=lambda k: (k.model, k.batch, k.n, k.label))
    jobs = [(k.model, bases[k.model], theta, k, s) for k in keys for s in range(seeds)]
    results = pool.map(_measure_job, jobs, chunksize=max(1, len(jobs) // 64)) if pool else map(_measure_job, jobs)
    runs: Runs = {}
    for i, (job, r) in enumerate(zip(jobs, results, strict=True)):
        runs[(job[3], job[4])] = r
        if progress and (i + 1) % (10 * seeds) == 0:
            progress(f"    {(i + 1) // seeds}/{len(keys)} allocations x {seeds} seeds")

    def ms(k: Key) -> list[float]:
        return [runs[(k, s)][0] for s in range(seeds)]

    def ps(k: Key, share: str) -> list[float]:
        i = 1 + SHARES.index(share)
        return [runs[(k, s)][i] for s in range(seeds)]

    values = {t.name: t.value(ms, ps) for t in targets}
    residuals = {t.name: t.residual(values[t.name]) for t in targets}
    loss = sum(t.weight * residuals[t.name] ** 2 for t in targets)
    return Evaluation(dict(theta), loss, values, residuals, len(runs), time.perf_counter() - t0, runs)


def _load(model: str) -> PhysicsFile:
    cfg = load_config(MODELS[model])
    return load_physics(cfg.model.name, cfg.hardware.name)


# ------------------------------------------------------------------------------ search
def _grid(params: Sequence[Param], levels: int) -> list[Theta]:
    if levels < 1:
        raise CalibrationError(f"grid={levels}: need at least 1 level")
    axes = [[p.lo + (p.hi - p.lo) * (i + 0.5) / levels for i in range(levels)] for p in params]
    return [dict(zip((p.name for p in params), pt, strict=True)) for pt in itertools.product(*axes)]


def start_theta(params: Sequence[Param], bases: Mapping[str, PhysicsFile] | None = None) -> Theta:
    """The constants as the physics files (else the run configs / the preset) set them now, which
    must agree between the models (a memory utilisation below a model's floor is raised to it)."""
    bases = bases or {m: _load(m) for m in MODELS}
    now: dict[str, Theta] = {}
    for model, cfg_name in MODELS.items():
        cfg = load_preset_config(cfg_name, "paper", means=bases[model].workload)  # the means of ``bases``
        eng = bases[model].engine.resolved(cfg.hardware, cfg.emulator)
        now[model] = {p.name: float(getattr(eng, p.name) if p.section == "engine" else getattr(cfg.workload, p.name).mean)
                      for p in params}
    first, *rest = MODELS
    theta = now[first]
    for model in rest:
        phys, means = _apply(bases[model], theta, MODELS[model])
        for p in params:
            got = getattr(phys if p.section == "engine" else means, p.name)
            if not math.isclose(float(got), now[model][p.name], rel_tol=1e-9):
                raise CalibrationError(f"{p.name} is {theta[p.name]:g} for {first} but {now[model][p.name]:g} for "
                                       f"{model}: one constant cannot start from both; search it with --grid >= 1")
    return theta


def calibrate(params: Sequence[str], targets: Sequence[Target], seeds: int = 8, grid: int = 3,
              local_rounds: int = 2, final_seeds: int | None = None, step: float | None = None, jobs: int = 1,
              progress: Callable[[str], None] = print) -> tuple[Evaluation, Evaluation, list[Evaluation]]:
    """Coarse grid (``grid`` 0: the files' values as the one start), then coordinate local search
    (first improvement; each constant stepped by ``step`` x its bound range, default half a grid
    cell or 1/6 without a grid, halved after a round without improvement), then the winner on
    ``final_seeds``. ``jobs`` worker processes measure the batches.

    Returns (the starting constants scored on ``final_seeds``, the fit scored on ``final_seeds``,
    every evaluation of the search)."""
    covered = [p for p in params if p in DATASHEET_PARAMS
               and any(load_config(c).emulator.costs == "database" for c in MODELS.values())]
    if covered:
        raise CalibrationError(f"{', '.join(covered)}: the measured kernel tables (emulator.costs: database) cover "
                               "these; they move only the datasheet formulas")
    unknown = [p for p in params if p not in PARAMS]
    if unknown:
        raise CalibrationError(f"unknown constants {unknown}; known: {', '.join(PARAMS)}")
    if jobs < 1:
        raise CalibrationError(f"jobs={jobs}: need at least 1")
    ps = [PARAMS[p] for p in params]
    bases = {m: _load(m) for m in MODELS}
    final_seeds = final_seeds or seeds
    step = step if step is not None else (1 / grid / 2 if grid else 1 / 6)
    if not 0 < step <= 1:
        raise CalibrationError(f"step={step}: a fraction of each constant's bound range in (0, 1]")
    history: list[Evaluation] = []
    seen: dict[tuple[tuple[str, float], ...], Evaluation] = {}
    t0 = time.perf_counter()
    pool = ProcessPoolExecutor(max_workers=jobs) if jobs > 1 else None

    def score(th: Theta, n_seeds: int) -> Evaluation:
        key = (*sorted(th.items()), ("seeds", float(n_seeds)))
        if key not in seen:
            seen[key] = evaluate(th, targets, n_seeds, bases, pool=pool)
            history.append(seen[key])
        return seen[key]

    try:
        points = (_grid(ps, grid) if grid else [start_theta(ps, bases)]) if ps else [{}]
        for i, th in enumerate(points):
            ev = score(th, seeds)
            progress(f"grid {i + 1}/{len(points)} {_fmt(th)} loss {ev.loss:.2f} ({time.perf_counter() - t0:.0f} s)")
        best = min(history, key=lambda e: e.loss)
        steps = {p.name: (p.hi - p.lo) * step for p in ps}
        for r in range(local_rounds):
            improved = False
            for p in ps:
                for sign in (-1, 1):
                    v = round(min(max(best.theta[p.name] + sign * steps[p.name], p.lo), p.hi), 6)
                    if v == best.theta[p.name]:
                        continue
                    was = best.theta[p.name]
                    ev = score({**best.theta, p.name: v}, seeds)
                    mark = ""
                    if ev.loss < best.loss:
                        best, improved, mark = ev, True, "  <- best"
                    progress(f"local {r + 1}/{local_rounds} {p.name} {was:.4g} -> {v:.4g}: loss {ev.loss:.2f} "
                             f"({time.perf_counter() - t0:.0f} s){mark}")
            if not improved:
                steps = {k: v / 2 for k, v in steps.items()}
        progress(f"final: the start and {_fmt(best.theta)} on {final_seeds} seeds")
        start = score(points[0] if ps and not grid else {}, final_seeds)  # the files' values: the same start
        fit = score(best.theta, final_seeds)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    if fit.loss > start.loss:  # the search's seeds flattered it: keep the start
        progress(f"the fit ({fit.loss:.2f}) is worse than the start ({start.loss:.2f}) on {final_seeds} seeds: kept the start")
        fit = start
    return start, fit, history


def _fmt(theta: Mapping[str, float]) -> str:
    return "{" + ", ".join(f"{k}={v:.3g}" for k, v in theta.items()) + "}"


# ------------------------------------------------------------------------------ output
def table(start: Evaluation, fit: Evaluation, targets: Sequence[Target]) -> str:
    rows = ["| target | section | paper | start | fit | residual (sigma) |", "|---|---|---|---|---|---|"]
    for t in targets:
        paper = "best" if t.rank else f"{t.paper:+.4g}"
        rows.append(f"| {t.name} | {t.section} | {paper} | {start.values[t.name]:+.4g} | {fit.values[t.name]:+.4g} "
                    f"| {fit.residuals[t.name]:+.2f} |")
    rows.append(f"| **loss** | | | {start.loss:.2f} | {fit.loss:.2f} | |")
    return "\n".join(rows)


def write_fit(fit: Evaluation, targets: Sequence[Target], record: Mapping[str, Any], folder: Path | None = None) -> list[Path]:
    """Write the fitted constants and every target's residual into each model's physics file."""
    paths = []
    for model, cfg_name in MODELS.items():
        base = _load(model)
        phys, means = _apply(base, fit.theta, cfg_name)
        fit_rec = {**record, "loss": round(fit.loss, 4),
                   "targets": {t.name: {"section": t.section, "paper": "best" if t.rank else t.paper,
                                        "emulated": round(fit.values[t.name], 4),
                                        "residual_sigma": round(fit.residuals[t.name], 3)} for t in targets}}
        pf = PhysicsFile(model=base.model, hardware=base.hardware, engine=phys, workload=means, fit=fit_rec)
        p = physics_file(base.model, base.hardware, folder)
        head = [line for line in p.read_text().splitlines() if line.startswith("#")] if p.is_file() else []
        body = yaml.safe_dump(pf.model_dump(mode="json", exclude_none=True), sort_keys=False)
        p.write_text("\n".join(head) + ("\n" if head else "") + body)
        paths.append(p)
    return paths
