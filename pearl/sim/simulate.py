"""Trace replay: each system = the real Controller on the emulated engine, in virtual time.

Public names: ``run_system``, ``run_simulation``, ``run_simulation_cli``,
``best_allocation_search``, ``SimulationError``.

One system run (``run_system``), on a fresh ``VirtualTimeLoop`` (``run_virtual``)::

    engine   = EmulatedEngine(cfg)                       (the only swapped part, with the clock)
    ctrl     = Controller(cfg, engine, SyntheticSessionFactory(cfg.workload))
    await ctrl.start()                                    reserved workers launched + admitted;
                                                          t0 = now: the trace starts here
    EmulatedTrainer(take_batch, notify, publish).start()  training steps of train.step_time_s
    replayer: trace_events(timeline) at t0 + at_s -> ctrl.submit   (deadlines shifted by t0)
    Sampler: every 5 s the state table and progress (GPU-hours, role timeline)
    sleep until t0 + duration; stop everything (cancel + await), fold the counters

A system is only ``apply_system(cfg, spec)`` (policy knobs, fixed pools) and which events it is
sent: systems that do not use preemptible GPUs get none; the oracle gets ``oracle_events`` and a
plan (``oracle_plan``: measured makespans at every budget it can reach, then a Viterbi plan over
the segment's budget intervals with switch costs, ``pearl/sim/oracle.py``) that the replayer
enacts by replacing the Elastic Scheduler's ``allocation_overrides`` at each interval's event.

Summary per system (the JSON of ``python -m pearl simulate --json``)::

    trajectories_per_hour     completed trajectories / segment hours (rollout side; the trainer
                              consumes them in order with staleness <= policy.max_staleness)
    batch_rate_per_hour       whole batches per hour x B, to the end of the last whole batch (no
                              end effect; ``_batch_rate``)
    trajectories_completed, trajectories_trained, trajectories_in_flight, trajectories_failed
    rollout_steps, train_steps
    gpu_hours                 {reserved, preemptible, borrowed, training} (metrics.py)
    cost_usd, cost_per_1k_trajectories   (PricesSpec; training GPUs paid for the whole segment)
    reconfigurations          counts by kind from the Elastic Scheduler
    reconfiguration_costs_s   observed seconds by kind (Table 3)
    resume_prefill            the extra prefill of resumed requests (Table 3; emulator telemetry,
                              ``EmulatedEngine.resume_prefill``): {"tokens", "seconds",
                              "work_seconds": [...]} per resumed request (prompt tokens prefilled
                              again; prefill s, wall; GPU work of those tokens alone) and "share",
                              "work_share" per trajectory with a resumed request (wall / work
                              over the trajectory's generation seconds)
    makespan_prediction_error median |predicted - observed| / observed over rollout batches:
                              predicted = the runtime's prediction at the batch's start (the
                              decision in force composed with the borrow / return schedule known
                              then, ``pearl.core.outlook.batch_forecast``),
                              observed = that batch's makespan in the emulator
    makespan_prediction_bias  median (predicted - observed) / observed, the same batches: its sign
                              says whether the predictor runs short (< 0) or long (> 0)
    batch_allocations         per predicted batch, the allocation at its start and at its end
    batch_one_configuration   per predicted batch, whether one allocation ran it throughout (no
                              grant, reclaim, borrow, return or switch between its start and end)
    batch_closed_loop         per predicted batch, whether it corrected the predictor's closed
                              loop (``pearl.core.makespan_correction``): it ran one mode throughout
    closed_loop_batches       the batches that corrected the closed loop
    interruptions, sim_events, sim_events_per_s, wall_s, role_hours
    router_moves              turns that left their previous worker: {"slack": past affinity_slack,
                              "cost": by the cost-aware rule} (pearl/core/affinity.py)
    placement_slack           the load slack the placed error's sticky model uses (the router's
                              affinity_slack, or the gap the cost rule tolerates for a typical turn)

Batch-makespan search (``best_allocation_search``): a fixed pool of ``n`` workers, no elasticity,
``allocation_overrides = {n: label}`` for colocation and every P:D split; the pipeline runs
``batches`` rollout batches (no trainer: the staleness bound stops it after ``max_staleness + 1``)
and the mean batch makespan is the measure. The decision engine's choice comes from ``decide``
on the same config's prior profiles refit with the colocated run's telemetry (what PEARL would
know after one step). ``seed_offset`` runs the same search on another sample of trajectories
(Table 2 runs 8 and compares means over the paired seeds: ``experiments.combine_table2_seeds``).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pearl.config import RunConfig
from pearl.core.decision import decide, mode_change_s
from pearl.core.events import ReclaimNotice
from pearl.core.makespan import compose_makespan, sticky_pool
from pearl.core.profile import HardwareProfile, WorkloadProfile
from pearl.engines.emulated import EmulatedEngine
from pearl.engines.emulated_physics import EmulatorPhysics
from pearl.runtime.clock import LoopClock, run_virtual
from pearl.runtime.controller import Controller
from pearl.sim.emulated_trainer import EmulatedTrainer
from pearl.sim.metrics import Sampler, cost_usd
from pearl.sim.oracle import OraclePlan, budget_intervals, oracle_events, plan_allocations, reachable_budgets
from pearl.sim.sessions import SyntheticSessionFactory
from pearl.sim.systems import SystemSpec, apply_system
from pearl.sim.traces import DEFAULT_NOTICE_S, GpuTimeline, TimedEvent, trace_events


class SimulationError(RuntimeError):
    """A replay could not run (the message names the system and what failed)."""


def _shift(e: TimedEvent, t0: float) -> TimedEvent:
    ev = e.event
    if isinstance(ev, ReclaimNotice):
        ev = ReclaimNotice(ev.gpu_ids, ev.deadline + t0, ev.notice_id, ev.event_id)
    return TimedEvent(e.at_s + t0, ev)


def _modes(history: Sequence[dict[str, Any]], t0: float) -> list[list[Any]]:
    out: list[list[Any]] = []
    for h in history:
        d = h.get("decision")
        if h.get("kind") == "replan" and isinstance(d, dict):
            lab = f"{d['label']}/{d['n_workers']}" if d.get("label") != "coloc" else f"coloc/{d['n_workers']}"
            t = float(h.get("t", t0)) - t0
            if not out or out[-1][1] != lab:
                out.append([max(t, 0.0), lab])
    return out


def _batch_rate(raw: dict[str, Any], batch: int) -> float | None:
    """Whole rollout batches per hour, in trajectories: ``3600 B k / (t_k - t0)`` with ``t_k`` the
    end of the last whole batch. Free of the segment's end effect: ``trajectories_per_hour`` also
    counts the trajectories of the batch cut off at the end, and with 10-25 batches per 2-hour
    segment where the cut falls moves a system's figure by up to a batch (4-10 %)."""
    ends: list[float] = raw["batch_ends"]
    t0 = float(raw["t0"])
    if not ends or ends[-1] <= t0:
        return None
    return round(3600.0 * batch * len(ends) / (ends[-1] - t0), 3)


