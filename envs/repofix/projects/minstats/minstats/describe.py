"""Central tendency and spread."""

from __future__ import annotations

import math


def mean(data: list[float]) -> float:
    if len(data) == 0:
        raise ValueError("mean of no data")
    return sum(data) / len(data)


def median(data: list[float]) -> float:
    if not data:
        raise ValueError("median of no data")
    s = sorted(data)
    n = len(s)
    mid = n // 2
    if n % 2 == 1:
        return s[mid]
    return (s[mid - 1] + s[mid]) / 2


def mode(data: list[float]) -> float:
    """The most frequent value; ties go to the smallest value."""
    if not data:
        raise ValueError("mode of no data")
    counts: dict[float, int] = {}
    for x in data:
        counts[x] = counts.get(x, 0) + 1
    best = max(counts.values())
    return min(x for x, c in counts.items() if c == best)


def variance(data: list[float], ddof: int = 1) -> float:
    """Sum of squared deviations divided by (n - ddof): ddof=1 sample, ddof=0 population."""
    n = len(data)
    if n - ddof < 1:
        raise ValueError(f"variance needs more than {ddof} values")
    m = mean(data)
    return sum((x - m) ** 2 for x in data) / (n - ddof)


def stdev(data: list[float], ddof: int = 1) -> float:
    return math.sqrt(variance(data, ddof))
