"""Workload model: determinism, growing context, the trajectory length limit, GRPO groups."""

from __future__ import annotations

import pytest

from pearl.config import Distribution, WorkloadSpec
from pearl.sim.workload import MIN_RESPONSE, WorkloadModel


def test_deterministic_for_a_seed() -> None:
    a = WorkloadModel(WorkloadSpec(seed=7)).batch(3)
    b = WorkloadModel(WorkloadSpec(seed=7)).batch(3)
    c = WorkloadModel(WorkloadSpec(seed=8)).batch(3)
    assert a == b
    assert a != c


def test_batches_differ_and_ids_unique() -> None:
    m = WorkloadModel(WorkloadSpec())
    b0, b1 = m.batch(0), m.batch(1)
    assert len(b0) == 64 and b0 != b1
    ids = [p.traj_id for p in b0 + b1]
    assert len(set(ids)) == len(ids)
    assert len({p.group_id for p in b0}) == 8 and all(sum(p.group_id == g.group_id for p in b0) == 8 for g in b0)


@pytest.mark.parametrize("limit", [4096, 8192, 32768])
def test_length_limit_holds(limit: int) -> None:
    m = WorkloadModel(WorkloadSpec(max_trajectory_tokens=limit, system_prompt_tokens=1000))
    for p in m.batch(0) + m.batch(1):
        assert p.total_tokens <= limit
        assert (p.turns and p.turns[-1].observation_tokens == 0) or p.truncated
        if not p.truncated:
            assert p.turns[-1].is_test  # submit = reward evaluation by the tests


def test_small_limit_truncates() -> None:
    m = WorkloadModel(WorkloadSpec(max_trajectory_tokens=3000, system_prompt_tokens=2500))
    plans = m.batch(0)
    assert sum(p.truncated for p in plans) > len(plans) // 2
    for p in plans:
        assert p.limit - p.total_tokens < MIN_RESPONSE or not p.truncated or p.turns[-1].observation_tokens > 0


def test_context_grows_and_constants_respected() -> None:
    spec = WorkloadSpec(
        turns=Distribution(mean=5, cv=0), response_tokens=Distribution(mean=100, cv=0),
        observation_tokens=Distribution(mean=50, cv=0), env_step_s=Distribution(mean=2, cv=0),
        test_run_prob=0.0, test_run_s=Distribution(mean=9, cv=0), task_difficulty_cv=0.0,
        system_prompt_tokens=1000, batch_size=8, group_size=8,
    )
    for p in WorkloadModel(spec).batch(0):
        assert len(p.turns) == 5 and not p.truncated
        assert [t.response_tokens for t in p.turns] == [100] * 5
        assert [t.observation_tokens for t in p.turns] == [50] * 4 + [0]
        assert [t.env_s for t in p.turns] == [2.0] * 4 + [9.0]
        assert p.total_tokens == 1000 + 5 * 100 + 4 * 50


def test_group_shares_task_difficulty() -> None:
    spec = WorkloadSpec(task_difficulty_cv=1.0, turns=Distribution(mean=20, cv=0.01, min=1, max=200),
                        batch_size=64, group_size=8, max_trajectory_tokens=40000)
    b = WorkloadModel(spec).batch(0)
    per_group = {}
    for p in b:
        per_group.setdefault(p.group_id, []).append(len(p.turns))
    spreads = [max(v) - min(v) for v in per_group.values()]
    means = sorted(sum(v) / len(v) for v in per_group.values())
    assert max(spreads) < means[-1] - means[0]  # between-task variation dominates within-group
