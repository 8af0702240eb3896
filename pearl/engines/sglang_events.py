"""SGLang's ``/generate`` wire format as PEARL reads it: one stream's state, how each event folds
into it, and what a finished stream means.

Each event of a ``/generate`` stream (``srt/managers/tokenizer_manager.py``: ``_handle_batch_output``
for an ordinary event, ``_handle_abort_req`` for an abort's echo, ``_coalesce_streaming_chunks``
when several were queued for the client) is folded into a ``SglangStream`` by ``absorb``; ``refused``
and ``no_room`` read the abort a finished stream ended with (a 4xx: the request's fault; a 503
without output: no room now). ``request_seed`` and ``model_eos_ids`` give a request's sampling seed
and the model's EOS ids. Pure functions over plain data: the engine (``pearl.engines.sglang``) does
the I/O.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pearl.core.trajectory import MISSING_LOGPROB
from pearl.engines.base import (
    EngineError,
    FinishReason,
    GenerateRequest,
    RequestRejectedError,
    ResponseShapeError,
)
from pearl.engines.http_engine import StreamState


def request_seed(rid: str) -> int:
    """The sampling seed of an unseeded request: ``crc32(rid)``, distinct per request id (so per
    trajectory of a group) and the same on every replay of that id."""
    return zlib.crc32(rid.encode())


def model_eos_ids(weights: str | Path) -> frozenset[int]:
    """The EOS ids SGLang stops on besides ``stop_token_ids``: ``eos_token_id`` (an int or a list)
    of the model's ``config.json`` united with its ``generation_config.json``'s
    (``ModelConfig._get_hf_eos_token_id``); empty where neither file says."""
    ids: set[int] = set()
    for name in ("config.json", "generation_config.json"):
        try:
            value = json.loads((Path(weights) / name).read_text()).get("eos_token_id")
        except (OSError, ValueError, AttributeError):
            continue
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, int):
                ids.add(v)
    return frozenset(ids)


@dataclass
class SglangStream(StreamState):
    """A ``/generate`` stream so far, with the weight version the server reports in it."""

    version: str | None = None
    ended: bool = False  # ``[DONE]`` (or the whole non-streaming reply) arrived
    abort_status: int | None = None  # ``finish_reason.status_code`` of an abort event
    abort_message: str = ""


FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT}


def absorb(wid: str, inflight: int, msg: Any, st: SglangStream) -> None:
    """Fold one event (or the whole non-streaming reply) of worker ``wid``'s stream into ``st``
