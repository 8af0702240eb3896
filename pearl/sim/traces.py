"""Availability traces: read, cut into segments, map to GPUs, and turn into elastic events.

Formats read natively (``load_trace``):

- spot-traces JSON (the "Can't Be Late", NSDI'24 repository; not shipped here, see docs/simulation.md)::

      {"metadata": {"gap_seconds": G}, "data": [count, count, ...]}

  ``data[i]`` is the number of cloud instances available during ``[i*G, (i+1)*G)``.
- CSV with a header ``time_s,available``: one row per change point, strictly increasing times,
  first row at time 0. Converted to ticks of the smallest time gap found (the last row lasts one
  gap).
- Bamboo event log CSV (NSDI'23, uclasystem/bamboo; ``configs/traces/bamboo-g4dn/``, shipped with
  its MIT licence), no header, one row per node event::

      time_ms,add|remove,node

  Times are integer milliseconds, non-decreasing; a node is added before it is removed and not
  added twice while up. Converted to instance counts at a tick of ``g`` = the greatest common
  divisor of the event times (60 s for the shipped trace): ``counts[i]`` = nodes up after every
  event with ``time_ms <= i * g``; tick 0 is time 0 (before the first event: 0 nodes); the state
  after the last event lasts one tick.

A broken file raises ``TraceError`` naming the file and the line (CSV) or field (JSON) at fault.

Public names: ``Trace``, ``TraceError``, ``load_trace``, ``SHIPPED_TRACE``, ``SegmentPick``,
``pick_segments``, ``match_segments``, ``GpuTimeline``, ``TimedEvent``, ``gpu_timeline``, ``trace_events``, ``DEFAULT_NOTICE_S``.

Life cycle: ``load_trace`` -> ``Trace.segment(start_s, duration_s)`` (or ``pick_segments``) ->
``gpu_timeline(trace, cluster)`` (instances -> preemptible GPUs) -> ``trace_events(timeline)``
(the GpusGranted / ReclaimNotice events a replayer submits on the virtual clock).

Modelling choices the paper leaves open (made here):

- GPUs = min(instances * ``gpus_per_instance``, ``max_preemptible_gpus``), rounded down to whole
  instances. GPU ids are stable slots ``spot-<i>``; instance ``i-<k>`` owns slots
  ``k*g .. k*g+g-1``. A drop reclaims the highest-numbered instances first (LIFO), so the GPUs
  that stay are the ones that have been up longest.
- A drop at time ``t`` is announced ``notice_s`` earlier (AWS: a 2-minute interruption notice), i.e.
  a ``ReclaimNotice`` at ``max(t - notice_s, previous change)`` with ``deadline = t``. The notice
  is never issued before the previous change point (the provider cannot know earlier).
- Segment picker: sliding windows of ``hours`` aligned to ticks, taken in this order:
  ``abundant`` = highest mean GPUs (ties: fewest changes); ``scarce`` = lowest mean among windows
  whose mean is at least a quarter of ``max_preemptible_gpus`` (an all-zero window tests nothing
  elastic); ``volatile`` = most change points (ties: largest total |delta|) among windows with at
  least the scarce one's mean, so scarce never has more GPUs than volatile. The three are
  disjoint. A trace whose windows are all alike (one mean, one change count) is a ``TraceError``
  saying so, as is one whose free windows all hold fewer GPUs than the scarce one.
- Matched picker (``match_segments``): for each label a target mean of preemptible GPUs, the
  window whose mean is nearest the target (ties: most change points, then earliest); disjoint,
  taken in the order given. ``experiments fig5-paper`` uses it to match the paper's segments:
  the paper sized ROLL-Large to each segment's GPUs (14 / 10 / 12 rollout GPUs, Sec. 6.1), so
  with 4 reserved GPUs its segments averaged 10 / 6 / 8 preemptible GPUs.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path

from pearl.config import CONFIG_DIR, ClusterSpec, RunConfig
from pearl.core.events import GpusGranted, GrantedGpu, ReclaimNotice

#: AWS spot interruption notice, seconds.
DEFAULT_NOTICE_S = 120.0
#: The real availability trace shipped in the repository (Bamboo's g4dn spot trace, MIT licence
#: beside it): the default of ``experiments`` and ``make simulate``, and the tests' real trace.
SHIPPED_TRACE = CONFIG_DIR / "traces" / "bamboo-g4dn" / "g4dn-trace.csv"
#: The most ticks an event log may expand to (a finer tick than this is refused, not allocated).
MAX_EVENT_LOG_TICKS = 1_000_000


class TraceError(ValueError):
    """A trace file could not be read; the message names the file and the line or field."""


@dataclass(frozen=True)
class Trace:
    """Instance counts at a fixed tick: ``counts[i]`` holds during ``[i*gap_s, (i+1)*gap_s)``."""

    source: str
    gap_s: float
    counts: tuple[int, ...]
    start_s: float = 0.0  # offset of counts[0] in the original file (for reports)

    @property
    def duration_s(self) -> float:
        return self.gap_s * len(self.counts)

    def segment(self, start_s: float, duration_s: float) -> Trace:
        """The ticks covering ``[start_s, start_s + duration_s)`` (relative to this trace)."""
        if start_s < 0 or duration_s <= 0:
            raise TraceError(f"{self.source}: segment start={start_s} s, duration={duration_s} s must be >= 0 / > 0")
        i0 = int(start_s // self.gap_s)
        n = max(1, math.ceil(duration_s / self.gap_s))
        if i0 + n > len(self.counts):
            raise TraceError(
                f"{self.source}: segment [{start_s / 3600:.2f} h, {(start_s + duration_s) / 3600:.2f} h) "
                f"runs past the trace end ({self.duration_s / 3600:.2f} h); choose an earlier --start-hour"
            )
        return Trace(self.source, self.gap_s, self.counts[i0 : i0 + n], self.start_s + i0 * self.gap_s)


def _load_json(path: Path, text: str) -> Trace:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise TraceError(f"trace {path}: line {e.lineno}, column {e.colno}: not valid JSON ({e.msg})") from None
    if not isinstance(obj, dict):
        raise TraceError(f"trace {path}: top level must be an object with 'metadata' and 'data'")
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or "gap_seconds" not in meta:
        raise TraceError(f"trace {path}: field 'metadata.gap_seconds' is missing")
    gap = meta["gap_seconds"]
    if isinstance(gap, bool) or not isinstance(gap, int | float) or not 0 < gap < math.inf:
        raise TraceError(f"trace {path}: field 'metadata.gap_seconds' must be a positive finite number, got {gap!r}")
    data = obj.get("data")
    if not isinstance(data, list) or not data:
        raise TraceError(f"trace {path}: field 'data' must be a non-empty list of instance counts")
    counts = []
    for i, c in enumerate(data):
        if isinstance(c, bool) or not isinstance(c, int | float) or not 0 <= c < math.inf or c != int(c):
            raise TraceError(f"trace {path}: field 'data[{i}]' must be a non-negative integer, got {c!r}")
        counts.append(int(c))
    if not math.isfinite(float(gap) * len(counts)):
        raise TraceError(f"trace {path}: field 'metadata.gap_seconds'={gap!r} times {len(counts)} ticks is not a finite duration")
    return Trace(str(path), float(gap), tuple(counts))


def _load_csv(path: Path, text: str) -> Trace:
    rows = list(csv.reader(text.splitlines()))
    if not rows or [h.strip() for h in rows[0]] != ["time_s", "available"]:
        raise TraceError(f"trace {path}: line 1: header must be 'time_s,available'")
    points: list[tuple[float, int]] = []
    for lineno, row in enumerate(rows[1:], start=2):
        if not row or all(not x.strip() for x in row):
            continue
        if len(row) != 2:
            raise TraceError(f"trace {path}: line {lineno}: expected 2 fields 'time_s,available', got {len(row)}")
        try:
            t = float(row[0])
        except ValueError:
            raise TraceError(f"trace {path}: line {lineno}: field 'time_s' is not a number: {row[0]!r}") from None
        try:
            n = int(row[1])
        except ValueError:
            raise TraceError(f"trace {path}: line {lineno}: field 'available' is not an integer: {row[1]!r}") from None
        if not math.isfinite(t) or t < 0:
            raise TraceError(f"trace {path}: line {lineno}: field 'time_s' must be finite and >= 0, got {t}")
        if n < 0:
            raise TraceError(f"trace {path}: line {lineno}: field 'available' must be >= 0, got {n}")
        if points and t <= points[-1][0]:
            raise TraceError(
                f"trace {path}: line {lineno}: field 'time_s'={t} does not increase (previous {points[-1][0]})"
            )
        if not points and t != 0:
            raise TraceError(f"trace {path}: line {lineno}: the first row must be at time_s=0, got {t}")
        points.append((t, n))
    if not points:
        raise TraceError(f"trace {path}: no data rows after the header")
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(points)]
    gap = min(gaps) if gaps else 300.0
    counts: list[int] = []
    for j, (t, n) in enumerate(points):
        end = points[j + 1][0] if j + 1 < len(points) else t + gap
        counts.extend([n] * max(1, round((end - t) / gap)))
    return Trace(str(path), gap, tuple(counts))


def _is_event_log(text: str) -> bool:
    """First row ``<int>,add|remove,<node>``: a Bamboo event log (else the change-point CSV)."""
    first = next((ln for ln in text.splitlines() if ln.strip()), "")
    fields = [f.strip() for f in first.split(",")]
    return len(fields) == 3 and fields[1] in ("add", "remove")


def _load_event_log(path: Path, text: str) -> Trace:
    events: list[tuple[int, bool, str]] = []  # (time_ms, add?, node)
    for lineno, row in enumerate(csv.reader(text.splitlines()), start=1):
        if not row or all(not x.strip() for x in row):
            continue
        if len(row) != 3:
            raise TraceError(f"trace {path}: line {lineno}: expected 3 fields 'time_ms,add|remove,node', got {len(row)}")
        t_txt, action, node = (x.strip() for x in row)
        try:
            t = int(t_txt)
        except ValueError:
            raise TraceError(f"trace {path}: line {lineno}: field 'time_ms' is not an integer: {t_txt!r}") from None
        if t < 0:
            raise TraceError(f"trace {path}: line {lineno}: field 'time_ms' must be >= 0, got {t}")
        if events and t < events[-1][0]:
            raise TraceError(f"trace {path}: line {lineno}: field 'time_ms'={t} goes back in time "
                             f"(previous {events[-1][0]})")
        if action not in ("add", "remove"):
            raise TraceError(f"trace {path}: line {lineno}: field 'action' must be 'add' or 'remove', got {action!r}")
        if not node:
            raise TraceError(f"trace {path}: line {lineno}: field 'node' is empty")
        events.append((t, action == "add", node))
    if not events:
        raise TraceError(f"trace {path}: no events")
    gap_ms = math.gcd(*(t for t, _a, _n in events)) or 1000
    n_ticks = events[-1][0] // gap_ms + 1
    if n_ticks > MAX_EVENT_LOG_TICKS:
        raise TraceError(f"trace {path}: event times share a tick of {gap_ms} ms, which makes {n_ticks} ticks "
                         f"(more than {MAX_EVENT_LOG_TICKS}); round the times to a coarser tick")
    up: set[str] = set()
    counts: list[int] = []
    j = 0
    for i in range(n_ticks):
        while j < len(events) and events[j][0] <= i * gap_ms:
            t, add, node = events[j]
            if add and node in up:
                raise TraceError(f"trace {path}: event {j + 1} (time_ms={t}): node {node!r} added while up")
            if not add and node not in up:
                raise TraceError(f"trace {path}: event {j + 1} (time_ms={t}): node {node!r} removed while not up")
            (up.add if add else up.discard)(node)
            j += 1
        counts.append(len(up))
    return Trace(str(path), gap_ms / 1000.0, tuple(counts))


def load_trace(path: str | Path) -> Trace:
    """Read a spot-traces JSON, a ``time_s,available`` CSV or a Bamboo ``time_ms,add|remove,node``
    event log (JSON by extension or a leading ``{``; an event log by its first row; else the CSV)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise TraceError(f"trace {p}: cannot read: {e.strerror}") from None
    if p.suffix.lower() == ".csv" or (p.suffix.lower() != ".json" and not text.lstrip().startswith("{")):
        return _load_event_log(p, text) if _is_event_log(text) else _load_csv(p, text)
    return _load_json(p, text)


# ------------------------------------------------------------------------------ GPU mapping
@dataclass(frozen=True)
class GpuTimeline:
    """Preemptible GPUs available per tick (after instance mapping and clipping)."""

    gap_s: float
    gpus: tuple[int, ...]
    gpus_per_instance: int
    source: str = ""
    start_s: float = 0.0

    @property
    def duration_s(self) -> float:
        return self.gap_s * len(self.gpus)

    def at(self, t: float) -> int:
        i = min(len(self.gpus) - 1, max(0, int(t // self.gap_s)))
        return self.gpus[i]

    @property
    def mean(self) -> float:
        return sum(self.gpus) / len(self.gpus)

    @property
    def n_changes(self) -> int:
        return sum(1 for a, b in zip(self.gpus, self.gpus[1:], strict=False) if a != b)


def gpu_timeline(trace: Trace, cluster: ClusterSpec) -> GpuTimeline:
    """Instances -> GPUs: ``min(n, floor(max_preemptible / g)) * g`` with ``g = gpus_per_instance``."""
    g = cluster.gpus_per_instance
    cap = cluster.max_preemptible_gpus // g
    return GpuTimeline(trace.gap_s, tuple(min(n, cap) * g for n in trace.counts), g, trace.source, trace.start_s)


@dataclass(frozen=True)
class TimedEvent:
    at_s: float
    event: GpusGranted | ReclaimNotice


def gpu_id(slot: int) -> str:
    return f"spot-{slot:02d}"


def trace_events(tl: GpuTimeline, notice_s: float = DEFAULT_NOTICE_S, node_prefix: str = "spot") -> list[TimedEvent]:
    """GpusGranted on rises, ReclaimNotice (``deadline`` = the drop time) on drops; sorted by time.

    Each instance is its own node (``<node_prefix>-node-<k>``), as for single-GPU spot instances.
    """
    g = tl.gpus_per_instance
    out: list[TimedEvent] = []
    prev_n = 0
    prev_change = 0.0
    for i, n in enumerate(tl.gpus):
        t = i * tl.gap_s
        if n > prev_n:
            k0, k1 = prev_n // g, n // g
            gpus = tuple(
                GrantedGpu(gpu_id(k * g + j), node=f"{node_prefix}-node-{k}", instance_id=f"i-{k}")
                for k in range(k0, k1)
                for j in range(g)
            )
            out.append(TimedEvent(t, GpusGranted(gpus, event_id=f"grant-{i}")))
            prev_change = t
        elif n < prev_n:
            ids = tuple(gpu_id(s) for s in range(n, prev_n))
            at = max(prev_change, t - notice_s)
            out.append(TimedEvent(at, ReclaimNotice(ids, deadline=t, notice_id=f"notice-{i}", event_id=f"reclaim-{i}")))
            prev_change = t
        prev_n = n
    out.sort(key=lambda e: e.at_s)
    return out


# ------------------------------------------------------------------------------ picker
@dataclass(frozen=True)
class SegmentPick:
    label: str  # abundant | scarce | volatile (pick_segments), or the caller's (match_segments)
    start_hour: float
    hours: float
    mean_gpus: float
    n_changes: int

    def to_dict(self) -> dict[str, object]:
        return {
            "label": self.label,
            "start_hour": self.start_hour,
            "hours": self.hours,
            "mean_gpus": round(self.mean_gpus, 3),
            "n_changes": self.n_changes,
        }


def _windows(trace: Trace, cluster: ClusterSpec, hours: float) -> tuple[GpuTimeline, int, list[tuple[int, float, int, int]]]:
    """Every tick-aligned window of ``hours``: (first tick, mean GPUs, change points, sum |delta|)."""
    tl = gpu_timeline(trace, cluster)
    n = max(1, math.ceil(hours * 3600 / tl.gap_s))
    if n > len(tl.gpus):
        raise TraceError(f"{trace.source}: trace is {tl.duration_s / 3600:.2f} h, shorter than {hours} h")
    stats = []
    for i in range(len(tl.gpus) - n + 1):
        w = tl.gpus[i : i + n]
        changes = sum(1 for a, b in itertools.pairwise(w) if a != b)
        delta = sum(abs(a - b) for a, b in itertools.pairwise(w))
        stats.append((i, sum(w) / n, changes, delta))
    return tl, n, stats


def match_segments(trace: Trace, cluster: ClusterSpec, targets: dict[str, float],
                   hours: float = 2.0) -> dict[str, SegmentPick]:
    """Disjoint windows of ``hours``, one per ``label -> target mean preemptible GPUs``: the
    window whose mean is nearest the target (ties: most change points, then earliest), taken in
    the order of ``targets``. A target outside ``[0, max_preemptible_gpus]`` is an error."""
    for label, m in targets.items():
        if not 0 <= m <= cluster.max_preemptible_gpus:
            raise TraceError(f"{trace.source}: segment {label!r} asks for a mean of {m} preemptible GPUs; "
                             f"the cluster has 0..{cluster.max_preemptible_gpus}")
    tl, n, stats = _windows(trace, cluster, hours)
    taken: list[int] = []
    picks: dict[str, SegmentPick] = {}
    for label, m in targets.items():
        cands = [s for s in stats if all(abs(s[0] - j) >= n for j in taken)]
        if not cands:
            raise TraceError(f"{trace.source}: no {hours} h window left for segment {label!r} "
                             f"({len(taken)} taken; the trace is {tl.duration_s / 3600:.1f} h)")
        best = min(cands, key=lambda s: (abs(s[1] - m), -s[2], s[0]))
        taken.append(best[0])
        picks[label] = SegmentPick(label, best[0] * tl.gap_s / 3600, n * tl.gap_s / 3600, best[1], best[2])
    return picks


def pick_segments(trace: Trace, cluster: ClusterSpec, hours: float = 2.0) -> dict[str, SegmentPick]:
    """Disjoint abundant / volatile / scarce windows of ``hours`` (rules in the module docstring)."""
    tl, n, stats = _windows(trace, cluster, hours)
    kinds = {(round(st[1], 9), st[2]) for st in stats}
    if len(kinds) == 1:
        mean, changes = next(iter(kinds))
        raise TraceError(f"{trace.source}: every {hours} h window is alike ({mean:g} preemptible GPUs on average, "
                         f"{changes} changes): there is no abundant, volatile or scarce segment to tell apart; "
                         "replay a window by its start (--start-hour)")
    taken: list[int] = []

    def free(i: int) -> bool:
        return all(abs(i - j) >= n for j in taken)

    picks: dict[str, SegmentPick] = {}

    def take(label: str, key, pool) -> None:  # type: ignore[no-untyped-def]
        cands = [s for s in pool if free(s[0])]
        if not cands:
            return
        best = min(cands, key=key)
        taken.append(best[0])
        picks[label] = SegmentPick(label, best[0] * tl.gap_s / 3600, n * tl.gap_s / 3600, best[1], best[2])

    take("abundant", lambda s: (-s[1], s[2], s[0]), stats)
    floor = cluster.max_preemptible_gpus / 4
    take("scarce", lambda s: (s[1], -s[2], s[0]), [s for s in stats if s[1] >= floor] or stats)
    low = picks["scarce"].mean_gpus if "scarce" in picks else -math.inf
    pool = [s for s in stats if s[1] >= low and free(s[0])]
    if not pool and any(free(s[0]) for s in stats):
        raise TraceError(f"{trace.source}: every free {hours} h window has fewer preemptible GPUs than the scarce "
                         f"segment's {low:.2f}: no volatile segment at least as provisioned")
    take("volatile", lambda s: (-s[2], -s[3], s[0]), pool)
    return {k: picks[k] for k in ("abundant", "volatile", "scarce") if k in picks}


#: The paper's ROLL-Large pool per segment (Sec. 6.1: "fixed rollout pools of 14, 10, or 12 GPUs"),
#: sized to each segment's GPUs: ``fig5-paper`` picks segments whose mean preemptible GPUs are
#: these minus the reserved ones.
PAPER_ROLL_LARGE = (14, 10, 12)


def fig5_segments(tr: Trace, cfg: RunConfig, hours: float, segments: str) -> dict[str, SegmentPick]:
    """``picker``: abundant / volatile / scarce (``pick_segments``); ``paper``: segments whose
    mean preemptible GPUs match the paper's ROLL-Large pools (``PAPER_ROLL_LARGE`` minus
    ``cluster.reserved_gpus``), labelled ``like-<pool>``."""
    if segments == "picker":
        picks = pick_segments(tr, cfg.cluster, hours)
        return {k: picks[k] for k in ("abundant", "volatile", "scarce")}
    if segments == "paper":
        targets = {f"like-{g}": float(g - cfg.cluster.reserved_gpus) for g in PAPER_ROLL_LARGE}
        return match_segments(tr, cfg.cluster, targets, hours)
    raise ValueError(f"fig5 segments must be 'picker' or 'paper', not {segments!r}")
