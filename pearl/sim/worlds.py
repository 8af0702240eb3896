"""Where the best PD mode changes: a sweep of plausible worlds, and PEARL's regret in each.

PEARL's thesis is that the best prefill-decode mode and P:D ratio depend on the world (the model,
the GPUs, the pool, the workload, the engine's own mechanics), so a system that measures and
adapts beats every static choice. ``python -m pearl experiments worlds`` tests it: each **world**
is one point of that space, run as a fixed rollout pool of ``gpus`` workers (no preemptible GPUs,
no borrowing: only the PD question is open) for ``batches`` rollout batches, with the emulated
trainer publishing a weight update after each step (each update pauses, aborts and resumes the
requests in flight and flushes every prefix cache, as on SGLang).

In each world:

* **the best static configuration**: colocation and the P:D splits, each run from the start and
  kept (``policy.allocation_overrides``), measured: colocation, the ``top_k`` splits the decision
  engine's prior (first-principles profile, no telemetry) ranks best among the feasible ones, then
  a climb on the prefill count from the best measured split (P - 1, P + 1 while it improves).
  ``--exhaustive K`` also measures every split of K worlds and reports how often the climb found
  the exhaustive best;
* **the systems**: ``pearl`` (the runtime as it ships: the prior decides, telemetry refits after
  every batch, the cost-aware hysteresis switches), ``rlboost+`` (always colocated), ``static-pd``
  (the rule verl and slime run PD by today: one P:D ratio chosen at the start - here the prior's
  best feasible split - and kept), ``pearl-coloc`` (PEARL without splits). On a fixed pool with
  borrowing off, ``rlboost+`` and ``pearl-coloc`` *are* static colocation and ``static-pd`` *is*
  the static run of its split: the same configuration run the same way, so each reports that
  run (``same_as``) rather than repeating it (``tests/sim/test_worlds.py`` checks the identity).

``pearl_regret = M_pearl / M_best_static - 1`` (``M``: the mean batch makespan over the
``batches`` batches, paired seeds: every run of a world plays the same trajectories).

The space (``SPACE``; a seeded Latin hypercube, ``scipy.stats.qmc``): hardware (``h100_sxm``,
``h200_sxm``, ``b200_sxm``), model (Qwen3-8B, Qwen3-30B-A3B), rollout GPUs 4-64, batch 32-256,
trajectory limit 8K-64K, mean observation 100-2000 tokens, mean turns 10-50, mean tool call
0.3-10 s, and the engine's mechanics within their bounds (``EmulatorPhysics.host_cpu_factor``,
``launch_per_layer_s``); plus the paper's own points (``PAPER_WORLDS``). What a world leaves
unset is the ``paper`` workload and the model's physics file; where the paper workload's 12K-token
initial prompt exceeds a third of the world's trajectory limit, it is cut to that third (its
shared system part to half of it).

Public names: ``WorldParams``, ``SPACE``, ``PAPER_WORLDS``, ``draw_worlds``, ``world_config``,
``run_world``, ``WorldError``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pearl.config import ConfigError, RunConfig
from pearl.core.decision import Mode, decide
from pearl.core.profile import HardwareProfile, WorkloadProfile
from pearl.engines.emulated import EmulatedEngine
from pearl.engines.emulated_physics import EmulatorPhysics, load_physics
from pearl.engines.emulated_tables import CostDatabaseError
from pearl.runtime.clock import LoopClock, run_virtual
from pearl.runtime.controller import Controller
from pearl.sim.emulated_trainer import EmulatedTrainer
from pearl.sim.presets import load_preset_config
from pearl.sim.sessions import SyntheticSessionFactory

#: model name -> the paper config it starts from (its cluster, training step and physics file)
MODELS = {"qwen3-8b": "qwen3-8b-h200", "qwen3-30b-a3b": "qwen3-30b-a3b-h200"}
#: hardware name -> the config's ``hardware`` entry (``configs/hardware``)
HARDWARE = {"h100_sxm": "h100_sxm", "h200_sxm": "h200", "b200_sxm": "b200_sxm"}


class WorldError(ValueError):
    """A world that cannot run: a parameter out of its bounds, a GPU the cost database lacks, no
    feasible allocation. The sweep reports it and goes on."""


class WorldParams(BaseModel):
    """One world (module docstring). Bounds are the sweep's space; a value outside is an error."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    hardware: str = "h200_sxm"
    model: str = "qwen3-8b"
    gpus: int = Field(default=8, ge=4, le=64, description="rollout workers (one GPU each)")
    batch: int = Field(default=64, ge=32, le=256, description="trajectories per rollout batch (multiple of 8)")
    limit: int = Field(default=32768, ge=8192, le=65536, description="trajectory length limit, tokens")
    observation_tokens: float | None = Field(default=None, ge=100, le=2000, description="mean observation")
    turns: float | None = Field(default=None, ge=10, le=50, description="mean turns per trajectory")
    tool_s: float | None = Field(default=None, ge=0.3, le=10.0, description="mean tool call, s")
    host_cpu_factor: float | None = Field(default=None, ge=0.5, le=2.0)
    launch_per_layer_s: float | None = Field(default=None, ge=2e-5, le=3e-4)
    memory_utilization: float | None = Field(default=None, ge=0.80, le=0.95, description="the engine's share of "
                                             "device memory (not drawn: the physics file's unless given)")
    seed: int = 0
    paper: str = Field(default="", description="the paper's figure this point is, if any")

    def brief(self) -> str:
        return (f"{self.model} on {self.gpus} x {self.hardware}, B={self.batch}, L={self.limit // 1024}K"
                + (f" ({self.paper})" if self.paper else ""))


