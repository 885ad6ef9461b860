// quanta-bench-report: assembles the per-scenario JSON objects of one `make bench` run
// into bench/results/latest.json (an object keyed by scenario, plus machine, date and
// command) and renders bench/RESULTS.md: every scenario with its configurations side by
// side, and each target met or missed with the margin.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

const std::vector<std::string> kOrder = {"fairness", "interactive", "overhead", "handoff", "launch-cost", "memcap", "scale"};

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

bool is_figure(const Json& value) { return value.is_number() || value.is_null() || value.is_boolean(); }

// Configurations of a scenario in the order they read best.
std::vector<std::string> configurations(const Json& scenario) {
  std::vector<std::string> out;
  for (const char* name : {"solo", "direct", "native", "quanta"}) {
    if (scenario.contains(name) && scenario[name].is_object()) out.push_back(name);
  }
  return out;
}

// One table: a row per figure, a column per configuration.
void figure_table(std::ostream& md, const Json& scenario, const std::vector<std::string>& configs, const std::string& sub) {
  std::vector<std::string> keys;
  for (const auto& config : configs) {
    const Json& block = sub.empty() ? scenario[config] : scenario[config].value(sub, Json::object());
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
      const Json& block = sub.empty() ? scenario[config] : scenario[config].value(sub, Json::object());
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
    md << "| " << cell(reference[i]["weight"]) << " | " << cell(reference[i]["target_share"]) << " |";
    for (const auto& config : configs) {
      const Json& tenants = scenario[config].value("tenants", Json::array());
      md << " " << (i < tenants.size() ? cell(tenants[i]["achieved_share"]) : "") << " |";
    }
    md << "\n";
  }
}

