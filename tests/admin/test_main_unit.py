"""``pearl/main.py`` pieces that need no second process: the preflight that ``make swebench-*``
runs before torchrun, and the placement of the initial GPUs on the ranks' nodes."""

from __future__ import annotations

import pytest

from pearl.config import CONFIG_DIR, load_config
from pearl.main import main, placed_state, preflight


def test_preflight_names_everything_this_host_lacks_for_the_paper_run(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = load_config(CONFIG_DIR / "swebench-qwen3-8b.yaml")
    problems = "\n".join(preflight(cfg, 4))
    import importlib.util

    import torch

    if importlib.util.find_spec("sglang") is None:
        assert "SGLang is not installed" in problems
    if not torch.cuda.is_available():
        assert "cluster.gpus_per_node=8 GPUs needed on every node" in problems
    assert "model.path /models/Qwen3-8B has no config.json" in problems
    # too few nodes for 4 reserved + 16 training GPUs at 8 per node
    assert "need 3 nodes, but WORLD_SIZE=2" in "\n".join(preflight(cfg, 2))
    rc = main(["--config", str(CONFIG_DIR / "swebench-qwen3-8b.yaml"), "--preflight", "--nnodes", "4"])
    err = capsys.readouterr().err
    assert rc == 2 and "cannot run on this host" in err and "model.path" in err


def test_preflight_passes_an_emulated_config() -> None:
    assert preflight(load_config(CONFIG_DIR / "emulated-demo.yaml"), 1) == []


def test_placed_state_fills_nodes_in_rank_order() -> None:
    cfg = load_config(CONFIG_DIR / "swebench-qwen3-8b.yaml")
    st = placed_state(cfg, 4)
    nodes = {g: st.gpus[g].node for g in ("r0", "r3", "t0", "t3", "t4", "t11", "t12", "t15")}
    assert nodes == {"r0": "node0", "r3": "node0", "t0": "node0", "t3": "node0", "t4": "node1", "t11": "node1",
                     "t12": "node2", "t15": "node2"}