def _steady_error(raw: dict[str, Any]) -> tuple[float | None, int]:
    """Median relative error over batches whose allocation (mode, ratio, worker count) did not
    change between the batch's start and end: the predictor cannot know future grants, reclaims
    or borrows, so only these batches test the model itself. Returns (error, n_batches)."""
    changes = [float(t) for t, _lab in _modes(raw["history"], 0.0)]
    preds = raw["summary"]["batch_predictions"]
    ends = raw["batch_ends"][-len(preds):] if preds else []
    errs = []
    for b, end in zip(preds, ends, strict=False):
        start = end - b["observed_s"]
        if b["observed_s"] > 0 and not any(start < t <= end for t in changes):
            errs.append(abs(b["predicted_s"] - b["observed_s"]) / b["observed_s"])
    return (round(statistics.median(errs), 4) if errs else None), len(errs)


def _piecewise_error(raw: dict[str, Any], placed: bool = False) -> tuple[float | None, int]:
    """Median relative error of the predictor over all batches, given the allocations that actually
    served each batch (what the batch-start prediction cannot know: grants, reclaims and borrows
    land mid-batch). While the decision with predicted makespan ``M_i`` is in force for ``dt_i``,
    the batch progresses at rate ``1 / M_i``; the predicted makespan is when the progress
    ``sum_i dt_i / M_i`` reaches 1 (extrapolated at the last rate if the batch ended before;
    ``pearl.core.makespan.compose_makespan``)::

        M_hat = t_j + (1 - sum_{i<j} dt_i / M_i) M_j     (j: the segment in which progress reaches 1)

    Modelling choice: progress is linear in time within an allocation (the predictor's makespan is
    for a whole batch; the tail of a batch is slower per trajectory, so this is an approximation).

    ``placed=True`` (``makespan_prediction_error_placed``): the same composition, but a
    colocated allocation that *grew* mid-batch is predicted for the pool the in-flight batch can
    use under the router's conversation affinity, not for the whole pool: ``M_i = M_coloc(n_eff)``
    with ``n_eff = sticky_pool(B, n_placed, N_i, s)`` (``pearl.core.makespan``, formula there;
    ``s`` = the router's placement slack, ``raw["placement_slack"]``, default 4), ``n_placed``
    = the previous segment's ``n_eff`` (``N`` at the batch's start, after a shrink and after a
    P:D segment), ``M_coloc`` the decision's ``colocated_by_workers`` interpolated linearly in
    ``1 / n``. Splits keep their own prediction. ``A = B``: the change is counted with every
    trajectory alive (mid-batch, before the tail). Returns (error, n_batches)."""
    plans = [(float(h["t"]), h["decision"]) for h in raw["history"]
             if h.get("kind") == "replan" and isinstance(h.get("decision"), dict)
             and h["decision"].get("predicted_makespan_s")]
    plans.sort(key=lambda x: x[0])
    slack = float(raw.get("placement_slack", 4))
    spans = list(raw.get("batch_makespans", []))
    ends = raw["batch_ends"]
    errs = []
    for end, obs in zip(ends, spans, strict=False):
        start = end - obs
        if obs <= 0:
            continue
        cur = [d for t, d in plans if t <= start]
        if not cur:
            continue
        segs = [(start, cur[-1])] + [(tc, d) for tc, d in plans if start < tc < end]
        rates: list[tuple[float, float]] = []
        n_placed: float | None = None
        for tc, d in segs:
            m = float(d["predicted_makespan_s"])
            if placed and d.get("mode", "colocated") == "colocated":
                n = float(d.get("n_workers", 0))
                n_placed = n if n_placed is None else sticky_pool(float(d.get("batch", 64)), n_placed, n, slack)
                m = _coloc_at(d, n_placed, m)
            else:
                n_placed = None
            rates.append((tc, m))
        pred = compose_makespan([(tc - start, m) for tc, m in rates])
        errs.append(abs(pred - obs) / obs)
    return (round(statistics.median(errs), 4) if errs else None), len(errs)


