"""What a person watching ``pearl run`` reads: one line per elastic event and one per training step.

Life cycle: ``RunStory`` is built by the run; the ``RunObserver`` hands it every sample together with
the controller's elastic history (``ControlPlane.history``); the run hands it every finished step.

* ``observe(sample, history)`` turns the history entries it has not seen (``new_entries``) into
  ``StoryEvent`` s (those before the first sample are the start-up: only its PD decision is kept) (``story_event``: grant, expansion prepared / admitted, reclaim notice, shrink,
  borrow, return, PD decision, failures, each with its measured cost where it has one), keeps them,
  and, when the run is not on a terminal (``plain``), prints each as one line at once; it prints a
  status line when nothing was printed for ``heartbeat_s``, so a piped run (CI, a log file) is never
  silent for minutes. On a terminal the live panel shows the latest events instead.
* ``step_line(rec, batch)`` is the step's line (``step_line``): reward mean +- spread, well-formed
  share, what the scheduler did since the previous step with its costs, GPUs per role, weight
  version and staleness, training and weight-sync seconds. ``steps`` and ``samples`` keep the
  points of the end-of-run plot (``pearl.obs.story_plot``).

Reward spread of a batch of rewards ``r_1..r_n``: ``sd = sqrt(sum (r_i - mean)^2 / n)`` (population).
Times are shown as ``m:ss`` since the rollout started (``t0``, the observer's first sample).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from pearl.obs.observer import Sample
    from pearl.runtime.train_loop import StepRecord

T = TypeVar("T")

#: the kinds a ``StoryEvent`` can have (the plot marks each kind with its own colour)
KINDS = ("grant", "expansion", "admitted", "notice", "shrink", "borrow", "return", "pd", "failure", "declined")


@dataclass(frozen=True, slots=True)
class StoryEvent:
    """One thing the elastic scheduler did: when (controller clock), what kind, its words, its cost."""

    t: float
    kind: str
    text: str
    cost_s: float | None = None
    short: str = ""  # the few words the step line uses ("shrink spot-00")

    @property
    def brief(self) -> str:
        """``short`` with the measured cost: ``shrink spot-00 2.1 s``."""
        return (self.short or self.kind) + (f" {self.cost_s:.1f} s" if self.cost_s is not None else "")

    def to_dict(self, t0: float) -> dict[str, Any]:
        return {"t_s": round(self.t - t0, 1), "kind": self.kind, "text": self.text,
                "cost_s": None if self.cost_s is None else round(self.cost_s, 2)}


def clock(seconds: float) -> str:
    """``m:ss`` of a non-negative duration."""
    s = max(0, round(seconds))
    return f"{s // 60}:{s % 60:02d}"


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and math.isfinite(float(x)) else None


def _ids(xs: Any) -> str:
    return ", ".join(str(x) for x in xs) if isinstance(xs, list | tuple) and xs else "-"


def _decision_text(d: Mapping[str, Any]) -> str:
    """A PD decision in words: the chosen allocation, its predicted makespan, the best other candidate."""
    label, mode = d.get("label"), d.get("mode")
    pm = _num(d.get("predicted_makespan_s"))
    out = f"PD decision: {label} ({mode})"
    if pm is not None:
        out += f", predicted batch makespan {pm:.0f} s"
    others = [c for c in d.get("candidates", []) if isinstance(c, Mapping) and c.get("label") != label]
    feasible = [c for c in others if c.get("feasible") and _num(c.get("predicted_makespan_s")) is not None]
    if feasible:
        best = min(feasible, key=lambda c: float(c["predicted_makespan_s"]))
        out += f" vs {best['label']} {float(best['predicted_makespan_s']):.0f} s"
    elif others:
        out += f" ({len(others)} other allocation(s) infeasible)"
    n = d.get("n_workers")
    return out + (f", from telemetry of {n} worker(s)" if isinstance(n, int) else "")


def story_event(e: Mapping[str, Any]) -> StoryEvent | None:
    """The ``StoryEvent`` of one elastic-history entry (``pearl.runtime.elastic`` ``_log``), or None
    for an entry a watcher need not read. ``replan`` entries are handled by ``RunStory`` (a PD line
    only when the allocation changes)."""
    t, kind = float(e.get("t", 0.0)), str(e.get("kind"))
    if kind == "grant":
        return StoryEvent(t, "grant", f"grant: preemptible GPU(s) {_ids(e.get('gpus'))} joined the cluster",
                          short=f"grant {_ids(e.get('gpus'))}")
    if kind == "expand_started":
        return StoryEvent(t, "expansion", f"expansion {e.get('group')}: preparing {_ids(e.get('workers'))} in the "
                                          "background (server start + weight load), rollout goes on",
                          short=f"expansion {e.get('group')} preparing")
    if kind == "expand_admitted":
        w = _num(e.get("wait_s"))
        return StoryEvent(t, "admitted", f"expansion {e.get('group')} admitted: {_ids(e.get('workers'))} serving"
                          + (f", {w:.1f} s after it started" if w is not None else ""), w,
                          f"expansion {e.get('group')} admitted")
    if kind == "reclaim_notice":
        left = (_num(e.get("deadline")) or t) - t
        return StoryEvent(t, "notice", f"reclaim notice: {_ids(e.get('gpus'))} must be free within {left:.0f} s",
                          short=f"notice {_ids(e.get('gpus'))}")
    if kind == "shrink":
        a, b = _num(e.get("started_at")), _num(e.get("released_at"))
        cost = b - a if a is not None and b is not None else None
        met = "met" if e.get("met_deadline") else "MISSED"
        return StoryEvent(t, "shrink", f"shrink: {_ids(e.get('gpus'))} released"
                          + (f" in {cost:.1f} s" if cost is not None else "")
                          + f", {e.get('aborted_requests', 0)} request(s) aborted with their partial output kept "
                          f"and resumed elsewhere, deadline {met}", cost, f"shrink {_ids(e.get('gpus'))}")
    if kind == "borrow":
        g = e.get("gate") or {}
        return StoryEvent(t, "borrow", f"borrow: training GPU(s) lent to rollout after step {e.get('step')} "
                          f"(gate: predicted saving {_num(g.get('saving_s')) or 0:.1f} s, return cost "
                          f"{_num(g.get('cost_s')) or 0:.1f} s)", short="borrow")
    if kind == "borrow_declined":
        g = e.get("gate") or {}
        return StoryEvent(t, "declined", f"borrow declined after step {e.get('step')}: {g.get('reason', 'gate')}",
                          short="borrow declined")
    if kind == "return":
        d = _num(e.get("delay_s"))
        return StoryEvent(t, "return", f"return: {_ids(e.get('workers'))} given back before step {e.get('step')}"
                          + (f" in {d:.1f} s" if d is not None else "")
                          + f", {e.get('aborted_requests', 0)} request(s) aborted and resumed", d,
                          f"return {_ids(e.get('workers'))}")
    if kind == "switch_declined":
        return StoryEvent(t, "declined", f"PD switch {e.get('current')} -> {e.get('target')} declined: the "
                                         "predicted saving does not pay for the switch", short="PD switch declined")
    if kind in ("expand_failed", "worker_failed", "error", "grant_declined", "expand_declined"):
        why = str(e.get("error") or e.get("reason") or "")
        first = why.splitlines()[0] if why else ""  # one line: a server's log tail stays in elastic-history.json
        return StoryEvent(t, "failure", f"{kind.replace('_', ' ')}: {first}".rstrip(": "), short=kind.replace("_", " "))
    return None


def new_entries(history: Sequence[Mapping[str, Any]], last_t: float | None, seen_at_last: int
                ) -> tuple[list[Mapping[str, Any]], float | None, int]:
    """The entries of ``history`` (appended in time order, oldest first, maybe truncated at the front)
    not seen yet, given the time of the newest seen entry and how many seen entries had that time;
    returns them with the new ``(last_t, seen_at_last)``."""
    fresh: list[Mapping[str, Any]] = []
    same = 0
    for e in history:
        t = float(e.get("t", 0.0))
        if last_t is not None and t < last_t:
            continue
        if last_t is not None and t == last_t:
            same += 1
            if same <= seen_at_last:
                continue
        fresh.append(e)
    if not fresh:
        return fresh, last_t, seen_at_last
    t_new = float(fresh[-1].get("t", 0.0))
    n_at = sum(1 for e in history if float(e.get("t", 0.0)) == t_new)
    return fresh, t_new, n_at


def batch_stats(batch: Sequence[Any], trainer_version: int) -> dict[str, float]:
    """A rollout batch in figures: ``reward`` (mean), ``reward_sd`` (population spread), ``reward_min``,
    ``reward_max``, ``well_formed`` (``1 - tool_errors / turns`` over the batch, from each agent
    session's ``info``), response ``tokens``, and ``staleness`` (trainer version - the oldest
    record's weight version)."""
    rewards = [float(r.reward) for r in batch]
    turns = sum(int(r.info.get("turns", 0) or 0) for r in batch)
    errors = sum(int(r.info.get("tool_errors", 0) or 0) for r in batch)
    lags = [trainer_version - r.policy_version for r in batch if r.policy_version >= 0]
    mean = sum(rewards) / len(rewards) if rewards else math.nan
    return {
        "reward": mean,
        "reward_sd": math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards)) if rewards else math.nan,
        "reward_min": min(rewards) if rewards else math.nan,
        "reward_max": max(rewards) if rewards else math.nan,
        "well_formed": (turns - errors) / turns if turns else math.nan,
        "tokens": float(sum(r.response_tokens for r in batch)),
        "staleness": float(max(lags)) if lags else math.nan,
    }


