"""``SglangEngine`` on real SGLang servers (GPU hosts only; skipped unless ``--run-gpu``).

Run on a host with >= 2 NVIDIA GPUs::

    pip install -e '.[sglang]' && make models && make test-gpu

Servers: one colocated (GPU 0) for the single-server checks, then a 1P1D pair (GPU 0 prefill,
GPU 1 decode, NIXL transfer backend). Model: SmolLM2-135M (untied, from ``pearl.models``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from pearl.core.state import Role
from pearl.engines.base import FinishReason, GenerateRequest, SamplingParams, ServerSpec
from pearl.engines.resume import continuation_request, generated_tokens
from pearl.engines.sglang import SglangEngine, SglangSettings
from pearl.models import ensure_models
from pearl.train.snapshot import write_snapshot

from .races import abort_mid_generation

pytestmark = [pytest.mark.gpu, pytest.mark.asyncio(loop_scope="module")]

PROMPT = tuple(range(1000, 1100))


def greedy(rid: str, n: int) -> GenerateRequest:
    return GenerateRequest(rid, PROMPT, SamplingParams(max_new_tokens=n, temperature=0.0))


@pytest.fixture(scope="module")
def smol() -> Path:
    return ensure_models(names=("smollm2-135m",))["smollm2-135m"]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(smol: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[SglangEngine]:
    eng = SglangEngine(tmp_path_factory.mktemp("sglang"),
                       SglangSettings(transfer_backend="nixl", mem_fraction_static=0.3))
    try:
        await eng.launch(ServerSpec("c", ("0",), Role.COLOCATED, str(smol)))
        yield eng
    finally:
        await eng.close()


async def test_generate_abort_resume(engine: SglangEngine) -> None:
    ref = await engine.generate("c", greedy("ref", 200))
    assert ref.finish_reason in (FinishReason.LENGTH, FinishReason.STOP) and len(ref.logprobs) == len(ref.output_ids)
    # a GPU may finish 200 tokens before the abort lands: that run says nothing and is tried again
    req, part = await abort_mid_generation(engine, "c", lambda rid: greedy(rid, 200), ref, 10)
    cont = continuation_request(req, [part], attempt=1)
    assert cont is not None
    rest = await engine.generate("c", cont)
    assert generated_tokens([part, rest]) == list(ref.output_ids)


async def test_weights_from_disk_and_memory_release(engine: SglangEngine, smol: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    snap = write_snapshot(load_file(str(smol / "model.safetensors")), tmp_path, 1, smol)
    await engine.load_weights("c", snap.path, 1)
    assert await engine.weight_version("c") == 1
    await engine.release_memory("c")
    await engine.resume_memory("c")
    res = await engine.generate("c", greedy("after", 8))
    assert res.weight_version == 1 and len(res.output_ids) > 0


async def test_pd_equals_colocated(engine: SglangEngine, smol: Path) -> None:
    ref = await engine.generate("c", greedy("pdref", 32))
    await engine.stop("c")
    await asyncio.gather(engine.launch(ServerSpec("p", ("0",), Role.PREFILL, str(smol))),
                         engine.launch(ServerSpec("d", ("1",), Role.DECODE, str(smol))))
    pd = await engine.generate_pd("p", "d", greedy("pd", 32))
    assert pd.output_ids == ref.output_ids
    # the two halves a cross-node pair runs through the node agents (pd_prefill answers at once
    # with the bootstrap room; pd_decode pulls the KV by it)
    half = greedy("halves", 32)
    handle = await engine.pd_prefill("p", half)
    assert handle is not None
    split = await engine.pd_decode("d", half, handle, "p")
    assert split.output_ids == ref.output_ids and split.decode_worker_id == "d"
