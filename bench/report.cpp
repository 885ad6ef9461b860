// quanta-bench-report: assembles the per-scenario JSON objects of one `make bench` run
// into bench/results/latest.json (an object keyed by scenario, plus machine, date and
// command) and renders bench/RESULTS.md: every scenario with its configurations side by
// side, each target met or missed with the margin, and every figure's change against the
// previous run's latest.json (also printed for the terminal).
#include <CLI/CLI.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "bench/report_compare.h"

namespace {

using Json = nlohmann::json;
using quanta::bench::cell;
namespace fs = std::filesystem;

const std::vector<std::string> kOrder = {"fairness", "interactive", "interactive-8",
                                         "overhead", "handoff",     "launch-cost",
                                         "memcap",   "scale",       "churn"};

// The last non-empty line of a file (a scenario's stderr: why it printed no JSON).
std::string last_line(const fs::path& file) {
  std::ifstream in(file);
  std::string last;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) last = line;
  }
  return last;
}

// One scenario's JSON from the inputs: <name>.json, or <name>.1.json, <name>.2.json, ...
// when bench.sh ran it several times (folded into medians). A run that printed no JSON
// becomes a note naming its last line of stderr. Null when the inputs hold nothing of it.
Json read_scenario(const fs::path& inputs, const std::string& name, bool required) {
  auto parse = [&](const std::string& stem, std::string& why) {
    std::ifstream in(inputs / (stem + ".json"));
    try {
      Json scenario = Json::parse(in);
      if (scenario.is_object()) return scenario;
      why = "its JSON is not an object";
    } catch (const std::exception&) {
      why = last_line(inputs / (stem + ".err"));
    }
    return Json(nullptr);
  };
  auto failed = [&](const std::string& why) {
    return Json{
        {"scenario", name},
        {"note", "quanta-bench " + name + " printed no JSON" + (why.empty() ? "" : ": " + why)}};
  };
  if (fs::exists(inputs / (name + ".1.json"))) {
    std::vector<Json> runs;
    std::vector<std::string> failures;
    for (int i = 1; fs::exists(inputs / (name + "." + std::to_string(i) + ".json")); ++i) {
      std::string why;
      Json run = parse(name + "." + std::to_string(i), why);
      if (run.is_null()) {
        failures.push_back("run " + std::to_string(i) + " printed no JSON" +
                           (why.empty() ? "" : ": " + why));
      } else {
        runs.push_back(run);
      }
    }
    Json merged = runs.empty() ? failed(failures.empty() ? "" : failures.front())
                               : quanta::bench::merge_repeats(runs);
    for (const auto& failure : failures) {
      std::string note = merged.value("note", "");
      merged["note"] = note.empty() ? failure : note + "; " + failure;
    }
    return merged;
  }
  if (!required && !fs::exists(inputs / (name + ".json"))) return Json(nullptr);
  std::string why;
  Json scenario = parse(name, why);
  return scenario.is_null() ? failed(why) : scenario;
}

bool is_figure(const Json& value) {
  return value.is_number() || value.is_null() || value.is_boolean();
}

// Configurations of a scenario in the order they read best.
std::vector<std::string> configurations(const Json& scenario) {
  std::vector<std::string> out;
  for (const char* name : {"solo", "direct", "native", "quanta"}) {
    if (scenario.contains(name) && scenario[name].is_object()) out.push_back(name);
  }
  return out;
}

// One table: a row per figure, a column per configuration.
void figure_table(std::ostream& md, const Json& scenario, const std::vector<std::string>& configs,
                  const std::string& sub) {
  std::vector<std::string> keys;
  for (const auto& config : configs) {
    const Json& block =
        sub.empty() ? scenario[config] : scenario[config].value(sub, Json::object());
    for (auto it = block.begin(); it != block.end(); ++it) {
      if (!is_figure(it.value())) continue;
      if (std::find(keys.begin(), keys.end(), it.key()) == keys.end()) keys.push_back(it.key());
    }
  }
  if (keys.empty()) return;
  md << "| figure |";
  for (const auto& config : configs) md << " " << config << " |";
  md << "\n|---|";
  for (size_t i = 0; i < configs.size(); ++i) md << "---|";
  md << "\n";
  for (const auto& key : keys) {
    md << "| " << key << " |";
    for (const auto& config : configs) {
      const Json& block =
          sub.empty() ? scenario[config] : scenario[config].value(sub, Json::object());
      md << " " << (block.contains(key) ? cell(block[key]) : "") << " |";
    }
    md << "\n";
  }
}

