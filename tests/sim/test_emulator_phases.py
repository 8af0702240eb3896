"""The emulator's token / time split (paper Sec. 3.2 quantities) and the paper preset's agent."""

from __future__ import annotations

import asyncio

import pytest

from pearl.config import load_config
from pearl.core.state import Role
from pearl.engines.base import FinishReason, GenerateRequest, SamplingParams, ServerSpec
from pearl.engines.emulated import EmulatedEngine
from pearl.engines.resume import continuation_request
from pearl.runtime.clock import LoopClock, run_virtual
from pearl.sim.presets import preset_overrides


def _split(cached: bool) -> dict[str, float]:
    """Two turns of one conversation; ``cached`` False: the weights change between them (a flush)."""
    async def main() -> dict[str, float]:
        clock = LoopClock()
        eng = EmulatedEngine.from_config(load_config("qwen3-8b-h200"), clock)
        await eng.launch(ServerSpec("w", ("w",), Role.COLOCATED, ""))
        first = await eng.generate("w", GenerateRequest("a", tuple(range(1, 3001)), SamplingParams(200), turn=1))
        if not cached:
            await eng.load_weights("w", "", 2)
        ctx = tuple(range(1, 3001)) + first.output_ids + tuple(range(90_000, 90_500))
        await eng.generate("w", GenerateRequest("a", ctx, SamplingParams(100), turn=2))
        await eng.close()  # counters of stopped workers are kept
        return eng.phase_split()

    return run_virtual(main())


def test_phase_split_counts_every_token_once() -> None:
    full, none = _split(True), _split(False)
    for s in (full, none):
        # prompts 3000 + 3700 tokens, computed or cached; the first token of each reply comes from prefill
        assert s["prefill_tokens"] + s["cached_tokens"] == 3000 + 3700
        assert s["decode_tokens"] == (200 - 1) + (100 - 1)
        assert s["prefill_busy_s"] > 0 and s["decode_busy_s"] > 0
        assert s["prompt_token_share"] == pytest.approx(6700 / (6700 + 298))
    assert full["cached_tokens"] == 3000 + 200 - 1 and none["cached_tokens"] == 0  # the last token's KV is not cached
    # recomputing the prefix costs prefill time, and shifts the time split towards prefill
    assert none["prefill_busy_s"] > full["prefill_busy_s"]
    assert none["prefill_time_share"] > full["prefill_time_share"]
    assert none["prefill_token_share"] > full["prefill_token_share"]


def test_paper_preset_gives_the_agent_a_shared_system_prompt_and_a_budget_cap() -> None:
    """The replays' workload: the prefix reuse is the radix cache's, so the preset sets no reuse;
    it sets what the agent sends (a shared system prompt, max_new_tokens = the budget)."""
    ov = preset_overrides("paper")
    assert not any(k.startswith("emulator.") for k in ov)
    cfg = load_config("qwen3-30b-a3b-h200", ov)
    assert cfg.workload.shared_prompt_tokens == 2000 < cfg.workload.system_prompt_tokens
    assert cfg.workload.max_response_tokens == 32768


def test_a_resumed_request_logs_its_extra_prefill() -> None:
    """Interrupted after 2 s, resumed on another worker: its whole prompt (original + generated)
    is prefilled again there (no prefix cache on the new worker) and logged as extra prefill."""
    async def main():
        clock = LoopClock()
        eng = EmulatedEngine.from_config(load_config("qwen3-8b-h200"), clock)
        for w in ("w1", "w2"):
            await eng.launch(ServerSpec(w, (w,), Role.COLOCATED, ""))
        original = GenerateRequest("t7", tuple(range(1, 4001)), SamplingParams(500), turn=1)
        task = asyncio.get_running_loop().create_task(eng.generate("w1", original))
        await clock.sleep(2.0)
        await eng.abort("w1")
        part = await task
        resumed = continuation_request(original, [part], 1)
        assert resumed is not None
        rest = await eng.generate("w2", resumed)
        await eng.close()
        return eng, part, resumed, rest

    eng, part, resumed, rest = run_virtual(main())
    assert part.finish_reason is FinishReason.ABORT and 0 < len(part.output_ids) < 500
    stats = eng.resume_prefill()
    assert stats["tokens"] == [4000 + len(part.output_ids)] == [len(resumed.input_ids)]
    assert stats["seconds"] == [pytest.approx(rest.timings.prefill_s)]
    gen = part.timings.prefill_s + part.timings.decode_s + rest.timings.prefill_s + rest.timings.decode_s
    assert stats["share"] == [pytest.approx(rest.timings.prefill_s / gen)]
    assert 0 < stats["share"][0] < 0.5
    # alone on w2, the wall prefill is exactly the GPU work of its tokens
    assert stats["work_seconds"] == [pytest.approx(rest.timings.prefill_s)]
    assert stats["work_share"] == [pytest.approx(stats["share"][0])]


