"""Order statistics and series helpers."""

from __future__ import annotations


def percentile(data: list[float], p: float) -> float:
    """Linear interpolation between closest ranks: p in [0, 100]."""
    if not data:
        raise ValueError("percentile of no data")
    if p < 0 or p > 100:
        raise ValueError(f"p={p} is outside [0, 100]")
    s = sorted(data)
    rank = (len(s) - 1) * p / 100
    lo = int(rank)
    hi = min(lo + 1, len(s) - 1)
    frac = rank - lo
    return s[lo] + (s[hi] - s[lo]) * frac


def clamp(x: float, lo: float, hi: float) -> float:
    if lo > hi:
        raise ValueError("lo > hi")
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def moving_average(data: list[float], window: int) -> list[float]:
    """Means of each run of ``window`` consecutive values (len(data) - window + 1 of them)."""
    if window < 1:
        raise ValueError("window must be at least 1")
    out: list[float] = []
    total = sum(data[:window])
    if len(data) >= window:
        out.append(total / window)
    for i in range(window, len(data)):
        total += data[i] - data[i - window]
        out.append(total / window)
    return out


def histogram(data: list[float], bins: int, lo: float, hi: float) -> list[int]:
    """Counts in ``bins`` equal-width bins over [lo, hi]; hi falls in the last bin, outside values are dropped."""
    if bins < 1:
        raise ValueError("bins must be at least 1")
    if lo >= hi:
        raise ValueError("lo must be below hi")
    counts = [0] * bins
    width = (hi - lo) / bins
    for x in data:
        if x < lo or x > hi:
            continue
        i = int((x - lo) / width)
        if i == bins:
            i = bins - 1
        counts[i] += 1
    return counts
