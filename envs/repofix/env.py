"""The repofix environment: fix an injected bug in a small Python project, offline.

Life cycle of one episode: ``reset(task)`` creates a temporary checkout (``envs.sandbox``),
copies the pristine project into it and writes the mutant file; the first user message is the
"issue": which tests fail and the first failure's report. ``step`` runs one tool: view / edit /
write (path-checked file tools), run_tests (the project's unittest suite under the sandbox guard
and limits), shell (only when ``allow_shell``: a shell command is limited in time, memory and
output but cannot be confined to the checkout, see ``envs.sandbox``), submit. ``submit`` restores
the pristine ``tests/`` folder (the agent may have edited tests; they are not graded), runs the
whole suite and returns the reward of ``envs.repofix.testrun.grade`` with ``done=True``.
``close`` deletes the checkout.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field

from envs.base import EnvError, StepResult, TaskError, clip_text
from envs.repofix.tasks import RepoFixTask, copy_project, project_dir, write_mutant
from envs.repofix.testrun import TargetError, grade, run_tests
from envs.sandbox import (
    Checkout,
    PathRefused,
    SandboxLimits,
    apply_edit,
    limited_argv,
    numbered,
    run_limited,
    sandbox_env,
)
from envs.toolcall import ToolCall, ToolSet, coding_tools

SYSTEM_PROMPT = """You are a software engineer fixing a bug in a Python repository.
The repository is your current directory; all paths are relative to it.
Find the bug in the source code (not in the tests), fix it with the smallest change, run the tests,
and submit when they pass. Test files are restored before grading, so editing them does not help.

