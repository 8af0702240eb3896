"""EnvSession over real environments and the real SmolLM2 tokenizer (chat template from the model folder)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from envs.base import EnvUnavailableError, StepResult
from envs.env_session import EnvSession, SessionLimits
from envs.factory import EnvSuite, load_tokenizer, make_session_factory
from envs.repofix import RepoFixEnv, RepoFixTask, generate_tasks
from envs.repofix.mutate import revert_mutation
from envs.swebench import SWEBenchEnv, load_instances
from envs.swebench.docker import DockerCLI, DockerConfig
from envs.tiny import TinyEnv, TinyTask
from envs.toolcall import ToolCall, ToolSet, coding_tools
from pearl.config import load_config
from pearl.core.session import EpisodeEnd, SessionSpec, TurnInput
from pearl.models import ensure_models
from tests.conftest import LITE_DEV, MODELS_DIR


@pytest.fixture(scope="module")
def tok() -> Any:
    # built from the local GGUF if missing (~20 s), as the other tests do; fails with what is missing
    return load_tokenizer(ensure_models(MODELS_DIR, names=("smollm2-135m",))["smollm2-135m"])


@pytest.fixture(scope="module")
def repofix_task() -> RepoFixTask:
    return asyncio.run(generate_tasks(1, seed=3))[0]


def reply(tok: Any, text: str, eos: bool = True) -> tuple[int, ...]:
    ids = tok.encode(text, add_special_tokens=False)
    return tuple(ids + ([tok.eos_token_id] if eos else []))


def rendered(tok: Any, messages: list[dict[str, str]]) -> list[int]:
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tok.encode(text, add_special_tokens=False))


LIMITS = SessionLimits(max_trajectory_tokens=8192, max_new_tokens=256, max_turns=10)


async def test_tiny_episode_rewards_the_copied_word(tok: Any) -> None:
    s = EnvSession(TinyEnv(), TinyTask("t0", ("river", "honey")), tok, LIMITS)
    first = await s.start()
    assert isinstance(first, TurnInput) and first.max_new_tokens == 256
    text = tok.decode(list(first.prompt_ids))
    assert text.endswith("Say the word: river<|im_end|>\n<|im_start|>assistant\n")
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.")
    second = await s.step(reply(tok, "River!"))
    assert isinstance(second, TurnInput)
    # the model closed its turn with <|im_end|>: the observation does not repeat it
    assert tok.decode(list(second.prompt_ids)) == "\n<|im_start|>user\nSay the word: honey<|im_end|>\n<|im_start|>assistant\n"
    end = await s.step(reply(tok, "money"))
    assert isinstance(end, EpisodeEnd)
    assert end.reward == pytest.approx((1.0 + 0.5 * 4 / 5) / 2)
    assert end.info["turns"] == 2 and end.info["truncated"] is False and end.info["end_reason"] == "done"


async def test_context_equals_the_chat_template_rendering(tok: Any, repofix_task: RepoFixTask) -> None:
    """Incremental ids == the template applied to the whole conversation (token-in, token-out)."""
    env = RepoFixEnv()
    s = EnvSession(env, repofix_task, tok, LIMITS)
    ti = await s.start()
    assert list(ti.prompt_ids) == rendered(tok, s.messages)
    m = repofix_task.mutation
    replies = [
        f"Let me look.\n<tool>view</tool>\n<path>{m.file}</path>\n<lines>1-5</lines>",
        "I am not sure what to do.",  # malformed: costs a turn, error as observation
        "<tool>run_tests</tool>",
    ]
    for r in replies:
        ti = await s.step(reply(tok, r))
        assert isinstance(ti, TurnInput)
        assert s.token_ids == rendered(tok, s.messages)
    assert s.tool_errors == 1
    assert s.messages[5]["content"].startswith("Error: no tool call found in your reply")
    fixed = revert_mutation((env._checkout.root / m.file).read_text(), m)  # type: ignore[union-attr]
    ti = await s.step(reply(tok, f"<tool>write</tool>\n<path>{m.file}</path>\n<content>\n{fixed}</content>"))
    assert isinstance(ti, TurnInput) and s.token_ids == rendered(tok, s.messages)
    end = await s.step(reply(tok, "<tool>submit</tool>"))
    assert isinstance(end, EpisodeEnd)
    assert end.reward == 1.0 and end.info["resolved"] is True and end.info["turns"] == 5
    assert env._checkout is None  # the session closed the env


async def test_response_cut_by_its_budget_gets_the_full_closing(tok: Any) -> None:
    s = EnvSession(TinyEnv(), TinyTask("t1", ("apple", "stone")), tok, LIMITS)
    await s.start()
    ti = await s.step(reply(tok, "apple apple apple", eos=False))
    assert isinstance(ti, TurnInput)
    assert ti.prompt_ids[0] == tok.eos_token_id
    assert tok.decode(list(ti.prompt_ids)).startswith("<|im_end|>\n<|im_start|>user\nSay the word: stone")


async def test_trajectory_token_limit_ends_and_grades(tok: Any, repofix_task: RepoFixTask) -> None:
    env = RepoFixEnv()
    probe = EnvSession(RepoFixEnv(), repofix_task, tok, LIMITS)
    n0 = len((await probe.start()).prompt_ids)
    await probe.aclose()
    limit = n0 + 120
    s = EnvSession(env, repofix_task, tok, SessionLimits(max_trajectory_tokens=limit, max_new_tokens=100,
                                                         min_turn_tokens=16))
    ti = await s.start()
    assert ti.max_new_tokens == 100
    # a full-file view cannot fit: the session ends the episode and submits the work as it stands
    end = await s.step(reply(tok, f"<tool>view</tool><path>{repofix_task.mutation.file}</path>"))
    assert isinstance(end, EpisodeEnd)
    assert end.info["truncated"] is True and end.info["end_reason"] == "max_trajectory_tokens"
    assert end.reward == 0.0 and end.info["f2p_total"] == len(repofix_task.fail_to_pass)  # graded, unfixed
    assert len(s.token_ids) <= limit
    # a turn budget never exceeds what is left
    s2 = EnvSession(TinyEnv(), TinyTask("t2", ("apple", "stone")), tok,
                    SessionLimits(max_trajectory_tokens=n0, max_new_tokens=4096, min_turn_tokens=1))
    first = await s2.start()
    assert first.max_new_tokens == n0 - len(first.prompt_ids)


async def test_on_limit_zero_and_max_turns(tok: Any, repofix_task: RepoFixTask) -> None:
    s = EnvSession(RepoFixEnv(), repofix_task, tok, SessionLimits(max_trajectory_tokens=8192, max_turns=2,
                                                                  on_limit="zero"))
    await s.start()
    assert isinstance(await s.step(reply(tok, "<tool>view</tool><path>.</path>")), TurnInput)
    end = await s.step(reply(tok, "<tool>view</tool><path>.</path>"))
    assert isinstance(end, EpisodeEnd)
    assert (end.reward, end.info["end_reason"], end.info["truncated"]) == (0.0, "max_turns", True)


async def test_long_observations_are_clipped(tok: Any, repofix_task: RepoFixTask) -> None:
    env = RepoFixEnv()
    s = EnvSession(env, repofix_task, tok, SessionLimits(max_trajectory_tokens=8192, max_observation_tokens=64))
    await s.start()
    await env.step(ToolCall("write", {"path": "big.txt", "content": "word " * 5000}))
    ti = await s.step(reply(tok, "<tool>view</tool><path>big.txt</path>"))
    assert isinstance(ti, TurnInput)
    delimiters = len(tok.encode("\n<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False))
    assert 64 <= len(ti.prompt_ids) <= 64 + delimiters + 2  # a boundary may re-encode a token longer
    assert "tokens of observation, some omitted" in s.messages[-1]["content"]
    await s.aclose()
    assert env._checkout is None


async def test_initial_prompt_over_the_limit_is_a_clear_error(tok: Any, repofix_task: RepoFixTask) -> None:
    env = RepoFixEnv()
    s = EnvSession(env, repofix_task, tok, SessionLimits(max_trajectory_tokens=100, max_new_tokens=16))
    with pytest.raises(Exception, match=r"initial prompt has \d+ tokens"):
        await s.start()
    assert env._checkout is None


async def test_env_failure_propagates_and_closes(tok: Any) -> None:
    inst = load_instances(LITE_DEV, limit=1)[0]
    env = SWEBenchEnv(docker=DockerCLI(DockerConfig(binary="pearl-no-such-docker")))
    s = EnvSession(env, inst, tok, LIMITS)
    with pytest.raises(EnvUnavailableError, match="not on PATH"):
        await s.start()


class _ExplodingEnv:
    tools: ToolSet = coding_tools(False)
    closed = 0

    def system_prompt(self) -> str:
        return "s"

    async def reset(self, task: Any) -> str:
        return "go"

    async def step(self, call: ToolCall) -> StepResult:
        raise RuntimeError("sandbox died")

    async def close(self) -> None:
        self.closed += 1


async def test_step_exception_closes_the_env_once(tok: Any) -> None:
    env = _ExplodingEnv()
    s = EnvSession(env, TinyTask("x", ("a",)), tok, LIMITS)  # type: ignore[arg-type]
    await s.start()
    with pytest.raises(RuntimeError, match="sandbox died"):
        await s.step(reply(tok, "<tool>submit</tool>"))
    await s.aclose()
    assert env.closed == 1


async def test_factory_assigns_one_task_per_group(tok: Any, tmp_path: Path) -> None:
    cfg = load_config("qwen3-8b-h200", {"workload.batch_size": 4, "workload.group_size": 2})
    tasks = (TinyTask("a", ("apple",)), TinyTask("b", ("river",)), TinyTask("c", ("stone",)))
    factory = make_session_factory(EnvSuite("tiny", tasks, TinyEnv), tok, cfg)
    seen = []
    for r in range(2):
        for g in range(2):
            for smp in range(2):
                sess = factory(SessionSpec(f"b{r}-g{g}-s{smp}", f"b{r}-g{g}", r, g, smp))
                seen.append(sess.task.task_id)
    assert seen == ["a", "a", "b", "b", "c", "c", "a", "a"]
    assert sess.limits.max_trajectory_tokens == cfg.workload.max_trajectory_tokens


async def test_a_reply_that_uses_its_whole_turn_budget_is_recorded_as_cut(tok: Any) -> None:
    limits = SessionLimits(max_trajectory_tokens=8192, max_new_tokens=6, max_turns=3, min_turn_tokens=1)
    s = EnvSession(TinyEnv(), TinyTask("t3", ("apple", "stone", "river")), tok, limits)
    ti = await s.start()
    cut = reply(tok, "apple apple apple apple apple apple apple", eos=False)[: ti.max_new_tokens]
    assert len(cut) == 6
    ti = await s.step(cut)
    assert isinstance(ti, TurnInput) and s.turns_cut == 1
    ti = await s.step(reply(tok, "stone"))  # ended by the model, within its budget
    assert isinstance(ti, TurnInput) and s.turns_cut == 1
    end = await s.step(reply(tok, "river"))
    assert isinstance(end, EpisodeEnd) and end.info["turns_cut"] == 1
