// The shim's settings, read once from the environment at first use and cached for the
// life of the process, so no hot path ever calls getenv.
#pragma once

#include <cstdint>

#include "shim/log.h"

namespace quanta::shim {

struct Options {
  bool disabled = false;      // QUANTA_DISABLE=1: every wrapper passes straight through
  bool count_managed = true;  // QUANTA_COUNT_MANAGED=0: cuMemAllocManaged goes uncounted
  uint64_t context_overhead_bytes = 300ull << 20;     // QUANTA_CONTEXT_OVERHEAD, per context
  LogLevel log_level = LogLevel::warn;                // QUANTA_LOG_LEVEL
  char socket_path[108] = "/run/quanta/tenant.sock";  // QUANTA_SOCKET (sun_path size)
  char pod[256] = "";                                 // QUANTA_POD, for unregistered host processes
};

// The cached options. The first call reads the environment (thread-safe; concurrent first
// callers wait for it); later calls are one acquire load.
const Options& options() noexcept;

// Parses "1048576", "300Mi", "2Gi", "512Ki", "1Ti" into bytes. False on anything else.
bool parse_byte_size(const char* text, uint64_t* bytes) noexcept;

}  // namespace quanta::shim
