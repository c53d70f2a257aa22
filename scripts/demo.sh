#!/usr/bin/env bash
# The README's first command: install ascent (torch first, the CPU build where there is none) and run the
# arithmetic demo: tiny model -> SFT warm-start -> GRPO -> held-out accuracy before and after RL.
set -euo pipefail
cd "$(dirname "$0")/.."
python -c "import torch" 2>/dev/null || python -m pip install -q torch==2.13.0
python -m pip install -q -e .
bash scripts/install_bubblewrap.sh || echo "note: without bubblewrap the Python tool (examples/tool_use) refuses to run; the arithmetic demo does not need it"
python examples/arithmetic/run_demo.py "$@"
