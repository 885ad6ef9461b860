#!/usr/bin/env bash
# Keeps `make demo-containers` working: runs scripts/demo-containers.sh for a short run and
# checks what it prints (the live table, each pod's share near its 25/75 target, the capped
# pod's refused allocation, no registration left) and that it leaves nothing behind; or,
# with `interrupt`, stops it with SIGINT (a Ctrl-C) while the containers run and checks the
# same clean-up. Exit 77 (skipped) without root or runc, unless QUANTA_REQUIRE_E2E is set.
#   demo_containers_test.sh SOURCE_DIR BUILD_DIR [run|interrupt]
set -uo pipefail
src=$1 build=$2 mode=${3:-run}
skip() {
  if [[ -n ${QUANTA_REQUIRE_E2E:-} ]]; then echo "FAIL: $1"; exit 1; fi
  echo "SKIP: $1"; exit 77
}
[[ $(id -u) -eq 0 ]] || skip "containers need root"
command -v runc >/dev/null || skip "runc is not installed (scripts/install-deps.sh installs it)"

tmp=$build/e2e-demo-$mode
rm -rf "$tmp"
mkdir -p "$tmp"
out=$tmp/demo.out
fail() {
  echo "FAIL: $*"
  echo "--- demo output ---"
  cat "$out"
  exit 1
}

if [[ $mode == run ]]; then
  DEMO_SECONDS=5 DEMO_TMP=$tmp timeout 240 "$src/scripts/demo-containers.sh" "$build" >"$out" 2>&1 &
else
  # Its own process group, as a shell's foreground job is: Ctrl-C reaches every process in it.
  DEMO_SECONDS=60 DEMO_TMP=$tmp setsid timeout 240 "$src/scripts/demo-containers.sh" "$build" >"$out" 2>&1 &
fi
demo=$!
# timeout(1) runs the script as its child: the script's pid names the demo's scope.
script_pid=""
for _ in $(seq 100); do
  script_pid=$(pgrep -P "$demo" -f demo-containers.sh | head -1)
  [[ -n $script_pid ]] && break
  sleep 0.1
done
[[ -n $script_pid ]] || fail "the demo did not start"

if [[ $mode == interrupt ]]; then
  for _ in $(seq 1200); do grep -q -- '--- ' "$out" && break; sleep 0.1; done
  grep -q -- '--- ' "$out" || fail "the demo never showed quantactl status"
  grep -q "demo/heavy" "$out" || fail "the first table does not list demo/heavy"
  kill -INT -- "-$demo"
fi
wait "$demo"
rc=$?

if [[ $mode == run ]]; then
  ((rc == 0)) || fail "the demo exited $rc"
  grep -qE '^ +[0-9]+ +demo/light +1 ' "$out" || fail "quantactl status never listed demo/light with weight 1"
  grep -qE '^ +[0-9]+ +demo/heavy +3 ' "$out" || fail "quantactl status never listed demo/heavy with weight 3"
  python3 - "$out" <<'PY' || fail "the summary is not what it should be"
import re, sys
text = open(sys.argv[1]).read()
ok = True
for pod, lo, hi in (("light", 10, 40), ("heavy", 60, 90)):
    m = re.search(rf"^  demo/{pod} +\d+ +[\d.]+% +([\d.]+)%", text, re.M)
    if not m:
        print(f"no summary line for demo/{pod}"); ok = False; continue
    got = float(m.group(1))
    if not lo <= got <= hi:
        print(f"demo/{pod} got {got}%, outside {lo}-{hi}%"); ok = False
m = re.search(r"exec'd process: (\d+) x 512 MiB granted, (\d+) refused", text)
if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
    print("the capped pod's allocations: " + (m.group(0) if m else "not shown")); ok = False
if not re.search(r"registrations left after the containers exited \(poststop\): 0$", text, re.M):
    print("registrations were left behind"); ok = False
sys.exit(0 if ok else 1)
PY
else
  ((rc == 130)) || fail "the interrupted demo exited $rc, not 130"
  grep -q "interrupted, cleaning up" "$out" || fail "the demo did not say it was cleaning up"
fi

# Nothing left: the run folder, the arbiter's regions and simgpu's state, the containers.
leftover=$(find "$tmp" -mindepth 1 -maxdepth 1 -name 'quanta-demo-containers.*')
[[ -z $leftover ]] || fail "the run folder is still there: $leftover"
ls /dev/shm/quanta-democ-"$script_pid".* /dev/shm/simgpu-democ-"$script_pid"* >/dev/null 2>&1 &&
  fail "shared memory left in /dev/shm: $(ls /dev/shm | grep -E "democ-$script_pid")"
pgrep -f "qdemo-$script_pid-" >/dev/null && fail "container processes still run: $(pgrep -af "qdemo-$script_pid-")"
pgrep -af quanta-arbiter | grep -qF "$tmp/" && fail "the demo's arbiter still runs"
# runc's cgroups for the containers (named by container id on cgroup v1 and v2).
if find /sys/fs/cgroup -maxdepth 3 -name "qdemo-$script_pid-*" 2>/dev/null | grep -q .; then
  fail "cgroups left: $(find /sys/fs/cgroup -maxdepth 3 -name "qdemo-$script_pid-*")"
fi
rm -rf "$tmp"
echo "PASS ($mode)"
