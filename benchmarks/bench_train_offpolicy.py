"""Off-policy correction on the learning benchmark: reward per step at staleness 0, 1 and 2.

Run: ``.venv/bin/python benchmarks/bench_train_offpolicy.py`` (``--steps``, ``--seeds``, ``--lr``).

The toy task of ``pearl.train.toytask`` (reward = share of response tokens from the lower half of
the vocabulary) on a randomly initialised micro Qwen3 (2 layers, 512-token vocabulary, built
here), trained by a real ``TrainerRank`` in this process. Staleness ``k``: the batch of step ``v``
is sampled by the weights of version ``max(0, v - k)`` (the asynchronous pipeline's bounded lag),
and its behaviour logprobs are those of that version. Each loss variant sees the same seeds:

    ppo-clip          ratio against the behaviour logprobs, PPO clip only (no dual clip, no IS)
    ppo-clip+dual     the same with the dual clip (c = 3) and the IS mask (token, C = 2)
    decoupled+tis     decoupled loss, pi_prox = sg(pi_theta), behaviour weight truncated at C = 2

Printed per variant and staleness: the batch reward per step (mean over seeds; the reward of the
policy that sampled it) and the reward of the final policy (a fresh on-policy batch, the same
prompts for every variant), plus the mean IS weight, max IS weight and KL(pi_behav || pi_theta)
the trainer logged. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pearl.config import TrainSpec  # noqa: E402
from pearl.train.batch import filter_records, make_samples  # noqa: E402
from pearl.train.grpo import global_denominator  # noqa: E402
from pearl.train.toytask import ToyTask  # noqa: E402
from pearl.train.trainer import RankConfig, TrainerRank  # noqa: E402

VARIANTS: dict[str, dict[str, Any]] = {
    "ppo-clip": {"policy_loss": "ppo-clip", "dual_clip": None, "is_correction": "none"},
    "ppo-clip+dual": {"policy_loss": "ppo-clip", "dual_clip": 3.0, "is_correction": "mask"},
    "decoupled+tis": {"policy_loss": "decoupled", "dual_clip": 3.0, "is_correction": "truncate"},
}


def micro_model(out: Path) -> Path:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                      tie_word_embeddings=False, initializer_range=0.1)
    Qwen3ForCausalLM(cfg).save_pretrained(out)
    return out


def run_one(model: Path, work: Path, variant: str, staleness: int, steps: int, seed: int, lr: float
            ) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    spec = TrainSpec(learning_rate=lr, checkpoint_every=10_000, micro_batch_tokens=4096, **VARIANTS[variant])
    rank = TrainerRank(RankConfig(str(model), str(work), spec))
    rank.setup()
    sampler = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    task = ToyTask(vocab_size=512, n_groups=4, group_size=8)
    history = [{k: v.detach().clone() for k, v in rank.model.state_dict().items()}]
    rewards, stats = [], []
    for v in range(steps):
        behaviour = max(0, v - staleness)
        sampler.load_state_dict(history[behaviour])
        recs = task.rollout(sampler, behaviour, seed=1000 * seed + v)
        kept, _ = filter_records(recs, rank.step, staleness)
        samples = make_samples(kept)
        res = rank.train_step(v + 1, samples, global_denominator([s.n_loss_tokens for s in samples], "token-mean"))
        rewards.append(sum(r.reward for r in recs) / len(recs))
        m = res["metrics"]
        stats.append((m["is_weight_mean"], m["is_weight_max"], m["behav_kl"]))
        history.append({k: t.detach().clone() for k, t in rank.model.state_dict().items()})
    sampler.load_state_dict(history[-1])
    final = task.rollout(sampler, rank.step, seed=999_999)
    rank.close()
    return {"rewards": rewards, "final": sum(r.reward for r in final) / len(final), "stats": stats}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--lr", type=float, default=3e-2)
    ap.add_argument("--staleness", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = micro_model(Path(tmp) / "micro")
        for k in args.staleness:
            for variant in VARIANTS:
                runs = [run_one(model, Path(tmp) / f"{variant}-{k}-{s}", variant, k, args.steps, s, args.lr)
                        for s in range(args.seeds)]
                curve = [sum(r["rewards"][i] for r in runs) / len(runs) for i in range(args.steps)]
                final = sum(r["final"] for r in runs) / len(runs)
                n = len(runs) * args.steps
                is_mean = sum(st[0] for r in runs for st in r["stats"]) / n
                is_max = max(st[1] for r in runs for st in r["stats"])
                kl = sum(st[2] for r in runs for st in r["stats"]) / n
                out[f"{variant}@{k}"] = {"curve": curve, "final": final, "is_weight_mean": is_mean,
                                         "is_weight_max": is_max, "behav_kl": kl}
                print(f"staleness {k}  {variant:14s} final {final:.3f}  reward/step "
                      + " ".join(f"{x:.2f}" for x in curve)
                      + f"  | IS mean {is_mean:.3f} max {is_max:.2f} KL(behav||theta) {kl:.4f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
