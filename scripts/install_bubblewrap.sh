#!/usr/bin/env bash
# Debian's `bubblewrap` package (the `bwrap` binary), the sandbox of the Python tool
# (ascent/envs/tools/python.py): every call runs in namespaces of its own with a minimal read-only root.
# Installs it with apt-get (as root) when it is missing; says what to do and fails otherwise.
set -euo pipefail
if command -v bwrap >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "error: bubblewrap is missing; the Python tool's sandbox needs Debian's bubblewrap package. Run this as" \
       "root on Debian/Ubuntu, or install it yourself (apt-get install -y bubblewrap) and run again." >&2
  exit 1
fi
echo "installing Debian's bubblewrap package for the Python tool's sandbox ..."
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -qq && apt-get install -y -qq bubblewrap; } >/tmp/ascent-apt-bubblewrap.log 2>&1; then
  echo "error: apt-get install bubblewrap failed (log: /tmp/ascent-apt-bubblewrap.log); install it and run again." >&2
  exit 1
fi