def gpus_text(per: Mapping[str, int]) -> str:
    return ", ".join(f"{v} {k}" for k, v in sorted(per.items()) if v) or "none"


def step_line(rec: StepRecord, batch: Mapping[str, float], events: Sequence[StoryEvent], t_s: float,
              gpus: Mapping[str, int], total_steps: int | None = None) -> str:
    """One training step in one line (see the module docstring)."""
    m = rec.metrics
    of = f"/{total_steps}" if total_steps else ""
    did = "; ".join(e.brief for e in events) or "nothing"
    upd = (f"KL(behav||theta) {m.get('behav_kl', math.nan):.4f}, IS weight max {m.get('is_weight_max', math.nan):.2f}"
           if not m.get("skipped_nonfinite") else "update refused (non-finite loss or gradient): weights kept")
    return (f"[pearl run {clock(t_s)}] step {rec.step}{of}: reward {batch.get('reward', math.nan):.3f} "
            f"+- {batch.get('reward_sd', math.nan):.3f} (min {batch.get('reward_min', math.nan):.2f}, max "
            f"{batch.get('reward_max', math.nan):.2f}) over {rec.trajectories} trajectories, well-formed "
            f"{batch.get('well_formed', math.nan):.0%} | scheduler since last step: {did} | GPUs: {gpus_text(gpus)} "
            f"| weights v{rec.version}, staleness {batch.get('staleness', math.nan):.0f} | train {rec.train_s:.1f} s, "
            f"weight sync {rec.sync_s:.1f} s; {upd}")


