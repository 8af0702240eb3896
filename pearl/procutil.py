"""Child-process helpers shared by everything that spawns servers or trainer ranks.

``free_port(host)`` asks the kernel for a free TCP port on ``host`` (bind to port 0).

``die_with_parent`` runs in the child between fork and exec (``preexec_fn``): Linux then sends the
child SIGTERM when its parent dies, so a crashed or killed owner (a ``kill -9`` of ``pearl run``, a
timed-out test) never leaves vLLM servers or trainer ranks running. SIGTERM, not SIGKILL, so a
server can still stop its own engine-core / worker children.
"""

from __future__ import annotations

import ctypes
import signal
import socket
import sys

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent() -> None:
    """``prctl(PR_SET_PDEATHSIG, SIGTERM)`` in the calling (child) process; no-op off Linux."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
