"""``pearl.train.grpo`` against independent re-implementations of the formulas verl and TRL document.

The reference functions below are written from the references' formulas (verl
``trainer/ppo/core_algos.py``: ``compute_grpo_outcome_advantage``, ``compute_policy_loss_vanilla``
with ``clip_ratio_c``, ``kl_penalty(low_var_kl)``, ``agg_loss``, ``compute_policy_loss_reinforce``;
``trainer/ppo/rollout_corr_helper.py``: token / sequence IS weights, truncation, rejection masks,
``k3_kl``; TRL ``GRPOTrainer``: advantages, ``_compute_loss`` for ``grpo`` / ``bnpo`` / ``dr_grpo``
and the truncated / masked vLLM importance-sampling ratio), as plain loops and tensor expressions,
not by calling pearl. Inputs are random, in float64, with multi-turn holes (observation tokens
inside a response, masked out) and stale logprobs.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from pearl.train.grpo import aggregate, global_denominator, group_advantages, token_terms

B, T = 8, 24


def inputs(seed: int) -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 4 - 0.05
    old = logp + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.4  # stale behaviour logprobs
    old[:, ::5] -= 1.5  # some tokens far off-policy (ratio > c = 3)
    ref = logp + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3
    mask = torch.zeros(B, T, dtype=torch.float64)
    for i in range(B):  # prompt, then turns of response separated by observation holes, then pad
        start = int(torch.randint(1, 4, (1,), generator=g))
        end = T - int(torch.randint(0, 5, (1,), generator=g))
        mask[i, start:end] = 1.0
        for _ in range(2):
            h = int(torch.randint(start, max(start + 1, end - 3), (1,), generator=g))
            mask[i, h : h + 3] = 0.0
        mask[i, start] = 1.0  # every sequence keeps a response token
    old = torch.where(mask.bool(), old, torch.full_like(old, -100.0))  # junk where masked
    rewards = torch.randint(0, 3, (B,), generator=g).to(torch.float64)
    rewards[0], rewards[1] = 0.0, 1.0  # no group is constant
    return {"logp": logp, "old": old, "ref": ref, "mask": mask, "rewards": rewards,
            "group": torch.arange(B) // 4}


# ------------------------------------------------------------------ reference formulas (verl)
def verl_grpo_advantage(scores: Tensor, index: list[int], norm_by_std: bool, eps: float = 1e-6) -> Tensor:
    by: dict[int, list[float]] = {}
    for s, k in zip(scores.tolist(), index, strict=True):
        by.setdefault(k, []).append(s)
    mean = {k: torch.mean(torch.tensor(v, dtype=torch.float64)) for k, v in by.items()}
    std = {k: torch.std(torch.tensor(v, dtype=torch.float64)) for k, v in by.items()}
    out = scores.clone()
    for i, k in enumerate(index):
        out[i] = (scores[i] - mean[k]) / (std[k] + eps) if norm_by_std else scores[i] - mean[k]
    return out


def masked_mean(x: Tensor, m: Tensor) -> Tensor:
    return (x * m).sum() / m.sum()


def verl_agg_loss(loss_mat: Tensor, mask: Tensor, mode: str, scale: float | None = None) -> Tensor:
    if mode == "token-mean":
        return masked_mean(loss_mat, mask)
    if mode == "seq-mean-token-mean":
        return ((loss_mat * mask).sum(-1) / mask.sum(-1)).mean()
    if mode == "seq-mean-token-sum-norm":
        assert scale is not None
        return ((loss_mat * mask).sum(-1) / scale).mean()
    raise AssertionError(mode)


def verl_vanilla(old: Tensor, logp: Tensor, adv: Tensor, mask: Tensor, lo: float, hi: float, c: float
                 ) -> tuple[Tensor, Tensor, Tensor]:
    neg_kl = torch.clamp(logp - old, min=-20.0, max=20.0)
    ratio = torch.exp(neg_kl)
    pg1 = -adv * ratio
    pg2 = -adv * torch.clamp(ratio, 1 - lo, 1 + hi)
    clip1 = torch.maximum(pg1, pg2)
    clipfrac = masked_mean(torch.gt(pg2, pg1).double(), mask)
    pg3 = -adv * c
    clip2 = torch.min(pg3, clip1)
    clipfrac_lower = masked_mean(torch.gt(clip1, pg3).double() * (adv < 0).double(), mask)
    return torch.where(adv < 0, clip2, clip1), clipfrac, clipfrac_lower


def verl_low_var_kl(logp: Tensor, ref: Tensor) -> Tensor:
    kl = torch.clamp(ref - logp, min=-20, max=20)
    return torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)


def verl_is_weights(logp: Tensor, rollout: Tensor, mask: Tensor, level: str, threshold: float) -> Tensor:
    log_ratio = logp - rollout
    if level == "token":
        w = torch.exp(torch.clamp(log_ratio, -20.0, 20.0))
    else:
        s = (log_ratio * mask).sum(-1, keepdim=True)
        w = torch.exp(torch.clamp(s, -20.0, 20.0)).expand_as(log_ratio)
    return w.clamp(max=threshold)


def verl_reject_mask(logp: Tensor, rollout: Tensor, mask: Tensor, level: str, lower: float, upper: float) -> Tensor:
    log_ratio = logp - rollout
    if level == "token":
        r = torch.exp(torch.clamp(log_ratio, -20.0, 20.0))
        keep = (r >= lower) & (r <= upper)
    else:
        r = torch.exp(torch.clamp((log_ratio * mask).sum(-1, keepdim=True), -20.0, 20.0))
        keep = ((r >= lower) & (r <= upper)).expand_as(log_ratio)
    return mask * keep.double()


# ------------------------------------------------------------------- reference formulas (TRL)
def trl_advantages(rewards: Tensor, group_size: int, scale: bool, eps: float = 1e-4) -> Tensor:
    grouped = rewards.view(-1, group_size)
    mean = grouped.mean(dim=1).repeat_interleave(group_size)
    std = grouped.std(dim=1).repeat_interleave(group_size)
    adv = rewards - mean
    return adv / (std + eps) if scale else adv


def trl_loss(logp: Tensor, adv: Tensor, mask: Tensor, lo: float, hi: float, loss_type: str,
             old: Tensor | None = None, is_ratio: Tensor | None = None, beta: float = 0.0,
             ref: Tensor | None = None, max_completion_length: int = T) -> Tensor:
    old_lp = logp.detach() if old is None else old
    coef_1 = torch.exp(logp - old_lp)
    coef_2 = torch.clamp(coef_1, 1 - lo, 1 + hi)
    a = adv.unsqueeze(1)
    per_token = -torch.min(coef_1 * a, coef_2 * a)
    if is_ratio is not None:
        per_token = per_token * is_ratio
    if beta != 0.0:
        assert ref is not None
        per_token = per_token + beta * (torch.exp(ref - logp) - (ref - logp) - 1)
    if loss_type == "grpo":
        return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type in ("bnpo", "dapo"):
        return (per_token * mask).sum() / mask.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        return (per_token * mask).sum() / (per_token.size(0) * max_completion_length)
    raise AssertionError(loss_type)


def trl_is_ratio(logp: Tensor, sampling: Tensor, mask: Tensor, mode: str, clip_min: float | None,
                 clip_max: float) -> Tensor:
    diff = (logp - sampling) * mask
    if mode.startswith("sequence"):
        diff = diff.sum(dim=-1, keepdim=True)
    r = torch.exp(diff)
    if mode.endswith("truncate"):
        return torch.clamp(r, min=clip_min, max=clip_max)
    lo = clip_min if clip_min is not None else -math.inf
    return r.masked_fill((r < lo) | (r > clip_max), 0.0)


# ------------------------------------------------------------------------------------- pearl
def pearl_loss(x: dict[str, Tensor], adv: Tensor, mode: str, norm: int | None = None, **kw: object) -> Tensor:
    terms = token_terms(x["logp"], x["old"], adv, 0.2, 0.28, mask=x["mask"], **kw)  # type: ignore[arg-type]
    d = global_denominator([int(s) for s in x["mask"].sum(-1).tolist()], mode, norm)  # type: ignore[arg-type]
    return aggregate(terms.loss, x["mask"], mode, d)  # type: ignore[arg-type]


TOL = {"rtol": 0.0, "atol": 1e-8}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_advantages_equal_verl_and_trl(seed: int) -> None:
    x = inputs(seed)
    idx = x["group"].tolist()
    for scale, norm in (("std", True), ("none", False)):
        ours = group_advantages(x["rewards"], x["group"], scale=scale)  # type: ignore[arg-type]
        torch.testing.assert_close(ours, verl_grpo_advantage(x["rewards"], idx, norm), **TOL)
        ours_trl = group_advantages(x["rewards"], x["group"], scale=scale, eps=1e-4)  # type: ignore[arg-type]
        torch.testing.assert_close(ours_trl, trl_advantages(x["rewards"], 4, norm), **TOL)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_dual_clip_ppo_loss_and_clip_fractions_equal_verl(seed: int, mode: str) -> None:
    x = inputs(seed)
    adv = group_advantages(x["rewards"], x["group"]).unsqueeze(1).expand(B, T)
    pg, clipfrac, clipfrac_lower = verl_vanilla(x["old"], x["logp"], adv, x["mask"], 0.2, 0.28, 3.0)
    pg = pg + 0.05 * verl_low_var_kl(x["logp"], x["ref"])
    ref_loss = verl_agg_loss(pg, x["mask"], mode, scale=T)
    terms = token_terms(x["logp"], x["old"], adv, 0.2, 0.28, x["ref"], 0.05, mask=x["mask"], dual_clip=3.0)
    d = global_denominator([int(s) for s in x["mask"].sum(-1).tolist()], mode, T)  # type: ignore[arg-type]
    torch.testing.assert_close(aggregate(terms.loss, x["mask"], mode, d), ref_loss, **TOL)  # type: ignore[arg-type]
    m = x["mask"].bool()
    assert terms.clipped[m].double().mean().item() == pytest.approx(clipfrac.item(), abs=1e-12)
    assert terms.dual_clipped[m].double().mean().item() == pytest.approx(clipfrac_lower.item(), abs=1e-12)
    assert terms.dual_clipped.any() and terms.clipped.any()  # the inputs exercise both clips
    torch.testing.assert_close(terms.kl[m], verl_low_var_kl(x["logp"], x["ref"])[m], **TOL)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(("mode", "loss_type"), [("token-mean", "dapo"), ("seq-mean-token-mean", "grpo"),
                                                 ("seq-mean-token-sum-norm", "dr_grpo")])
def test_ppo_loss_with_kl_equals_trl(seed: int, mode: str, loss_type: str) -> None:
    x = inputs(seed)
    adv = group_advantages(x["rewards"], x["group"], eps=1e-4)
    ours = pearl_loss(x, adv, mode, T, ref_logprobs=x["ref"], kl_coef=0.04, dual_clip=None)
    ref = trl_loss(x["logp"], adv, x["mask"], 0.2, 0.28, loss_type, old=x["old"], beta=0.04, ref=x["ref"])
    torch.testing.assert_close(ours, ref, **TOL)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("correction", ["truncate", "mask"])
def test_decoupled_truncated_and_masked_is_equal_trl_and_verl(seed: int, level: str, correction: str) -> None:
    """Decoupled loss with pi_prox = sg(pi_theta): value and gradient equal TRL's PPO loss with
    old = sg(logp) times its truncated / masked vLLM IS ratio; the gradient equals verl's bypass
    "reinforce" loss with IS weights (truncate) or a rejection mask (mask)."""
    x = inputs(seed)
    adv = group_advantages(x["rewards"], x["group"])
    c = 2.0 if level == "token" else math.exp(5.0)  # a sequence's weight is a product over ~15 tokens
    lp_ours = x["logp"].clone().requires_grad_(True)
    ours_x = {**x, "logp": lp_ours}
    ours = pearl_loss(ours_x, adv, "token-mean", policy_loss="decoupled", is_correction=correction,
                      is_level=level, is_threshold=c, dual_clip=3.0)
    (g_ours,) = torch.autograd.grad(ours, lp_ours)

    lp_trl = x["logp"].clone().requires_grad_(True)
    ratio = trl_is_ratio(x["logp"], x["old"], x["mask"], f"{level}_{correction}",
                         None if correction == "truncate" else 1 / c, c)
    trl = trl_loss(lp_trl, adv, x["mask"], 0.2, 0.28, "dapo", is_ratio=ratio)
    (g_trl,) = torch.autograd.grad(trl, lp_trl)
    torch.testing.assert_close(ours, trl, **TOL)
    torch.testing.assert_close(g_ours, g_trl, **TOL)

    lp_verl = x["logp"].clone().requires_grad_(True)
    a = adv.unsqueeze(1).expand(B, T)
    if correction == "truncate":
        w = verl_is_weights(x["logp"], x["old"], x["mask"], level, c)
        assert (w == c).any() and (w < c).any()  # some weights truncated, not all
        verl = verl_agg_loss(-a * lp_verl * w, x["mask"], "token-mean")
    else:
        keep = verl_reject_mask(x["logp"], x["old"], x["mask"], level, 1 / c, c)
        w = torch.exp(torch.clamp(x["logp"] - x["old"], -20, 20))
        if level == "sequence":
            w = torch.exp(torch.clamp(((x["logp"] - x["old"]) * x["mask"]).sum(-1, keepdim=True), -20, 20))
        # verl renormalises over the kept tokens; pearl (as TRL) keeps rejected tokens in the
        # denominator: scale verl's loss by kept / all to compare the same quantity
        verl = verl_agg_loss(-a * lp_verl * w, keep, "token-mean") * keep.sum() / x["mask"].sum()
        assert 0 < keep.sum() < x["mask"].sum()  # the threshold rejects some tokens, not all
    (g_verl,) = torch.autograd.grad(verl, lp_verl)
    torch.testing.assert_close(g_ours, g_verl, **TOL)


@pytest.mark.parametrize("seed", [0, 1])
def test_behaviour_kl_statistics_equal_verl(seed: int) -> None:
    x = inputs(seed)
    terms = token_terms(x["logp"], x["old"], torch.zeros(B), 0.2, 0.28, mask=x["mask"])
    m = x["mask"].bool()
    lr, rho = terms.log_ratio[m], terms.ratio[m]
    k3_ref = masked_mean(torch.exp(x["logp"] - x["old"]) - (x["logp"] - x["old"]) - 1, x["mask"])
    k1_ref = masked_mean(x["old"] - x["logp"], x["mask"])
    assert (rho - lr - 1).mean().item() == pytest.approx(k3_ref.item(), abs=1e-12)
    assert (-lr).mean().item() == pytest.approx(k1_ref.item(), abs=1e-12)
