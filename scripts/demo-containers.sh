#!/usr/bin/env bash
# `make demo-containers`: pods get Quanta with no change to their images. Starts
# quanta-arbiter (simgpu, or the real GPU when an NVIDIA driver answers), writes Quanta's CDI
# spec with `quanta-hook cdi generate`, assembles an image without libstdc++ (the e2e
# harness's code, through quanta-e2e-bundle) and runs two annotated containers under real
# runc: demo/light (quanta.dev/weight=1) and demo/heavy (quanta.dev/weight=3,
# quanta.dev/memory-limit=2Gi), plus a process exec'd into demo/heavy that allocates until
# the pod's cap refuses it. Shows `quantactl status` while they run, then each pod's share
# against its 25/75 target and the refused allocation. Removes the containers, their
# registrations and everything else it made on exit, Ctrl-C included.
#   DEMO_SECONDS   how long the two pods run (default 15)
#   DEMO_KEEP=1    keep the run folder (bundles, logs, reports) for a look afterwards
#   DEMO_TMP       where the run folder is made (default /tmp)
set -euo pipefail
build=$(cd "${1:-build}" && pwd)
seconds=${DEMO_SECONDS:-15}
me=demo-containers

if [[ $(id -u) -ne 0 ]]; then
  echo "$me: needs root: runc creates the containers' namespaces and cgroups, and quanta-hook" >&2
  echo "$me: registers them on the arbiter's admin socket, which answers root only; run it as root (sudo make demo-containers)" >&2
  exit 1
fi
if ! [[ $seconds =~ ^[0-9]+$ ]] || ((seconds < 3 || seconds > 600)); then
  echo "$me: DEMO_SECONDS=$seconds is not allowed: use a whole number of seconds from 3 to 600" >&2
  exit 2
fi
runc=$(command -v runc || true)
[[ -n $runc ]] || { echo "$me: runc is not installed (scripts/install-deps.sh installs it)" >&2; exit 1; }
for f in bin/quanta-arbiter bin/quanta-hook libexec/quanta-hook bin/quantactl bin/quanta-e2e-bundle lib/libquanta.so; do
  [[ -e $build/$f ]] || { echo "$me: $build/$f is missing: build first (make build)" >&2; exit 1; }
done

