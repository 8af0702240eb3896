"""minstats: descriptive statistics."""

from minstats.describe import mean, median, mode, stdev, variance
from minstats.series import clamp, histogram, moving_average, percentile

__all__ = ["clamp", "histogram", "mean", "median", "mode", "moving_average", "percentile", "stdev", "variance"]
