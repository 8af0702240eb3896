"""The worlds sweep's driver and report: runs the worlds, summarises, draws, writes.

``sweep`` runs every world (``pearl.sim.worlds.run_world``) in ``jobs`` worker processes, one
world per task, printing a line per world as it ends; a world that cannot run (``WorldError``: a
parameter out of bounds, a GPU the cost database lacks, no feasible allocation) is reported with
its error and the rest go on. ``summary`` holds, over the worlds that ran:

* ``best_mode``: how many worlds each mode is best in (colocation, a split), and the best P:D
  ratios seen;
* ``pearl_regret``: median, mean, worst, the share of worlds within 0.5 % and 2 %;
* ``loss``: per system, ``M_system / M_best_static - 1`` over the worlds: mean and worst (with
  the world), and how often it is within 1 % of the best;
* ``separation``: per parameter, how well it separates the worlds where a split is best from those
  where colocation is (the AUC of the one-parameter rank classifier, 0.5 = none; the picture's
  axes are the two largest);
* ``exhaustive``: for worlds run with every split measured, whether the climb's answer (the best
  of colocation, the prior's top splits and their neighbours) is the exhaustive best.

The picture (``worlds.png``): the worlds on the two most separating axes, colour = the best
static mode (colocation, or the split's prefill share), marker size and edge = PEARL's regret;
the table (``worlds.md``): each policy's loss, mean and worst, across the worlds.

Public names: ``sweep``, ``summarize``, ``markdown``, ``plot``.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from pearl.sim.worlds import SPACE, WorldError, WorldParams, run_world

SYSTEMS = ("pearl", "rlboost+", "static-pd", "pearl-coloc")


def _job(args: tuple[WorldParams, int, int, bool]) -> dict[str, Any]:
    p, batches, top_k, exhaustive = args
    t0 = time.process_time()
    try:
        r = run_world(p, batches, top_k, exhaustive)
    except WorldError as e:
        return {"id": p.id, "params": p.model_dump(exclude={"id"}), "error": str(e)}
    r["cpu_s"] = round(time.process_time() - t0, 2)
    return r


def sweep(worlds: Sequence[WorldParams], batches: int = 3, top_k: int = 3, jobs: int = 1,
          exhaustive: set[str] | None = None, progress: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Run ``worlds`` (module docstring); results in the order of ``worlds``."""
    exhaustive = exhaustive or set()
    tasks = [(p, batches, top_k, p.id in exhaustive) for p in worlds]
    out: dict[str, dict[str, Any]] = {}
    t0 = time.perf_counter()

    def report(r: dict[str, Any]) -> None:
        out[r["id"]] = r
        n = len(out)
        if "error" in r:
            progress(f"[{n}/{len(tasks)} {time.perf_counter() - t0:.0f} s] {r['id']}: error: {r['error']}")
            return
        best = r["best_static"]
        progress(f"[{n}/{len(tasks)} {time.perf_counter() - t0:.0f} s] {r['id']} best {best['allocation']} "
                 f"{best['makespan_s']:.1f} s, pearl {r['systems']['pearl']['makespan_s']:.1f} s "
                 f"(regret {100 * r['pearl_regret']:+.2f} %), {r['cpu_s']:.0f} CPU s")

    if jobs <= 1:
        for t in tasks:
            report(_job(t))
    else:
        with ProcessPoolExecutor(max_workers=jobs) as ex:
            futs = [ex.submit(_job, t) for t in tasks]
            for f in as_completed(futs):
                report(f.result())
    return [out[p.id] for p in worlds]


# ------------------------------------------------------------------------------ summary
def _auc(xs: Sequence[float], labels: Sequence[bool]) -> float:
    """P(x of a positive > x of a negative), ties half: the rank AUC (0.5: no separation)."""
    pos = [x for x, y in zip(xs, labels, strict=True) if y]
    neg = [x for x, y in zip(xs, labels, strict=True) if not y]
    if not pos or not neg:
        return 0.5
    wins = sum((a > b) + 0.5 * (a == b) for a in pos for b in neg)
    return wins / (len(pos) * len(neg))


