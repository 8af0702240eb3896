"""``pearl/main.py`` with real engines: two ranks on loopback, each node agent serving one real vLLM
server of the tiny Qwen3, the trainer rank started by rank 1's agent, the training loop of
``pearl run``.

The allocation is pinned to 1P1D (``policy.allocation_overrides``), and the two workers sit on two
nodes (``gpus_per_node: 1``): every request is a cross-node PD pair, the prefill on node0's server,
the decode on node1's, the KV pulled server to server over NIXL with the handle passing through the
controller. Checked: the run serves and trains (at least one update published and loaded by both
servers), the trainer rank runs under node1's agent, and SIGTERM on rank 0 shuts both ranks down
with exit 0. Then both ranks start again on the same ``output_dir``: the run resumes at the
trainer's last checkpoint (the real servers start on its snapshot) and trains further.
"""

from __future__ import annotations

import signal
from pathlib import Path

import aiohttp
import pytest
import yaml

from pearl.models import ensure_models
from tests.admin.test_service import ROOT, Proc, free_port, get, progress_until, spawn_ranks
from tests.conftest import MODELS_DIR

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def vllm_config(tmp: Path) -> Path:
    cfg = yaml.safe_load((ROOT / "configs/cpu-demo.yaml").read_text())
    cfg["model"] = {"from": "tiny-qwen3"}
    cfg["cluster"].update(reserved_gpus=2, max_preemptible_gpus=0, training_gpus=0, gpus_per_node=1)
    cfg["workload"].update(batch_size=4, group_size=2, max_trajectory_tokens=2048)
    cfg["engine"].update(max_model_len=2048, start_timeout_s=720, device_map={"r0": "0", "r1": "1"})
    cfg["env"] = {"kind": "tiny", "max_new_tokens": 16, "max_turns": 2, "min_turn_tokens": 4}
    cfg["policy"] = {"max_staleness": 1, "allocation_overrides": {2: "1P1D"}}
    cfg["admin"] = {"tensorboard": False, "agent_health_period_s": 2.0}
    cfg["trace"] = None
    cfg["output_dir"] = str(tmp / "run")
    path = tmp / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.timeout(2400)
async def test_two_ranks_real_vllm_cross_node_pd_trainer_then_sigterm_then_resume(tmp_path: Path) -> None:
    ensure_models(MODELS_DIR, ("tiny-qwen3",))  # built by `make test` already; ~3 s otherwise
    cfg = vllm_config(tmp_path)
    port = free_port()
    procs: list[Proc] = []
    try:
        rank0, rank1 = await spawn_ranks(cfg, port, procs)
        await rank0.wait_line("PEARL serving on 2 node(s)", timeout_s=900)
        url = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as http:
            _, state = await get(http, f"{url}/v1/state")
            gpu_node = {g["gpu_id"]: g["node"] for g in state["gpus"]}
            roles = {w["role"]: gpu_node[w["gpus"][0]] for w in state["workers"]}
            assert roles == {"prefill": roles["prefill"], "decode": roles["decode"]}
            assert roles["prefill"] != roles["decode"], state  # the pair spans the two nodes
            p = await progress_until(http, url, "train_step", 1, timeout_s=600)
            assert p["weight_version"] >= 1 and p["trajectories_completed"] >= 4, p
            assert p["trajectories_lost"] == 0, p
            _, nodes = await get(http, f"{url}/v1/nodes")
            by_node = {n["node"]: n for n in nodes["nodes"]}
            assert all(n["alive"] and n["split_pd"] for n in by_node.values()), by_node
            assert by_node["node1"]["children"]["trainer-0"]["returncode"] is None, by_node
        await rank0.wait_line("train step 1:", timeout_s=300)  # logged once both servers loaded v1
        rank0.proc.send_signal(signal.SIGTERM)
        assert await rank0.exit_code(timeout_s=180) == 0, "\n".join(rank0.lines[-40:])
        assert await rank1.exit_code(timeout_s=120) == 0, "\n".join(rank1.lines[-40:])
        assert any("controller asked" in ln for ln in rank1.lines)
        done_v = p["weight_version"]

        # restart both ranks on the same output_dir: the trainer rank resumes from its last
        # checkpoint, both real servers start on that update's snapshot, and training goes on
        rank0, rank1 = await spawn_ranks(cfg, port, procs)
        line = await rank0.wait_line("resuming at policy v", timeout_s=900)
        v0 = int(line.split("resuming at policy v", 1)[1].split()[0])
        assert v0 >= done_v, line  # at least the update seen before the stop (more may have been checkpointed)
        await rank0.wait_line("PEARL serving on 2 node(s)", timeout_s=900)
        async with aiohttp.ClientSession() as http:
            # the resumed run's train step starts at v0 (it does not fall back to 0): wait for one more
            p2 = await progress_until(http, url, "train_step", v0 + 1, timeout_s=600)
            assert p2["weight_version"] >= v0 + 1 and p2["trajectories_lost"] == 0, p2
        rank0.proc.send_signal(signal.SIGTERM)
        assert await rank0.exit_code(timeout_s=180) == 0, "\n".join(rank0.lines[-40:])
        assert await rank1.exit_code(timeout_s=120) == 0, "\n".join(rank1.lines[-40:])
    finally:
        for p in procs:
            await p.kill()
