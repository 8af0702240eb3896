"""The experiments' tables and charts: one seed per cell, and several (``experiments --seeds K``).

``fig5_markdown`` renders Fig. 5 (one seed: the first seed's runs; several: a second table),
``bound_oracle`` bounds a segment's oracle by the systems replayed on it, ``bar_chart`` draws the PNGs.

One 2-hour replay completes 10-25 batches; where the segment's end cuts a batch moves a system's
count by up to a batch (4-10 %), and which trajectories a seed draws moves it again. A comparison
of two systems on one seed therefore cannot resolve a difference below a batch. With ``K`` seeds
each cell is replayed on workload seeds ``s0 + i`` (``i < K``, ``s0`` = the config's
``workload.seed``; seed ``i`` draws other trajectories, the same in every system of the cell:
paired), each ratio is taken per seed on *completed* trajectories, and the tables give, over the
seeds, ``mean ± sd [min, max]`` (``sd``: the sample standard deviation, 0 with one seed).

Public names: ``FIG5_SYSTEMS``, ``fig5_markdown``, ``bound_oracle``, ``bar_chart``, ``seed_overrides``,
``spread``, ``fmt_spread``, ``fig5_seeds_markdown``, ``fig7_seeds_rows``, ``fig8_seeds_rows``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from pearl.sim.replay_report import markdown_table
from pearl.sim.simulate import oracle_bound
from pearl.sim.systems import SYSTEMS

FIG5_SYSTEMS = ("roll", "roll-large", "rlboost+", "pearl", "oracle", "pearl-coloc", "pearl-nogate")


def bar_chart(path: Path, groups: Sequence[str], series: Mapping[str, Sequence[float]], ylabel: str, title: str) -> None:
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(groups) * max(1, len(series)) / 3), 4))
    w = 0.8 / max(1, len(series))
    for i, (name, vals) in enumerate(series.items()):
        ax.bar([j + i * w for j in range(len(groups))], vals, width=w, label=name)
    ax.set_xticks([j + 0.4 - w / 2 for j in range(len(groups))])
    ax.set_xticklabels(groups, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def fig5_markdown(out: Path, results: Mapping[str, Any], name: str = "fig5") -> str:
    """Table + bar chart from ``{"model/segment": {"segment", "systems": {name: summary}}}``
    (partial results give a partial table: missing systems show '-'). ``name``: fig5 or
    fig5-paper (the PNG's name and the heading)."""
    names = [n for n in FIG5_SYSTEMS if any(n in r["systems"] for r in results.values())]

    def tph(r: Mapping[str, Any], n: str) -> float | None:
        s = r["systems"].get(n)
        return None if s is None else float(s["trajectories_per_hour"])

    rows = []
    for key, r in results.items():
        model, label = key.split("/")
        base = tph(r, "roll")
        row: list[Any] = [model, label, f"{r['segment']['mean_gpus']:.1f}"]
        row += [f"{v / base:.2f}x" if base and (v := tph(r, n)) is not None else "-" for n in names]
        pe, rb, orc = tph(r, "pearl"), tph(r, "rlboost+"), tph(r, "oracle")
        row.append(f"{100 * (pe / rb - 1):+.1f}%" if pe and rb else "-")
        row.append(f"{100 * pe / orc:.1f}%" if pe and orc else "-")
        rate = {n: r["systems"].get(n, {}).get("batch_rate_per_hour") for n in ("roll", "rlboost+", "pearl")}
        row.append(f"{rate['pearl'] / rate['roll']:.2f}x / {100 * (rate['pearl'] / rate['rlboost+'] - 1):+.1f}%"
                   if all(rate.values()) else "-")
        ps = r["systems"].get("pearl", {})
        err = ps.get("makespan_prediction_error")
        steady = ps.get("makespan_prediction_error_steady")
        piece = ps.get("makespan_prediction_error_piecewise")
        placed = ps.get("makespan_prediction_error_placed")

        def pct(x: float | None) -> str:
            return "-" if x is None else f"{100 * x:.1f}%"

        row.append(f"{pct(err)} / {pct(piece)} / {pct(placed)} / {pct(steady)}")
        cpu = [x.get("cpu_s", 0.0) for x in r["systems"].values() if x.get("cpu_s")]
        row.append(f"{max(cpu):.0f}" if cpu else "-")
        rows.append(row)
    header = ["model", "segment", "mean spot GPUs", *names, "pearl vs rlboost+", "pearl / oracle",
              "by whole batches: pearl / roll, vs rlboost+", "pearl predictor err (batch start / piecewise / piecewise placed / steady batches)", "max CPU s per system"]
    groups = list(results)
    series = {n: [(tph(results[g], n) or 0.0) / (tph(results[g], "roll") or 1.0) for g in groups] for n in names}
    paper = name == "fig5-paper"
    bar_chart(out / f"{name}.png", groups, series, "throughput / ROLL",
         "Fig. 5" + (" (paper-matched segments)" if paper else "") + ": end-to-end throughput normalised to ROLL")
    src = next((r["trace"] for r in results.values() if r.get("trace")), "the trace")
    title = (f"## Fig. 5 on paper-matched segments: throughput normalised to ROLL (2-hour segments of {src} "
             "whose mean preemptible GPUs match the paper's ROLL-Large pools of 14 / 10 / 12 GPUs)"
             if paper else f"## Fig. 5: throughput normalised to ROLL (2-hour segments of {src})")
    return (title + "\n\n" + markdown_table(header, rows) + "\n"
            + fig5_seeds_markdown(results, bound_oracle))


def bound_oracle(result: Mapping[str, Any]) -> dict[str, Any]:
    """One segment's result with its oracle bounded by every system replayed on the segment
    (``pearl.sim.simulate.oracle_bound``; each system ran as its own job, so the bound is taken
    here). The saved partial results stay unbounded, so applying it again gives the same."""
    systems = dict(result["systems"])
    if "oracle" in systems:
        systems["oracle"] = oracle_bound("oracle", systems, {n for n, s in SYSTEMS.items() if s.fixed_pool is not None})
    return {**result, "systems": systems}




def seed_overrides(base_seed: int, i: int) -> dict[str, Any]:
    """Config overrides of the ``i``-th seed of a cell (none for ``i = 0``: the config's own seed)."""
    return {} if i == 0 else {"workload.seed": base_seed + i}


def spread(xs: Sequence[float]) -> tuple[float, float, float, float]:
    """(mean, sample sd, min, max) of ``xs`` (sd 0 for one value)."""
    if not xs:
        raise ValueError("spread of no values")
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return statistics.fmean(xs), sd, min(xs), max(xs)


def fmt_spread(xs: Sequence[float], kind: str) -> str:
    """``kind``: ``gain`` (x - 1 in %, signed), ``share`` (x in %), ``ratio`` (x with a trailing x)."""
    if not xs:
        return "-"
    m, sd, lo, hi = spread(xs)
    if kind == "gain":
        return f"{100 * (m - 1):+.1f} % ± {100 * sd:.1f} [{100 * (lo - 1):+.1f}, {100 * (hi - 1):+.1f}]"
    if kind == "share":
        return f"{100 * m:.1f} % ± {100 * sd:.1f} [{100 * lo:.1f}, {100 * hi:.1f}]"
    if kind == "ratio":
        return f"{m:.2f}x ± {sd:.2f} [{lo:.2f}, {hi:.2f}]"
    raise ValueError(f"unknown spread kind {kind!r}")


def _ratios(by_seed: Mapping[str, Mapping[str, Any]], a: str, b: str,
            field: str = "trajectories_completed") -> list[float]:
    """Per seed where both ran: ``a``'s ``field`` / ``b``'s."""
    out = []
    for systems in by_seed.values():
        x, y = systems.get(a, {}).get(field), systems.get(b, {}).get(field)
        if x is not None and y:
            out.append(float(x) / float(y))
    return out


def _mean_of(by_seed: Mapping[str, Mapping[str, Any]], name: str, field: str) -> str:
    xs = [float(s[name][field]) for s in by_seed.values() if s.get(name, {}).get(field) is not None]
    return f"{statistics.fmean(xs):.0f}" if xs else "-"


def _of_seeds(xs: Sequence[float], kind: str, k: int) -> str:
    """``fmt_spread``, naming the number of seeds where fewer than the cell's ``k`` have both systems."""
    return fmt_spread(xs, kind) + (f" ({len(xs)} of {k} seeds)" if xs and len(xs) < k else "")


def fig5_seeds_markdown(results: Mapping[str, Any], bound: Callable[[Mapping[str, Any]], Mapping[str, Any]]) -> str:
    """The multi-seed table of Fig. 5 from ``{"model/segment": {"segment", "by_seed": {seed:
    {system: summary}}}}``; ``bound`` bounds one seed's oracle by the systems of that seed."""
    rows = []
    k_max = 0
    for key, r in results.items():
        by_seed = {s: dict(bound({"systems": sy})["systems"]) for s, sy in r.get("by_seed", {}).items()}
        if not by_seed:
            continue
        k_max = max(k_max, len(by_seed))
        model, label = key.split("/")
        errs = [float(s["pearl"]["makespan_prediction_error"]) for s in by_seed.values()
                if s.get("pearl", {}).get("makespan_prediction_error") is not None]
        rows.append([model, label, f"{r['segment']['mean_gpus']:.1f}", len(by_seed),
                     " / ".join(_mean_of(by_seed, n, "trajectories_completed") for n in ("roll", "rlboost+", "pearl", "oracle")),
                     fmt_spread(_ratios(by_seed, "pearl", "roll"), "ratio"),
                     fmt_spread(_ratios(by_seed, "pearl", "rlboost+"), "gain"),
                     _of_seeds(_ratios(by_seed, "pearl", "oracle"), "share", len(by_seed)),
                     fmt_spread(_ratios(by_seed, "pearl", "rlboost+", "batch_rate_per_hour"), "gain"),
                     f"{100 * statistics.fmean(errs):.1f} %" if errs else "-"])
    if not rows:
        return ""
    return (f"\nOver {k_max} workload seeds per cell (`--seeds {k_max}`; each ratio per seed on completed "
            "trajectories, then mean ± sample sd [min, max] over the seeds; pearl / oracle with each seed's oracle "
            "bounded by that seed's systems):\n\n" + markdown_table(
                ["model", "segment", "mean spot GPUs", "seeds",
                 "completed trajectories, mean: roll / rlboost+ / pearl / oracle", "pearl / roll",
                 "pearl vs rlboost+", "pearl / oracle", "by whole batches: pearl vs rlboost+",
                 "pearl predictor err (batch start, mean)"], rows) + "\n")


def fig7_seeds_rows(results: Mapping[str, Any], variants: Sequence[str]) -> list[list[Any]]:
    """Rows (model, GPUs, seeds, gain of each variant over roll) from ``{"model/n": {"by_seed":
    {seed: {variant: summary}}}}``; gains per seed on completed trajectories."""
    rows = []
    for key, r in results.items():
        by_seed = r.get("by_seed", {})
        if not by_seed:
            continue
        model, n = key.split("/")
        rows.append([model, n, len(by_seed)] + [fmt_spread(_ratios(by_seed, v, variants[0]), "gain")
                                                for v in variants[1:]])
    return rows


def fig8_seeds_rows(results: Mapping[str, Any]) -> list[list[Any]]:
    """Rows (point, seeds, rlboost+ / pearl mean completed, pearl vs rlboost+ counted and by whole
    batches) from ``{point: {"by_seed": {seed: {system: summary}}}}``."""
    rows = []
    for label, r in results.items():
        by_seed = r.get("by_seed", {})
        if not by_seed:
            continue
        rows.append([label, len(by_seed),
                     f"{_mean_of(by_seed, 'rlboost+', 'trajectories_completed')} / "
                     f"{_mean_of(by_seed, 'pearl', 'trajectories_completed')}",
                     fmt_spread(_ratios(by_seed, "pearl", "rlboost+"), "gain"),
                     fmt_spread(_ratios(by_seed, "pearl", "rlboost+", "batch_rate_per_hour"), "gain")])
    return rows
