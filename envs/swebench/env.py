"""The SWE-bench environment: resolve a real GitHub issue inside the instance's Docker image.

Life cycle of one episode:

1. ``reset(instance)``: check the Docker engine and the instance image (``EnvUnavailableError``
   naming the image and how to get it if either is missing), start an idle container of the
   image (no network), and return the prompt built from the problem statement.
2. ``step``: view / edit / write (file tools executed in the container; paths must stay under
   ``/testbed``), run_tests (the repository's harness test command on a target or on the test
   files of the instance), shell (any command, run in the container with a time limit: the
   container is the confinement), submit.
3. ``submit``: the agent's patch is ``git add -A && git diff --cached`` in ``/testbed``. As in
   the harness, it is then evaluated in a *fresh* container of the same image: the patch is
   written to ``/tmp/patch.diff`` and applied (three methods in turn), the eval script is run, and
   the log is graded (``envs.swebench.grading``: reward 1.0 if resolved, else 0.0).
4. ``close``: every container of the episode is removed (also after errors or cancellation).
"""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass, field

from envs.base import EnvError, EnvUnavailableError, StepResult, TaskError, clip_text
from envs.sandbox import PathRefused, ProcResult, SandboxLimits, apply_edit
from envs.swebench.dataset import SWEBenchInstance
from envs.swebench.docker import DockerCLI
from envs.swebench.grading import grade
from envs.swebench.harness import (
    CONTAINER_PATCH_FILE,
    REPO_DIR,
    ImageNaming,
    activate_lines,
    apply_patch_script,
    build_test_command,
    eval_script,
    repo_spec,
)
from envs.swebench.prompt import SYSTEM_PROMPT, build_prompt
from envs.toolcall import ToolCall, ToolSet, coding_tools

DATA_CHARS = 64 * 2**20  # file contents, patches and eval logs come back whole (up to 64 MiB)


@dataclass(frozen=True, slots=True)
class SWEBenchConfig:
    images: ImageNaming = field(default_factory=ImageNaming)
    command: SandboxLimits = field(default_factory=lambda: SandboxLimits(time_s=120.0))
    eval_timeout_s: float = 1800.0  # the harness default
    max_observation_chars: int = 8000
    include_hints: bool = False


