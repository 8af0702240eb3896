"""Fault injection at the engine boundary: ``ChaosEngine`` wraps any ``InferenceEngine``.

The runtime talks to the data plane only through ``InferenceEngine``, so every fault a real
cluster produces at that boundary can be injected here without touching the runtime: the wrapper
delegates each call to the real (emulated) engine and, when a fault is *armed*, changes what the
runtime sees:

=====================  ==========================================================================
fault                  what the runtime sees
=====================  ==========================================================================
``launch_failure``     the next ``launch`` raises ``EngineStartError`` after its preparation time
                       (a worker that fails to initialize: its expansion group must be cancelled)
``engine_crash``       ``crash(worker)``: the server dies; its in-flight calls raise
                       ``EngineDeadError`` carrying the partial output produced so far; every
                       later call raises ``EngineDeadError``; ``healthy`` is False
``kv_transfer``        the next ``generate_pd`` raises ``KVTransferError`` (decode side refused the
                       KV hand-off; nothing was generated)
``weight_load``        the next in-place ``load_weights`` raises ``EngineError``
``slow_drain``         the next ``release_memory`` takes ``extra_s`` longer (a borrowed GPU slow to
                       drain: the mandatory return is late)
=====================  ==========================================================================

Phase hooks: ``on_call(kind, worker_id)`` is called at the start of ``launch``,
``load_weights``, ``release_memory``, ``resume_memory`` and ``generate*`` so the chaos driver can
inject a reclaim *during* an expansion's initialization, a weight sync, a return or a borrow.

Observation for the invariant checker: every result the runtime received is logged per
conversation (``Attempt``), with the exact ``input_ids`` length and output tokens; the set of
devices held by live workers is tracked (``devices``) so a GPU bound to two live servers is seen
at the boundary, not only in the state table.

Life cycle: built around the engine by the chaos runner; ``close`` closes the inner engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pearl.core.state import Role
from pearl.engines.base import (
    EngineCapabilities,
    EngineDeadError,
    EngineError,
    EngineStartError,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    InferenceEngine,
    KVTransferError,
    PauseMode,
    ServerSpec,
)


@dataclass(frozen=True, slots=True)
class Attempt:
    """One generation attempt as the runtime received it (``raised``: the error class name, if any)."""

    rid: str
    input_len: int
    output_ids: tuple[int, ...]
    finish: str
    worker: str
    raised: str = ""
    returned_tokens: bool = True  # False: an error without partial (the tokens did not reach the runtime)


@dataclass
class Armed:
    launch_failure: int = 0
    kv_transfer: int = 0
    weight_load: int = 0
    slow_drain: list[float] = field(default_factory=list)

    def disarm(self) -> None:
        """Nothing armed any more (faults already injected stay injected)."""
        self.launch_failure = self.kv_transfer = self.weight_load = 0
        self.slow_drain.clear()


class ChaosEngine:
    """An ``InferenceEngine`` that delegates to ``inner`` and injects the armed faults."""

    def __init__(self, inner: InferenceEngine, armed: Armed | None = None,
                 on_call: Callable[[str, str], None] | None = None) -> None:
        """``armed``: the faults to inject (the driver arms them as it goes); ``on_call``: the phase
        hook (module docstring)."""
        self.inner = inner
        self.armed = armed if armed is not None else Armed()
        self.dead: set[str] = set()
        self.devices: dict[str, tuple[str, ...]] = {}  # live worker -> devices
        self.device_conflicts: list[str] = []
        self.attempts: dict[tuple[str, int], list[Attempt]] = {}  # (conversation, turn) -> attempts
        self.fresh: set[str] = set()  # launched, weights not yet loaded (next load = finalization)
        self.injected: dict[str, int] = {}
        self.on_call = on_call
        self._calls: dict[str, dict[str, asyncio.Future[None]]] = {}  # worker -> rid -> crash signal

    def __getattr__(self, name: str) -> Any:  # engine extras (reconfig_log, events, ...) pass through
        return getattr(self.inner, name)

    @property
    def capabilities(self) -> EngineCapabilities:
        return self.inner.capabilities

    def _count(self, kind: str) -> None:
        self.injected[kind] = self.injected.get(kind, 0) + 1

    def _hook(self, kind: str, worker_id: str) -> None:
        if self.on_call is not None:
            self.on_call(kind, worker_id)

    def _check_alive(self, worker_id: str) -> None:
        if worker_id in self.dead:
            raise EngineDeadError(worker_id, "server process is gone (injected crash)", exit_code=-9)

    # ------------------------------------------------------------------ life cycle
    async def launch(self, spec: ServerSpec) -> None:
        for other, devs in self.devices.items():
            if other != spec.worker_id and set(devs) & set(spec.devices):
                self.device_conflicts.append(
                    f"launch {spec.worker_id} on {spec.devices} while {other} holds {devs}")
        fail = self.armed.launch_failure > 0
        if fail:
            self.armed.launch_failure -= 1
            fail_next = getattr(self.inner, "fail_next_launch", None)
            if fail_next is not None:
                fail_next(spec.worker_id)
        self.dead.discard(spec.worker_id)
        self.devices[spec.worker_id] = spec.devices
        self._hook("launch", spec.worker_id)
        try:
            await self.inner.launch(spec)
        except BaseException:
            self.devices.pop(spec.worker_id, None)
            if fail:
                self._count("launch_failure")
            raise
        if fail and fail_next is None:
            await self.inner.stop(spec.worker_id)
            self.devices.pop(spec.worker_id, None)
            self._count("launch_failure")
            raise EngineStartError(spec.worker_id, "injected launch failure", exit_code=1)
        self.fresh.add(spec.worker_id)

    async def stop(self, worker_id: str) -> None:
        self.devices.pop(worker_id, None)
        self.fresh.discard(worker_id)
        await self.inner.stop(worker_id)

    async def healthy(self, worker_id: str) -> bool:
        return worker_id not in self.dead and await self.inner.healthy(worker_id)

    async def close(self) -> None:
        await self.inner.close()

    def inflight(self, worker_id: str) -> int:
        """Generation calls in flight on ``worker_id`` through this wrapper."""
        return len(self._calls.get(worker_id, {}))

    def inflight_rids(self, worker_id: str) -> list[str]:
        """Request ids of the generation calls in flight on ``worker_id``."""
        return list(self._calls.get(worker_id, {}))

    async def crash(self, worker_id: str) -> None:
        """The server dies now: in-flight calls end with ``EngineDeadError`` (partial kept)."""
        self.dead.add(worker_id)
        self._count("engine_crash")
        for fut in self._calls.get(worker_id, {}).values():
            if not fut.done():
                fut.set_result(None)
        await self.inner.abort(worker_id)

    # ------------------------------------------------------------------ generation
    async def _generate(self, workers: tuple[str, ...], req: GenerateRequest,
                        call: Callable[[], Any]) -> GenerateResult:
        for w in workers:
            self._check_alive(w)
        conv = (req.conversation, req.turn)
        signal: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for w in workers:
            self._calls.setdefault(w, {})[req.rid] = signal
        try:
            res: GenerateResult = await call()
        except (EngineDeadError, KVTransferError) as e:
            p = e.partial
            self._log(conv, Attempt(req.rid, len(req.input_ids), p.output_ids if p else (), "error", workers[0],
                                    type(e).__name__, p is not None))
            raise
        except EngineError as e:
            self._log(conv, Attempt(req.rid, len(req.input_ids), (), "error", workers[0], type(e).__name__, False))
            raise
        finally:
            for w in workers:
                self._calls.get(w, {}).pop(req.rid, None)
        dead = [w for w in workers if w in self.dead]
        if dead and signal.done():
            self._log(conv, Attempt(req.rid, len(req.input_ids), res.output_ids, "error", workers[0],
                                    "EngineDeadError", True))
            raise EngineDeadError(dead[0], "server process died mid-request (injected crash)", exit_code=-9,
                                  partial=res)
        self._log(conv, Attempt(req.rid, len(req.input_ids), res.output_ids, res.finish_reason.value, workers[0]))
        return res

    def _log(self, conv: tuple[str, int], a: Attempt) -> None:
        self.attempts.setdefault(conv, []).append(a)

    async def generate(self, worker_id: str, req: GenerateRequest) -> GenerateResult:
        self._hook("generate", worker_id)
        return await self._generate((worker_id,), req, lambda: self.inner.generate(worker_id, req))

    async def generate_pd(self, prefill_id: str, decode_id: str, req: GenerateRequest) -> GenerateResult:
        self._hook("generate_pd", prefill_id)
        if self.armed.kv_transfer > 0:
            self._check_alive(prefill_id)
            self._check_alive(decode_id)
            self.armed.kv_transfer -= 1
            self._count("kv_transfer_failure")
            self._log((req.conversation, req.turn),
                      Attempt(req.rid, len(req.input_ids), (), "error", prefill_id, "KVTransferError", False))
            raise KVTransferError(decode_id, f"decode worker refused the KV transfer of {req.rid} (injected)")
        return await self._generate((prefill_id, decode_id), req,
                                    lambda: self.inner.generate_pd(prefill_id, decode_id, req))

    async def abort(self, worker_id: str, rid: str | None = None) -> None:
        await self.inner.abort(worker_id, rid)

    async def pause(self, worker_id: str, mode: PauseMode = PauseMode.KEEP) -> None:
        self._check_alive(worker_id)
        await self.inner.pause(worker_id, mode)

    async def resume(self, worker_id: str) -> None:
        await self.inner.resume(worker_id)

    # ------------------------------------------------------------------ weights / memory / role
    async def load_weights(self, worker_id: str, path: str, version: int) -> None:
        self._hook("load_weights", worker_id)
        self._check_alive(worker_id)
        first = worker_id in self.fresh
        if not first and self.armed.weight_load > 0:
            self.armed.weight_load -= 1
            self._count("weight_load_failure")
            await self.inner.abort(worker_id)
            raise EngineError(worker_id, f"loading weights v{version} from {path} failed (injected: checksum mismatch)")
        await self.inner.load_weights(worker_id, path, version)
        self.fresh.discard(worker_id)

    async def weight_version(self, worker_id: str) -> int:
        self._check_alive(worker_id)
        return await self.inner.weight_version(worker_id)

    async def release_memory(self, worker_id: str) -> None:
        self._hook("release_memory", worker_id)
        if self.armed.slow_drain:
            extra = self.armed.slow_drain.pop(0)
            self._count("slow_drain")
            clock = getattr(self.inner, "clock", None)
            if clock is not None:
                await clock.sleep(extra)
        self._check_alive(worker_id)
        await self.inner.release_memory(worker_id)

    async def resume_memory(self, worker_id: str) -> None:
        self._hook("resume_memory", worker_id)
        self._check_alive(worker_id)
        await self.inner.resume_memory(worker_id)

    async def set_role(self, worker_id: str, role: Role) -> None:
        self._check_alive(worker_id)
        await self.inner.set_role(worker_id, role)


def finished_normally(a: Attempt) -> bool:
    return a.finish in (FinishReason.STOP.value, FinishReason.LENGTH.value)
