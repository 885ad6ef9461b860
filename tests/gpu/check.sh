#!/usr/bin/env bash
# Quanta's real-GPU validation kit: proves on an NVIDIA GPU what simgpu shows in CI.
# One self-contained run (under 8 minutes on a GPU): interception on every lookup path,
# pod memory caps (also through PyTorch when it is installed), the bench scenarios beside
# the driver's native time slicing, and eBPF tracing where the kernel allows it. It never
# changes the GPU's settings (no MIG, clock, compute-mode or reset commands).
#
#   tests/gpu/check.sh [--sim] [--kit DIR] [--quick] [--context-overhead SIZE] [--only SECTIONS]
#
# --sim runs the identical checks on simgpu (CI does, so the kit never rots); --kit names
# the folder holding bin/, lib/ and sim/ (`make gpu-kit` output, or a build folder; by
# default the folder this script sits in when it has bin/, else the repo's build/);
# --context-overhead gives the check's arbiter the node's [shim] context_overhead (default:
# the shipped "measure", the arbiter's own measurement at start), so the context-overhead
# check judges the value the node will use;
# --only runs some sections, a comma list of interception, memory, torch, bench and ebpf
# (say, memory alone after changing context_overhead).
# Results: results.json and results.md under $OUT when set, else ./gpu-results/, with
# logs.tar.gz: the arbiter's log and every tenant's and scenario's output, for diagnosis.
set -uo pipefail

mode=real
quick=0
here=$(cd "$(dirname "$0")" && pwd)
kit=
context_overhead=
only=
while [[ $# -gt 0 ]]; do
  case "$1" in
    --sim) mode=sim; shift ;;
    --quick) quick=1; shift ;;
    --kit) kit=${2:?--kit needs a folder}; shift 2 ;;
    --context-overhead) context_overhead=${2:?--context-overhead needs a size such as 544Mi}; shift 2 ;;
    --only) only=${2:?--only needs sections: interception, memory, torch, bench, ebpf}; shift 2 ;;
    *) echo "check.sh: unknown argument '$1' (allowed: --sim, --quick, --kit DIR, --context-overhead SIZE, --only SECTIONS)" >&2; exit 2 ;;
  esac
