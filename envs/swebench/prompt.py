"""The first user message of a SWE-bench episode, built from the instance's problem statement.

The wording follows the common SWE-bench agent prompts (SWE-agent / OpenHands style): where the
repository is, the issue between tags, and what counts as done. The issue text is clipped to
``max_issue_chars`` (head kept) so that a huge statement cannot eat the trajectory token limit;
hints (``hints_text``) are included only when asked, since SWE-bench evaluation normally hides them.
"""

from __future__ import annotations

from envs.swebench.dataset import SWEBenchInstance
from envs.swebench.harness import REPO_DIR

SYSTEM_PROMPT = """You are a software engineer working in a Linux container on a Python repository.
Resolve the issue you are given by editing the repository's non-test source files.
Paths are relative to the repository root {repo_dir} (absolute paths under {repo_dir} also work).
When you are done, submit: hidden tests then decide whether the issue is resolved.

{tools}"""


def build_prompt(instance: SWEBenchInstance, include_hints: bool = False, max_issue_chars: int = 12_000) -> str:
    issue = instance.problem_statement.strip()
    if len(issue) > max_issue_chars:
        issue = issue[:max_issue_chars] + f"\n[... issue text cut at {max_issue_chars} characters ...]"
    parts = [
        f"<uploaded_files>\n{REPO_DIR}\n</uploaded_files>",
        f"I've uploaded a Python code repository in the directory {REPO_DIR} "
        f"(repository {instance.repo}, version {instance.version}, commit {instance.base_commit[:12]}). "
        "Consider the following issue:",
        f"<issue>\n{issue}\n</issue>",
    ]
    if include_hints and instance.hints_text.strip():
        parts.append(f"<hints>\n{instance.hints_text.strip()}\n</hints>")
    parts.append("Make the minimal changes to non-test files in the repository so that the issue is resolved. "
                 "The tests that check the fix are hidden; you may write and run your own checks. "
                 "Then submit.")
    return "\n\n".join(parts)
