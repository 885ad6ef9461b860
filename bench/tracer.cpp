// Runs quanta-trace handoff beside a run and reads its timeline's handoff intervals.
#include "tracer.h"

#include <nlohmann/json.hpp>

#include <thread>

namespace quanta::bench {

HandoffTracer::HandoffTracer(Run& run, double seconds) : run_(run), seconds_(seconds) {
  const Paths& paths = run.bench().paths();
  if (!file_exists(paths.trace)) {
    error_ = "quanta-trace is not built (" + paths.trace + ")";
    return;
  }
  if (!file_exists(paths.shim)) {
    error_ = "libquanta.so is not built";
    return;
  }
  timeline_path_ = run.dir() + "/handoff-timeline.json";
  process_ = std::make_unique<Process>(run.spawn({paths.trace, "handoff", "--binary", paths.shim, "--duration",
                                                  std::to_string(seconds), "--json", "--timeline", timeline_path_},
                                                 "", false, "trace"));
  // Attached once it announces the session; loading BPF takes a few hundred ms.
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < until) {
    if (read_file(process_->stderr_path()).find("Tracing") != std::string::npos) return;
    if (!process_->running()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::string tail = last_line(read_file(process_->stderr_path()));
  error_ = "quanta-trace handoff did not attach" + (tail.empty() ? std::string() : ": " + tail);
  process_->stop(std::chrono::milliseconds(500));
}

HandoffTracer::~HandoffTracer() = default;

std::vector<double> HandoffTracer::finish() {
  std::vector<double> handoffs_us;
  if (!error_.empty() || !process_) return handoffs_us;
  ExitStatus status = process_->wait(std::chrono::milliseconds(static_cast<int64_t>((seconds_ + 15) * 1000)));
  if (!status.exited || status.code != 0) {
    error_ = "quanta-trace handoff ended with " + status.describe() + ": " + last_line(read_file(process_->stderr_path()));
    return handoffs_us;
  }
  try {
    auto timeline = nlohmann::json::parse(read_file(timeline_path_));
    for (const auto& event : timeline.at("traceEvents")) {
      if (event.value("name", "") == "handoff" && event.contains("dur")) handoffs_us.push_back(event["dur"].get<double>());
    }
    if (timeline.contains("otherData") && timeline["otherData"].value("events_lost", 0) > 0) {
      error_ = "quanta-trace lost " + std::to_string(timeline["otherData"].value("events_lost", 0)) + " timeline events";
    }
  } catch (const std::exception& parse_error) {
    error_ = std::string("cannot read the quanta-trace timeline: ") + parse_error.what();
  }
  return handoffs_us;
}

}  // namespace quanta::bench
