// Folding repeated runs of a scenario into one, and setting a run's figures against the
// previous run's: the arithmetic behind the "changes" quanta-bench-report prints and
// writes into RESULTS.md (tests/bench/report_compare_test.cpp holds it to account).
#include "bench/report_compare.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>
#include <sstream>

namespace quanta::bench {

namespace {

using Pointer = Json::json_pointer;

// Keys that describe a run rather than measure it, at any depth.
const std::set<std::string> kNotFigures = {
    "machine",  "workload",  "targets", "date",   "command", "gpu",        "quick",
    "scenario", "elapsed_s", "note",    "source", "repeat",  "conditions", "changes"};

struct Figure {
  Pointer where;
  std::string name;  // dotted: quanta.one_gpu.handoff_p99_us
};

// Numbers and nulls reached through objects, in document order.
void collect(const Json& object, const Pointer& where, const std::string& name,
             std::vector<Figure>& out) {
  for (auto it = object.begin(); it != object.end(); ++it) {
    if (kNotFigures.count(it.key()) != 0) continue;
    Pointer child = where / it.key();
    std::string child_name = name.empty() ? it.key() : name + "." + it.key();
    if (it.value().is_object()) {
      collect(it.value(), child, child_name, out);
    } else if (it.value().is_number() || it.value().is_null()) {
      out.push_back(Figure{child, child_name});
    }
  }
}

std::vector<Figure> figures_of(const Json& scenario) {
  std::vector<Figure> out;
  if (scenario.is_object()) collect(scenario, Pointer(), "", out);
  return out;
}

std::optional<double> number_at(const Json& doc, const Pointer& where) {
  if (!doc.is_object() || !doc.contains(where)) return std::nullopt;
  const Json& value = doc.at(where);
  if (!value.is_number()) return std::nullopt;
  return value.get<double>();
}

double rounded(double value, double scale) {
  return std::round(value * scale) / scale;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

Json number_or_null(std::optional<double> value) {
  return value ? Json(*value) : Json(nullptr);
}

bool at_most(const Json& target) {
  return target.value("comparison", "<=") != ">=";
}

std::string verdict(const Json& target) {
  if (target.is_object() && target.contains("inconclusive")) return "inconclusive";
  if (!target.is_object() || !target.contains("met") || !target["met"].is_boolean())
    return "not measured";
  return target["met"].get<bool>() ? "met" : "missed";
}

const Json& member(const Json& object, const std::string& key) {
  static const Json kNull;
  if (!object.is_object() || !object.contains(key)) return kNull;
  return object[key];
}

void append_note(Json& object, const std::string& note) {
  if (object.contains("note") && object["note"].is_string() &&
      !object["note"].get<std::string>().empty()) {
    object["note"] = object["note"].get<std::string>() + "; " + note;
  } else {
    object["note"] = note;
  }
}

// One figure of the comparison: before and now (absent, null or a number) and what that
// means.
Json compare_figure(const std::string& scenario, const std::string& name, const Json* before,
                    const Json* now) {
  Json row = {{"scenario", scenario},  {"figure", name},    {"before", nullptr},
              {"now", nullptr},        {"change", nullptr}, {"change_pct", nullptr},
              {"beyond_noise", false}, {"worse", false}};
  auto value_of = [](const Json* value) {
    return value != nullptr && value->is_number() ? std::optional<double>(value->get<double>())
                                                  : std::nullopt;
  };
  std::optional<double> b = value_of(before), n = value_of(now);
  row["before"] = number_or_null(b);
  row["now"] = number_or_null(n);
  if (before == nullptr) {
    row["status"] = "new";
  } else if (now == nullptr) {
    row["status"] = "gone";
  } else if (!b && !n) {
    row["status"] = "not measured";
  } else if (!b) {
    row["status"] = "not measured before";
  } else if (!n) {
    row["status"] = "not measured now";
  } else {
    double change = *n - *b;
    row["change"] = rounded(change, 1e6);
    if (*b != 0) row["change_pct"] = rounded(change / std::fabs(*b) * 100, 10);
    row["status"] = change == 0 ? "unchanged" : "changed";
  }
  return row;
}

}  // namespace

std::string cell(const Json& value) {
  if (value.is_null()) return "—";
  if (value.is_boolean()) return value.get<bool>() ? "yes" : "no";
  if (value.is_number_integer() || value.is_number_unsigned()) return value.dump();
  if (value.is_number()) {
    // Four significant digits below 1000, whole numbers above: 0.73, 23.4, 106.4, 2790.
    double number = value.get<double>();
    std::ostringstream out;
    if (std::fabs(number) >= 1000 || number == std::floor(number)) {
      out.precision(0);
      out << std::fixed << number;
    } else {
      out.precision(4);
      out << number;
    }
    return out.str();
  }
  if (value.is_string()) return value.get<std::string>();
  return value.dump();
}

Json merge_repeats(const std::vector<Json>& runs) {
  if (runs.empty()) return Json(nullptr);
  if (runs.size() == 1) return runs.front();
  Json out = runs.front();
  const size_t count = runs.size();

  // Every figure any run measured, as the median of the runs that measured it.
  std::vector<Figure> all;
  std::set<std::string> seen;
  for (const auto& run : runs) {
    for (auto& figure : figures_of(run)) {
      if (seen.insert(figure.where.to_string()).second) all.push_back(figure);
    }
  }
  for (const auto& figure : all) {
    std::vector<double> values;
    for (const auto& run : runs) {
      if (auto value = number_at(run, figure.where)) values.push_back(*value);
    }
    out[figure.where] = values.empty() ? Json(nullptr) : Json(rounded(median(values), 1e6));
  }

  // Targets: the median decides; the worst run and each run's value travel with it.
  if (out.contains("targets") && out["targets"].is_object()) {
    for (auto it = out["targets"].begin(); it != out["targets"].end(); ++it) {
      Json& target = it.value();
      if (!target.is_object()) continue;
      const bool lower_is_better = at_most(target);
      std::vector<double> values;
      Json per_run = Json::array();
      for (const auto& run : runs) {
        const Json& value = member(member(member(run, "targets"), it.key()), "value");
        per_run.push_back(value.is_number() ? value : Json(nullptr));
        if (value.is_number()) values.push_back(value.get<double>());
      }
      target["runs"] = per_run;
      if (values.empty()) {
        target["value"] = target["met"] = target["margin"] = target["worst"] = nullptr;
      } else {
        double value = rounded(median(values), 1e6);
        double worst = lower_is_better ? *std::max_element(values.begin(), values.end())
                                       : *std::min_element(values.begin(), values.end());
        target["value"] = value;
        target["worst"] = worst;
        if (target.contains("limit") && target["limit"].is_number()) {
          double limit = target["limit"].get<double>();
          target["met"] = lower_is_better ? value <= limit : value >= limit;
          target["margin"] = rounded(value - limit, 1e6);
        }
      }
      std::string description = target.value("description", it.key());
      target["description"] = description + " (median of " + std::to_string(count) + " runs)";
    }
  }

  // Notes a later run raised that the first did not, at the scenario and configuration level.
  for (size_t i = 1; i < count; ++i) {
    const Json& run = runs[i];
    auto merge_note = [&](Json& into, const Json& from) {
      if (!from.is_object() || !from.contains("note") || !from["note"].is_string()) return;
      std::string note = from["note"].get<std::string>();
      if (into.contains("note") && into["note"].is_string() &&
          into["note"].get<std::string>().find(note) != std::string::npos)
        return;
      append_note(into, "run " + std::to_string(i + 1) + ": " + note);
    };
    merge_note(out, run);
    for (auto it = out.begin(); it != out.end(); ++it) {
      if (it.value().is_object() && kNotFigures.count(it.key()) == 0)
        merge_note(it.value(), member(run, it.key()));
    }
  }

  double elapsed = 0;
  Json kept = Json::array();
  for (const auto& run : runs) {
    if (run.contains("elapsed_s") && run["elapsed_s"].is_number())
      elapsed += run["elapsed_s"].get<double>();
    Json copy = run;
    if (copy.is_object()) copy.erase("machine");
    kept.push_back(copy);
  }
  out["elapsed_s"] = rounded(elapsed, 10);
  out["repeat"] = {{"count", count},
                   {"figures", "median of the runs; a target's worst run under worst"},
                   {"runs", kept}};
  append_note(out, "every figure is the median of " + std::to_string(count) +
                       " runs (each run under repeat.runs)");
  return out;
}

namespace {

// Where the previous run came from, and why its figures are not like for like when it was
// --quick and this run is not (or the other way round) or ran on another GPU.
void describe_previous(Json& out, const Json& previous, const Json& current,
                       const std::vector<std::string>& order, const std::string& previous_note) {
  if (!previous.is_object()) {
    out["previous"] = nullptr;
    out["previous_note"] =
        previous_note.empty() ? "no previous run: every figure is new" : previous_note;
    return;
  }
  out["previous"] = {{"date", previous.value("date", "")},
                     {"command", previous.value("command", "")},
                     {"gpu", previous.value("gpu", "")},
                     {"quick", false}};
  std::vector<std::string> unlike;
  for (const auto& name : order) {
    const Json& scenario = member(previous, name);
    if (member(scenario, "quick").is_boolean() && scenario["quick"].get<bool>())
      out["previous"]["quick"] = true;
  }
  bool quick_now = false;
  for (const auto& name : order) {
    const Json& scenario = member(current, name);
    if (member(scenario, "quick").is_boolean() && scenario["quick"].get<bool>()) quick_now = true;
  }
  if (out["previous"]["quick"].get<bool>() != quick_now)
    unlike.push_back(quick_now ? "this run is --quick and the previous was not"
                               : "the previous run was --quick and this one is not");
  std::string gpu_before = previous.value("gpu", ""),
              gpu_now = current.is_object() ? current.value("gpu", "") : "";
  if (!gpu_before.empty() && !gpu_now.empty() && gpu_before != gpu_now)
    unlike.push_back("the previous run was on GPU '" + gpu_before + "', this one on '" + gpu_now +
                     "'");
  std::string note = previous_note;
  for (const auto& reason : unlike)
    note += (note.empty() ? "" : "; ") + reason + ": the changes are not like for like";
  if (!note.empty()) out["previous_note"] = note;
}

// A changed or unchanged row is beyond the noise when it moved more than noise_pct of its
// previous value (any move at all from 0).
void mark_noise(Json& row, double noise_pct) {
  const double before_value = row["before"].get<double>(), change = row["change"].get<double>();
  row["beyond_noise"] =
      before_value == 0 ? change != 0 : std::fabs(change / before_value) * 100 > noise_pct;
}

// The scenario's targets, the figures with a direction, in this run's order and the
// previous run's leftovers after: each row says which way it moved and whether it is worse.
void compare_targets(Json& rows, const std::string& name, const Json& now, const Json& before,
                     double noise_pct) {
  std::set<std::string> target_keys;
  std::vector<std::string> ordered_targets;
  for (const Json* side : {&now, &before}) {
    const Json& targets = member(*side, "targets");
    if (!targets.is_object()) continue;
    for (auto it = targets.begin(); it != targets.end(); ++it) {
      if (it.value().is_object() && target_keys.insert(it.key()).second)
        ordered_targets.push_back(it.key());
    }
  }
  for (const auto& key : ordered_targets) {
    const Json& target_now = member(member(now, "targets"), key);
    const Json& target_before = member(member(before, "targets"), key);
    const Json* value_now = target_now.is_object() ? &member(target_now, "value") : nullptr;
    const Json* value_before =
        target_before.is_object() ? &member(target_before, "value") : nullptr;
    Json row = compare_figure(name, "targets." + key, value_before, value_now);
    const Json& described = target_now.is_object() ? target_now : target_before;
    row["target"] = key;
    row["description"] = described.value("description", key);
    row["comparison"] = at_most(described) ? "<=" : ">=";
    row["limit"] = member(described, "limit");
    row["verdict_before"] = target_before.is_object() ? verdict(target_before) : "not measured";
    row["verdict_now"] = target_now.is_object() ? verdict(target_now) : "not measured";
    if (row["status"] == "changed" || row["status"] == "unchanged") {
      double change = row["change"].get<double>();
      bool better = at_most(described) ? change < 0 : change > 0;
      row["direction"] = change == 0 ? "unchanged" : better ? "towards" : "away";
      mark_noise(row, noise_pct);
    }
    bool moved_away = row.value("direction", "") == "away" && row["beyond_noise"].get<bool>();
    bool newly_missed = row["verdict_before"] == "met" && row["verdict_now"] == "missed";
    row["worse"] = moved_away || newly_missed;
    rows.push_back(row);
  }
}

// Every other figure of the scenario, in this run's order and the previous run's leftovers
// after.
void compare_other_figures(Json& rows, const std::string& name, const Json& now,
                           const Json& before, double noise_pct) {
  std::vector<Figure> figures = figures_of(now);
  std::set<std::string> listed;
  for (const auto& figure : figures) listed.insert(figure.where.to_string());
  for (const auto& figure : figures_of(before)) {
    if (listed.insert(figure.where.to_string()).second) figures.push_back(figure);
  }
  const bool has_before = before.is_object();
  for (const auto& figure : figures) {
    const Json* value_now = now.contains(figure.where) ? &now.at(figure.where) : nullptr;
    const Json* value_before =
        has_before && before.contains(figure.where) ? &before.at(figure.where) : nullptr;
    Json row = compare_figure(name, figure.name, value_before, value_now);
    if (row["status"] == "changed" || row["status"] == "unchanged") mark_noise(row, noise_pct);
    rows.push_back(row);
  }
}

}  // namespace

Json compare_runs(const Json& previous, const Json& current, const std::vector<std::string>& order,
                  double noise_pct, const std::string& previous_note) {
  Json out = {{"noise_pct", noise_pct}, {"scenarios", Json::array()}, {"figures", Json::array()}};
  const bool have_previous = previous.is_object();
  describe_previous(out, previous, current, order, previous_note);
  for (const auto& name : order) {
    const Json& now = member(current, name);
    const Json& before = have_previous ? member(previous, name) : member(Json(), name);
    const bool has_now = now.is_object(), has_before = before.is_object();
    if (!has_now && !has_before) continue;
    if (!has_now) {
      out["scenarios"].push_back({{"scenario", name}, {"status", "not run now"}});
      continue;
    }
    out["scenarios"].push_back({{"scenario", name}, {"status", has_before ? "compared" : "new"}});
    compare_targets(out["figures"], name, now, before, noise_pct);
    compare_other_figures(out["figures"], name, now, before, noise_pct);
  }
  return out;
}

namespace {

std::string change_text(const Json& row) {
  const std::string status = row.value("status", "");
  if (status == "new") return row["now"].is_null() ? "new (not measured)" : "new";
  if (status == "gone") return "no longer reported";
  if (status == "not measured") return "not measured before or now";
  if (status == "not measured before" || status == "not measured now") return status;
  if (status == "unchanged") return "unchanged";
  std::string text = (row["change"].get<double>() > 0 ? "+" : "") + cell(row["change"]);
  if (!row["change_pct"].is_null()) {
    text += " (" + std::string(row["change_pct"].get<double>() > 0 ? "+" : "") +
            cell(row["change_pct"]) + "%)";
  }
  return text;
}

std::string target_text(const Json& row) {
  if (!row.contains("target")) return "";
  std::string text;
  if (row.contains("direction")) {
    std::string direction = row["direction"].get<std::string>();
    text = direction == "unchanged" ? "unchanged"
           : direction == "towards" ? "towards the target"
                                    : "away from the target";
  }
  std::string limit = "(" + row.value("comparison", "<=") + " " + cell(row["limit"]) + ")";
  text += (text.empty() ? "" : " ") + limit;
  std::string before = row.value("verdict_before", ""), now = row.value("verdict_now", "");
  text += before == now ? ", " + now : ", " + before + " → " + now;
  if (row.value("worse", false)) text += ", **worse beyond noise**";
  return text;
}

std::string previous_line(const Json& comparison) {
  const Json& previous = comparison["previous"];
  if (!previous.is_object()) return "";
  std::string date = previous.value("date", "");
  std::string command = previous.value("command", "");
  return (date.empty() ? "an undated run" : date) + (command.empty() ? "" : ", `" + command + "`");
}

std::vector<const Json*> rows_of(const Json& comparison, const std::string& scenario) {
  std::vector<const Json*> rows;
  for (const auto& row : comparison["figures"]) {
    if (row["scenario"] == scenario) rows.push_back(&row);
  }
  return rows;
}

}  // namespace

void print_comparison(std::ostream& out, const Json& comparison) {
  std::string against = previous_line(comparison);
  out << "Changes against the previous run" << (against.empty() ? "" : " (" + against + ")")
      << ":\n";
  if (comparison.contains("previous_note"))
    out << "  note: " << comparison["previous_note"].get<std::string>() << "\n";
  std::vector<std::string> worse;
  for (const auto& entry : comparison["scenarios"]) {
    const std::string scenario = entry["scenario"].get<std::string>(),
                      status = entry["status"].get<std::string>();
    if (status == "not run now") {
      out << scenario << ": not run this time (in the previous run)\n";
      continue;
    }
    out << scenario << (status == "new" ? ": new (not in the previous run)" : ":") << "\n";
    for (const Json* row : rows_of(comparison, scenario)) {
      std::string name = row->contains("target") ? "target " + (*row)["target"].get<std::string>()
                                                 : (*row)["figure"].get<std::string>();
      out << "  " << name << ": " << cell((*row)["before"]) << " -> " << cell((*row)["now"]) << ", "
          << change_text(*row);
      std::string target = target_text(*row);
      if (!target.empty()) {
        // The terminal has no Markdown: strip the emphasis.
        std::string plain;
        for (char c : target) {
          if (c != '*') plain += c;
        }
        for (size_t at; (at = plain.find("→")) != std::string::npos;)
          plain.replace(at, std::string("→").size(), "->");
        out << ", " << plain;
      }
      out << "\n";
      if (row->value("worse", false)) worse.push_back(scenario + " " + name);
    }
  }
  if (worse.empty()) {
    out << "No target worsened beyond noise (" << cell(comparison["noise_pct"]) << "%).\n";
  } else {
    out << "Worsened beyond noise (" << cell(comparison["noise_pct"]) << "%):";
    for (const auto& name : worse) out << " " << name << ";";
    out << "\n";
  }
}

void comparison_markdown(std::ostream& md, const Json& comparison) {
  md << "\n## Changes since the previous run\n\n";
  std::string against = previous_line(comparison);
  if (!against.empty()) {
    md << "Against the previous `latest.json` (" << against
       << "). A target that moved away from its limit by more "
       << "than " << cell(comparison["noise_pct"])
       << "% of its value, or went from met to missed, counts as worse "
       << "beyond noise.\n";
  }
  if (comparison.contains("previous_note"))
    md << "\n" << comparison["previous_note"].get<std::string>() << ".\n";

  std::vector<const Json*> worse;
  for (const auto& row : comparison["figures"]) {
    if (row.value("worse", false)) worse.push_back(&row);
  }
  if (comparison["previous"].is_object()) {
    if (worse.empty()) {
      md << "\nNo target worsened beyond noise.\n";
    } else {
      md << "\n**Worsened beyond noise:**\n\n";
      for (const Json* row : worse) {
        md << "- " << (*row)["scenario"].get<std::string>() << ": "
           << (*row)["description"].get<std::string>() << ": " << cell((*row)["before"]) << " → "
           << cell((*row)["now"]) << " (" << change_text(*row) << "), "
           << (*row)["verdict_before"].get<std::string>() << " → "
           << (*row)["verdict_now"].get<std::string>() << "\n";
      }
    }
  }

  for (const auto& entry : comparison["scenarios"]) {
    const std::string scenario = entry["scenario"].get<std::string>(),
                      status = entry["status"].get<std::string>();
    md << "\n### " << scenario << "\n\n";
    if (status == "not run now") {
      md << "Not run this time (it was in the previous run).\n";
      continue;
    }
    if (status == "new") md << "New: not in the previous run.\n\n";
    md << "| figure | before | now | change | target |\n|---|---|---|---|---|\n";
    for (const Json* row : rows_of(comparison, scenario)) {
      md << "| " << (*row)["figure"].get<std::string>() << " | " << cell((*row)["before"]) << " | "
         << cell((*row)["now"]) << " | " << change_text(*row) << " | " << target_text(*row)
         << " |\n";
    }
  }
}

}  // namespace quanta::bench
