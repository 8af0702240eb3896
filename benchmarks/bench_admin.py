"""Admin API and control-plane figures (prints them; asserts nothing).

    .venv/bin/python benchmarks/bench_admin.py api [--target local|serve] [--duration 6] [--concurrency 8]
    .venv/bin/python benchmarks/bench_admin.py overhead [--trajectories 64,256,1024]
    .venv/bin/python benchmarks/bench_admin.py all

``api``: a load generator on loopback (aiohttp, ``--concurrency`` connections, closed loop: each
connection sends its next request when the previous answer arrives) against a server in a separate
process: ``--target serve`` runs ``python -m pearl serve`` on ``configs/emulated-demo.yaml`` (the
real controller with a rollout running on the emulated engine in real time); ``--target local``
serves the same app over ``StateControlPlane`` (no rollout: the admin layer alone). The request mix
is 60% ``GET /v1/state``, 10% ``/v1/progress``, 10% ``/v1/decision``, 10% ``/metrics`` and 10%
signals (``POST /v1/events/notice-cancelled`` naming an unknown notice: parsed, validated and
submitted to the controller, which answers 404 - the full write path without changing the run).
Figures: p50 / p99 latency per kind and overall, requests per second; with ``serve``, also the
tokens the rollout generated during the load vs the mean of a quiet period of the same length
before and after (ratio: how much the API load slows the rollout on this CPU).

``overhead``: see ``bench_overhead`` below (needs ``pearl.runtime.controller``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


# ------------------------------------------------------------------------------ servers
def _serve_local(port: int) -> None:
    """Child process: the admin app over StateControlPlane (a 20-GPU table)."""
    from pearl.admin.app import AdminServer
    from pearl.admin.local import StateControlPlane
    from pearl.config import AdminSpec
    from pearl.core.state import ClusterState, Gpu, Role, Worker, WorkerStatus, Zone

    gpus = [Gpu(f"r{i}", Zone.RESERVED) for i in range(4)] + [
        Gpu(f"p{i}", Zone.PREEMPTIBLE, node=f"node{1 + i // 8}", instance_id=f"i-{i}") for i in range(12)
    ] + [Gpu(f"o{i}", Zone.OVERLAP, node="node3") for i in range(4)]
    workers = [Worker(f"w-{g.gpu_id}", (g.gpu_id,), Role.COLOCATED, WorkerStatus.ACTIVE)
               for g in gpus if g.zone is not Zone.OVERLAP]

    async def main() -> None:
        import uvloop  # noqa: F401

        control = StateControlPlane(ClusterState.build(gpus, workers), time.monotonic, {})
        spec = AdminSpec(port=port, max_events_per_s=1e6, max_reads_per_s=1e6)
        server = AdminServer(control, spec, time.monotonic)
        await server.start()
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await server.stop()

    import uvloop

    uvloop.run(main())


def start_server(target: str, port: int, token: str, tmp: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PEARL_ADMIN_TOKEN": token}
    if target == "local":
        cmd = [sys.executable, __file__, "_serve-local", str(port)]
    else:
        import yaml

        cfg = yaml.safe_load((ROOT / "configs/emulated-demo.yaml").read_text())
        cfg["admin"].update({"max_events_per_s": 1e6, "max_reads_per_s": 1e6, "tensorboard": False})
        cfg["output_dir"] = str(tmp / "run")
        path = tmp / "bench.yaml"
        path.write_text(yaml.safe_dump(cfg))
        cmd = [sys.executable, "-m", "pearl", "serve", "--config", str(path), "--port", str(port)]
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(tmp / "server.log", "wb"))


async def wait_ready(url: str, timeout_s: float = 120.0) -> None:
    t0 = time.monotonic()
    async with aiohttp.ClientSession() as s:
        while time.monotonic() - t0 < timeout_s:
            try:
                async with s.get(f"{url}/healthz") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise TimeoutError(f"server at {url} not ready after {timeout_s} s")


# ------------------------------------------------------------------------------ load
MIX = [("state", 6), ("progress", 1), ("decision", 1), ("metrics", 1), ("event", 1)]


async def load(url: str, token: str, duration_s: float, concurrency: int) -> dict[str, list[float]]:
    hdr = {"Authorization": f"Bearer {token}"}
    lat: dict[str, list[float]] = defaultdict(list)
    errors: dict[str, int] = defaultdict(int)
    seq = [k for k, w in MIX for _ in range(w)]
    end = time.perf_counter() + duration_s
    counter = 0

    async def one(s: aiohttp.ClientSession, i: int) -> None:
        nonlocal counter
        j = i
        while time.perf_counter() < end:
            kind = seq[j % len(seq)]
            j += 1
            t0 = time.perf_counter()
            if kind == "event":  # validated + submitted to the controller, which rejects it: no side effect
                counter += 1
                body = {"notice_id": f"no-such-notice-{i}-{counter}"}
                req = s.post(f"{url}/v1/events/notice-cancelled", json=body, headers=hdr)
            else:
                path = {"state": "/v1/state", "progress": "/v1/progress", "decision": "/v1/decision",
                        "metrics": "/metrics"}[kind]
                req = s.get(f"{url}{path}", headers=hdr)
            async with req as r:
                await r.read()
                if r.status >= 400 and not (kind == "event" and r.status == 404):
                    errors[f"{kind}:{r.status}"] += 1
            lat[kind].append(time.perf_counter() - t0)

    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=conn) as s:
        await asyncio.gather(*(one(s, i) for i in range(concurrency)))
    if errors:
        print(f"  errors: {dict(errors)}")
    return lat


async def progress(url: str, token: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as s, s.get(f"{url}/v1/progress",
                                                   headers={"Authorization": f"Bearer {token}"}) as r:
        return await r.json()


async def bench_api(target: str, duration_s: float, concurrency: int) -> None:
    token = secrets.token_urlsafe(24)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as d:
        proc = start_server(target, port, token, Path(d))
        try:
            await wait_ready(url)
            what = "python -m pearl serve (controller + emulated rollout)" if target == "serve" else \
                "admin app over StateControlPlane (no rollout)"
            print(f"admin API load: target={target}: {what}; {concurrency} connections, {duration_s:.0f} s")
            quiet = None
            if target == "serve":
                p0 = await progress(url, token)
                await asyncio.sleep(duration_s)
                p1 = await progress(url, token)
                quiet = p1["tokens_generated"] - p0["tokens_generated"]
            p0 = await progress(url, token)
            t0 = time.perf_counter()
            lat = await load(url, token, duration_s, concurrency)
            wall = time.perf_counter() - t0
            p1 = await progress(url, token)
            if quiet is not None:
                await asyncio.sleep(duration_s)
                p2 = await progress(url, token)
                quiet = (quiet + p2["tokens_generated"] - p1["tokens_generated"]) / 2
            allx = [x for v in lat.values() for x in v]
            print(f"  {'kind':10s} {'n':>7s} {'p50 ms':>8s} {'p99 ms':>8s}")
            for kind in [k for k, _ in MIX]:
                xs = lat.get(kind, [])
                print(f"  {kind:10s} {len(xs):7d} {pct(xs, .5) * 1e3:8.2f} {pct(xs, .99) * 1e3:8.2f}")
            print(f"  {'all':10s} {len(allx):7d} {pct(allx, .5) * 1e3:8.2f} {pct(allx, .99) * 1e3:8.2f}")
            print(f"  throughput: {len(allx) / wall:,.0f} requests/s")
            if quiet is not None:
                busy = p1["tokens_generated"] - p0["tokens_generated"]
                print(f"  rollout tokens generated: quiet {quiet:,.0f} vs under load {busy:,} "
                      f"(ratio {busy / max(quiet, 1):.2f}); trajectories completed so far {p1['trajectories_completed']}")
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                rc = proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = proc.wait()
            print(f"  server exit code after SIGTERM: {rc}")


# ------------------------------------------------------------------------------ control-plane overhead
# The "null engine" below is ``pearl.reliability.load.InstantEngine``: a data plane that costs
# nothing (every request completes at once with ``max_new_tokens`` tokens), so all wall time the
# runtime spends is control-plane work (controller, schedulers, router, tracker, sessions, asyncio).


class CountingEngine:
    """Counts dispatched requests on its way to a real engine (transparent proxy)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.requests = 0

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    async def generate(self, worker_id: str, req):
        self.requests += 1
        return await self.inner.generate(worker_id, req)

    async def generate_pd(self, prefill_id: str, decode_id: str, req):
        self.requests += 1
        return await self.inner.generate_pd(prefill_id, decode_id, req)


