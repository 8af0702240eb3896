"""Local model folders: built untied, idempotent, clear errors when missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors import safe_open

from pearl.models import MODEL_NAMES, ModelBuildError, ensure_models, gguf_file, model_path


def test_unknown_or_missing_model_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ModelBuildError, match="unknown model"):
        model_path("gpt-5")
    with pytest.raises(ModelBuildError, match=r"pearl\.models build"):
        model_path("tiny-qwen3", tmp_path / "empty")


def test_gguf_is_found_without_importing_the_package() -> None:
    assert gguf_file().name.endswith(".gguf") and gguf_file().stat().st_size > 50_000_000


def test_built_models_are_untied_bf16_and_rebuild_is_a_no_op() -> None:
    paths = ensure_models()  # builds once per checkout (~30 s), then only checks stamps
    assert set(paths) == set(MODEL_NAMES)
    stamps = {n: (p / "model.safetensors").stat().st_mtime_ns for n, p in paths.items()}
    assert ensure_models() == paths  # idempotent: nothing is rebuilt
    assert stamps == {n: (p / "model.safetensors").stat().st_mtime_ns for n, p in paths.items()}
    for name, path in paths.items():
        cfg = json.loads((path / "config.json").read_text())
        assert cfg["tie_word_embeddings"] is False and "quantization_config" not in cfg, name
        assert (path / "tokenizer.json").is_file() and (path / "chat_template.jinja").is_file()
        with safe_open(str(path / "model.safetensors"), "pt") as f:
            keys = set(f.keys())
            assert {"lm_head.weight", "model.embed_tokens.weight"} <= keys
            assert str(f.get_slice("lm_head.weight").get_dtype()) == "BF16"
