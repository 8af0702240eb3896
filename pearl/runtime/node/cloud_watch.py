"""Preemption signals read where the clouds publish them, on the node that will be taken.

Three sources, each a loop over one documented HTTP interface, each reporting a ``CloudSignal``
(instance, node, wall-clock deadline) to a sink the first time it sees a notice:

* **AWS** instance metadata, IMDSv2: ``PUT /latest/api/token`` (header
  ``X-aws-ec2-metadata-token-ttl-seconds``) gives a session token sent as ``X-aws-ec2-metadata-token``
  on every read; ``GET /latest/meta-data/instance-id`` names the instance;
  ``GET /latest/meta-data/spot/instance-action`` is 404 until a Spot interruption is scheduled, then
  ``{"action": "terminate"|"stop"|"hibernate", "time": "<RFC 3339>"}`` with ``time`` the deadline;
  ``GET /latest/meta-data/events/recommendations/rebalance`` is 404 until a rebalance
  recommendation, then ``{"noticeTime": "<RFC 3339>"}``. A rebalance recommendation has no
  deadline: it becomes a notice only with ``cloud_watch.rebalance_deadline_s`` set (deadline
  ``noticeTime + rebalance_deadline_s``), else it is logged. A 401 renews the token.
* **GCP** metadata server (header ``Metadata-Flavor: Google`` both ways):
  ``GET /computeMetadata/v1/instance/id``; ``GET .../instance/preempted?wait_for_change=true``
  (a hanging GET answered when the value changes; ``TRUE`` once the VM is preempted, then it has
  ``gcp_notice_s`` = 30 s, Compute Engine's preemption notice) and
  ``GET .../instance/maintenance-event?wait_for_change=true`` (``NONE``,
  ``MIGRATE_ON_HOST_MAINTENANCE``: live migration, logged only, ``TERMINATE_ON_HOST_MAINTENANCE``: a
  notice with deadline now + ``gcp_notice_s``). Each wait passes the last ``ETag`` as ``last_etag``.
* **Kubernetes** API server with the pod's service account (``Authorization: Bearer`` the token
  file, the CA bundle beside it): ``GET /api/v1/nodes/<node>`` every ``period_s``; the node is
  being taken when ``metadata.deletionTimestamp`` is set or ``spec.taints`` holds
  ``ToBeDeletedByClusterAutoscaler`` or ``node.kubernetes.io/unschedulable`` (a drain). Deadline:
  now + ``kubernetes_grace_s``. The instance id is the tail of ``spec.providerID``
  (``aws:///us-east-1a/i-0abc`` -> ``i-0abc``; GCE: the instance name), else the node name.

Failure handling (the same for each source): any error - connection refused, a timeout
(``timeout_s`` per request; GCP's hanging GETs get ``wait_timeout_s``), a non-JSON or mis-shaped
answer, an unexpected status - is logged (one line) and the loop backs off exponentially from
``period_s`` to ``max_backoff_s`` (doubling, reset by the next good answer). A source never
raises out of its loop and never stops the node agent; ``errors`` counts what went wrong.

A signal is reported once per (source, instance, deadline); the sink then feeds the controller's
admin gate (``pearl.admin.app.AdminApp.cloud_signal``), where one instance is one notice whichever
source or AWS shape reports it first.

Life cycle: ``watch = CloudWatch(sources, sink)``; ``watch.start()`` spawns one task per source;
``await watch.close()`` cancels them and closes the HTTP session.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import json
import logging
import os
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import aiohttp

log = logging.getLogger("pearl.cloud_watch")

AWS_TOKEN_TTL_S = 21_600
SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
K8S_TAINTS = frozenset({"ToBeDeletedByClusterAutoscaler", "node.kubernetes.io/unschedulable"})


class CloudAnswerError(ValueError):
    """A cloud endpoint answered something its documentation does not allow."""


@dataclass(frozen=True, slots=True)
class CloudSignal:
    """One preemption signal: ``instance_id`` will be taken at ``deadline_wall`` (POSIX s)."""

    source: str  # aws-spot | aws-rebalance | gcp-preempted | gcp-maintenance | k8s-node
    instance_id: str
    node: str
    deadline_wall: float
    detail: str = ""
    seen_wall: float = field(default_factory=time.time)

    @property
    def key(self) -> tuple[str, str, int]:
        return self.source, self.instance_id, int(self.deadline_wall)


Sink = Callable[[CloudSignal], Awaitable[Any]]


def _posix(text: Any) -> float:
    if not isinstance(text, str):
        raise CloudAnswerError(f"expected an RFC 3339 time, got {type(text).__name__}")
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise CloudAnswerError(f"not an RFC 3339 time: {text[:60]!r}") from None
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()


def _json_object(text: str) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except ValueError:
        raise CloudAnswerError(f"not JSON: {text[:60]!r}") from None
    if not isinstance(doc, dict):
        raise CloudAnswerError(f"not a JSON object: {text[:60]!r}")
    return doc


class Source(abc.ABC):
    """One polling loop with logging and exponential back-off (module docstring)."""

    name = "source"

    def __init__(self, node: str, period_s: float = 2.0, timeout_s: float = 2.0, max_backoff_s: float = 60.0,
                 now: Callable[[], float] = time.time,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> None:
        if period_s <= 0 or timeout_s <= 0 or max_backoff_s < period_s:
            raise ValueError(f"period_s={period_s}, timeout_s={timeout_s} must be > 0 and "
                             f"max_backoff_s={max_backoff_s} >= period_s")
        self.node = node
        self.period_s = period_s
        self.timeout_s = timeout_s
        self.max_backoff_s = max_backoff_s
        self.now = now
        self.sleep = sleep
        self.errors = 0
        self.polls = 0
        self.delay_s = period_s
        self.last_error = ""

    @abc.abstractmethod
    async def poll(self, http: aiohttp.ClientSession) -> list[CloudSignal]:
        """One read of the cloud's signal endpoints: the signals now present (empty when none)."""

    async def run(self, http: aiohttp.ClientSession, report: Sink) -> None:
        while True:
            try:
                signals = await self.poll(http)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the cloud is unreachable, slow or answers garbage: log, back off
                self.errors += 1
                self.last_error = f"{type(e).__name__}: {e}"[:300]
                self.delay_s = min(self.max_backoff_s, self.delay_s * 2)
                log.warning("cloud watch %s: %s (next try in %.1f s)", self.name, self.last_error, self.delay_s)
            else:
                self.polls += 1
                self.delay_s = self.period_s
                for sig in signals:
                    await report(sig)
            await self.sleep(self.delay_s)

    def _timeout(self, seconds: float | None = None) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(total=seconds or self.timeout_s)


