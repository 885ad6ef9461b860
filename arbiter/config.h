// The node configuration (config/quanta.toml): where the sockets and regions live, the
// scheduler's bounds and the policy defaults and per-pod tables. load_config refuses a bad
// file with file:line:column, the key, the value and what is allowed.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/policy.h"

namespace quanta::arbiter {

struct SchedulerConfig {
  uint64_t quantum_ns = 20'000'000;          // node default quantum
  uint64_t quantum_min_ns = 1'000'000;       // bounds every pod's quantum; also the minimum
  uint64_t quantum_max_ns = 100'000'000;     // hold before an interactive tenant preempts
  uint64_t revoke_timeout_ns = 500'000'000;  // a holder that ignores a revoke is passed over
  uint64_t lease_ns = 1'000'000'000;         // tenants lapse to ungated launches after this
  uint64_t idle_release_ns = 2'000'000;      // an idle holder is revoked early when others wait
  bool drain_overlap = true;  // an interactive preemptor starts while the old holder drains
};

// What the node enforces against tenants (see SECURITY.md). Applies to processes in
// registered containers; host processes admitted under allow_unregistered are development
// processes and keep their QUANTA_* variables.
enum class UnplacedAction {
  kOpen,            // a process the arbiter cannot place runs ungated and uncapped
  kClosed,          // it is refused CUDA (or capped at zero)
  kClosedIfCapped,  // closed for pods that asked for a memory limit, open for the rest
};
enum class OverCapAction { kReport, kDeny, kKill };  // NVML shows a pod above its cap

struct EnforceConfig {
  // true: the shim takes its limits from the arbiter and ignores QUANTA_* variables that
  // would loosen them (QUANTA_DISABLE, QUANTA_COUNT_MANAGED, QUANTA_CONTEXT_OVERHEAD,
  // QUANTA_SOCKET). false: those variables are honoured everywhere.
  bool enforce = true;
  UnplacedAction unplaced = UnplacedAction::kClosedIfCapped;
  OverCapAction over_cap = OverCapAction::kReport;
};

// Settings the arbiter hands every shim in its Welcome.
struct ShimConfig {
  uint64_t context_overhead = 300ull << 20;  // bytes charged per CUDA context
  bool count_managed = true;                 // cuMemAllocManaged counts against the cap
};

struct MetricsConfig {
  std::string listen;  // "HOST:PORT" of the Prometheus endpoint; "" = not served
};

struct NodeConfig {
  std::string source;  // the file this came from ("" for built-in defaults)
  std::string scope = "quanta";
  std::string tenant_socket = "/run/quanta/tenant.sock";
  std::string admin_socket = "/run/quanta/admin.sock";
  std::string state_dir = "/var/lib/quanta";
  bool allow_unregistered = false;
  std::vector<std::string> gpus;  // UUIDs to manage; empty = every device NVML reports
  SchedulerConfig scheduler;
  EnforceConfig enforce;
  ShimConfig shim;
  MetricsConfig metrics;
  common::Policy defaults;
  std::map<std::string, common::Policy, std::less<>> pods;  // [pod."NAME"], defaults applied

  // The policy of a pod named in the config, or the defaults.
  common::Policy policy_for(const std::string& pod) const;
};

class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

const char* unplaced_name(UnplacedAction a);
const char* over_cap_name(OverCapAction a);

// Parses and validates a config file; throws ConfigError with one clear line.
NodeConfig load_config(const std::string& path);
// Same, from text (tests); `source_name` is used in messages.
NodeConfig parse_config(const std::string& text, const std::string& source_name);

// Applies one policy key ("weight", "priority", "max_share"/"max-share",
// "memory_limit"/"memory-limit", "quantum"; also with the annotation prefix "quanta.dev/")
// given as text. Returns "" or an error line.
std::string apply_policy_value(common::Policy* policy, const std::string& key,
                               const std::string& value);

}  // namespace quanta::arbiter
