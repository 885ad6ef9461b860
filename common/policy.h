// Per-pod scheduling and memory policy, and the parsers for its textual forms (pod
// annotations, node config, quantactl). Parsers return false and fill a message naming
// what was wrong and what is allowed; they never throw or allocate.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace quanta::common {

enum class Priority : uint32_t { kInteractive = 0, kBatch = 1, kBestEffort = 2 };

constexpr uint32_t kMinWeight = 1;
constexpr uint32_t kMaxWeight = 1000;
constexpr uint32_t kShareScale = 1000000;  // max_share in parts per million

struct Policy {
  uint32_t weight = 1;
  Priority priority = Priority::kBatch;
  uint32_t max_share_ppm = kShareScale;  // 1.0 = no ceiling
  uint32_t min_share_ppm = 0;            // guaranteed share while it wants the GPU; 0 = none
  uint64_t memory_limit = 0;             // bytes per GPU for the whole pod; 0 = none
  uint64_t quantum_ns = 0;               // preferred quantum; 0 = node default
};

// A fixed buffer for one error line, so parsers stay allocation-free.
struct ParseError {
  char text[256] = {};
};

// "1".."1000".
bool parse_weight(std::string_view text, uint32_t* out, ParseError* err);
// "interactive", "batch", "best-effort".
bool parse_priority(std::string_view text, Priority* out, ParseError* err);
// A fraction in (0, 1] ("0.3") or a percentage ("30%").
bool parse_share(std::string_view text, uint32_t* out_ppm, ParseError* err);
// Bytes with an optional Kubernetes quantity suffix: "1048576", "512Mi", "10Gi", "2G", "1.5Gi".
// The one grammar of sizes in config files, annotations, the environment and quantactl.
bool parse_bytes(std::string_view text, uint64_t* out, ParseError* err);
// The same, or "0" (nothing): a charge that may be turned off ([shim] context_overhead,
// QUANTA_CONTEXT_OVERHEAD).
bool parse_bytes_or_zero(std::string_view text, uint64_t* out, ParseError* err);
// A duration with a unit: "500us", "20ms", "1s", "5m", "1h" (also "ns"); bare numbers are
// refused. The one grammar of durations in config files, annotations and the environment.
bool parse_duration(std::string_view text, uint64_t* out_ns, ParseError* err);
// The same on a command line, where a plain number is seconds ("30" = "30s"), as every
// tool's --duration and --timeout has always taken it.
bool parse_command_duration(std::string_view text, uint64_t* out_ns, ParseError* err);

const char* priority_name(Priority p);

}  // namespace quanta::common
