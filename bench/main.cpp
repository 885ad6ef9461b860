// quanta-bench: runs one benchmark scenario (native baseline and Quanta side by side, on
// simgpu or a real GPU) and prints one JSON object on stdout; progress goes to stderr.
#include "bench/harness.h"
#include "bench/machine.h"
#include "bench/scenarios.h"

#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <iostream>

int main(int argc, char** argv) {
  using namespace quanta::bench;
  auto logger = spdlog::stderr_logger_mt("quanta-bench");
  logger->set_pattern("quanta-bench: %v");
  spdlog::set_default_logger(logger);

  std::string scenario_names;
  for (const auto& entry : scenarios()) scenario_names += (scenario_names.empty() ? "" : ", ") + std::string(entry.name);

  CLI::App app{"quanta-bench: Quanta's scenarios, each measured beside the native baseline in the same run"};
  std::string scenario;
  bool json = false;
  bool quick = false;
  std::string gpu_text;
  double seconds = 0;
  double minutes = 0;
  app.add_option("scenario", scenario, "one of: " + scenario_names)->required();
  app.add_flag("--json", json, "print one compact JSON object (default: indented)");
  app.add_option("--gpu", gpu_text, "sim (simgpu) or real (the NVIDIA driver); default real when one works")
      ->check(CLI::IsMember({"sim", "real"}));
  app.add_option("--seconds", seconds, "measured duration of each configuration (overrides the scenario's)")
      ->check(CLI::Range(0.2, 600.0));
  app.add_option("--minutes", minutes, "soak: length of the whole run in minutes")->check(CLI::Range(0.1, 1440.0));
  app.add_flag("--quick", quick, "short runs with fewer samples: a smoke test, not a measurement");
  CLI11_PARSE(app, argc, argv);

  const ScenarioEntry* chosen = nullptr;
  for (const auto& entry : scenarios()) {
    if (scenario == entry.name) chosen = &entry;
  }
  if (chosen == nullptr) {
    std::cerr << "quanta-bench: unknown scenario '" << scenario << "': use one of " << scenario_names << "\n";
    return 2;
  }
  // Children are reaped by the harness; a closed stdout reader must not kill us mid-run.
  signal(SIGPIPE, SIG_IGN);

  sweep_leftovers();
  Paths paths = Paths::around("/proc/self/exe");
  std::optional<RealGpu> real_gpu;
  if (gpu_text != "sim") real_gpu = detect_real_gpu(paths.sim_dir);
  if (gpu_text == "real" && !real_gpu) {
    std::cerr << "quanta-bench: --gpu real: no NVIDIA driver answered (libcuda.so.1 did not load or cuInit failed); use --gpu sim\n";
    return 2;
  }
  BenchOptions options;
  options.gpu = real_gpu ? GpuMode::real : GpuMode::sim;
  options.quick = quick;
  if (seconds > 0) options.seconds = seconds;
  if (minutes > 0) options.minutes = minutes;
  Bench bench(paths, options);

  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(i == 0 ? "quanta-bench" : argv[i]);
  char date[64];
  time_t now = time(nullptr);
  strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));

  spdlog::info("{} on {}{}", chosen->name, real_gpu ? real_gpu->name : "simgpu", quick ? " (quick)" : "");
  auto started = std::chrono::steady_clock::now();
  Json result;
  try {
    result = chosen->run(bench);
  } catch (const std::exception& error) {
    std::cerr << "quanta-bench: " << chosen->name << ": " << error.what() << "\n";
    return 1;
  }
  Json out = {{"scenario", chosen->name},
              {"machine", describe_machine(real_gpu)},
              {"gpu", real_gpu ? "real" : "sim"},
              {"date", date},
              {"command", command},
              {"quick", quick}};
  for (auto& [key, value] : result.items()) {
    if (key != "scenario") out[key] = value;
  }
  out["elapsed_s"] = std::round(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count() * 10) / 10;
  // A tenant meant to run under Quanta that ran ungated makes every quanta figure of its
  // configuration meaningless: the run fails, whatever the scenario.
  const std::vector<std::string> not_admitted = bench.not_admitted();
  if (!not_admitted.empty()) {
    out["failed"] = true;
    out["not_admitted"] = not_admitted;
    out["error"] = std::to_string(not_admitted.size()) +
                   " tenant(s) meant to run under Quanta were not admitted and gated in their pod "
                   "(see not_admitted): the quanta figures of their configurations do not "
                   "measure Quanta";
    std::cerr << "quanta-bench: " << chosen->name << ": " << out["error"].get<std::string>()
              << "\n";
    for (const std::string& line : not_admitted) std::cerr << "  " << line << "\n";
  }
  std::cout << (json ? out.dump() : out.dump(2)) << std::endl;
  // A scenario that checks invariants (soak) failed, or a tenant ran ungated.
  return out.value("failed", false) ? 1 : 0;
}
