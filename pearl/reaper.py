"""A server's reaper: kills the server's process group when the process that owns it dies.

Why: ``die_with_parent`` (``PR_SET_PDEATHSIG``) sends a server SIGTERM when its owner dies, but a
vLLM API server still starting up does not exit on SIGTERM (measured: after a ``kill -9`` of the
owner during start-up it finished loading and kept serving, parent PID 1), and its
``VLLM::EngineCore`` child survives even a SIGKILL of the API server. Every server leads its own
process group (``start_new_session``), so killing that group is what stops all of it.

Life cycle: ``ChildServer.start`` spawns ``python -m pearl.reaper --owner PID --pgid PGID`` right
after the server, in a session of its own (a signal to the owner's group does not reach it). The
reaper gets ``PR_SET_PDEATHSIG=SIGTERM`` for its owner and also polls every ``--poll`` seconds (the
death signal is lost if the owner died before ``prctl`` ran). It exits quietly when the group is
gone (a normal stop); when the owner is gone first it sends the group SIGTERM, then SIGKILL after
``--grace`` seconds, and exits. It imports nothing but the standard library (starts in ~30 ms).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import sys
import time

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def owner_alive(owner: int) -> bool:
    """The owner is our parent: once it dies we are re-parented, so ``getppid`` changes."""
    return os.getppid() == owner


def reap(pgid: int, grace_s: float, poll_s: float) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    end = time.monotonic() + grace_s
    while time.monotonic() < end and group_alive(pgid):
        time.sleep(min(poll_s, 0.2))
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pearl.reaper", description=__doc__.split("\n")[0])
    ap.add_argument("--owner", type=int, required=True, help="PID of the owning process (our parent)")
    ap.add_argument("--pgid", type=int, required=True, help="process group of the server to reap")
    ap.add_argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL")
    ap.add_argument("--poll", type=float, default=1.0, help="seconds between liveness checks")
    a = ap.parse_args(argv)
    owner_gone = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal owner_gone
        owner_gone = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the owner; it stops its servers itself
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    while True:
        if not group_alive(a.pgid):
            return 0
        if owner_gone or not owner_alive(a.owner):
            reap(a.pgid, a.grace, a.poll)
            return 0
        time.sleep(a.poll)


if __name__ == "__main__":
    sys.exit(main())
