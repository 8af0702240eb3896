"""PEARL: adaptive prefill-decode execution with elasticity for asynchronous agentic RL."""
__version__ = "0.1.0"