def _coloc_at(d: dict[str, Any], n_eff: float, default: float) -> float:
    """The decision's colocated prediction at ``n_eff`` workers (``colocated_by_workers``,
    linear in ``1 / n`` between entries); ``default`` where the curve is missing or ``n_eff``
    is the whole pool."""
    curve = d.get("colocated_by_workers") or []
    n = float(d.get("n_workers", 0))
    if not curve or n_eff >= n or n_eff < 1:
        return default
    lo = int(n_eff)
    hi = min(lo + 1, len(curve))
    if hi == lo or lo >= len(curve):
        return float(curve[min(lo, len(curve)) - 1])
    w = (1.0 / n_eff - 1.0 / hi) / (1.0 / lo - 1.0 / hi)
    return float(w * curve[lo - 1] + (1.0 - w) * curve[hi - 1])


_COST_KINDS = {"launch": "expansion_preparation", "finalize": "expansion_finalization", "activate": "activation",
               "deactivate": "deactivation", "role_switch": "role_switch", "weight_update": "weight_update"}


def _costs(ctrl: Controller, engine: EmulatedEngine) -> dict[str, list[float]]:
    """Observed reconfiguration seconds by kind (Table 3): the engine's log of every launch
    (worker preparation, including the start-up workers), finalization (weight sync + admission),
    activation / deactivation of borrowed GPUs, role switches, in-place weight updates; and the
    toggle manager's return delays (from TrainingStarted until the last borrowed GPU is free)."""
    out: dict[str, list[float]] = {}
    for kind, _w, sec in engine.reconfig_log:
        out.setdefault(_COST_KINDS.get(kind, kind), []).append(sec)
    out["borrow_return_delay"] = [r["delay_s"] for r in ctrl.summary()["returns"]]
    return {k: [round(x, 3) for x in v] for k, v in out.items() if v}


