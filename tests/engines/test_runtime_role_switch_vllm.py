"""The runtime executes colocated -> 1P1D -> colocated on real vLLM servers (CPU), while rolling out.

Real pieces: the Controller (elastic scheduler, planner, plan executor, pipeline), ``VllmEngine``
(role change = relaunch with the other KV role), the tiny Qwen3 and the tiny environment. The
target allocation is pinned through ``policy.allocation_overrides`` (the decision engine's own
choice on this CPU is colocation everywhere, see docs/engines.md), so the test exercises the plan
path, not the predictor. Checked after each switch: the GPU-worker-role table holds exactly the
target roles, every worker is active, and a rollout batch completes through the new topology
with no failed trajectory (in 1P1D its requests are served prefill -> KV transfer -> decode).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from envs.factory import build_suite, load_tokenizer, make_session_factory
from pearl.config import CONFIG_DIR, load_config
from pearl.core.state import WorkerStatus
from pearl.engines.devicemap import DeviceMappedEngine
from pearl.engines.vllm import VllmEngine
from pearl.models import ensure_models
from pearl.runtime.controller import Controller

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1500)]

# No trainer runs here, so the policy version stays 0 and the staleness gate would stop the pipeline
# after max_staleness + 1 batches. These batches take a second each; on a machine where server starts
# are slow (a cold compile cache on a fresh machine: 50 s instead of 30 s per start) a small bound
# was passed during the first relaunch and the wait for a later batch never returned (it held CI).
NO_TRAINER_STALENESS = 1_000_000
# every wait is bounded inside the test, so a failure is reported and the servers are stopped
WAIT_S = 600


def roles(ctrl: Controller) -> Counter[str]:
    st = ctrl.executor.state
    assert all(w.status is WorkerStatus.ACTIVE for w in st.workers.values()), st.to_dict()
    return Counter(w.role.value for w in st.workers.values())


async def test_runtime_switches_coloc_pd_coloc(tmp_path: Path) -> None:
    tiny = ensure_models(names=("tiny-qwen3",))["tiny-qwen3"]
    cfg = load_config(CONFIG_DIR / "cpu-demo.yaml", {
        "model": str(CONFIG_DIR / "models" / "tiny-qwen3.yaml"),
        "cluster.reserved_gpus": 2, "cluster.max_preemptible_gpus": 0, "cluster.training_gpus": 0,
        "workload.batch_size": 2, "workload.group_size": 2, "workload.max_trajectory_tokens": 1024,
        "engine.max_model_len": 1024, "engine.start_timeout_s": 720, "engine.device_map": {"r0": "0", "r1": "1"},
        "env.kind": "tiny", "env.max_new_tokens": 8, "env.max_turns": 1, "env.min_turn_tokens": 4,
        "policy.max_staleness": NO_TRAINER_STALENESS, "policy.allocation_overrides": {2: "coloc"}, "trace": None,
    })
    tok = load_tokenizer(tiny)
    factory = make_session_factory(await build_suite(cfg.env), tok, cfg)
    engine = DeviceMappedEngine(VllmEngine.from_config(cfg.engine, tmp_path / "servers"), cfg.engine.device_map)
    ctrl = Controller(cfg, engine, factory, initial_weights=(0, str(tiny)))
    try:
        await ctrl.start()
        assert roles(ctrl) == {"colocated": 2}
        await asyncio.wait_for(ctrl.wait_batches(1), WAIT_S)
        served: dict[str, Counter[str]] = {}
        for label, want, mode in [("1P1D", {"prefill": 1, "decode": 1}, "disaggregated"),
                                  ("coloc", {"colocated": 2}, "colocated")]:
            ctrl.elastic.use_overrides({2: label})
            rep = await asyncio.wait_for(ctrl.elastic.replan(f"test: switch to {label}"), WAIT_S)
            assert rep is not None and not rep.errors, rep
            assert roles(ctrl) == want
            # Batch k+1 may have started before the switch; batch k+2 starts after it, so its requests
            # are served by the new topology only. (Waiting for a fixed batch count races fast machines: all
            # three batches can finish colocated before the first switch.) ``recent`` is trimmed only past
            # thousands of records, so slicing from n0 gives exactly the records after the switch.
            k, n0 = ctrl.pipeline.stats.rollout_step, len(ctrl.tracker.recent)
            await asyncio.wait_for(ctrl.wait_batches(k + 2), WAIT_S)
            served[label] = Counter(r.mode for r in ctrl.tracker.recent[n0:])
            assert served[label][mode] >= 1, served
        assert ctrl.pipeline.stats.trajectories_failed == 0, ctrl.pipeline.failures
        assert ctrl.pipeline.stats.trajectories_completed >= 6
    finally:
        await ctrl.stop()
