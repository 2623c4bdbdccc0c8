#!/bin/sh
# Bulk-path benchmark of the emulated AX88772A (no QEMU): frames/s and
# Mbit/s for 1514- and 64-byte frames, as ratios to the 100 Mbit/s line
# rate. Runs on one core. BENCH_SECONDS sets the time per case.
set -eu
cd "$(dirname "$0")/.."
pin=""
if command -v taskset >/dev/null 2>&1; then
    pin="taskset -c 0"
fi
echo "I: $0 (rustc: $(rustc --version))" >&2
CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-1}" cargo bench -p ax88772 --bench bulk_path --no-run >&2
exec $pin cargo bench -q -p ax88772 --bench bulk_path
