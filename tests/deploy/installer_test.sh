#!/usr/bin/env bash
# deploy/image/quanta-install-host in a scratch "host": it installs libquanta.so, quanta-hook,
# the node config and the CDI spec (quanta-hook adds <prefix>/etc); a second install with a new library
# replaces the file by rename while a process keeps mapping the old one (its bytes stay
# intact: nothing is truncated); an unchanged payload leaves every file (inode) alone; a
# node config the arbiter refuses stops the install before anything changes. NVIDIA's CDI
# spec in the lower-priority folder is taken over into the higher one (unchanged: left
# alone), and nothing is taken over with --no-take-over, with NVIDIA's spec in the folder of
# highest priority, or without one (each says so in a line); with three folders the device
# plugin's spec is taken over too, each spec just above its own folder; --watch regenerates
# the take-over when NVIDIA's spec changes or moves and removes it when the spec goes.
set -euo pipefail
src=${1:?usage: installer_test.sh SOURCE_DIR BUILD_DIR}
build=${2:?}
t=$(mktemp -d /tmp/quanta-install.XXXXXX)
mapper=
watcher=
cleanup() {
  [[ -n $mapper ]] && kill "$mapper" 2>/dev/null
  [[ -n $watcher ]] && kill "$watcher" 2>/dev/null && wait "$watcher" 2>/dev/null
  rm -rf "$t" /dev/shm/quanta-install-$$*
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
passed=0
ok() { echo "ok: $*"; passed=$((passed + 1)); }

mkdir -p "$t/payload/lib" "$t/payload/bin" "$t/node-config"
cp "$build/lib/libquanta.so" "$t/payload/lib/libquanta.so"
# The built quanta-hook, as the image carries it: the static launcher in bin/, the program
# it starts in libexec/.
mkdir -p "$t/payload/libexec"
cp "$build/bin/quanta-hook" "$t/payload/bin/quanta-hook"
cp "$build/libexec/quanta-hook" "$t/payload/libexec/quanta-hook"
hook_kind="built quanta-hook"
export LD_LIBRARY_PATH=$build/sim SIMGPU_STATE=quanta-install-$$
node -e '
const YAML = require(process.argv[1] + "/tests/deploy/node_modules/yaml");
const fs = require("fs");
const cm = YAML.parse(fs.readFileSync(process.argv[1] + "/deploy/node/node-config.yaml", "utf8"));
fs.writeFileSync(process.argv[2], cm.data["quanta.toml"]);' "$src" "$t/node-config/quanta.toml"

install() {
  "$src/deploy/image/quanta-install-host" --prefix="$t/opt/quanta" --node-config="$t/node-config/quanta.toml" \
    --config="$t/etc/quanta/quanta.toml" --socket=/run/quanta/tenant.sock --cdi-dir="$t/etc/cdi" \
    --spec-dirs="$t/etc/cdi,$t/var/run/cdi" --payload="$t/payload" --arbiter="$build/bin/quanta-arbiter" "$@"
}
inode() { stat -c %i "$1"; }

# 1. A fresh node.
out=$(install) || fail "first install failed: $out"
for f in opt/quanta/lib/libquanta.so opt/quanta/bin/quanta-hook opt/quanta/libexec/quanta-hook opt/quanta/etc/ld.so.preload opt/quanta/etc/node.conf etc/quanta/quanta.toml etc/cdi/quanta.yaml; do
  [[ -f $t/$f ]] || fail "$f not installed: $out"
done
[[ -x $t/opt/quanta/bin/quanta-hook ]] || fail "quanta-hook is not executable"
[[ $(cat "$t/opt/quanta/etc/ld.so.preload") == /opt/quanta/lib/libquanta.so ]] || fail "ld.so.preload: $(cat "$t/opt/quanta/etc/ld.so.preload")"
cmp -s "$t/node-config/quanta.toml" "$t/etc/quanta/quanta.toml" || fail "the node config copy differs"
grep -Eq '^kind: "?quanta\.dev/gpu"?$' "$t/etc/cdi/quanta.yaml" || fail "the CDI spec is not of kind quanta.dev/gpu"
leftovers=$(find "$t/opt" "$t/etc" -name '*.new.*' -o -name '.*.tmp')
[[ -z $leftovers ]] || fail "staging files left behind: $leftovers"
ok "a fresh install puts every file in place ($hook_kind)"

# 2. A new library while a process maps the old one.
mkfifo "$t/mapper.fifo"
python3 -c '
import hashlib, mmap, sys
f = open(sys.argv[1], "rb"); m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
print(hashlib.sha256(m[:]).hexdigest(), flush=True)
sys.stdin.readline()
print(hashlib.sha256(m[:]).hexdigest(), flush=True)' "$t/opt/quanta/lib/libquanta.so" <"$t/mapper.fifo" >"$t/mapper.out" 2>&1 &
mapper=$!
exec 9>"$t/mapper.fifo"
for _ in $(seq 50); do [[ -s $t/mapper.out ]] && break; sleep 0.1; done
before=$(head -1 "$t/mapper.out")
old_inode=$(inode "$t/opt/quanta/lib/libquanta.so")
printf 'a newer build\n' >>"$t/payload/lib/libquanta.so"
out=$(install) || fail "second install failed: $out"
[[ $out == *"libquanta.so installed"* ]] || fail "the new library was not installed: $out"
cmp -s "$t/payload/lib/libquanta.so" "$t/opt/quanta/lib/libquanta.so" || fail "the installed library is not the new one"
[[ $(inode "$t/opt/quanta/lib/libquanta.so") != "$old_inode" ]] || fail "the library was rewritten in place, not replaced"
echo >&9
exec 9>&-
wait "$mapper" || fail "the process mapping the old library died: $(cat "$t/mapper.out")"
mapper=
after=$(sed -n 2p "$t/mapper.out")
[[ -n $before && $before == "$after" ]] || fail "the mapped old library changed under its process ($before -> $after)"
ok "a new library replaces the old by rename; the process mapping the old one reads it intact"

# 3. Same payload again: nothing the installer owns is touched.
owned="opt/quanta/lib/libquanta.so opt/quanta/bin/quanta-hook opt/quanta/libexec/quanta-hook etc/quanta/quanta.toml etc/cdi/quanta.yaml"
inodes=$(for f in $owned; do inode "$t/$f"; done)
out=$(install) || fail "third install failed: $out"
[[ $(grep -c unchanged <<<"$out") -eq 5 ]] || fail "an unchanged payload was rewritten: $out"
again=$(for f in $owned; do inode "$t/$f"; done)
[[ $inodes == "$again" ]] || fail "inodes changed on an unchanged install"
ok "an unchanged payload leaves every file alone"

# 4. NVIDIA's spec: taken over into the folder of higher priority.
takeover=$t/var/run/cdi/quanta-nvidia.com_gpu.yaml
vendor() { # vendor FILE GENERATION: a spec shaped like nvidia-ctk's, marked with GENERATION
  mkdir -p "$(dirname "$1")"
  if [[ $1 == *.json ]]; then
    printf '%s\n' '{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu",' "\"containerEdits\":{\"env\":[\"NVIDIA_VENDOR_GENERATION=$2\"]}," \
      '"devices":[{"name":"0","containerEdits":{"env":["NVIDIA_VENDOR_DEVICE=0"]}},' \
      '{"name":"all","containerEdits":{"env":["NVIDIA_VENDOR_DEVICE=all"]}}]}' >"$1.tmp"
  else
    printf '%s\n' 'cdiVersion: "0.5.0"' 'kind: nvidia.com/gpu' 'containerEdits:' "  env: [NVIDIA_VENDOR_GENERATION=$2]" \
      'devices:' '  - name: "0"' '    containerEdits: {env: [NVIDIA_VENDOR_DEVICE=0]}' \
      '  - name: all' '    containerEdits: {env: [NVIDIA_VENDOR_DEVICE=all]}' >"$1.tmp"
  fi
  mv "$1.tmp" "$1"
}
vendor "$t/etc/cdi/nvidia.yaml" 1
out=$(install) || fail "install with NVIDIA's spec failed: $out"
[[ -f $takeover ]] || fail "no take-over in the higher-priority folder: $out"
grep -Eq '^kind: "?nvidia\.com/gpu"?$' "$takeover" || fail "the take-over is not of kind nvidia.com/gpu"
grep -q NVIDIA_VENDOR_GENERATION=1 "$takeover" || fail "the take-over lost NVIDIA's edits"
grep -q "$t/opt/quanta/bin/quanta-hook" "$takeover" || fail "the take-over has no quanta-hook"
[[ $out == *"took over $t/etc/cdi/nvidia.yaml"* ]] || fail "the install did not say it took over: $out"
[[ -z $(find "$t/etc" "$t/var" -name '.*.tmp') ]] || fail "staging files left behind"
taken=$(inode "$takeover")
out=$(install) || fail "install again failed: $out"
[[ $out == *"quanta-nvidia.com_gpu.yaml unchanged"* && $(inode "$takeover") == "$taken" ]] ||
  fail "an unchanged take-over was rewritten: $out"
ok "NVIDIA's spec is taken over into the higher-priority folder; unchanged, it is left alone"

# 5. No take-over: turned off, NVIDIA's spec in the highest folder, or no spec at all.
out=$(install --no-take-over) || fail "install --no-take-over failed: $out"
[[ ! -e $takeover && $out == *"removed (--no-take-over)"* && $out == *"only the quanta.dev/gpu kind is installed"* ]] ||
  fail "--no-take-over: $out"
mkdir -p "$t/var/run/cdi"
mv "$t/etc/cdi/nvidia.yaml" "$t/var/run/cdi/nvidia-container-toolkit.json"
out=$(install) || fail "install with NVIDIA's spec in the highest folder failed: $out"
[[ ! -e $takeover && $(grep -c "highest-priority CDI folder" <<<"$out") -eq 1 ]] || fail "spec in the highest folder: $out"
rm "$t/var/run/cdi/nvidia-container-toolkit.json"
out=$(install) || fail "install without NVIDIA's spec failed: $out"
[[ ! -e $takeover && $out == *"no NVIDIA CDI spec"*"only the quanta.dev/gpu kind is installed"* ]] || fail "no spec: $out"
vendor "$t/vendor/nvidia.yaml" 1
out=$(install --vendor-spec="$t/vendor/nvidia.yaml") || fail "install --vendor-spec failed: $out"
grep -q NVIDIA_VENDOR_GENERATION=1 "$takeover" || fail "--vendor-spec was not taken over: $out"
ok "no take-over when turned off, beside NVIDIA's spec or without one, each said in a line; --vendor-spec names the spec"

# 5b. The runtime's CDI folders as deploy/node passes them, three: NVIDIA's spec in /etc/cdi
# and the device plugin's own (its CDI strategies name k8s.device-plugin.nvidia.com/gpu
# devices from /var/run/cdi) are both found and each taken over in the folder just above
# its own; NVIDIA's spec moved to /var/run/cdi (the GPU operator's toolkit) moves its
# take-over up too, and the copy left below would sit beside it, so it goes.
three="$t/etc/cdi,$t/var/run/cdi,$t/var/run/cdi-quanta"
plugin=$t/var/run/cdi/k8s.device-plugin.nvidia.com-gpu.json
plugin_takeover=$t/var/run/cdi-quanta/quanta-k8s.device-plugin.nvidia.com_gpu.yaml
printf '%s\n' '{"cdiVersion":"0.5.0","kind":"k8s.device-plugin.nvidia.com/gpu",' \
  '"devices":[{"name":"GPU-0","containerEdits":{"env":["NVIDIA_PLUGIN_DEVICE=GPU-0"]}}]}' >"$plugin"
vendor "$t/etc/cdi/nvidia.yaml" 3
out=$(install --spec-dirs="$three") || fail "install with both specs failed: $out"
grep -q NVIDIA_VENDOR_GENERATION=3 "$takeover" || fail "NVIDIA's spec in /etc/cdi was not taken over in /var/run/cdi: $out"
grep -Eq '^kind: "?k8s\.device-plugin\.nvidia\.com/gpu"?$' "$plugin_takeover" ||
  fail "the device plugin's spec was not taken over in /var/run/cdi-quanta: $out"
grep -q NVIDIA_PLUGIN_DEVICE=GPU-0 "$plugin_takeover" || fail "the plugin's take-over lost its edits"
grep -q "$t/opt/quanta/bin/quanta-hook" "$plugin_takeover" || fail "the plugin's take-over has no quanta-hook"
[[ $(grep -c "took over" <<<"$out") -eq 2 ]] || fail "the install did not say what it took over, one line each: $out"
rm "$t/etc/cdi/nvidia.yaml"
vendor "$t/var/run/cdi/nvidia-container-toolkit.json" 4
out=$(install --spec-dirs="$three") || fail "install with NVIDIA's spec moved to /var/run/cdi failed: $out"
[[ ! -e $takeover && $out == *"$takeover removed"* ]] || fail "the take-over beside NVIDIA's spec in /var/run/cdi stayed: $out"
grep -q NVIDIA_VENDOR_GENERATION=4 "$t/var/run/cdi-quanta/quanta-nvidia.com_gpu.yaml" ||
  fail "NVIDIA's spec in /var/run/cdi was not taken over in /var/run/cdi-quanta: $out"
[[ -f $plugin_takeover ]] || fail "the plugin's take-over went: $out"
rm "$plugin" "$t/var/run/cdi/nvidia-container-toolkit.json"
out=$(install --spec-dirs="$three") || fail "install without specs failed: $out"
[[ -z $(ls -A "$t/var/run/cdi-quanta") && $out == *"no NVIDIA CDI spec"* ]] || fail "take-overs outlived their specs: $out"
# A spec whose kind is no vendor/class (a file name from it would leave the folder).
printf '%s\n' '{"cdiVersion":"0.5.0","kind":"nvidia.com/../../../gpu","devices":[{"name":"0"}]}' >"$t/vendor/odd.json"
if out=$(install --spec-dirs="$three" --vendor-spec="$t/vendor/odd.json" 2>&1); then
  [[ $(find "$t" -name 'quanta-*_*.yaml' | wc -l) -eq 0 ]] || fail "a take-over named after kind nvidia.com/../../../gpu was written"
  fail "an install taking over a spec of kind nvidia.com/../../../gpu succeeded: $out"
fi
[[ $(find "$t" -name 'quanta-*_*.yaml' | wc -l) -eq 0 ]] || fail "a take-over named after kind nvidia.com/../../../gpu was written: $out"
[[ $out == *"kind"* ]] || fail "the refusal does not name the kind: $out"
rm -rf "$t/var/run/cdi-quanta" "$t/vendor/odd.json"
ok "with three CDI folders both NVIDIA's and the device plugin's specs are taken over, each just above its own, and a take-over follows its spec up"

# 6. --watch keeps the take-over in step: regenerated when NVIDIA's spec changes, removed
# when it goes, and a stopped watcher leaves nothing behind.
rm -f "$takeover"
mkdir -p "$t/tmp"
vendor "$t/etc/cdi/nvidia.yaml" 1
TMPDIR=$t/tmp "$src/deploy/image/quanta-install-host" --watch=1 --prefix="$t/opt/quanta" --config="$t/etc/quanta/quanta.toml" \
  --socket=/run/quanta/tenant.sock --spec-dirs="$three" >"$t/watch.log" 2>&1 &
watcher=$!
until_true() { for _ in $(seq 300); do eval "$1" && return 0; sleep 0.1; done; return 1; }
until_true 'grep -q NVIDIA_VENDOR_GENERATION=1 "$takeover" 2>/dev/null' || fail "--watch did not write the take-over: $(cat "$t/watch.log")"
vendor "$t/etc/cdi/nvidia.yaml" 2
until_true 'grep -q NVIDIA_VENDOR_GENERATION=2 "$takeover"' || fail "--watch did not follow NVIDIA's new spec: $(cat "$t/watch.log")"
mv "$t/etc/cdi/nvidia.yaml" "$t/var/run/cdi/nvidia.yaml"
until_true '[[ ! -e $takeover ]] && grep -q NVIDIA_VENDOR_GENERATION=2 "$t/var/run/cdi-quanta/quanta-nvidia.com_gpu.yaml" 2>/dev/null' ||
  fail "--watch did not move the take-over above NVIDIA's moved spec: $(cat "$t/watch.log")"
rm "$t/var/run/cdi/nvidia.yaml"
until_true '[[ ! -e $t/var/run/cdi-quanta/quanta-nvidia.com_gpu.yaml ]]' || fail "--watch kept a take-over of a spec that is gone: $(cat "$t/watch.log")"
kill "$watcher"
wait "$watcher" && fail "the watcher ignored SIGTERM"
watcher=
[[ -z $(ls -A "$t/tmp") ]] || fail "the stopped watcher left $(ls "$t/tmp")"
ok "--watch regenerates the take-over when NVIDIA's spec changes or moves and removes it when the spec goes"

# 7. A node config the arbiter refuses: the install stops before changing anything.
printf '[node]\nscope = "no spaces allowed"\n' >"$t/node-config/quanta.toml"
if out=$(install 2>&1); then fail "installed with an invalid node config: $out"; fi
[[ $out == *"scope"* && $out == *"nothing was installed"* ]] || fail "invalid-config message: $out"
cmp -s "$t/etc/quanta/quanta.toml" <(printf '[node]\nscope = "no spaces allowed"\n') && fail "the invalid config was copied"
[[ $(inode "$t/opt/quanta/lib/libquanta.so") == $(echo "$again" | head -1) ]] || fail "the library changed"
ok "an invalid node config stops the install with the parser's message"
echo "installer: $passed passed, 0 failed"
