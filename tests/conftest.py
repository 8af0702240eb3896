"""Shared pytest setup: the opt-in ``gpu`` marker and paths to local models and shared data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODELS_DIR = Path(os.environ.get("PEARL_MODELS_DIR", ROOT / ".models"))
SHARED_DIR = Path(os.environ.get("PEARL_SHARED_DIR", ROOT.parent / "shared"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-gpu", action="store_true", default=False, help="run tests marked gpu (needs GPUs + SGLang)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-gpu"):
        return
    skip_gpu = pytest.mark.skip(reason="needs a GPU host: run with `make test-gpu` (pytest -m gpu --run-gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
