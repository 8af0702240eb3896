"""The SWE-bench environment (see ``envs.swebench.env``): datasets, harness conventions, grading."""

from envs.swebench.dataset import SWEBenchInstance, load_instances
from envs.swebench.env import SWEBenchConfig, SWEBenchEnv
from envs.swebench.grading import SWEGrade, grade
from envs.swebench.harness import ImageNaming

__all__ = ["ImageNaming", "SWEBenchConfig", "SWEBenchEnv", "SWEBenchInstance", "SWEGrade", "grade",
           "load_instances"]
