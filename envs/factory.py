"""From a run config to environments: the task suite and the pipeline's ``SessionFactory``.

Life cycle (once per run, before rollout)::

    suite = await build_suite(cfg.env)                    # tasks: generated (repofix, tiny) or loaded
    factory = make_session_factory(suite, tokenizer, cfg)  # SessionSpec -> EnvSession
    pipeline = Pipeline(..., session_factory=factory)

Task assignment: the GRPO group ``g`` of rollout batch ``r`` plays task
``tasks[(r * groups_per_batch + g) mod len(tasks)]`` -- every sample of a group gets the same task
(GRPO compares samples of one prompt), successive groups and batches walk through the suite, and
each sample gets its own ``Env`` (own checkout / container).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from envs.base import Env
from envs.env_session import ChatTokenizer, EnvSession, SessionLimits
from envs.repofix import RepoFixConfig, RepoFixEnv, generate_tasks
from envs.sandbox import SandboxLimits
from envs.swebench import ImageNaming, SWEBenchConfig, SWEBenchEnv, load_instances
from envs.swebench.docker import DockerCLI, DockerConfig
from envs.tiny import TinyEnv, make_tiny_tasks
from pearl.config import EnvSpec, RunConfig
from pearl.core.session import SessionSpec


@dataclass(frozen=True)
class EnvSuite:
    """The tasks of a run and how to make one episode's environment."""

    kind: str
    tasks: tuple[Any, ...]
    make_env: Callable[[], Env]

    def task_for(self, spec: SessionSpec, groups_per_batch: int) -> Any:
        return self.tasks[(spec.batch_index * groups_per_batch + spec.group_index) % len(self.tasks)]


async def build_suite(spec: EnvSpec) -> EnvSuite:
    """Tasks and env constructor for ``spec.kind`` (repofix validates its mutants: a few seconds)."""
    if spec.kind == "tiny":
        return EnvSuite("tiny", make_tiny_tasks(spec.num_tasks, spec.seed, spec.tiny_turns), TinyEnv)
    if spec.kind == "repofix":
        limits = SandboxLimits(time_s=spec.command_timeout_s, memory_mb=spec.memory_mb,
                               max_output_chars=spec.max_output_chars)
        cfg = RepoFixConfig(command=limits, grade=limits, allow_shell=spec.allow_shell, workdir=spec.workdir)
        tasks = await generate_tasks(spec.num_tasks, spec.seed, tuple(spec.projects) or None,
                                     SandboxLimits(time_s=min(5.0, spec.command_timeout_s)))
        return EnvSuite("repofix", tasks, lambda: RepoFixEnv(cfg))
    assert spec.dataset is not None  # EnvSpec's validator
    instances = load_instances(spec.dataset, spec.instance_ids or None)
    sw_cfg = SWEBenchConfig(
        images=ImageNaming(spec.image_prefix, spec.image_namespace, spec.image_tag),
        command=SandboxLimits(time_s=spec.command_timeout_s, max_output_chars=spec.max_output_chars),
        eval_timeout_s=spec.eval_timeout_s, include_hints=spec.include_hints)
    docker_cfg = DockerConfig(binary=spec.docker_binary, memory=spec.docker_memory)
    return EnvSuite("swebench", instances, lambda: SWEBenchEnv(sw_cfg, DockerCLI(docker_cfg)))


def session_limits(cfg: RunConfig) -> SessionLimits:
    e = cfg.env
    return SessionLimits(max_trajectory_tokens=cfg.workload.max_trajectory_tokens, max_new_tokens=e.max_new_tokens,
                         max_turns=e.max_turns, max_observation_tokens=e.max_observation_tokens,
                         min_turn_tokens=e.min_turn_tokens, on_limit=e.on_limit)


def make_session_factory(suite: EnvSuite, tokenizer: ChatTokenizer, cfg: RunConfig
                         ) -> Callable[[SessionSpec], EnvSession]:
    """The pipeline's ``SessionFactory``: one ``EnvSession`` (and ``Env``) per trajectory."""
    limits = session_limits(cfg)
    groups = cfg.workload.batch_size // cfg.workload.group_size
    kwargs = {} if cfg.env.enable_thinking is None else {"enable_thinking": cfg.env.enable_thinking}

    def factory(spec: SessionSpec) -> EnvSession:
        return EnvSession(suite.make_env(), suite.task_for(spec, groups), tokenizer, limits, kwargs)

    return factory


def load_tokenizer(path: str | Path) -> ChatTokenizer:
    """The Hugging Face tokenizer (with chat template) of a local model folder."""
    from transformers import AutoTokenizer

    # A chat tokenizer satisfies ChatTokenizer, but transformers types it more loosely than the session
    # uses it (decode() -> str | list[str], apply_chat_template() on its own conversation types).
    return cast(ChatTokenizer, AutoTokenizer.from_pretrained(str(path)))
