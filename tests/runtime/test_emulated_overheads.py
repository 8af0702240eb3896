"""The engine's time beyond its kernels (``pearl.engines.emulated_overheads``): the overlap
scheduler's max, eager launches, the measured scheduler times, and the decode span that carries
them in closed form."""

from __future__ import annotations

import dataclasses

import pytest

from pearl.core.state import Role
from pearl.engines.base import GenerateRequest, SamplingParams, ServerSpec
from pearl.engines.emulated import EmulatedEngine
from pearl.engines.emulated_overheads import FlooredSpan, Overheads, SchedulerTimes, load_scheduler_times
from pearl.runtime.clock import LoopClock, run_virtual

from .helpers import config


def _base(n: int = 8, ctx: float = 8 * 4000.0, k: int = 400):
    eng = EmulatedEngine.from_config(config(), LoopClock())
    return eng.costs, eng.costs.span(n, ctx, k)


@pytest.mark.parametrize("floor_ms,extra_ms", [(0.0, 1.0), (20.0, 0.0), (20.0, 0.5), (1000.0, 0.0)])
def test_a_floored_span_is_the_sum_of_its_steps_and_inverts(floor_ms: float, extra_ms: float) -> None:
    _, base = _base()
    f, e = floor_ms / 1e3, extra_ms / 1e3
    span = FlooredSpan(base, f, e, 400)
    steps = [max(base.total(j + 1) - base.total(j), f) + e for j in range(400)]
    for k in (0, 1, 17, 133, 400):
        assert span.total(k) == pytest.approx(sum(steps[:k]), rel=1e-9, abs=1e-12)
    for k in (1, 50, 399):
        assert span.within(sum(steps[:k]) + 1e-9, 400) == k
        assert span.within(sum(steps[:k]) - 1e-6, 400) == k - 1


def test_an_iteration_takes_the_longer_of_gpu_and_cpu_under_overlap_and_both_without() -> None:
    sched = SchedulerTimes(a_ext=0.001, c_ext=1e-6)
    o = Overheads(sched=sched, layers=36, launch_per_layer_s=1e-4)
    # an extend of 2 requests whose prompts hold 30K tokens: CPU 31 ms, kernels 12 ms, launches 3.6 ms
    assert o.extend_s(2, 30_000, 0.012) == pytest.approx(0.031 - 0.012)
    assert dataclasses.replace(o, overlap=False).extend_s(2, 30_000, 0.012) == pytest.approx(0.031)
    # a tiny extend: the launches bound it
    assert Overheads(layers=36, launch_per_layer_s=1e-4).extend_s(1, 10, 0.001) == pytest.approx(0.0036 - 0.001)
    # the decode step: max(D, cpu) with overlap, D + cpu without; eager past cuda_graph_max_bs
    _, base = _base(n=300, ctx=300 * 2000.0)
    dec = Overheads(sched=SchedulerTimes(b_dec=1e-4), layers=36, launch_per_layer_s=1e-4, cuda_graph_max_bs=256)
    d0 = base.total(1)
    assert dec.decode_span(base, 300, 10).total(1) == pytest.approx(max(d0, 0.03))
    assert dataclasses.replace(dec, overlap=False).decode_span(base, 300, 10).total(1) == pytest.approx(d0 + 0.03)
    assert Overheads.none().decode_span(base, 300, 10) is base


def test_the_emulated_engine_charges_the_scheduler_when_it_is_the_longer() -> None:
    """A decode of one request whose scheduler time per step (here 50 ms) exceeds its kernels: every
    step takes the scheduler's time, and the engine counts the difference as its own time."""
    async def main(per_request_s: float):
        clock = LoopClock()
        eng = EmulatedEngine.from_config(config(), clock)
        eng.iterations.overheads = dataclasses.replace(eng.overheads, sched=SchedulerTimes(b_dec=per_request_s),
                                                       cpu_factor=1.0)
        await eng.launch(ServerSpec("w", ("w",), Role.COLOCATED, ""))
        r = await eng.generate("w", GenerateRequest("a", tuple(range(1, 1001)), SamplingParams(101)))
        split = eng.phase_split()
        await eng.close()
        return r, split

    slow, split = run_virtual(main(0.05))
    fast, split0 = run_virtual(main(0.0))
    assert slow.timings.decode_s == pytest.approx(100 * 0.05)
    assert fast.timings.decode_s < 100 * 0.05 / 2
    assert split["sched_s"] == pytest.approx(100 * 0.05 - fast.timings.decode_s, rel=1e-6)
    assert split0["sched_s"] == 0.0 and slow.output_ids == fast.output_ids



def test_the_shipped_scheduler_times_are_sglangs_measured_ones() -> None:
    t = load_scheduler_times()
    # measured from SGLang's own code (benchmarks/bench_sglang_scheduler.py): a few microseconds per
    # decoding request, ~0.1 us per prompt token the radix tree walks
    assert 0.5e-6 < t.b_dec < 20e-6 and 20e-9 < t.c_ext < 1e-6
