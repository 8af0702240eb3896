"""Security and robustness probe of the admin API in front of the *real* controller.

``run_security_probe(fuzz_per_route)`` serves the admin API (``AdminServer`` on a loopback
socket, token from the config) over a real ``Controller`` driving ``InstantEngine`` (no serving
cost), captures every log record of every logger at DEBUG (the aiohttp access log included), and
checks:

* **auth** - every route but ``/healthz`` answers 401 without / with a wrong token, and nothing
  reaches the controller;
* **no secrets in logs** - after requests carrying the token (right, wrong, as a prefix of a
  wrong one, mistakenly in a query string) and a ``GET /v1/config``, the token's text appears in no
  log record and not in the config document;
* **limits** - a body over ``admin.max_body_bytes`` is 413 and not applied; a burst of events
  from one client gets 429s and the controller applies at most the burst allowance;
* **fuzz** - ``fuzz_per_route`` mutated JSON bodies (``pearl.reliability.fuzz.mutate``, seeded) on
  every event and cloud route: no 5xx, and afterwards the controller's scheduler and pipeline
  tasks are alive, its state table is valid, and it still answers.

Returns a ``SecurityReport`` (counts + problems); ``tests/reliability/test_security.py`` asserts
it is clean, ``pearl reliability`` reports it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from dataclasses import dataclass, field
from typing import Any

from pearl.config import RunConfig
from pearl.reliability.fuzz import mutate

TOKEN = "pearl-probe-secret-7f3a9c21d4e8b6a05"

_EVENT_BODIES: dict[str, Any] = {
    "/v1/events/gpus-granted": {"gpus": [{"gpu_id": "spot-9", "node": "n9", "instance_id": "i-9"}]},
    "/v1/events/reclaim-notice": {"gpu_ids": ["spot-9"], "deadline_in_s": 30},
    "/v1/events/notice-cancelled": {"notice_id": "n-1"},
    "/v1/events/training-started": {"step": 1},
    "/v1/events/training-finished": {"step": 1, "weight_version": 1},
    "/v1/cloud/aws/eventbridge": {
        "version": "0", "id": "e-1", "detail-type": "EC2 Spot Instance Interruption Warning", "source": "aws.ec2",
        "time": "2026-11-29T14:00:00Z", "detail": {"instance-id": "i-9", "instance-action": "terminate"}},
    "/v1/cloud/aws/instance-action": {"action": "terminate", "time": "2026-11-29T14:02:00Z", "instance_id": "i-9"},
}


@dataclass
class SecurityReport:
    routes: int = 0
    unauthorized_probes: int = 0
    fuzz_requests: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    log_records_scanned: int = 0
    rate_limited: int = 0
    burst_applied: int = 0
    burst_sent: int = 0
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"routes": self.routes, "unauthorized_probes": self.unauthorized_probes,
                "fuzz_requests": self.fuzz_requests, "statuses": dict(sorted(self.statuses.items())),
                "log_records_scanned": self.log_records_scanned, "burst_sent": self.burst_sent,
                "burst_rate_limited": self.rate_limited, "burst_applied": self.burst_applied,
                "problems": self.problems[:10], "ok": not self.problems}


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:  # a record whose args do not format is still scanned raw
            text = f"{record.msg} {record.args}"
        if record.exc_info:
            text += logging.Formatter().formatException(record.exc_info)
        self.lines.append(text)


def probe_config(seed: int = 0) -> RunConfig:
    from pearl.reliability.chaos import chaos_config

    d = chaos_config(seed=seed).model_dump()
    d["admin"].update(token=TOKEN, port=0, max_events_per_s=20.0)
    d["workload"].update(batch_size=8, group_size=4)
    return RunConfig.model_validate(d)


async def _probe(fuzz_per_route: int, seed: int) -> SecurityReport:
    import aiohttp

    from pearl.admin.app import AdminServer
    from pearl.admin.openapi import ROUTES
    from pearl.reliability.load import InstantEngine
    from pearl.runtime.clock import LoopClock
    from pearl.runtime.controller import Controller
    from pearl.sim.sessions import SyntheticSessionFactory

    cfg = probe_config(seed)
    rep = SecurityReport(routes=len(ROUTES))
    cap = _Capture()
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(cap)
    root.setLevel(logging.DEBUG)
    # every logger that could carry a secret is scanned at full verbosity, whatever an earlier
    # setup_logging() (pearl.obs.logs) left behind, e.g. aiohttp.access raised to WARNING
    scanned = [logging.getLogger(n) for n in ("aiohttp.access", "aiohttp.server", "pearl")]
    old_levels = [lg.level for lg in scanned]
    for lg in scanned:
        lg.setLevel(logging.DEBUG)
    clock = LoopClock()
    ctrl = Controller(cfg, InstantEngine(), SyntheticSessionFactory(cfg.workload, clock), clock=clock, max_batches=1)
    server = AdminServer(ctrl, cfg.admin, clock.now, host="127.0.0.1", port=0, env={})
    rng = random.Random(f"pearl-security/{seed}")
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        await ctrl.start()
        await server.start()
        async with aiohttp.ClientSession(server.url) as http:
            # --- auth on every route but health
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {TOKEN}-x"},
                            {"Authorization": TOKEN}):
                for r in ROUTES:
                    async with http.request(r.method, r.path, json={}, headers=headers) as resp:
                        rep.unauthorized_probes += 1
                        want = 200 if r.path == "/healthz" else 401
                        if resp.status != want:
                            rep.problems.append(f"{r.method} {r.path} with {list(headers) or 'no'} auth: "
                                                f"{resp.status}, expected {want}")
            if ctrl.elastic.history and any(h.get("kind") == "grant" for h in ctrl.elastic.history):
                rep.problems.append("an unauthenticated request reached the controller")
            # --- the token in places it should never be echoed from
            async with http.get(f"/v1/state?token={TOKEN}", headers=auth) as resp:
                await resp.read()
            async with http.get("/v1/config", headers=auth) as resp:
                body = await resp.text()
                if TOKEN in body:
                    rep.problems.append("GET /v1/config shows the admin token")
            # --- body size
            big = {"gpus": [{"gpu_id": f"g{i}" * 50} for i in range(cfg.admin.max_body_bytes // 100 + 10)]}
            async with http.post("/v1/events/gpus-granted", json=big, headers=auth) as resp:
                if resp.status != 413:
                    rep.problems.append(f"a {len(json.dumps(big))}-byte body answered {resp.status}, expected 413")
            # --- fuzzed bodies on every event and cloud route
            for path, base in _EVENT_BODIES.items():
                for _ in range(fuzz_per_route):
                    ops: list[tuple[int, str, Any]] = [
                        (rng.randrange(10_000), rng.choice(["set", "del", "add"]),
                         rng.choice([None, -1, 0, 1e308, float("inf"), "", "x" * 300, [], {}, "spot-0", True]))
                        for _ in range(rng.randint(1, 3))]
                    body = mutate(base, ops)
                    await asyncio.sleep(1.0 / cfg.admin.max_events_per_s)  # stay under the rate limit
                    async with http.post(path, data=json.dumps(body), headers={**auth, "Content-Type": "application/json"}) as resp:
                        rep.fuzz_requests += 1
                        rep.statuses[resp.status] = rep.statuses.get(resp.status, 0) + 1
                        if resp.status >= 500:
                            rep.problems.append(f"POST {path} {json.dumps(body)[:120]} -> {resp.status}")
            # --- event-rate limit: a burst from one client
            await asyncio.sleep(2.0)  # let the bucket refill
            n0 = sum(1 for h in ctrl.elastic.history if h.get("kind") == "grant")
            results = []
            rep.burst_sent = 100
            loop = asyncio.get_running_loop()
            t_burst = loop.time()
            for i in range(rep.burst_sent):
                async with http.post("/v1/events/gpus-granted", json={"gpus": [{"gpu_id": f"burst-{i}"}]},
                                     headers=auth) as resp:
                    results.append(resp.status)
            rep.rate_limited = results.count(429)
            await ctrl.elastic.idle()
            rep.burst_applied = sum(1 for h in ctrl.elastic.history if h.get("kind") == "grant") - n0
            # token bucket: a burst of rate * 1 s, then the rate, over the burst's duration
            allowance = int(cfg.admin.max_events_per_s * (1.0 + loop.time() - t_burst)) + 2
            if rep.rate_limited == 0 or rep.burst_applied > allowance:
                rep.problems.append(f"burst of {rep.burst_sent} events: {rep.rate_limited} rate-limited, "
                                    f"{rep.burst_applied} applied (allowance ~{allowance})")
            # --- the controller survived everything
            async with http.get("/v1/progress", headers=auth) as resp:
                if resp.status != 200:
                    rep.problems.append(f"GET /v1/progress after the fuzz: {resp.status}")
            await asyncio.sleep(1.5)  # the burst drained the bucket
            async with http.post("/v1/events/gpus-granted", json={"gpus": [{"gpu_id": "after-fuzz"}]},
                                 headers=auth) as resp:
                status = resp.status
            try:  # a dead scheduler never drains its queue
                await asyncio.wait_for(ctrl.elastic.idle(), 30)
            except TimeoutError:
                rep.problems.append("the elastic scheduler stopped handling events")
            if status not in (202, 429) or (status == 202 and "after-fuzz" not in ctrl.executor.state.gpus):
                rep.problems.append(f"a valid grant after the fuzz answered {status} and was not applied")
            from pearl.core.state import ClusterState

            ClusterState.from_dict(ctrl.state_dict())
            if any(h.get("kind") == "error" for h in ctrl.elastic.history):
                errs = [h for h in ctrl.elastic.history if h.get("kind") == "error"]
                rep.problems.append(f"the scheduler logged {len(errs)} handler errors, e.g. {errs[0]}")
    finally:
        await server.stop()
        await ctrl.stop()
        root.removeHandler(cap)
        root.setLevel(old_level)
        for lg, lvl in zip(scanned, old_levels, strict=True):
            lg.setLevel(lvl)
    rep.log_records_scanned = len(cap.lines)
    leaked = [line for line in cap.lines if TOKEN in line]
    if leaked:
        rep.problems.append(f"the admin token appears in {len(leaked)} log records, e.g. {leaked[0][:160]!r}")
    if not cap.lines:
        rep.problems.append("no log record was captured (the scan saw nothing)")
    return rep


def run_security_probe(fuzz_per_route: int = 40, seed: int = 0) -> SecurityReport:
    return asyncio.run(_probe(fuzz_per_route, seed))
