// The shim's settings, read once at first use and cached for the life of the process, so
// no hot path ever calls getenv. The node's settings files (/etc/quanta, settings_file.h)
// are read first; where the node enforces, the QUANTA_* variables that would loosen a cap
// or the gate are ignored (each reported once), so a tenant's environment cannot lift them.
#pragma once

#include <cstdint>

#include "shim/base/log.h"

namespace quanta::shim {

struct Options {
  bool disabled = false;           // QUANTA_DISABLE=1: every wrapper passes straight through
  bool count_managed = true;       // QUANTA_COUNT_MANAGED=0: cuMemAllocManaged goes uncounted
  bool count_managed_set = false;  // ... and it was given (and honoured)
  uint64_t context_overhead_bytes = 300ull << 20;     // QUANTA_CONTEXT_OVERHEAD, per context
  bool context_overhead_set = false;                  // ... given and honoured
  LogLevel log_level = LogLevel::warn;                // QUANTA_LOG_LEVEL
  char socket_path[108] = "/run/quanta/tenant.sock";  // node.conf socket, or QUANTA_SOCKET
  char pod[256] = "";                                 // QUANTA_POD, for unregistered host processes

  // From /etc/quanta/node.conf and container.conf.
  bool enforced = false;          // node.conf enforce = on (its default when the file exists)
  bool unplaced_closed = false;   // refuse CUDA while the arbiter cannot place this process
  char container_pod[256] = "";   // container.conf pod = ns/name (for messages)
};

// The cached options. The first call reads the files and the environment (thread-safe;
// concurrent first callers wait for it); later calls are one acquire load.
const Options& options() noexcept;

}  // namespace quanta::shim
