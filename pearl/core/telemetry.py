"""What the predictor learns from: one ``TelemetryRecord`` per served request (one turn of one
trajectory), and the serving ``Mode`` it ran in.

The pipeline writes a record when a turn's response is back; the tracker keeps a window of them
and refits the profiles from it (``fitting.fit_hardware`` / ``fitting.fit_workload``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum


class Mode(StrEnum):
    """How the rollout pool serves: every worker prefills and decodes, or a P:D split."""

    COLOCATED = "colocated"
    DISAGGREGATED = "disaggregated"


@dataclass(frozen=True, slots=True)
class TelemetryRecord:
    """One request (one turn of one trajectory) as measured by the engine and the pipeline.

    ``mode`` accepts the enum or its value (``"colocated"`` / ``"disaggregated"``, as JSON
    telemetry and the pipeline carry it) and holds the enum after construction; any other value
    raises ``ValueError``."""

    traj_id: str
    turn: int
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    queue_s: float = 0.0
    prefill_s: float = 0.0
    transfer_s: float = 0.0
    decode_s: float = 0.0
    env_s: float = 0.0
    decode_concurrency: float = 1.0
    mode: Mode | str = Mode.COLOCATED
    worker_id: str = ""
    final: bool = False  # the trajectory ended after this turn
    #: the turn was served by a worker other than the one that served the trajectory's previous
    #: turn (a cost-aware or slack move, an interruption): its prefix cache was elsewhere
    moved: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.mode, Mode):
            object.__setattr__(self, "mode", Mode(self.mode))

    def valid(self) -> bool:
        """Finite, non-negative times and token counts with ``cached <= prompt``."""
        nums = (self.queue_s, self.prefill_s, self.transfer_s, self.decode_s, self.env_s, self.decode_concurrency)
        if any(not math.isfinite(v) or v < 0 for v in nums):
            return False
        return self.prompt_tokens >= 0 and 0 <= self.cached_tokens <= self.prompt_tokens and self.output_tokens >= 0