async def _run(cfg: RunConfig, events: list[TimedEvent], duration_s: float,
               progress: Callable[[float], None] | None,
               schedule: Sequence[tuple[float, dict[int, str]]] = ()) -> dict[str, Any]:
    clock = LoopClock()
    factory = SyntheticSessionFactory(cfg.workload, clock)
    engine = EmulatedEngine.from_config(cfg, clock, EmulatedEngine.emulator_physics(cfg), iteration_log=[],
                                        responses=factory)
    ctrl = Controller(cfg, engine, factory, clock=clock)
    await ctrl.start()
    t0 = clock.now()
    trainer = EmulatedTrainer(clock, cfg.train.step_time_s, ctrl.take_batch, ctrl.notify,
                              lambda v: ctrl.publish(v, None))
    sampler = Sampler(ctrl, clock, period_s=5.0)
    submitted: list[dict[str, Any]] = []

    async def replay() -> None:
        # the oracle's plan: at each interval-opening event, the Elastic Scheduler's allocation
        # overrides are replaced (before the event is submitted at the same instant)
        items: list[tuple[float, int, TimedEvent | dict[int, str]]] = [
            (t, 0, ov) for t, ov in schedule if t > 0] + [(e.at_s, 1, e) for e in events]
        items.sort(key=lambda x: (x[0], x[1]))
        for at, _k, item in items:
            await clock.sleep_until(t0 + at)
            if isinstance(item, dict):
                ctrl.elastic.use_overrides(item)
                continue
            e = _shift(item, t0)
            res = await ctrl.submit(e.event)
            submitted.append({"t": e.at_s - t0, "event": e.event.kind.value, "applied": res.applied})

    async def ticker() -> None:
        while True:
            await clock.sleep(60.0)
            if progress is not None:
                progress((clock.now() - t0) / duration_s)

    trainer.start()
    sampler.start()
    tasks = [asyncio.get_running_loop().create_task(replay(), name="trace-replayer"),
             asyncio.get_running_loop().create_task(ticker(), name="sim-progress")]
    try:
        await clock.sleep_until(t0 + duration_s)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await sampler.stop()
        await trainer.stop()
        prog = ctrl.progress()
        summ = ctrl.summary()
        costs = _costs(ctrl, engine)
        history = list(ctrl.elastic.history)
        await ctrl.stop()
    return {
        "t0": t0, "progress": prog, "summary": summ, "costs": costs, "history": history,
        "sampler": sampler, "trainer": trainer.stats, "events": engine.events, "submitted": submitted,
        "batch_ends": list(ctrl.pipeline.stats.batch_ends),
        "batch_makespans": list(ctrl.pipeline.stats.batch_makespans),
        "placement_slack": ctrl.pipeline.router.placement_slack(ctrl.tracker.hardware, ctrl.tracker.workload),
        "router_moves": dict(ctrl.pipeline.router.moves),
        "phase_split": engine.phase_split(),
        "resume_prefill": engine.resume_prefill(),
    }


