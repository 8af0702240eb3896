"""Key faults against real vLLM servers on this CPU, through the real controller: rollout continues.

One controller drives two tiny-Qwen3 vLLM servers (1 prefill + 1 decode: the minimum for a PD
topology) behind ``ChaosEngine``; one test, in steps, because every server start costs a minute
on two shared cores:

1. a KV transfer the decode side refuses (injected at the engine boundary: NIXL offers no switch
   to make a healthy decode server refuse; the runtime sees exactly ``KVTransferError``);
2. ``kill -9`` of a vLLM server process mid-request (real): the streamed partial output is kept,
   the dead worker leaves the topology, a replacement server is launched and admitted;
3. a weight sync (a real reload of the snapshot on every server) in which one server's load
   fails (injected at the boundary, so that only one of the two servers has to be relaunched):
   that worker is replaced, rollout goes on.

After each step the rollout batch in flight completes with every trajectory, and every attempt of
every turn started from the prompt plus all tokens already received (no partial output dropped).
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
import yaml

from pearl.config import CONFIG_DIR, RunConfig, load_config
from pearl.engines.devicemap import DeviceMappedEngine
from pearl.engines.vllm import VllmEngine
from pearl.engines.vllm_server import VllmSettings
from pearl.reliability.faults import ChaosEngine
from pearl.runtime.clock import LoopClock

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.soak]


def _config(model: Path) -> RunConfig:
    # no trainer: the policy version stays 0, so the staleness bound is lifted (a bound of 100 could be
    # reached by these one-second batches during a slow server start and stop the pipeline)
    d = load_config("qwen3-8b-h200").model_dump()
    tiny_spec = yaml.safe_load((CONFIG_DIR / "models" / "tiny-qwen3.yaml").read_text())
    d["model"] = tiny_spec | {"path": str(model)}
    d["cluster"].update(reserved_gpus=2, max_preemptible_gpus=0, training_gpus=0)
    d["workload"].update(batch_size=4, group_size=2, max_trajectory_tokens=512, system_prompt_tokens=48,
                         turns={"mean": 1, "cv": 0, "min": 1, "max": 1},
                         observation_tokens={"mean": 16, "cv": 0, "min": 16, "max": 16},
                         # long enough that a request seen streaming is still being generated when
                         # the server is killed (with 24 tokens the server could finish the whole
                         # response while the client, on a busy machine, had read only 2 of them:
                         # the stream then ended normally and no partial output was cut)
                         response_tokens={"mean": 96, "cv": 0, "min": 96, "max": 96},
                         env_step_s={"mean": 0.2, "cv": 0, "min": 0.2, "max": 0.2}, test_run_prob=0.0)
    d["policy"].update(allocation_overrides={2: "1P1D"}, max_staleness=1_000_000, borrow_enabled=False)
    return RunConfig.model_validate(d)


def _check_attempts(chaos: ChaosEngine) -> list[str]:
    bad = []
    for atts in chaos.attempts.values():
        base, got = atts[0].input_len, 0
        for a in atts:
            if a.input_len != base + got:
                bad.append(f"{a.rid}: starts at {a.input_len}, expected {base} + {got}")
                break
            if a.returned_tokens:
                got += len(a.output_ids)
    return bad


async def _wait(cond, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not cond():
        if loop.time() > end:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        await asyncio.sleep(0.2)


async def _streaming_request(chaos: ChaosEngine, vllm: VllmEngine, wid: str, timeout_s: float) -> str:
    """A request on ``wid`` that has streamed at least 2 tokens and is still streaming: killing the
    server now interrupts it mid-decode whatever this machine's speed (a fixed sleep would let a
    short response finish first on a fast machine)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while loop.time() < end:
        for rid in chaos.inflight_rids(wid):
            try:
                n = await asyncio.wait_for(vllm.wait_tokens(rid, 2), 30)
            except TimeoutError:
                continue
            if n >= 2 and vllm.streaming(rid):
                return rid
        await asyncio.sleep(0.02)
    raise AssertionError(f"no request streamed on {wid} within {timeout_s:.0f} s")


