#!/usr/bin/env bash
# docs/operator-guide.md "Install" followed as a script on one node, on simgpu: NVIDIA's CDI
# spec in place (as `nvidia-ctk cdi generate` writes /etc/cdi/nvidia.yaml: devices 0, the
# GPU's UUID and all), the installer run with the init container's command, arguments and
# environment from deploy/node/arbiter-daemonset.yaml, the arbiter with its container's, and
# the pods of deploy/examples/ as the device plugin's CDI strategy hands them to the runtime:
# each container gets CDI device nvidia.com/gpu=<GPU> (the index or the UUID) and nothing of
# Quanta's but its pod's quanta.dev/* annotations (plus the io.kubernetes.cri.* ones
# containerd writes). podman, a real CDI consumer, resolves the devices from /etc/cdi and
# /var/run/cdi (the folders the installer was told the runtime reads) and runs each
# container with quanta-tenant in place of the image's command. Then step 6 must hold: every
# pod is gated (granted the GPU), the inference pod is capped at its 10Gi memory-limit (11Gi
# refused, 1Gi granted), and `quantactl status` lists each pod. Then the device plugin's own
# CDI strategy: its spec (kind k8s.device-plugin.nvidia.com/gpu) in /var/run/cdi, taken over
# by the DaemonSet's cdi-sync container into the folder above, and a pod given its GPU from
# it is gated and capped. Last, cdi-sync keeps the take-over in step when NVIDIA's spec
# changes.
#
# The node is a private mount and network namespace: /etc/cdi, /run (so /var/run/cdi),
# /opt, /etc and /var/lib are writable there only, so every host path is the one the
# manifests name and nothing of the machine's is touched; the namespace, its podman
# containers, the arbiter, simgpu's state and the scratch folder go when the test ends.
# Exit 77 (skipped) without root, podman, runc or namespaces, unless QUANTA_REQUIRE_E2E is set.
#   install_guide_test.sh SOURCE_DIR BUILD_DIR
# QUANTA_GUIDE_INSTALLER and QUANTA_GUIDE_DAEMONSET replace the installer and the DaemonSet
# (an older version of either, to show what it did not do).
set -euo pipefail
src=$(cd "${1:?usage: install_guide_test.sh SOURCE_DIR BUILD_DIR}" && pwd)
build=$(cd "${2:?usage: install_guide_test.sh SOURCE_DIR BUILD_DIR}" && pwd)
installer=${QUANTA_GUIDE_INSTALLER:-$src/deploy/image/quanta-install-host}
daemonset=${QUANTA_GUIDE_DAEMONSET:-$src/deploy/node/arbiter-daemonset.yaml}

skip() {
  if [[ -n ${QUANTA_REQUIRE_E2E:-} ]]; then echo "FAIL: $1"; exit 1; fi
  echo "SKIP: $1"
  exit 77
}

if [[ -z ${QUANTA_GUIDE_NODE:-} ]]; then
  [[ $(id -u) -eq 0 ]] || skip "needs root (podman, mount namespaces)"
  for c in podman runc conmon unshare node; do
    command -v "$c" >/dev/null || skip "$c is not installed (scripts/install-deps.sh installs it)"
  done
  [[ -d $src/tests/deploy/node_modules/yaml ]] || skip "tests/deploy/node_modules is missing (scripts/install-deps.sh installs it)"
  for f in bin/quanta-arbiter bin/quantactl bin/quanta-hook libexec/quanta-hook lib/libquanta.so \
    bin/quanta-e2e-bundle bin/quanta-tenant sim/libnvidia-ml.so.1; do
    [[ -e $build/$f ]] || { echo "FAIL: $build/$f is missing (build first)"; exit 1; }
  done
  unshare --mount --net --propagation private true 2>/dev/null || skip "cannot make mount and network namespaces here"
  exec unshare --mount --net --propagation private env QUANTA_GUIDE_NODE=1 "$0" "$src" "$build"
fi

# --- In the node's namespaces from here on.
t=$(mktemp -d /tmp/quanta-guide.XXXXXX)
chmod 755 "$t"
sim=quanta-guide-$$
arbiter_pid=
sync_pid=
containers=()
step=setup
podman_global=(podman --root "$t/podman-root" --runroot "$t/podman-run" --storage-driver vfs
  --cgroup-manager cgroupfs --events-backend none --runtime "$(command -v runc)")