def _cfg(batch: int, env_mean_s: float | None = None, stream: bool = False):
    """The demo workload at batch ``batch`` on 8 reserved GPUs. ``stream``: no staleness bound, so
    batches follow each other without a trainer (a steady stream of trajectories)."""
    from pearl.config import load_config

    over: dict[str, object] = {"workload.batch_size": batch, "workload.group_size": 8, "cluster.reserved_gpus": 8,
                               "cluster.max_preemptible_gpus": 0, "cluster.training_gpus": 0}
    if env_mean_s is not None:
        over["workload.env_step_s"] = {"mean": env_mean_s, "cv": 0.5, "min": env_mean_s / 10, "max": env_mean_s * 10}
        over["workload.test_run_prob"] = 0.0
    if stream:
        over["policy.max_staleness"] = 10**9
    return load_config(str(ROOT / "configs/emulated-demo.yaml"), overrides=over)


async def _one_batch(cfg, engine, clock, batches: int = 1) -> tuple[float, float, int, float]:
    """Run ``batches`` rollout batches; (wall s, process CPU s, requests, clock s of the batches)."""
    from pearl.runtime.controller import Controller
    from pearl.sim.sessions import SyntheticSessionFactory

    c = Controller(cfg, engine, SyntheticSessionFactory(cfg.workload, clock), clock=clock, max_batches=batches)
    await c.start()
    w0, p0, t0 = time.perf_counter(), time.process_time(), clock.now()
    await c.wait_batches(batches)
    w1, p1, t1 = time.perf_counter(), time.process_time(), clock.now()
    await c.stop()
    return w1 - w0, p1 - p0, engine.requests, t1 - t0


