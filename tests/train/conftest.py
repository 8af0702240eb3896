"""Fixtures for the trainer tests: a micro Qwen3 folder built locally (fast), untied."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def micro_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer Qwen3 with a 512-token vocabulary, random init (seed 0), saved as safetensors."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256, tie_word_embeddings=False,
        initializer_range=0.1,
    )
    model = Qwen3ForCausalLM(cfg)
    out = tmp_path_factory.mktemp("micro-qwen3")
    model.save_pretrained(out)
    return out