def plot_roles(cats: Mapping[str, tuple[str, str]], training_gpus: int) -> dict[str, int]:
    """GPUs per role for the plot from one sample's gpu -> (zone, category): the serving roles
    (colocated / prefill / decode), ``borrowed`` (a lent training GPU serving rollout), ``preparing``
    (a preemptible GPU whose worker is not serving yet), ``lent, idle``, ``idle`` (a reserved GPU with
    no serving worker), and ``training`` = ``training_gpus`` - the training GPUs drawn as lent."""
    out: dict[str, int] = {}
    lent = 0
    for zone, cat in cats.values():
        if zone == "overlap":
            lent += 1
        role = cat
        if cat == "idle":
            role = {"preemptible": "preparing", "overlap": "lent, idle"}.get(zone, "idle")
        out[role] = out.get(role, 0) + 1
    if training_gpus:
        out["training"] = max(0, training_gpus - lent)
    return out


@dataclass(frozen=True, slots=True)
class StepPoint:
    """A finished step for the plot: when (controller clock), which, its reward mean and spread."""

    t: float
    step: int
    reward: float
    reward_sd: float


@dataclass
class RunStory:
    """The run's event and step lines, and the points of its plot (see the module docstring)."""

    say: Callable[[str], None]
    plain: bool
    heartbeat_s: float = 60.0
    total_steps: int | None = None
    training_gpus: int = 0
    events: list[StoryEvent] = field(default_factory=list)
    steps: list[StepPoint] = field(default_factory=list)
    samples: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    t0: float | None = None
    _last_t: float | None = None
    _seen: int = 0
    _label: str | None = None
    _pool: Any = None  # n_workers of the last PD line's decision
    _since_step: list[StoryEvent] = field(default_factory=list)
    _last_said: float | None = None
    _last_sample: Sample | None = None

    def _emit(self, t: float, line: str) -> None:
        self.say(line)
        self._last_said = t

    def observe(self, s: Sample, history: Sequence[Mapping[str, Any]],
                cats: Mapping[str, tuple[str, str]] | None = None) -> list[StoryEvent]:
        """Fold one sample and the history's new entries in; returns the new events. ``cats``:
        gpu id -> (zone, category) of the sample (``pearl.sim.metrics.category_of``), for the plot's
        roles (``plot_roles``); without it the sample's counts per category are kept."""
        if self.t0 is None:
            self.t0 = s.t
        self.samples.append((s.t, plot_roles(cats, self.training_gpus) if cats is not None
                             else dict(s.gpus_per_category)))
        self._last_sample = s
        fresh, self._last_t, self._seen = new_entries(history, self._last_t, self._seen)
        out: list[StoryEvent] = []
        for e in fresh:
            ev: StoryEvent | None
            if e.get("kind") == "replan":
                d = e.get("decision")
                ev = None
                # a PD line when the allocation or the pool it was chosen for changes
                if isinstance(d, Mapping) and (d.get("label"), d.get("n_workers")) != (self._label, self._pool):
                    switch = self._label is not None and d.get("label") != self._label
                    ev = StoryEvent(float(e.get("t", s.t)), "pd", (f"PD switch {self._label} -> {d.get('label')}; "
                                    if switch else "") + _decision_text(d), short=f"PD {d.get('label')}")
                    self._label, self._pool = str(d.get("label")), d.get("n_workers")
            else:
                ev = story_event(e)
            # the start-up (the reserved workers launched as one expansion) is the run's "ready after" line;
            # its PD decision is kept: it is the first allocation
            if ev is not None and (ev.t >= self.t0 or ev.kind == "pd"):
                out.append(ev)
        self.events += out
        self._since_step += out
        if self.plain:
            for ev in out:
                self._emit(s.t, f"[pearl run {clock(ev.t - self.t0)}] {ev.text}")
            if self._last_said is None:
                self._last_said = s.t
            if s.t - self._last_said >= self.heartbeat_s:
                p = s.progress
                self._emit(s.t, f"[pearl run {clock(s.t - self.t0)}] rollout: {p.trajectories_completed} "
                                f"trajectories done, {p.trajectories_in_flight} in flight, training step "
                                f"{p.train_step}, weights v{p.weight_version}; GPUs: {gpus_text(s.gpus_per_category)}")
        return out

    def step_line(self, rec: StepRecord, batch: Mapping[str, float], t: float) -> str:
        """The step's line (the events since the previous step are consumed); remembers its plot point."""
        t0 = self.t0 if self.t0 is not None else t
        self.steps.append(StepPoint(t, rec.step, batch.get("reward", math.nan), batch.get("reward_sd", math.nan)))
        gpus = self._last_sample.gpus_per_category if self._last_sample is not None else {}
        line = step_line(rec, batch, self._since_step, t - t0, gpus, self.total_steps)
        self._since_step = []
        self._last_said = t
        return line

    def recent(self, n: int = 5) -> list[str]:
        """The last ``n`` events as ``m:ss text`` (the live panel's rows)."""
        t0 = self.t0 or 0.0
        return [f"{clock(e.t - t0)} {e.text}" for e in self.events[-n:]]