cleanup() {
  local rc=$?
  set +e
  for c in "${containers[@]}"; do "${podman_global[@]}" rm -f -t 0 "$c" >/dev/null 2>&1; done
  for p in $sync_pid $arbiter_pid; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  rm -f /dev/shm/"$sim"*
  # podman's own mounts under the scratch folder, then the layers.
  grep -o " $t/[^ ]*" /proc/self/mountinfo | sort -r | while read -r m; do umount -l "$m"; done
  rm -rf "$t"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
fail() {
  echo "FAIL ($step): $*"
  for f in install.log sync.log arbiter.log; do
    [[ -s $t/$f ]] && { echo "--- $f"; tail -40 "$t/$f"; }
  done
  exit 1
}
passed=0
failed=0
ok() { echo "ok: $*"; passed=$((passed + 1)); }

# Host folders the DaemonSet writes, writable in this namespace only: an overlay whose
# upper layer is a tmpfs (which works whatever /tmp is), or a tmpfs of its own.
mkdir -p "$t/layer"
mount -t tmpfs -o mode=755 quanta-guide "$t/layer"
writable() {
  local d=$1 n=${1//\//_}
  mkdir -p "$t/layer/$n/up" "$t/layer/$n/work"
  mount -t overlay overlay -o "lowerdir=$d,upperdir=$t/layer/$n/up,workdir=$t/layer/$n/work" "$d" ||
    skip "cannot overlay $d in a mount namespace here"
}
writable /etc
writable /var/lib
mount -t tmpfs -o mode=755 quanta-guide-run /run
mount -t tmpfs -o mode=755 quanta-guide-opt /opt
mkdir -p /etc/cdi
mount -t tmpfs -o mode=755 quanta-guide-cdi /etc/cdi # no spec of the machine's
mkdir -p /var/run/cdi
ip link set lo up 2>/dev/null || true
export LD_LIBRARY_PATH=$build/sim SIMGPU_STATE=$sim

yaml() { # yaml FILE SCRIPT: runs SCRIPT (JavaScript) with `doc`, the parsed FILE
  node -e "const YAML = require('$src/tests/deploy/node_modules/yaml');
const doc = YAML.parse(require('fs').readFileSync(process.argv[1], 'utf8')); $2" "$1"
}
# The command and arguments (or the environment, K=V) of a DaemonSet container, one a line.
container_field() {
  yaml "$daemonset" "const s = doc.spec.template.spec;
const c = [...(s.initContainers ?? []), ...s.containers].find((c) => c.name === '$1');
if (!c) process.exit(0);
const out = '$2' === 'argv' ? [...c.command, ...(c.args ?? [])] : (c.env ?? []).map((e) => e.name + '=' + e.value);
console.log(out.join('\n'));"
}
# The image's programs are the build's here.
image_program() {
  case $1 in
    /usr/local/bin/quanta-install-host) echo "$installer" ;;
    /usr/local/bin/quanta-arbiter) echo "$build/bin/quanta-arbiter" ;;
    *) fail "the DaemonSet runs $1, which this test does not know" ;;
  esac
}

# 0. NVIDIA's spec, where nvidia-ctk writes it, for simgpu's GPU.
step="NVIDIA's CDI spec"
uuid=$("$build/bin/quanta-tenant" --json info | node -pe 'JSON.parse(require("fs").readFileSync(0, "utf8")).devices[0].uuid')
[[ $uuid == GPU-* ]] || fail "simgpu lists no GPU"
vendor_spec() { # vendor_spec GENERATION: the spec, its containerEdits' env marked with GENERATION
  "$build/bin/quanta-e2e-bundle" vendor-spec --sim-state "$sim" --uuid "$uuid" --output "$t/vendor.json"
  yaml "$t/vendor.json" "doc.containerEdits.env.push('E2E_VENDOR_GENERATION=$1');
require('fs').writeFileSync('$t/nvidia.yaml', YAML.stringify(doc));"
  mv -f "$t/nvidia.yaml" /etc/cdi/nvidia.yaml
}
vendor_spec 1

