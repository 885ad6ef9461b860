// quanta-trace: bounded eBPF tracing sessions for Quanta (a node-wide session over every
// arbiter, shim and driver user; off-CPU and run-queue latency of tenants; GPU handoff
// latency from the probes of given binaries). Parses the command line and hands over to
// one tool; every failure ends here as one line on stderr and exit code 1.
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>

#include "bpf/tools.h"
#include "bpf/trace_run.h"
#include "common/policy.h"
#include "common/version.h"

namespace {

// --duration on every tool: seconds ("30"), or a number with a unit ("500ms", "2s", "5m").
void add_duration(CLI::App* tool, double* seconds, const std::string& help) {
  tool->add_option_function<std::string>(
      "-d,--duration",
      [seconds](const std::string& text) {
        quanta::common::ParseError err;
        uint64_t ns = 0;
        if (!quanta::common::parse_command_duration(text, &ns, &err))
          throw CLI::ValidationError("--duration", err.text);
        *seconds = static_cast<double>(ns) / 1e9;
      },
      help + ": seconds (30) or a number with a unit (500ms, 2s, 5m)");
}

}  // namespace

int main(int argc, char** argv) {
  using namespace quanta::bpf;
  // Reports go to stdout; progress and errors to stderr, so `--json` output stays clean.
  auto logger = spdlog::stderr_logger_mt("quanta-trace");
  logger->set_pattern("quanta-trace: %^%l%$: %v");
  logger->flush_on(spdlog::level::trace);  // callers wait for the "Tracing" line
  spdlog::set_default_logger(logger);

  CLI::App app{"quanta-trace: bounded eBPF tracing sessions for Quanta"};
  app.set_version_flag("--version", quanta::common::version_line("quanta-trace"));
  app.require_subcommand(1);
  bool verbose = false;
  app.add_flag("-v,--verbose", verbose, "Show libbpf's own messages");

  OffcpuOptions offcpu;
  auto* offcpu_cmd = app.add_subcommand(
      "offcpu", "Run-queue latency and off-CPU time of processes, as log2 histograms");
  offcpu_cmd->add_option("-p,--pid", offcpu.pids, "Process (tgid) to trace; repeatable")
      ->required();
  add_duration(offcpu_cmd, &offcpu.duration_s, "How long to trace (default 5 s)");
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
  add_duration(handoff_cmd, &handoff.duration_s, "How long to trace (default 5 s)");
  handoff_cmd->add_flag("--json", handoff.json, "Print one JSON object instead of text");
  handoff_cmd->add_option("--timeline", handoff.timeline_file,
                          "Write a Chrome/Perfetto trace JSON timeline to FILE");
  handoff_cmd->add_option("--prometheus", handoff.prometheus_file,
                          "Also write the histograms in Prometheus text format to FILE");

  SessionOptions session;
  auto* session_cmd = app.add_subcommand(
      "session",
      "Trace the whole node: every arbiter, libquanta.so and libcuda.so.1 user, found by itself");
  add_duration(session_cmd, &session.duration_s, "How long to trace (default 30 s)");
  session_cmd->add_option("--gpu", session.gpu, "Report only this GPU or MIG instance: its UUID (GPU-…, MIG-…) or its index, as quantactl takes it");
  session_cmd->add_option("--pod", session.pod, "Report only this pod: namespace/name, or its name alone when no other pod has it, as quantactl takes it");
  session_cmd->add_option("--perfetto", session.perfetto_file,
                          "Write a Perfetto/Chrome trace (JSON) to FILE (open at ui.perfetto.dev)");
  session_cmd->add_option("--svg", session.svg_file, "Write an SVG timeline to FILE");
  session_cmd
      ->add_option("--svg-window", session.svg_window_s,
                   "Seconds the SVG shows (default: about forty quanta around the middle)")
      ->check(CLI::NonNegativeNumber);
  session_cmd->add_flag("--json", session.json, "Print one JSON object instead of text");
  session_cmd->add_flag("!--no-driver", session.driver,
                        "Do not attach uprobes to libcuda.so.1 (they cost ~1-2 us per launch)");

  bool raw_tracepoints = false;
  app.add_flag("--raw-tracepoints", raw_tracepoints,
               "Attach raw scheduler tracepoints even where BTF ones work (the fallback for "
               "kernels without them)");

  // The global flags may also follow the tool's name.
  for (CLI::App* tool : {offcpu_cmd, handoff_cmd, session_cmd}) tool->fallthrough();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // a usage error exits 2, as other tools' do
  }
  offcpu.raw_tracepoints = raw_tracepoints;
  session.raw_tracepoints = raw_tracepoints;
  if (verbose) spdlog::set_level(spdlog::level::debug);
  install_libbpf_logging(verbose);

  try {
    if (*offcpu_cmd) return run_offcpu(offcpu);
    if (*session_cmd) return run_session(session);
    return run_handoff(handoff);
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
}
