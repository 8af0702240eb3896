"""The contract tests run SGLang's own code from ``.sglang`` (``tests/contract/sglang_env.py``), each in
child processes, so nothing of SGLang is imported into the test process; they skip, saying so,
only when that folder has not been built (``make setup`` builds it)."""

from __future__ import annotations

import pytest

from .sglang_env import MISSING, installed


@pytest.fixture(scope="session")
def sglang_installed() -> None:
    """``.sglang`` is built."""
    if not installed():
        pytest.skip(MISSING)
