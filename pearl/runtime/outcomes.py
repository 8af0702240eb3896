"""What submitting an event answers: its outcome, or the resource it named that does not exist.

Shared by the door every event enters through (``pearl.runtime.door``) and the control plane the
admin API sees (``pearl.runtime.control``, which re-exports both), so neither imports the other
for them.

Public names: ``SubmitResult``, ``UnknownResourceError``.
"""

from __future__ import annotations

from dataclasses import dataclass


class UnknownResourceError(LookupError):
    """A GPU, instance or notice id the controller does not know."""

    def __init__(self, kind: str, ident: str) -> None:
        super().__init__(f"unknown {kind} {ident!r}")
        self.kind = kind
        self.ident = ident


@dataclass(frozen=True, slots=True)
class SubmitResult:
    applied: bool
    duplicate: bool = False
    event_id: str = ""
    detail: str = ""
