"""Structured logging for PEARL processes (``setup_logging``), plain text or one JSON object per line.

Life cycle: each process (``pearl/main.py`` rank, ``pearl serve``) calls ``setup_logging`` once at
start; it installs one handler on the root logger, replacing any handler it installed before, so
calling it twice is harmless. Records carry ``rank`` (from ``RANK``, default 0).

JSON lines: ``{"t": <POSIX s>, "level": "INFO", "logger": "pearl.admin", "rank": 0, "msg": "...",
...extra}`` where ``extra`` are the ``extra={...}`` fields a call passes, and ``exc`` the formatted
traceback if any.

Secrets: ``RedactFilter`` replaces every occurrence of the given secrets (the admin token) by
``***`` in everything a formatter can emit: the final message (``msg`` with its ``args``), the
traceback text (``exc_info`` is formatted into ``exc_text`` once and redacted, then dropped, so no
formatter formats the raw exception again) and ``stack_info``. Extra fields are redacted too (JSON
lines emit them). The admin API never logs headers; this is the second line of defence for what a
library logs on its own (aiohttp's parser errors quote the offending header or request line).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterable
from typing import Any, TextIO

_STD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None)).keys()) | {"message", "asctime"}
_MARK = "_pearl_handler"


class JsonFormatter(logging.Formatter):
    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "t": round(record.created, 6),
            "level": record.levelname,
            "logger": record.name,
            "rank": self.rank,
            "msg": record.getMessage(),
        }
        for k, v in vars(record).items():
            if k not in _STD_ATTRS and not k.startswith("_"):
                out[k] = v if isinstance(v, str | int | float | bool | type(None)) else repr(v)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = record.stack_info
        return json.dumps(out, default=repr)


class RedactFilter(logging.Filter):
    """Replace secrets in everything a record can emit (message, traceback, stack, extras) by ``***``."""

    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        self.secrets = [s for s in secrets if s]
        self._fmt = logging.Formatter()

    def _red(self, text: str) -> str:
        for s in self.secrets:
            text = text.replace(s, "***")
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.secrets:
            return True
        try:
            msg = record.getMessage()
        except Exception:  # a bad format string: keep its parts, redacted
            msg = f"{record.msg} {record.args!r}"
        record.msg, record.args = self._red(msg), ()
        if record.exc_info:
            if not record.exc_text:
                record.exc_text = self._fmt.formatException(record.exc_info)
            record.exc_info = None
        if record.exc_text:
            record.exc_text = self._red(record.exc_text)
        if record.stack_info:
            record.stack_info = self._red(record.stack_info)
        for k, v in list(vars(record).items()):
            if k not in _STD_ATTRS and not k.startswith("_") and isinstance(v, str):
                setattr(record, k, self._red(v))
        return True


def setup_logging(level: str | int = "INFO", json_lines: bool = False, secrets: Iterable[str] = (),
                  stream: TextIO | None = None) -> logging.Handler:
    """Install PEARL's handler on the root logger (text or JSON lines) and return it."""
    rank = int(os.environ.get("RANK", "0") or 0)
    handler = logging.StreamHandler(stream or sys.stderr)
    setattr(handler, _MARK, True)
    if json_lines:
        handler.setFormatter(JsonFormatter(rank))
    else:
        handler.setFormatter(logging.Formatter(f"%(asctime)s [r{rank}] %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactFilter(secrets))
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, _MARK, False):
            root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING if root.level <= logging.INFO else root.level)
    return handler
