// Handoff latencies from Quanta's own USDT probes, through `quanta-trace handoff`: it
// runs beside a quanta configuration and its timeline gives every release-to-next-launch
// interval exactly (the log2 histogram of its report is only a fallback).
#pragma once

#include "harness.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace quanta::bench {

class HandoffTracer {
 public:
  // Starts tracing the shim's probes for `seconds`; waits until the probes are attached.
  HandoffTracer(Run& run, double seconds);
  ~HandoffTracer();
  bool attached() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  // Waits for the session to end; returns every handoff in microseconds (empty with
  // error() set when the tracer failed).
  std::vector<double> finish();

 private:
  Run& run_;
  std::unique_ptr<Process> process_;
  std::string timeline_path_;
  std::string error_;
  double seconds_;
};

}  // namespace quanta::bench
