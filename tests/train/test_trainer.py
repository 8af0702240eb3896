"""One trainer rank in-process (world size 1): checkpoint / resume, snapshots, errors."""

from __future__ import annotations

import math
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


# ------------------------------------------------------------------ multi-turn, off-policy, non-finite
def multi_turn_records(seed: int, version: int) -> list:
    """Two groups of three episodes: prompt, response, observation, response (two turns), with
    behaviour logprobs that are not the trainer's (stale: drawn at random around -log V)."""
    from pearl.core.trajectory import Segment, TrajectoryRecord

    g = torch.Generator().manual_seed(seed)

    def toks(n: int) -> tuple[int, ...]:
        return tuple(torch.randint(0, 512, (n,), generator=g).tolist())

    def lps(n: int) -> tuple[float, ...]:
        return tuple((-6.2 + torch.randn(n, generator=g, dtype=torch.float64) * 0.8).tolist())

    recs = []
    for i in range(6):
        n1, n2 = 3 + i % 3, 4 + i % 2
        segs = (Segment(toks(4), False, turn=1), Segment(toks(n1), True, lps(n1), version, turn=1),
                Segment(toks(3), False, turn=2), Segment(toks(n2), True, lps(n2), version, turn=2))
        recs.append(TrajectoryRecord(f"mt-{seed}-{i}", f"g{i // 3}", segs, reward=float(i % 3 == 0) + 0.5 * (i % 2)))
    return recs


def independent_step(model_sd: dict[str, torch.Tensor], ref_path: Path, samples: list, spec: TrainSpec
                     ) -> tuple[float, float, float, float]:
    """Loss, mean k3 KL to the reference, k3 KL(behaviour || current) and gradient norm of one
    ppo-clip + dual-clip step, token-mean, computed token by token from the module docstring."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(ref_path, dtype=torch.float32)
    model.load_state_dict(model_sd)
    ref = AutoModelForCausalLM.from_pretrained(ref_path, dtype=torch.float32)
    n_tok = sum(sum(s.loss_mask[1:]) for s in samples)
    loss = torch.zeros((), dtype=torch.float64)
    kl_sum = behav_sum = 0.0
    for s in samples:
        ids = torch.tensor([s.token_ids])
        lp_all = torch.log_softmax(model(input_ids=ids).logits[0].double(), -1)
        with torch.no_grad():
            ref_all = torch.log_softmax(ref(input_ids=ids).logits[0].double(), -1)
        for t in range(1, len(s.token_ids)):
            if not s.loss_mask[t]:
                continue
            lp = lp_all[t - 1, s.token_ids[t]]
            r = torch.exp(lp - s.logprobs[t])
            a = s.advantage
            p = torch.maximum(-a * r, -a * torch.clamp(r, 1 - spec.clip_eps_low, 1 + spec.clip_eps_high))
            if a < 0:
                p = torch.minimum(p, torch.tensor(-a * spec.dual_clip, dtype=torch.float64))
            d = ref_all[t - 1, s.token_ids[t]] - lp
            k3 = torch.exp(d) - d - 1
            loss = loss + (p + spec.kl_coef * k3) / n_tok
            kl_sum += float(k3.detach())
            lr = float(lp.detach()) - s.logprobs[t]
            behav_sum += math.exp(lr) - lr - 1
    loss.backward()  # type: ignore[no-untyped-call]
    norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters() if p.grad is not None))
    return float(loss.detach()), kl_sum / n_tok, behav_sum / n_tok, float(norm)


def test_multi_turn_off_policy_step_with_kl_matches_an_independent_computation(micro_model: Path,
                                                                              tmp_path: Path) -> None:
    spec = SPEC.model_copy(update={"kl_coef": 0.1, "micro_batch_tokens": 48})
    r = TrainerRank(RankConfig(str(micro_model), str(tmp_path), spec))
    r.setup()
    r.train_step(1, *batch(r, 1))  # the policy moves away from the reference
    samples = make_samples(multi_turn_records(3, 1))
    assert all(0 in s.loss_mask[5:] for s in samples)  # observation holes inside the response
    denom = global_denominator([s.n_loss_tokens for s in samples], "token-mean")
    before = state(r)
    res = r.train_step(2, samples, denom)
    loss, kl, behav_kl, norm = independent_step(before, micro_model, samples, spec)
    m = res["metrics"]
    assert m["loss"] == pytest.approx(loss, rel=1e-6)
    assert m["kl"] == pytest.approx(kl, abs=1e-7) and kl > 1e-4  # k3 of a float32 logprob: ~1e-7 absolute
    assert m["behav_kl"] == pytest.approx(behav_kl, rel=1e-6)
    assert m["grad_norm"] == pytest.approx(norm, rel=1e-5)
    assert m["clip_frac"] > 0 and m["dual_clip_frac"] > 0  # stale logprobs: both clips are active
    assert m["tokens"] == denom and m["is_weight_max"] > spec.dual_clip


def test_nonfinite_loss_skips_the_step_and_keeps_the_weights(micro_model: Path, tmp_path: Path) -> None:
    """A NaN loss: no optimizer step, the weights and version stay, no snapshot is written; the
    refusal is counted and the same step number succeeds next with finite data."""
    import dataclasses

    r = TrainerRank(RankConfig(str(micro_model), str(tmp_path), SPEC))
    r.setup()
    samples, denom = batch(r, 4)
    before = state(r)
    poisoned = [dataclasses.replace(samples[0], advantage=float("nan")), *samples[1:]]
    res = r.train_step(1, poisoned, denom)
    assert res["skipped"] is True and res["version"] == 0 and r.step == 0
    assert "snapshot" not in res and not (tmp_path / "snapshots").exists()
    assert res["metrics"]["nonfinite_skipped"] == 1 and math.isnan(res["metrics"]["loss"])
    for k, v in r.model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert all(p.grad is None or not p.grad.any() for p in r.model.parameters())
    ok = r.train_step(1, samples, denom)
    assert ok["skipped"] is False and ok["version"] == 1 and ok["snapshot"]["version"] == 1
    assert ok["metrics"]["nonfinite_skipped"] == 1 and math.isfinite(ok["metrics"]["grad_norm"])


def test_junk_logprob_on_a_masked_token_leaves_the_step_unchanged(micro_model: Path, tmp_path: Path) -> None:
    """-100 or NaN as the 'logprob' of an observation token (masked): the update is bitwise the
    one with a plain 0.0 there."""
    import dataclasses

    base = make_samples(multi_turn_records(5, 0))
    denom = global_denominator([s.n_loss_tokens for s in base], "token-mean")
    obs = base[0].loss_mask.index(0, 5)  # first observation token after the first response
    results = []
    for i, junk in enumerate((0.0, -100.0, float("nan"))):
        lps = list(base[0].logprobs)
        lps[obs] = junk
        samples = [dataclasses.replace(base[0], logprobs=tuple(lps)), *base[1:]]
        r = TrainerRank(RankConfig(str(micro_model), str(tmp_path / str(i)), SPEC))
        r.setup()
        res = r.train_step(1, samples, denom)
        assert res["skipped"] is False
        results.append((res["metrics"]["loss"], res["metrics"]["grad_norm"], r.digest()))
    assert results[1] == results[0] and results[2] == results[0]
