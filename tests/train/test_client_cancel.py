"""A rank-0 command cancelled after it was sent (a weight broadcast whose receivers refused the
update) leaves its reply in the pipe: the next command must get its own reply, not that one.

The rank is a stand-in process speaking the trainer's line protocol (``pearl.train.trainer.serve``:
a ready line, then one JSON reply per command line); its broadcast answers only after a delay, as a
real rank blocked in a broadcast nobody joined answers at its group's timeout."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from pearl.config import TrainSpec
from pearl.train.client import TrainerClient

RANK = r'''
import json, sys, time
print(json.dumps({"ok": True, "step": 0}), flush=True)
for line in sys.stdin:
    cmd = json.loads(line)["cmd"]
    if cmd == "bcast":
        time.sleep(1.0)
        print(json.dumps({"ok": True, "version": 0, "tensors": 1, "buckets": 1, "bytes": 4, "seconds": 1.0}), flush=True)
    else:
        print(json.dumps({"ok": True, "layout": [["float32", [["answer-to", [1]]]]], "cmd": cmd}), flush=True)
'''


@pytest.fixture
def stand_in_python(tmp_path: Path) -> str:
    """An executable that ignores the trainer's argv and runs the stand-in rank."""
    (tmp_path / "rank.py").write_text(RANK)
    exe = tmp_path / "rank"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {tmp_path / 'rank.py'}\n")
    exe.chmod(0o755)
    return str(exe)


async def test_a_cancelled_broadcast_never_answers_the_next_command(stand_in_python: str, tmp_path: Path) -> None:
    client = TrainerClient(tmp_path / "model", tmp_path / "work", TrainSpec(), max_staleness=1,
                           python=stand_in_python)
    await client.start()
    try:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(client.broadcast(), 0.2)
        layout = await asyncio.wait_for(client.weight_layout(), 10)
        assert layout == [["float32", [["answer-to", [1]]]]]
        layout = await asyncio.wait_for(client.weight_layout(), 10)  # and the pairing holds after
        assert layout == [["float32", [["answer-to", [1]]]]]
    finally:
        await client.close()