@dataclass(frozen=True)
class Dim:
    """One axis of the space: ``lo``..``hi``, log-scaled or not, or ``choices``."""

    name: str
    lo: float = 0.0
    hi: float = 1.0
    log: bool = False
    choices: tuple[str, ...] = ()

    def value(self, u: float) -> Any:
        if self.choices:
            return self.choices[min(int(u * len(self.choices)), len(self.choices) - 1)]
        if self.log:
            return math.exp(math.log(self.lo) + u * (math.log(self.hi) - math.log(self.lo)))
        return self.lo + u * (self.hi - self.lo)


SPACE: tuple[Dim, ...] = (
    Dim("hardware", choices=tuple(HARDWARE)),
    Dim("model", choices=tuple(MODELS)),
    Dim("gpus", 4, 64, log=True),
    Dim("batch", 32, 256, log=True),
    Dim("limit", 8192, 65536, log=True),
    Dim("observation_tokens", 100, 2000, log=True),
    Dim("turns", 10, 50),
    Dim("tool_s", 0.3, 10.0, log=True),
    Dim("host_cpu_factor", 0.5, 2.0, log=True),
    Dim("launch_per_layer_s", 2e-5, 3e-4, log=True),
)


def _rounded(name: str, v: Any) -> Any:
    if name == "gpus":
        return max(4, min(64, round(v)))
    if name == "batch":
        return max(32, min(256, 8 * round(v / 8)))
    if name == "limit":
        return max(8192, min(65536, 1024 * round(v / 1024)))
    if name in ("observation_tokens", "turns"):
        return round(v, 1)
    if name in ("tool_s", "host_cpu_factor"):
        return round(v, 3)
    if name == "launch_per_layer_s":
        return float(f"{v:.3g}")
    return v


def draw_worlds(n: int, seed: int = 0) -> list[WorldParams]:
    """``n`` worlds of a Latin hypercube over ``SPACE`` (seeded: the same ``n`` and ``seed``, the
    same worlds), ids ``w00``.. (workload seed = the sweep's seed)."""
    if n <= 0:
        return []
    from scipy.stats import qmc  # type: ignore[import-untyped]

    pts = qmc.LatinHypercube(d=len(SPACE), seed=seed).random(n)
    out = []
    for i, row in enumerate(pts):
        kw = {d.name: _rounded(d.name, d.value(float(u))) for d, u in zip(SPACE, row, strict=True)}
        out.append(WorldParams(id=f"w{i:02d}", seed=seed, **kw))
    return out


