"""The one inference-engine contract the runtime uses (emulated, vLLM on CPU, SGLang on GPUs).

The runtime never talks HTTP or spawns processes itself: it holds an ``InferenceEngine`` and asks
it to launch / stop servers bound to GPUs (or CPU cores), to generate from token ids (colocated, or
prefill -> KV transfer -> decode across two servers), to abort, pause and resume, to load weight
snapshots, and to release / resume memory on borrowed training GPUs.

Request life cycle seen through this contract::

    generate(...) / generate_pd(...)
        -> GenerateResult(finish_reason=stop|length)         normal completion
        -> GenerateResult(finish_reason=abort, partial out)  aborted (preemption, role change,
                                                             weight update): the caller keeps the
                                                             partial tokens+logprobs and resumes
                                                             elsewhere with prompt + partial output
        -> raises EngineDeadError                            the server died; partial output that
                                                             was streamed is in ``err.partial``
        -> raises KVTransferError                            prefill -> decode hand-off failed

Errors follow a small hierarchy: ``EngineError`` (recoverable, the request may be retried
elsewhere), ``EngineDeadError`` (the server is gone; the runtime must remove it),
``KVTransferError``, ``RequestRejectedError`` (the server refused the request itself: sending it
again elsewhere is pointless), ``WeightUpdateError`` (a refused or failed weight update, with the
server's message), ``EngineStartError`` (launch or readiness failed; names the worker, exit code
and the tail of its log). A server that breaks its own protocol raises an ``EngineProtocolError``:
``ResponseShapeError`` (a reply of a shape the adapter does not know), ``StreamCutError`` (a
stream that ends without its end marker while the server lives), ``ResponseTooLargeError`` (one
event past the client's line limit), ``WeightVersionError`` (the version a load promised never
shows) and ``RoleSwitchError`` (an in-place role switch the server refused). Each carries the
partial output received so far (``partial``) and the adapter has aborted the remote request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

from pearl.core.state import Role


class FinishReason(StrEnum):
    STOP = "stop"  # a stop token / EOS
    LENGTH = "length"  # max_new_tokens reached
    ABORT = "abort"  # aborted: the output is partial and the request can be resumed


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """Where and how to run one worker's server.

    ``devices`` are GPU ids on GPU hosts, or CPU core ids for the CPU engine. ``port`` 0 lets the
    engine pick a free port. ``weights`` is the snapshot folder to load at start.
    """

    worker_id: str
    devices: tuple[str, ...]
    role: Role
    weights: str
    weight_version: int = 0
    port: int = 0
    host: str = "127.0.0.1"
    extra: dict[str, str] = field(default_factory=dict)


class PauseMode(StrEnum):
    """What ``pause`` does to the requests in flight (one vocabulary; each adapter maps it to its
    engine's own word: vLLM ``keep|abort|wait``, SGLang ``in_place|abort|retract``)."""

    KEEP = "keep"  # freeze them where they are; ``resume`` continues them (SGLang ``in_place``)
    ABORT = "abort"  # end them now: partial outputs return with ``finish_reason=abort``
    RETRACT = "retract"  # put them back in the queue, KV freed; ``resume`` re-prefills them
    WAIT = "wait"  # admit nothing new and let them finish


@dataclass(frozen=True, slots=True)
class EngineCapabilities:
    """What an engine can do, declared by the engine (``InferenceEngine.capabilities``) and read by
    the runtime instead of probing for methods or reading names.

    ``split_pd``: the two halves of a PD request run as separate calls (``pd_prefill`` returns a
    handle, ``pd_decode`` takes it), so a pair may span two nodes. ``in_place_role_switch``:
    ``set_role`` flips prefill <-> decode without a relaunch (the weights and the process stay).
    ``weight_broadcast``: ``broadcast_weights`` / a trainer broadcast group can update the weights
    without a snapshot on disk. ``pause_modes``: the ``PauseMode`` values ``pause`` accepts.
    """

    split_pd: bool = False
    in_place_role_switch: bool = False
    weight_broadcast: bool = False
    pause_modes: frozenset[PauseMode] = frozenset({PauseMode.KEEP})

    def check_pause(self, worker_id: str, mode: PauseMode) -> PauseMode:
        """``mode`` as a ``PauseMode`` if declared; else ``EngineError`` naming the declared ones."""
        m = PauseMode(mode)
        if m not in self.pause_modes:
            raise EngineError(worker_id, f"pause mode {m.value!r} is not supported by this engine "
                                         f"(it declares {sorted(p.value for p in self.pause_modes)})")
        return m


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None


#: the characters ``GenerateRequest.rid`` puts between its fields (so none may be in a conversation id)
_WIRE_SEPARATORS = frozenset("/#")


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    """One generation call. Its identity is three fields: ``conversation`` (the trajectory id; the
    prefix-cache key), ``turn`` (the turn of that conversation) and ``attempt`` (0 for the first
    call of a turn, ``k`` for its ``k``-th resumption after an abort). ``input_ids`` is the full
    prompt (for a resumed request: the original prompt followed by the partial output already
    generated).

    ``rid`` is the wire id an engine's HTTP API is given, *formatted* from the three fields
    (``<conversation>/<turn>``, then ``#<attempt>`` for ``attempt > 0``): unique per attempt.
    Nothing reads identity back out of it; code that needs the conversation or turn reads the field.
    """

    conversation: str
    input_ids: tuple[int, ...]
    sampling: SamplingParams
    return_logprobs: bool = True
    turn: int = 0
    attempt: int = 0

    def __post_init__(self) -> None:
        if not self.conversation or _WIRE_SEPARATORS & set(self.conversation):
            raise ValueError(f"conversation {self.conversation!r}: must be non-empty without '/' or '#' "
                             "(the wire id is formatted from it)")
        if self.turn < 0 or self.attempt < 0:
            raise ValueError(f"conversation {self.conversation!r}: turn={self.turn}, attempt={self.attempt} "
                             "must both be >= 0")

    @property
    def rid(self) -> str:
        base = f"{self.conversation}/{self.turn}"
        return f"{base}#{self.attempt}" if self.attempt else base


@dataclass(frozen=True, slots=True)
class RequestTimings:
    """Per-request telemetry (seconds) reported by the engine; the Runtime Tracker fits on it."""

    queue_s: float = 0.0
    prefill_s: float = 0.0
    transfer_s: float = 0.0
    decode_s: float = 0.0
    decode_concurrency: float = 1.0  # mean running requests on the decode worker while decoding


@dataclass(frozen=True, slots=True)
class GenerateResult:
    rid: str
    output_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    weight_version: int
    prompt_tokens: int
    cached_tokens: int = 0
    timings: RequestTimings = field(default_factory=RequestTimings)
    worker_id: str = ""
    decode_worker_id: str = ""


class EngineError(RuntimeError):
    """A recoverable engine failure for one request or call: retry elsewhere."""

    def __init__(self, worker_id: str, message: str) -> None:
        super().__init__(f"worker {worker_id}: {message}")
        self.worker_id = worker_id


class EngineDeadError(EngineError):
    """The server process is gone. ``partial`` holds whatever output was received before it died."""

    def __init__(
        self,
        worker_id: str,
        message: str,
        exit_code: int | None = None,
        log_tail: str = "",
        partial: GenerateResult | None = None,
    ) -> None:
        detail = f"{message} (exit code {exit_code})" if exit_code is not None else message
        if log_tail:
            detail += f"; last log lines:\n{log_tail}"
        super().__init__(worker_id, detail)
        self.exit_code = exit_code
        self.log_tail = log_tail
        self.partial = partial


class EngineStartError(EngineDeadError):
    """Launch or readiness failed (bad weights, port in use, out of memory, timeout)."""


class KVTransferError(EngineError):
    """The prefill -> decode KV hand-off failed; ``partial`` (if any) is kept by the caller."""

    def __init__(self, worker_id: str, message: str, partial: GenerateResult | None = None) -> None:
        super().__init__(worker_id, message)
        self.partial = partial


class EngineProtocolError(EngineError):
    """The server answered outside its protocol; ``partial`` (if any) is the output so far."""

    def __init__(self, worker_id: str, message: str, partial: GenerateResult | None = None) -> None:
        super().__init__(worker_id, message)
        self.partial = partial


class ResponseShapeError(EngineProtocolError):
    """A reply or stream event of a shape the adapter does not know."""


class StreamCutError(EngineProtocolError):
    """A stream ended without its end marker (``[DONE]``) while the server is still alive."""


class ResponseTooLargeError(EngineProtocolError):
    """One stream event exceeded the client's line limit."""


class WeightVersionError(EngineProtocolError):
    """The weight version a load or update promised does not show on the server."""


class RequestRejectedError(EngineError):
    """The server refused the request itself (a 4xx ``status_code``: too long for its context or
    KV pool, invalid): sent anywhere again it fails the same way, so the caller fails the turn.
    Whatever the refusal carried as output is not the model's and is dropped."""

    def __init__(self, worker_id: str, message: str, status_code: int) -> None:
        super().__init__(worker_id, message)
        self.status_code = status_code


class WeightUpdateError(EngineError):
    """The server refused or failed a weight update; the message is the server's own."""


class RoleSwitchError(EngineProtocolError):
    """The server refused an in-place role switch (``safe_to_restore``: it still serves its old role)."""

    def __init__(self, worker_id: str, message: str, safe_to_restore: bool = True) -> None:
        super().__init__(worker_id, message)
        self.safe_to_restore = safe_to_restore


@runtime_checkable
class InferenceEngine(Protocol):
    """What every data plane implements. All methods are coroutines and cancellation-safe: a
    cancelled ``generate`` aborts the remote request before re-raising ``CancelledError``."""

    async def launch(self, spec: ServerSpec) -> None:
        """Start the worker's server and return once it is ready (raises ``EngineStartError``)."""
        ...

    async def stop(self, worker_id: str) -> None:
        """Stop the server (idempotent). In-flight requests end with ``finish_reason=abort``."""
        ...

    async def healthy(self, worker_id: str) -> bool: ...

    async def generate(self, worker_id: str, req: GenerateRequest) -> GenerateResult:
        """Colocated generation on one worker."""
        ...

    async def generate_pd(self, prefill_id: str, decode_id: str, req: GenerateRequest) -> GenerateResult:
        """Disaggregated generation: prefill on ``prefill_id``, KV transfer, decode on ``decode_id``."""
        ...

    async def abort(self, worker_id: str, rid: str | None = None) -> None:
        """Abort one request (``rid``) or every request on the worker (None)."""
        ...

    @property
    def capabilities(self) -> EngineCapabilities:
        """What this engine can do (a wrapper declares what it forwards)."""
        ...

    async def pause(self, worker_id: str, mode: PauseMode = PauseMode.KEEP) -> None:
        """Pause generation on the worker; ``mode`` must be one of ``capabilities.pause_modes``."""
        ...

    async def resume(self, worker_id: str) -> None: ...

    async def load_weights(self, worker_id: str, path: str, version: int) -> None:
        """Load a weight snapshot folder; afterwards the worker reports ``version``."""
        ...

    async def weight_version(self, worker_id: str) -> int: ...

    async def release_memory(self, worker_id: str) -> None:
        """Free device memory (weights + KV) but keep the process: a borrowed GPU goes back."""
        ...

    async def resume_memory(self, worker_id: str) -> None: ...

    async def set_role(self, worker_id: str, role: Role) -> None:
        """Change PD role (relaunch, or in place where the engine supports it)."""
        ...

    async def close(self) -> None:
        """Stop every server this engine started."""
        ...