def gate_outcomes(log: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Gate decisions of one run counted per gate and outcome (``pearl.core.gate.GateOutcome``):
    ``{"borrow": {"admitted": 14, "saving_below_cost": 8}, "expansion": {...}}``. The borrow
    gate's replays inside batch-start predictions are not decisions and are not in the log."""
    out: dict[str, dict[str, int]] = {}
    for g in log:
        kind, outcome = str(g["kind"]), str(g["outcome"])  # ``GateDecision.to_dict`` + the gate's kind
        per = out.setdefault(kind, {})
        per[outcome] = per.get(outcome, 0) + 1
    return {k: dict(sorted(v.items())) for k, v in sorted(out.items())}


def run_system(cfg: RunConfig, spec: SystemSpec, tl: GpuTimeline | None, duration_s: float | None = None,
               notice_s: float = DEFAULT_NOTICE_S, fixed_pool: int | None = None,
               allocation_overrides: dict[int, str] | None = None,
               progress: Callable[[float], None] | None = None,
               schedule: Sequence[tuple[float, dict[int, str]]] = ()) -> tuple[dict[str, Any], dict[str, Any]]:
    """Replay one system; returns (summary, series) as described in the module docstring."""
    dur = duration_s if duration_s is not None else (tl.duration_s if tl is not None else 7200.0)
    if spec.fixed_pool is not None and fixed_pool is None:
        mean = tl.mean if tl is not None else 0.0
        fixed_pool = cfg.cluster.reserved_gpus + round(mean)
    scfg = apply_system(cfg, spec, fixed_pool, allocation_overrides)
    events: list[TimedEvent] = []
    if tl is not None and spec.use_preemptible:
        events = [e for e in trace_events(tl, notice_s) if e.at_s < dur]
        if spec.oracle:
            events = oracle_events(events, dur)
    w0, c0 = time.perf_counter(), time.process_time()
    try:
        raw = run_virtual(_run(scfg, events, dur, progress, schedule))
    except Exception as e:
        raise SimulationError(f"system {spec.name}: replay failed: {type(e).__name__}: {e}") from e
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    prog, summ, smp = raw["progress"], raw["summary"], raw["sampler"]
    hours = dur / 3600
    led = smp.ledger
    gpu_hours = {k: round(v / 3600, 4) for k, v in led.gpu_s.items()}
    gpu_hours["training"] = round(scfg.cluster.training_gpus * hours, 4)
    cost = cost_usd(gpu_hours, scfg.prices)
    done = prog.trajectories_completed
    summary = {
        "trajectories_per_hour": round(done / hours, 3),
        "trajectories_completed": done,
        "batch_rate_per_hour": _batch_rate(raw, scfg.workload.batch_size),
        "trajectories_trained": raw["trainer"].trajectories,
        "trajectories_in_flight": prog.trajectories_in_flight,
        "trajectories_failed": prog.trajectories_lost,
        "rollout_steps": summ["rollout_steps"],
        "train_steps": raw["trainer"].steps,
        "gpu_hours": gpu_hours,
        "cost_usd": round(cost, 2),
        "cost_per_1k_trajectories": round(1000 * cost / done, 2) if done else None,
        "reconfigurations": dict(summ["reconfigurations"]),
        "gates": gate_outcomes(summ.get("gates", [])),
        "reconfiguration_costs_s": raw["costs"],
        "resume_prefill": {k: [round(x, 5 if k.endswith("share") else 3) for x in v]
                           for k, v in raw["resume_prefill"].items()},
        "makespan_prediction_error": (None if summ["makespan_prediction_error"] is None
                                      else round(summ["makespan_prediction_error"], 4)),
        "makespan_prediction_bias": (None if summ["makespan_prediction_bias"] is None
                                     else round(summ["makespan_prediction_bias"], 4)),
        "makespan_prediction_error_steady": _steady_error(raw)[0],
        "steady_batches": _steady_error(raw)[1],
        "makespan_prediction_error_piecewise": _piecewise_error(raw)[0],
        "makespan_prediction_error_placed": _piecewise_error(raw, placed=True)[0],
        "batch_makespans_s": [round(b["observed_s"], 2) for b in summ["batch_predictions"]],
        "batch_predicted_s": [round(b["predicted_s"], 2) for b in summ["batch_predictions"]],
        "batch_allocations": [[b["allocation_at_start"], b["allocation_at_end"]] for b in summ["batch_predictions"]],
        "batch_one_configuration": [b["one_configuration"] for b in summ["batch_predictions"]],
        "batch_closed_loop": [b["closed_loop"] for b in summ["batch_predictions"]],
        "closed_loop_batches": summ["closed_loop_batches"],
        "interruptions": summ["interruptions"],
        "router_moves": raw["router_moves"],
        "placement_slack": raw["placement_slack"],
        "role_hours": {k: round(v / 3600, 4) for k, v in led.role_s.items()},
        "prefill_time_share": round(raw["phase_split"]["prefill_time_share"], 4),
        "prefix_hit_ratio": round(raw["phase_split"]["cached_tokens"] / max(
            1.0, raw["phase_split"]["cached_tokens"] + raw["phase_split"]["prefill_tokens"]), 4),
        "fixed_pool": fixed_pool if spec.fixed_pool is not None else None,
        "sim_events": raw["events"],
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),  # this process's CPU time: the one-core figure on a shared machine
        "sim_events_per_s": round(raw["events"] / wall) if wall > 0 else None,
        "sim_events_per_cpu_s": round(raw["events"] / cpu) if cpu > 0 else None,
    }
    t0 = raw["t0"]
    comp = [(t - t0, n) for t, n in smp.completed]
    completions: list[float] = []
    prev = 0
    for t, n in comp:
        completions.extend([t] * max(0, n - prev))
        prev = max(prev, n)
    series = {
        "completions": completions,
        "timeline": [[g, max(0.0, a - t0), max(0.0, b - t0), c] for g, a, b, c in led.segments if b > t0],
        "modes": _modes(raw["history"], t0),
        "budget": [[i * tl.gap_s, n] for i, n in enumerate(tl.gpus)] if tl is not None else [],
        "events": raw["submitted"],
    }
    return summary, series


