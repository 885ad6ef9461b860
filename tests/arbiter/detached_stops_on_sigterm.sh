#!/usr/bin/env bash
# A detached quanta-arbiter (no --foreground) must stop on SIGTERM like a foreground one:
# its signal handling is set up after it detaches.
set -euo pipefail
arbiter=${1:?usage: detached_stops_on_sigterm.sh QUANTA_ARBITER SIM_DIR}
export LD_LIBRARY_PATH=${2:?}
run=$(mktemp -d /tmp/quanta-detached.XXXXXX)
scope=qdetached$$
export SIMGPU_STATE=simgpu-$scope
trap 'pkill -KILL -f "$run/quanta.toml" 2>/dev/null || true; rm -rf "$run" /dev/shm/$scope.* /dev/shm/$SIMGPU_STATE*' EXIT
cat >"$run/quanta.toml" <<TOML
[node]
scope = "$scope"
tenant_socket = "$run/tenant.sock"
admin_socket = "$run/admin.sock"
state_dir = "$run"
TOML
"$arbiter" --config "$run/quanta.toml"
for _ in $(seq 100); do [[ -S $run/tenant.sock ]] && break; sleep 0.05; done
[[ -S $run/tenant.sock ]] || { echo "detached arbiter never served its socket"; cat "$run/quanta-arbiter.log"; exit 1; }
pid=$(pgrep -f "$run/quanta.toml")
kill -TERM "$pid"
for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || { echo "stopped on SIGTERM"; exit 0; }; sleep 0.05; done
echo "detached quanta-arbiter (pid $pid) still runs 3 s after SIGTERM"
exit 1
