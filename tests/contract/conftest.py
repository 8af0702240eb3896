"""The contract tests run SGLang's own code from ``.sglang`` (``tests/contract/sglang_env.py``), each in
child processes, so nothing of SGLang is imported into the test process; without that folder
(``make setup`` builds it) they skip, saying so, on a developer's machine and fail under CI."""

from __future__ import annotations

import pytest

from tests.conftest import missing_setup

from .sglang_env import MISSING, installed


@pytest.fixture(scope="session")
def sglang_installed() -> None:
    """``.sglang`` is built."""
    if not installed():
        missing_setup(MISSING)
