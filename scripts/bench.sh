#!/usr/bin/env bash
# `make bench`: runs every quanta-bench scenario with --json, one after the other, and
# writes bench/results/latest.json (keyed by scenario, plus machine, date and command)
# and bench/RESULTS.md. Usage:
#   scripts/bench.sh BUILD_DIR [--quick] [--gpu sim|real] [--results FILE] [--markdown FILE]
#                    [--only "fairness handoff"]
#   scripts/bench.sh BUILD_DIR --render-only   # RESULTS.md again from latest.json (and bench/analysis.md)
# The scenarios measure time on a shared machine: the script records whether compilers
# or linkers ran meanwhile, and RESULTS.md says so.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:?usage: scripts/bench.sh BUILD_DIR [--quick] [--gpu sim|real] [--results FILE] [--markdown FILE] [--only "S1 S2"]}
shift
build=$(cd "$build" && pwd)
results="$root/bench/results/latest.json"
markdown="$root/bench/RESULTS.md"
scenarios="fairness interactive overhead handoff launch-cost memcap scale"
bench_args=()
render_only=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) bench_args+=(--quick); shift ;;
    --gpu) bench_args+=(--gpu "${2:?--gpu needs sim or real}"); shift 2 ;;
    --results) results=$2; shift 2 ;;
    --markdown) markdown=$2; shift 2 ;;
    --only) scenarios=$2; shift 2 ;;
    --render-only) render_only=1; shift ;;
    *) echo "bench.sh: unknown argument '$1' (allowed: --quick, --gpu sim|real, --results FILE, --markdown FILE, --only LIST, --render-only)" >&2; exit 2 ;;
  esac
done

bench="$build/bin/quanta-bench"
report="$build/bin/quanta-bench-report"
for program in "$bench" "$report"; do
  [[ -x $program ]] || { echo "bench.sh: $program is not built (run: cmake --build $build --target quanta-bench)" >&2; exit 1; }
done

analysis="$root/bench/analysis.md"
if [[ $render_only -eq 1 ]]; then
  "$report" --from "$results" --markdown "$markdown" $([[ -f $analysis ]] && echo --analysis "$analysis")
  echo "bench.sh: rendered $markdown from $results" >&2
  exit 0
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/quanta-bench-run-XXXXXX")
watcher=
cleanup() {
  [[ -n $watcher ]] && kill "$watcher" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# Other heavy work during the measurement (compilers, linkers, test runs) skews timing
# figures; sample it once a second.
(
  while sleep 1; do
    busy=$(ps -eo comm= | grep -cE '^(cc1plus|cc1|ld|ld\.gold|collect2|clang|ctest|gtest)' || true)
    echo "$busy $(cut -d' ' -f1 /proc/loadavg)" >> "$work/load.txt"
  done
) &
watcher=$!

start=$(date +%s)
for scenario in $scenarios; do
  echo "bench.sh: $scenario" >&2
  if ! "$bench" "$scenario" --json "${bench_args[@]}" > "$work/$scenario.json" 2> "$work/$scenario.err"; then
    echo "bench.sh: $scenario failed: $(tail -n 1 "$work/$scenario.err")" >&2
  fi
done
kill "$watcher" 2>/dev/null || true
watcher=
elapsed=$(( $(date +%s) - start ))

conditions=""
if [[ -s $work/load.txt ]]; then
  samples=$(wc -l < "$work/load.txt")
  busy=$(awk '$1 > 0 {n++} END {print n+0}' "$work/load.txt")
  peak_load=$(awk 'BEGIN {m=0} $2 > m {m=$2} END {print m}' "$work/load.txt")
  if [[ $busy -gt 0 ]]; then
    conditions="other builds (compilers/linkers/tests) ran during $busy of $samples seconds of the measurement; peak 1-minute load $peak_load on $(nproc) cores"
  else
    conditions="no compiler, linker or test run was seen during the measurement; peak 1-minute load $peak_load on $(nproc) cores"
  fi
fi

mkdir -p "$(dirname "$results")" "$(dirname "$markdown")"
"$report" --inputs "$work" --json "$results" --markdown "$markdown" \
  --command "$(echo "scripts/bench.sh $(basename "$build") ${bench_args[*]}" | sed 's/ *$//')" \
  --conditions "$conditions" $([[ -f $analysis ]] && echo --analysis "$analysis")
echo "bench.sh: wrote $results and $markdown in ${elapsed} s" >&2
