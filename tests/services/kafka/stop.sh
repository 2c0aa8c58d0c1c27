#!/usr/bin/env bash
# Stops the broker that start.sh launched from RUN_DIR, by the PID in RUN_DIR/kafka.pid (TERM, up to
# 20 s for a clean shutdown, then KILL), and removes RUN_DIR. Safe to call twice or on a failed start.
# Silent when all goes well (tests/run calls it after pytest's closing line).
#
#   stop.sh RUN_DIR
#   stop.sh --keep RUN_DIR   stops the broker the same way and keeps RUN_DIR, for start.sh --restart
set -uo pipefail

say() { echo "kafka: $*" >&2; }
keep=0
if [[ "${1:-}" == "--keep" ]]; then
    keep=1
    shift
fi
run_dir="${1:?usage: stop.sh [--keep] RUN_DIR}"
[[ -d "$run_dir" ]] || exit 0
rmdir "$run_dir" 2>/dev/null && exit 0  # empty: start.sh never ran in it
if [[ ! -f "$run_dir/.faultstream-kafka" ]]; then
    say "$run_dir was not made by start.sh: left alone"
    exit 1
fi

pid="$(cat "$run_dir/kafka.pid" 2>/dev/null || true)"
# Only a PID whose command line is our broker's: the number may have been reused since.
if [[ "$pid" =~ ^[0-9]+$ ]] && { tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null |
    grep -qF "kafka.Kafka $run_dir/server.properties"; then
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 200); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        say "broker PID $pid ignored TERM for 20 s: killing it"
        kill -KILL "$pid" 2>/dev/null
        sleep 0.2
    fi
fi
if ((keep)); then
    rm -f "$run_dir/kafka.pid"
else
    rm -rf "$run_dir"
fi
