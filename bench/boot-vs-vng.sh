#!/usr/bin/env bash
# Boot to a guest ready for checks: phyfarm's farm guest against virtme-ng's
# `vng --run bzImage --exec true`, medians and their ratio (target <= 0.3).
# Options: see `bench/boot-vs-vng.sh --help`.
set -euo pipefail
cd "$(dirname "$0")/.."
cache="${PHYFARM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/phyfarm}"
# The harness package from this checkout (harness/pyproject.toml says why).
PYTHONPATH="$PWD/harness${PYTHONPATH:+:$PYTHONPATH}" exec "$cache/venv/bin/python" bench/boot-vs-vng.py "$@"
