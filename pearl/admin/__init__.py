"""The admin API: how operators and cloud signals talk to a running PEARL (docs/service.md).

``app`` (aiohttp app + ``AdminServer``), ``schemas`` (pydantic wire shapes), ``openapi`` (the served
document, rendered from the same route table), ``security`` (token, listen policy, rate limit,
idempotency), ``events`` (the book of accepted events: durable, idempotent, one notice per id,
replayed after a restart), ``cloud`` (AWS spot-notice shapes -> reclaim notices), ``metrics`` (Prometheus),
``local`` (``StateControlPlane``: a small real control plane over the state table, for tests and
benchmarks). The app only sees the ``pearl.runtime.control.ControlPlane`` Protocol.
"""
