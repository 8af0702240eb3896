"""Auth, listen-address policy, rate limiting and idempotency: the admin API's, and the node agents'.

- **Token**: ``AdminSpec.token`` or the environment variable ``PEARL_ADMIN_TOKEN`` (config wins).
  Compared with ``hmac.compare_digest`` on the UTF-8 bytes (constant time in the token length).
  The token is never logged: ``AdminSpec`` hides it from ``repr`` and the effective config redacts it.
- **Listen policy**: without a token the service only listens on a loopback address; any other
  address (``0.0.0.0``, a LAN IP, a host name other than ``localhost``) raises ``AdminSecurityError``.
- **Rate limit**: a token bucket per client address. Bucket of capacity ``b`` refilled at ``r`` per
  second: after ``dt`` seconds it holds ``min(b, level + r * dt)``; a request takes one token or is
  refused (429, ``Retry-After = ceil((1 - level) / r)``). ``b = max(1, r)`` (one second of burst).
  Clients are tracked in an LRU of bounded size so a flood of addresses cannot grow memory.
- **Idempotency**: an ``IdempotencyLedger`` remembers, per event id, a digest of the request that
  first used it; the same id with a different payload is a 409 (the controller applies an id once).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import math
import os
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

TOKEN_ENV = "PEARL_ADMIN_TOKEN"
MIN_TOKEN_CHARS = 16
#: a key names a secret when its last word is one of these (``token``, ``hf_token``, ``api_key``), not
#: when a word merely contains one (``max_trajectory_tokens`` is a count)
_SECRET_KEY = re.compile(r"(?:^|[_.\-])(?:token|secret|password|passwd|api_?key|credentials?)$", re.IGNORECASE)


class AdminSecurityError(ValueError):
    """The admin API would be exposed unsafely (no token on a non-loopback address, weak token)."""


def resolve_token(config_token: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """The bearer token: config first, else ``PEARL_ADMIN_TOKEN``; empty means none."""
    env = os.environ if env is None else env
    token = config_token if config_token else env.get(TOKEN_ENV) or None
    if token is not None and len(token) < MIN_TOKEN_CHARS:
        raise AdminSecurityError(
            f"admin token is {len(token)} characters; use at least {MIN_TOKEN_CHARS} "
            "(e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)"
        )
    return token


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # any other host name may resolve anywhere: treat as exposed


def check_listen(host: str, token: str | None) -> None:
    """Refuse to listen on a non-loopback address without a token."""
    if token is None and not is_loopback(host):
        raise AdminSecurityError(
            f"refusing to listen on {host!r} without an admin token: set admin.token in the config or "
            f"{TOKEN_ENV} in the environment, or listen on 127.0.0.1"
        )


def token_matches(header: str | None, token: str) -> bool:
    """True iff ``header`` is ``Bearer <token>``; the comparison is constant-time."""
    if header is None:
        return False
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode("utf-8", "surrogatepass"), token.encode("utf-8"))


class RateLimiter:
    """Token buckets per client key (see the module docstring for the formula)."""

    def __init__(self, rate_per_s: float, now: Callable[[], float], max_clients: int = 4096) -> None:
        if rate_per_s <= 0:
            raise ValueError(f"rate_per_s={rate_per_s} must be > 0")
        self.rate = rate_per_s
        self.capacity = max(1.0, rate_per_s)
        self._now = now
        self._max = max_clients
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key -> (level, t)

    def take(self, key: str) -> float:
        """Take one token for ``key``: 0.0 if allowed, else seconds until one is available."""
        t = self._now()
        level, last = self._buckets.pop(key, (self.capacity, t))
        level = min(self.capacity, level + self.rate * max(0.0, t - last))
        wait = 0.0
        if level >= 1.0:
            level -= 1.0
        else:
            wait = (1.0 - level) / self.rate
        self._buckets[key] = (level, t)
        while len(self._buckets) > self._max:
            self._buckets.popitem(last=False)
        return wait

    @staticmethod
    def retry_after(wait_s: float) -> str:
        return str(max(1, math.ceil(wait_s)))


class IdempotencyLedger:
    """Remembers which payload first used an event id (bounded LRU)."""

    def __init__(self, max_entries: int = 65_536) -> None:
        self._max = max_entries
        self._seen: OrderedDict[str, str] = OrderedDict()

    @staticmethod
    def digest(route: str, payload: bytes) -> str:
        return hashlib.sha256(route.encode() + b"\0" + payload).hexdigest()

    def conflicts(self, event_id: str, digest: str) -> bool:
        """True if ``event_id`` was first used with a different payload; records it otherwise."""
        prev = self._seen.get(event_id)
        if prev is not None:
            self._seen.move_to_end(event_id)
            return prev != digest
        self._seen[event_id] = digest
        while len(self._seen) > self._max:
            self._seen.popitem(last=False)
        return False

    def forget(self, event_id: str) -> None:
        """Drop an id whose event was rejected (so a corrected retry with the same id is allowed)."""
        self._seen.pop(event_id, None)


def redact(obj: Any) -> Any:
    """Replace the string value of every key that names a secret (token, password, ...) by ``"***"``."""
    if isinstance(obj, dict):
        return {k: ("***" if _SECRET_KEY.search(str(k)) and isinstance(v, str) and v else redact(v))
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [redact(v) for v in obj]
    return obj