@pytest.mark.timeout(3000)  # four server starts (2 + 2 replacements) on two shared cores
async def test_rollout_survives_real_vllm_faults(tmp_path: Path) -> None:
    from pearl.models import ensure_models
    from pearl.runtime.controller import Controller
    from pearl.sim.sessions import SyntheticSessionFactory

    tiny = ensure_models(names=("tiny-qwen3",))["tiny-qwen3"]
    cfg = _config(tiny)
    clock = LoopClock()
    vllm = VllmEngine(tmp_path / "run", VllmSettings(max_model_len=1024, kv_cache_gib=1, start_timeout_s=600))
    # one core per server (GPU r0 -> core 0, r1 -> core 1; a replacement takes its GPU's core): with
    # vLLM's "auto" binding both servers spread their threads over both cores and spin-wait on each
    # other (decode ran at 3-7 tokens/s)
    chaos = ChaosEngine(DeviceMappedEngine(vllm, {"r0": "0", "r1": "1"}))
    ctrl = Controller(cfg, chaos, SyntheticSessionFactory(cfg.workload, clock), clock=clock,
                      initial_weights=(0, str(tiny)))
    await ctrl.start()
    try:
        # on a saturated machine a first start may time out: the controller re-plans and retries
        await _wait(lambda: len(ctrl.pipeline.router.workers) == 2, 1800, "both servers admitted")
        st = ctrl.executor.state
        assert sorted(w.role.value for w in st.workers.values() if w.status.value == "active") == ["decode", "prefill"]
        # 1. a refused KV transfer: the request is retried, the batch completes
        chaos.armed.kv_transfer = 1
        await asyncio.wait_for(ctrl.wait_batches(1), 600)
        assert chaos.injected.get("kv_transfer_failure") == 1
        # 2. kill -9 the decode server while it streams a request
        dec = next(w for w in ctrl.executor.state.workers.values() if w.role.value == "decode").worker_id
        await _streaming_request(chaos, vllm, dec, 300)  # a request that has streamed tokens and goes on
        proc = vllm.server(dec).proc
        assert proc is not None
        os.kill(proc.pid, signal.SIGKILL)
        await _wait(lambda: dec not in ctrl.executor.state.workers, 120, f"{dec} removed from the topology")
        # a replacement is launched and admitted, and a batch completes after the kill (the batch
        # running at the kill may already have finished: count from now, not from batch 2)
        done_at_kill = ctrl.pipeline.stats.rollout_step

        def pd_pair() -> bool:
            roles = sorted(w.role.value for w in ctrl.executor.state.workers.values() if w.status.value == "active")
            return roles == ["decode", "prefill"]

        await _wait(pd_pair, 900, "a replacement decode server admitted")
        await asyncio.wait_for(ctrl.wait_batches(done_at_kill + 1), 900)
        assert pd_pair(), ctrl.executor.state.to_dict()
        # 3. a weight sync in which one server's load fails: the other really reloads v1
        before = set(ctrl.pipeline.router.workers)
        chaos.armed.weight_load = 1
        await asyncio.wait_for(ctrl.publish(1, str(tiny)), 600)
        assert chaos.injected.get("weight_load_failure") == 1
        assert any("weight sync v1" in f for f in ctrl.pipeline.failures), ctrl.pipeline.failures[-3:]
        await _wait(lambda: len(ctrl.pipeline.router.workers) == 2 and set(ctrl.pipeline.router.workers) != before,
                    900, "the failed worker replaced")
        done_at_sync = ctrl.pipeline.stats.rollout_step
        await asyncio.wait_for(ctrl.wait_batches(done_at_sync + 1), 900)
        assert ctrl.pipeline.stats.trajectories_failed == 0
        assert ctrl.pipeline.stats.trajectories_completed >= (done_at_sync + 1) * cfg.workload.batch_size
        assert _check_attempts(chaos) == []
        assert any(a.raised == "EngineDeadError" and a.returned_tokens for atts in chaos.attempts.values()
                   for a in atts), "the killed server's streamed partial output reached the runtime"
    finally:
        await ctrl.stop()
