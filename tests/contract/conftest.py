"""The contract tests run against SGLang's own code from ``.sglang`` (``tests/contract/sglang_env.py``);
they skip, saying so, only when that folder has not been built (``make setup`` builds it)."""

from __future__ import annotations

import pytest

from .sglang_env import MISSING, import_sglang, use_sglang


@pytest.fixture(scope="session")
def sglang_modules() -> object:
    """SGLang's modules the tests use (imported once; a few tens of seconds on 2 cores)."""
    mods = import_sglang()
    if mods is None:
        pytest.skip(MISSING)
    return mods


@pytest.fixture(scope="session")
def sglang_installed() -> None:
    """``.sglang`` is built (for tests that run SGLang's code in their own processes)."""
    if not use_sglang():
        pytest.skip(MISSING)
