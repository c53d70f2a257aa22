#!/usr/bin/env bash
# The embodied GPU benchmark (issue #29, BENCHMARKS.md): a Qwen2.5-VL-3B-shape VLA (random weights, bf16,
# 256 action tokens) plays MuJoCo's Pusher-v5 from 128 px frames rendered through EGL, with GRPO through the
# real CLI; see bench/embodied_gpu.py for what is measured.
#   bash bench/embodied_gpu.sh OUT_DIR [--engines fast,reference] [extra bench/embodied_gpu.py arguments]
# --engines: the rollout engines to measure, one after the other in fresh processes (default: reference);
# each writes OUT_DIR/embodied_<engine>.json and .log, and a last line compares their medians.
# Needs .whl/ with gymnasium, mujoco (+ mujoco-core, glfw, pyopengl, cloudpickle, farama-notifications) and
# ascent's own (pydantic, pebble), and the GL loaders' .deb files in .whl/gl/ (unpacked into / here, as the
# device notes say: the GPU machine's image has no libEGL).
set -u
out=${1:?OUT_DIR}; shift
engines=reference
if [ "${1:-}" = "--engines" ]; then engines=${2:?--engines fast,reference}; shift 2; fi
mkdir -p "$out"
for f in .whl/gl/*.deb; do dpkg -x "$f" /; done; ldconfig
vendor=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
[ -f "$vendor" ] && export __EGL_VENDOR_LIBRARY_FILENAMES=$vendor
export PYTHONUNBUFFERED=1 MUJOCO_GL=egl PYOPENGL_PLATFORM=egl PYTHONPATH="${PYTHONPATH:-}:$PWD:$PWD/bench"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/device.txt"
nproc | tee -a "$out/device.txt"
python3 - <<'PY' 2>&1 | tail -2 | tee -a "$out/device.txt"
import mujoco, torch, transformers, gymnasium
from OpenGL import GL
ctx = mujoco.GLContext(16, 16); ctx.make_current()
print("GL renderer:", GL.glGetString(GL.GL_RENDERER).decode(), "| mujoco", mujoco.__version__,
      "| gymnasium", gymnasium.__version__, "| torch", torch.__version__, "| transformers", transformers.__version__)
PY
for engine in ${engines//,/ }; do
  python3 bench/embodied_gpu.py --engine "$engine" --json "$out/embodied_$engine.json" "$@" 2>&1 \
    | grep --line-buffered -v "Loading weights\|Writing model\|^\s*$" | tee "$out/embodied_$engine.log" | tail -40
done
python3 - "$out" ${engines//,/ } <<'PY'
import json, sys
out, engines = sys.argv[1], sys.argv[2:]
keys = ("iteration", "generate", "env_steps_per_s", "policy_ms_per_step", "return")
for engine in engines:
    try:
        median = json.load(open(f"{out}/embodied_{engine}.json"))["train"]["median"]
    except (OSError, KeyError, ValueError) as e:
        print(f"{engine}: no result ({type(e).__name__}: {e})")
        continue
    print(f"{engine}: " + " ".join(f"{k}={median.get(k)}" for k in keys))
PY
