"""The emulated engine: cost-model sanity, continuous batching, KV queueing, exact aborts."""

from __future__ import annotations

import asyncio

import pytest

from pearl.config import EmulatorSpec, HardwareSpec
from pearl.core.state import Role
from pearl.core.telemetry import screen_iterations
from pearl.engines.base import EngineStartError, FinishReason, GenerateRequest, SamplingParams, ServerSpec
from pearl.engines.emulated import EmulatedEngine
from pearl.engines.emulated_costs import WorkerCosts, span_sum, steps_within
from pearl.runtime.clock import LoopClock, run_virtual

from .helpers import config


def _costs(name: str = "qwen3-8b-h200") -> WorkerCosts:
    cfg = config(name)
    return WorkerCosts.from_specs(cfg.model, cfg.hardware, cfg.emulator)


def _req(conv: str, turn: int, n_prompt: int, n_new: int, start: int = 1, attempt: int = 0) -> GenerateRequest:
    return GenerateRequest(conv, tuple(range(start, start + n_prompt)), SamplingParams(n_new), turn=turn,
                           attempt=attempt)


def test_decode_step_cost_grows_with_batch_and_kv() -> None:
    c = _costs()
    assert c.decode_step_s(1, 1000) < c.decode_step_s(8, 8000) < c.decode_step_s(64, 64000)
    assert c.decode_step_s(16, 16 * 1000) < c.decode_step_s(16, 16 * 20000)  # more KV to read
    # memory-bound at small batch: one step reads all 16.4 GB of weights at 4.8 TB/s * 0.7
    assert c.decode_step_s(1, 0) == pytest.approx(0.004 + 8.2e9 * 2 / (4.8e12 * 0.7))
    # Qwen3-8B KV pool: (141 GB * 0.9 - 16.4 GB) / 144 KiB per token
    assert c.kv_capacity_tokens == int((141e9 * 0.9 - 8.2e9 * 2) // 147456)


def test_moe_reads_more_experts_with_a_larger_batch() -> None:
    c = _costs("qwen3-30b-a3b-h200")
    touched = [c.experts_touched(n) for n in (1, 4, 16, 64)]
    assert touched[0] == pytest.approx(8.0)  # one token: its top-8 experts
    assert touched == sorted(touched) and touched[-1] < 128
    assert c.weight_read_bytes(1) < c.weight_read_bytes(16) < c.weight_read_bytes(64) < 30.5e9 * 2
    assert _costs().weight_read_bytes(1) == _costs().weight_read_bytes(64)  # dense: all weights, always


def test_span_sum_matches_step_by_step_and_inverts() -> None:
    c = _costs()
    for n, ctx in ((1, 500), (8, 8 * 4000), (48, 48 * 30000)):
        a0, a1, m0, m1 = c.decode_line(n, ctx)
        line = (c.overhead_s, a0, a1, m0, m1)
        steps = [c.decode_step_s(n, ctx + n * j) for j in range(300)]
        assert span_sum(300, *line) == pytest.approx(sum(steps), rel=1e-9)
        assert steps_within(sum(steps[:137]) + 1e-7, 300, line) == 137
        assert steps_within(sum(steps[:137]) - 1e-7, 300, line) == 136


def _launch_all(eng: EmulatedEngine, *specs: tuple[str, Role]):
    return asyncio.gather(*(eng.launch(ServerSpec(w, (w,), r, "")) for w, r in specs))


def test_single_request_time_is_prefill_plus_decode_steps() -> None:
    async def main():
        clock = LoopClock()
        eng = EmulatedEngine.from_config(config(), clock)
        await _launch_all(eng, ("w", Role.COLOCATED))
        t0 = clock.now()
        res = await eng.generate("w", _req("a", 1, 3000, 100))
        dt = clock.now() - t0
        again = await eng.generate("w", _req("a", 1, 3000, 100, attempt=1))
        await eng.close()
        return eng, res, again, dt

    eng, res, again, dt = run_virtual(main())
    c = eng.costs
    prefill = c.prefill_chunk_s([(3000, 0)])
    decode = sum(c.decode_step_s(1, 3001 + j) for j in range(99))  # the first token came from prefill
    assert res.timings.prefill_s == pytest.approx(prefill)
    assert res.timings.decode_s == pytest.approx(decode)
    assert dt == pytest.approx(prefill + decode)
    assert len(res.output_ids) == len(res.logprobs) == 100 and res.finish_reason is FinishReason.LENGTH
    assert res.output_ids == again.output_ids  # deterministic synthetic tokens
    assert again.cached_tokens == 2999  # prefix cache: everything but one prompt token


def test_abort_returns_exactly_the_tokens_generated_so_far() -> None:
    async def main():
        clock = LoopClock()
        eng = EmulatedEngine.from_config(config(), clock)
        await _launch_all(eng, ("w", Role.COLOCATED))
        t0 = clock.now()
        task = asyncio.create_task(eng.generate("w", _req("a", 1, 1000, 1000)))
        await clock.sleep(2.0)
        await eng.abort("w")
        res = await task
        await eng.close()
        return eng, res, clock.now() - t0

    eng, res, elapsed = run_virtual(main())
    c = eng.costs
    t = c.prefill_chunk_s([(1000, 0)])
    done = 1
    while t + c.decode_step_s(1, 1000 + done) <= elapsed:
        t += c.decode_step_s(1, 1000 + done)
        done += 1
    assert res.finish_reason is FinishReason.ABORT
    assert len(res.output_ids) == len(res.logprobs) == done


def _abort_in_a_span(everything: bool):
    """a (2000-token prompt) and b (3000) decode side by side; 2 s in, a is aborted (or the whole
    worker is), cutting their decode span; b then decodes alone to its end."""
    async def main():
        clock = LoopClock()
        eng = EmulatedEngine.from_config(config(), clock, iteration_log=[])
        await _launch_all(eng, ("w", Role.COLOCATED))
        a_req, b_req = _req("a", 1, 2000, 2000), _req("b", 1, 3000, 2000, start=50_000)
        a = asyncio.create_task(eng.generate("w", a_req))
        b = asyncio.create_task(eng.generate("w", b_req))
        await clock.sleep(2.0)
        t_abort = clock.now()
        await eng.abort("w", None if everything else a_req.rid)
        res = await asyncio.gather(a, b)
        await clock.sleep(1.0)  # the cut span ends its iteration in progress
        await eng.close()
        return eng, res, t_abort

    return run_virtual(main())


@pytest.mark.parametrize("everything", [False, True])
def test_a_span_cut_by_an_abort_is_logged_at_the_batch_that_ran_it(everything: bool) -> None:
    """Every iteration record states the batch and context its iterations ran at: its wall time is
    the emulator's span of that batch (a span cut by an abort ran with the leaving requests in it),
    and none is screened out as bad input (a record of the batch left after the abort would be
    batch 0 when the whole worker is aborted)."""
    eng, (a, b), t_abort = _abort_in_a_span(everything)
    assert a.finish_reason is FinishReason.ABORT
    assert (b.finish_reason is FinishReason.ABORT) == everything
    log = eng.iteration_log
    cut = [r for r in log if r.start_s < t_abort <= r.end_s]
    assert len(cut) == 1 and cut[0].batch == 2
    for r in log:
        assert r.wall_s == pytest.approx(eng.costs.span(r.batch, r.context_tokens, r.steps).total(r.steps))
    kept, why = screen_iterations(log)
    assert kept == log and not why
    # every token is counted once: the aborted request's tokens of the cut span too
    assert eng.phase_split()["decode_tokens"] == len(a.output_ids) + len(b.output_ids) - 2


def test_prefill_interrupts_decode_on_a_colocated_worker() -> None:
    async def main(with_arrival: bool):
        clock = LoopClock()
        eng = EmulatedEngine.from_config(config(), clock)
        await _launch_all(eng, ("w", Role.COLOCATED))
        a = asyncio.create_task(eng.generate("w", _req("a", 1, 1000, 400)))
        await clock.sleep(1.0)
        if with_arrival:
            await eng.generate("w", _req("b", 1, 8000, 1, start=50_000))
        res = await a
        await eng.close()
        return eng, res

    eng, alone = run_virtual(main(False))
    _, disturbed = run_virtual(main(True))
    stall = eng.costs.prefill_chunk_s([(8000, 0)])
    # A's decode stalled for B's whole prefill chunk (and is otherwise the same, up to B's decode step)
    assert disturbed.timings.decode_s - alone.timings.decode_s == pytest.approx(stall, rel=0.05)
    assert disturbed.output_ids == alone.output_ids


def test_kv_capacity_queues_the_request_that_does_not_fit() -> None:
    async def main():
        clock = LoopClock()
        cfg = config()
        hw = HardwareSpec(**{**cfg.hardware.model_dump(), "memory_gb": 20.0})
        eng = EmulatedEngine(cfg.model, hw, clock, EmulatorSpec())
        await _launch_all(eng, ("w", Role.COLOCATED))
        cap = eng.costs.kv_capacity_tokens
        n = cap // 2 + 10  # two of these do not fit together
        assert 1000 < cap < 20_000  # (20 GB * 0.9 - 16.4 GB) / 144 KiB
        t0 = clock.now()
        first = asyncio.create_task(eng.generate("w", _req("a", 1, n, 50)))
        second = asyncio.create_task(eng.generate("w", _req("b", 1, n, 50, start=60_000)))
        r1 = await first
        t1 = clock.now()
        r2 = await second
        await eng.close()
        return cap, r1, r2, t1 - t0

    _cap, r1, r2, t_first = run_virtual(main())
    assert r1.timings.queue_s == 0.0
    # the second waited in the queue exactly until the first freed its KV
    assert r2.timings.queue_s == pytest.approx(t_first)


def test_disaggregated_request_pays_kv_transfer() -> None:
    async def main():
        clock = LoopClock()
        eng = EmulatedEngine.from_config(config(), clock)
        await _launch_all(eng, ("p", Role.PREFILL), ("d", Role.DECODE))
        res = await eng.generate_pd("p", "d", _req("a", 1, 10_000, 50))
        await eng.close()
        return eng, res

    _eng, res = run_virtual(main())
    # 10,000 tokens x 144 KiB at 50 GB/s + 2 ms latency
    assert res.timings.transfer_s == pytest.approx(0.002 + 10_000 * 147456 / 50e9)
    assert res.worker_id == "p" and res.decode_worker_id == "d"
    assert len(res.output_ids) == 50


def test_launch_times_and_injected_failure() -> None:
    async def main():
        clock = LoopClock()
        eng = EmulatedEngine.from_config(config(), clock)
        eng.fail_next_launch("bad")
        t0 = clock.now()
        await eng.launch(ServerSpec("ok", ("g0",), Role.COLOCATED, ""))
        t_ok = clock.now() - t0
        with pytest.raises(EngineStartError, match="injected"):
            await eng.launch(ServerSpec("bad", ("g1",), Role.COLOCATED, ""))
        healthy = await eng.healthy("ok"), await eng.healthy("bad")
        await eng.close()
        return t_ok, healthy

    t_ok, healthy = run_virtual(main())
    assert 56.0 <= t_ok <= 67.0
    assert healthy == (True, False)


def test_the_radix_cache_serves_what_was_computed_and_a_flush_forgets_it() -> None:
    """Reuse comes out of the tokens: a conversation's next turn finds its prompt and its output
    less the last token (SGLang's cache_finished_req); another conversation finds only the prefix
    it shares; a weight update flushes the tree."""
    async def main():
        clock = LoopClock()
        eng = EmulatedEngine.from_config(config(), clock)
        await _launch_all(eng, ("w", Role.COLOCATED))
        first = await eng.generate("w", _req("a", 1, 3001, 10))
        ctx = tuple(range(1, 3002)) + first.output_ids + tuple(range(90_000, 90_500))
        second = await eng.generate("w", GenerateRequest("a", ctx, SamplingParams(10), turn=2))
        other = await eng.generate("w", GenerateRequest("b", tuple(range(1, 2001)) + tuple(range(70_000, 70_300)),
                                                         SamplingParams(10)))
        await eng.load_weights("w", "", 2)
        flushed = await eng.generate("w", GenerateRequest("a", ctx, SamplingParams(10), turn=2, attempt=1))
        stats = eng.radix_cache("w").stats()
        await eng.close()
        return first, second, other, flushed, stats, eng.crashes

    first, second, other, flushed, stats, crashes = run_virtual(main())
    assert first.cached_tokens == 0
    assert second.cached_tokens == 3001 + 10 - 1 and len(second.output_ids) == 10
    assert other.cached_tokens == 2000
    assert flushed.cached_tokens == 0
    assert stats["protected"] == 0 and stats["evictable"] == len(flushed.output_ids) - 1 + 3001 + 10 + 500
    assert crashes == []


def test_kv_pressure_retracts_the_newest_request_and_it_resumes_losing_nothing() -> None:
    """Two requests admitted on SGLang's estimate (4096 x new_token_ratio each) outgrow a small pool
    while decoding: the one with fewer tokens generated is retracted (its KV freed, back to the
    queue), re-prefills prompt + output and ends with exactly the tokens an unpressed run gives."""
    async def main(memory_gb: float):
        clock = LoopClock()
        cfg = config()
        hw = HardwareSpec(**{**cfg.hardware.model_dump(), "memory_gb": memory_gb})
        eng = EmulatedEngine(cfg.model, hw, clock, EmulatorSpec())
        await _launch_all(eng, ("w", Role.COLOCATED))
        cap = eng.costs.kv_capacity_tokens
        a = asyncio.create_task(eng.generate("w", _req("a", 1, 4000, 3000)))
        await clock.sleep(0.1)
        b = asyncio.create_task(eng.generate("w", _req("b", 1, 4000, 3000, start=60_000)))
        ra, rb = await a, await b
        split = eng.phase_split()
        await eng.close()
        return cap, ra, rb, split

    cap, ra, rb, split = run_virtual(main(20.434))
    _, ra0, rb0, split0 = run_virtual(main(141.0))
    # b is admitted beside a (4000 + 3000 < cap - a's KV - 0.7 x a's 3000 left), both do not fit
    assert 13_000 < cap < 14_000
    assert split["retracted"] == 1 and split0["retracted"] == 0
    assert (ra.output_ids, rb.output_ids) == (ra0.output_ids, rb0.output_ids)
    assert len(rb.output_ids) == 3000
    # b (fewer tokens generated when the pool ran out) paid its prompt and output again
    assert split["prefill_tokens"] > split0["prefill_tokens"]
    assert rb.timings.queue_s > 0.0


def _chunk_beside_a_decode(mixed: bool):
    """Request a (2000-token prompt, 400 new) decodes alone; 0.5 s in, b (6000-token prompt, 50
    new) arrives: its prefill chunk runs beside a's decoding, mixed into one pass or alone."""
    async def main():
        clock = LoopClock()
        eng = EmulatedEngine.from_config(config(**{"emulator.costs": "database", "emulator.mixed_chunk": mixed}), clock,
                                         iteration_log=[])
        await _launch_all(eng, ("w", Role.COLOCATED))

        async def late():
            await clock.sleep(0.5)
            return await eng.generate("w", _req("b", 1, 6000, 50, start=50_000))

        a, b = await asyncio.gather(eng.generate("w", _req("a", 1, 2000, 400)), late())
        split = eng.phase_split()
        await eng.close()
        return eng, a, b, split

    return run_virtual(main())


def test_a_mixed_chunk_carries_the_running_decodes_one_token() -> None:
    """emulator.mixed_chunk (SGLang --enable-mixed-chunk): b's chunk is one pass of the database's
    mixed step with a's decode, and a gets a token from it; off (SGLang's default), a waits for the
    chunk. Every token is made once either way."""
    off_eng, a_off, b_off, split_off = _chunk_beside_a_decode(False)
    on_eng, a_on, b_on, split_on = _chunk_beside_a_decode(True)
    for a, b in ((a_off, b_off), (a_on, b_on)):
        assert len(a.output_ids) == 400 and len(b.output_ids) == 50
    assert split_on["decode_tokens"] == split_off["decode_tokens"] == 399 + 49
    # a's span before b arrived: identical in both runs; b's chunk starts at its cut
    first = on_eng.iteration_log[0]
    assert first == off_eng.iteration_log[0] and first.batch == 1
    ctx = first.context_tokens + first.steps
    c = on_eng.costs
    chunk, mixed = c.prefill_chunk_s([(6000, 0)]), c.mixed_step_s([(6000, 0)], 1, ctx)
    assert b_off.timings.prefill_s == pytest.approx(chunk)
    assert b_on.timings.prefill_s == pytest.approx(mixed)
    assert chunk < mixed < chunk + c.decode_step_s(1, ctx)  # cheaper than the chunk and a decode apart
    # the mixed pass's time beyond the chunk is decode time; the chunk alone is prefill time
    assert split_on["prefill_busy_s"] == pytest.approx(split_off["prefill_busy_s"])
    # a is one iteration ahead after b's chunk: it finishes before it does with the chunk alone
    assert a_on.timings.decode_s < a_off.timings.decode_s


def test_a_decode_worker_admits_on_the_512_token_reserve_and_offloads_under_pressure() -> None:
    """SGLang's PD decode server (DecodePreallocQueue): a transferred request is admitted while
    prompt + 512 <= free - 512 x active, so two fit beside each other and then outgrow the pool;
    the retracted one's KV goes to host memory and comes back (no recompute) when the other ends.
    Every token is made once, as in an unpressed run."""
    async def main(memory_gb: float):
        clock = LoopClock()
        cfg = config()
        hw = HardwareSpec(**{**cfg.hardware.model_dump(), "memory_gb": memory_gb})
        eng = EmulatedEngine(cfg.model, hw, clock, EmulatorSpec())
        await _launch_all(eng, ("p", Role.PREFILL), ("d", Role.DECODE))
        a = asyncio.create_task(eng.generate_pd("p", "d", _req("a", 1, 4000, 3000)))
        await clock.sleep(0.1)
        b = asyncio.create_task(eng.generate_pd("p", "d", _req("b", 1, 4000, 3000, start=60_000)))
        ra, rb = await a, await b
        split = eng.phase_split()
        await eng.close()
        return eng.costs.kv_capacity_tokens, ra, rb, split

    cap, ra, rb, split = run_virtual(main(20.434))
    _, ra0, rb0, split0 = run_virtual(main(141.0))
    assert 13_000 < cap < 14_000
    assert split["retracted"] == 1 and split0["retracted"] == 0
    assert (ra.output_ids, rb.output_ids) == (ra0.output_ids, rb0.output_ids)
    assert len(ra.output_ids) == len(rb.output_ids) == 3000
    # offloaded, not recomputed: the prefill work is the same; the host copies are engine time
    assert split["prefill_tokens"] == split0["prefill_tokens"]
    assert split["sched_s"] > split0["sched_s"]
