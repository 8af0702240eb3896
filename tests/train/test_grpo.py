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


def test_extreme_logprob_on_a_masked_token_stays_out_of_loss_and_gradient() -> None:
    """One logprob of -100 (or NaN) on a masked pad / observation token: the loss and the gradient
    are those of the batch without it (masking selects, it does not multiply)."""
    new = torch.log(torch.tensor([[0.5, 0.3, 0.2]])).requires_grad_(True)
    adv = torch.tensor([1.0])
    mask = torch.tensor([[True, False, True]])
    ref_lp = torch.log(torch.tensor([[0.4, 0.3, 0.25]]))
    grads = []
    for bad in (-100.0, float("nan"), math.log(0.3)):
        old = torch.log(torch.tensor([[0.45, 0.3, 0.21]]))
        old[0, 1] = bad
        t = token_terms(new, old, adv, 0.2, 0.28, ref_lp, 0.1, mask=mask, dual_clip=3.0)
        loss = aggregate(t.loss, mask, "token-mean", 2.0)
        assert math.isfinite(loss.item())
        (g,) = torch.autograd.grad(loss, new)
        assert torch.isfinite(g).all() and g[0, 1].item() == 0.0
        grads.append((loss.item(), g))
    for loss_v, g in grads[:2]:
        assert loss_v == grads[2][0]
        assert torch.equal(g, grads[2][1])
    # multiplying by the mask (values * mask) would make this NaN: exp(new + 100) overflows to inf, inf * 0
    old = torch.tensor([[0.0, -100.0, 0.0]])
    assert not math.isfinite((torch.exp(new - old) * mask).sum().item())


def test_log_ratio_and_kl_are_clamped_as_verl() -> None:
    new = torch.tensor([[0.0, 0.0]])
    old = torch.tensor([[-30.0, 30.0]])  # log-ratios +30 and -30 -> clamped to +-20
    t = token_terms(new, old, torch.tensor([0.0]), 0.2, 0.2, ref_logprobs=torch.tensor([[15.0, -5.0]]), kl_coef=1.0)
    torch.testing.assert_close(t.ratio, torch.exp(torch.tensor([[20.0, -20.0]])))
    # k3 at d = 15: exp(15) - 16 -> clamped at 10; at d = -5: exp(-5) + 4
    torch.testing.assert_close(t.kl, torch.tensor([[10.0, math.exp(-5.0) + 4.0]]))


def test_dual_clip_bounds_negative_advantage_tokens() -> None:
    # ratios 5 and 2 with A = -1, c = 3: PPO gives 5 and 2; the dual clip bounds at 3 -> 3 and 2
    new = torch.log(torch.tensor([[0.5, 0.2]])).requires_grad_(True)
    old = torch.log(torch.tensor([[0.1, 0.1]]))
    t = token_terms(new, old, torch.tensor([-1.0]), 0.2, 0.28, dual_clip=3.0)
    torch.testing.assert_close(t.loss, torch.tensor([[3.0, 2.0]]), atol=1e-6, rtol=1e-6)
    assert t.dual_clipped.tolist() == [[True, False]]
    t.loss.sum().backward()
    assert new.grad is not None
    torch.testing.assert_close(new.grad, torch.tensor([[0.0, 2.0]]))  # bounded token: no gradient
    # positive advantage: the dual clip does nothing
    t_pos = token_terms(new.detach(), old, torch.tensor([1.0]), 0.2, 0.28, dual_clip=3.0)
    torch.testing.assert_close(t_pos.loss, torch.tensor([[-1.28, -1.28]]))
    with pytest.raises(ValueError, match="dual_clip c must be > 1"):
        token_terms(new, old, torch.tensor([1.0]), 0.2, 0.2, dual_clip=1.0)


def test_decoupled_loss_truncated_token_level_by_hand() -> None:
    # w = pi_theta/pi_behav = 0.5/0.1 = 5 -> truncated at C = 2; 0.2/0.4 = 0.5 kept
    new = torch.log(torch.tensor([[0.5, 0.2]])).requires_grad_(True)
    old = torch.log(torch.tensor([[0.1, 0.4]]))
    t = token_terms(new, old, torch.tensor([1.0]), 0.2, 0.28, policy_loss="decoupled",
                    is_correction="truncate", is_threshold=2.0)
    torch.testing.assert_close(t.loss, torch.tensor([[-2.0, -0.5]]))
    torch.testing.assert_close(t.is_weight, torch.tensor([[5.0, 0.5]]))
    assert t.truncated.tolist() == [[True, False]] and not t.clipped.any()
    t.loss.sum().backward()
    assert new.grad is not None
    torch.testing.assert_close(new.grad, torch.tensor([[-2.0, -0.5]]))  # -w~ A d logp: the weight is a constant


def test_is_mask_sequence_level_rejects_the_whole_sequence() -> None:
    # sequence 0: log w = log 3 + log 1 > log 2 -> every token rejected ; sequence 1: w = 1.5 -> kept
    new = torch.log(torch.tensor([[0.3, 0.5], [0.3, 0.5]]))
    old = torch.log(torch.tensor([[0.1, 0.5], [0.2, 0.5]]))
    mask = torch.tensor([[True, True], [True, True]])
    t = token_terms(new, old, torch.tensor([1.0, 1.0]), 0.2, 0.28, mask=mask, is_correction="mask",
                    is_level="sequence", is_threshold=2.0)
    assert t.rejected.tolist() == [[True, True], [False, False]]
    torch.testing.assert_close(t.loss[0], torch.zeros(2))
    torch.testing.assert_close(t.loss[1], torch.tensor([-1.28, -1.0]))  # ppo-clip: ratio 1.5 clipped at 1.28
    torch.testing.assert_close(t.is_weight, torch.tensor([[3.0, 3.0], [1.5, 1.5]]))
    with pytest.raises(ValueError, match="count it twice"):
        token_terms(new, old, torch.tensor([1.0, 1.0]), 0.2, 0.2, is_correction="truncate")


def test_seq_mean_token_sum_norm() -> None:
    v = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 0.0, 0.0, 0.0]])
    m = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    d = global_denominator([3, 1], "seq-mean-token-sum-norm", norm_tokens=8)
    assert d == 16.0
    # ((1+2+3)/8 + 4/8) / 2 = 10/16
    assert aggregate(v, m, "seq-mean-token-sum-norm", d).item() == pytest.approx(10 / 16)
    with pytest.raises(ValueError, match="norm_tokens"):
        global_denominator([3, 1], "seq-mean-token-sum-norm")


@pytest.mark.parametrize(("fields", "message"), [
    ({"temperature": 0.7}, "samples at temperature 1"),
    ({"is_correction": "truncate"}, "needs train.policy_loss=decoupled"),
    ({"loss_agg": "seq-mean-token-sum-norm"}, "needs train.loss_norm_tokens"),
    ({"dual_clip": 1.0}, "greater than 1"),
])
def test_train_spec_refuses_inconsistent_loss_settings(fields: dict[str, object], message: str) -> None:
    from pydantic import ValidationError

    from pearl.config import TrainSpec

    with pytest.raises(ValidationError, match=message):
        TrainSpec(**fields)  # type: ignore[arg-type]
    assert TrainSpec(policy_loss="decoupled", is_correction="truncate").is_threshold == 2.0
