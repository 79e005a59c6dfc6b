#!/bin/sh
# Debian's Chromium for the memory inspector's browser tests (tests/test_service_ui.py), driven by
# Playwright's Python package. Playwright's own browser download (`playwright install`) is never used:
# the system package is what the tests launch (/usr/bin/chromium, or $GPUIR_CHROMIUM).
# Installs only when missing, as root, where apt-get exists; otherwise it says why and the browser
# tests skip with that reason. It never fails the build.
CHROMIUM="${GPUIR_CHROMIUM:-/usr/bin/chromium}"
if [ -x "$CHROMIUM" ]; then
    exit 0
fi
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "install_browser.sh: $CHROMIUM is missing and this is not root with apt-get: the browser tests will" \
         "skip (install Debian's chromium package, or set GPUIR_CHROMIUM to a Chromium binary)" >&2
    exit 0
fi
echo "install_browser.sh: installing Debian's chromium (for the browser tests)" >&2
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }; then
    echo "install_browser.sh: apt-get could not install chromium: the browser tests will skip" >&2
fi
exit 0