def _axis(r: dict[str, Any], name: str) -> float | None:
    p = r["params"]
    if name == "batch_per_gpu":
        return float(p["batch"]) / float(p["gpus"])
    v = p.get(name)
    if v is None:  # left to the preset or the physics file: what the world ran with
        v = r.get("effective", {}).get(name)
    if isinstance(v, str):
        return float(next(d for d in SPACE if d.name == name).choices.index(v))
    return None if v is None else float(v)


#: the axes the separation ranks: the space's, and the batch each GPU serves
AXES = (*(d.name for d in SPACE), "batch_per_gpu")


def summarize(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    ran = [r for r in results if "error" not in r]
    errors = [{"id": r["id"], "error": r["error"]} for r in results if "error" in r]
    if not ran:
        return {"worlds": len(results), "ran": 0, "errors": errors}
    regrets = [r["pearl_regret"] for r in ran]
    split_best = [r["best_static"]["mode"] == "split" for r in ran]
    loss: dict[str, dict[str, Any]] = {}
    for name in SYSTEMS:
        vals = [(r["systems"][name]["makespan_s"] / r["best_static"]["makespan_s"] - 1.0, r["id"]) for r in ran
                if r["systems"][name].get("makespan_s")]
        if not vals:
            continue
        worst = max(vals)
        loss[name] = {"mean": round(statistics.fmean(v for v, _ in vals), 5), "worst": round(worst[0], 5),
                      "worst_world": worst[1], "within_1pct": round(sum(v <= 0.01 + 1e-9 for v, _ in vals) / len(vals), 4),
                      "worlds": len(vals)}
    sep = {}
    for a in AXES:
        raw = [(_axis(r, a), s) for r, s in zip(ran, split_best, strict=True)]
        pts = [(x, s) for x, s in raw if x is not None]
        if len(pts) >= 3:
            sep[a] = round(_auc([x for x, _ in pts], [s for _, s in pts]), 4)
    ex = [r for r in ran if r.get("exhaustive")]
    ratios: dict[str, int] = {}
    for r in ran:
        if r["best_static"]["mode"] == "split":
            lab = r["best_static"]["allocation"]
            n = r["params"]["gpus"]
            share = f"{round(int(lab.split('P')[0]) / n, 2)}"
            ratios[share] = ratios.get(share, 0) + 1
    return {
        "worlds": len(results), "ran": len(ran), "errors": errors,
        "best_mode": {"colocated": sum(not s for s in split_best), "split": sum(split_best),
                      "split_prefill_shares": dict(sorted(ratios.items()))},
        "pearl_regret": {"median": round(statistics.median(regrets), 5), "mean": round(statistics.fmean(regrets), 5),
                         "worst": round(max(regrets), 5),
                         "worst_world": max(ran, key=lambda r: r["pearl_regret"])["id"],
                         "within_0.5pct": round(sum(x <= 0.005 + 1e-9 for x in regrets) / len(regrets), 4),
                         "within_2pct": round(sum(x <= 0.02 + 1e-9 for x in regrets) / len(regrets), 4)},
        "loss": loss,
        "separation_auc": dict(sorted(sep.items(), key=lambda kv: -abs(kv[1] - 0.5))),
        "exhaustive": {"worlds": len(ex),
                       "agree": sum(r.get("climb_agrees", True) for r in ex)},
        "cpu_s": round(sum(r.get("cpu_s", 0.0) for r in ran), 1),
    }


# ------------------------------------------------------------------------------ outputs
def top_axes(summary: dict[str, Any]) -> tuple[str, str]:
    ranked = list(summary.get("separation_auc", {}))
    ranked += [a for a in ("batch_per_gpu", "limit") if a not in ranked]
    return ranked[0], ranked[1]


def plot(results: Sequence[dict[str, Any]], summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ran = [r for r in results if "error" not in r]
    ax_x, ax_y = top_axes(summary)
    fig, ax = plt.subplots(figsize=(8, 6))
    for r in ran:
        x, y = _axis(r, ax_x), _axis(r, ax_y)
        if x is None or y is None:
            continue
        best = r["best_static"]
        if best["mode"] == "split":
            q = int(best["allocation"].split("P")[0]) / r["params"]["gpus"]
            color = plt.get_cmap("viridis")(q)
        else:
            color = "tab:red"
        reg = max(r["pearl_regret"], 0.0)
        size = 30 + 4000 * reg
        ax.scatter([x], [y], s=size, c=[color], edgecolors="black" if reg > 0.02 else "none",
                   linewidths=1.5, alpha=0.8, marker="*" if r["params"].get("paper") else "o")
    ax.set_xlabel(ax_x + (" (log)" if ax_x in ("batch_per_gpu", "limit", "gpus", "batch") else ""))
    ax.set_ylabel(ax_y)
    for a, setter in ((ax_x, ax.set_xscale), (ax_y, ax.set_yscale)):
        if a in ("batch_per_gpu", "limit", "gpus", "batch", "observation_tokens", "tool_s"):
            setter("log")
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], marker="o", ls="", color="tab:red", label="colocation best"),
               Line2D([], [], marker="o", ls="", color=plt.get_cmap("viridis")(0.3), label="split best (colour: P share)"),
               Line2D([], [], marker="*", ls="", color="grey", label="the paper's points"),
               Line2D([], [], marker="o", ls="", color="white", markeredgecolor="black", label="PEARL regret > 2 %")]
    ax.legend(handles=handles, loc="best", fontsize=8)
    reg = summary["pearl_regret"]
    ax.set_title(f"{summary['ran']} worlds: best static mode; marker size = PEARL's regret "
                 f"(median {100 * reg['median']:.2f} %, worst {100 * reg['worst']:.2f} %)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(results: Sequence[dict[str, Any]], summary: dict[str, Any], command: str) -> str:
    lines = [f"## Worlds\n\n`{command}`: {summary['worlds']} worlds, {summary['ran']} ran "
             f"({len(summary['errors'])} reported an error), {summary.get('cpu_s', 0):.0f} CPU s.\n"]
    if not summary["ran"]:
        return "\n".join(lines)
    bm = summary["best_mode"]
    reg = summary["pearl_regret"]
    shares = ", ".join(f"{k} ({v})" for k, v in bm["split_prefill_shares"].items()) or "none"
    lines.append(f"Best static mode: colocation in {bm['colocated']} worlds, a split in {bm['split']} "
                 f"(prefill share of the workers, worlds: {shares}). PEARL's regret over the best static "
                 f"configuration: median {100 * reg['median']:+.2f} %, mean {100 * reg['mean']:+.2f} %, worst "
                 f"{100 * reg['worst']:+.2f} % ({reg['worst_world']}); within 0.5 %: "
                 f"{100 * reg['within_0.5pct']:.0f} % of worlds, within 2 %: {100 * reg['within_2pct']:.0f} %.\n")
    lines += ["| policy | mean loss vs best static | worst loss (world) | within 1 % |", "|---|---|---|---|"]
    for name, v in summary["loss"].items():
        lines.append(f"| {name} | {100 * v['mean']:+.2f} % | {100 * v['worst']:+.2f} % ({v['worst_world']}) | "
                     f"{100 * v['within_1pct']:.0f} % |")
    sep = summary.get("separation_auc", {})
    if sep:
        lines.append("\nWhat separates the worlds where a split is best (rank AUC, 0.5 = nothing): "
                     + ", ".join(f"{k} {v:.2f}" for k, v in list(sep.items())[:6]) + ".\n")
    ex = summary["exhaustive"]
    if ex["worlds"]:
        lines.append(f"The static search against every split measured: {ex['agree']} of {ex['worlds']} worlds agree.\n")
    lines += ["\n| world | params | best static | pearl | regret |", "|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['id']} | | error: {r['error']} | | |")
            continue
        p = r["params"]
        brief = (f"{p['model']}, {p['gpus']} x {p['hardware']}, B {p['batch']}, L {p['limit'] // 1024}K"
                 + (f" ({p['paper']})" if p.get("paper") else ""))
        lines.append(f"| {r['id']} | {brief} | {r['best_static']['allocation']} {r['best_static']['makespan_s']:.1f} s | "
                     f"{'/'.join(sorted(set(str(a).split('/')[0] for a in r['systems']['pearl'].get('allocations', []))))} "
                     f"{r['systems']['pearl']['makespan_s']:.1f} s | {100 * r['pearl_regret']:+.2f} % |")
    return "\n".join(lines) + "\n"


def write(out: Path, results: Sequence[dict[str, Any]], summary: dict[str, Any], command: str) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "worlds.json", "md": out / "worlds.md", "png": out / "worlds.png"}
    paths["json"].write_text(json.dumps({"worlds": list(results), "summary": summary, "command": command}, indent=1))
    paths["md"].write_text(markdown(results, summary, command))
    if summary.get("ran"):
        plot(results, summary, paths["png"])
    return paths


