#!/usr/bin/env bash
# Headless OpenGL for the simulators' frames (ascent.envs.sim; MuJoCo with MUJOCO_GL=egl): Debian's libEGL and
# Mesa's EGL (software rendering on a CPU machine; a GPU machine's driver brings its own), for the frame tests
# (tests/unit/entrypoints/test_debug_env_frames.py). Installs them with apt-get (as root) when missing; says
# what to do and fails otherwise. `ascent doctor` reports whether a renderer works.
set -euo pipefail
if ldconfig -p | grep -q 'libEGL_mesa.so.0'; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "error: Mesa's EGL is missing; the simulator frame tests need libegl1 and libegl-mesa0. Run this as" \
       "root on Debian/Ubuntu, or install them yourself (apt-get install -y libegl1 libegl-mesa0) and run again." >&2
  exit 1
fi
echo "installing Debian's libegl1 and libegl-mesa0 for the simulators' frames ..."
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -qq && apt-get install -y -qq libegl1 libegl-mesa0 libgl1-mesa-dri; } \
    >/tmp/ascent-apt-render.log 2>&1; then
  echo "error: apt-get install libegl1 libegl-mesa0 failed (log: /tmp/ascent-apt-render.log)." >&2
  exit 1
fi
