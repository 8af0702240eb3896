"""The repofix environment: SWE-style bug fixing on small local projects (see ``envs.repofix.env``)."""

from envs.repofix.env import RepoFixConfig, RepoFixEnv
from envs.repofix.tasks import RepoFixTask, available_projects, generate_tasks

__all__ = ["RepoFixConfig", "RepoFixEnv", "RepoFixTask", "available_projects", "generate_tasks"]