class AwsImds(Source):
    name = "aws"

    def __init__(self, node: str, base_url: str = "http://169.254.169.254", rebalance_deadline_s: float | None = None,
                 **kw: Any) -> None:
        super().__init__(node, **kw)
        self.base = base_url.rstrip("/")
        self.rebalance_deadline_s = rebalance_deadline_s
        self._token: str | None = None
        self.instance_id: str | None = None
        self._rebalance_logged = False

    async def _new_token(self, http: aiohttp.ClientSession) -> str:
        async with http.put(f"{self.base}/latest/api/token", timeout=self._timeout(),
                            headers={"X-aws-ec2-metadata-token-ttl-seconds": str(AWS_TOKEN_TTL_S)}) as r:
            if r.status != 200:
                raise CloudAnswerError(f"PUT /latest/api/token answered {r.status}")
            token = (await r.text()).strip()
        if not token or len(token) > 4096:
            raise CloudAnswerError("PUT /latest/api/token gave no usable token")
        return token

    async def _get(self, http: aiohttp.ClientSession, path: str) -> tuple[int, str]:
        for _ in range(2):  # a 401 means the session token expired: renew once
            if self._token is None:
                self._token = await self._new_token(http)
            async with http.get(f"{self.base}/latest/meta-data/{path}", timeout=self._timeout(),
                                headers={"X-aws-ec2-metadata-token": self._token}) as r:
                if r.status == 401:
                    self._token = None
                    continue
                return r.status, await r.text()
        raise CloudAnswerError(f"GET {path}: 401 with a fresh session token")

    async def poll(self, http: aiohttp.ClientSession) -> list[CloudSignal]:
        if self.instance_id is None:
            status, text = await self._get(http, "instance-id")
            if status != 200 or not text.strip():
                raise CloudAnswerError(f"GET instance-id answered {status}")
            self.instance_id = text.strip()
        out: list[CloudSignal] = []
        status, text = await self._get(http, "spot/instance-action")
        if status == 200:
            doc = _json_object(text)
            action = doc.get("action")
            if action not in ("terminate", "stop", "hibernate"):
                raise CloudAnswerError(f"spot/instance-action: unknown action {str(action)[:40]!r}")
            out.append(CloudSignal("aws-spot", self.instance_id, self.node, _posix(doc.get("time")), str(action)))
        elif status != 404:
            raise CloudAnswerError(f"GET spot/instance-action answered {status}")
        status, text = await self._get(http, "events/recommendations/rebalance")
        if status == 200:
            notice = _posix(_json_object(text).get("noticeTime"))
            if self.rebalance_deadline_s is not None:
                out.append(CloudSignal("aws-rebalance", self.instance_id, self.node,
                                       notice + self.rebalance_deadline_s, "rebalance recommendation"))
            elif not self._rebalance_logged:
                self._rebalance_logged = True
                log.warning("cloud watch aws: rebalance recommendation for %s at %s (no notice: "
                            "cloud_watch.rebalance_deadline_s is not set)", self.instance_id, notice)
        elif status != 404:
            raise CloudAnswerError(f"GET events/recommendations/rebalance answered {status}")
        return out


