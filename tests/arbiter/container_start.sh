#!/usr/bin/env bash
# quanta-arbiter as a container runs it (--foreground --wait-for-gpus): it stays up and says
# why while NVML is missing, serves once the driver library appears, creates its missing
# socket and state directories, stops cleanly on SIGTERM while waiting, and without
# --wait-for-gpus still fails at once with one clear line. --check-config loads and
# validates a config, prints one line and exits 0, or the error and non-zero.
set -euo pipefail
arbiter=${1:?usage: container_start.sh QUANTA_ARBITER SIM_DIR SOURCE_DIR}
sim=${2:?}
src=${3:?}
run=$(mktemp -d /tmp/quanta-container.XXXXXX)
scope=qcontainer$$
export SIMGPU_STATE=simgpu-$scope
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$run" /dev/shm/$scope.* /dev/shm/$SIMGPU_STATE*
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

# --check-config: the shipped configs load; a bad key is one line naming it.
for cfg in "$src/config/quanta.toml" "$src/config/demo.toml"; do
  out=$("$arbiter" --check-config --config "$cfg") || fail "--check-config refused $cfg: $out"
  [[ $(wc -l <<<"$out") -eq 1 && $out == *": ok ("* ]] || fail "--check-config printed: $out"
done
printf '[scheduler]\nquantum = "20 parsecs"\n' >"$run/bad.toml"
if err=$("$arbiter" --check-config --config "$run/bad.toml" 2>&1); then fail "--check-config accepted a bad quantum"; fi
[[ $(wc -l <<<"$err") -eq 1 && $err == *"bad.toml:2:"*"scheduler.quantum"* ]] || fail "bad config message: $err"
echo "ok: --check-config"

# Sockets and state in directories that do not exist yet, as on a fresh node.
cat >"$run/quanta.toml" <<TOML
[node]
scope = "$scope"
tenant_socket = "$run/run/quanta/tenant.sock"
admin_socket = "$run/run/quanta-admin/admin.sock"
state_dir = "$run/var/lib/quanta"
TOML

# Without --wait-for-gpus a node without NVML is an immediate, explained exit.
mkdir -p "$run/driver"
if err=$(LD_LIBRARY_PATH=$run/driver timeout 10 "$arbiter" --foreground --config "$run/quanta.toml" 2>&1); then
  fail "started without NVML"
fi
[[ $err == *"cannot load NVML"* ]] || fail "no-NVML message: $err"
echo "ok: without --wait-for-gpus a missing driver exits with: ${err##*: }"

# With it: up and explaining while the driver is missing; stops cleanly on SIGTERM.
LD_LIBRARY_PATH=$run/driver "$arbiter" --foreground --wait-for-gpus --config "$run/quanta.toml" 2>"$run/wait1.log" &
pids+=($!)
sleep 1.5
kill -0 "${pids[-1]}" 2>/dev/null || fail "exited while waiting for GPUs: $(cat "$run/wait1.log")"
grep -q "waiting for GPUs (0 s so far): cannot load NVML" "$run/wait1.log" || fail "no waiting line: $(cat "$run/wait1.log")"
kill -TERM "${pids[-1]}"
for _ in $(seq 50); do kill -0 "${pids[-1]}" 2>/dev/null || break; sleep 0.1; done
kill -0 "${pids[-1]}" 2>/dev/null && fail "still running 5 s after SIGTERM while waiting for GPUs"
wait "${pids[-1]}" && code=0 || code=$?
[[ $code -eq 0 ]] || fail "SIGTERM while waiting exited $code, not 0"
echo "ok: waits for GPUs with a log line and stops on SIGTERM with exit 0"

# The driver appears (the library is dropped into the search path): the arbiter serves.
LD_LIBRARY_PATH=$run/driver "$arbiter" --foreground --wait-for-gpus --config "$run/quanta.toml" 2>"$run/wait2.log" &
pids+=($!)
sleep 1
cp "$sim/libnvidia-ml.so.1" "$run/driver/"
for _ in $(seq 150); do [[ -S $run/run/quanta/tenant.sock ]] && break; sleep 0.1; done
[[ -S $run/run/quanta/tenant.sock && -S $run/run/quanta-admin/admin.sock ]] ||
  fail "no sockets 15 s after NVML appeared: $(cat "$run/wait2.log")"
[[ -d $run/var/lib/quanta ]] || fail "state directory not created"
grep -q "GPUs present after" "$run/wait2.log" || fail "no line saying the GPUs appeared: $(cat "$run/wait2.log")"
kill -0 "${pids[-1]}" 2>/dev/null || fail "exited after the GPUs appeared: $(cat "$run/wait2.log")"
kill -TERM "${pids[-1]}"
wait "${pids[-1]}" || fail "exited non-zero on SIGTERM: $(cat "$run/wait2.log")"
echo "ok: serves once NVML appears, in directories it created"
echo "container start: 5 passed, 0 failed"
