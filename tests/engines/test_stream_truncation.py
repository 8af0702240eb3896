"""A generation stream whose HTTP body ends without ``data: [DONE]`` is a dropped connection, not
a finished request: both adapters raise (``race_death`` turns it into ``EngineDeadError`` when the
server process is gone, ``EngineError`` otherwise) instead of returning the tokens so far as a
normal result. Found in a CI-like run: a SIGKILLed vLLM decode server closed the stream cleanly
between events and the PD request "completed" with a partial output and no error."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import aiohttp
import pytest
from aiohttp import web

from pearl.engines import sglang as sg
from pearl.engines import vllm as vl


async def _server(events: list[dict[str, object]], done: bool) -> tuple[web.AppRunner, str]:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for ev in events:
            await resp.write(f"data: {json.dumps(ev)}\n\n".encode())
        if done:
            await resp.write(b"data: [DONE]\n\n")
        return resp  # the body ends cleanly either way (chunked terminator sent)

    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    app.router.add_post("/generate", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


VLLM_EVENTS: list[dict[str, object]] = [{"choices": [{"token_ids": [5, 6], "logprobs": {"token_logprobs": [-0.1, -0.2]}}]}]
SGLANG_EVENTS: list[dict[str, object]] = [{"output_ids": [5, 6], "meta_info": {"output_token_logprobs": [[-0.1, 5], [-0.2, 6]]}}]


def _vllm(tmp_path: Path):  # type: ignore[no-untyped-def]
    eng = vl.VllmEngine(tmp_path)
    return eng, VLLM_EVENTS, vl._Stream(), lambda srv, st: eng._stream(srv, {"stream": True, "request_id": "r"}, st)


def _sglang(tmp_path: Path):  # type: ignore[no-untyped-def]
    eng = sg.SglangEngine(tmp_path)
    return eng, SGLANG_EVENTS, sg._Stream(), lambda srv, st: eng._read(srv, {"stream": True, "rid": "r"}, st)


@pytest.mark.parametrize("done", [True, False])
@pytest.mark.parametrize("adapter", [_vllm, _sglang], ids=["vllm", "sglang"])
async def test_stream_must_end_with_done(tmp_path: Path, adapter, done: bool) -> None:  # type: ignore[no-untyped-def]
    eng, events, st, read = adapter(tmp_path)
    runner, url = await _server(events, done)
    srv = SimpleNamespace(url=url, spec=SimpleNamespace(worker_id="d"), inflight=0)
    try:
        if done:
            await read(srv, st)
        else:
            with pytest.raises(aiohttp.ClientPayloadError, match="closed before"):
                await read(srv, st)
        if adapter is _vllm:
            assert st.tokens == [5, 6]  # what arrived is kept (the partial result of a dead server)
    finally:
        await eng.close()
        await runner.cleanup()