class GcpMetadata(Source):
    """Two hanging GETs (``preempted`` and ``maintenance-event``), one ``poll`` each in turn."""

    name = "gcp"
    HEADERS: ClassVar[dict[str, str]] = {"Metadata-Flavor": "Google"}

    def __init__(self, node: str, base_url: str = "http://metadata.google.internal", notice_s: float = 30.0,
                 wait_timeout_s: float = 60.0, key: str = "preempted", **kw: Any) -> None:
        super().__init__(node, **kw)
        if key not in ("preempted", "maintenance-event"):
            raise ValueError(f"key={key!r}: preempted or maintenance-event")
        self.name = f"gcp-{key}"
        self.base = base_url.rstrip("/")
        self.notice_s = notice_s
        self.wait_timeout_s = wait_timeout_s
        self.key = key
        self.instance_id: str | None = None
        self._etag: str | None = None
        self._first_seen: float | None = None

    async def _read(self, http: aiohttp.ClientSession, path: str, wait: bool) -> str:
        params = {"wait_for_change": "true", "timeout_sec": str(int(self.wait_timeout_s))} if wait else {}
        if wait and self._etag:
            params["last_etag"] = self._etag
        async with http.get(f"{self.base}/computeMetadata/v1/instance/{path}", params=params, headers=self.HEADERS,
                            timeout=self._timeout(self.wait_timeout_s + self.timeout_s if wait else None)) as r:
            if r.status != 200:
                raise CloudAnswerError(f"GET instance/{path} answered {r.status}")
            if r.headers.get("Metadata-Flavor") != "Google":
                raise CloudAnswerError(f"GET instance/{path}: no Metadata-Flavor: Google in the answer")
            if wait:
                self._etag = r.headers.get("ETag") or self._etag
            return (await r.text()).strip()

    async def poll(self, http: aiohttp.ClientSession) -> list[CloudSignal]:
        if self.instance_id is None:
            self.instance_id = await self._read(http, "id", wait=False)
            if not self.instance_id:
                raise CloudAnswerError("GET instance/id gave an empty id")
        value = await self._read(http, self.key, wait=True)
        if self.key == "preempted":
            if value not in ("TRUE", "FALSE"):
                raise CloudAnswerError(f"instance/preempted: {value[:40]!r} is neither TRUE nor FALSE")
            if value == "TRUE":
                return [CloudSignal("gcp-preempted", self.instance_id, self.node, self._deadline(), "preempted")]
            return []
        if value not in ("NONE", "MIGRATE_ON_HOST_MAINTENANCE", "TERMINATE_ON_HOST_MAINTENANCE"):
            raise CloudAnswerError(f"instance/maintenance-event: unknown value {value[:40]!r}")
        if value == "TERMINATE_ON_HOST_MAINTENANCE":
            return [CloudSignal("gcp-maintenance", self.instance_id, self.node, self._deadline(), value)]
        if value == "MIGRATE_ON_HOST_MAINTENANCE":
            log.info("cloud watch gcp: live migration of %s announced (no notice)", self.instance_id)
        return []

    def _deadline(self) -> float:
        # one deadline per preemption: a repeated TRUE (after a reconnect) must not move it
        if self._first_seen is None:
            self._first_seen = self.now()
        return self._first_seen + self.notice_s


