#!/usr/bin/env bash
# Runs the CTest suites of one build folder. eBPF tests need tracefs, so it is mounted
# here when we are root and it is missing. Extra arguments go to ctest.
set -euo pipefail
build=${1:?usage: run-tests.sh BUILD_DIR [ctest args...]}
shift
if [[ $(id -u) -eq 0 ]] && ! mountpoint -q /sys/kernel/tracing 2>/dev/null; then
  mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null || true
fi
cd "$build"
ctest --output-on-failure --timeout 300 -j "$(nproc)" "$@"