class SWEBenchEnv:
    """One SWE-bench episode (see the module docstring)."""

    def __init__(self, config: SWEBenchConfig | None = None, docker: DockerCLI | None = None) -> None:
        self.config = config or SWEBenchConfig()
        self.docker = docker or DockerCLI()
        self.tools: ToolSet = coding_tools(allow_shell=True)
        self._instance: SWEBenchInstance | None = None
        self._containers: list[str] = []
        self._done = False

    def system_prompt(self) -> str:
        return SYSTEM_PROMPT.format(repo_dir=REPO_DIR, tools=self.tools.describe())

    async def reset(self, instance: SWEBenchInstance) -> str:
        if not isinstance(instance, SWEBenchInstance):
            raise TaskError(f"SWEBenchEnv.reset needs a SWEBenchInstance, got {type(instance).__name__}")
        repo_spec(instance.repo, instance.version)  # refuse unknown repositories before any Docker work
        await self.close()
        await self.docker.check()
        image = self.config.images.image(instance.instance_id)
        if not await self.docker.image_exists(image):
            raise EnvUnavailableError(
                f"the SWE-bench image {image} for {instance.instance_id} is not present locally: build it with "
                f"the swebench harness (python -m swebench.harness.prepare_images --instance_ids "
                f"{instance.instance_id}) or pull it (set env.image_namespace: swebench to use Docker Hub names)")
        self._containers.append(await self.docker.start(image, instance.instance_id))
        self._instance, self._done = instance, False
        return build_prompt(instance, self.config.include_hints)

    async def step(self, call: ToolCall) -> StepResult:
        instance, container = self._require()
        if self._done:
            raise EnvError(f"episode {instance.instance_id} is already done (submit was called)")
        if self.tools.get(call.name) is None:
            return StepResult(f"Error: unknown tool {call.name!r}; the tools are: {', '.join(self.tools.names)}",
                              info={"tool": call.name, "error": "unknown_tool"})
        try:
            result: StepResult = await getattr(self, f"_tool_{call.name}")(instance, container, call.args)
        except PathRefused as e:
            result = StepResult(str(e), info={"tool": call.name, "error": "refused"})
        if call.ignored_calls and not result.done:
            note = f"[note: only the first tool call of a reply runs; {call.ignored_calls} more ignored]\n"
            result = StepResult(note + result.observation, result.reward, result.done, result.info)
        return result

    async def close(self) -> None:
        containers, self._containers = self._containers, []
        for c in containers:
            await self.docker.remove(c)

    # ------------------------------------------------------------------------------- tools
    async def _sh(self, container: str, script: str, stdin: bytes | None = None, time_s: float | None = None,
                  max_chars: int | None = None) -> ProcResult:
        """Run ``script`` in ``container``; ``max_chars`` is raised for data (files, patches, logs)
        that must come back whole, not clipped like an observation."""
        base = self.config.command
        limits = SandboxLimits(time_s=time_s or base.time_s, max_output_chars=max_chars or base.max_output_chars)
        return await self.docker.exec(container, script, limits, stdin=stdin)

    async def _read(self, container: str, path: str) -> str:
        res = await self._sh(container, f"cat -- {shlex.quote(path)}", max_chars=DATA_CHARS)
        if res.returncode != 0:
            raise PathRefused(f"Error: cannot read {path}: {res.output.strip()[-300:]}")
        return res.output

    async def _tool_view(self, inst: SWEBenchInstance, container: str, args: dict[str, str]) -> StepResult:
        path = container_path(args["path"])
        q = shlex.quote(path)
        rng = args.get("lines", "").strip()
        sed = ""
        if rng:
            a, _, b = rng.partition("-")
            if not a.isdigit() or (b and not b.isdigit()):
                raise PathRefused(f"Error: lines={rng!r} is not a range START-END of numbers")
            sed = f" | sed -n '{int(a)},{int(b) if b else int(a)}p'"
        script = (f"if [ -d {q} ]; then find {q} -maxdepth 2 -not -path '*/.*' | sort | head -400; "
                  f"elif [ -f {q} ]; then cat -n -- {q}{sed}; else echo {shlex.quote(f'Error: {path} does not exist')}; fi")
        res = await self._sh(container, script)
        return StepResult(clip_text(res.output, self.config.max_observation_chars, "file"), info={"tool": "view"})

    async def _tool_edit(self, inst: SWEBenchInstance, container: str, args: dict[str, str]) -> StepResult:
        path = container_path(args["path"])
        new_text = apply_edit(await self._read(container, path), args["old"], args["new"], args["path"])
        await self._write(container, path, new_text)
        return StepResult(f"Edited {args['path']}.", info={"tool": "edit"})

    async def _tool_write(self, inst: SWEBenchInstance, container: str, args: dict[str, str]) -> StepResult:
        path = container_path(args["path"])
        await self._write(container, path, args["content"])
        return StepResult(f"Wrote {args['path']}.", info={"tool": "write"})

    async def _write(self, container: str, path: str, content: str) -> None:
        q = shlex.quote(path)
        res = await self._sh(container, f"mkdir -p -- \"$(dirname -- {q})\" && cat > {q}", stdin=content.encode())
        if res.returncode != 0:
            raise PathRefused(f"Error: cannot write {path}: {res.output.strip()[-300:]}")

    async def _tool_run_tests(self, inst: SWEBenchInstance, container: str, args: dict[str, str]) -> StepResult:
        target = args.get("target") or None
        cmd = build_test_command(inst, shlex.quote(target) if target else None)
        res = await self._sh(container, " && ".join([*activate_lines(), cmd]))
        body = clip_text(res.output, self.config.max_observation_chars, "test output")
        return StepResult(f"[{res.describe()}]\n{body}", info={"tool": "run_tests", "returncode": res.returncode})

    async def _tool_shell(self, inst: SWEBenchInstance, container: str, args: dict[str, str]) -> StepResult:
        res = await self._sh(container, " && ".join([*activate_lines(), args["cmd"]]))
        body = clip_text(res.output, self.config.max_observation_chars, "command output")
        return StepResult(f"[{res.describe()}]\n{body}", info={"tool": "shell", "returncode": res.returncode})

    async def _tool_submit(self, inst: SWEBenchInstance, container: str, args: dict[str, str]) -> StepResult:
        diff = await self._sh(container, f"cd {REPO_DIR} && git add -A && git diff --cached --no-color", max_chars=DATA_CHARS)
        patch = diff.output if diff.returncode == 0 else ""
        self._done = True
        if not patch.strip():
            return StepResult("Submitted an empty patch: not resolved (reward 0.00).", reward=0.0, done=True,
                              info={"tool": "submit", "resolved": False, "status": "EMPTY_PATCH"})
        log = await self.evaluate(inst, patch)
        g = grade(inst, log)
        verdict = "resolved" if g.resolved else "not resolved"
        return StepResult(f"Submitted: {verdict} (reward {g.reward:.2f}).", reward=g.reward, done=True,
                          info={"tool": "submit", **g.as_info(), "patch_chars": len(patch)})

    async def evaluate(self, inst: SWEBenchInstance, patch: str) -> str:
        """The harness evaluation of ``patch`` in a fresh container; returns the full log."""
        fresh = await self.docker.start(self.config.images.image(inst.instance_id), f"eval-{inst.instance_id}")
        self._containers.append(fresh)
        await self._sh(fresh, f"cat > {CONTAINER_PATCH_FILE}", stdin=patch.encode())
        applied = await self._sh(fresh, apply_patch_script())
        log = applied.output
        if applied.returncode == 0:
            await self._sh(fresh, "cat > /eval.sh", stdin=eval_script(inst).encode())
            res = await self._sh(fresh, "bash /eval.sh 2>&1", time_s=self.config.eval_timeout_s, max_chars=DATA_CHARS)
            log += "\n" + res.output
            if res.timed_out:
                log += "\n>>>>> Tests Timed Out"
        return log

    def _require(self) -> tuple[SWEBenchInstance, str]:
        if self._instance is None or not self._containers:
            raise EnvError("SWEBenchEnv.step called before reset (or after close)")
        return self._instance, self._containers[0]


def container_path(rel: str) -> str:
    """The absolute container path of agent path ``rel``; must stay under ``/testbed``."""
    rel = rel.strip()
    if not rel or "\x00" in rel:
        raise PathRefused("Error: give a path relative to the repository root, e.g. src/module.py")
    joined = posixpath.normpath(rel if rel.startswith("/") else posixpath.join(REPO_DIR, rel))
    if joined != REPO_DIR and not joined.startswith(REPO_DIR + "/"):
        raise PathRefused(f"Error: path {rel!r} refused: it is outside the repository {REPO_DIR}")
    return joined
