#!/usr/bin/env bash
# Build the one-file agentworker with PyInstaller into dist/agentworker, then smoke
# test it (packaging/onefile/smoke.sh). Usage: packaging/onefile/build.sh [PYTHON]
# PYTHON is an interpreter whose environment has agentworker installed (default .venv).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${1:-.venv/bin/python}"
"$PY" -m pip install --quiet -e ".[onefile]"  # the pinned PyInstaller
"$PY" -m PyInstaller --noconfirm --clean --log-level WARN \
  --distpath dist --workpath build/pyinstaller packaging/onefile/agentworker.spec
ls -l dist/agentworker
packaging/onefile/smoke.sh dist/agentworker
