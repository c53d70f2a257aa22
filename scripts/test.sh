#!/usr/bin/env bash
# The README's test command: install torch first (the local CPU build where there is no torch yet, so
# nothing pulls CUDA wheels), then the project with its dev tools, then lint, type-check and the whole suite
# (unit tests, the real CLI on a tiny model, the end-to-end run on a local Ray cluster, and `ascent studio` in
# Debian's headless Chromium, which scripts/install_chromium.sh installs when it is missing).
set -euo pipefail
cd "$(dirname "$0")/.."
python -c "import torch" 2>/dev/null || python -m pip install -q torch==2.13.0
python -m pip install -q -e ".[dev]"
bash scripts/install_chromium.sh
bash scripts/install_bubblewrap.sh  # the Python tool's sandbox
bash scripts/install_render.sh  # headless EGL for the simulators' frames (MuJoCo)
ruff check ascent tests examples bench
ruff format --check ascent tests examples bench
mypy
python -m pytest tests --durations=30 "$@"  # the 30 slowest tests, to keep the suite in its budget
