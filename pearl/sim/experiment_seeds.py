"""Several workload seeds per experiment cell: the mean and its spread (``experiments --seeds K``).

One 2-hour replay completes 10-25 batches; where the segment's end cuts a batch moves a system's
count by up to a batch (4-10 %), and which trajectories a seed draws moves it again. A comparison
of two systems on one seed therefore cannot resolve a difference below a batch. With ``K`` seeds
each cell is replayed on workload seeds ``s0 + i`` (``i < K``, ``s0`` = the config's
``workload.seed``; seed ``i`` draws other trajectories, the same in every system of the cell:
paired), each ratio is taken per seed on *completed* trajectories, and the tables give, over the
seeds, ``mean ± sd [min, max]`` (``sd``: the sample standard deviation, 0 with one seed).

Public names: ``seed_overrides``, ``spread``, ``fmt_spread``, ``fig5_seeds_markdown``,
``fig7_seeds_rows``, ``fig8_seeds_rows``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pearl.sim.replay_report import markdown_table


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
                     fmt_spread(_ratios(by_seed, "pearl", "oracle"), "share"),
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