void notes(std::ostream& md, const Json& scenario, const std::vector<std::string>& configs) {
  auto note_of = [&](const std::string& where, const Json& block) {
    if (block.contains("note") && block["note"].is_string()) md << "- " << where << ": " << block["note"].get<std::string>() << "\n";
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
  if (target["met"].is_null()) return "not measured";
  return target["met"].get<bool>() ? "met" : "**missed**";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"quanta-bench-report: latest.json and RESULTS.md from one run's per-scenario JSON files"};
  std::string inputs, from, json_out, markdown_out, command, analysis, conditions;
  auto* inputs_option = app.add_option("--inputs", inputs, "directory holding <scenario>.json files");
  app.add_option("--from", from, "an assembled latest.json to render again (instead of --inputs)")->excludes(inputs_option);
  app.add_option("--json", json_out, "where to write the assembled JSON (required with --inputs)");
  app.add_option("--markdown", markdown_out, "where to write RESULTS.md")->required();
  app.add_option("--command", command, "the command that produced the run");
  app.add_option("--conditions", conditions, "one line on what else ran during the measurement");
  app.add_option("--analysis", analysis, "a Markdown file appended as the analysis of misses");
  CLI11_PARSE(app, argc, argv);
  if (inputs.empty() == from.empty() || (!inputs.empty() && json_out.empty())) {
    std::cerr << "quanta-bench-report: give --inputs DIR with --json FILE, or --from latest.json\n";
    return 2;
  }

  Json all = Json::object();
  Json machine;
  std::string date, gpu;
  double elapsed = 0;
  if (!from.empty()) {
    std::ifstream in(from);
    try {
      all = Json::parse(in);
    } catch (const std::exception& error) {
      std::cerr << "quanta-bench-report: cannot read " << from << ": " << error.what() << "\n";
      return 1;
    }
    machine = all.value("machine", Json::object());
    date = all.value("date", "");
    gpu = all.value("gpu", "");
    command = all.value("command", "");
    conditions = all.value("conditions", "");
  }
  for (const auto& name : inputs.empty() ? std::vector<std::string>{} : kOrder) {
    fs::path file = fs::path(inputs) / (name + ".json");
    Json scenario;
    std::ifstream in(file);
    try {
      scenario = Json::parse(in);
    } catch (const std::exception&) {
      std::ifstream err(fs::path(inputs) / (name + ".err"));
      std::string text((std::istreambuf_iterator<char>(err)), std::istreambuf_iterator<char>());
      std::string last;
      std::istringstream lines(text);
      for (std::string line; std::getline(lines, line);) {
        if (!line.empty()) last = line;
      }
      scenario = {{"scenario", name}, {"note", "quanta-bench " + name + " printed no JSON" + (last.empty() ? "" : ": " + last)}};
    }
    if (machine.is_null() && scenario.contains("machine")) machine = scenario["machine"];
    if (date.empty() && scenario.contains("date")) date = scenario["date"].get<std::string>();
    if (gpu.empty() && scenario.contains("gpu")) gpu = scenario["gpu"].get<std::string>();
    elapsed += scenario.value("elapsed_s", 0.0);
    all[name] = scenario;
  }
  if (from.empty()) {
    all["machine"] = machine;
    all["date"] = date;
    all["command"] = command;
    all["gpu"] = gpu;
    all["elapsed_s"] = std::round(elapsed * 10) / 10;
    if (!conditions.empty()) all["conditions"] = conditions;
  }
  if (!json_out.empty()) std::ofstream(json_out) << all.dump(2) << "\n";

  std::ostringstream md;
  md << "# Quanta benchmark results\n\n"
     << "Written by `scripts/bench.sh` from `bench/results/latest.json`; every figure was measured beside its "
        "native baseline in the same run. How each figure is measured: [METHODS.md](METHODS.md).\n\n"
     << "- machine: " << cell(machine.value("cpu", Json("?"))) << ", " << cell(machine.value("cores", Json(0)))
     << " cores, kernel " << cell(machine.value("kernel", Json("?"))) << ", GPU: " << cell(machine.value("gpu", Json("?")))
     << "\n- date: " << date << "\n- command: `" << command << "`\n- total time: " << cell(all["elapsed_s"]) << " s\n";
  if (!conditions.empty()) md << "- conditions: " << conditions << "\n";

  md << "\n## Targets\n\n| scenario | target | value | limit | verdict | margin |\n|---|---|---|---|---|---|\n";
  for (const auto& name : kOrder) {
    const Json& scenario = all[name];
    if (!scenario.contains("targets")) {
      md << "| " << name << " | (no result) | — | — | not measured | — |\n";
      continue;
    }
    for (auto it = scenario["targets"].begin(); it != scenario["targets"].end(); ++it) {
      const Json& t = it.value();
      md << "| " << name << " | " << t.value("description", it.key()) << " | " << cell(t["value"]) << " | "
         << cell(t["limit"]) << " | " << verdict(t) << " | " << cell(t["margin"]) << " |\n";
    }
  }

  for (const auto& name : kOrder) {
    const Json& scenario = all[name];
    md << "\n## " << name << "\n\n";
    if (scenario.contains("workload")) md << "Workload: `" << scenario["workload"].dump() << "`\n\n";
    auto configs = configurations(scenario);
    if (name == "scale") {
      for (const char* layout : {"one_gpu", "eight_gpus"}) {
        md << "**" << layout << "**\n\n";
        figure_table(md, scenario, configs, layout);
        for (const auto& config : configs) {
          const Json& block = scenario[config].value(layout, Json::object());
          if (!block.contains("worst_tenant")) continue;
          const Json& worst = block["worst_tenant"];
          md << "\n" << config << " worst tenant: weight " << cell(worst["weight"]) << ", target share "
             << cell(worst["target_share"]) << ", achieved " << cell(worst["achieved_share"]) << "\n";
        }
        md << "\n";
      }
    } else {
      figure_table(md, scenario, configs, "");
      shares_table(md, scenario, configs);
    }
    std::vector<std::string> ratios;
    for (auto it = scenario.begin(); it != scenario.end(); ++it) {
      if (it.value().is_number() && it.key() != "elapsed_s") ratios.push_back(it.key() + " = " + cell(it.value()));
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

  if (!analysis.empty()) {
    std::ifstream in(analysis);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!text.empty()) md << "\n" << text;
  }
  std::ofstream(markdown_out) << md.str();
  return 0;
}
