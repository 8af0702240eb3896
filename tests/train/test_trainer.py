"""One trainer rank in-process (world size 1): checkpoint / resume, snapshots, errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from pearl.config import TrainSpec
from pearl.train.batch import make_samples
from pearl.train.grpo import global_denominator
from pearl.train.toytask import ToyTask
from pearl.train.trainer import RankConfig, TrainerRank, TrainerStepError, latest_checkpoint

SPEC = TrainSpec(learning_rate=1e-3, checkpoint_keep=3, micro_batch_tokens=64)


def batch(rank: TrainerRank, seed: int) -> tuple[list, float]:
    task = ToyTask(vocab_size=512, n_groups=2, group_size=4)
    samples = make_samples(task.rollout(rank.model, rank.step, seed))
    return samples, global_denominator([s.n_loss_tokens for s in samples], "token-mean")


def state(rank: TrainerRank) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in rank.model.state_dict().items()}


def test_checkpoint_resume_gives_identical_weights(micro_model: Path, tmp_path: Path) -> None:
    a = TrainerRank(RankConfig(str(micro_model), str(tmp_path), SPEC))
    a.setup()
    b1 = batch(a, 1)
    a.train_step(1, *b1)
    b2 = batch(a, 2)
    res = a.train_step(2, *b2)
    after2 = state(a)
    assert res["version"] == 2 and res["snapshot"]["version"] == 2
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-000001", "step-000002"]

    shutil.rmtree(tmp_path / "checkpoints" / "step-000002")  # resume from step 1, replay step 2
    assert latest_checkpoint(tmp_path / "checkpoints") == tmp_path / "checkpoints" / "step-000001"
    b = TrainerRank(RankConfig(str(micro_model), str(tmp_path), SPEC, resume=True))
    info = b.setup()
    assert info["step"] == 1 and info["resumed_from"].endswith("step-000001")
    b.train_step(2, *b2)
    for k, v in after2.items():
        assert torch.equal(b.model.state_dict()[k], v), k  # optimizer moments restored too

    c = TrainerRank(RankConfig(str(micro_model), str(tmp_path / "fresh"), SPEC))
    c.setup()
    c.train_step(1, *batch(c, 9))  # without resume the second step differs from a's
    assert not torch.equal(c.model.state_dict()["lm_head.weight"], after2["lm_head.weight"])


def test_snapshot_loads_in_transformers(micro_model: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    r = TrainerRank(RankConfig(str(micro_model), str(tmp_path), SPEC))
    r.setup()
    before = state(r)
    res = r.train_step(1, *batch(r, 3))
    snap = Path(res["snapshot"]["path"])
    assert snap == tmp_path / "snapshots" / "v1"
    with safe_open(str(snap / "model.safetensors"), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}  # noqa: SIM118 (snapshot_dtype)
    loaded = AutoModelForCausalLM.from_pretrained(snap, dtype=torch.bfloat16)
    sd = loaded.state_dict()
    changed = 0
    for k, v in r.model.state_dict().items():
        assert torch.equal(sd[k], v.to(torch.bfloat16)), k
        changed += int(not torch.equal(v, before[k]))
    assert changed > 0  # the update moved weights


def test_step_number_mismatch_is_an_error(micro_model: Path, tmp_path: Path) -> None:
    r = TrainerRank(RankConfig(str(micro_model), str(tmp_path), SPEC))
    r.setup()
    with pytest.raises(TrainerStepError, match="at step 0; asked to run step 3"):
        r.train_step(3, *batch(r, 0))


def test_tied_model_is_refused(tmp_path: Path) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, tie_word_embeddings=True)
    Qwen3ForCausalLM(cfg).save_pretrained(tmp_path / "tied")
    r = TrainerRank(RankConfig(str(tmp_path / "tied"), str(tmp_path / "w"), SPEC))
    with pytest.raises(TrainerStepError, match="ties embed_tokens and lm_head"):
        r.setup()
