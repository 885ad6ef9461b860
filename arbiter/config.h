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

struct NodeConfig {
  std::string source;  // the file this came from ("" for built-in defaults)
  std::string scope = "quanta";
  std::string tenant_socket = "/run/quanta/tenant.sock";
  std::string admin_socket = "/run/quanta/admin.sock";
  std::string state_dir = "/var/lib/quanta";
  bool allow_unregistered = false;
  std::vector<std::string> gpus;  // UUIDs to manage; empty = every device NVML reports
  SchedulerConfig scheduler;
  common::Policy defaults;
  std::map<std::string, common::Policy, std::less<>> pods;  // [pod."NAME"], defaults applied

  // The policy of a pod named in the config, or the defaults.
  common::Policy policy_for(const std::string& pod) const;
};

class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

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