done
all_sections=interception,memory,torch,bench,ebpf
for section in ${only//,/ }; do
  [[ ,$all_sections, == *,$section,* ]] ||
    { echo "check.sh: --only: unknown section '$section' (allowed: $all_sections)" >&2; exit 2; }
done
wanted() { [[ -z $only || ,$only, == *,$1,* ]]; }  # `only=none` skips every section
if [[ -z $kit ]]; then
  if [[ -x $here/bin/quanta-arbiter ]]; then kit=$here; else kit=$(cd "$here/../.." && pwd)/build; fi
fi
kit=$(cd "$kit" && pwd) || { echo "check.sh: kit folder '$kit' does not exist" >&2; exit 2; }
for f in bin/quanta-arbiter bin/quantactl bin/quanta-tenant bin/quanta-bench lib/libquanta.so; do
  [[ -e $kit/$f ]] || { echo "check.sh: $kit/$f is missing (build it, or make gpu-kit)" >&2; exit 2; }
done
torch_script=$here/torch_checks.py
[[ -f $torch_script ]] || torch_script=$kit/torch_checks.py

out=${OUT:-$PWD/gpu-results}
mkdir -p "$out"
work=$(mktemp -d /tmp/quanta-check.XXXXXX)
records=$work/records.jsonl
: >"$records"
arbiter_pid=
cleanup() {
  [[ -n $arbiter_pid ]] && kill "$arbiter_pid" 2>/dev/null
  wait 2>/dev/null
  tar -czf "$out/logs.tar.gz" -C "$work" --exclude='*.sock' . 2>/dev/null
  rm -f /dev/shm/quanta-check-$$.* /dev/shm/simgpu-check-$$* 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 143' TERM INT

# record NAME PASS|FAIL|SKIP "detail" [figures-json]
record() {
  python3 - "$1" "$2" "$3" "${4:-{\}}" >>"$records" <<'PY'
import json, sys
try:
    figures = json.loads(sys.argv[4])
except ValueError:
    figures = {"raw": sys.argv[4][:2000]}
print(json.dumps({"check": sys.argv[1], "result": sys.argv[2], "detail": sys.argv[3], "figures": figures}))
PY
  printf '%-5s %-34s %s\n' "$2" "$1" "$3"
}
json_get() {  # json_get FILE EXPR  (EXPR evaluated on the parsed object `j`)
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print($2)" "$1" 2>/dev/null
}

# --- the GPU and its driver -----------------------------------------------------------
if [[ $mode == sim ]]; then
  export LD_LIBRARY_PATH=$kit/sim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export SIMGPU_STATE=simgpu-check-$$ SIMGPU_MEMORY=${SIMGPU_MEMORY:-16Gi}
  gpu_name="simgpu (simulated)"; driver="simgpu"; gpu_mem=$((16 << 30))
  record driver PASS "simgpu from $kit/sim"
else
  if ! info=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader,nounits 2>&1 | head -1); then
    record driver FAIL "nvidia-smi failed: $info"
    info=
  fi
  gpu_name=$(cut -d, -f1 <<<"$info" | xargs)
  driver=$(cut -d, -f2 <<<"$info" | xargs)
  gpu_mem=$(( $(cut -d, -f3 <<<"$info" | xargs || echo 0) * 1048576 ))
  [[ -n $info ]] && record driver PASS "$gpu_name, driver $driver" \
    "{\"gpu\": \"$gpu_name\", \"driver\": \"$driver\", \"memory_bytes\": $gpu_mem}"
fi
cap=$(( gpu_mem / 4 / 1073741824 * 1073741824 ))
(( cap >= 1073741824 )) || cap=1073741824

# --- a private arbiter -----------------------------------------------------------------
cat >"$work/quanta.toml" <<TOML
[node]
scope = "quanta-check-$$"
tenant_socket = "$work/tenant.sock"
admin_socket = "$work/admin.sock"
state_dir = "$work"
allow_unregistered = true

[scheduler]
quantum = "10ms"

[pod."check/capped"]
memory_limit = $cap

[pod."check/neighbour"]
weight = 1
TOML
if [[ -n $context_overhead ]]; then
  printf '\n[shim]\ncontext_overhead = "%s"\n' "$context_overhead" >>"$work/quanta.toml"
fi
# The /metrics library's own dependencies come from the kit only where this machine lacks
# them (a minimal CUDA image may have no brotli).
arbiter_env=()
missing=$(ldd "$kit/bin/quanta-arbiter" 2>/dev/null | awk '/not found/ {print $1}')
if [[ -n $missing && -d $kit/lib/fallback ]]; then
  mkdir -p "$work/fallback"
  for lib in $missing; do [[ -e $kit/lib/fallback/$lib ]] && ln -s "$kit/lib/fallback/$lib" "$work/fallback/$lib"; done
  arbiter_env=(env "LD_LIBRARY_PATH=$work/fallback${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
  echo "check.sh: using the kit's copies of $(echo $missing) for quanta-arbiter" >&2
fi
"${arbiter_env[@]}" "$kit/bin/quanta-arbiter" --foreground --config "$work/quanta.toml" 2>"$work/arbiter.log" &
arbiter_pid=$!
for _ in $(seq 100); do [[ -S $work/tenant.sock ]] && break; sleep 0.05; done
if [[ ! -S $work/tenant.sock ]]; then
  record arbiter FAIL "quanta-arbiter did not start: $(tail -n 3 "$work/arbiter.log" | tr '\n' ' ')"
  only=none  # every later check needs it: report this one failure, not a cascade
else
  record arbiter PASS "quanta-arbiter up (pid $arbiter_pid)"
fi
export QUANTA_SOCKET=$work/tenant.sock QUANTA_LOG_LEVEL=${QUANTA_LOG_LEVEL:-warn}
quantactl() { "$kit/bin/quantactl" --admin-socket "$work/admin.sock" "$@"; }
# env execs the program, so `$!` of a backgrounded run is the tenant's own pid.
shimmed=(env LD_PRELOAD=$kit/lib/libquanta.so)

# --- 1. interception on every lookup path ----------------------------------------------
if wanted interception; then
  for lookup in direct dlsym getproc getproc-ptds; do
    QUANTA_POD=check/lookup-$lookup "${shimmed[@]}" "$kit/bin/quanta-tenant" --json --lookup "$lookup" \
      batch --kernel-ms 1 --seconds 2 >"$work/lookup-$lookup.json" 2>"$work/lookup-$lookup.err" &
    tenant=$!
    launches=0
    while kill -0 "$tenant" 2>/dev/null; do
      sleep 0.05
      quantactl status --json >"$work/status.json" 2>/dev/null || continue
      launches=$(json_get "$work/status.json" \
        "sum(t.get('launches',0) for g in j['gpus'] for t in g['tenants'] if t['pid']==$tenant)")
      [[ ${launches:-0} -gt 0 ]] && break
    done
    wait "$tenant"; rc=$?
    kernels=$(json_get "$work/lookup-$lookup.json" "j.get('kernels',0)")
    if [[ $rc -eq 0 && ${launches:-0} -gt 0 ]]; then
      record "interception-$lookup" PASS "$kernels kernels, launches seen at the gate" \
        "{\"kernels\": ${kernels:-0}, \"gated_launches_seen\": $launches}"
    else
      record "interception-$lookup" FAIL "exit $rc, gated launches seen: ${launches:-0}: $(tail -n 1 "$work/lookup-$lookup.err")"
    fi
  done
fi

# --- 2. memory caps ---------------------------------------------------------------------
if wanted memory; then
  QUANTA_POD=check/capped "${shimmed[@]}" "$kit/bin/quanta-tenant" --json info >"$work/info.json" 2>"$work/info.err"
  seen_total=$(json_get "$work/info.json" "j['devices'][0]['mem_total']")
  seen_device_total=$(json_get "$work/info.json" "j['devices'][0]['total_mem']")
  nvml_total=$(json_get "$work/info.json" "(j.get('nvml') or {}).get('devices',[{}])[0].get('memory_total','absent')")
  if [[ $seen_total == "$cap" && $seen_device_total == "$cap" && ( $nvml_total == "$cap" || $nvml_total == absent ) ]]; then
    record cap-views PASS "cuMemGetInfo, cuDeviceTotalMem and NVML show the $((cap >> 20)) MiB cap" \
      "{\"cap\": $cap, \"cuMemGetInfo_total\": $seen_total, \"nvml_total\": \"$nvml_total\"}"
  else
    record cap-views FAIL "cap $cap; cuMemGetInfo total ${seen_total:-?}, cuDeviceTotalMem ${seen_device_total:-?}, NVML ${nvml_total:-?}"
  fi

  for family in alloc vmm; do
    QUANTA_POD=check/neighbour "${shimmed[@]}" "$kit/bin/quanta-tenant" --json alloc --family alloc \
      --bytes 1Gi --count 1 --hold-ms 1500 >"$work/neighbour.json" 2>/dev/null &
    neighbour=$!
    QUANTA_POD=check/capped "${shimmed[@]}" "$kit/bin/quanta-tenant" --json alloc --family "$family" \
      --bytes 256Mi --race >"$work/race-$family.json" 2>"$work/race-$family.err"
    wait "$neighbour"; nrc=$?
    held=$(json_get "$work/race-$family.json" "j.get('peak_bytes_held',-1)")
    oom=$(json_get "$work/race-$family.json" "j.get('oom',0)")
    nok=$(json_get "$work/neighbour.json" "j.get('successes',0)")
    if [[ ${oom:-0} -ge 1 && ${held:--1} -le $cap && ${held:--1} -gt 0 && $nrc -eq 0 && ${nok:-0} -eq 1 ]]; then
      record "cap-$family" PASS "denied at $((held >> 20)) MiB held (cap $((cap >> 20)) MiB); neighbour pod unharmed" \
        "{\"cap\": $cap, \"held_at_denial\": $held, \"denials\": $oom}"
    else
      record "cap-$family" FAIL "held ${held:-?} of cap $cap, denials ${oom:-?}, neighbour exit $nrc successes ${nok:-?}"
    fi
  done
fi

# The ledger against NVML's per-process usage: a tenant holding 2 x 512 MiB must show at
# least that in both; the difference is the context memory the ledger charges as overhead.
if wanted memory; then
  # Watched for as long as the tenant lives (on a loaded machine its start alone can take
  # seconds), not for a fixed number of looks.
  QUANTA_POD=check/capped "${shimmed[@]}" "$kit/bin/quanta-tenant" --json alloc --family alloc \
    --bytes 512Mi --count 2 --hold-ms 3000 >"$work/hold.json" 2>"$work/hold.err" &
  holder=$!
  ledger= nvml=
  while kill -0 "$holder" 2>/dev/null; do
    sleep 0.1
    quantactl status --json >"$work/status.json" 2>/dev/null || continue
    ledger=$(json_get "$work/status.json" \
      "sum(t.get('memory_used',0) for g in j['gpus'] for t in g['tenants'] if t['pid']==$holder)")
    python3 "$here/nvml_procs.py" >"$work/nvml.json" 2>/dev/null || python3 "$kit/nvml_procs.py" >"$work/nvml.json" 2>/dev/null
    nvml=$(json_get "$work/nvml.json" "j.get('$holder', 0)")
    (( ${ledger:-0} >= 1073741824 && ${nvml:-0} >= 1073741824 )) && break
  done
  wait "$holder"
  if (( ${ledger:-0} >= 1073741824 && ${nvml:-0} >= 1073741824 )); then
    record ledger-vs-nvml PASS "ledger $((ledger >> 20)) MiB, NVML $((nvml >> 20)) MiB for a tenant holding 1024 MiB" \
      "{\"ledger_bytes\": $ledger, \"nvml_bytes\": $nvml, \"difference_bytes\": $((ledger - nvml))}"
    # The ledger must never count less than NVML, or a pod can pass its cap by NVML's count:
    # the context charge has to cover what a context really takes on this GPU and driver.
    context_bytes=$(( nvml - 1073741824 ))
    charged=$(( ledger - 1073741824 ))
    if (( ledger >= nvml )); then
      record context-overhead PASS "a context takes $((context_bytes >> 20)) MiB by NVML's count; the ledger charges $((charged >> 20)) MiB" \
        "{\"context_nvml_bytes\": $context_bytes, \"context_charged_bytes\": $charged}"
    else
      advice=$(( (context_bytes + (32 << 20) - 1) / (32 << 20) * 32 ))
      record context-overhead FAIL "a context takes $((context_bytes >> 20)) MiB by NVML's count but the ledger charges $((charged >> 20)) MiB: set [shim] context_overhead = \"${advice}Mi\" in the node's config (then check again with --context-overhead ${advice}Mi)" \
        "{\"context_nvml_bytes\": $context_bytes, \"context_charged_bytes\": $charged, \"advised\": \"${advice}Mi\"}"
    fi
  else
    record ledger-vs-nvml FAIL "ledger ${ledger:-?} bytes, NVML ${nvml:-?} bytes for a tenant holding 1 GiB"
  fi
fi

# PyTorch: the cap seen by torch.cuda.mem_get_info, OutOfMemoryError past it (also through
# the VMM path with expandable segments), launches from cudart reaching the gate.
if wanted torch; then
  if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1 && [[ $mode == real ]]; then
    for conf in "" "expandable_segments:True"; do
      name=torch-cap${conf:+-expandable}
      if PYTORCH_CUDA_ALLOC_CONF=$conf QUANTA_POD=check/capped "${shimmed[@]}" python3 "$torch_script" cap "$cap" \
          >"$work/$name.json" 2>"$work/$name.err"; then
        record "$name" PASS "torch sees the cap, OutOfMemoryError past it, still healthy" "$(cat "$work/$name.json")"
      else
        record "$name" FAIL "$(tail -n 1 "$work/$name.json" "$work/$name.err" | tr '\n' ' ')"
      fi
    done
    # Importing torch and creating its context take seconds: watch the gate for as long as
    # the process runs, not at a fixed moment.
    QUANTA_POD=check/neighbour "${shimmed[@]}" python3 "$torch_script" work 4 >"$work/torch-work.json" 2>&1 &
    tp=$!
    launches=0
    while kill -0 "$tp" 2>/dev/null; do
      sleep 0.2
      quantactl status --json >"$work/status.json" 2>/dev/null || continue
      launches=$(json_get "$work/status.json" "sum(t.get('launches',0) for g in j['gpus'] for t in g['tenants'] if t['pid']==$tp)")
      [[ ${launches:-0} -gt 0 ]] && break
    done
    wait "$tp"
    if [[ ${launches:-0} -gt 0 ]]; then
      record torch-gated PASS "cudart launches from PyTorch reach the gate ($launches seen)"
    else
      record torch-gated FAIL "no gated launches seen from the PyTorch process"
    fi
  else
    record torch SKIP "PyTorch with CUDA is not available here ($mode)"
  fi
fi

# --- 3. bench scenarios beside native time slicing --------------------------------------
if wanted bench; then
  bench_flags=(--gpu "$mode")
  if (( quick )) || [[ $mode == sim ]]; then bench_flags+=(--quick); fi
  for scenario in fairness interactive overhead handoff launch-cost; do
    if "$kit/bin/quanta-bench" "$scenario" --json "${bench_flags[@]}" >"$work/bench-$scenario.json" 2>"$work/bench-$scenario.err"; then
      record "bench-$scenario" PASS "figures recorded" "$(cat "$work/bench-$scenario.json")"
    else
      record "bench-$scenario" FAIL "$(tail -n 1 "$work/bench-$scenario.err")"
    fi
  done
fi

# --- 4. eBPF tracing --------------------------------------------------------------------
if wanted ebpf; then
  if [[ -x $kit/bin/quanta-trace ]]; then
    QUANTA_POD=check/lookup-direct "${shimmed[@]}" "$kit/bin/quanta-tenant" --json batch --kernel-ms 1 --seconds 3 >/dev/null 2>&1 &
    t1=$!
    QUANTA_POD=check/neighbour "${shimmed[@]}" "$kit/bin/quanta-tenant" --json batch --kernel-ms 1 --seconds 3 >/dev/null 2>&1 &
    t2=$!
    if "$kit/bin/quanta-trace" handoff --binary "$kit/lib/libquanta.so" --binary "$kit/bin/quanta-arbiter" --duration 2 --json \
        >"$work/trace.json" 2>"$work/trace.err"; then
      handoffs=$(json_get "$work/trace.json" "j['handoff_latency']['count']")
      p50=$(json_get "$work/trace.json" "round(j['handoff_latency']['p50_ns'] / 1000, 1)")
      if [[ ${handoffs:-0} -gt 0 ]]; then
        record ebpf PASS "quanta-trace saw $handoffs handoffs between two tenants, p50 ${p50} us" "$(cat "$work/trace.json")"
      else
        record ebpf FAIL "quanta-trace attached but saw no handoff between two contending tenants"
      fi
    else
      record ebpf SKIP "eBPF tracing unavailable here: $(tail -n 1 "$work/trace.err")"
    fi
    wait "$t1" "$t2"
  else
    record ebpf SKIP "quanta-trace not in the kit"
  fi
fi

# --- 5. results -----------------------------------------------------------------------
python3 - "$records" "$out" "$mode" "$gpu_name" "$driver" "$context_overhead" <<'PY'
import datetime, json, os, platform, sys
records_path, out, mode, gpu, driver, context_overhead = sys.argv[1:7]
records = [json.loads(l) for l in open(records_path) if l.strip()]
summary = {r: sum(1 for x in records if x["result"] == r) for r in ("PASS", "FAIL", "SKIP")}
doc = {"mode": mode, "gpu": gpu, "driver": driver, "context_overhead": context_overhead or "default", "date": datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None).isoformat() + "Z",
       "host": platform.node(), "kernel": platform.release(), "summary": summary, "checks": records}
json.dump(doc, open(os.path.join(out, "results.json"), "w"), indent=2)
lines = [f"# Quanta GPU check ({mode})", "", f"- GPU: {gpu}", f"- driver: {driver}",
         f"- date: {doc['date']}", f"- kernel: {doc['kernel']}",
         f"- [shim] context_overhead: {doc['context_overhead']}",
         f"- result: {summary['PASS']} passed, {summary['FAIL']} failed, {summary['SKIP']} skipped", "",
         "| check | result | detail |", "| --- | --- | --- |"]
lines += [f"| {r['check']} | {r['result']} | {r['detail']} |" for r in records]
for r in records:
    if r["check"].startswith("bench-") and r["figures"]:
        lines += ["", f"## {r['check']}", "", "```json", json.dumps(r["figures"], indent=1)[:4000], "```"]
open(os.path.join(out, "results.md"), "w").write("\n".join(lines) + "\n")
print(f"{summary['PASS']} passed, {summary['FAIL']} failed, {summary['SKIP']} skipped")
sys.exit(1 if summary["FAIL"] else 0)
PY