{tools}"""


@dataclass(frozen=True, slots=True)
class RepoFixConfig:
    """``command``: limits of run_tests / shell; ``grade``: limits of the final test run."""

    command: SandboxLimits = field(default_factory=lambda: SandboxLimits(time_s=20.0))
    grade: SandboxLimits = field(default_factory=lambda: SandboxLimits(time_s=30.0))
    allow_shell: bool = False
    max_observation_chars: int = 8000
    workdir: str | None = None  # parent of the temporary checkouts (default: the system temp dir)


class RepoFixEnv:
    """One episode (see the module docstring)."""

    def __init__(self, config: RepoFixConfig | None = None) -> None:
        self.config = config or RepoFixConfig()
        self.tools: ToolSet = coding_tools(self.config.allow_shell)
        self._checkout: Checkout | None = None
        self._task: RepoFixTask | None = None
        self._done = False

    # ---------------------------------------------------------------------------- protocol
    def system_prompt(self) -> str:
        return SYSTEM_PROMPT.format(tools=self.tools.describe())

    async def reset(self, task: RepoFixTask) -> str:
        if not isinstance(task, RepoFixTask):
            raise TaskError(f"RepoFixEnv.reset needs a RepoFixTask, got {type(task).__name__}")
        await self.close()
        self._checkout = Checkout.create(prefix=f"pearl-repofix-{task.project}-", parent=self.config.workdir)
        try:
            copy_project(task.project, self._checkout.root)
            write_mutant(self._checkout.root, task.mutation)
        except BaseException:
            await self.close()
            raise
        self._task, self._done = task, False
        return self._issue(task)

    async def step(self, call: ToolCall) -> StepResult:
        co, task = self._require()
        if self._done:
            raise EnvError(f"episode {task.task_id} is already done (submit was called); reset a new one")
        if self.tools.get(call.name) is None:
            return StepResult(f"Error: unknown tool {call.name!r}; the tools are: {', '.join(self.tools.names)}",
                              info={"tool": call.name, "error": "unknown_tool"})
        handler = getattr(self, f"_tool_{call.name}")
        try:
            result: StepResult = await handler(co, task, call.args)
        except (PathRefused, TargetError) as e:
            result = StepResult(str(e), info={"tool": call.name, "error": "refused"})
        if call.ignored_calls and not result.done:
            note = f"[note: only the first tool call of a reply runs; {call.ignored_calls} more ignored]\n"
            result = StepResult(note + result.observation, result.reward, result.done, result.info)
        return result

    async def close(self) -> None:
        if self._checkout is not None:
            self._checkout.remove()
            self._checkout = None

    # ------------------------------------------------------------------------------- tools
    async def _tool_view(self, co: Checkout, task: RepoFixTask, args: dict[str, str]) -> StepResult:
        rel = args["path"]
        path = co.resolve(rel)
        if path.is_dir():
            text = co.listing(rel)
        else:
            text = numbered(co.read_text(rel), args.get("lines"), self.config.max_observation_chars)
        return StepResult(text, info={"tool": "view"})

    async def _tool_edit(self, co: Checkout, task: RepoFixTask, args: dict[str, str]) -> StepResult:
        rel = args["path"]
        new_text = apply_edit(co.read_text(rel), args["old"], args["new"], rel)
        co.write_text(rel, new_text)
        return StepResult(f"Edited {rel}.", info={"tool": "edit"})

    async def _tool_write(self, co: Checkout, task: RepoFixTask, args: dict[str, str]) -> StepResult:
        rel = args["path"]
        created = co.write_text(rel, args["content"])
        return StepResult(f"{'Created' if created else 'Wrote'} {rel}.", info={"tool": "write"})

    async def _tool_run_tests(self, co: Checkout, task: RepoFixTask, args: dict[str, str]) -> StepResult:
        run = await run_tests(co.root, self.config.command, args.get("target") or None)
        body = clip_text(run.report(), self.config.max_observation_chars, "test output")
        obs = f"Tests: {run.summary()}\n{body}"
        return StepResult(obs, info={"tool": "run_tests", "passed": len(run.passed), "failed": len(run.failed),
                                     "timed_out": run.proc.timed_out})

    async def _tool_shell(self, co: Checkout, task: RepoFixTask, args: dict[str, str]) -> StepResult:
        limits = self.config.command
        argv = ["/bin/bash", "-c", args["cmd"]]
        proc = await run_limited(limited_argv(argv, limits), co.root, limits, env=sandbox_env(co.root))
        body = clip_text(proc.output, self.config.max_observation_chars, "command output")
        return StepResult(f"[{proc.describe()}]\n{body}", info={"tool": "shell", "returncode": proc.returncode})

    async def _tool_submit(self, co: Checkout, task: RepoFixTask, args: dict[str, str]) -> StepResult:
        tests = co.root / "tests"
        if tests.is_symlink() or tests.is_file():
            tests.unlink()
        elif tests.exists():
            shutil.rmtree(tests)
        shutil.copytree(project_dir(task.project) / "tests", tests,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        run = await run_tests(co.root, self.config.grade)
        g = grade(run, task.fail_to_pass, task.pass_to_pass)
        self._done = True
        verdict = "resolved" if g.resolved else "not resolved"
        obs = f"Submitted: {verdict} (reward {g.reward:.2f}; tests {run.summary()})."
        return StepResult(obs, reward=g.reward, done=True, info={"tool": "submit", **g.as_info()})

    # ----------------------------------------------------------------------------- helpers
    def _require(self) -> tuple[Checkout, RepoFixTask]:
        if self._checkout is None or self._task is None:
            raise EnvError("RepoFixEnv.step called before reset (or after close)")
        return self._checkout, self._task

    @staticmethod
    def _issue(task: RepoFixTask) -> str:
        failing = "\n".join(f"- {t}" for t in task.fail_to_pass[:10])
        more = f"\n(and {len(task.fail_to_pass) - 10} more)" if len(task.fail_to_pass) > 10 else ""
        excerpt = f"\n\nFirst failure:\n{task.failure_excerpt}" if task.failure_excerpt else ""
        return (f"The project `{task.project}` has a bug. These tests fail:\n{failing}{more}{excerpt}\n\n"
                "Fix the bug in the source code, then submit. Reply with exactly one tool call, "
                "for example:\n<tool>view</tool>\n<path>.</path>")