def oracle_plan(cfg: RunConfig, tl: GpuTimeline | None, duration_s: float, notice_s: float = DEFAULT_NOTICE_S,
                top_k: int = 2, cache: dict[int, dict[str, float]] | None = None) -> OraclePlan:
    """The hindsight oracle's plan (``pearl.sim.oracle``): measure colocation and the ``top_k``
    splits the predictor ranks best (plus its own choice) at every reachable budget (measuring all
    N-1 splits at every budget would multiply the search time by ~5; ``table2`` shows the measured
    best is among them), then the Viterbi plan over the segment's budget intervals with switch
    costs. ``cache`` (budget -> label -> measured makespan) is reused across segments of a config."""
    cache = {} if cache is None else cache
    batch = cfg.workload.batch_size
    tp = cfg.cluster.tp_size
    hw = HardwareProfile.from_specs(cfg.model, cfg.hardware, tp)
    wl = WorkloadProfile.from_spec(cfg.workload)
    floor = cfg.train.step_time_s
    rates: dict[int, dict[str, float]] = {}
    switch_s: dict[int, float] = {}
    events = [e for e in trace_events(tl, notice_s) if e.at_s < duration_s] if tl is not None else []
    intervals = budget_intervals(oracle_events(events, duration_s), cfg.cluster, duration_s)
    borrow = cfg.cluster.training_gpus // tp if cfg.policy.borrow_enabled else 0
    # every budget a level of the trace gives, and every budget the plan's intervals hold (e.g. the
    # reserved GPUs alone until the first grant's workers are ready), with the borrowed GPUs too
    need = set(reachable_budgets(tl, cfg.cluster, borrow=cfg.policy.borrow_enabled))
    need |= {iv.n_workers for iv in intervals} | ({iv.n_workers + borrow for iv in intervals} if borrow else set())
    for n in sorted(b for b in need if b >= 1):
        if n not in cache:
            cache[n] = dict(best_allocation_search(cfg, n, batches=1, top_k=top_k)["measured"])
        rates[n] = {a: batch / max(m, floor) for a, m in cache[n].items() if m > 0}
        switch_s[n] = mode_change_s(n, batch, hw, wl, cfg.emulator.role_switch_s)
    return plan_allocations(intervals, rates, switch_s, cfg.policy, borrow, floor)


def oracle_bound(name: str, summaries: Mapping[str, dict[str, Any]], off_trace: set[str]) -> dict[str, Any]:
    """The oracle's summary, bounding every system of the run by construction: the best (most
    ``trajectories_per_hour``) of its own planned replay and every other system's replayed
    schedule on the same trace (each is an allocation schedule the trace allows, so the hindsight
    oracle may pick it; fixed pools sized off the trace, ``off_trace`` = roll-large, are not).
    ``oracle_plan.source`` names the schedule taken ("plan": its own), ``oracle_plan.
    plan_trajectories_per_hour`` the plan's own throughput."""
    own = summaries[name]
    plan = dict(own.get("oracle_plan", {}))
    plan["plan_trajectories_per_hour"] = own["trajectories_per_hour"]
    best, source = own, "plan"
    for other, s in summaries.items():
        if other == name or other in off_trace or "oracle_plan" in s:
            continue
        if s["trajectories_per_hour"] > best["trajectories_per_hour"]:
            best, source = s, other
    plan["source"] = source
    return {**best, "oracle_plan": plan}


