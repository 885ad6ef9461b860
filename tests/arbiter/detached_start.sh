#!/usr/bin/env bash
# A detached quanta-arbiter (no --foreground) returns once it serves, or fails with the
# reason when it cannot (another arbiter holds the scope), and stops on SIGTERM like a
# foreground one: its signal handling is set up after it detaches.
set -euo pipefail
arbiter=${1:?usage: detached_start.sh QUANTA_ARBITER SIM_DIR}
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
"$arbiter" --config "$run/quanta.toml" 2>"$run/first.err"
# It returns once the detached arbiter serves, saying where it runs.
[[ -S $run/tenant.sock ]] || { echo "the detached arbiter returned before it served its socket"; cat "$run/quanta-arbiter.log"; exit 1; }
pid=$(pgrep -f "$run/quanta.toml")
grep -q "detached as pid $pid" "$run/first.err" || { echo "it did not say where it runs:"; cat "$run/first.err"; exit 1; }
# A second start on the same scope fails, and says why, instead of detaching into an error
# that only its log would show.
if "$arbiter" --config "$run/quanta.toml" 2>"$run/second.err"; then
  echo "a second detached arbiter on a held scope exited 0:"; cat "$run/second.err"; exit 1
fi
grep -q "is running" "$run/second.err" || { echo "the refusal does not say another arbiter runs:"; cat "$run/second.err"; exit 1; }
[[ $(pgrep -fc "$run/quanta.toml") == 1 ]] || { echo "the refused arbiter still runs after its start returned"; exit 1; }
kill -TERM "$pid"
for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || { echo "stopped on SIGTERM"; exit 0; }; sleep 0.05; done
echo "detached quanta-arbiter (pid $pid) still runs 3 s after SIGTERM"
exit 1
