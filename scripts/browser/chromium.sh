#!/usr/bin/env bash
# scripts/browser/chromium.sh - print the path of a headless-capable Chromium, installing
# Debian's `chromium` package when it is missing and this shell may (root, apt-get).
# Used by tests/report/test_summary_browser.py (the summary page at 1400 px) and CI, the way
# scripts/slurm/start.sh installs slurm-wlm.
#
# Exit codes: 0 = path printed on stdout; 3 = not installed and cannot install here (the
# reason on stderr: not root, or no apt-get); 1 = the installation itself failed.
set -euo pipefail

for name in chromium chromium-browser; do
  if path=$(command -v "$name"); then echo "$path"; exit 0; fi
done
if [ "$(id -u)" != 0 ]; then
  echo "chromium is not installed and this is not root: install Debian's 'chromium' package" >&2
  exit 3
fi
if ! command -v apt-get >/dev/null; then
  echo "chromium is not installed and there is no apt-get here: install a Chromium" >&2
  exit 3
fi
echo "apt-get install chromium" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q --no-install-recommends chromium >/dev/null \
  || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends chromium >/dev/null; } \
  || { echo "apt-get install chromium failed" >&2; exit 1; }
command -v chromium
