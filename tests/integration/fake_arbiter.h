// A scripted stand-in for quanta-arbiter on a tenant socket, for shim behaviour the real
// arbiter does not (yet) produce on demand: Refused with a chosen action, Welcomes with
// chosen settings and flags. Its regions are real (memfds with valid headers, kept mapped
// here so a test reads the ledger words); every attached process holds the grant and the
// heartbeat stays fresh while it serves.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/shm_layout.h"
#include "common/wire.h"

namespace quanta::integration {

struct FakeArbiterScript {
  int deny_first = 0;        // Hellos answered with Refused{kDeny} before any Welcome
  bool refuse_open = false;  // every Hello answered with Refused{kRunOpen}
  uint32_t welcome_flags = 0;
  uint32_t count_managed = 1;
  uint64_t context_overhead = 0;
  uint64_t memory_cap = 0;  // on GPU index 0, for every slot
  // Hellos answered with a Refused whose header says this tenant protocol version (an
  // arbiter of another release); 0: never.
  uint32_t other_version = 0;
};

class FakeArbiter {
 public:
  FakeArbiter(const std::string& socket_path, FakeArbiterScript script);
  ~FakeArbiter();
  FakeArbiter(const FakeArbiter&) = delete;
  FakeArbiter& operator=(const FakeArbiter&) = delete;

  int hellos() const { return hellos_.load(); }
  int welcomes() const { return welcomes_.load(); }
  int attaches() const { return attaches_.load(); }
  // The pod ledger word on GPU index 0 (all tenants share one pod region here).
  uint64_t pod_used() const;
  // From now on Hellos are refused with `action`, and every open connection is closed.
  void refuse_from_now_on(common::RefusedAction action);

 private:
  void serve();
  void on_message(int fd);
  void send(int fd, const void* message, size_t size, const std::vector<int>& fds);

  std::string path_;
  FakeArbiterScript script_;
  int listen_fd_ = -1;
  int stop_fd_ = -1;
  int pod_fd_ = -1;
  int control_fd_ = -1;
  common::PodRegion* pod_ = nullptr;
  common::ControlRegion* control_ = nullptr;
  std::vector<int> connections_;
  std::vector<pid_t> peers_;
  std::mutex mutex_;
  std::atomic<int> hellos_{0}, welcomes_{0}, attaches_{0};
  std::atomic<int> refuse_action_{-1};  // -1: follow the script
  std::thread thread_;
};

}  // namespace quanta::integration