run=$(mktemp -d "${DEMO_TMP:-/tmp}/quanta-demo-containers.XXXXXX")
chmod 755 "$run"
scope=quanta-democ-$$
ids=("qdemo-$$-light" "qdemo-$$-heavy")
pids=()
arbiter_pid=""
cleanup() {
  local rc=$?
  # A second Ctrl-C must not cut the clean-up short; it is bounded (runc kill and delete).
  trap '' INT TERM
  trap - EXIT
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  # delete runs the containers' poststop hooks, which unregister them: before the arbiter goes.
  for id in "${ids[@]}"; do
    "$runc" --root "$run/runc" kill "$id" KILL >/dev/null 2>&1 || true
    "$runc" --root "$run/runc" delete --force "$id" >/dev/null 2>&1 || true
  done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if [[ -n $arbiter_pid ]]; then
    kill "$arbiter_pid" 2>/dev/null || true
    wait "$arbiter_pid" 2>/dev/null || true
  fi
  rm -f /dev/shm/"$scope".* /dev/shm/simgpu-democ-$$* 2>/dev/null || true
  if [[ ${DEMO_KEEP:-0} == 1 ]]; then
    echo "$me: kept $run"
  else
    rm -rf "$run"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'echo; echo "$me: interrupted, cleaning up"; exit 130' INT TERM

if nvidia-smi -L >/dev/null 2>&1; then
  gpu="the real GPU ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1))"
  command -v nvidia-ctk >/dev/null || {
    echo "$me: an NVIDIA driver answers but nvidia-ctk is not installed: the containers get the driver" >&2
    echo "$me: from NVIDIA's CDI spec (NVIDIA Container Toolkit 1.13 or later)" >&2
    exit 1
  }
  sim=0
else
  export LD_LIBRARY_PATH=$build/sim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export SIMGPU_STATE=simgpu-democ-$$ SIMGPU_LOG=$run/simgpu.log SIMGPU_MEMORY=16Gi
  # Each context takes device memory as a real driver's does; the arbiter measures it at
  # start and the shims charge it (the stand-in for NVIDIA's spec passes it to containers).
  export SIMGPU_CONTEXT_MEMORY=300Mi
  gpu="simgpu (a simulated GPU; no NVIDIA driver on this machine)"
  sim=1
fi

# A node config of its own: scope, sockets (the tenant socket's folder is what the CDI spec
# mounts into the containers at /run/quanta; the admin socket's is not) and state under the
# run folder; no unregistered processes.
mkdir -p "$run/sock" "$run/admin" "$run/state" "$run/cdi" "$run/opt-quanta/bin" "$run/opt-quanta/lib"
cat >"$run/quanta.toml" <<EOF
[node]
scope = "$scope"
tenant_socket = "$run/sock/tenant.sock"
admin_socket = "$run/admin/admin.sock"
state_dir = "$run/state"
allow_unregistered = false

[scheduler]
quantum = "20ms"
idle_release = "2ms"

[hook]
timeout = "5s"
EOF
QUANTA_LOG_LEVEL=info "$build/bin/quanta-arbiter" --foreground --config "$run/quanta.toml" \
  >"$run/arbiter.out" 2>"$run/arbiter.log" </dev/null &
arbiter_pid=$!
for _ in $(seq 200); do [[ -S $run/admin/admin.sock ]] && break; sleep 0.05; done
[[ -S $run/admin/admin.sock ]] || { echo "$me: quanta-arbiter did not start:"; cat "$run/arbiter.log"; exit 1; }
quantactl() { "$build/bin/quantactl" --admin-socket "$run/admin/admin.sock" "$@"; }

# Quanta "installed" the way the node image does it (docs/operator-guide.md), under a prefix
# of the demo's own, and its CDI spec generated from the node config.
# The installer's layout (the static launcher in bin/, the program in libexec/) and its
# command line; the hooks' environment is the spec's fixed one, nothing of the demo's.
install -D -m 0755 "$build/libexec/quanta-hook" "$run/opt-quanta/libexec/quanta-hook"
install -D -m 0755 "$build/bin/quanta-hook" "$run/opt-quanta/bin/quanta-hook"
install -D -m 0644 "$build/lib/libquanta.so" "$run/opt-quanta/lib/libquanta.so"
"$run/opt-quanta/bin/quanta-hook" cdi generate --config "$run/quanta.toml" --prefix "$run/opt-quanta" \
  --output "$run/cdi/quanta.json"
uuid=$(quantactl status --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["gpus"][0]["uuid"])')

# The vendor's spec: what NVIDIA's toolkit writes for the node's driver, or the e2e
# harness's stand-in that mounts simgpu's libraries where the toolkit mounts the driver's.
if ((sim)); then
  "$build/bin/quanta-e2e-bundle" vendor-spec --sim-state "$SIMGPU_STATE" --sim-log "$SIMGPU_LOG" \
    --uuid "$uuid" --output "$run/cdi/vendor.json"
else
  nvidia-ctk cdi generate --format json --output "$run/cdi/vendor.json" >"$run/nvidia-ctk.log" 2>&1 ||
    { echo "$me: nvidia-ctk cdi generate failed:"; cat "$run/nvidia-ctk.log"; exit 1; }
fi
rootfs=$("$build/bin/quanta-e2e-bundle" rootfs "$run/image")

echo "Quanta in containers on $gpu, ${seconds} s, under $("$runc" --version | head -1)"
echo "  CDI spec: quanta-hook cdi generate wrote kind quanta.dev/gpu (devices $(python3 -c '
import json, sys
print(", ".join(d["name"] for d in json.load(open(sys.argv[1]))["devices"]))' "$run/cdi/quanta.json"))"
echo "  image: glibc and quanta-tenant only (no libstdc++, no Quanta); each container asks for"
echo "         nvidia.com/gpu=0 and quanta.dev/gpu=0, as a pod with both CDI devices does"
echo "  pod demo/light: quanta.dev/weight=1"
echo "  pod demo/heavy: quanta.dev/weight=3, quanta.dev/memory-limit=2Gi; a second process"
echo "                  exec'd into it asks for 512 MiB blocks until the pod's cap refuses one"
echo

# Both pods start their kernels at the same moment, once the containers are up.
start_at=$(($(date +%s%N) + 4000000000))
bundle() {
  local name=$1; shift
  "$build/bin/quanta-e2e-bundle" bundle --rootfs "$rootfs" --id "qdemo-$$-$name" --pod "demo/$name" \
    --edits "$run/cdi/vendor.json=0" --edits "$run/cdi/quanta.json=0" --output "$run/bundles/$name" "$@" \
    -- /bin/quanta-tenant --json batch --kernel-ms 2 --depth 2 --seconds "$seconds" --start-at "$start_at"
}
bundle light --annotation quanta.dev/weight=1
bundle heavy --annotation quanta.dev/weight=3 --annotation quanta.dev/memory-limit=2Gi
for name in light heavy; do
  "$runc" --root "$run/runc" run --bundle "$run/bundles/$name" "qdemo-$$-$name" \
    >"$run/$name.json" 2>"$run/$name.err" </dev/null &
  pids+=($!)
done

running() { [[ $("$runc" --root "$run/runc" state "$1" 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["status"])' 2>/dev/null) == running ]]; }
for _ in $(seq 300); do running "${ids[1]}" && break; sleep 0.1; done
if ! running "${ids[1]}"; then
  echo "$me: the demo/heavy container did not start; runc and quanta-hook said:"
  cat "$run/heavy.err"
  exit 1
fi
now_ns() { date +%s%N; }
sleep_until() { local left=$(($1 - $(now_ns))); ((left > 0)) && sleep "$(printf '%d.%09d' $((left / 1000000000)) $((left % 1000000000)))"; return 0; }
# As `kubectl exec` would: a second process in demo/heavy's container, in its cgroup, so in
# its pod and against its ledger, while the pod's batch process runs. Each CUDA context is
# charged [shim] context_overhead (300 MiB) too: 2 x 300 MiB + 2 x 512 MiB fit in 2 GiB, a
# third 512 MiB block does not.
sleep_until $((start_at + 1000000000))
hold_ms=$(((seconds - 2) * 1000))
"$runc" --root "$run/runc" exec "${ids[1]}" /bin/quanta-tenant --json alloc --bytes 512Mi --count 4 \
  --hold-ms "$hold_ms" >"$run/alloc.json" 2>"$run/alloc.err" </dev/null &
pids+=($!)

# The live table every 4 s while the pods run, the first once both are past their start.
# The arbiter's own figures are kept from the last table that still listed both pods.
next=$((start_at + 3000000000))
while kill -0 "${pids[0]}" 2>/dev/null || kill -0 "${pids[1]}" 2>/dev/null; do
  if (($(now_ns) >= next)); then
    printf '\033[1m--- %s ---\033[0m\n' "$(date +%T)"
    quantactl status || true
    if quantactl status --json >"$run/status.json.new" 2>/dev/null &&
      grep -q '"demo/light"' "$run/status.json.new" && grep -q '"demo/heavy"' "$run/status.json.new"; then
      mv "$run/status.json.new" "$run/status.json"
    fi
    next=$((next + 4000000000))
  fi
  sleep 0.2
done
failed=0
for i in "${!pids[@]}"; do wait "${pids[$i]}" || failed=1; done
pids=()
if ((failed)); then
  echo "$me: a container or the exec'd process failed:"
  tail -n 5 "$run"/light.err "$run"/heavy.err "$run"/alloc.err
  exit 1
fi
# The runtime deletes a container whose run returned; its poststop hook unregistered it.
for _ in $(seq 50); do
  left=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1])).get("registrations", [])))' \
    "$run/state/$scope.state.json" 2>/dev/null || echo "?")
  [[ $left == 0 ]] && break
  sleep 0.1
