"""intervals: closed intervals and interval arithmetic."""

from intervals.interval import Interval
from intervals.sets import gaps, merge, total_length

__all__ = ["Interval", "gaps", "merge", "total_length"]
