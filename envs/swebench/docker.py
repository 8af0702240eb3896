"""The Docker boundary: a thin async wrapper over the ``docker`` CLI (no SDK dependency).

Life cycle: ``check()`` once (is there a CLI, does the engine answer?) -> ``image_exists`` ->
``start(image)`` a detached container that idles (``tail -f /dev/null``) with no network and a
memory cap -> any number of ``exec`` (each bounded by ``timeout -s KILL`` *inside* the container
and by the wall clock outside) -> ``remove`` (``docker rm -f``; idempotent).

Every failure of the boundary raises ``EnvUnavailableError`` naming what is missing and what to do:
no CLI on PATH, engine not reachable (the typical "Cannot connect to the Docker daemon"), image not
present locally. Commands the agent runs that fail are *not* errors: they are results.
"""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from envs.base import EnvError, EnvUnavailableError
from envs.sandbox import ProcResult, SandboxLimits, run_limited


@dataclass(frozen=True, slots=True)
class DockerConfig:
    binary: str = "docker"
    memory: str = "8g"  # docker --memory
    cpus: float = 2.0
    network: str = "none"  # episodes are offline
    control_timeout_s: float = 120.0  # docker run / rm / inspect


class DockerCLI:
    def __init__(self, config: DockerConfig | None = None) -> None:
        self.config = config or DockerConfig()
        self._checked = False

    def _control(self) -> SandboxLimits:
        return SandboxLimits(time_s=self.config.control_timeout_s, memory_mb=0, max_output_chars=64_000)

    async def _docker(self, *args: str, stdin: bytes | None = None, limits: SandboxLimits | None = None
                      ) -> ProcResult:
        exe = shutil.which(self.config.binary)
        if exe is None:
            raise EnvUnavailableError(
                f"the Docker CLI {self.config.binary!r} is not on PATH: install Docker (docker.com/get-docker) "
                "or set env.docker_binary; SWE-bench episodes run in Docker containers")
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "DOCKER_HOST", "DOCKER_CONFIG",
                                                              "DOCKER_CONTEXT", "DOCKER_CERT_PATH",
                                                              "DOCKER_TLS_VERIFY")}
        return await run_limited([exe, *args], Path.cwd(), limits or self._control(), env=env, stdin=stdin)

    async def check(self) -> None:
        """Raise ``EnvUnavailableError`` unless a Docker engine answers."""
        if self._checked:
            return
        res = await self._docker("version", "--format", "{{.Server.Version}}")
        if res.returncode != 0 or not res.output.strip() or "Cannot connect" in res.output:
            detail = res.output.strip().splitlines()[-1] if res.output.strip() else res.describe()
            raise EnvUnavailableError(
                f"no Docker engine is reachable ({detail}): start the Docker daemon (e.g. `sudo systemctl start "
                "docker`) or point DOCKER_HOST at one; SWE-bench episodes need it (the repofix env does not)")
        self._checked = True

    async def image_exists(self, image: str) -> bool:
        res = await self._docker("image", "inspect", "--format", "{{.Id}}", image)
        return res.returncode == 0

    async def start(self, image: str, name_hint: str) -> str:
        """Start an idle container of ``image``; returns its name."""
        safe = "".join(c if c.isalnum() or c in "_.-" else "-" for c in name_hint.lower())[:60]
        name = f"pearl-{safe}-{uuid.uuid4().hex[:8]}"
        res = await self._docker("run", "-d", "--name", name, "--network", self.config.network,
                                 "--memory", self.config.memory, "--cpus", str(self.config.cpus),
                                 "--entrypoint", "tail", image, "-f", "/dev/null")
        if res.returncode != 0:
            raise EnvError(f"docker run of {image} failed ({res.describe()}): {res.output.strip()[-500:]}")
        return name

    async def exec(self, container: str, script: str, limits: SandboxLimits, stdin: bytes | None = None,
                   workdir: str = "/testbed") -> ProcResult:
        """Run ``bash -c script`` in ``container``; killed inside after ``limits.time_s``."""
        t = max(1, int(limits.time_s))
        outer = SandboxLimits(time_s=limits.time_s + 10.0, memory_mb=0, max_output_chars=limits.max_output_chars)
        args = ["exec", *(["-i"] if stdin is not None else []), "-w", workdir, container,
                "timeout", "-s", "KILL", str(t), "bash", "-c", script]
        res = await self._docker(*args, stdin=stdin, limits=outer)
        if res.returncode == 137 and not res.timed_out:  # killed by `timeout -s KILL` in the container
            return ProcResult(res.returncode, res.output, True, res.omitted_chars)
        return res

    async def remove(self, container: str) -> None:
        await self._docker("rm", "-f", container)
