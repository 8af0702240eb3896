"""Report folder for a simulation: a markdown summary and PNG plots (matplotlib, Agg backend).

Public names: ``write_report(result, out_dir) -> Path`` (returns the markdown file),
``plot_throughput``, ``plot_timeline``, ``markdown_table``, ``ROLE_COLORS``.

``result`` is the dict ``pearl.sim.simulate.run_simulation`` returns: ``{"systems": {name: summary},
"series": {name: {...}}, "meta": {...}, "wall_s": ...}``. Per system ``series`` holds::

    completions   [t_s, ...]                         virtual times of completed trajectories
    timeline      [[gpu_id, t0_s, t1_s, category]]    category in ROLE_COLORS
    modes         [[t_s, label], ...]                 allocation label after each change ("4P4D")
    budget        [[t_s, n_preemptible_gpus], ...]    the trace as replayed

Plots (one file each): ``throughput.png`` (trajectories/hour over a sliding window, all systems;
the preemptible GPU budget on a second axis), ``timeline-<system>.png`` (a row per GPU, coloured by
what it did: prefill / decode / colocated / idle / borrowed (a training GPU serving rollout)),
``modes.png`` (allocation label over time per system).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROLE_COLORS: dict[str, str] = {
    "prefill": "#1f77b4",
    "decode": "#ff7f0e",
    "colocated": "#2ca02c",
    "borrowed": "#9467bd",
    "idle": "#d9d9d9",
}

#: Sliding window for the throughput curve, seconds.
THROUGHPUT_WINDOW_S = 1200.0


def _natural(gpu_id: str) -> tuple[Any, ...]:
    """Sort key: reserved, spot, training GPUs, numbers in numeric order (r2 before r10)."""
    import re

    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", gpu_id))


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


def throughput_curve(completions: Sequence[float], end_s: float, window_s: float = THROUGHPUT_WINDOW_S,
                     step_s: float = 60.0) -> tuple[list[float], list[float]]:
    """Trajectories per hour in ``[t - window, t]``, sampled every ``step_s`` (hours on x)."""
    ts = sorted(completions)
    xs: list[float] = []
    ys: list[float] = []
    j0 = j1 = 0
    t = step_s
    while t <= end_s + 1e-9:
        while j1 < len(ts) and ts[j1] <= t:
            j1 += 1
        while j0 < j1 and ts[j0] <= t - window_s:
            j0 += 1
        w = min(window_s, t)
        xs.append(t / 3600)
        ys.append((j1 - j0) * 3600 / w)
        t += step_s
    return xs, ys


def plot_throughput(result: Mapping[str, Any], path: Path) -> None:
    end = float(result["meta"]["duration_s"])
    fig, ax = plt.subplots(figsize=(9, 4))
    for name, s in result["series"].items():
        xs, ys = throughput_curve(s["completions"], end)
        ax.plot(xs, ys, label=name)
    ax.set_xlabel("time (h)")
    ax.set_ylabel(f"trajectories / h ({THROUGHPUT_WINDOW_S / 60:.0f}-min window)")
    first = next(iter(result["series"].values()), None)
    if first and first.get("budget"):
        ax2 = ax.twinx()
        pts = first["budget"]
        ax2.step([p[0] / 3600 for p in pts], [p[1] for p in pts], where="post", color="k", alpha=0.3,
                 linestyle="--", label="preemptible GPUs")
        ax2.set_ylabel("preemptible GPUs (trace)")
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title("Throughput over time")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_timeline(name: str, series: Mapping[str, Any], end_s: float, path: Path) -> None:
    segs = series["timeline"]
    gpus = sorted({s[0] for s in segs}, key=_natural)
    row = {g: i for i, g in enumerate(gpus)}
    fig, ax = plt.subplots(figsize=(10, max(2.5, 0.22 * len(gpus) + 1)))
    by_cat: dict[str, list[tuple[float, float]]] = {}
    ys: dict[str, list[tuple[float, float]]] = {}
    for g, t0, t1, cat in segs:
        by_cat.setdefault(cat, []).append((t0 / 3600, (t1 - t0) / 3600))
        ys.setdefault(cat, []).append((row[g] - 0.4, 0.8))
    for cat, spans in by_cat.items():
        for (x, w), (y, h) in zip(spans, ys[cat], strict=True):
            ax.broken_barh([(x, w)], (y, h), facecolors=ROLE_COLORS.get(cat, "#000000"))
    ax.set_yticks(range(len(gpus)))
    ax.set_yticklabels(gpus, fontsize=6)
    ax.set_xlim(0, end_s / 3600)
    ax.set_xlabel("time (h)")
    # pyplot re-exports matplotlib.patches.Rectangle without declaring it public (stub gap)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in ROLE_COLORS.values()]  # type: ignore[attr-defined]
    ax.legend(handles, list(ROLE_COLORS), loc="upper right", fontsize=7, ncol=5)
    ax.set_title(f"GPU roles over time: {name}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_modes(result: Mapping[str, Any], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(9, 3))
    labels: list[str] = []
    for s in result["series"].values():
        for _t, lab in s["modes"]:
            if lab not in labels:
                labels.append(lab)
    idx = {lab: i for i, lab in enumerate(labels)}
    end = float(result["meta"]["duration_s"])
    for name, s in result["series"].items():
        pts = s["modes"]
        if not pts:
            continue
        xs = [p[0] / 3600 for p in pts] + [end / 3600]
        ys = [idx[p[1]] for p in pts] + [idx[pts[-1][1]]]
        ax.step(xs, ys, where="post", label=name)
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=7)
    ax.set_xlabel("time (h)")
    ax.set_title("Rollout allocation (mode / P:D ratio) over time")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def fmt(x: Any) -> str:
        if isinstance(x, float):
            return f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"
        return str(x)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(x) for x in r) + " |" for r in rows]
    return "\n".join(lines)


def summary_rows(systems: Mapping[str, Mapping[str, Any]]) -> list[list[Any]]:
    base = systems.get("roll", {}).get("trajectories_per_hour")
    rows = []
    for name, s in systems.items():
        tph = s["trajectories_per_hour"]
        rows.append([
            name,
            tph,
            f"{tph / base:.2f}x" if base else "-",
            s["rollout_steps"],
            s["train_steps"],
            sum(s["gpu_hours"].values()),
            s["cost_per_1k_trajectories"],
            sum(s["reconfigurations"].values()),
            "-" if s.get("makespan_prediction_error") is None else f"{100 * s['makespan_prediction_error']:.1f}%",
        ])
    return rows


def write_report(result: Mapping[str, Any], out_dir: str | Path) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = result["meta"]
    end = float(meta["duration_s"])
    plot_throughput(result, out / "throughput.png")
    plot_modes(result, out / "modes.png")
    for name, s in result["series"].items():
        plot_timeline(name, s, end, out / f"timeline-{_safe(name)}.png")
    md = [
        f"# Simulation: {meta.get('config', '')} on {meta.get('trace', '')}",
        "",
        f"Segment: start {meta.get('start_hour', 0):.2f} h, {end / 3600:.2f} h; "
        f"wall {result['wall_s']:.1f} s; simulated events/s {meta.get('events_per_s', 0):.0f}.",
        "",
        markdown_table(
            ["system", "traj/h", "vs roll", "rollout steps", "train steps", "GPU-h", "$/1k traj", "reconfigs",
             "makespan err"],
            summary_rows(result["systems"]),
        ),
        "",
        "## Reconfigurations by kind",
        "",
    ]
    for name, s in result["systems"].items():
        kinds = ", ".join(f"{k}: {v}" for k, v in sorted(s["reconfigurations"].items())) or "none"
        md.append(f"- **{name}**: {kinds}")
    gated = {n: s["gates"] for n, s in result["systems"].items() if s.get("gates")}
    if gated:
        md += ["", "## Gate decisions (borrow: idle training GPUs; expansion: granted preemptible GPUs; switch: a "
               "mode or ratio switch before a known shrink; schedule: a switch weighed over the batch's pool "
               "changes)", "",
               "Outcomes (`pearl/core/gate.py` `GateOutcome`): admitted, ungated (gate off), "
               "saving_below_cost, saving_below_threshold, window_too_short, batch_ends_first, lifetime_too_short, "
               "no_speedup.", ""]
        for name, gates in gated.items():
            parts = [f"{kind} " + ", ".join(f"{o}: {n}" for o, n in per.items()) for kind, per in gates.items()]
            md.append(f"- **{name}**: " + "; ".join(parts))
    md += ["", "## Plots", "", "![throughput](throughput.png)", "", "![modes](modes.png)", ""]
    for name in result["series"]:
        md += [f"![timeline {name}](timeline-{_safe(name)}.png)", ""]
    path = out / "report.md"
    path.write_text("\n".join(md))
    return path
