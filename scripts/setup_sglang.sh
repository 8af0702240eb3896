#!/usr/bin/env bash
# Build .sglang/: the pinned SGLang wheel's Python code for the contract tests (tests/contract),
# installed --no-deps into its own folder so the main .venv's CPU torch is never touched.
# tests/contract/conftest.py appends the folder to sys.path *after* the venv's site-packages, so
# every package the venv already has (torch, transformers, fastapi, ...) is the venv's own; only
# SGLang and the few pure dependencies the venv lacks come from here. How to bump the version:
# docs/engines.md, "SGLang contract tests".
set -euo pipefail
SGLANG_VERSION=${SGLANG_VERSION:-0.5.23}
PIP=${PIP:-.venv/bin/pip}
DEST=${DEST:-.sglang}
STAMP="$DEST/.pearl-sglang-$SGLANG_VERSION"
[ -f "$STAMP" ] && exit 0
rm -rf "$DEST"
# SGLang itself, without its GPU dependency tree (torch==2.14.1, flashinfer, sglang-kernel, ...).
"$PIP" install -q --no-deps --target "$DEST" "sglang==$SGLANG_VERSION"
# Pure dependencies SGLang imports at module level that the venv lacks (each checked by
# importing sglang.srt.entrypoints.http_server): orjson, xxhash, soundfile (its wheel carries
# libsndfile), IPython (sglang/utils.py imports IPython.display) with its own small tree.
"$PIP" install -q --no-deps --target "$DEST" "orjson>=3.10" "xxhash>=3.4" "soundfile==0.13.1"
"$PIP" install -q --target "$DEST" "ipython>=8"
touch "$STAMP"
echo "setup_sglang: SGLang $SGLANG_VERSION in $DEST ($(du -sh "$DEST" | cut -f1))"
