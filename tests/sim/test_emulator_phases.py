"""The emulator's token / time split (paper Sec. 3.2 quantities) and the paper preset's reuse."""

from __future__ import annotations

import pytest

from pearl.config import load_config
from pearl.core.state import Role
from pearl.engines.base import GenerateRequest, SamplingParams, ServerSpec
from pearl.engines.emulated import EmulatedEngine
from pearl.runtime.clock import LoopClock, run_virtual
from pearl.sim.presets import preset_overrides


def _split(reuse: float) -> dict[str, float]:
    async def main() -> dict[str, float]:
        clock = LoopClock()
        eng = EmulatedEngine.from_config(load_config("qwen3-8b-h200", {"emulator.prefix_reuse": reuse}), clock)
        await eng.launch(ServerSpec("w", ("w",), Role.COLOCATED, ""))
        first = await eng.generate("w", GenerateRequest("a/1", tuple(range(1, 3001)), SamplingParams(200)))
        ctx = tuple(range(1, 3001)) + first.output_ids + tuple(range(90_000, 90_500))
        await eng.generate("w", GenerateRequest("a/2", ctx, SamplingParams(100)))
        await eng.close()  # counters of stopped workers are kept
        return eng.phase_split()

    return run_virtual(main())


def test_phase_split_counts_every_token_once() -> None:
    full, none = _split(1.0), _split(0.0)
    for s in (full, none):
        # prompts 3000 + 3700 tokens, computed or cached; the first token of each reply comes from prefill
        assert s["prefill_tokens"] + s["cached_tokens"] == 3000 + 3700
        assert s["decode_tokens"] == (200 - 1) + (100 - 1)
        assert s["prefill_busy_s"] > 0 and s["decode_busy_s"] > 0
        assert s["prompt_token_share"] == pytest.approx(6700 / (6700 + 298))
    assert full["cached_tokens"] == 3200 and none["cached_tokens"] == 0
    # recomputing the prefix costs prefill time, and shifts the time split towards prefill
    assert none["prefill_busy_s"] > full["prefill_busy_s"]
    assert none["prefill_time_share"] > full["prefill_time_share"]
    assert none["prefill_token_share"] > full["prefill_token_share"]


def test_paper_preset_sets_the_calibrated_reuse_for_emulator_and_predictor_prior() -> None:
    ov = preset_overrides("paper")
    assert ov["emulator.prefix_reuse"] == ov["workload.prefix_cache_hit"] == 0.3
    cfg = load_config("qwen3-30b-a3b-h200", ov)
    assert cfg.emulator.prefix_reuse == 0.3