void shares_table(std::ostream& md, const Json& scenario, const std::vector<std::string>& configs) {
  bool any = false;
  for (const auto& config : configs) any = any || scenario[config].contains("tenants");
  if (!any) return;
  md << "\n| weight | target share |";
  for (const auto& config : configs) md << " " << config << " share |";
  md << "\n|---|---|";
  for (size_t i = 0; i < configs.size(); ++i) md << "---|";
  md << "\n";
  const Json& reference = scenario[configs.front()]["tenants"];
  for (size_t i = 0; i < reference.size(); ++i) {
    md << "| " << cell(reference[i]["weight"]) << " | " << cell(reference[i]["target_share"])
       << " |";
    for (const auto& config : configs) {
      const Json& tenants = scenario[config].value("tenants", Json::array());
      md << " " << (i < tenants.size() ? cell(tenants[i]["achieved_share"]) : "") << " |";
    }
    md << "\n";
  }
}

void notes(std::ostream& md, const Json& scenario, const std::vector<std::string>& configs) {
  auto note_of = [&](const std::string& where, const Json& block) {
    if (block.contains("note") && block["note"].is_string())
      md << "- " << where << ": " << block["note"].get<std::string>() << "\n";
  };
  note_of("scenario", scenario);
  for (const auto& config : configs) {
    note_of(config, scenario[config]);
    for (auto it = scenario[config].begin(); it != scenario[config].end(); ++it) {
      if (it.value().is_object()) note_of(config + "." + it.key(), it.value());
    }
  }
}

std::string verdict(const Json& target) {
  if (target.contains("inconclusive") && target["inconclusive"].is_string())
    return "inconclusive: " + target["inconclusive"].get<std::string>();
  if (target["met"].is_null()) return "not measured";
  return target["met"].get<bool>() ? "met" : "**missed**";
}

// `all[name]`, or null when the run has none (a const Json's operator[] must not be asked
// for a key it lacks).
const Json& member(const Json& all, const std::string& name) {
  static const Json kNone;
  auto it = all.find(name);
  return it == all.end() ? kNone : *it;
}

// What the command line asks for.
struct Options {
  std::string inputs, from, json_out, markdown_out, command, analysis, conditions;
  std::string previous_file, scenario_list;
  bool print_changes = false;
  double noise_pct = 10;
};

// The run's latest.json as it is assembled (or read back with --from), with its scenarios in
// the order RESULTS.md shows them.
struct Run {
  Json all = Json::object();
  Json machine;
  std::string date, gpu, command, conditions;
  std::vector<std::string> order = kOrder;
  std::vector<std::string> asked;  // --scenarios, in its order
};

// --from: a latest.json assembled before, read back with its machine, date and command.
void read_assembled(const std::string& from, Run& run) {
  std::ifstream in(from);
  try {
    run.all = Json::parse(in);
  } catch (const std::exception& error) {
    throw std::runtime_error("cannot read " + from + ": " + error.what());
  }
  run.machine = run.all.value("machine", Json::object());
  run.date = run.all.value("date", "");
  run.gpu = run.all.value("gpu", "");
  run.command = run.all.value("command", "");
  run.conditions = run.all.value("conditions", "");
}

// After --scenarios: the scenarios a --from file holds beyond the usual ones (a --only run of
// soak, say), appended to the order.
void order_assembled_extras(Run& run) {
  for (auto it = run.all.begin(); it != run.all.end(); ++it) {
    if (it.value().is_object() && it.value().contains("scenario") &&
        std::find(run.order.begin(), run.order.end(), it.key()) == run.order.end()) {
      run.order.push_back(it.key());
    }
  }
}

// --scenarios: the ones asked for, appended to the order when new.
void read_asked(const std::string& scenario_list, Run& run) {
  std::istringstream names(scenario_list);
  for (std::string name; names >> name;) {
    run.asked.push_back(name);
    if (std::find(run.order.begin(), run.order.end(), name) == run.order.end())
      run.order.push_back(name);
  }
}

// --inputs: every scenario's JSON (those asked for, which must be there, or all there are),
// and the machine, date and GPU the first of them names.
void assemble(const std::string& inputs, Run& run) {
  double elapsed = 0;
  for (const auto& name : run.order) {
    const bool required = std::find(run.asked.begin(), run.asked.end(), name) != run.asked.end();
    if (!run.asked.empty() && !required) continue;
    Json scenario = read_scenario(inputs, name, required);
    if (scenario.is_null()) continue;
    if (run.machine.is_null() && scenario.contains("machine")) run.machine = scenario["machine"];
    if (run.date.empty() && scenario.contains("date") && scenario["date"].is_string())
      run.date = scenario["date"].get<std::string>();
    if (run.gpu.empty() && scenario.contains("gpu") && scenario["gpu"].is_string())
      run.gpu = scenario["gpu"].get<std::string>();
    elapsed += scenario.value("elapsed_s", 0.0);
    run.all[name] = scenario;
  }
  run.all["machine"] = run.machine;
  run.all["date"] = run.date;
  run.all["command"] = run.command;
  run.all["gpu"] = run.gpu;
  run.all["elapsed_s"] = std::round(elapsed * 10) / 10;
  if (!run.conditions.empty()) run.all["conditions"] = run.conditions;
}

