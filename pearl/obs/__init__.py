"""Observability: structured logs, live progress, TensorBoard scalars and the end-of-run report."""