#: the paper's own points (Fig. 7's pools at batch 64, Sec. 3.3's batches on 8 GPUs), every other
#: parameter the ``paper`` workload's
PAPER_WORLDS: tuple[WorldParams, ...] = (
    *(WorldParams(id=f"p-8b-{n}", model="qwen3-8b", gpus=n, paper=f"Fig. 7, Qwen3-8B, {n} GPUs") for n in (4, 8, 16)),
    *(WorldParams(id=f"p-30b-{n}", model="qwen3-30b-a3b", gpus=n, paper=f"Fig. 7, Qwen3-30B-A3B, {n} GPUs")
      for n in (4, 8, 16)),
    *(WorldParams(id=f"p-30b-bs{b}", model="qwen3-30b-a3b", gpus=8, batch=b, paper=f"Sec. 3.3, batch {b}")
      for b in (32, 96)),
)


def parse_world(text: str, seed: int = 0) -> WorldParams:
    """A world from ``key=value,key=value`` (``--world``); unknown keys and bad values raise
    ``WorldError`` naming them."""
    kw: dict[str, Any] = {"id": "", "seed": seed}
    for item in filter(None, (x.strip() for x in text.split(","))):
        k, sep, v = item.partition("=")
        if not sep:
            raise WorldError(f"--world {text!r}: {item!r} is not key=value")
        kw[k.strip()] = v.strip()
    kw["id"] = kw["id"] or "x-" + "-".join(f"{v}" for k, v in kw.items() if k not in ("id", "seed"))
    try:
        return WorldParams(**kw)
    except ValidationError as e:
        raise WorldError(f"--world {text!r}: " + "; ".join(
            f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in e.errors())) from None


