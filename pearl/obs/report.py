"""The end-of-run report of a live run: ``report.md`` + ``gpu-roles.png`` + ``throughput.png``.

Reuses the simulator's plotting (``pearl.sim.replay_report``: the same GPU-role colours and throughput
definition), so a live run and a replay are read the same way. Inputs come from a ``RunRecord``
(``pearl.obs.observer``).

Throughput over time: completions are recovered from the sampled counter (a step of ``n`` between
two samples counts ``n`` completions at the later sample's time), then
``throughput(t) = 3600 * #completions in [t - W, t] / min(W, t)`` trajectories per hour, with the
window ``W = max(60 s, duration / 20)`` (a live demo lasts minutes, not the simulator's hours).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pearl.access import redact
from pearl.sim.replay_report import markdown_table, plot_timeline, throughput_curve

if TYPE_CHECKING:
    from pearl.obs.observer import RunRecord


def completion_times(counter: list[tuple[float, int]]) -> list[float]:
    out: list[float] = []
    prev = counter[0][1] if counter else 0
    for t, n in counter:
        out.extend([t] * max(0, n - prev))
        prev = max(prev, n)
    return out


def plot_throughput_curve(times: list[float], end_s: float, path: Path) -> None:
    import matplotlib.pyplot as plt

    window = max(60.0, end_s / 20)
    xs, ys = throughput_curve(times, end_s, window_s=window, step_s=max(1.0, end_s / 200))
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.plot([x * 60 for x in xs], ys)
    ax.set_xlabel("time (min)")
    ax.set_ylabel(f"trajectories / h ({window:.0f}-s window)")
    ax.set_title("Throughput over time")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_run_report(record: RunRecord, out_dir: str | Path, title: str, config: dict[str, Any]) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = record.t0 or 0.0
    end = max(record.t_end - t0, 1e-9)
    # shift to run time 0
    segs = [[g, a - t0, b - t0, c] for g, a, b, c in record.ledger.segments]
    counter = [(t - t0, n) for t, n in record.completions]
    times = completion_times(counter)
    lines = [f"# {title}", ""]
    p = record.last.progress if record.last is not None else None
    if p is not None:
        rows: list[list[Any]] = [
            ["duration (s)", round(end, 1)],
            ["trajectories completed", p.trajectories_completed],
            ["trajectories interrupted (resumed)", p.trajectories_interrupted],
            ["trajectories lost", p.trajectories_lost],
            ["tokens generated", p.tokens_generated],
            ["mean throughput (traj/h)", round(3600 * len(times) / end, 2)],
            ["rollout steps / train steps", f"{p.rollout_step} / {p.train_step}"],
            ["final weight version", p.weight_version],
        ]
        lines += [markdown_table(["figure", "value"], rows), ""]
    if record.ledger.role_s:
        rows = [[cat, round(sec / 3600, 4)] for cat, sec in sorted(record.ledger.role_s.items())]
        lines += ["## GPU-hours by role", "", markdown_table(["role", "GPU-hours"], rows), ""]
    if record.modes:
        rows = [[round(t - t0, 1), lab] for t, lab in record.modes]
        lines += ["## PD allocation changes", "", markdown_table(["t (s)", "allocation"], rows), ""]
    if segs:
        plot_timeline(title, {"timeline": segs}, end, out / "gpu-roles.png")
        lines += ["## GPU roles over time", "", "![GPU roles](gpu-roles.png)", ""]
    plot_throughput_curve(times, end, out / "throughput.png")
    lines += ["## Throughput", "", "![throughput](throughput.png)", ""]
    lines += ["## Effective config (secrets redacted)", "", "```json", json.dumps(redact(config), indent=1, default=str),
              "```", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