# 4. The DaemonSet: the ConfigMap where its volume puts it, the init container's install.
step="install (init container)"
mkdir -p /etc/quanta-config
yaml "$src/deploy/node/node-config.yaml" "require('fs').writeFileSync('/etc/quanta-config/quanta.toml', doc.data['quanta.toml']);"
mapfile -t install_argv < <(container_field install argv)
mapfile -t install_env < <(container_field install env)
((${#install_argv[@]} > 0)) || fail "the DaemonSet has no init container named install"
install_argv[0]=$(image_program "${install_argv[0]}")
echo "installer: ${install_argv[*]:1}"
# The image's payload and arbiter (/usr/share/quanta/host, /usr/local/bin/quanta-arbiter)
# are the build's.
env "${install_env[@]}" QUANTA_INSTALL_GPU_WAIT=60 "${install_argv[@]}" \
  --payload="$build" --arbiter="$build/bin/quanta-arbiter" >"$t/install.log" 2>&1 ||
  fail "the installer failed"
takeover=$(find /var/run/cdi -maxdepth 1 -name '*.yaml' -newer /etc/cdi/nvidia.yaml | head -1)
if [[ -z $takeover ]]; then
  # Not fatal yet: the pods below show what that costs.
  echo "FAIL ($step): the installer wrote nothing into /var/run/cdi: a pod given nvidia.com/gpu gets no Quanta"
  failed=1
else
  grep -q quanta-hook "$takeover" || fail "$takeover has no quanta-hook"
  ok "the installer took over NVIDIA's spec: $takeover"
fi

# The DaemonSet's other containers: the arbiter, and the one keeping the take-over in step.
step="arbiter container"
mapfile -t arbiter_argv < <(container_field arbiter argv)
mapfile -t arbiter_env < <(container_field arbiter env)
arbiter_argv[0]=$(image_program "${arbiter_argv[0]}")
echo "arbiter: ${arbiter_argv[*]:1}"
env "${arbiter_env[@]}" "${arbiter_argv[@]}" >"$t/arbiter.log" 2>&1 &
arbiter_pid=$!
mapfile -t sync_argv < <(container_field cdi-sync argv)
if ((${#sync_argv[@]} > 0)); then
  mapfile -t sync_env < <(container_field cdi-sync env)
  sync_argv[0]=$(image_program "${sync_argv[0]}")
  echo "cdi-sync: ${sync_argv[*]:1}"
  env "${sync_env[@]}" "${sync_argv[@]}" >"$t/sync.log" 2>&1 &
  sync_pid=$!
fi
# 5. quantactl status answers.
for _ in $(seq 600); do
  "$build/bin/quantactl" status >/dev/null 2>&1 && break
  kill -0 "$arbiter_pid" 2>/dev/null || fail "the arbiter exited"
  sleep 0.1
done
"$build/bin/quantactl" status >"$t/status.txt" 2>&1 || fail "quantactl status: $(cat "$t/status.txt")"
ok "the arbiter answers quantactl status"

# 6. kubectl apply -f deploy/examples/: each GPU container as the device plugin's CDI
# strategy and containerd hand it to the runtime.
step="the example pods"
pods=()
caps=()
gpu_names=(0 "$uuid")
i=0
# start_pod FILE DEVICE [RUNNER...]: the pod of FILE's GPU container run by podman with CDI
# device DEVICE (through RUNNER, a command podman runs under, if any); sets pod (namespace/
# name) and cap (its quanta.dev/memory-limit); returns 1 when FILE has no GPU container.
start_pod() {
  local file=$1 device=$2
  shift 2
  local fields
  mapfile -t fields < <(yaml "$file" "const m = doc.metadata;
const c = doc.spec.containers.find((c) => (c.resources?.limits ?? {})['nvidia.com/gpu'] !== undefined);
if (!c) process.exit(0);
console.log([m.namespace ?? 'default', m.name, c.name, c.resources.limits['nvidia.com/gpu'],
  m.annotations?.['quanta.dev/memory-limit'] ?? '',
  ...Object.entries(m.annotations ?? {}).filter(([k]) => k.startsWith('quanta.dev/')).map(([k, v]) => k + '=' + v)].join('\n'));")
  ((${#fields[@]} >= 4)) || return 1
  local ns=${fields[0]} name=${fields[1]} container=${fields[2]} gpus=${fields[3]}
  cap=${fields[4]}
  [[ $gpus == 1 ]] || fail "$file asks for $gpus nvidia.com/gpu"
  i=$((i + 1))
  local args=(--device "$device" --annotation io.kubernetes.cri.container-type=container
    --annotation "io.kubernetes.cri.sandbox-name=$name" --annotation "io.kubernetes.cri.sandbox-namespace=$ns"
    --annotation "io.kubernetes.cri.sandbox-uid=00000000-0000-4000-8000-00000000000$i"
    --annotation "io.kubernetes.cri.container-name=$container")
  local a workload=(--kernel-ms 1)
  for a in "${fields[@]:5}"; do args+=(--annotation "$a"); done
  # An inference pod serves requests with pauses between them: classes are strict, so a
  # batch pod beside an interactive one that never paused would never be granted the GPU.
  [[ " ${fields[*]:5} " == *" quanta.dev/priority=interactive "* ]] && workload+=(--think-ms 5)
  [[ -d $t/$name/rootfs ]] || "$build/bin/quanta-e2e-bundle" rootfs "$t/$name" >/dev/null
  local id=guide-$$-$name
  containers+=("$id")
  # podman's default rlimits (nofile 1048576) can be above what the machine allows: lower
  # ones instead (containerd sets none of its own).
  "$@" "${podman_global[@]}" run -d --name "$id" --network none --log-driver none \
    --ulimit nofile=1024:1024 --ulimit nproc=4096:4096 \
    "${args[@]}" --rootfs "$t/$name/rootfs" /bin/quanta-tenant batch --seconds 600 "${workload[@]}" \
    >"$t/podman-$name.out" 2>&1 || fail "podman run of $ns/$name ($device) failed: $(cat "$t/podman-$name.out")"
  echo "started $ns/$name: --device $device ${fields[*]:5}"
  pod=$ns/$name
}
for file in "$src"/deploy/examples/*.yaml; do
  # The plugin names the GPU by its index or its UUID: both are tried.
  start_pod "$file" "nvidia.com/gpu=${gpu_names[$((i % 2))]}" || continue
  pods+=("$pod")
  caps+=("$cap")
done
((${#pods[@]} == 3)) || fail "deploy/examples/ gave ${#pods[@]} GPU pods, not 3"

# Gated: every pod is a tenant of the arbiter, at its memory cap, and its launches wait at
# the gate: the interactive and batch pods are granted the GPU, the best-effort one waits
# while they want it (and is granted it once they are gone, below).
step="gated"
bytes() { numfmt --from=iec-i "$1"; }
tenants() { # tenants: pod grants memory_cap state, a line per tenant in quantactl status --json
  "$build/bin/quantactl" status --json >"$t/status.json" 2>/dev/null || return 0
  node -e '
const s = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
for (const t of s.gpus.flatMap((g) => g.tenants)) console.log(t.pod, t.grants, t.memory_cap, t.state);' "$t/status.json"
}
granted() { # granted POD...: each has a tenant the arbiter granted the GPU
  local now
  now=$(tenants)
  for pod in "$@"; do
    awk -v p="$pod" '$1 == p && $2 > 0 { found = 1 } END { exit !found }' <<<"$now" || return 1
  done
}
for _ in $(seq 600); do granted default/llm-inference default/resnet-training && break; sleep 0.1; done
granted default/llm-inference default/resnet-training ||
  fail "the interactive and batch pods were not granted the GPU: $(tenants)"
now=$(tenants)
for n in "${!pods[@]}"; do
  line=$(awk -v p="${pods[$n]}" '$1 == p' <<<"$now")
  [[ -n $line ]] || fail "${pods[$n]} is not a tenant of the arbiter: $now"
  read -r _ _ cap state <<<"$line"
  [[ $cap == "$(bytes "${caps[$n]}")" ]] || fail "${pods[$n]}'s memory cap is $cap, not its quanta.dev/memory-limit ${caps[$n]}"
  echo "  ${pods[$n]}: $line"
done
ok "each pod is a tenant at its memory-limit; the interactive and batch pods are granted the GPU"

# Capped: a process of the inference pod asks for more than its 10Gi, then for 1Gi.
step="capped"
alloc() { # alloc POD BYTES: successes and denials of one allocation in the pod's container
  "${podman_global[@]}" exec "guide-$$-${1#*/}" /bin/quanta-tenant --json alloc --bytes "$2" 2>"$t/alloc.err" |
    node -pe 'const r = JSON.parse(require("fs").readFileSync(0, "utf8")); r.successes + " " + r.oom' ||
    echo "none: $(cat "$t/alloc.err")"
}
pod=default/llm-inference
[[ " ${pods[*]} " == *" $pod "* ]] || fail "deploy/examples/ has no $pod"
got=$(alloc "$pod" 11Gi)
[[ $got == "0 1" ]] || fail "11Gi in $pod (memory-limit 10Gi): successes and denials $got, not 0 1"
got=$(alloc "$pod" 1Gi)
[[ $got == "1 0" ]] || fail "1Gi in $pod: successes and denials $got, not 1 0"
ok "$pod is capped: 11Gi refused, 1Gi granted under its 10Gi memory-limit"

# Listed: quantactl status, as step 6 says.
step="listed"
"$build/bin/quantactl" status >"$t/status.txt" 2>&1 || fail "quantactl status: $(cat "$t/status.txt")"
for pod in "${pods[@]}"; do
  grep -q " $pod " "$t/status.txt" || fail "quantactl status does not list $pod:
$(cat "$t/status.txt")"
done
cat "$t/status.txt"
ok "quantactl status lists ${pods[*]}"

# The best-effort pod is granted the GPU once the pods of better classes are gone.
step="gated (best-effort)"
for pod in default/llm-inference default/resnet-training; do
  "${podman_global[@]}" rm -f -t 0 "guide-$$-${pod#*/}" >/dev/null 2>&1 || fail "podman rm of $pod failed"
done
for _ in $(seq 600); do granted default/notebook && break; sleep 0.1; done
granted default/notebook || fail "default/notebook was not granted the GPU once alone: $(tenants)"
ok "default/notebook waited at the gate and was granted the GPU once alone"

# The device plugin's CDI strategies: it writes its own spec (kind
# k8s.device-plugin.nvidia.com/gpu) into /var/run/cdi and names a pod's GPU from it. The
# runtime reads /var/run/cdi-quanta last, as deploy/containerd and deploy/crio configure it;
# this podman reads two folders only, so it runs with the host's /var/run/cdi as its lower
# folder and /var/run/cdi-quanta as its higher one (a mount namespace of its own), which is
# how those two rank for the runtime.
step="the device plugin's CDI strategy"
yaml "$t/vendor.json" "doc.kind = 'k8s.device-plugin.nvidia.com/gpu';
require('fs').writeFileSync('$t/plugin.json', JSON.stringify(doc));"
mv -f "$t/plugin.json" /var/run/cdi/k8s.device-plugin.nvidia.com-gpu.json
plugin_takeover=$(container_field cdi-sync argv | sed -n 's/^--spec-dirs=.*,//p')/quanta-k8s.device-plugin.nvidia.com_gpu.yaml
for _ in $(seq 300); do [[ -f $plugin_takeover ]] && break; sleep 0.1; done
[[ -f $plugin_takeover ]] || fail "the cdi-sync container did not take over the device plugin's spec into $plugin_takeover"
[[ $(realpath "$(dirname "$plugin_takeover")") != "$(realpath /var/run/cdi)" ]] ||
  fail "the device plugin's take-over went into /var/run/cdi, beside its spec, where the runtime drops both"
ok "the cdi-sync container took over the device plugin's spec: $plugin_takeover"
runtime_folders=(unshare --mount --propagation private sh -c
  'mount --bind /var/run/cdi /etc/cdi && mount --bind "$0" /var/run/cdi && exec "$@"' "$(dirname "$plugin_takeover")")
start_pod "$src/deploy/examples/inference-interactive.yaml" "k8s.device-plugin.nvidia.com/gpu=$uuid" "${runtime_folders[@]}" ||
  fail "deploy/examples/inference-interactive.yaml has no GPU container"
for _ in $(seq 600); do granted "$pod" && break; sleep 0.1; done
line=$(tenants | awk -v p="$pod" '$1 == p')
[[ -n $line ]] || fail "$pod, given its GPU as the device plugin names it, is not a tenant of the arbiter: $(tenants)"
read -r _ grants plugin_cap _ <<<"$line"
[[ $grants -gt 0 ]] || fail "$pod is not granted the GPU: $line"
[[ $plugin_cap == "$(bytes "$cap")" ]] || fail "$pod's memory cap is $plugin_cap, not its quanta.dev/memory-limit $cap"
ok "$pod, given k8s.device-plugin.nvidia.com/gpu=$uuid, is gated and capped at $cap"

# Kept in step: NVIDIA's spec regenerated (a driver upgrade), the take-over follows.
step="kept in step"
if [[ -n $sync_pid ]]; then
  vendor_spec 2
  for _ in $(seq 600); do grep -q E2E_VENDOR_GENERATION=2 "$takeover" && break; sleep 0.1; done
  grep -q E2E_VENDOR_GENERATION=2 "$takeover" || fail "$takeover was not regenerated after NVIDIA's spec changed"
  grep -q E2E_VENDOR_GENERATION=1 "$takeover" && fail "$takeover still has the old spec's edits"
  ok "the cdi-sync container regenerated $takeover when NVIDIA's spec changed"
else
  fail "the DaemonSet has no cdi-sync container: nothing keeps the take-over in step with NVIDIA's spec"
fi
((failed == 0)) || fail "see above"
echo "install guide: $passed passed, 0 failed"
