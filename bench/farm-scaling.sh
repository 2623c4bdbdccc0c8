#!/bin/sh
# The farm's wall time with -n W against -n 1, measured in one invocation.
# Options: see `bench/farm-scaling.sh --help`.
set -eu
cd "$(dirname "$0")/.."
cache="${PHYFARM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/phyfarm}"
# The harness package from this checkout (harness/pyproject.toml says why).
PYTHONPATH="$PWD/harness${PYTHONPATH:+:$PYTHONPATH}" exec "$cache/venv/bin/python" bench/farm-scaling.py "$@"
