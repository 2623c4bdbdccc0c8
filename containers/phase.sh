#!/usr/bin/env bash
# phase.sh NAME COMMAND [ARG...]: run COMMAND and say how long it took.
#
# The line goes to stderr, and to $PHYFARM_PHASE_LOG when it is set (`make
# test` sets it and prints the table at the end). COMMAND's exit status is
# returned unchanged.
set -u
name=$1
shift
start=$(date +%s)
"$@"
rc=$?
secs=$(($(date +%s) - start))
printf 'I: phase %s: %dm%02ds (exit %d)\n' "$name" $((secs / 60)) $((secs % 60)) "$rc" >&2
if [ -n "${PHYFARM_PHASE_LOG:-}" ]; then
    printf '%s\t%d\t%d\n' "$name" "$secs" "$rc" >>"$PHYFARM_PHASE_LOG"
fi
exit "$rc"