// Every figure's change against the previous run's latest.json (read before --json
// overwrites it: bench.sh passes a copy, but the file may be the same).
Json changes_since(const std::string& previous_file, const Run& run, double noise_pct) {
  Json previous;
  std::string note;
  if (!fs::exists(previous_file)) {
    note = "no previous run (" + previous_file + " does not exist): every figure is new";
  } else {
    std::ifstream in(previous_file);
    try {
      previous = Json::parse(in);
      if (!previous.is_object()) {
        previous = nullptr;
        note = "the previous run's " + previous_file + " is not a JSON object: every figure is new";
      }
    } catch (const std::exception& error) {
      note = "the previous run's " + previous_file + " is not JSON (" + error.what() +
             "): every figure is new";
    }
  }
  return quanta::bench::compare_runs(previous, run.all, run.order, noise_pct, note);
}

// The line of the header that says what worsened since the previous run.
void changes_line(std::ostream& md, const Json& changes) {
  std::vector<std::string> worse;
  for (const auto& row : changes.value("figures", Json::array())) {
    if (row.value("worse", false))
      worse.push_back(row.value("scenario", "") + " " + row.value("target", ""));
  }
  if (!changes["previous"].is_object()) {
    md << "- changes: none to show (" << changes.value("previous_note", "no previous run") << ")\n";
  } else if (worse.empty()) {
    md << "- changes: no target worsened beyond noise since "
       << changes["previous"].value("date", "the previous run")
       << " ([changes](#changes-since-the-previous-run))\n";
  } else {
    md << "- changes: **" << worse.size() << " target" << (worse.size() == 1 ? "" : "s")
       << " worsened beyond noise** since " << changes["previous"].value("date", "the previous run")
       << ":";
    for (size_t i = 0; i < worse.size(); ++i) md << (i ? "," : "") << " " << worse[i];
    md << " ([changes](#changes-since-the-previous-run))\n";
  }
}

// The machine, date, command and time of the run, and its changes in one line.
void header_markdown(std::ostream& md, const Run& run, const std::string& results_file) {
  const Json& machine = run.machine;
  md << "# Quanta benchmark results\n\n"
     << "Written by `scripts/bench.sh` from `bench/results/"
     << (results_file.empty() ? "latest.json" : results_file)
     << "`; every figure was measured beside its native baseline in the same run. How each figure "
        "is measured: [METHODS.md](METHODS.md).\n\n"
     << "- machine: " << cell(machine.value("cpu", Json("?"))) << ", "
     << cell(machine.value("cores", Json(0))) << " cores, kernel "
     << cell(machine.value("kernel", Json("?")))
     << ", GPU: " << cell(machine.value("gpu", Json("?"))) << "\n- date: " << run.date
     << "\n- command: `" << run.command << "`\n- total time: " << cell(member(run.all, "elapsed_s"))
     << " s\n";
  if (!run.conditions.empty()) md << "- conditions: " << run.conditions << "\n";
  if (run.all.contains("changes") && run.all["changes"].is_object())
    changes_line(md, run.all["changes"]);
}

// Every scenario's targets: value, limit, verdict and margin.
void targets_markdown(std::ostream& md, const Run& run) {
  md << "\n## Targets\n\n| scenario | target | value | limit | verdict | margin "
        "|\n|---|---|---|---|---|---|\n";
  for (const auto& name : run.order) {
    const Json& scenario = member(run.all, name);
    if (!scenario.contains("targets")) {
      md << "| " << name << " | (no result) | — | — | not measured | — |\n";
      continue;
    }
    for (auto it = scenario["targets"].begin(); it != scenario["targets"].end(); ++it) {
      const Json& t = it.value();
      md << "| " << name << " | " << t.value("description", it.key()) << " | " << cell(t["value"])
         << " | " << cell(t["limit"]) << " | " << verdict(t) << " | " << cell(t["margin"])
         << (t.contains("worst") ? "; worst run " + cell(t["worst"]) : "") << " |\n";
    }
  }
}

// scale's two layouts, each with its configurations side by side and its worst tenant.
void scale_markdown(std::ostream& md, const Json& scenario,
                    const std::vector<std::string>& configs) {
  for (const char* layout : {"one_gpu", "eight_gpus"}) {
    md << "**" << layout << "**\n\n";
    figure_table(md, scenario, configs, layout);
    for (const auto& config : configs) {
      const Json& block = scenario[config].value(layout, Json::object());
      if (!block.contains("worst_tenant")) continue;
      const Json& worst = block["worst_tenant"];
      md << "\n"
         << config << " worst tenant: weight " << cell(worst["weight"]) << ", target share "
         << cell(worst["target_share"]) << ", achieved " << cell(worst["achieved_share"]) << "\n";
    }
    md << "\n";
  }
}

