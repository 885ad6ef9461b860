// The integration harness: one private quanta-arbiter per test (temp config, unique scope,
// sockets in a temp dir), tenants spawned with or without libquanta.so preloaded on a
// private simgpu world, and readers for what proves the promises independently of the code
// under test: the simgpu execution log and the arbiter's regions (sealed memfds, reached
// through the arbiter's descriptors).
#pragma once

#include <sys/types.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/shm_layout.h"
#include "tests/support/child.h"
#include "tests/support/temp_dir.h"

namespace quanta::integration {

// The test-support library's temp folders and child processes, under the names these
// suites have always used.
using test_support::Child;
using test_support::Env;
using test_support::expect_clean_exit;
using test_support::process_stopped;
using test_support::read_file;
using test_support::TempDir;

uint64_t monotonic_ns();
int64_t realtime_ns();
constexpr uint64_t kMs = 1000000ull;
// The running gtest's name (arbiter scopes and folders are named after it).
std::string test_name();
// A `--start-at` value (CLOCK_REALTIME ns) `ms` from now, so tenants start together.
std::string start_in(double ms);

struct PodConfig {
  std::string name;
  int weight = 1;
  std::string memory_limit;  // "" = none
};

struct ArbiterConfig {
  bool allow_unregistered = true;
  std::string quantum = "20ms";
  std::string revoke_timeout = "500ms";
  std::string lease = "400ms";
  std::string idle_release = "10ms";
  std::vector<PodConfig> pods;
  // Both sockets in a folder of their own (<dir>/run/tenant.sock, admin.sock), laid out as
  // /run/quanta is on a node, so containers can mount the tenant socket's folder.
  bool sockets_in_run_dir = false;
  std::string nvml_interval{};  // [node] nvml_interval ("" = the default)
  std::string extra{};  // appended to the config as it is ("[enforce]\nover_cap = \"kill\"\n")
};

// More of a world than most tests need.
struct WorldExtras {
  Env sim_env;  // SIMGPU_* settings of this world (e.g. SIMGPU_MEMORY)
};

// One simgpu world and one arbiter managing it. Tenants spawned through it share both.
class World {
 public:
  explicit World(const std::string& test_name, ArbiterConfig config = {}, WorldExtras extras = {});
  ~World();

  // Starts (or restarts) the arbiter and waits until its tenant socket accepts connections:
  // this build's, or the quanta-arbiter at `binary` (another release's).
  void start_arbiter(const std::string& binary = "");
  void kill_arbiter(int sig);  // sends sig and reaps it
  Child& arbiter() { return arbiter_; }
  // The running arbiter's pid (0 when none); safe to read from any thread.
  pid_t arbiter_pid() const { return arbiter_pid_.load(); }
  std::string arbiter_log() const;

  // One admin request over the admin socket; {"ok": false, ...} when it cannot be asked.
  nlohmann::json admin(const nlohmann::json& request) const;
  // The pids the arbiter's status lists as connected tenants, on any GPU.
  std::set<pid_t> connected_pids() const;

  const std::string& tenant_socket() const { return tenant_socket_; }
  const std::string& admin_socket() const { return admin_socket_; }
  const std::string& config_path() const { return config_path_; }
  const std::string& scope() const { return scope_; }
  const std::string& sim_state() const { return sim_state_; }
  const std::string& sim_log_path() const { return sim_log_; }
  const TempDir& dir() const { return dir_; }

  // Environment of a process on this world's simgpu, optionally with the shim preloaded.
  Env tenant_env(const std::string& pod, bool preload) const;
  // quanta-tenant --json ARGS...
  Child spawn_tenant(const std::vector<std::string>& args, const std::string& pod, bool preload, Env extra = {});
  Child spawn(const std::vector<std::string>& argv, const Env& env);
  // Runs argv as a process of a Quanta node: /etc/quanta/node.conf and container.conf hold
  // the given texts ("" = no such file), in a private mount namespace (with_quanta_etc).
  // Needs root; the test skips otherwise (check node_files_supported()).
  Child spawn_on_node(const std::string& node_conf, const std::string& container_conf,
                      const std::vector<std::string>& argv, const Env& env);
  static bool node_files_supported();
  std::string file(const std::string& name) const { return dir_.file(name); }

 private:
  std::string name_;
  ArbiterConfig config_;
  WorldExtras extras_;
  TempDir dir_;
  std::string scope_;
  std::string sim_state_;
  std::string sim_log_;
  std::string tenant_socket_;
  std::string admin_socket_;
  std::string config_path_;
  Child arbiter_;
  std::atomic<pid_t> arbiter_pid_{0};
  int arbiter_runs_ = 0;
  int spawned_ = 0;
};

// One line of simgpu's execution log: a slice of device time given to one context.
struct Slice {
  int device = 0;
  uint64_t context = 0;
  pid_t pid = 0;
  uint64_t start_ns = 0;
  uint64_t end_ns = 0;
};
std::vector<Slice> read_sim_log(const std::string& path);

// Consecutive slices of one pid on device 0 merged: who had the engine, from when to when.
struct Hold {
  pid_t pid = 0;
  uint64_t start_ns = 0;
  uint64_t end_ns = 0;
};
std::vector<Hold> holds_of(const std::vector<Slice>& slices);

// Device busy time per pid within [from, to).
std::map<pid_t, uint64_t> busy_by_pid(const std::vector<Slice>& slices, uint64_t from, uint64_t to);

// Opens one of the arbiter's regions by its memfd name ("<scope>.gpu.0") among the running
// arbiter's descriptors, of shared-memory `layout` when not 0 (a GPU serving pods of the
// previous release has a control region of each): -1 when there is none.
int open_arbiter_region(const World& world, const std::string& name, int flags, uint32_t layout = 0);

// Read-only views of the arbiter's regions as they are now (a restarted arbiter makes new
// control regions: make a new view; pod regions of live tenants carry over).
class ControlView {
 public:
  ControlView(const World& world, uint32_t gpu_index);
  ~ControlView();
  bool ok() const { return region_ != nullptr; }
  const common::ControlRegion* operator->() const { return region_; }
  // The slot this pid was admitted to, or kNoSlot. The control region names no process, so
  // this reads the slot the arbiter wrote in the process's pod region (GateLimits::slot) and
  // checks that the control slot is in use.
  uint32_t slot_of(pid_t pid) const;

 private:
  const World& world_;
  uint32_t gpu_index_;
  const common::ControlRegion* region_ = nullptr;
};

class PodView {
 public:
  PodView(const World& world, uint32_t pod_index);
  ~PodView();
  bool ok() const { return region_ != nullptr; }
  const common::PodRegion* operator->() const { return region_; }

 private:
  const common::PodRegion* region_ = nullptr;
};

// Finds the pod region whose key is `pod_key` (scans <scope>.pod.<i>); -1 when none.
int find_pod_region(const World& world, const std::string& pod_key);

void sleep_ms(double ms);

// Polls `predicate` every millisecond until it holds or `timeout_s` passes.
template <typename Predicate>
bool eventually(double timeout_s, Predicate predicate) {
  const uint64_t deadline = monotonic_ns() + static_cast<uint64_t>(timeout_s * 1e9);
  while (!predicate()) {
    if (monotonic_ns() > deadline) return false;
    sleep_ms(1);
  }
  return true;
}

}  // namespace quanta::integration
