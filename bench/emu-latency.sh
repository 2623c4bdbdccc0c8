#!/bin/sh
# Bulk OUT completion latency of the emulator's event loop under a paced
# stream (no QEMU): p50/p99/max as ratios to one frame's wire time, with
# the unpaced loop's round trip as the reference. BENCH_FRAMES sets the
# frames per case.
set -eu
cd "$(dirname "$0")/.."
echo "I: $0 (rustc: $(rustc --version))" >&2
CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-1}" cargo bench -p ax88772 --bench completion_latency --no-run >&2
exec cargo bench -q -p ax88772 --bench completion_latency
