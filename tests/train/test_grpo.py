"""GRPO maths against hand-computed values (pearl/train/grpo.py)."""

from __future__ import annotations

import math

import pytest
import torch

from pearl.train.grpo import aggregate, global_denominator, group_advantages, token_logprobs, token_terms


def test_group_advantages_std_by_hand() -> None:
    # group 0: rewards 1, 0, 0, 1 -> mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = sqrt(1/3)
    # group 1: rewards 2, 4 -> mean 3, std sqrt(2) ; group 2: one sample -> 0
    r = torch.tensor([1.0, 0.0, 2.0, 0.0, 1.0, 4.0, 7.0])
    g = torch.tensor([0, 0, 1, 0, 0, 1, 2])
    adv = group_advantages(r, g, eps=0.0)
    a0 = 0.5 / math.sqrt(1 / 3)
    a1 = 1 / math.sqrt(2)
    expected = torch.tensor([a0, -a0, -a1, -a0, a0, a1, 0.0])
    torch.testing.assert_close(adv, expected)


def test_group_advantages_none_and_constant_group() -> None:
    r = torch.tensor([3.0, 1.0, 5.0, 5.0])
    g = torch.tensor([0, 0, 1, 1])
    torch.testing.assert_close(group_advantages(r, g, scale="none"), torch.tensor([1.0, -1.0, 0.0, 0.0]))
    # equal rewards in a group: zero advantage, not NaN
    assert group_advantages(r, g)[2:].tolist() == [0.0, 0.0]


def test_group_advantages_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="shapes"):
        group_advantages(torch.zeros(3), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="scale"):
        group_advantages(torch.zeros(2), torch.zeros(2, dtype=torch.long), scale="max")  # type: ignore[arg-type]


def test_clipped_objective_by_hand() -> None:
    # four tokens: (ratio, advantage) = (1.25, +1) (0.5, +1) (1.25, -1) (0.5, -1); eps_low 0.2, eps_high 0.2
    old = torch.log(torch.tensor([[0.4, 0.4, 0.4, 0.4]]))
    new = torch.log(torch.tensor([[0.5, 0.2, 0.5, 0.2]]))
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    t = token_terms(new, old, adv, eps_low=0.2, eps_high=0.2)
    torch.testing.assert_close(t.ratio, torch.tensor([[1.25, 0.5, 1.25, 0.5]]))
    # A>0: -A*min(r, 1.2) ; A<0: -A*max(r, 0.8)
    torch.testing.assert_close(t.loss, torch.tensor([[-1.2, -0.5, 1.25, 0.8]]))
    assert t.clipped.tolist() == [[True, False, False, True]]
    assert t.kl.abs().sum().item() == 0.0


def test_asymmetric_clip_uses_eps_high_for_positive_advantage() -> None:
    old = torch.zeros(1, 2)
    new = torch.log(torch.tensor([[1.3, 0.75]]))
    adv = torch.tensor([2.0])  # per-sequence advantage, broadcast over tokens
    t = token_terms(new, old, adv, eps_low=0.2, eps_high=0.28)
    torch.testing.assert_close(t.loss, torch.tensor([[-2 * 1.28, -2 * 0.75]]))
    t_neg = token_terms(new, old, -adv, eps_low=0.2, eps_high=0.28)
    torch.testing.assert_close(t_neg.loss, torch.tensor([[2 * 1.3, 2 * 0.8]]))


def test_gradient_is_zero_where_clipped() -> None:
    new = torch.log(torch.tensor([[0.5, 0.45]])).requires_grad_(True)
    old = torch.log(torch.tensor([[0.4, 0.4]]))
    t = token_terms(new, old, torch.tensor([1.0]), 0.2, 0.2)
    t.loss.sum().backward()
    assert new.grad is not None
    # token 0: ratio 1.25 > 1.2, clipped -> no gradient; token 1: ratio 1.125 -> d(-r)/dlogp = -r
    torch.testing.assert_close(new.grad, torch.tensor([[0.0, -1.125]]))


def test_k3_kl_by_hand() -> None:
    logp = torch.log(torch.tensor([[0.5, 0.2]]))
    ref = torch.log(torch.tensor([[0.25, 0.2]]))
    old = logp.clone()  # ratio 1: surrogate = -A
    t = token_terms(logp, old, torch.tensor([0.0]), 0.2, 0.2, ref_logprobs=ref, kl_coef=0.1)
    d = math.log(0.5)  # ref - logp on token 0
    k3 = math.exp(d) - d - 1  # 0.5 + 0.693 - 1 = 0.1931
    torch.testing.assert_close(t.kl, torch.tensor([[k3, 0.0]]))
    torch.testing.assert_close(t.loss, torch.tensor([[0.1 * k3, 0.0]]))


def test_token_mean_vs_seq_mean_with_masks() -> None:
    v = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 0.0, 0.0, 0.0]])
    m = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    # token-mean: (1+2+3+4)/4 = 2.5 ; seq-mean-token-mean: ((1+2+3)/3 + 4/1)/2 = 3
    assert aggregate(v, m, "token-mean", global_denominator([3, 1], "token-mean")).item() == pytest.approx(2.5)
    dseq = global_denominator([3, 1], "seq-mean-token-mean")
    assert aggregate(v, m, "seq-mean-token-mean", dseq).item() == pytest.approx(3.0)


def test_aggregate_shares_sum_to_global_loss() -> None:
    """Split the batch in two 'ranks': the shares with the global denominator add up exactly."""
    torch.manual_seed(0)
    v = torch.randn(6, 5)
    m = (torch.rand(6, 5) > 0.3).float()
    for mode in ("token-mean", "seq-mean-token-mean"):
        d = global_denominator([int(x) for x in m.sum(1).tolist()], mode)  # type: ignore[arg-type]
        whole = aggregate(v, m, mode, d)  # type: ignore[arg-type]
        parts = aggregate(v[:2], m[:2], mode, d) + aggregate(v[2:], m[2:], mode, d)  # type: ignore[arg-type]
        torch.testing.assert_close(whole, parts)
    with pytest.raises(ValueError, match="denominator"):
        aggregate(v, m, "token-mean", 0.0)


def test_token_logprobs_matches_log_softmax() -> None:
    torch.manual_seed(1)
    logits = torch.randn(2, 3, 7)
    tgt = torch.randint(0, 7, (2, 3))
    ref = torch.log_softmax(logits, -1).gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(token_logprobs(logits, tgt), ref)
