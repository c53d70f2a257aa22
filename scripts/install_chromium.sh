#!/usr/bin/env bash
# Debian's `chromium` package, for the studio's browser tests (tests/integration/test_studio_browser.py) and
# scripts/studio_screenshots.py: Playwright drives it through its executable path, so no browser is
# downloaded. Installs it with apt-get (as root) when it is missing; says what to do and fails otherwise.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "error: Chromium is missing; the studio's browser tests need Debian's chromium package. Run this as root" \
       "on Debian/Ubuntu, or install it yourself (apt-get install -y chromium) and run again." >&2
  exit 1
fi
echo "installing Debian's chromium package for the studio's browser tests ..."
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -qq && apt-get install -y -qq chromium; } >/tmp/ascent-apt-chromium.log 2>&1; then
  echo "error: apt-get install chromium failed (log: /tmp/ascent-apt-chromium.log); install it and run again." >&2
  exit 1
fi
