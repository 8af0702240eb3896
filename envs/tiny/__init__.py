"""The tiny environment (see ``envs.tiny.env``)."""

from envs.tiny.env import TinyEnv, TinyTask, make_tiny_tasks, score

__all__ = ["TinyEnv", "TinyTask", "make_tiny_tasks", "score"]
