"""GRPO maths: group-relative advantages, the clipped surrogate, the KL term, loss aggregation.

Pure tensor functions (no I/O, no process groups, no clock): the trainer ranks call them on each
micro-batch; the tests check them against hand-computed values.

Symbols (one trajectory ``i`` of group ``g``, response token ``t``):

    r_i                 scalar reward of trajectory i
    A_i                 group-relative advantage, broadcast to every response token of i
    logp_t              log pi_theta(y_t | y_<t)   (current trainer weights)
    old_t               log pi_rollout(y_t | y_<t) (the logprob the inference engine reported)
    ref_t               log pi_ref(y_t | y_<t)     (frozen reference, only when kl_coef > 0)
    m_t in {0, 1}       loss mask: 1 on policy-generated tokens, 0 on prompt / observations / pad

Advantage (``group_advantages``)::

    A_i = (r_i - mean_g(r)) / (std_g(r) + eps)       scale="std"  (GRPO, DeepSeekMath)
    A_i =  r_i - mean_g(r)                            scale="none" (Dr. GRPO: no std bias)

``std_g`` is the unbiased sample standard deviation (``torch.std``, as TRL and verl use). A group of
one sample has no baseline: its advantage is 0 (it contributes no gradient).

Clipped surrogate with asymmetric clip ("clip-higher", DAPO), per token::

    rho_t = exp(logp_t - old_t)
    L_t   = -min(rho_t * A_i, clip(rho_t, 1 - eps_low, 1 + eps_high) * A_i)
          = -A_i * min(rho_t, 1 + eps_high)     if A_i >= 0
          = -A_i * max(rho_t, 1 - eps_low)      if A_i <  0

The ratio is taken against the *rollout* logprobs, not a recomputation with the pre-update trainer
weights: in asynchronous RL the samples come from an older policy version (bounded staleness) and
from a different engine (numerics), and importance-weighting against the distribution that really
produced the tokens corrects both. One optimizer step is taken per batch, so there is no separate
"old policy" forward pass.

KL to the reference (k3 estimator, Schulman 2020), per token, added as ``kl_coef * K_t``::

    d_t = ref_t - logp_t
    K_t = exp(d_t) - d_t - 1            (>= 0, unbiased for KL(pi_theta || pi_ref) under pi_theta)

The tokens were sampled from pi_rollout, not pi_theta; with one update per batch and bounded
staleness the two are close and we accept the small bias (as GRPO implementations do).

Aggregation (``aggregate``), over the whole *global* batch (all ranks, all micro-batches)::

    token-mean          L = sum_i sum_t m_t L_t / sum_i sum_t m_t            (default)
    seq-mean-token-mean L = (1/N) sum_i [ sum_t m_t L_t / sum_t m_t ]        (original GRPO)

We default to **token-mean** (DAPO): every generated token weighs the same, so long agentic
trajectories (many turns, many response tokens) are not down-weighted per token as they are under
the per-sequence mean, and a long degenerate response is penalised in proportion to its length.
Both forms are sums over sequences divided by a *global* constant (total tokens or total
sequences), so a rank computes its share with ``denominator`` = the global constant and gradients
are **summed** (not averaged) across ranks and micro-batches: the result equals the single-process
loss exactly, whatever the sharding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

AdvantageScale = Literal["std", "none"]
LossAgg = Literal["token-mean", "seq-mean-token-mean"]


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
    """Per-token quantities of the objective, all [B, T]."""

    loss: Tensor  # L_t + kl_coef * K_t
    ratio: Tensor  # rho_t
    clipped: Tensor  # bool: the clip is active (the token gives no policy gradient)
    kl: Tensor  # K_t (zeros when no reference)


def token_terms(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    eps_low: float,
    eps_high: float,
    ref_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
) -> TokenTerms:
    """Clipped surrogate + optional k3 KL per token. ``advantages`` is [B] (per sequence) or
    [B, T]. Formulas in the module docstring."""
    if eps_low < 0 or eps_high < 0:
        raise ValueError(f"clip eps must be >= 0, got eps_low={eps_low}, eps_high={eps_high}")
    adv = advantages.unsqueeze(-1) if advantages.ndim == logprobs.ndim - 1 else advantages
    adv = adv.to(logprobs.dtype)
    ratio = torch.exp(logprobs - old_logprobs)
    surr1 = ratio * adv
    surr2 = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    loss = -torch.minimum(surr1, surr2)
    clipped = ((adv > 0) & (ratio > 1.0 + eps_high)) | ((adv < 0) & (ratio < 1.0 - eps_low))
    if ref_logprobs is not None and kl_coef > 0:
        d = ref_logprobs - logprobs
        kl = torch.exp(d) - d - 1.0
        loss = loss + kl_coef * kl
    else:
        kl = torch.zeros_like(loss)
    return TokenTerms(loss=loss, ratio=ratio, clipped=clipped, kl=kl)


def aggregate(values: Tensor, mask: Tensor, mode: LossAgg, denominator: float) -> Tensor:
    """This micro-batch's share of the global aggregate (see module docstring).

    ``values``, ``mask``: [B, T]. ``denominator``: the *global* number of masked tokens
    (token-mean) or of sequences (seq-mean-token-mean). Summing the returned shares over every
    micro-batch of every rank gives the global loss.
    """
    if denominator <= 0:
        raise ValueError(f"denominator must be > 0, got {denominator}")
    m = mask.to(values.dtype)
    if mode == "token-mean":
        return (values * m).sum() / denominator
    if mode == "seq-mean-token-mean":
        per_seq = (values * m).sum(-1) / m.sum(-1).clamp(min=1.0)
        return per_seq.sum() / denominator
    raise ValueError(f"unknown loss aggregation {mode!r}; use 'token-mean' or 'seq-mean-token-mean'")


def global_denominator(mask_sums: list[int], mode: LossAgg) -> float:
    """The global constant for ``aggregate``: total masked tokens, or number of sequences with at
    least one masked token."""
    if mode == "token-mean":
        return float(sum(mask_sums))
    if mode == "seq-mean-token-mean":
        return float(sum(1 for s in mask_sums if s > 0))
    raise ValueError(f"unknown loss aggregation {mode!r}; use 'token-mean' or 'seq-mean-token-mean'")
