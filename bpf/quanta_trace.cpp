// quanta-trace: bounded eBPF tracing sessions for Quanta (off-CPU and run-queue latency of
// tenants, GPU handoff latency from Quanta's USDT probes). Parses the command line and
// hands over to one tool; every failure ends here as one line on stderr and exit code 1.
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>

#include "session.h"
#include "tools.h"

int main(int argc, char** argv) {
  using namespace quanta::bpf;
  // Reports go to stdout; progress and errors to stderr, so `--json` output stays clean.
  auto logger = spdlog::stderr_logger_mt("quanta-trace");
  logger->set_pattern("quanta-trace: %^%l%$: %v");
  logger->flush_on(spdlog::level::trace);  // callers wait for the "Tracing" line
  spdlog::set_default_logger(logger);

  CLI::App app{"quanta-trace: bounded eBPF tracing sessions for Quanta"};
  app.require_subcommand(1);
  bool verbose = false;
  app.add_flag("-v,--verbose", verbose, "Show libbpf's own messages");

  OffcpuOptions offcpu;
  auto* offcpu_cmd = app.add_subcommand(
      "offcpu", "Run-queue latency and off-CPU time of processes, as log2 histograms");
  offcpu_cmd->add_option("-p,--pid", offcpu.pids, "Process (tgid) to trace; repeatable")
      ->required();
  offcpu_cmd->add_option("-d,--duration", offcpu.duration_s, "Seconds to trace")
      ->check(CLI::PositiveNumber);
  offcpu_cmd->add_flag("--json", offcpu.json, "Print one JSON object instead of text");
  offcpu_cmd->add_option("--prometheus", offcpu.prometheus_file,
                         "Also write the histograms in Prometheus text format to FILE");

  HandoffOptions handoff;
  auto* handoff_cmd = app.add_subcommand(
      "handoff", "GPU handoff latency and gate wait from the quanta:* USDT probes of a binary");
  handoff_cmd
      ->add_option("-b,--binary", handoff.binaries,
                   "Executable or library holding quanta:* probes (repeat: libquanta.so for gate "
                   "and release probes, quanta-arbiter for grants)")
      ->required();
  handoff_cmd->add_option("-p,--pid", handoff.pids,
                          "Trace only these processes (default: all that map the binary)");
  handoff_cmd->add_option("-d,--duration", handoff.duration_s, "Seconds to trace")
      ->check(CLI::PositiveNumber);
  handoff_cmd->add_flag("--json", handoff.json, "Print one JSON object instead of text");
  handoff_cmd->add_option("--timeline", handoff.timeline_file,
                          "Write a Chrome/Perfetto trace JSON timeline to FILE");
  handoff_cmd->add_option("--prometheus", handoff.prometheus_file,
                          "Also write the histograms in Prometheus text format to FILE");

  CLI11_PARSE(app, argc, argv);
  if (verbose) spdlog::set_level(spdlog::level::debug);
  install_libbpf_logging(verbose);

  try {
    if (*offcpu_cmd) return run_offcpu(offcpu);
    return run_handoff(handoff);
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
}