class KubernetesNode(Source):
    name = "kubernetes"

    def __init__(self, node: str, k8s_node: str | None = None, base_url: str = "https://kubernetes.default.svc",
                 grace_s: float = 30.0, sa_dir: Path = SA_DIR, **kw: Any) -> None:
        super().__init__(node, **kw)
        self.k8s_node = k8s_node or os.environ.get("NODE_NAME") or ""
        if not self.k8s_node:
            raise ValueError("kubernetes watch: no node name (cloud_watch.kubernetes_node or env NODE_NAME)")
        self.base = base_url.rstrip("/")
        self.grace_s = grace_s
        self.sa_dir = Path(sa_dir)
        self._first_seen: float | None = None

    def _auth(self) -> tuple[dict[str, str], ssl.SSLContext | None]:
        token = (self.sa_dir / "token").read_text().strip()  # re-read: kubelet rotates it
        ca = self.sa_dir / "ca.crt"
        ctx = ssl.create_default_context(cafile=str(ca)) if self.base.startswith("https") and ca.is_file() else None
        return {"Authorization": f"Bearer {token}", "Accept": "application/json"}, ctx

    async def poll(self, http: aiohttp.ClientSession) -> list[CloudSignal]:
        headers, ctx = self._auth()
        async with http.get(f"{self.base}/api/v1/nodes/{self.k8s_node}", headers=headers, timeout=self._timeout(),
                            ssl=ctx if ctx is not None else True) as r:
            if r.status != 200:
                raise CloudAnswerError(f"GET /api/v1/nodes/{self.k8s_node} answered {r.status}")
            node = _json_object(await r.text())
        meta, spec = node.get("metadata"), node.get("spec", {})
        if not isinstance(meta, dict) or not isinstance(spec, dict) or node.get("kind", "Node") != "Node":
            raise CloudAnswerError("the answer is not a v1 Node")
        taints = spec.get("taints") or []
        if not isinstance(taints, list):
            raise CloudAnswerError("spec.taints is not a list")
        keys = {str(t.get("key")) for t in taints if isinstance(t, dict)}
        reason = ("deletionTimestamp " + str(meta["deletionTimestamp"]) if meta.get("deletionTimestamp")
                  else ", ".join(sorted(keys & K8S_TAINTS)))
        if not reason:
            self._first_seen = None
            return []
        if self._first_seen is None:
            self._first_seen = self.now()
        provider = str(spec.get("providerID") or "")
        instance = provider.rstrip("/").rsplit("/", 1)[-1] if provider else self.k8s_node
        return [CloudSignal("k8s-node", instance, self.node, self._first_seen + self.grace_s, reason)]


class CloudWatch:
    """The node's sources and the sink their first sightings go to (module docstring)."""

    def __init__(self, sources: list[Source], sink: Sink) -> None:
        self.sources = sources
        self.sink = sink
        self.reported: dict[tuple[str, str, int], CloudSignal] = {}
        self.sink_errors = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._http: aiohttp.ClientSession | None = None

    async def _report(self, sig: CloudSignal) -> None:
        if sig.key in self.reported:
            return
        try:
            await self.sink(sig)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the controller refused or is unreachable: retried on the next sighting
            self.sink_errors += 1
            log.warning("cloud watch: %s notice for %s not delivered: %s", sig.source, sig.instance_id, e)
            return
        self.reported[sig.key] = sig
        log.warning("cloud watch: %s notice for instance %s on %s, deadline %s (%s)", sig.source, sig.instance_id,
                    sig.node, datetime.fromtimestamp(sig.deadline_wall, UTC).isoformat(), sig.detail)

    def start(self) -> None:
        if self._tasks:
            return
        self._http = aiohttp.ClientSession()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(s.run(self._http, self._report), name=f"cloud-watch-{s.name}")
                       for s in self.sources]

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._http is not None:
            await self._http.close()
            self._http = None

    def view(self) -> dict[str, Any]:
        """Per source: polls, errors, the last error; and the signals reported (for health documents)."""
        return {"sources": {s.name: {"polls": s.polls, "errors": s.errors, "last_error": s.last_error or None}
                            for s in self.sources},
                "signals": [{"source": g.source, "instance_id": g.instance_id, "node": g.node,
                             "deadline_wall": g.deadline_wall, "detail": g.detail} for g in self.reported.values()]}


def build_sources(spec: Any, node: str) -> list[Source]:
    """The sources ``cloud_watch`` (``pearl.config.CloudWatchSpec``) turns on, for ``node``."""
    kw = {"period_s": spec.period_s, "timeout_s": spec.timeout_s, "max_backoff_s": spec.max_backoff_s}
    out: list[Source] = []
    if spec.aws:
        out.append(AwsImds(node, spec.aws_url, spec.rebalance_deadline_s, **kw))
    if spec.gcp:
        for key in ("preempted", "maintenance-event"):
            out.append(GcpMetadata(node, spec.gcp_url, spec.gcp_notice_s, key=key, **kw))
    if spec.kubernetes:
        out.append(KubernetesNode(node, spec.kubernetes_node, spec.kubernetes_url, spec.kubernetes_grace_s, **kw))
    return out


@contextlib.asynccontextmanager
async def watching(sources: list[Source], sink: Sink) -> Any:
    """``async with watching(sources, sink) as watch:`` - started, closed on exit."""
    watch = CloudWatch(sources, sink)
    watch.start()
    try:
        yield watch
    finally:
        await watch.close()
