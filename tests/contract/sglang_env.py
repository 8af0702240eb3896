"""SGLang's own Python code, importable on this CPU for the contract tests.

``scripts/setup_sglang.sh`` (run by ``make setup``) installs the pinned SGLang wheel ``--no-deps``
into ``<repo>/.sglang``; ``use_sglang()`` appends that folder to ``sys.path`` *after* the venv's
site-packages, so every package the venv has (torch 2.13 CPU, transformers, fastapi, uvicorn,
msgspec, zmq, ...) is the venv's own and only SGLang and its few missing pure dependencies come
from ``.sglang``.

One thing is stubbed, and only while two of SGLang's modules execute: ``torchvision``. The venv
has none (PyPI's torchvision is CUDA-linked and fails beside the CPU torch; ``scripts/setup.sh``
removes it), and SGLang's model-config package imports two vision modules at module level
(``srt/multimodal/internvl_utils.py``, ``srt/configs/deepseek_ocr.py``: image transforms for
InternVL and DeepSeek-OCR, never called by a text model). ``_VisionOnlyTorchvision`` runs those two
modules' real code with a stub ``torchvision`` in ``sys.modules`` and removes it as soon as each
module has executed, so transformers (which probes ``find_spec("torchvision")`` to pick its
image backends) never sees a torchvision. Nothing CUDA-related needs stubbing for the modules the
tests use: SGLang's CUDA kernels are imported lazily or guarded by platform checks on a CPU host.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SGLANG_DIR = ROOT / ".sglang"
SGLANG_VERSION = "0.5.23"
#: SGLang modules that import torchvision at module level (image preprocessing of vision models)
VISION_MODULES = frozenset({"sglang.srt.multimodal.internvl_utils", "sglang.srt.configs.deepseek_ocr"})
MISSING = (f"SGLang {SGLANG_VERSION} is not installed in {SGLANG_DIR} (run `make setup`, or "
           f"`bash scripts/setup_sglang.sh`)")


class _StubModule(types.ModuleType):
    """A module whose every attribute is a fresh placeholder class (``T.Compose``,
    ``InterpolationMode``, ``functional``): enough for module-level imports and annotations."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = type(name, (), {"__module__": self.__name__})
        setattr(self, name, value)
        return value


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        mod = _StubModule(spec.name)
        mod.__path__ = []
        return mod

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class _StubFinder(importlib.abc.MetaPathFinder):
    """Serves ``torchvision`` and its submodules as stubs (installed only while a vision module runs)."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, _StubLoader(), is_package=True)
        return None


class _ScopedLoader(importlib.abc.Loader):
    """Runs a vision module's real code with the torchvision stub present, then removes the stub."""

    def __init__(self, real: importlib.abc.Loader) -> None:
        self.real = real

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.real.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        stub = _StubFinder()
        sys.meta_path.insert(0, stub)
        try:
            self.real.exec_module(module)
        finally:
            sys.meta_path.remove(stub)
            for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
                del sys.modules[name]


class _VisionOnlyTorchvision(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name not in VISION_MODULES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _ScopedLoader(spec.loader)
        return spec


def installed() -> bool:
    """``.sglang`` holds SGLang (checked without touching ``sys.path``)."""
    return (SGLANG_DIR / "sglang" / "__init__.py").is_file()


def use_sglang() -> bool:
    """Make ``import sglang`` resolve to ``.sglang`` in this process (idempotent; the child
    processes of the contract tests call it, never the test process); False if not installed."""
    if not installed():
        return False
    if str(SGLANG_DIR) not in sys.path:
        sys.path.append(str(SGLANG_DIR))
    if not any(isinstance(f, _VisionOnlyTorchvision) for f in sys.meta_path):
        sys.meta_path.insert(0, _VisionOnlyTorchvision())
    return True

