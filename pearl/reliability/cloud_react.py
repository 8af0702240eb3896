"""How fast a cloud notice becomes a shrink: ``python -m pearl.reliability.cloud_react [--runs N]
[--period S]``.

Real, in real time (wall clock, ``time.monotonic``): the emulated ``pearl serve`` ``Service``
(``configs/emulated-demo.yaml``) with its cloud watch on AWS (``cloud_watch.aws``) pointed at a
local instance-metadata server on 127.0.0.1 speaking IMDSv2 (``PUT /latest/api/token``, then
``spot/instance-action``: 404 until the test publishes a document). Each run grants one GPU of
instance ``i-<n>``, waits a random part of the poll period (seeded), publishes
``{"action": "terminate", "time": <now>}`` (due at once) and measures
the time from publishing to the controller starting the shrink of that GPU (the ``started_at``
of the Elastic Scheduler's ``shrink`` entry, awaited with ``ElasticScheduler.watch``). Expected: about half the poll period on average, one
period at most, plus the gate and the controller's queue. Prints one JSON object: every reaction
in seconds, the median and the maximum.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web


class LocalImds:
    """A minimal EC2 instance-metadata server (IMDSv2) whose spot/instance-action can be set."""

    def __init__(self, instance_id: str) -> None:
        self.instance_id = instance_id
        self.action: dict[str, str] | None = None
        self._runner: web.AppRunner | None = None
        self.url = ""

    def publish(self, action: dict[str, str]) -> None:
        """spot/instance-action answers ``action`` from now on (404 before)."""
        self.action = action

    async def start(self) -> None:
        app = web.Application()
        app.router.add_put("/latest/api/token", self._token)
        app.router.add_get("/latest/meta-data/{path:.*}", self._get)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    async def _token(self, request: web.Request) -> web.Response:
        return web.Response(text="local-token")

    async def _get(self, request: web.Request) -> web.Response:
        if request.headers.get("X-aws-ec2-metadata-token") != "local-token":
            return web.Response(status=401)
        path = request.match_info["path"]
        if path == "instance-id":
            return web.Response(text=self.instance_id)
        if path == "spot/instance-action" and self.action is not None:
            return web.Response(text=json.dumps(self.action))
        return web.Response(status=404)

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


async def measure(runs: int, period_s: float, out_dir: Path, seed: int = 0) -> dict[str, Any]:
    from pearl.config import RunConfig, load_config
    from pearl.runtime.clock import LoopClock
    from pearl.serve import Service

    root = Path(__file__).resolve().parents[2]
    reactions: list[float] = []
    rng = random.Random(seed)
    for n in range(runs):
        imds = LocalImds(f"i-{n:04d}")
        await imds.start()
        d = load_config(str(root / "configs/emulated-demo.yaml")).model_dump()
        d["admin"].update(tensorboard=False, port=0)
        d["output_dir"] = str(out_dir / f"run{n}")
        d["cloud_watch"] = {"aws": True, "aws_url": imds.url, "period_s": period_s, "timeout_s": 2.0}
        svc = Service(RunConfig.model_validate(d), LoopClock(), port=0, journal=False)
        await svc.start()
        try:
            assert svc.admin is not None and svc.controller is not None
            app, ctrl = svc.admin.admin, svc.controller
            await app.grant_gpus([{"gpu_id": "p0", "node": "node0", "instance_id": imds.instance_id}], f"grant-{n}")
            await ctrl.elastic.idle()
            shrunk = ctrl.elastic.watch("shrink")
            await asyncio.sleep(rng.uniform(0.0, period_s))  # publish at a random phase of the poll cycle
            t0 = ctrl.clock.now()  # LoopClock: the loop's time.monotonic
            imds.publish({"action": "terminate", "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")})
            reactions.append(float((await asyncio.wait_for(shrunk, 60))["started_at"]) - t0)
        finally:
            await svc.stop()
            await imds.close()
    return {"clock": "real (time.monotonic)", "poll_period_s": period_s, "runs": runs,
            "reaction_s": [round(r, 4) for r in reactions], "median_s": round(statistics.median(reactions), 4),
            "max_s": round(max(reactions), 4)}


def main(argv: list[str] | None = None) -> None:
    import tempfile

    ap = argparse.ArgumentParser(description="cloud notice -> shrink reaction time (real clock)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--period", type=float, default=2.0, help="cloud_watch.period_s")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(asyncio.run(measure(args.runs, args.period, Path(tmp)))))


if __name__ == "__main__":
    main()
