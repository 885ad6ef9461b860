// quanta-tenant: parses the command line, reaches the driver by the chosen lookup path,
// runs one workload mode and prints its summary (one JSON object with --json).
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "tests/tenant/driver.h"
#include "tests/tenant/gpu.h"
#include "tests/tenant/modes.h"
#include "tests/tenant/options.h"

namespace {

using quanta::tenant::Options;

// QUANTA_POD must be in the environment before anything preloaded reads it, so the
// program re-executes itself once with it set.
void export_pod(const Options& options, char** argv) {
  if (options.pod.empty()) return;
  const char* current = std::getenv("QUANTA_POD");
  if (current != nullptr && options.pod == current) return;
  setenv("QUANTA_POD", options.pod.c_str(), 1);
  execv("/proc/self/exe", argv);
  spdlog::warn("re-exec with QUANTA_POD={} failed; continuing with it set only after start",
               options.pod);
}

void print_text(const nlohmann::json& report) {
  for (const auto& [key, value] : report.items()) {
    std::cout << key << ": " << (value.is_string() ? value.get<std::string>() : value.dump())
              << '\n';
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace quanta::tenant;
  auto logger = spdlog::stderr_logger_mt("quanta-tenant");
  logger->set_pattern("quanta-tenant: %l: %v");
  spdlog::set_default_logger(logger);

  ParseResult parsed = parse_options(argc, argv);
  if (!parsed.options) {
    if (parsed.exit_code == 0) {
      std::cout << parsed.message;
    } else {
      std::fprintf(stderr, "quanta-tenant: %s\n", parsed.message.c_str());
    }
    return parsed.exit_code;
  }
  const Options& options = *parsed.options;
  export_pod(options, argv);
  // Sleeps (request arrivals, --start-at) end within microseconds, not the 50 us default.
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);

  nlohmann::json report = {
      {"mode", mode_name(options.mode)},
      {"ok", false},
      {"lookup", lookup_name(options.lookup)},
      {"device", options.device},
      {"context", context_name(options.context)},
      {"stream", stream_name(options.stream)},
      {"sched", sched_name(options.sched)},
      {"pid", getpid()},
      {"pod", std::getenv("QUANTA_POD") != nullptr ? std::getenv("QUANTA_POD") : ""},
      {"label", options.label}};
  if (options.lookup == Lookup::getproc || options.lookup == Lookup::getproc_ptds) {
    report["cuda_version"] = options.cuda_version;
  }

  bool ok = false;
  Driver driver;
  if (std::string failure = load_driver(options.lookup, options.cuda_version, driver);
      !failure.empty()) {
    spdlog::error("{}", failure);
    report["error"] = {{"call", "lookup " + std::string(lookup_name(options.lookup))},
                       {"name", failure}};
  } else {
    report["missing_entries"] = driver.missing;
    // Where the lookup path really landed, e.g. the _ptsz variants under getproc-ptds.
    report["entry_points"] = {
        {"cuLaunchKernel", describe_entry(reinterpret_cast<const void*>(driver.LaunchKernel))},
        {"cuStreamSynchronize",
         describe_entry(reinterpret_cast<const void*>(driver.StreamSynchronize))},
        {"cuMemAlloc", describe_entry(reinterpret_cast<const void*>(driver.MemAlloc))}};
    try {
      if (driver.DriverGetVersion != nullptr) {
        init_driver(driver);
        int version = 0;
        check(driver, driver.DriverGetVersion(&version), "cuDriverGetVersion");
        report["driver_version"] = version;
      }
      switch (options.mode) {
        case Mode::batch:
          ok = run_batch(driver, options, report);
          break;
        case Mode::requests:
          ok = run_requests(driver, options, report);
          break;
        case Mode::alloc:
          ok = run_alloc(driver, options, report);
          break;
        case Mode::info:
          ok = run_info(driver, options, report);
          break;
      }
      if (!ok && report.contains("first_error")) {
        spdlog::error("{} failed: {}", report["first_error"]["call"].get<std::string>(),
                      report["first_error"]["name"].get<std::string>());
      }
    } catch (const CudaError& error) {
      spdlog::error("{}", error.what());
      report["error"] = {{"call", error.call()}, {"name", error.name()}};
      ok = false;
    }
  }
  report["ok"] = ok;
  if (options.json) {
    std::cout << report.dump() << std::endl;
  } else {
    print_text(report);
  }
  return ok ? 0 : 1;
}
