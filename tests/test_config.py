from __future__ import annotations

from pathlib import Path

import pytest

from pearl.config import CONFIG_DIR, ConfigError, load_config, parse_config


@pytest.mark.parametrize("path", sorted(CONFIG_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_loads(path: Path) -> None:
    cfg = load_config(path)
    assert cfg.model.name and cfg.hardware.name


def test_paper_cluster_and_sourced_model_facts() -> None:
    c = load_config("qwen3-30b-a3b-h200")
    assert (c.cluster.training_gpus, c.cluster.reserved_gpus, c.cluster.max_preemptible_gpus) == (16, 4, 12)
    assert c.model.n_experts == 128 and c.model.experts_per_token == 8
    assert c.hardware.memory_gb == 141 and c.hardware.hbm_bandwidth_tbs == 4.8


def test_cross_field_errors_name_both_values() -> None:
    with pytest.raises(ConfigError, match=r"workload: batch_size=33 is not a multiple of group_size=8"):
        load_config("qwen3-8b-h200", {"workload.batch_size": 33})
    with pytest.raises(ConfigError, match=r"ratio_switch_threshold=0.2 > mode_switch_threshold=0.03"):
        load_config("qwen3-8b-h200", {"policy.ratio_switch_threshold": 0.2})
    with pytest.raises(ConfigError, match=r"max_trajectory_tokens=65536 exceeds model.max_context=40960"):
        load_config("qwen3-8b-h200", {"workload.max_trajectory_tokens": 65536})


def test_field_errors_name_the_path_and_value() -> None:
    with pytest.raises(ConfigError, match=r"cluster.tp_size: Input should be greater than or equal to 1 \(got 0\)"):
        load_config("qwen3-8b-h200", {"cluster.tp_size": 0})
    with pytest.raises(ConfigError, match=r"policy.mode_swich_threshold: Extra inputs are not permitted"):
        load_config("qwen3-8b-h200", {"policy.mode_swich_threshold": 0.1})


def test_missing_parts_and_broken_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="missing required field 'hardware'"):
        parse_config({"model": "qwen3-8b"})
    with pytest.raises(ConfigError, match=r"model 'nope' not found .*known: \["):
        parse_config({"model": "nope", "hardware": "h200"})
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: qwen3-8b\nhardware: [h200\n")
    with pytest.raises(ConfigError, match=r"bad.yaml line \d+, column \d+ is not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    top = tmp_path / "list.yaml"
    top.write_text("- 1\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(top)
