// The node configuration (config/quanta.toml): where the sockets and regions live, the
// scheduler's bounds and the policy defaults and per-pod tables. load_config refuses a bad
// file with file:line:column, the key, the value and what is allowed.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "common/policy.h"
#include "config/fit_probe.h"

namespace quanta::config {

// [scheduler]: the one place its defaults are declared (the arbiter's SchedulerOptions
// extends it).
struct SchedulerConfig {
  uint64_t quantum_ns = 20'000'000;          // node default quantum
  uint64_t quantum_min_ns = 1'000'000;       // bounds every pod's quantum; also the minimum
  uint64_t quantum_max_ns = 100'000'000;     // hold before an interactive tenant preempts
  uint64_t revoke_timeout_ns = 500'000'000;  // a holder that ignores a revoke is passed over
  uint64_t lease_ns = 1'000'000'000;         // tenants lapse to ungated launches after this
  uint64_t idle_release_ns = 2'000'000;      // an idle holder is revoked early when others wait
  // An interactive tenant preempting a lower class starts at once while the old holder
  // drains its queued work (false: strictly one tenant on the GPU at a time, and the holder
  // keeps quantum_min first).
  bool drain_overlap = true;
  // How late a quantum may end, in ppm of the quantum, when the arbiter serves another GPU's
  // deadline then (0: every quantum ends on time). The extra time is charged like the rest
  // of the hold, so shares do not move; only the quantum's length does.
  uint32_t quantum_slack_ppm = 100'000;
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
  // What holds a cap against a pod that lies about its usage (its ledger words are its own
  // to write): NVML's per-process count, acted on at each sample.
  OverCapAction over_cap = OverCapAction::kKill;
};

// Settings the arbiter hands every shim in its Welcome.
struct ShimConfig {
  // Bytes charged per CUDA context: measured on the node's GPUs at start
  // (context_overhead.h) unless the config gives a size.
  bool measure_context_overhead = true;
  uint64_t context_overhead = 0;
  bool count_managed = true;  // cuMemAllocManaged counts against the cap
};

// What quanta-hook does at container creation (the other half of its behaviour follows
// [enforce] unplaced).
struct HookConfig {
  // The most one hook invocation waits for the arbiter's answer; past it the arbiter counts
  // as unreachable and [enforce] unplaced decides. The whole invocation gives up at twice
  // this (a hung driver), refusing the container.
  uint64_t timeout_ns = 5'000'000'000;
};

// What a pod's annotations may ask for ([bounds], and per namespace [namespace."NAME"]):
// pods choose their own annotations, so the node says how far they may go. Checked at
// registration, before `quantactl set` overrides (the node's own word is not bounded).
struct PolicyBounds {
  uint32_t max_weight = common::kMaxWeight;
  uint32_t priorities = 0b111;  // bit (1 << Priority) set: that priority may be asked for
  uint32_t max_min_share_ppm = common::kShareScale;        // one pod's min-share
  uint32_t namespace_min_share_ppm = common::kShareScale;  // a namespace's pods on one GPU
  bool memory_limit_required = false;  // every pod ends with a cap (its own or [defaults])
  uint64_t max_memory_limit = 0;  // a ceiling on a pod's cap; 0 = none (then "none" is refused)

  bool allows(common::Priority p) const { return (priorities >> static_cast<uint32_t>(p)) & 1u; }
};

struct MetricsConfig {
  std::string listen;  // "HOST:PORT" of the Prometheus endpoint; "" = not served
  // Pod sizes the capacity metrics count room for (quanta_gpu_pods_fit, quanta_node_pods_fit).
  std::vector<FitProbe> fit_probes = default_fit_probes();

  static std::vector<FitProbe> default_fit_probes();
};

struct NodeConfig {
  std::string source;  // the file this came from ("" for built-in defaults)
  std::string scope = "quanta";
  std::string tenant_socket = "/run/quanta/tenant.sock";
  // Not in the tenant socket's folder: that folder is mounted into every GPU container.
  std::string admin_socket = "/run/quanta-admin/admin.sock";
  std::string state_dir = "/var/lib/quanta";
  bool allow_unregistered = false;
  std::vector<std::string> gpus;  // UUIDs to manage; empty = every device NVML reports
  // How often NVML's per-process view is read (nvml_sampler.h): reconciliation with the
  // registry ([enforce] over_cap, unmanaged processes) and per-pod utilisation. 0 = never.
  uint64_t nvml_interval_ns = 1'000'000'000;
  // The arbiter's nice value, -20 to 19 (cpu_priority.h): below the tenants' 0 by default,
  // so the wake-ups that hand each GPU on do not queue behind the tenants' threads.
  int nice = -10;
  SchedulerConfig scheduler;
  EnforceConfig enforce;
  ShimConfig shim;
  HookConfig hook;
  MetricsConfig metrics;
  common::Policy defaults;
  std::map<std::string, common::Policy, std::less<>> pods;  // [pod."NAME"], defaults applied
  PolicyBounds bounds;  // [bounds]: every namespace without a table of its own
  std::map<std::string, PolicyBounds, std::less<>> namespace_bounds;  // [namespace."NAME"]

  // The policy of a pod named in the config, or the defaults.
  common::Policy policy_for(const std::string& pod) const;
  // The bounds of a namespace ("" for pods outside Kubernetes).
  const PolicyBounds& bounds_for(std::string_view ns) const;
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
// "min_share"/"min-share", "memory_limit"/"memory-limit", "quantum"; also with the
// annotation prefix "quanta.dev/") given as text. Returns "" or an error line.
std::string apply_policy_value(common::Policy* policy, const std::string& key,
                               const std::string& value);
// What is wrong with a whole policy once every key is applied ("" when nothing): a
// minimum share above the pod's own ceiling.
std::string policy_error(const common::Policy& policy);

// Whether `policy` (the defaults with the pod's annotations `asked` applied) stays within
// `bounds`; "" or one line naming the annotation, its value, what the bounds allow and
// where they are set (`where`: "[bounds]" or "[namespace.\"NAME\"]").
std::string bounds_error(const PolicyBounds& bounds, const std::string& where,
                         const common::Policy& policy,
                         const std::map<std::string, std::string>& asked);

}  // namespace quanta::config