(``inflight``: requests running on that server, for the concurrency sample). With ``c`` =
    ``meta_info.completion_tokens`` and ``k`` tokens so far, an event's ``n`` ids are new tokens
    if ``k + n == c`` (incremental), the whole output if ``n == c`` (cumulative, the final reply).
    An abort's last event (``_handle_abort_req`` in SGLang's tokenizer manager) repeats the last
    id and carries every logprob entry ``[logprob, id, text]``; when chunks were still queued
    for the client it is coalesced with them (``_coalesce_streaming_chunks``: ids and logprob
    lists concatenated, ``c`` of the abort), so its ids are the queued new tokens followed by
    the repeated one (``k + n - 1 == c``) and its logprob list ends with the ``c`` entries of
    the whole output, which are taken as the output and its logprobs. Anything else is a
    ``ResponseShapeError``; an ``error`` event is a ``RequestRejectedError`` when SGLang marks
    it as the request's fault (``code`` 4xx), else an ``EngineError``."""
    if not isinstance(msg, dict):
        raise ResponseShapeError(wid, f"generate event is not a JSON object: {str(msg)[:200]!r}")
    if "error" in msg:
        err = msg["error"]
        text = err.get("message", err) if isinstance(err, dict) else err
        code = err.get("code") if isinstance(err, dict) else None
        if isinstance(code, int) and 400 <= code < 500:
            raise RequestRejectedError(wid, f"generate refused ({code}): {text}", code)
        raise EngineError(wid, f"generate error: {text}")
    ids, meta = msg.get("output_ids"), msg.get("meta_info")
    if not isinstance(ids, list) or not isinstance(meta, dict):
        raise ResponseShapeError(wid, f"generate event lacks output_ids / meta_info: {str(msg)[:200]!r}")
    done = meta.get("completion_tokens")
    c = int(done) if isinstance(done, int) else len(st.tokens) + len(ids)
    k = len(st.tokens)
    lps = meta.get("output_token_logprobs")
    lps = lps if isinstance(lps, list) and all(isinstance(e, list) and len(e) >= 2 for e in lps) else None
    fr = meta.get("finish_reason")
    aborted = isinstance(fr, dict) and fr.get("type") == "abort"
    whole: list[Any] | None = None  # logprob entries of the whole output (an abort's last event)
    if aborted and c >= k and lps is not None and len(lps) >= c and (len(lps) > len(ids) or k + len(ids) != c):
        whole = lps[len(lps) - c:]
        st.tokens = [int(e[1]) for e in whole]
    elif k + len(ids) == c:
        st.tokens.extend(int(t) for t in ids)  # incremental (or an empty final event)
    elif len(ids) == c and c >= k:
        st.tokens = [int(t) for t in ids]
    elif aborted and ids and k + len(ids) - 1 == c:
        st.tokens.extend(int(t) for t in ids[:-1])  # queued new tokens + the repeated last one
    elif aborted and c >= k:
        pass  # an abort's last event without logprobs: the output stays the prefix that arrived
    else:
        raise ResponseShapeError(wid, f"generate event with {len(ids)} output_ids and completion_tokens {c} "
                                 f"after {k} tokens: neither incremental nor cumulative")
    if len(st.tokens) > k:
        st.arrived(inflight)
        st.grew.set()
    if whole is not None:
        st.logprobs = [float(e[0]) if e[0] is not None else MISSING_LOGPROB for e in whole]
    elif lps:
        vals = [float(e[0]) if e[0] is not None else MISSING_LOGPROB for e in lps]
        if len(vals) == len(st.tokens):
            st.logprobs = vals
        elif len(st.logprobs) + len(vals) == len(st.tokens):
            st.logprobs.extend(vals)
        else:
            raise ResponseShapeError(wid, f"generate event with {len(vals)} logprobs after {len(st.logprobs)} "
                                     f"for {len(st.tokens)} tokens: they cannot be aligned")
    st.prompt_tokens = int(meta.get("prompt_tokens") or st.prompt_tokens)
    st.cached_tokens = int(meta.get("cached_tokens") or st.cached_tokens)
    if meta.get("weight_version") is not None:
        st.version = str(meta["weight_version"])
    if fr:
        st.finish = fr.get("type") if isinstance(fr, dict) else str(fr)
        if isinstance(fr, dict) and st.finish == "abort":
            code = fr.get("status_code")
            st.abort_status = int(code) if isinstance(code, int) else None
            st.abort_message = str(fr.get("message") or "")


def refused(wid: str, req: GenerateRequest, st: SglangStream) -> None:
    """An abort with a 4xx ``status_code`` is SGLang refusing the request itself
    (``Req.set_finish_with_abort``; a decode server's KV budget in ``disaggregation/decode.py``):
    a ``RequestRejectedError``. Its output is not the model's answer (a refused request is run
    on the input ``[0]`` and still samples a token) and is dropped."""
    code = st.abort_status
    if st.finish == "abort" and code is not None and 400 <= code < 500:
        raise RequestRejectedError(wid, f"request {req.rid} refused ({code}): {st.abort_message}; "
                                   f"its {len(st.tokens)} output token(s) are dropped", code)

def no_room(st: SglangStream) -> bool:
    """A 503 abort with no output: SGLang has no room for the request now (a full waiting
    queue, ``_abort_on_queued_limit``; a decode server that could not reclaim KV)."""
    return st.finish == "abort" and st.abort_status == 503 and not st.tokens
