"""The end-of-run picture of ``pearl run``: ``run.png`` beside ``summary.json`` (matplotlib, Agg).

Two panels over one time axis (minutes since the rollout started, ``t0``):

* top: the mean reward of each training step's batch, drawn at the time the step finished, with its
  spread (+- the population standard deviation, ``pearl.obs.story.batch_stats``) as error bars and
  the step number above each point;
* bottom: GPUs per role over time, stacked (``pearl.obs.story.plot_roles``: colocated / prefill /
  decode serving rollout, a borrowed training GPU serving rollout, a preemptible GPU preparing, a
  lent GPU not serving, idle, training), from the observer's samples (one every ``period_s``);
  every elastic event that changed something is a vertical line in its kind's colour, labelled with
  its ``short`` words and measured cost (declined gates are in the log lines only).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from pearl.obs.story import KINDS, StepPoint, StoryEvent

ROLES = ("colocated", "prefill", "decode", "borrowed", "preparing", "lent, idle", "idle", "training")
ROLE_COLOURS = {"colocated": "#4c72b0", "prefill": "#dd8452", "decode": "#55a868", "borrowed": "#c44e52",
                "preparing": "#f2c45a", "lent, idle": "#e8a6a6", "idle": "#cccccc", "training": "#8172b3"}
EVENT_COLOURS = dict(zip(KINDS, ("#2ca02c", "#17becf", "#1f77b4", "#ff7f0e", "#d62728", "#9467bd", "#8c564b",
                                 "#e377c2", "#000000", "#999999"), strict=True))


def role_series(samples: Sequence[tuple[float, Mapping[str, int]]], t0: float
                ) -> tuple[list[float], dict[str, list[int]]]:
    """Minutes since ``t0`` and, per role (``pearl.obs.story.plot_roles``), the GPU count of each sample."""
    xs = [(t - t0) / 60 for t, _ in samples]
    return xs, {r: [int(per.get(r, 0)) for _, per in samples] for r in ROLES}


def plot_run(path: Path, steps: Sequence[StepPoint], samples: Sequence[tuple[float, Mapping[str, int]]],
             events: Sequence[StoryEvent], t0: float, title: str) -> Path:
    """Write the two-panel PNG to ``path`` and return it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_r, ax_g) = plt.subplots(2, 1, figsize=(10, 7), sharex=True, height_ratios=(1, 1.2))
    pts = [p for p in steps if math.isfinite(p.reward)]
    if pts:
        xs = [(p.t - t0) / 60 for p in pts]
        ax_r.errorbar(xs, [p.reward for p in pts], yerr=[p.reward_sd if math.isfinite(p.reward_sd) else 0 for p in pts],
                      marker="o", capsize=3)
        for x, p in zip(xs, pts, strict=True):
            ax_r.annotate(str(p.step), (x, p.reward), textcoords="offset points", xytext=(0, 7), ha="center",
                          fontsize=7)
    ax_r.set_ylabel("reward (batch mean +- sd)")
    ax_r.set_ylim(-0.05, 1.05)
    ax_r.set_title(title)
    ax_r.grid(alpha=0.3)
    if samples:
        xs_g, ys = role_series(samples, t0)
        shown = {k: v for k, v in ys.items() if any(v)}
        if shown:
            ax_g.stackplot(xs_g, *shown.values(), labels=list(shown), colors=[ROLE_COLOURS[k] for k in shown],
                           step="post", alpha=0.85)
        top = max((sum(col) for col in zip(*shown.values(), strict=True)), default=1) if shown else 1
        ax_g.set_ylim(0, top + 1.5)
        ax_g.legend(loc="upper left", fontsize=7, ncol=3)
    for ev in events:
        if ev.kind == "declined":  # a gate that said no changed nothing: the log lines carry it
            continue
        x = max(0.0, (ev.t - t0) / 60)  # the start-up's PD decision is drawn at the rollout's start
        colour = EVENT_COLOURS.get(ev.kind, "#000000")
        for ax in (ax_r, ax_g):
            ax.axvline(x, color=colour, lw=0.8, ls="--", alpha=0.8)
        ax_g.annotate(ev.brief, (x, 1.0), xycoords=("data", "axes fraction"), rotation=90, fontsize=6,
                      va="top", ha="right", color=colour, xytext=(-1, -2), textcoords="offset points")
    ax_g.set_xlabel("minutes since rollout started")
    ax_g.set_ylabel("GPUs per role")
    ax_g.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