def _virtual(cfg, kind: str, batches: int = 1) -> tuple[float, float, int, float]:
    from pearl.engines.emulated import EmulatedEngine
    from pearl.reliability.load import InstantEngine
    from pearl.runtime.clock import LoopClock, run_virtual

    async def go() -> tuple[float, float, int, float]:
        clock = LoopClock()
        engine = InstantEngine() if kind == "null" else CountingEngine(EmulatedEngine.from_config(cfg, clock))
        return await _one_batch(cfg, engine, clock, batches)

    return run_virtual(go())


def _window(cfg, seconds: float, virtual: bool) -> tuple[int, float, float]:
    """Null engine, steady stream, the first ``seconds`` of clock time after start-up, in real or
    virtual time: (requests dispatched, loop lag p50 ms, p99 ms; lag only in real time)."""
    import uvloop

    from pearl.reliability.load import InstantEngine
    from pearl.runtime.clock import LoopClock, run_virtual
    from pearl.runtime.controller import Controller
    from pearl.sim.sessions import SyntheticSessionFactory

    async def go() -> tuple[int, float, float]:
        clock = LoopClock()
        engine = InstantEngine()
        c = Controller(cfg, engine, SyntheticSessionFactory(cfg.workload, clock), clock=clock)
        await c.start()
        lags: list[float] = []

        async def probe() -> None:  # how late a 10 ms timer fires: the loop's saturation
            while True:
                t = time.perf_counter()
                await asyncio.sleep(0.01)
                lags.append(time.perf_counter() - t - 0.01)

        pt = None if virtual else asyncio.ensure_future(probe())
        r0 = engine.requests
        await clock.sleep(seconds)
        r1 = engine.requests
        if pt is not None:
            pt.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pt
        await c.stop()
        return r1 - r0, pct(lags, 0.5) * 1e3, pct(lags, 0.99) * 1e3

    return run_virtual(go()) if virtual else uvloop.run(go())


