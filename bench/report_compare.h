// What quanta-bench-report computes beyond assembling one run: a scenario measured several
// times folded into one (the median of each figure, the worst of each target), and every
// figure of this run set against the previous run's latest.json, with the direction each
// target's value moved.
#pragma once

#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

namespace quanta::bench {

using Json = nlohmann::json;

// Folds N runs of one scenario (each the object quanta-bench printed) into one: every
// numeric figure becomes the median over the runs that measured it (null where none did),
// every target's value the median with `met` and `margin` taken again from it, plus
// `worst` (the run furthest on the wrong side of the limit) and `runs` (each run's value).
// The runs themselves go under repeat.runs (without machine), so latest.json keeps the
// per-run figures. A single run comes back as it is.
Json merge_repeats(const std::vector<Json>& runs);

// Every figure of `current` against `previous` (both assembled latest.json objects) for
// the scenarios in `order`. A figure is a number or null reached through objects (arrays,
// strings, booleans and run metadata are not figures); a target's figure is its value.
// `previous` may be null (no earlier run) or of an older layout: what is missing there
// reads "new", a null there "not measured before". Returns
//   {previous: {date, command, gpu, quick} | null, previous_note, noise_pct,
//    scenarios: {name: "compared" | "new" | "not run now" | "dropped"},
//    figures: [{scenario, figure, target?, description?, comparison?, limit?, before, now,
//               change, change_pct, status, direction?, verdict_before?, verdict_now?,
//               beyond_noise, worse}]}
// status: changed | unchanged | new | not measured before | not measured now |
//         not measured | gone; direction (targets only): towards | away | unchanged.
// worse: a target that moved away from its limit by more than noise_pct percent, or that
// was met before and is missed now.
Json compare_runs(const Json& previous, const Json& current, const std::vector<std::string>& order,
                  double noise_pct, const std::string& previous_note = "");

// The comparison as plain lines for the terminal (what `make bench` prints).
void print_comparison(std::ostream& out, const Json& comparison);

// The comparison as a RESULTS.md section: what worsened beyond noise first, then a table
// per scenario.
void comparison_markdown(std::ostream& md, const Json& comparison);

// One figure for tables: four significant digits below 1000, whole numbers above.
std::string cell(const Json& value);

}  // namespace quanta::bench