async def with_heartbeat(aw: Awaitable[T], every_s: float, say: Callable[[float], None]) -> T:
    """Await ``aw``; every ``every_s`` seconds it is still running, call ``say(elapsed_s)`` (a slow
    start is never silent). Cancelling this cancels ``aw`` and waits for it."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(aw)
    t0 = loop.time()
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=every_s)
            if done:
                return task.result()
            say(loop.time() - t0)
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def highlights(summary: Mapping[str, Any]) -> list[str]:
    """What the run showed, one line per thing a newcomer came to see (from ``summary.json``):
    the reward's first and last step, the preemptible GPU's grant / admission / reclaim, the
    borrowing of training GPUs, the PD decisions, the trajectories lost."""
    out: list[str] = []
    r = [x for x in summary.get("mean_reward_per_step", []) if isinstance(x, int | float)]
    if r:
        best = max(r)
        out.append(f"learning: reward {r[0]:.3f} at step 1 -> {r[-1]:.3f} at step {len(r)} (best {best:.3f})")
    evs = [e for e in summary.get("events", []) if isinstance(e, Mapping)]

    def of(kind: str) -> list[Mapping[str, Any]]:
        return [e for e in evs if e.get("kind") == kind]

    def at(e: Mapping[str, Any]) -> str:
        return clock(float(e.get("t_s", 0.0)))

    def cost(e: Mapping[str, Any]) -> str:
        return f" ({e['cost_s']:.1f} s)" if isinstance(e.get("cost_s"), int | float) else ""

    pre = [f"{e.get('kind')} at {at(e)}{cost(e)}" for e in evs if e.get("kind") in ("grant", "admitted", "notice",
                                                                                      "shrink")]
    out.append("preemptible GPUs: " + ("; ".join(pre) if pre else "no grant or reclaim in this run"))
    lent = [e for e in of("borrow") if e.get("text", "").startswith("borrow:")]
    rets = [float(e["cost_s"]) for e in of("return") if isinstance(e.get("cost_s"), int | float)]
    out.append(f"training GPUs lent between updates: {len(lent)} time(s), returned {len(rets)} time(s)"
               + (f" in {min(rets):.1f}-{max(rets):.1f} s" if rets else ""))
    pd = [f"{e.get('text', '')} at {at(e)}" for e in of("pd")]
    out.append("PD decisions: " + (" | ".join(pd) if pd else "none recorded"))
    out.append(f"trajectories lost: {summary.get('trajectories_lost')}")
    return out
