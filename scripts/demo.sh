#!/usr/bin/env bash
# `make demo`: starts quanta-arbiter with config/demo.toml on simgpu (or on the real GPU
# when an NVIDIA driver answers), runs three batch pods with weights 1:2:4 and a pod capped
# at 2 GiB for about 20 s under libquanta.so, shows the live table, then a summary, the
# contention attribution the arbiter measured (who waited behind whom, from its hold
# timeline), and ends with what `quanta-trace session` saw meanwhile: handoff histograms, a contention
# attribution table, and a Perfetto trace and SVG timeline under BUILD/demo/.
set -euo pipefail
build=$(cd "${1:-build}" && pwd)
seconds=${DEMO_SECONDS:-20}
root=$(cd "$(dirname "$0")/.." && pwd)
run=$(mktemp -d /tmp/quanta-demo.XXXXXX)
pids=()
trace_gpu=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [[ -n ${trace_pid:-} ]] && kill "$trace_pid" 2>/dev/null || true
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
  # Each context takes device memory as a real driver's does; the arbiter measures it at
  # start and the shims charge it.
  export SIMGPU_CONTEXT_MEMORY=300Mi
  # A UUID of its own, so the trace reports this demo's GPU even beside other simgpu users.
  export SIMGPU_UUIDS=GPU-de300000-0000-4000-8000-00000000d3e0
  trace_gpu=(--gpu "$SIMGPU_UUIDS")
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

# The tracing session watches the whole node (it finds the arbiter, libquanta.so and the
# driver itself); the driver uprobes are left out so the shares shown are undisturbed.
out=$build/demo
mkdir -p "$out"
trace_why=""
if [[ $(id -u) -ne 0 ]]; then
  trace_why="quanta-trace needs root"
elif [[ ! -x $build/bin/quanta-trace ]]; then
  trace_why="quanta-trace is not built (QUANTA_BUILD_BPF=OFF)"
elif [[ ! -r /sys/kernel/btf/vmlinux ]]; then
  trace_why="this kernel has no BTF (/sys/kernel/btf/vmlinux)"
fi
if [[ -z $trace_why ]]; then
  mountpoint -q /sys/kernel/tracing 2>/dev/null || mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null || true
  "$build/bin/quanta-trace" session --duration $((seconds + 30)) --no-driver "${trace_gpu[@]}" \
    --perfetto "$out/trace.json" --svg "$out/timeline.svg" >"$run/trace.txt" 2>"$run/trace.err" &
  trace_pid=$!
  for _ in $(seq 200); do grep -q Tracing "$run/trace.err" 2>/dev/null && break; sleep 0.05; done
  grep -q Tracing "$run/trace.err" || { trace_why="quanta-trace did not start: $(tail -1 "$run/trace.err")"; trace_pid=""; }
fi

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
metrics=$(quantactl status --json | python3 -c 'import json,sys; print(json.load(sys.stdin).get("metrics_listen",""))' || true)
[[ -n $metrics ]] && echo "  Prometheus metrics at http://$metrics/metrics; quantactl top shows the same live" && echo
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

echo
echo "Contention attribution (the arbiter's hold timeline; quantactl explain POD tells one pod's minute)"
for pod in demo/light demo/medium demo/heavy; do
  quantactl explain --json "$pod" >"$run/explain-${pod#demo/}.json" 2>"$run/explain-${pod#demo/}.err" || true
done
python3 - "$run" <<'PY'
import json, os, sys
run = sys.argv[1]
names = ["light", "medium", "heavy"]
data = {}
for n in names:
    try:
        with open(os.path.join(run, f"explain-{n}.json")) as f:
            data[n] = json.load(f)["gpus"][0]
    except (OSError, ValueError, KeyError, IndexError):
        print(f"  demo/{n}: no attribution (see {run}/explain-{n}.err)")
if not data:
    sys.exit(0)
head = f"  {'pod':<13}{'share':>7}{'target':>8}{'running':>9}{'waiting':>9}{'draining':>9}   waited while the GPU was held by:"
print(head)
print(f"  {'':<13}{'':>7}{'':>8}{'':>9}{'':>9}{'':>9}   " + "".join(f"{'demo/' + n:>13}" for n in names) + f"{'nobody':>9}")
for n in names:
    g = data.get(n)
    if g is None:
        continue
    ph = g["phases"]
    behind = {b["pod"]: b["seconds"] for b in g["behind"]}
    cells = "".join(f"{behind.get('demo/' + h, 0.0):>12.1f}s" if h != n else f"{'-':>13}" for h in names)
    print(f"  demo/{n:<8}{g['achieved_share']:>7.1%}{g['target_share']:>8.1%}{ph['running']:>8.1f}s"
          f"{ph['waiting']:>8.1f}s{ph['draining']:>8.1f}s   {cells}{behind.get('', 0.0):>8.1f}s")
light = data.get("light")
if light and light["behind"]:
    top = max((b for b in light["behind"] if b["pod"]), key=lambda b: b["seconds"], default=None)
    if top:
        print(f"  demo/light waited {light['phases']['waiting']:.1f} s, {top['seconds']:.1f} s of it behind {top['pod']}: "
              "its neighbours' turns, as their weights entitle them (not a fault).")
PY
if [[ -n $trace_why ]]; then
  echo "Tracing skipped: $trace_why."
  exit 0
fi
kill -INT "$trace_pid"
wait "$trace_pid" || { echo "demo: quanta-trace failed:"; cat "$run/trace.err"; exit 1; }
trace_pid=""
echo "What quanta-trace session saw (attribution computed from the trace)"
cat "$run/trace.txt"
echo
echo "Open $out/trace.json at https://ui.perfetto.dev (or chrome://tracing); $out/timeline.svg in a browser."
