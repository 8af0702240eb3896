#!/usr/bin/env bash
# Build .swebench/: the pinned swebench package (the official SWE-bench harness) for
# tests/envs/test_swebench_harness_equal.py, which proves envs/swebench's log parsers and
# repository specs equal to the package's. Installed --no-deps into its own folder: the test loads
# only the package's pure modules from it (harness/constants/*.py and harness/log_parsers/python.py,
# which import nothing outside the standard library and those constants), never its Docker /
# datasets / modal tree, and never touches the main .venv.
set -euo pipefail
SWEBENCH_VERSION=${SWEBENCH_VERSION:-4.1.0}
PIP=${PIP:-.venv/bin/pip}
DEST=${DEST:-.swebench}
STAMP="$DEST/.pearl-swebench-$SWEBENCH_VERSION"
[ -f "$STAMP" ] && exit 0
rm -rf "$DEST"
"$PIP" install -q --no-deps --target "$DEST" "swebench==$SWEBENCH_VERSION"
touch "$STAMP"
echo "setup_swebench: swebench $SWEBENCH_VERSION in $DEST ($(du -sh "$DEST" | cut -f1))"
