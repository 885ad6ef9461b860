#!/usr/bin/env bash
# `make demo`: starts quanta-arbiter with config/demo.toml on simgpu (or on the real GPU
# when an NVIDIA driver answers), runs three batch pods with weights 1:2:4 and a pod capped
# at 2 GiB for about 20 s under libquanta.so, shows the live table, then a summary.
set -euo pipefail
build=$(cd "${1:-build}" && pwd)
seconds=${DEMO_SECONDS:-20}
root=$(cd "$(dirname "$0")/.." && pwd)
run=$(mktemp -d /tmp/quanta-demo.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [[ -n ${arbiter_pid:-} ]] && kill "$arbiter_pid" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -f /dev/shm/quanta-demo.* /dev/shm/simgpu-demo-$$* 2>/dev/null || true
}
trap cleanup EXIT

if nvidia-smi -L >/dev/null 2>&1; then
  gpu="the real GPU ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1))"
else
  export LD_LIBRARY_PATH=$build/sim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export SIMGPU_STATE=simgpu-demo-$$ SIMGPU_LOG=$run/simgpu.log SIMGPU_MEMORY=16Gi
  gpu="simgpu (a simulated GPU; no NVIDIA driver on this machine)"
fi

sed "s|@RUN@|$run|g" "$root/config/demo.toml" >"$run/quanta.toml"
"$build/bin/quanta-arbiter" --foreground --config "$run/quanta.toml" 2>"$run/arbiter.log" &
arbiter_pid=$!
for _ in $(seq 100); do [[ -S $run/tenant.sock ]] && break; sleep 0.05; done
[[ -S $run/tenant.sock ]] || { echo "demo: quanta-arbiter did not start:"; cat "$run/arbiter.log"; exit 1; }

echo "Quanta demo on $gpu, ${seconds} s"
echo "  pods demo/light, demo/medium, demo/heavy: batch tenants, 2 ms kernels, weights 1:2:4"
echo "  pod demo/capped: memory_limit 2Gi; its tenant asks for 512 MiB blocks until denied"
echo

export QUANTA_SOCKET=$run/tenant.sock QUANTA_LOG_LEVEL=${QUANTA_LOG_LEVEL:-error}
tenant() {
  local pod=$1; shift
  QUANTA_POD=$pod LD_PRELOAD=$build/lib/libquanta.so "$build/bin/quanta-tenant" --json "$@" \
    >"$run/${pod#demo/}.json" 2>"$run/${pod#demo/}.err" &
  pids+=($!)
}
start_at=$(( $(date +%s%N) + 500000000 ))
for pod in demo/light demo/medium demo/heavy; do
  tenant $pod --start-at $start_at batch --kernel-ms 2 --depth 2 --seconds "$seconds"
done
tenant demo/capped alloc --family alloc --bytes 512Mi --count 8 --hold-ms $((seconds * 1000 / 2))

quantactl() { "$build/bin/quantactl" --admin-socket "$run/admin.sock" "$@"; }
deadline=$(( $(date +%s) + seconds + 2 ))
while (( $(date +%s) < deadline )); do
  sleep 4
  printf '\033[1m--- %s ---\033[0m\n' "$(date +%T)"
  quantactl status || true
done
for p in "${pids[@]}"; do wait "$p" || echo "demo: a tenant failed; see $run/*.err"; done
pids=()

echo
echo "Summary"
python3 - "$run" <<'PY'
import json, os, sys
run = sys.argv[1]
weights = {"light": 1, "medium": 2, "heavy": 4}
total_w = sum(weights.values())
rows, total_ks = [], 0.0
for name in weights:
    with open(os.path.join(run, name + ".json")) as f:
        r = json.load(f)
    rows.append((name, r))
    total_ks += r.get("kernel_seconds", 0.0)
print(f"  {'pod':<14}{'weight':>7}{'target':>9}{'achieved':>10}{'kernels':>9}")
worst = 0.0
for name, r in rows:
    target = weights[name] / total_w
    got = r.get("kernel_seconds", 0.0) / total_ks if total_ks else 0.0
    worst = max(worst, abs(got - target) * 100)
    print(f"  demo/{name:<9}{weights[name]:>7}{target:>9.1%}{got:>10.1%}{r.get('kernels', 0):>9}")
print(f"  largest share error: {worst:.1f} percentage points (native time slicing would give 33.3% each)")
with open(os.path.join(run, "capped.json")) as f:
    c = json.load(f)
print(f"  demo/capped: {c.get('successes')} x 512 MiB granted, {c.get('oom')} denied with "
      f"CUDA_ERROR_OUT_OF_MEMORY at the 2 GiB cap (peak held {c.get('peak_bytes_held', 0) / 2**30:.1f} GiB)")
PY
