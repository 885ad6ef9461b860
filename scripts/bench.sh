#!/usr/bin/env bash
# `make bench`: runs every quanta-bench scenario with --json, one after the other, and
# writes bench/results/latest.json (keyed by scenario, plus machine, date and command)
# and bench/RESULTS.md, and prints each figure's change against the previous latest.json
# (also under "changes" in the new one and in RESULTS.md). Usage:
#   scripts/bench.sh BUILD_DIR [--quick] [--gpu sim|real] [--results FILE] [--markdown FILE]
#                    [--only "fairness handoff"] [--repeat N] [--repeat-only "interactive"]
#                    [--previous FILE] [--noise-pct P]
#   scripts/bench.sh BUILD_DIR --render-only   # RESULTS.md again from latest.json (and bench/analysis.md)
# --repeat N runs each of the --repeat-only scenarios (default: interactive and
# interactive-8, whose tails vary most from run to run) N times; every figure is then the median of the N runs,
# each target carries its worst run, and latest.json keeps every run under repeat.runs.
# The scenarios measure time on a shared machine: the script records whether compilers
# or linkers ran meanwhile, and RESULTS.md says so.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:?usage: scripts/bench.sh BUILD_DIR [--quick] [--gpu sim|real] [--results FILE] [--markdown FILE] [--only "S1 S2"] [--repeat N] [--repeat-only "S1"] [--previous FILE] [--noise-pct P] [--render-only]}
shift
build=$(cd "$build" && pwd)
results="$root/bench/results/latest.json"
markdown="$root/bench/RESULTS.md"
scenarios="fairness interactive interactive-8 overhead handoff launch-cost memcap scale churn"
bench_args=()
render_only=0
repeat=1
repeat_only="interactive interactive-8"
previous=
noise_pct=10
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) bench_args+=(--quick); shift ;;
    --gpu) bench_args+=(--gpu "${2:?--gpu needs sim or real}"); shift 2 ;;
    --results) results=$2; shift 2 ;;
    --markdown) markdown=$2; shift 2 ;;
    --only) scenarios=$2; shift 2 ;;
    --render-only) render_only=1; shift ;;
    --repeat) repeat=${2:?--repeat needs a count}; shift 2 ;;
    --repeat-only) repeat_only=${2:?--repeat-only needs a list of scenarios}; shift 2 ;;
    --previous) previous=${2:?--previous needs a file}; shift 2 ;;
    --noise-pct) noise_pct=${2:?--noise-pct needs a percentage}; shift 2 ;;
    *) echo "bench.sh: unknown argument '$1' (allowed: --quick, --gpu sim|real, --results FILE, --markdown FILE, --only LIST, --repeat N, --repeat-only LIST, --previous FILE, --noise-pct P, --render-only)" >&2; exit 2 ;;
  esac
done
if ! [[ $repeat =~ ^[0-9]+$ ]] || [[ $repeat -lt 1 || $repeat -gt 20 ]]; then
  echo "bench.sh: --repeat '$repeat' is not a whole number from 1 to 20" >&2
  exit 2
fi
if ! [[ $noise_pct =~ ^[0-9]+([.][0-9]+)?$ ]]; then
  echo "bench.sh: --noise-pct '$noise_pct' is not a non-negative number (a percentage, e.g. 10)" >&2
  exit 2
fi
# The previous run is what the results file holds now, unless told otherwise.
[[ -n $previous ]] || previous=$results

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

# Keep the previous run before anything can overwrite it (a missing one means none).
previous_copy=$previous
if [[ -f $previous ]]; then
  previous_copy="$work/previous.json"
  cp "$previous" "$previous_copy"
fi

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
  runs=1
  [[ " $repeat_only " == *" $scenario "* ]] && runs=$repeat
  for ((run = 1; run <= runs; run++)); do
    # A repeated scenario's runs are <scenario>.1.json ... (the report folds them).
    stem=$scenario
    [[ $runs -gt 1 ]] && stem="$scenario.$run"
    echo "bench.sh: $scenario$([[ $runs -gt 1 ]] && echo " (run $run of $runs)")" >&2
    if ! "$bench" "$scenario" --json "${bench_args[@]}" > "$work/$stem.json" 2> "$work/$stem.err"; then
      echo "bench.sh: $scenario failed: $(tail -n 1 "$work/$stem.err")" >&2
    fi
  done
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

command="scripts/bench.sh $(basename "$build") ${bench_args[*]}"
if [[ $repeat -gt 1 ]]; then
  command="$command --repeat $repeat"
  [[ $repeat_only == "interactive interactive-8" ]] || command="$command --repeat-only \"$repeat_only\""
fi
mkdir -p "$(dirname "$results")" "$(dirname "$markdown")"
"$report" --inputs "$work" --scenarios "$scenarios" --json "$results" --markdown "$markdown" \
  --previous "$previous_copy" --noise-pct "$noise_pct" --print-changes \
  --command "$(echo "$command" | sed 's/ *$//')" \
  --conditions "$conditions" $([[ -f $analysis ]] && echo --analysis "$analysis")
echo "bench.sh: wrote $results and $markdown in ${elapsed} s" >&2
