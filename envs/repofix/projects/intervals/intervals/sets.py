"""Operations on lists of intervals."""

from __future__ import annotations

from intervals.interval import Interval


def merge(intervals: list[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering the same points (overlapping or touching ones merge)."""
    ordered = sorted(intervals, key=lambda iv: (iv.lo, iv.hi))
    out: list[Interval] = []
    for iv in ordered:
        if out and iv.lo <= out[-1].hi:
            out[-1] = Interval(out[-1].lo, max(out[-1].hi, iv.hi))
        else:
            out.append(iv)
    return out


def total_length(intervals: list[Interval]) -> float:
    """Length of the union."""
    return sum(iv.length for iv in merge(intervals))


def gaps(intervals: list[Interval], lo: float, hi: float) -> list[Interval]:
    """The parts of [lo, hi] not covered by ``intervals`` (single points are not reported)."""
    out: list[Interval] = []
    cursor = lo
    for iv in merge(intervals):
        if iv.hi < lo or iv.lo > hi:
            continue
        if iv.lo > cursor:
            out.append(Interval(cursor, iv.lo))
        cursor = max(cursor, iv.hi)
    if cursor < hi:
        out.append(Interval(cursor, hi))
    return out