def run_simulation(cfg: RunConfig, tl: GpuTimeline | None, systems: Sequence[SystemSpec],
                   duration_s: float | None = None, notice_s: float = DEFAULT_NOTICE_S,
                   roll_large_gpus: int | None = None, trace_label: str = "",
                   progress: Callable[[str, float], None] | None = None,
                   search_cache: dict[int, dict[str, float]] | None = None) -> dict[str, Any]:
    """Every system on the same segment; ``{"systems", "series", "meta", "wall_s"}``."""
    w0 = time.perf_counter()
    res: dict[str, Any] = {"systems": {}, "series": {}}
    dur = duration_s if duration_s is not None else (tl.duration_s if tl is not None else 7200.0)
    for spec in systems:
        ov = None
        plan = None
        if spec.oracle:
            plan = oracle_plan(cfg, tl, dur, notice_s, cache=search_cache)
            ov = dict(plan.schedule[0][1]) if plan.schedule else None
        cb = (lambda f, name=spec.name: progress(name, f)) if progress is not None else None
        summary, series = run_system(cfg, spec, tl, dur, notice_s,
                                     roll_large_gpus if spec.fixed_pool is not None else None, ov, cb,
                                     plan.schedule if plan is not None else ())
        if plan is not None:
            summary["oracle_plan"] = {
                "intervals": [[round(iv.start_s, 1), round(iv.end_s, 1), iv.n_workers, lab]
                              for iv, lab in zip(plan.intervals, plan.labels, strict=True)],
                "planned_switches": plan.switches,
                "planned_trajectories": round(plan.value, 1),
            }
        res["systems"][spec.name] = summary
        res["series"][spec.name] = series
        if progress is not None:
            progress(spec.name, 1.0)
    for spec in systems:
        if spec.oracle:
            res["systems"][spec.name] = oracle_bound(spec.name, res["systems"],
                                                     {s.name for s in systems if s.fixed_pool is not None})
    wall = time.perf_counter() - w0
    ev = sum(s["sim_events"] for s in res["systems"].values())
    res["wall_s"] = round(wall, 3)
    res["meta"] = {
        "config": cfg.name, "trace": trace_label or (tl.source if tl is not None else "fixed pool"),
        "start_hour": (tl.start_s / 3600) if tl is not None else 0.0, "duration_s": dur,
        "mean_preemptible_gpus": round(tl.mean, 3) if tl is not None else 0.0,
        "events": ev, "events_per_s": round(ev / wall) if wall > 0 else None,
    }
    return res


# ------------------------------------------------------------------------------ batch search
async def _measure(cfg: RunConfig, batches: int, physics: EmulatorPhysics | None = None,
                   engines: list[EmulatedEngine] | None = None, sync_at_s: float | None = None) -> tuple[list[float], Any]:
    clock = LoopClock()
    factory = SyntheticSessionFactory(cfg.workload, clock)
    engine = EmulatedEngine.from_config(cfg, clock, physics if physics is not None else
                                        EmulatedEngine.emulator_physics(cfg), iteration_log=[], responses=factory)
    if engines is not None:
        engines.append(engine)
    ctrl = Controller(cfg, engine, factory, clock=clock, max_batches=batches)
    await ctrl.start()

    async def updates() -> None:  # the trainer's update lands sync_at_s into each batch
        assert sync_at_s is not None
        start = clock.now()  # batch b + 1 starts as batch b ends (the staleness bound admits it)
        for _ in range(batches):
            done = asyncio.ensure_future(ctrl.pipeline.wait_batch())
            try:
                if not await clock.wait(done, start + sync_at_s):  # still running at the update
                    await ctrl.publish(ctrl.pipeline.weights[0] + 1)
                    await done
            finally:
                done.cancel()
            start = clock.now()

    task = asyncio.get_running_loop().create_task(updates(), name="measure-updates") if sync_at_s else None
    try:
        await ctrl.wait_batches(batches)
        return list(ctrl.pipeline.stats.batch_makespans), ctrl.tracker
    finally:
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await ctrl.stop()


def measure_makespan(cfg: RunConfig, n: int, label: str, batches: int = 1, physics: EmulatorPhysics | None = None,
                     engines: list[EmulatedEngine] | None = None, sync_at_s: float | None = None) -> tuple[float, Any]:
    """Mean measured batch makespan of ``n`` fixed workers in allocation ``label`` (and the tracker).
    ``physics``: the emulator's constants (default: the model's ``configs/emulator`` file);
    ``engines``: if given, the engine is appended to it (its telemetry: ``phase_split``);
    ``sync_at_s``: a weight update (every worker paused, its requests aborted and resumed, its
    prefix cache flushed) lands that many seconds into each batch, as the trainer's does in the
    asynchronous steady state when the previous batch's training step ends (``train.step_time_s``
    after this batch starts); None: none."""
    policy = cfg.policy.model_copy(update={"use_preemptible": False, "borrow_enabled": False,
                                           "allocation_overrides": {n: label}, "allow_disaggregation": True,
                                           "max_staleness": max(cfg.policy.max_staleness, batches)})
    cluster = cfg.cluster.model_copy(update={"reserved_gpus": n * cfg.cluster.tp_size, "max_preemptible_gpus": 0})
    c = cfg.model_copy(update={"policy": policy, "cluster": cluster})
    spans, tracker = run_virtual(_measure(c, batches, physics, engines, sync_at_s))
    if not spans:
        raise SimulationError(f"measuring {label} on {n} workers: no batch completed")
    return statistics.fmean(spans), tracker


