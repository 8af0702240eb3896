"""The node agent's wire format: ``ServerSpec``, ``GenerateRequest``, ``GenerateResult``,
``EngineCapabilities`` and engine errors to and from JSON (``pearl.runtime.node.agent``). Errors keep their type and partial output,
so the controller's recovery logic sees over HTTP what it would see locally. Pure functions."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
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
    KVTransferError,
    PauseMode,
    RequestTimings,
    ResponseShapeError,
    ResponseTooLargeError,
    SamplingParams,
    ServerSpec,
    StreamCutError,
    WeightVersionError,
)


def spec_to_dict(spec: ServerSpec) -> dict[str, Any]:
    return {**dataclasses.asdict(spec), "devices": list(spec.devices), "role": spec.role.value}


def spec_from_dict(d: Mapping[str, Any]) -> ServerSpec:
    return ServerSpec(
        worker_id=str(d["worker_id"]), devices=tuple(str(x) for x in d["devices"]), role=Role(d["role"]),
        weights=str(d["weights"]), weight_version=int(d.get("weight_version", 0)), port=int(d.get("port", 0)),
        host=str(d.get("host", "127.0.0.1")), extra={str(k): str(v) for k, v in dict(d.get("extra", {})).items()},
    )


def request_to_dict(req: GenerateRequest) -> dict[str, Any]:
    s = req.sampling
    return {
        "conversation": req.conversation, "turn": req.turn, "attempt": req.attempt,
        "input_ids": list(req.input_ids), "return_logprobs": req.return_logprobs,
        "sampling": {"max_new_tokens": s.max_new_tokens, "temperature": s.temperature, "top_p": s.top_p,
                     "stop_token_ids": list(s.stop_token_ids), "seed": s.seed},
    }


def request_from_dict(d: Mapping[str, Any]) -> GenerateRequest:
    s = d["sampling"]
    return GenerateRequest(
        conversation=str(d["conversation"]), turn=int(d["turn"]), attempt=int(d["attempt"]),
        input_ids=tuple(int(x) for x in d["input_ids"]),
        sampling=SamplingParams(int(s["max_new_tokens"]), float(s.get("temperature", 1.0)),
                                float(s.get("top_p", 1.0)), tuple(int(x) for x in s.get("stop_token_ids", ())),
                                None if s.get("seed") is None else int(s["seed"])),
        return_logprobs=bool(d.get("return_logprobs", True)),
    )


def capabilities_to_dict(c: EngineCapabilities) -> dict[str, Any]:
    return {"split_pd": c.split_pd, "in_place_role_switch": c.in_place_role_switch,
            "weight_broadcast": c.weight_broadcast, "pause_modes": sorted(m.value for m in c.pause_modes)}


def capabilities_from_dict(d: Mapping[str, Any]) -> EngineCapabilities:
    return EngineCapabilities(split_pd=bool(d["split_pd"]), in_place_role_switch=bool(d["in_place_role_switch"]),
                              weight_broadcast=bool(d["weight_broadcast"]),
                              pause_modes=frozenset(PauseMode(m) for m in d["pause_modes"]))


def common_capabilities(caps: Iterable[EngineCapabilities]) -> EngineCapabilities:
    """What every one of ``caps`` can do (the engines of all nodes behind one ``RemoteEngine``)."""
    cs = list(caps)
    if not cs:
        return EngineCapabilities()
    return EngineCapabilities(split_pd=all(c.split_pd for c in cs),
                              in_place_role_switch=all(c.in_place_role_switch for c in cs),
                              weight_broadcast=all(c.weight_broadcast for c in cs),
                              pause_modes=frozenset.intersection(*(c.pause_modes for c in cs)))


def result_to_dict(r: GenerateResult) -> dict[str, Any]:
    return {**dataclasses.asdict(r), "output_ids": list(r.output_ids), "logprobs": list(r.logprobs),
            "finish_reason": r.finish_reason.value}


def result_from_dict(d: Mapping[str, Any]) -> GenerateResult:
    return GenerateResult(
        rid=str(d["rid"]), output_ids=tuple(int(x) for x in d["output_ids"]),
        logprobs=tuple(float(x) for x in d["logprobs"]), finish_reason=FinishReason(d["finish_reason"]),
        weight_version=int(d["weight_version"]), prompt_tokens=int(d["prompt_tokens"]),
        cached_tokens=int(d.get("cached_tokens", 0)), timings=RequestTimings(**dict(d.get("timings", {}))),
        worker_id=str(d.get("worker_id", "")), decode_worker_id=str(d.get("decode_worker_id", "")),
    )


def error_to_dict(e: EngineError) -> dict[str, Any]:
    out: dict[str, Any] = {"type": type(e).__name__, "worker_id": e.worker_id,
                           "message": str(e).removeprefix(f"worker {e.worker_id}: ")}
    partial = getattr(e, "partial", None)
    out["partial"] = None if partial is None else result_to_dict(partial)
    if isinstance(e, EngineDeadError):
        out["exit_code"], out["log_tail"] = e.exit_code, e.log_tail
        out["message"] = out["message"].split(" (exit code")[0].split("; last log lines:")[0]
    return out


def error_from_dict(d: Mapping[str, Any]) -> EngineError:
    wid, msg = str(d.get("worker_id", "")), str(d.get("message", ""))
    partial = None if d.get("partial") is None else result_from_dict(d["partial"])
    kind = d.get("type")
    if kind in ("EngineDeadError", "EngineStartError"):
        cls = EngineStartError if kind == "EngineStartError" else EngineDeadError
        return cls(wid, msg, d.get("exit_code"), str(d.get("log_tail", "")), partial)
    if kind == "KVTransferError":
        return KVTransferError(wid, msg, partial)
    protocol = {c.__name__: c for c in (ResponseShapeError, StreamCutError, ResponseTooLargeError, WeightVersionError)}
    if isinstance(kind, str) and kind in protocol:
        return protocol[kind](wid, msg, partial)
    return EngineError(wid, msg)