def test_resumed_prefill_work_excludes_what_the_worker_interleaves() -> None:
    """On a worker that is prefilling another long prompt, the resumed request's wall prefill holds
    the other's chunks too; its GPU work is that of its own tokens alone."""
    async def main():
        clock = LoopClock()
        eng = EmulatedEngine.from_config(load_config("qwen3-8b-h200"), clock)
        await eng.launch(ServerSpec("w", ("w",), Role.COLOCATED, ""))
        loop = asyncio.get_running_loop()
        other = loop.create_task(eng.generate("w", GenerateRequest("o", tuple(range(100_001, 130_001)),
                                                                   SamplingParams(50), turn=1)))
        resumed = GenerateRequest("t7", tuple(range(1, 12_001)), SamplingParams(50), turn=1, attempt=1)
        await eng.generate("w", resumed)
        await other
        await eng.close()
        alone = eng._alone_prefill_s(12_000, 0)
        return eng.resume_prefill(), alone

    stats, alone = run_virtual(main())
    assert stats["tokens"] == [12_000]
    assert stats["work_seconds"] == [pytest.approx(alone)]
    assert stats["seconds"][0] > stats["work_seconds"][0] + 0.1  # it shared chunks with the other 30K-token prompt


def test_aborting_a_decode_worker_ends_the_requests_bound_for_it() -> None:
    """A PD request still prefilling on P is bound for D: aborting D (a borrowed decode worker
    being returned) ends it now, instead of letting it hand off to D and decode to the end."""

    async def main():
        clock = LoopClock()
        eng = EmulatedEngine.from_config(load_config("qwen3-8b-h200"), clock)
        await eng.launch(ServerSpec("p", ("p",), Role.PREFILL, ""))
        await eng.launch(ServerSpec("d", ("d",), Role.DECODE, ""))
        req = GenerateRequest("t1", tuple(range(1, 30_001)), SamplingParams(2000), turn=1)
        task = asyncio.get_running_loop().create_task(eng.generate_pd("p", "d", req))
        await clock.sleep(0.05)  # inside the 30K-token prefill
        assert eng.request_stages()["t1/1"] == ("prefill", ("p",))
        t0 = clock.now()
        await eng.abort("d")
        res = await task
        await eng.close()
        return res, clock.now() - t0

    res, waited = run_virtual(main())
    assert res.finish_reason is FinishReason.ABORT and res.output_ids == ()
    assert waited < 0.01


def test_decode_fit_on_one_colocated_batch_holds_at_a_decode_pools_batch() -> None:
    """The decode step fitted on one colocated batch (12 workers: ~5 sequences each) predicts the
    emulator's iteration at the larger batches of a P:D split's decode pool (9-16 sequences).
    The step is fitted on the emulator's logged decode spans (``pearl.core.iteration_fit``), which
    carry no prefill stall, as the predictor's two-scale memory-bound step (a fixed part plus a
    part linear in the KV tokens); the emulator's step is the measured kernel table, which is not
    linear in either, so the fit is within 4 % (measured -1.9 % at 12 x 4K .. +3.4 % at 1 x 4K on
    the preset's own workload means). On the calibrated means too: the next test."""
    from pearl.engines.emulated_costs import worker_costs
    from pearl.sim.simulate import measure_makespan

    cfg = load_config("qwen3-8b-h200", preset_overrides("paper"))
    _, tracker = measure_makespan(cfg, 12, "coloc", 1)
    hw = tracker.hardware
    assert hw.samples > 0  # fitted, not the prior
    from pearl.engines.emulated_physics import load_physics

    costs = worker_costs(cfg.model, cfg.hardware, cfg.emulator, cfg.cluster.tp_size,
                         load_physics(cfg.model.name, cfg.hardware.name).engine)
    for ctx in (4000.0, 12000.0, 24000.0):
        for n in (1, 5, 9, 12, 16):
            assert hw.decode_step_s(n, ctx) == pytest.approx(costs.decode_step_s(n, n * ctx), rel=0.04), (n, ctx)


def test_decode_fit_on_one_colocated_batch_holds_in_the_replay_world() -> None:
    """As above, on the workload the replays run (``load_preset_config``: the physics file's
    workload means), up to the 21 sequences a 3-decode-worker pool of batch 64 runs: within 4 %
    (measured -0.3 % at 5 x 4K .. +2.9 % at 16 x 24K)."""
    from pearl.engines.emulated_costs import worker_costs
    from pearl.engines.emulated_physics import load_physics
    from pearl.sim.presets import load_preset_config
    from pearl.sim.simulate import measure_makespan

    cfg = load_preset_config("qwen3-8b-h200", "paper")
    _, tracker = measure_makespan(cfg, 12, "coloc", 1)
    hw = tracker.hardware
    costs = worker_costs(cfg.model, cfg.hardware, cfg.emulator, cfg.cluster.tp_size,
                         load_physics(cfg.model.name, cfg.hardware.name).engine)
    for ctx in (4000.0, 12000.0, 24000.0):
        for n in (1, 5, 9, 16, 21):
            assert hw.decode_step_s(n, ctx) == pytest.approx(costs.decode_step_s(n, n * ctx), rel=0.04), (n, ctx)