done

echo
echo "Summary"
light_pid=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["pid"])' "$run/light.json")
heavy_pid=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["pid"])' "$run/heavy.json")
if ((sim)); then
  "$build/bin/quanta-e2e-bundle" shares --sim-log "$SIMGPU_LOG" "$light_pid" "$heavy_pid" >"$run/shares.json"
  source_of="simgpu's execution log, while both ran"
else
  echo '{}' >"$run/shares.json"
  source_of="the arbiter's figures (quantactl status --json)"
fi
python3 - "$run" "$light_pid" "$heavy_pid" "$source_of" "$left" <<'PY'
import json, os, sys
run, light_pid, heavy_pid, source_of, left = sys.argv[1:6]
shares = json.load(open(os.path.join(run, "shares.json")))
status = {}
try:
    status = json.load(open(os.path.join(run, "status.json")))
except (OSError, ValueError):
    pass
arbiter = {}
for gpu in status.get("gpus", []):
    for t in gpu.get("tenants", []):
        if t.get("launches", 0) > 0 or t.get("grants", 0) > 0:
            arbiter[str(t.get("pid"))] = t.get("achieved_share")
busy = shares.get("busy_ns", {})
total = sum(busy.values())
print(f"  {'pod':<12}{'weight':>7}{'target':>9}{'achieved':>10}{'arbiter':>9}{'kernels':>9}")
worst = 0.0
for name, pid, weight in (("light", light_pid, 1), ("heavy", heavy_pid, 3)):
    r = json.load(open(os.path.join(run, name + ".json")))
    target = weight / 4
    a = arbiter.get(pid)
    got = busy.get(pid, 0) / total if total else a
    if got is not None:
        worst = max(worst, abs(got - target) * 100)
    got_s = f"{got:.1%}" if got is not None else "-"
    a_s = f"{a:.1%}" if a is not None else "-"
    print(f"  demo/{name:<7}{weight:>7}{target:>9.1%}{got_s:>10}{a_s:>9}{r.get('kernels', 0):>9}")
print(f"  achieved: from {source_of}; arbiter: its own figure at the last table above")
print(f"  largest share error: {worst:.1f} percentage points (native time slicing would give 50% each)")
c = json.load(open(os.path.join(run, "alloc.json")))
print(f"  demo/heavy's exec'd process: {c.get('successes')} x 512 MiB granted, {c.get('oom')} refused with "
      f"CUDA_ERROR_OUT_OF_MEMORY at the pod's 2 GiB cap (its batch process's context counts too)")
print(f"  registrations left after the containers exited (poststop): {left}")
PY
