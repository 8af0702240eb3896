"""GRPO maths: group-relative advantages, the clipped surrogate, the KL term, loss aggregation.

Pure tensor functions (no I/O, no process groups, no clock): the trainer ranks call them on each
micro-batch; the tests check them against hand-computed values.

Symbols (one trajectory ``i`` of group ``g``, response token ``t``):

    r_i                 scalar reward of trajectory i
    A_i                 group-relative advantage, broadcast to every response token of i
    logp_t              log pi_theta(y_t | y_<t)   (current trainer weights)
    old_t               log pi_behav(y_t | y_<t)   (the logprob the inference engine reported: the
                        behaviour policy, possibly some versions older than theta)
    ref_t               log pi_ref(y_t | y_<t)     (frozen reference, only when kl_coef > 0)
    m_t in {0, 1}       loss mask: 1 on policy-generated tokens, 0 on prompt / observations / pad

Advantage (``group_advantages``)::

    A_i = (r_i - mean_g(r)) / (std_g(r) + eps)       scale="std"  (GRPO, DeepSeekMath)
    A_i =  r_i - mean_g(r)                            scale="none" (unscaled: Dr. GRPO's advantage)

``std_g`` is the unbiased sample standard deviation (``torch.std``, as TRL and verl use). A group of
one sample has no baseline: its advantage is 0 (it contributes no gradient).

Log-ratios (every one masked with ``where`` first, then clamped; masked-out positions hold 0, so a
NaN or -100 on a pad / observation / placeholder token never reaches the loss or its gradient)::

    lr_t  = clamp(logp_t - old_t, -20, 20)            rho_t = exp(lr_t)   (pi_theta / pi_behav)

Policy loss ``policy_loss="ppo-clip"`` (the ratio is taken against the *rollout* logprobs: verl's
bypass mode), with asymmetric clip ("clip-higher", DAPO) and the optional dual clip (Ye et al. 2020,
``dual_clip`` = c > 1, verl's ``clip_ratio_c``), per token::

    P_t = max(-A_i rho_t, -A_i clip(rho_t, 1 - eps_low, 1 + eps_high))
    P_t = min(P_t, -A_i c)                            if A_i < 0 and dual clip is on
    L_t = P_t

so a negative-advantage token far off-policy (rho_t >> 1) weighs at most c |A_i|, not rho_t |A_i|.

Policy loss ``policy_loss="decoupled"`` (AReaL's decoupled PPO; with one optimizer step per batch
the proximal policy is the current one, detached: pi_prox = sg(pi_theta), which is verl's bypass
"reinforce" loss and TRL's truncated IS)::

    r_t = exp(logp_t - sg(logp_t))                    (= 1; gradient d logp_t)
    w_t = exp(sg(lr_t))                               behaviour weight pi_prox / pi_behav
    P_t = max(-A_i r_t, -A_i clip(r_t, 1 - eps_low, 1 + eps_high)), dual-clipped as above
    L_t = w~_t P_t

Importance-sampling correction of the behaviour weight (``is_level``, ``is_correction``, C =
``is_threshold`` > 1)::

    token level     w_t = exp(sg(lr_t))
    sequence level  w_t = exp(clamp(sum_{t in i} m_t sg(logp_t - old_t), -20, 20))   (same for every t of i)
    truncate        w~_t = min(w_t, C)                (decoupled only: ppo-clip already weights by rho_t)
    mask            the token (token level) or the whole sequence (sequence level) is dropped from the
                    loss when w_t > C or w_t < 1/C    (it stays in the denominator, as TRL and verl do)

KL to the reference (k3 estimator, Schulman 2020), per token, added as ``kl_coef * K_t``::

    d_t = clamp(ref_t - logp_t, -20, 20)
    K_t = min(exp(d_t) - d_t - 1, 10)   (>= 0, unbiased for KL(pi_theta || pi_ref) under pi_theta)

The tokens were sampled from pi_rollout, not pi_theta; with one update per batch and bounded
staleness the two are close and we accept the small bias (as GRPO implementations do).

Statistics of the off-policy gap (logged every step, over loss tokens): the behaviour weight w_t
(mean, max), the share of tokens the mask rejected / the truncation bounded, and the KL between the
behaviour and the current policy, KL(pi_behav || pi_theta), estimated on the behaviour's samples
with k3 = mean(rho_t - lr_t - 1) and k1 = mean(old_t - logp_t) (verl's ``k3_kl`` / ``kl``).

Aggregation (``aggregate``), over the whole *global* batch (all ranks, all micro-batches)::

    token-mean               L = sum_i sum_t m_t L_t / sum_i sum_t m_t              (default)
    seq-mean-token-mean      L = (1/N) sum_i [ sum_t m_t L_t / sum_t m_t ]          (original GRPO)
    seq-mean-token-sum-norm  L = (1/N) sum_i [ sum_t m_t L_t / T_norm ]             (Dr. GRPO)

``T_norm`` is a constant (``TrainSpec.loss_norm_tokens``; Dr. GRPO uses the generation budget), so
no sequence's tokens weigh more because the sequence is short.

We default to **token-mean** (DAPO): every generated token weighs the same, so long agentic
trajectories (many turns, many response tokens) are not down-weighted per token as they are under
the per-sequence mean, and a long degenerate response is penalised in proportion to its length.
Every form is a sum over sequences divided by a *global* constant (total tokens, total sequences,
or sequences x T_norm), so a rank computes its share with ``denominator`` = the global constant and
gradients are **summed** (not averaged) across ranks and micro-batches: the result equals the
single-process loss exactly, whatever the sharding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import Tensor

AdvantageScale = Literal["std", "none"]
LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
LOSS_AGGS: tuple[str, ...] = get_args(LossAgg)
PolicyLoss = Literal["ppo-clip", "decoupled"]
IsCorrection = Literal["none", "truncate", "mask"]
IsLevel = Literal["token", "sequence"]

#: log-ratios are clamped to +-20 before ``exp`` (exp(20) ~ 4.9e8), the k3 KL to <= 10 (as verl)
LOG_RATIO_BOUND = 20.0
KL_BOUND = 10.0


def group_advantages(
    rewards: Tensor, group_index: Tensor, scale: AdvantageScale = "std", eps: float = 1e-6
) -> Tensor:
    """Group-relative advantages ``A_i`` (formula in the module docstring).

    ``rewards``: float [N]; ``group_index``: int64 [N] with values in 0..G-1 (dense group ids).
    """
    if rewards.ndim != 1 or group_index.shape != rewards.shape:
        raise ValueError(
            f"rewards {tuple(rewards.shape)} and group_index {tuple(group_index.shape)} must be equal 1-D shapes"
        )
    if rewards.numel() == 0:
        return rewards.clone()
    r = rewards.to(torch.float64)
    n_groups = int(group_index.max().item()) + 1
    counts = torch.bincount(group_index, minlength=n_groups).to(torch.float64)
    sums = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, group_index, r)
    mean = sums / counts.clamp(min=1)
    centred = r - mean[group_index]
    if scale == "none":
        return centred.to(rewards.dtype)
    if scale != "std":
        raise ValueError(f"unknown advantage scale {scale!r}; use 'std' or 'none'")
    sq = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, group_index, centred * centred)
    var = sq / (counts - 1).clamp(min=1)
    std = var.sqrt()[group_index]
    single = counts[group_index] <= 1
    adv = torch.where(single, torch.zeros_like(centred), centred / (std + eps))
    return adv.to(rewards.dtype)


def token_logprobs(logits: Tensor, targets: Tensor) -> Tensor:
    """``log softmax(logits)[target]`` per position, computed as ``logit - logsumexp`` (no full
    log-softmax tensor). ``logits``: [B, T, V]; ``targets``: [B, T] -> [B, T] float32."""
    logits = logits.float()
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


@dataclass(frozen=True)
class TokenTerms:
    """Per-token quantities of the objective, all [B, T]; zero outside ``mask``."""

    loss: Tensor  # w_t * L_t + kl_coef * K_t on kept tokens, 0 elsewhere
    ratio: Tensor  # rho_t (against the behaviour logprobs, whatever the loss)
    clipped: Tensor  # bool: the PPO clip is active (the token gives no policy gradient)
    kl: Tensor  # K_t (zeros when no reference)
    dual_clipped: Tensor  # bool: the dual clip bounds a negative-advantage token's loss at c * |A|
    is_weight: Tensor  # behaviour weight w_t before truncation (exp of the clamped log-ratio)
    rejected: Tensor  # bool: a loss token the IS mask removed (w outside [1/C, C])
    truncated: Tensor  # bool: a loss token whose weight was truncated at C
    log_ratio: Tensor  # lr_t = logp_t - old_t, clamped to +-LOG_RATIO_BOUND (0 outside the mask)


def _masked_log_ratio(a: Tensor, b: Tensor, mask: Tensor) -> Tensor:
    """``clamp(a - b, -20, 20)`` where ``mask``, 0 elsewhere (``where``: a NaN or -100 outside the
    mask never reaches the loss or its gradient)."""
    return torch.where(mask, a - b, torch.zeros_like(a)).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)


def token_terms(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    eps_low: float,
    eps_high: float,
    ref_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
    *,
    mask: Tensor | None = None,
    dual_clip: float | None = None,
    policy_loss: PolicyLoss = "ppo-clip",
    is_correction: IsCorrection = "none",
    is_level: IsLevel = "token",
    is_threshold: float = 2.0,
) -> TokenTerms:
    """Per-token objective (formulas in the module docstring). ``advantages`` is [B] (per
    sequence) or [B, T]; ``mask`` (bool or 0/1, [B, T]) marks the loss tokens (default: all).
    Every quantity is computed on masked log-ratios, so values outside the mask are irrelevant."""
    if eps_low < 0 or eps_high < 0:
        raise ValueError(f"clip eps must be >= 0, got eps_low={eps_low}, eps_high={eps_high}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip c must be > 1, got {dual_clip}")
    if is_threshold <= 1.0:
        raise ValueError(f"is_threshold C must be > 1, got {is_threshold}")
    if policy_loss not in ("ppo-clip", "decoupled"):
        raise ValueError(f"unknown policy_loss {policy_loss!r}; use 'ppo-clip' or 'decoupled'")
    if is_correction not in ("none", "truncate", "mask"):
        raise ValueError(f"unknown is_correction {is_correction!r}; use 'none', 'truncate' or 'mask'")
    if is_level not in ("token", "sequence"):
        raise ValueError(f"unknown is_level {is_level!r}; use 'token' or 'sequence'")
    if policy_loss == "ppo-clip" and is_correction == "truncate":
        raise ValueError("policy_loss='ppo-clip' already weights each token by rho_t = pi_theta/pi_behav; a "
                         "truncated weight on top would count it twice: use is_correction='mask' or "
                         "policy_loss='decoupled'")
    m = torch.ones_like(logprobs, dtype=torch.bool) if mask is None else mask.bool()
    adv = advantages.unsqueeze(-1) if advantages.ndim == logprobs.ndim - 1 else advantages
    adv = adv.to(logprobs.dtype)
    raw = torch.where(m, logprobs - old_logprobs, torch.zeros_like(logprobs))
    lr = raw.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    rho = torch.exp(lr)
    # behaviour weight w = pi_prox / pi_behav, pi_prox = pi_theta detached (one optimizer step per batch)
    if is_level == "token":
        log_w = lr.detach()
    else:
        log_w = raw.detach().sum(-1, keepdim=True).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND).expand_as(lr)
    w = torch.exp(log_w)
    zero = torch.zeros_like(rho, dtype=torch.bool)
    rejected, truncated = zero, zero
    keep = m
    if is_correction == "mask":
        rejected = m & ((log_w > math.log(is_threshold)) | (log_w < -math.log(is_threshold)))
        keep = m & ~rejected
    if policy_loss == "ppo-clip":
        ratio = rho
        weight = torch.ones_like(rho)
    else:
        ratio = torch.exp(logprobs - logprobs.detach())  # = 1, gradient d logp
        weight = w
        if is_correction == "truncate":
            truncated = m & (w > is_threshold)
            weight = w.clamp(max=is_threshold)
    pg1 = -adv * ratio
    pg2 = -adv * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    pg = torch.maximum(pg1, pg2)
    clipped = m & (pg2 > pg1)
    dual = zero
    if dual_clip is not None:
        pg3 = -adv * dual_clip
        dual = m & (adv < 0) & (pg > pg3)
        pg = torch.where(adv < 0, torch.minimum(pg, pg3), pg)
    loss = weight * pg
    if ref_logprobs is not None and kl_coef > 0:
        d = _masked_log_ratio(ref_logprobs, logprobs, m)
        kl = (torch.exp(d) - d - 1.0).clamp(max=KL_BOUND)
        loss = loss + kl_coef * kl
    else:
        kl = torch.zeros_like(loss)
    loss = torch.where(keep, loss, torch.zeros_like(loss))
    return TokenTerms(loss=loss, ratio=torch.where(m, rho, torch.zeros_like(rho)), clipped=clipped,
                      kl=torch.where(m, kl, torch.zeros_like(kl)), dual_clipped=dual,
                      is_weight=torch.where(m, w, torch.zeros_like(w)), rejected=rejected, truncated=truncated,
                      log_ratio=lr)


def aggregate(values: Tensor, mask: Tensor, mode: LossAgg, denominator: float) -> Tensor:
    """This micro-batch's share of the global aggregate (see module docstring).

    ``values``, ``mask``: [B, T]. ``denominator``: the global constant of ``global_denominator``.
    Summing the returned shares over every micro-batch of every rank gives the global loss.
    Masking selects (``where``), it does not multiply: a non-finite value outside the mask stays out.
    """
    if denominator <= 0:
        raise ValueError(f"denominator must be > 0, got {denominator}")
    m = mask.bool()
    kept = torch.where(m, values, torch.zeros_like(values))
    if mode in ("token-mean", "seq-mean-token-sum-norm"):
        return kept.sum() / denominator
    if mode == "seq-mean-token-mean":
        per_seq = kept.sum(-1) / m.sum(-1).clamp(min=1).to(values.dtype)
        return per_seq.sum() / denominator
    raise ValueError(f"unknown loss aggregation {mode!r}; use one of {LOSS_AGGS}")


def global_denominator(mask_sums: list[int], mode: LossAgg, norm_tokens: int | None = None) -> float:
    """The global constant for ``aggregate``: total masked tokens (token-mean), number of sequences
    with at least one masked token (seq-mean-token-mean), or that number times ``norm_tokens``
    (seq-mean-token-sum-norm)."""
    if mode == "token-mean":
        return float(sum(mask_sums))
    if mode == "seq-mean-token-mean":
        return float(sum(1 for s in mask_sums if s > 0))
    if mode == "seq-mean-token-sum-norm":
        if norm_tokens is None or norm_tokens < 1:
            raise ValueError(f"seq-mean-token-sum-norm needs norm_tokens >= 1 (the constant length), got {norm_tokens}")
        return float(sum(1 for s in mask_sums if s > 0) * norm_tokens)
    raise ValueError(f"unknown loss aggregation {mode!r}; use one of {LOSS_AGGS}")