def bench_overhead(sizes: list[int]) -> None:
    print("control-plane overhead per dispatched request (one rollout batch of B trajectories, virtual time;")
    print("  null engine = zero-cost data plane, so wall time is controller + pipeline + sessions + asyncio)")
    print(f"  {'B':>6s} {'requests':>9s} {'CPU us/req':>11s} {'wall us/req':>12s} {'emulated CPU us/req':>20s} "
          f"{'turn interval s':>16s}")
    per_req = []
    for b in sizes:
        cfg = _cfg(b)
        w, p, n, _ = _virtual(cfg, "null")
        _we, pe, ne, span = _virtual(cfg, "emulated")
        turn_s = span * b / max(ne, 1)  # mean seconds between two requests of one trajectory (upper bound)
        per_req.append((p / n, turn_s))
        print(f"  {b:6d} {n:9d} {p / n * 1e6:11.1f} {w / n * 1e6:12.1f} {pe / ne * 1e6:20.1f} {turn_s:16.2f}")
    over = sorted(x for x, _ in per_req)[len(per_req) // 2]
    turn = min(t for _, t in per_req)
    print(f"  => control-plane overhead ~{over * 1e6:.0f} us CPU per dispatched request: one controller process")
    print(f"     dispatches up to ~{1 / over:,.0f} requests/s. With a request every {turn:.1f} s per trajectory")
    print(f"     (this workload on emulated H200s) that is ~{turn / over:,.0f} concurrent trajectories before the")
    print("     controller's own CPU is the bottleneck (N_max = turn interval / overhead).")
    env_s = 0.05
    print(f"real-time check (null engine, env step {env_s * 1e3:.0f} ms so that the knee is within reach here; steady")
    print("  stream of batches; 'ideal' = the same config's request rate in virtual time, where CPU costs nothing):")
    print(f"  {'B':>6s} {'ideal req/s':>12s} {'achieved':>9s} {'ratio':>6s} {'loop lag p50 ms':>16s} {'p99 ms':>7s}"
          f"  {'controller':>10s}")
    window = 4.0
    sat_rate: float | None = None
    for b in (64, 256, 1024, 2048):
        cfg = _cfg(b, env_s, stream=True)
        nv, _, _ = _window(cfg, window, virtual=True)
        n, lag50, lag99 = _window(cfg, window, virtual=False)
        ideal, rate = nv / window, n / window
        saturated = rate / ideal < 0.95
        if saturated and sat_rate is None:
            sat_rate = rate
        print(f"  {b:6d} {ideal:12,.0f} {rate:9,.0f} {rate / ideal:6.2f} {lag50:16.2f} {lag99:7.2f}  "
              f"{'saturated' if saturated else 'keeps up':>10s}")
    if sat_rate is not None:
        print(f"  => measured saturation here: ~{sat_rate:,.0f} requests/s (wall, on this shared 2-core machine), i.e.")
        print(f"     ~{sat_rate * turn:,.0f} concurrent trajectories at a {turn:.1f} s turn interval (measured N_max)")


async def bench_api_cpu(n: int = 400) -> None:
    """CPU per request with client and server in one process (sequential; an upper bound for the
    server alone, and insensitive to other processes competing for the cores)."""
    from aiohttp.test_utils import TestClient, TestServer

    from pearl.admin.app import AdminApp
    from pearl.admin.local import StateControlPlane
    from pearl.config import AdminSpec
    from pearl.core.state import ClusterState, Gpu, Role, Worker, WorkerStatus, Zone

    gpus = [Gpu(f"g{i}", Zone.PREEMPTIBLE, instance_id=f"i-{i}") for i in range(20)]
    workers = [Worker(f"w{i}", (f"g{i}",), Role.DECODE, WorkerStatus.ACTIVE) for i in range(20)]
    control = StateControlPlane(ClusterState.build(gpus, workers), time.monotonic, {})
    token = "x" * 32
    app = AdminApp(control, AdminSpec(max_events_per_s=1e9, max_reads_per_s=1e9), token, time.monotonic).build()
    hdr = {"Authorization": f"Bearer {token}"}
    print(f"admin API CPU per request, in-process client + server, sequential, {n} requests each:")
    async with TestClient(TestServer(app)) as c:
        cases = {
            "GET /healthz": lambda i: c.get("/healthz"),
            "GET /v1/state": lambda i: c.get("/v1/state", headers=hdr),
            "GET /metrics": lambda i: c.get("/metrics", headers=hdr),
            "POST event (applied)": lambda i: c.post("/v1/events/training-started",
                                                     json={"step": i, "event_id": f"cpu-{i}"}, headers=hdr),
            "POST event (401)": lambda i: c.post("/v1/events/training-started", json={"step": i}),
        }
        for name, make in cases.items():
            for i in range(20):  # warm up
                async with make(-1 - i) as r:
                    await r.read()
            c0, w0 = time.process_time(), time.perf_counter()
            for i in range(n):
                async with make(i) as r:
                    await r.read()
            cpu, wall = (time.process_time() - c0) / n, (time.perf_counter() - w0) / n
            print(f"  {name:24s} {cpu * 1e6:8.0f} us CPU   {wall * 1e6:8.0f} us wall")


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "_serve-local":
        _serve_local(int(sys.argv[2]))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["api", "overhead", "all"])
    ap.add_argument("--target", choices=["local", "serve", "both"], default="both")
    ap.add_argument("--duration", type=float, default=6.0)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--trajectories", default="64,256,1024")
    args = ap.parse_args()
    if args.what in ("api", "all"):
        targets = ["local", "serve"] if args.target == "both" else [args.target]
        asyncio.run(bench_api_cpu())
        for t in targets:
            asyncio.run(bench_api(t, args.duration, args.concurrency))
    if args.what in ("overhead", "all"):
        bench_overhead([int(x) for x in args.trajectories.split(",")])


if __name__ == "__main__":
    main()
