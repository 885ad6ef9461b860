#!/usr/bin/env bash
# docs/single-host.md's steps, run as the page writes them: its one `sh` block, on simgpu,
# with the build's binaries first in PATH, the page's folder (/tmp/quanta) a fresh one,
# /opt/quanta/lib the build's shim and the two python3 workloads quanta-tenant ones. Then
# checks that each step did what the page says: the arbiter detached and served, both pods
# ran gated under their policies, quantactl showed them, and SIGTERM stopped it.
set -euo pipefail
source_dir=${1:?usage: single_host_doc.sh SOURCE_DIR BUILD_DIR}
build=${2:?}
page=$source_dir/docs/single-host.md
t=$(mktemp -d /tmp/quanta-single-host.XXXXXX)
export SIMGPU_STATE=simgpu-single-host-$$
cleanup() {
  pkill -KILL -f "quanta-arbiter --config $t/quanta.toml" 2>/dev/null || true
  rm -rf "$t" "/dev/shm/$SIMGPU_STATE"*
}
trap cleanup EXIT

# The block between ```sh and ``` (the page has exactly one).
awk '/^```sh$/{inside=1; next} /^```$/{if (inside) exit} inside' "$page" >"$t/steps.sh"
[[ $(grep -c '^```sh$' "$page") == 1 ]] || { echo "$page: want exactly one sh block"; exit 1; }
grep -q 'quanta-arbiter --config /tmp/quanta/quanta.toml$' "$t/steps.sh" || { echo "the block no longer starts the arbiter as expected"; exit 1; }
sed -i -e "s|/tmp/quanta|$t|g" \
       -e "s|/opt/quanta/lib/libquanta.so|$build/lib/libquanta.so|g" \
       -e "s|python3 train.py|quanta-tenant batch --seconds 4 --kernel-ms 2|" \
       -e "s|python3 serve.py|quanta-tenant requests --seconds 4 --rate 50 --kernel-ms 1|" \
       "$t/steps.sh"

export PATH=$build/bin:$PATH
export LD_LIBRARY_PATH=$build/sim
export SIMGPU_CONTEXT_MEMORY=300Mi
if ! bash -euo pipefail "$t/steps.sh" >"$t/out" 2>"$t/err"; then
  echo "the page's steps failed:"; cat "$t/out" "$t/err"; cat "$t/quanta-arbiter.log" 2>/dev/null; exit 1
fi
out=$(cat "$t/out")
fail() { echo "FAIL: $*"; echo "--- stdout"; cat "$t/out"; echo "--- stderr"; cat "$t/err"; exit 1; }
grep -q "quanta-arbiter: $t/quanta.toml: ok" <<<"$out" || fail "--check-config did not accept the page's config"
grep -q "quanta-arbiter: detached as pid" "$t/err" || fail "the arbiter did not say it detached"
grep -q "dev/trainer" <<<"$out" && grep -q "dev/notebook" <<<"$out" || fail "quantactl status did not list both pods"
grep -Eq "weight +3 +node table" <<<"$out" || fail "quantactl policy did not show the trainer's weight from the node table"
grep -Eq "memory-limit +8589934592 +node table" <<<"$out" || fail "quantactl policy did not show the trainer's cap"
grep -q "pod dev/notebook updated" <<<"$out" || fail "quantactl set did not update the notebook"
grep -q "Pod dev/notebook on GPU 0" <<<"$out" || fail "quantactl explain did not tell the notebook's minute"
grep -q "no arbiter at" "$t/err" && fail "a workload ran without the arbiter"
for _ in $(seq 60); do
  pgrep -f "quanta-arbiter --config $t/quanta.toml" >/dev/null || { echo "single-host page: every step ran as written"; exit 0; }
  sleep 0.05
done
fail "the arbiter still runs 3 s after the page's SIGTERM"
