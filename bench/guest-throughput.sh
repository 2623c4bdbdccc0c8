#!/bin/sh
# In-guest iperf3 TCP through the emulated AX88772A (paced, unpaced) and
# QEMU's usb-net, as ratios to references measured in the same run.
# Options: see `bench/guest-throughput.sh --help`.
set -eu
cd "$(dirname "$0")/.."
cache="${PHYFARM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/phyfarm}"
# The harness package from this checkout (harness/pyproject.toml says why).
PYTHONPATH="$PWD/harness${PYTHONPATH:+:$PYTHONPATH}" exec "$cache/venv/bin/python" bench/guest-throughput.py "$@"
