// The arbiter daemon: owns the GPUs (control region + scheduler + timer each), the pods
// and their regions, the admitted processes (pidfd each), the tenant and admin sockets and
// the event loop that ties them together. Tenant-socket handling lives in
// tenant_server.cpp, the admin commands in admin_server.cpp, the rest in arbiter.cpp.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <set>
#include <string>
#include <vector>

#include "arbiter/config.h"
#include "arbiter/event_loop.h"
#include "arbiter/pod_registry.h"
#include "arbiter/regions.h"
#include "arbiter/scheduler.h"

namespace quanta::arbiter {

struct Gpu {
  uint32_t index = 0;
  std::string uuid;
  ControlRegionMap region;
  std::unique_ptr<Scheduler> sched;
  Timer timer;
  std::map<SlotId, pid_t> slot_pids;  // admitted slots on this GPU
  bool dirty = true;                  // needs a sync from shared memory and a decision
  // When ControlHeader::waiters last became non-zero (read after the store); 0 while none.
  uint64_t waiters_visible_ns = 0;
};

struct Process {
  pid_t pid = 0;
  UniqueFd pidfd;
  uint32_t pod_index = 0;
  uint32_t proc_index = 0;
  std::map<uint32_t, SlotId> slots;  // GPU index → slot
  int connection = -1;               // its current tenant connection, if any
};

struct Connection {
  UniqueFd sock;
  UniqueFd doorbell;
  pid_t pid = 0;  // from SO_PEERCRED
  uid_t uid = 0;
  bool welcomed = false;
  std::set<uint32_t> control_sent;  // GPUs whose control region travelled on this connection
};

struct AdminConnection {
  UniqueFd sock;
  std::string inbox;
};

// UUIDs that `quantactl drain` left drained (admin_drain.cpp), re-applied at start.
std::set<std::string> load_drained(const NodeConfig& config);

class Arbiter {
 public:
  // Discovers the GPUs, opens or re-adopts the regions, binds the sockets. Throws with
  // one clear line on anything that prevents serving.
  explicit Arbiter(NodeConfig config);
  ~Arbiter();
  // Serves until SIGTERM/SIGINT (or stop()).
  void run();
  void stop() { loop_.stop(); }

  // The admin protocol's dispatcher (also used by tests): one JSON request, one response.
  nlohmann::json handle_admin(const nlohmann::json& request);

 private:
  // arbiter.cpp
  void adopt_previous_state();
  void heartbeat();
  void after_events();
  void sync_and_decide(Gpu& gpu);
  void apply(Gpu& gpu, const std::vector<Action>& actions);
  void on_death(pid_t pid);
  void free_slot(Gpu& gpu, SlotId slot);
  void reclaim_memory(Pod& pod, uint32_t proc_index);
  void apply_policy(Pod& pod);
  void fill_slot(Gpu& gpu, SlotId slot, const Process& proc, const Pod& pod);
  void watch_process(Process& proc);
  common::GateChannel& channel(const Process& proc, uint32_t gpu_index);
  Gpu* gpu_by_uuid(const std::string& uuid);
  std::string managed_list() const;

  // tenant_server.cpp
  void on_tenant_accept();
  void on_tenant_message(int fd);
  void on_doorbell(int fd);
  void close_connection(int fd, const std::string& why);
  void handle_hello(Connection& conn, const std::string& claimed_pod);
  void handle_attach(Connection& conn, const std::string& uuid);
  void refuse(Connection& conn, const std::string& reason);

  // admin_server.cpp
  void on_admin_accept();
  void on_admin_readable(int fd);
  nlohmann::json status_json();
  // admin_drain.cpp
  nlohmann::json handle_drain(const nlohmann::json& request, bool on);
  void save_drained() const;

  NodeConfig config_;
  EventLoop loop_;
  PodRegistry pods_;
  std::vector<std::unique_ptr<Gpu>> gpus_;
  std::map<pid_t, Process> processes_;
  std::map<int, Connection> connections_;
  std::map<int, AdminConnection> admin_connections_;
  UniqueFd tenant_listener_;
  UniqueFd admin_listener_;
  UniqueFd signal_fd_;
  UniqueFd lock_fd_;
  Timer heartbeat_timer_;
  uint64_t generation_ = 0;
  uint64_t started_ns_ = 0;
};

}  // namespace quanta::arbiter