def best_allocation_search(cfg: RunConfig, n: int, batches: int = 1, top_k: int | None = None,
                           seed_offset: int = 0) -> dict[str, Any]:
    """Measure colocation and every P:D split on ``n`` workers (or the ``top_k`` best predicted
    splits); compare with the decision engine's choice (see module docstring). ``seed_offset``
    shifts the workload's seed (another sample of trajectories, the same in every allocation)."""
    if seed_offset:
        cfg = cfg.model_copy(update={"workload": cfg.workload.model_copy(
            update={"seed": cfg.workload.seed + seed_offset})})
    coloc_ms, tracker = measure_makespan(cfg, n, "coloc", batches)
    hw, wl = tracker.hardware, tracker.workload
    d = decide(n, cfg.workload.batch_size, hw, wl, cfg.policy)
    cands = [c for c in d.candidates if c.allocation.label != "coloc"]
    if top_k is not None:
        cands = sorted(cands, key=lambda c: (not c.feasible, c.makespan_s))[:top_k]
    measured = {"coloc": coloc_ms}
    for c in cands:
        lab = c.allocation.label
        measured[lab] = measure_makespan(cfg, n, lab, batches)[0]
    if d.target.label not in measured:
        measured[d.target.label] = measure_makespan(cfg, n, d.target.label, batches)[0]
    best = min(measured, key=lambda k: measured[k])
    return {
        "n_workers": n,
        "seed": cfg.workload.seed,
        "chosen": d.target.label,
        "best": best,
        "measured": {k: round(v, 3) for k, v in measured.items()},
        "predicted": {c.allocation.label: round(c.makespan_s, 3) for c in d.candidates},
        "feasible": {c.allocation.label: c.feasible for c in d.candidates},
    }


# ------------------------------------------------------------------------------ CLI
def run_simulation_cli(cfg: RunConfig, args: Any) -> dict[str, Any]:
    from pearl.sim.replay_report import write_report
    from pearl.sim.systems import parse_systems
    from pearl.sim.traces import fig5_segments, gpu_timeline, load_trace, pick_segments

    systems = parse_systems(args.systems)
    if args.seed is not None:
        cfg = cfg.model_copy(update={"workload": cfg.workload.model_copy(update={"seed": args.seed})})
    trace = load_trace(args.trace)
    if args.segment and args.segment.startswith("like-"):  # matched to the paper's segments
        start_h = fig5_segments(trace, cfg, args.hours, "paper")[args.segment].start_hour
    elif args.segment:
        start_h = pick_segments(trace, cfg.cluster, args.hours)[args.segment].start_hour
    else:
        start_h = args.start_hour or 0.0
    seg = trace.segment(start_h * 3600, args.hours * 3600)
    tl = gpu_timeline(seg, cfg.cluster)
    label = f"{Path(args.trace).name}@{start_h:.2f}h"
    if args.json:
        return run_simulation(cfg, tl, systems, notice_s=args.notice_s, roll_large_gpus=args.roll_large_gpus,
                              trace_label=label)
    from rich.progress import Progress

    with Progress() as bar:
        ids = {s.name: bar.add_task(s.name, total=1.0) for s in systems}

        def cb(name: str, f: float) -> None:
            bar.update(ids[name], completed=min(1.0, f))

        result = run_simulation(cfg, tl, systems, notice_s=args.notice_s, roll_large_gpus=args.roll_large_gpus,
                                trace_label=label, progress=cb)
    out = Path(args.out or f"runs/simulate/{cfg.name}-{Path(args.trace).stem}-{start_h:.2f}h")
    md = write_report(result, out)
    from pearl.sim.replay_report import markdown_table, summary_rows

    print(markdown_table(["system", "traj/h", "vs roll", "rollout steps", "train steps", "GPU-h", "$/1k traj",
                          "reconfigs", "makespan err"], summary_rows(result["systems"])))
    print(f"report: {md}  (wall {result['wall_s']:.1f} s, {result['meta']['events_per_s']} simulated events/s)")
    return result


__all__ = ["SimulationError", "best_allocation_search", "measure_makespan", "oracle_plan", "run_simulation",
           "run_simulation_cli", "run_system"]
