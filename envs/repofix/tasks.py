"""Repofix tasks: (project, injected bug) pairs, validated against the project's own tests.

Life cycle: ``generate_tasks(n, seed)`` runs once per run (before rollout). For each project it
lists every mutation site (``envs.repofix.mutate``), shuffles them with ``random.Random(seed)``,
and takes sites round-robin over the projects. Each candidate is applied in a scratch checkout
and the tests are run (sandboxed): a candidate is kept only if at least one test fails and the run
finishes in time (equivalent mutants and infinite loops are dropped). The failing tests become the
task's FAIL_TO_PASS list, the rest PASS_TO_PASS, and the first failure's message the "issue text".
The same ``(n, seed, projects)`` always gives the same tasks.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

from envs.base import TaskError
from envs.repofix.mutate import Mutation, apply_mutation, project_sites
from envs.repofix.testrun import SuiteRun, run_tests
from envs.sandbox import Checkout, SandboxLimits

PROJECTS_DIR = Path(__file__).resolve().parent / "projects"
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".*")


def available_projects() -> tuple[str, ...]:
    return tuple(sorted(p.name for p in PROJECTS_DIR.iterdir() if (p / "tests").is_dir()))


def project_dir(name: str) -> Path:
    path = PROJECTS_DIR / name
    if not (path / "tests").is_dir():
        raise TaskError(f"unknown repofix project {name!r}; known: {', '.join(available_projects())}")
    return path


@dataclass(frozen=True, slots=True)
class RepoFixTask:
    """One task: a project with one injected bug and the tests that expose it."""

    task_id: str
    project: str
    mutation: Mutation
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    failure_excerpt: str  # the first failing test's report, shown as the issue text


def copy_project(name: str, dest: Path) -> None:
    """Copy the pristine project ``name`` into the (existing, empty) directory ``dest``."""
    shutil.copytree(project_dir(name), dest, ignore=_IGNORE, dirs_exist_ok=True)


def write_mutant(root: Path, m: Mutation) -> None:
    path = root / m.file
    path.write_text(apply_mutation(path.read_text(), m))


def _first_failure(output: str, max_chars: int = 1200) -> str:
    """The first FAIL/ERROR report of a unittest run (header, traceback, message)."""
    start = output.find("=" * 70)
    if start < 0:
        return ""
    ends = [k for k in (output.find("\n" + "=" * 70, start + 70), output.find("\n" + "-" * 70 + "\nRan ", start))
            if k > 0]
    block = output[start:min(ends)] if ends else output[start:]
    return block.strip()[:max_chars]


async def validate(project: str, m: Mutation, limits: SandboxLimits, scratch_parent: Path | None = None
                   ) -> RepoFixTask | None:
    """Run the tests on the mutant; the task, or None if no test fails or the run times out."""
    co = Checkout.create(prefix=f"pearl-validate-{project}-", parent=scratch_parent)
    try:
        copy_project(project, co.root)
        write_mutant(co.root, m)
        run: SuiteRun = await run_tests(co.root, limits)
    finally:
        co.remove()
    if run.proc.timed_out or run.proc.returncode < 0 or not run.status:
        return None
    failed = tuple(run.failed)
    if not failed:
        return None
    stem = Path(m.file).stem
    digest = hashlib.sha1(f"{m.file}:{m.line}:{m.col}:{m.kind}:{m.replacement}".encode()).hexdigest()[:8]
    task_id = f"{project}.{stem}.L{m.line}.{m.kind}.{digest}"
    passed = tuple(run.passed)
    return RepoFixTask(task_id, project, m, failed, passed, _first_failure(run.proc.output))


async def generate_tasks(n: int, seed: int = 0, projects: tuple[str, ...] | None = None,
                         limits: SandboxLimits | None = None, concurrency: int = 2) -> tuple[RepoFixTask, ...]:
    """``n`` validated tasks, deterministic in ``(n, seed, projects)`` (see the module docstring)."""
    if n < 1:
        raise TaskError(f"generate_tasks: n={n} must be at least 1")
    names = projects or available_projects()
    for name in names:
        project_dir(name)
    limits = limits or SandboxLimits(time_s=5.0)
    rng = random.Random(seed)
    queues: list[list[tuple[str, Mutation]]] = []
    for name in names:
        sites = [(name, m) for m in project_sites(project_dir(name))]
        rng.shuffle(sites)
        queues.append(sites)
    order: list[tuple[str, Mutation]] = []
    while any(queues):
        for q in queues:
            if q:
                order.append(q.pop(0))
    tasks: list[RepoFixTask] = []
    pos = 0
    while len(tasks) < n and pos < len(order):
        batch = order[pos:pos + max(concurrency, n - len(tasks))]
        pos += len(batch)
        sem = asyncio.Semaphore(concurrency)

        async def one(item: tuple[str, Mutation], sem: asyncio.Semaphore = sem) -> RepoFixTask | None:
            async with sem:
                return await validate(item[0], item[1], limits)

        results = await asyncio.gather(*(one(item) for item in batch))
        tasks.extend(t for t in results if t is not None)
    if len(tasks) < n:
        raise TaskError(f"only {len(tasks)} of the requested {n} repofix tasks could be made from projects "
                        f"{list(names)}: lower env.num_tasks or add projects")
    return tuple(tasks[:n])
