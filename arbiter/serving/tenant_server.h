// The tenant socket's transport: accepting connections, binding each to its live peer
// process (peer_identity.h), bounding what callers that never say Hello may hold, reading
// packets without ever accepting descriptors, and passing regions back. What a Hello or an
// Attach means is decided behind TenantApi; this file never touches pods, GPUs or slots.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>

#include "arbiter/loop/event_loop.h"
#include "arbiter/loop/fd_reaper.h"
#include "arbiter/loop/log_limit.h"
#include "arbiter/loop/unix_socket.h"
#include "arbiter/serving/peer_identity.h"
#include "arbiter/serving/tenant_protocol.h"
#include "common/wire.h"

namespace quanta::arbiter {

// What the arbiter answers to a Hello.
struct Admission {
  bool admitted = false;
  std::string reason;  // refused: why, for the tenant and the log
  common::RefusedAction action = common::RefusedAction::kRunOpen;
  uint32_t pod_index = 0;
  uint32_t proc_index = 0;
  std::string pod_key;
  int pod_fd = -1;  // borrowed: the pod region to send
  uint64_t generation = 0;
  uint32_t flags = 0;  // common::kWelcome*
  uint32_t count_managed = 1;
  uint64_t context_overhead = 0;
};

// What the arbiter answers to an Attach.
struct Attachment {
  bool attached = false;
  std::string reason;
  common::RefusedAction action = common::RefusedAction::kRunOpen;
  uint32_t gpu_index = 0;
  uint32_t slot = 0;
  int control_fd =
      -1;  // borrowed: the GPU's control region (sent once per connection); -1 for an observer
  uint64_t memory_cap = 0;  // the pod's cap on that GPU (observers' views)
  uint32_t owner = 0;       // the slot's owner word (ControlSlot::owner); 0 for an observer
};

// The arbiter as the tenant server sees it.
class TenantApi {
 public:
  virtual ~TenantApi() = default;
  // A live, identified process said Hello from `cgroup`; its shim maps shared-memory
  // layout `layout` (common::layout_of_protocol of its Hello).
  virtual Admission admit(const PeerIdentity& peer, const std::string& cgroup,
                          const std::string& claimed_pod, uint32_t layout) = 0;
  // An admitted process asks for a GPU.
  // The Attach as parsed: a process that only reads memory views (NVML, `observe`) gets no
  // slot and is never scheduled.
  virtual Attachment attach(pid_t pid, const TenantMessage& request) = 0;
  // A process was refused at the door (counted by the metrics), for `reason`.
  virtual void refused(const std::string& reason) = 0;
  // An admitted process rang its doorbell (it published a want or a release).
  virtual void rang(pid_t pid) = 0;
};

struct TenantLimits {
  uint64_t hello_deadline_ns = 2'000'000'000;  // a connection must say Hello within this
  size_t max_pending = 1024;                   // connections not welcomed yet, in all
  size_t max_pending_per_cgroup = 16;          // ... from one cgroup
  size_t max_pending_per_pid = 4;              // ... from one process
  size_t max_connections = 8192;               // all connections
  // Tests only: take descriptors like a kernel without SO_PASSRIGHTS (they go to the reaper).
  bool accept_rights = false;
};

class TenantServer {
 public:
  // Listens on `path` (mode 0666). Throws std::runtime_error on failure.
  TenantServer(EventLoop& loop, TenantApi& api, FdReaper& reaper, LogLimiter& log,
               const std::string& path, TenantLimits limits, bool allow_peer_pidfd);
  ~TenantServer();
  TenantServer(const TenantServer&) = delete;
  TenantServer& operator=(const TenantServer&) = delete;

  // Listens on the path again when its socket file was removed or replaced (called from
  // the heartbeat): processes that start later can still reach the arbiter.
  void keep_listening();
  // The process died: its connection is closed now rather than at end of stream.
  void drop_process(pid_t pid);
  size_t connections() const { return connections_.size(); }
  size_t pending() const { return pending_.size(); }
  // Whether the kernel refuses descriptors on tenant connections (SO_PASSRIGHTS, 6.16+);
  // otherwise any that arrive are closed by the reaper.
  bool rights_refused() const { return rights_refused_; }

 private:
  struct Connection {
    UniqueFd sock;
    PeerIdentity peer;
    std::string cgroup;
    uint64_t accepted_ns = 0;
    bool welcomed = false;
    // The tenant protocol its Hello spoke (0 before one): every reply is in it, and every
    // later message must speak it too.
    uint32_t protocol = 0;
    UniqueFd doorbell;
    std::set<uint32_t> control_sent;  // GPUs whose control region travelled on it
  };

  UniqueFd open_listener();  // bound to path_, options set; records bound_
  void on_accept();
  void on_readable(int fd);
  void on_doorbell(int fd);
  void on_deadline();
  void close_connection(int fd, const std::string& why);
  void handle_hello(Connection& conn, const TenantMessage& hello);
  void handle_attach(Connection& conn, const TenantMessage& request);
  void refuse(Connection& conn, const std::string& reason, common::RefusedAction action);
  // Frees room by closing not-yet-welcomed connections that can never say Hello: their
  // process exited, or it closed its end before the loop read the close.
  void prune_gone_pending();
  void arm_deadline();

  EventLoop& loop_;
  TenantApi& api_;
  FdReaper& reaper_;
  LogLimiter& log_;
  std::string path_;
  TenantLimits limits_;
  bool allow_peer_pidfd_;
  bool rights_refused_ = false;
  UniqueFd listener_;
  PathIdentity bound_;  // what path_ led to when listener_ was bound
  Timer deadline_timer_;
  std::map<int, Connection> connections_;
  std::deque<std::pair<uint64_t, int>> pending_order_;  // (accepted_ns, fd), oldest first
  std::set<int> pending_;
  std::map<std::string, size_t> pending_by_cgroup_;
  std::map<pid_t, size_t> pending_by_pid_;
  std::map<pid_t, int> welcomed_by_pid_;
};

}  // namespace quanta::arbiter