# ------------------------------------------------------------------------------ one world
def world_config(p: WorldParams) -> tuple[RunConfig, EmulatorPhysics]:
    """The run config and emulator physics of ``p``: the model's paper config under the ``paper``
    workload, the world's GPU, pool, batch and workload, and the model's physics file with the
    world's mechanics. Raises ``WorldError`` naming what is wrong."""
    if p.model not in MODELS:
        raise WorldError(f"world {p.id}: unknown model {p.model!r}; known: {', '.join(MODELS)}")
    if p.hardware not in HARDWARE:
        raise WorldError(f"world {p.id}: hardware {p.hardware!r} is not in the sweep's cost database systems; "
                         f"known: {', '.join(HARDWARE)}")
    if p.batch % 8:
        raise WorldError(f"world {p.id}: batch {p.batch} is not a multiple of the GRPO group size 8")
    base = MODELS[p.model]
    plain = load_preset_config(base, "paper")
    pf = load_physics(plain.model.name, plain.hardware.name)
    ov: dict[str, Any] = {
        "hardware": HARDWARE[p.hardware], "workload.batch_size": p.batch, "workload.seed": p.seed,
        "workload.max_trajectory_tokens": p.limit, "model.max_context": max(plain.model.max_context, p.limit),
        "cluster.reserved_gpus": p.gpus, "cluster.max_preemptible_gpus": 0,
        "policy.borrow_enabled": False, "policy.use_preemptible": False,
    }
    wl = plain.workload
    if wl.system_prompt_tokens > p.limit // 3:  # the prompt must leave the agent room to work
        system = p.limit // 3
        ov["workload.system_prompt_tokens"] = system
        ov["workload.shared_prompt_tokens"] = min(wl.shared_prompt_tokens, system // 2)
    if p.observation_tokens is not None:
        ov["workload.observation_tokens"] = {**wl.observation_tokens.model_dump(), "mean": p.observation_tokens}
    if p.turns is not None:
        ov["workload.turns"] = {**wl.turns.model_dump(), "mean": p.turns}
    if p.tool_s is not None:
        ov["workload.env_step_s"] = {**wl.env_step_s.model_dump(), "mean": p.tool_s}
    try:
        cfg = load_preset_config(base, "paper", ov, means=pf.workload)
    except ConfigError as e:
        raise WorldError(f"world {p.id}: {e}") from None
    mech = {k: v for k, v in (("host_cpu_factor", p.host_cpu_factor), ("launch_per_layer_s", p.launch_per_layer_s),
                              ("memory_utilization", p.memory_utilization)) if v is not None}
    return cfg, pf.engine.model_copy(update=mech)


def prior_decision(cfg: RunConfig, n: int) -> Any:
    """The decision engine's choice on the prior (first principles, no telemetry) for ``n`` workers."""
    hw = HardwareProfile.from_specs(cfg.model, cfg.hardware, cfg.cluster.tp_size)
    wl = WorkloadProfile.from_spec(cfg.workload)
    return decide(n, cfg.workload.batch_size, hw, wl, cfg.policy)


async def _batches(cfg: RunConfig, physics: EmulatorPhysics, batches: int) -> dict[str, Any]:
    clock = LoopClock()
    factory = SyntheticSessionFactory(cfg.workload, clock)
    engine = EmulatedEngine.from_config(cfg, clock, physics, iteration_log=[], responses=factory)
    ctrl = Controller(cfg, engine, factory, clock=clock, max_batches=batches)
    await ctrl.start()
    trainer = EmulatedTrainer(clock, cfg.train.step_time_s, ctrl.take_batch, ctrl.notify,
                              lambda v: ctrl.publish(v, None))
    trainer.start()
    try:
        await ctrl.wait_batches(batches)
        st = ctrl.pipeline.stats
        ps = engine.phase_split()
        hit = ps["cached_tokens"] / (ps["cached_tokens"] + ps["prefill_tokens"]) if ps["prefill_tokens"] else 0.0
        return {
            "makespans_s": [round(m, 3) for m in st.batch_makespans],
            "trajectories": st.trajectories_completed,
            "failed": st.trajectories_failed,
            "allocations": [a for _, a in ctrl.batch_allocations],
            "switches": dict(ctrl.elastic.reconfigurations),
            "prefix_hit": round(hit, 4), "prefill_time_share": round(ps["prefill_time_share"], 4),
            "retracted": int(ps["retracted"]), "events": engine.events,
        }
    finally:
        await trainer.stop()
        await ctrl.stop()


def measure(cfg: RunConfig, physics: EmulatorPhysics, batches: int, label: str | None,
            system: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``batches`` batches of ``cfg``'s fixed pool: with the allocation ``label`` kept from the start,
    or (``label`` None) as the policy ``system`` (policy field overrides) decides."""
    n = cfg.cluster.reserved_gpus // cfg.cluster.tp_size
    upd: dict[str, Any] = {"allocation_overrides": {n: label}, "allow_disaggregation": True} if label else {}
    upd.update(system or {})
    c = cfg.model_copy(update={"policy": cfg.policy.model_copy(update=upd)})
    out = run_virtual(_batches(c, physics, batches))
    out["makespan_s"] = round(statistics.fmean(out["makespans_s"]), 3) if out["makespans_s"] else math.inf
    return out


def _split(label: str) -> int:
    return int(label.split("P")[0]) if "P" in label else 0


def _climb(n: int, top: list[str], ok: Callable[[str], bool], run: Callable[[str], dict[str, Any]]) -> str:
    """The static search (module docstring): colocation, the prior's ``top`` splits, then P - 1 /
    P + 1 from the best measured split while that improves; the best configuration it measured."""
    seen = ["coloc", *top]
    good = {lab: run(lab)["makespan_s"] for lab in seen if ok(lab)}
    while True:
        splits = {k: v for k, v in good.items() if k != "coloc"}
        if not splits:
            break
        best = min(splits, key=lambda k: splits[k])
        q = _split(best)
        nxt = [f"{x}P{n - x}D" for x in (q - 1, q + 1) if 1 <= x < n and f"{x}P{n - x}D" not in seen]
        if not nxt:
            break
        seen += nxt
        good.update({lab: run(lab)["makespan_s"] for lab in nxt if ok(lab)})
        if min((good[lab] for lab in nxt if lab in good), default=math.inf) >= splits[best]:
            break
    if not good:
        return "coloc"
    return min(good, key=lambda k: good[k])


def run_world(p: WorldParams, batches: int = 3, top_k: int = 3, exhaustive: bool = False,
              progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """One world (module docstring): the static search, the systems and the regret."""
    try:
        cfg, physics = world_config(p)
        EmulatedEngine.from_config(cfg, LoopClock(), physics)  # the cost tables and the KV pool exist
    except CostDatabaseError as e:
        raise WorldError(f"world {p.id}: {e}") from None
    except ValueError as e:
        raise WorldError(f"world {p.id}: {e}") from None
    n = p.gpus
    prior = prior_decision(cfg, n)
    cands = {c.allocation.label: c for c in prior.candidates}
    runs: dict[str, dict[str, Any]] = {}

    def run(label: str) -> dict[str, Any]:
        if label not in runs:
            runs[label] = measure(cfg, physics, batches, label)
            if progress:
                progress(f"{p.id} {label}: {runs[label]['makespan_s']:.1f} s")
        return runs[label]

    def ok(label: str) -> bool:
        r = run(label)
        return r["failed"] == 0 and len(r["makespans_s"]) == batches

    splits = sorted((c for c in prior.candidates if c.allocation.mode is Mode.DISAGGREGATED and c.feasible),
                    key=lambda c: c.makespan_s)
    top = [c.allocation.label for c in splits[:top_k]]
    if exhaustive:
        for q in range(1, n):
            ok(f"{q}P{n - q}D")
    climbed = _climb(n, top, ok, run)
    static_pd = splits[0].allocation.label if splits else None
    if static_pd is not None:
        ok(static_pd)
    feasible = {k: v for k, v in runs.items() if v["failed"] == 0 and len(v["makespans_s"]) == batches}
    if not feasible:
        raise WorldError(f"world {p.id}: no allocation of {n} workers completes its batches "
                         "(" + ", ".join(f"{k}: {v['failed']} trajectories failed" for k, v in runs.items()) + ")")
    best = min(feasible, key=lambda k: feasible[k]["makespan_s"])
    climb_agrees = climbed in feasible and feasible[climbed]["makespan_s"] <= feasible[best]["makespan_s"] * (1 + 1e-9)
    pearl_run = measure(cfg, physics, batches, None, {"allow_disaggregation": True, "force_disaggregation": False})
    if progress:
        progress(f"{p.id} pearl: {pearl_run['makespan_s']:.1f} s ({', '.join(str(a) for a in pearl_run['allocations'])})")

    def sys_entry(r: dict[str, Any], same_as: str | None = None) -> dict[str, Any]:
        e = {"makespan_s": r["makespan_s"], "trajectories": r["trajectories"], "allocations": r["allocations"]}
        if same_as:
            e["same_as"] = same_as
        return e

    systems = {
        "pearl": sys_entry(pearl_run),
        "rlboost+": sys_entry(runs["coloc"], "static:coloc"),
        "pearl-coloc": sys_entry(runs["coloc"], "static:coloc"),
        "static-pd": (sys_entry(runs[static_pd], f"static:{static_pd}") if static_pd is not None
                      else {"makespan_s": None, "trajectories": 0, "infeasible": "the prior finds no feasible split"}),
    }
    bm = feasible[best]["makespan_s"]
    wl = cfg.workload
    return {
        "id": p.id,
        "params": p.model_dump(exclude={"id"}),
        # what the world ran with where it left a parameter to the preset or the physics file
        "effective": {"observation_tokens": wl.observation_tokens.mean, "turns": wl.turns.mean,
                      "tool_s": wl.env_step_s.mean, "system_prompt_tokens": wl.system_prompt_tokens,
                      "host_cpu_factor": physics.host_cpu_factor if physics.host_cpu_factor is not None else 1.0,
                      "launch_per_layer_s": (physics.launch_per_layer_s if physics.launch_per_layer_s is not None
                                             else cfg.emulator.launch_per_layer_s),
                      "memory_utilization": (physics.memory_utilization if physics.memory_utilization is not None
                                             else cfg.hardware.memory_utilization)},
        "best_static": {"allocation": best, "makespan_s": bm, "mode": "colocated" if best == "coloc" else "split"},
        "static": {k: {"makespan_s": v["makespan_s"], "failed": v["failed"], "prefix_hit": v["prefix_hit"],
                       "prefill_time_share": v["prefill_time_share"], "retracted": v["retracted"],
                       "predicted_s": round(cands[k].makespan_s, 3) if k in cands else None}
                   for k, v in sorted(runs.items(), key=lambda kv: (kv[0] != "coloc", _split(kv[0])))},
        "systems": systems,
        "pearl_regret": round(pearl_run["makespan_s"] / bm - 1.0, 5),
        "prior_choice": prior.target.label,
        "exhaustive": exhaustive,
        "climb": climbed,
        "climb_agrees": climb_agrees,
        "events": sum(v["events"] for v in runs.values()) + pearl_run["events"],
    }


__all__ = ["HARDWARE", "MODELS", "PAPER_WORLDS", "SPACE", "WorldError", "WorldParams", "draw_worlds", "measure",
           "parse_world", "prior_decision", "run_world", "world_config"]