# ------------------------------------------------------------------------------ command
def _docs_section(path: Path, section: str) -> None:
    """Replace (or append) the ``## Worlds`` section of ``path`` with ``section``."""
    text = path.read_text() if path.is_file() else "# Experiments\n"
    head, sep, rest = text.partition("\n## Worlds\n")
    tail = ""
    if sep:
        nxt = rest.find("\n## ")
        tail = rest[nxt:] if nxt >= 0 else ""
    path.write_text(head.rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n" + tail)


def worlds_main(args: Any) -> int:
    """``python -m pearl experiments worlds`` (``pearl.sim.cli``): run, summarise, write."""
    import shlex
    import sys

    from pearl.sim.worlds import PAPER_WORLDS, draw_worlds, parse_world

    def say(msg: str) -> None:
        print(msg, file=sys.stderr if args.json else sys.stdout, flush=True)

    for flag, v, lo in (("--worlds", args.worlds, 0), ("--batches", args.batches, 1), ("--top-k", args.top_k, 0),
                        ("--jobs", args.jobs, 1), ("--exhaustive", args.exhaustive, 0)):
        if v < lo:
            print(f"error: {flag} {v}: must be at least {lo}", file=sys.stderr)
            return 2
    worlds = draw_worlds(args.worlds, args.seed)
    if not args.no_paper:
        worlds += [p.model_copy(update={"seed": args.seed}) for p in PAPER_WORLDS]
    results: list[dict[str, Any]] = []
    for spec in args.world:
        try:
            worlds.append(parse_world(spec, args.seed))
        except WorldError as e:  # reported with the others; the sweep goes on
            results.append({"id": f"--world {spec}", "params": {}, "error": str(e)})
    if not worlds and not results:
        print("error: no worlds: give --worlds N, the paper's points or --world", file=sys.stderr)
        return 2
    small = sorted((p for p in worlds if p.gpus <= 16), key=lambda p: p.gpus) + [p for p in worlds if p.gpus > 16]
    exhaustive = {p.id for p in small[: args.exhaustive]}
    command = "python -m pearl experiments worlds " + " ".join(shlex.quote(a) for a in sys.argv[3:])
    say(f"{len(worlds)} worlds, {args.batches} batches each run, {args.jobs} jobs"
        + (f", every split measured in {len(exhaustive)}" if exhaustive else ""))
    t0 = time.perf_counter()
    results += sweep(worlds, args.batches, args.top_k, args.jobs, exhaustive, say)
    summary = summarize(results)
    summary["wall_s"] = round(time.perf_counter() - t0, 1)
    paths = write(Path(args.out), results, summary, command)
    if args.docs and summary.get("ran"):
        import shutil

        section = markdown(results, summary, command)
        if paths["png"].is_file():  # the picture travels with the page (the run's folder is not kept)
            dest = Path(args.docs).parent / "worlds.png"
            if dest.resolve() != paths["png"].resolve():
                shutil.copyfile(paths["png"], dest)
            section = section.replace("\n\n", "\n\n![worlds: the best static mode and PEARL's regret](worlds.png)\n\n", 1)
        _docs_section(Path(args.docs), section)
    if args.json:
        print(json.dumps({"worlds": results, "summary": summary}))
    else:
        reg = summary.get("pearl_regret", {})
        say(f"wrote {paths['json']}, {paths['md']}" + (f", {paths['png']}" if summary.get("ran") else "")
            + (f"; PEARL's regret median {100 * reg['median']:+.2f} %, worst {100 * reg['worst']:+.2f} %"
               if reg else ""))
    return 0
