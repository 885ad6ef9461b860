// quanta-tenant's command line: one subcommand per workload mode, common options that
// may come before or after it, and the one-line errors for values out of range.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tests/tenant/driver.h"

namespace quanta::tenant {

enum class Mode { batch, requests, alloc, info };
enum class ContextKind { primary, own };
enum class StreamKind { created, null };
// How the host thread waits in synchronize calls (the context's CU_CTX_SCHED_* flag).
enum class SchedKind { automatic, spin, yield, blocking };
enum class AllocFamily {
  alloc,
  pitch,
  managed,
  host,
  vmm,
  async,
  pool,
  array,
  array3d,
  mipmapped,
  graph_node
};

struct Options {
  Mode mode = Mode::batch;
  // common
  int device = 0;
  bool json = false;
  std::string pod;
  std::string label;
  std::optional<std::int64_t> start_at_ns;  // CLOCK_REALTIME
  ContextKind context = ContextKind::primary;
  StreamKind stream = StreamKind::created;
  SchedKind sched = SchedKind::automatic;
  Lookup lookup = Lookup::direct;
  int cuda_version = 12080;
  // batch and requests
  double seconds = 5.0;
  double kernel_ms = 2.0;
  int depth = 2;
  double think_ms = 0.0;      // batch: host time after each completion before the next launch
  bool launch_times = false;  // batch: report each launch's CLOCK_MONOTONIC time
  int warmup =
      1;  // untimed kernels (1 us each) before the start, so lazy module loading is not measured
  double rate = 50.0;
  // alloc
  AllocFamily family = AllocFamily::alloc;
  std::uint64_t bytes = 64ull << 20;
  std::optional<std::uint64_t> count;  // default 1, unlimited with --race
  double hold_ms = 0.0;
  bool free_each = false;
  bool race = false;
};

struct ParseResult {
  std::optional<Options> options;  // empty: exit with exit_code after printing message
  int exit_code = 0;
  std::string message;  // help text (exit 0) or the one-line error (exit 2)
};

ParseResult parse_options(int argc, char** argv);

std::string mode_name(Mode mode);
std::string family_name(AllocFamily family);
std::string context_name(ContextKind kind);
std::string stream_name(StreamKind kind);
std::string sched_name(SchedKind kind);

// "64Mi" -> 67108864. Empty on anything that is not a whole size.
std::optional<std::uint64_t> parse_bytes(const std::string& text);

}  // namespace quanta::tenant