// One scenario's section: its workload, its configurations side by side, its ratios and notes.
void scenario_markdown(std::ostream& md, const std::string& name, const Json& scenario) {
  md << "\n## " << name << "\n\n";
  if (scenario.contains("workload")) md << "Workload: `" << scenario["workload"].dump() << "`\n\n";
  const auto configs = configurations(scenario);
  if (name == "scale") {
    scale_markdown(md, scenario, configs);
  } else {
    figure_table(md, scenario, configs, "");
    shares_table(md, scenario, configs);
  }
  std::vector<std::string> ratios;
  for (auto it = scenario.begin(); it != scenario.end(); ++it) {
    if (it.value().is_number() && it.key() != "elapsed_s")
      ratios.push_back(it.key() + " = " + cell(it.value()));
  }
  if (!ratios.empty()) {
    md << "\n";
    for (size_t i = 0; i < ratios.size(); ++i) md << (i ? ", " : "") << ratios[i];
    md << "\n";
  }
  std::ostringstream scenario_notes;
  notes(scenario_notes, scenario, configs);
  if (!scenario_notes.str().empty()) md << "\nNotes:\n\n" << scenario_notes.str();
}

// RESULTS.md: header, targets, each scenario, the changes and the analysis of misses.
std::string results_markdown(const Run& run, const Options& o) {
  std::ostringstream md;
  // The run's own file (latest.json unless scripts/bench.sh was given --results).
  header_markdown(md, run, fs::path(o.from.empty() ? o.json_out : o.from).filename().string());
  targets_markdown(md, run);
  for (const auto& name : run.order) {
    const Json& scenario = member(run.all, name);
    if (!scenario.is_object() && std::find(kOrder.begin(), kOrder.end(), name) == kOrder.end())
      continue;
    scenario_markdown(md, name, scenario);
  }
  if (run.all.contains("changes")) quanta::bench::comparison_markdown(md, run.all["changes"]);
  if (!o.analysis.empty()) {
    std::ifstream in(o.analysis);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!text.empty()) md << "\n" << text;
  }
  return md.str();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "quanta-bench-report: latest.json and RESULTS.md from one run's per-scenario JSON files"};
  Options o;
  auto* inputs_option =
      app.add_option("--inputs", o.inputs, "directory holding <scenario>.json files");
  app.add_option("--from", o.from, "an assembled latest.json to render again (instead of --inputs)")
      ->excludes(inputs_option);
  app.add_option("--json", o.json_out,
                 "where to write the assembled JSON (required with --inputs)");
  app.add_option("--markdown", o.markdown_out, "where to write RESULTS.md")->required();
  app.add_option("--command", o.command, "the command that produced the run");
  app.add_option("--conditions", o.conditions, "one line on what else ran during the measurement");
  app.add_option("--analysis", o.analysis, "a Markdown file appended as the analysis of misses");
  app.add_option(
      "--previous", o.previous_file,
      "the previous run's latest.json to compare against (a missing file means no previous run)");
  app.add_option("--scenarios", o.scenario_list,
                 "the scenarios this run asked for, space-separated (default: every "
                 "<scenario>.json in --inputs)");
  app.add_option("--noise-pct", o.noise_pct,
                 "a target moving away from its limit by more than this % is called worse")
      ->check(CLI::Range(0.0, 1000.0));
  app.add_flag("--print-changes", o.print_changes,
               "print each figure's change against --previous on stdout");
  CLI11_PARSE(app, argc, argv);
  if (o.inputs.empty() == o.from.empty() || (!o.inputs.empty() && o.json_out.empty())) {
    std::cerr << "quanta-bench-report: give --inputs DIR with --json FILE, or --from latest.json\n";
    return 2;
  }

  Run run;
  run.command = o.command;
  run.conditions = o.conditions;
  if (!o.from.empty()) {
    try {
      read_assembled(o.from, run);
    } catch (const std::exception& error) {
      std::cerr << "quanta-bench-report: " << error.what() << "\n";
      return 1;
    }
  }
  read_asked(o.scenario_list, run);
  if (o.from.empty()) {
    assemble(o.inputs, run);
  } else {
    order_assembled_extras(run);
  }
  if (!o.previous_file.empty())
    run.all["changes"] = changes_since(o.previous_file, run, o.noise_pct);
  if (o.print_changes && run.all.contains("changes"))
    quanta::bench::print_comparison(std::cout, run.all["changes"]);
  if (!o.json_out.empty()) std::ofstream(o.json_out) << run.all.dump(2) << "\n";
  std::ofstream(o.markdown_out) << results_markdown(run, o);
  return 0;
}
