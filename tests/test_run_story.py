"""What a person watching ``pearl run`` reads: the event lines from the controller's elastic history,
the step line, the heartbeat of a piped run, the highlights and the end-of-run picture."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pearl.core.trajectory import Segment, TrajectoryRecord
from pearl.obs.observer import Sample
from pearl.obs.story import RunStory, batch_stats, highlights, new_entries, story_event, with_heartbeat
from pearl.obs.story_plot import plot_run
from pearl.runtime.control import Progress
from pearl.runtime.train_loop import StepRecord

DECISION = {"mode": "colocated", "label": "coloc", "predicted_makespan_s": 41.7, "n_workers": 2, "batch": 16,
            "candidates": [{"label": "coloc", "predicted_makespan_s": 41.7, "feasible": True},
                           {"label": "1P1D", "predicted_makespan_s": 55.2, "feasible": True}]}
#: elastic-history entries as ``pearl.runtime.elastic`` logs them, in time order
HISTORY: list[dict[str, Any]] = [
    {"t": 100.0, "kind": "replan", "reason": "start", "decision": DECISION},
    {"t": 120.0, "kind": "grant", "gpus": ["spot-00"]},
    {"t": 120.0, "kind": "expand_started", "group": "x1", "workers": ["w-spot-00-2"]},
    {"t": 130.0, "kind": "replan", "reason": "batch", "decision": DECISION},  # same allocation and pool: no line
    {"t": 150.0, "kind": "borrow", "step": 1, "gate": {"saving_s": 12.5, "cost_s": 6.0}},
    {"t": 175.0, "kind": "return", "step": 2, "workers": ["o-t0"], "aborted_requests": 3, "delay_s": 1.25},
    {"t": 210.0, "kind": "expand_admitted", "group": "x1", "workers": ["w-spot-00-2"], "wait_s": 90.0},
    {"t": 212.0, "kind": "replan", "reason": "admit",
     "decision": {**DECISION, "mode": "disaggregated", "label": "1P1D", "n_workers": 3}},
    {"t": 400.0, "kind": "reclaim_notice", "gpus": ["spot-00"], "deadline": 430.0},
    {"t": 428.0, "kind": "shrink", "gpus": ["spot-00"], "aborted_requests": 4, "started_at": 425.5,
     "released_at": 427.75, "met_deadline": True},
]


def sample(t: float, per: dict[str, int] | None = None) -> Sample:
    return Sample(t, Progress(trajectories_completed=int(t), train_step=1, weight_version=1),
                  per or {"colocated": 1, "borrowed": 1}, None)


def test_each_elastic_entry_reads_as_one_event_with_its_measured_cost() -> None:
    evs = [story_event(e) for e in HISTORY if e["kind"] != "replan"]
    assert [(e.kind, e.cost_s) for e in evs if e is not None] == [
        ("grant", None), ("expansion", None), ("borrow", None), ("return", 1.25), ("admitted", 90.0),
        ("notice", None), ("shrink", 2.25)]
    texts = {e.kind: e.text for e in evs if e is not None}
    assert texts["shrink"] == ("shrink: spot-00 released in 2.2 s, 4 request(s) aborted with their partial output "
                               "kept and resumed elsewhere, deadline met")
    assert texts["notice"] == "reclaim notice: spot-00 must be free within 30 s"
    assert texts["borrow"] == "borrow: training GPU(s) lent to rollout after step 1 (gate: predicted saving 12.5 s, return cost 6.0 s)"
    assert story_event({"t": 1.0, "kind": "queued"}) is None
    failed = story_event({"t": 2.0, "kind": "expand_failed", "group": "x2",
                          "error": "admission: worker w-spot-00-4: vLLM server died (exit code -9); last log lines:\n"
                                   "INFO a\nINFO b"})
    assert failed is not None and failed.text == ("expand failed: admission: worker w-spot-00-4: vLLM server died "
                                                  "(exit code -9); last log lines")


def test_new_entries_are_read_once_across_polls_and_a_front_truncated_window() -> None:
    fresh, t, n = new_entries(HISTORY[:3], None, 0)
    assert fresh == HISTORY[:3] and (t, n) == (120.0, 2)
    fresh, t, n = new_entries(HISTORY[1:6], t, n)  # the window lost its oldest entry; entries at t=120 seen
    assert fresh == HISTORY[3:6] and (t, n) == (175.0, 1)
    assert new_entries(HISTORY[1:6], t, n) == ([], 175.0, 1)


def test_start_up_entries_before_the_first_sample_leave_only_the_first_pd_decision() -> None:
    said: list[str] = []
    story = RunStory(say=said.append, plain=True, heartbeat_s=1e9)
    startup = [{"t": 10.0, "kind": "expand_started", "group": "x1", "workers": ["w-r0-0"]},
               {"t": 90.0, "kind": "expand_admitted", "group": "x1", "workers": ["w-r0-0"], "wait_s": 80.0},
               {"t": 91.0, "kind": "replan", "reason": "start", "decision": DECISION}]
    story.observe(sample(100.0), startup)
    assert [e.kind for e in story.events] == ["pd"]
    assert said == ["[pearl run 0:00] PD decision: coloc (colocated), predicted batch makespan 42 s vs 1P1D 55 s, "
                    "from telemetry of 2 worker(s)"]


def test_piped_run_prints_each_event_once_and_the_step_line_says_what_happened_since_the_last_step() -> None:
    said: list[str] = []
    story = RunStory(say=said.append, plain=True, heartbeat_s=1e9, total_steps=12)
    story.observe(sample(100.0), HISTORY[:3])
    story.observe(sample(180.0), HISTORY[:6])
    assert said == [
        "[pearl run 0:00] PD decision: coloc (colocated), predicted batch makespan 42 s vs 1P1D 55 s, from "
        "telemetry of 2 worker(s)",
        "[pearl run 0:20] grant: preemptible GPU(s) spot-00 joined the cluster",
        "[pearl run 0:20] expansion x1: preparing w-spot-00-2 in the background (server start + weight load), "
        "rollout goes on",
        "[pearl run 0:50] borrow: training GPU(s) lent to rollout after step 1 (gate: predicted saving 12.5 s, "
        "return cost 6.0 s)",
        "[pearl run 1:15] return: o-t0 given back before step 2 in 1.2 s, 3 request(s) aborted and resumed",
    ]
    recs = [TrajectoryRecord(f"t{i}", "g", (Segment((1,), False), Segment((2, 3), True, (-0.1, -0.2), 1)), r,
                             info=MappingProxyType({"turns": 2, "tool_errors": e}))
            for i, (r, e) in enumerate([(0.0, 0), (0.5, 1), (1.0, 0), (0.5, 0)])]
    stats = batch_stats(recs, trainer_version=2)
    assert stats == {"reward": 0.5, "reward_sd": 0.3535533905932738, "reward_min": 0.0, "reward_max": 1.0,
                     "well_formed": 0.875, "tokens": 8.0, "staleness": 1.0}
    line = story.step_line(StepRecord(2, 2, 4, 0.5, 20.0, 1.5, {"behav_kl": 0.0042, "is_weight_max": 1.5}),
                           stats, 190.0)
    assert line == (
        "[pearl run 1:30] step 2/12: reward 0.500 +- 0.354 (min 0.00, max 1.00) over 4 trajectories, well-formed 88% "
        "| scheduler since last step: PD coloc; grant spot-00; expansion x1 preparing; borrow; return o-t0 1.2 s "
        "| GPUs: 1 borrowed, 1 colocated | weights v2, staleness 1 | train 20.0 s, weight sync 1.5 s; "
        "KL(behav||theta) 0.0042, IS weight max 1.50")
    story.observe(sample(430.0), HISTORY)
    nxt = story.step_line(StepRecord(3, 3, 4, 0.5, 20.0, 1.5, {"skipped_nonfinite": 1.0}), stats, 431.0)
    assert ("scheduler since last step: expansion x1 admitted 90.0 s; PD 1P1D; notice spot-00; shrink spot-00 2.2 s"
            in nxt)
    assert "update refused (non-finite loss or gradient): weights kept" in nxt
    assert "PD switch coloc -> 1P1D; PD decision: 1P1D (disaggregated)" in said[-3]


def test_a_piped_run_is_never_silent_longer_than_the_heartbeat_and_a_terminal_run_prints_no_event_lines() -> None:
    said: list[str] = []
    story = RunStory(say=said.append, plain=True, heartbeat_s=60.0)
    for t in range(0, 200, 2):
        story.observe(sample(float(t)), [])
    assert len(said) == 3  # at 60, 120, 180 s
    assert said[0] == ("[pearl run 1:00] rollout: 60 trajectories done, 0 in flight, training step 1, weights v1; "
                       "GPUs: 1 borrowed, 1 colocated")
    quiet: list[str] = []
    live = RunStory(say=quiet.append, plain=False, heartbeat_s=60.0)
    live.observe(sample(0.0), HISTORY)
    live.observe(sample(500.0), HISTORY)
    assert quiet == []  # the live panel shows them instead
    assert len(live.recent(3)) == 3 and live.recent(1) == ["7:08 shrink: spot-00 released in 2.2 s, 4 request(s) "
                                                           "aborted with their partial output kept and resumed "
                                                           "elsewhere, deadline met"]


async def test_a_slow_start_says_it_is_still_starting() -> None:
    ticks: list[float] = []

    async def slow() -> str:
        await asyncio.sleep(0.35)
        return "ready"

    assert await with_heartbeat(slow(), 0.1, ticks.append) == "ready"
    assert len(ticks) == 3


def test_a_pd_line_when_the_pool_grows_even_if_the_allocation_keeps_its_label() -> None:
    said: list[str] = []
    story = RunStory(say=said.append, plain=True, heartbeat_s=1e9)
    grown = {**DECISION, "n_workers": 3, "predicted_makespan_s": 20.0}
    story.observe(sample(100.0), [{"t": 100.0, "kind": "replan", "decision": DECISION},
                                  {"t": 101.0, "kind": "replan", "decision": DECISION},
                                  {"t": 102.0, "kind": "replan", "decision": grown}])
    assert said == [
        "[pearl run 0:00] PD decision: coloc (colocated), predicted batch makespan 42 s vs 1P1D 55 s, from "
        "telemetry of 2 worker(s)",
        "[pearl run 0:02] PD decision: coloc (colocated), predicted batch makespan 20 s vs 1P1D 55 s, from "
        "telemetry of 3 worker(s)"]


def test_highlights_say_each_thing_the_run_showed() -> None:
    story = RunStory(say=lambda _: None, plain=False)
    story.observe(sample(100.0), HISTORY)
    summary = {"mean_reward_per_step": [0.19, 0.25, 0.61], "trajectories_lost": 0,
               "events": [e.to_dict(story.t0 or 0.0) for e in story.events]}
    lines = highlights(summary)
    assert lines[0] == "learning: reward 0.190 at step 1 -> 0.610 at step 3 (best 0.610)"
    assert lines[1] == ("preemptible GPUs: grant at 0:20; admitted at 1:50 (90.0 s); notice at 5:00; "
                        "shrink at 5:28 (2.2 s)")
    assert lines[2] == "training GPUs lent between updates: 1 time(s), returned 1 time(s) in 1.2-1.2 s"
    assert lines[3].startswith("PD decisions: PD decision: coloc (colocated)")
    assert lines[4] == "trajectories lost: 0"


def test_plot_roles_count_each_gpu_once_by_zone() -> None:
    from pearl.obs.story import plot_roles

    cats = {"r0": ("reserved", "colocated"), "spot-00": ("preemptible", "idle"), "t0": ("overlap", "idle")}
    assert plot_roles(cats, training_gpus=1) == {"colocated": 1, "preparing": 1, "lent, idle": 1, "training": 0}
    cats = {"r0": ("reserved", "colocated"), "t0": ("overlap", "borrowed")}
    assert plot_roles(cats, training_gpus=1) == {"colocated": 1, "borrowed": 1, "training": 0}
    assert plot_roles({"r0": ("reserved", "decode")}, training_gpus=2) == {"decode": 1, "training": 2}
    story = RunStory(say=lambda _: None, plain=False, training_gpus=1)
    story.observe(sample(0.0), [], {"r0": ("reserved", "colocated")})
    assert story.samples == [(0.0, {"colocated": 1, "training": 1})]


def test_the_picture_is_a_png_with_both_panels(tmp_path: Path) -> None:
    story = RunStory(say=lambda _: None, plain=False)
    for t, per in [(100.0, {"colocated": 1, "idle": 1}), (200.0, {"colocated": 2, "borrowed": 1}),
                   (450.0, {"colocated": 1})]:
        story.observe(sample(t, per), HISTORY)
    from pearl.obs.story import StepPoint

    steps = [StepPoint(160.0, 1, 0.2, 0.1), StepPoint(300.0, 2, 0.4, 0.2)]
    path = plot_run(tmp_path / "run.png", steps, story.samples, story.events, 100.0, "demo")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
