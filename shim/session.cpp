// The arbiter session: the first connection (exactly one thread does it; others wait,
// bounded), Hello/Welcome, adopting the pod region and doorbell, attaching each device the
// process uses, and reconnecting after an arbiter restart. Every failure degrades to
// ungated pass-through.
#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/wire.h"
#include "shim/devices.h"
#include "shim/link_state.h"
#include "shim/log.h"
#include "shim/options.h"
#include "shim/text.h"

namespace quanta::shim {

Process g_process;
Binding g_bindings[kMaxGpus];

namespace {

// A route per mapping generation of a device's gate, never freed, so a launcher holding
// an old one reads valid memory.
Route g_routes[kMaxRoutes];
std::atomic<uint32_t> g_routes_used{0};
std::atomic<uint32_t> g_atfork_registered{0};

Route* new_route(const ControlRegion* control, PodRegion* pod, uint32_t proc_index,
                 uint32_t gpu_index, uint32_t slot_index) {
  const uint32_t at = g_routes_used.fetch_add(1, std::memory_order_relaxed);
  if (at >= static_cast<uint32_t>(kMaxRoutes)) return nullptr;
  Route* route = &g_routes[at];
  route->control = control;
  route->slot = &control->slots[slot_index];
  route->channel = &pod->procs[proc_index].gpus[gpu_index];
  route->gpu_index = gpu_index;
  route->slot_index = slot_index;
  return route;
}

// ---------------------------------------------------------------------------------------
// The socket conversation. Callers hold socket_lock.
// ---------------------------------------------------------------------------------------

enum class HelloOutcome { kWelcome, kRefused, kNoArbiter, kBroken };

struct HelloResult {
  HelloOutcome outcome = HelloOutcome::kBroken;
  int socket_fd = -1;
  int pod_fd = -1;
  int doorbell_fd = -1;
  uint32_t pod_index = 0;
  uint32_t proc_index = 0;
  uint64_t generation = 0;
  char text[common::kMessageTextLen] = {};
};

HelloResult say_hello() {
  HelloResult result;
  const Options& opts = options();
  const int fd = wire_connect(opts.socket_path);
  if (fd < 0) {
    result.outcome = HelloOutcome::kNoArbiter;
    describe_errno(errno, result.text, sizeof result.text);
    return result;
  }
  common::HelloMessage hello{};
  hello.header = common::make_header<common::HelloMessage>(common::MessageType::kHello);
  copy_text(hello.claimed_pod, sizeof hello.claimed_pod, opts.pod);
  ArbiterReply reply;
  int fds[2] = {-1, -1};
  int fd_count = 0;
  long received = -1;
  if (wire_send(fd, &hello, sizeof hello))
    received = wire_receive(fd, &reply, sizeof reply, fds, 2, &fd_count);
  if (received <= 0 || !wire_message_valid(reply.header, received)) {
    close_all(fds, fd_count);
    close(fd);
    copy_text(result.text, sizeof result.text,
              received == 0 ? "the arbiter closed the connection" : "no valid reply to hello");
    return result;
  }
  if (reply.header.type == common::MessageType::kRefused) {
    close_all(fds, fd_count);
    close(fd);
    result.outcome = HelloOutcome::kRefused;
    copy_text(result.text, sizeof result.text, reply.refused.reason);
    return result;
  }
  if (reply.header.type != common::MessageType::kWelcome || fd_count != 2 ||
      reply.welcome.proc_index >= common::kMaxProcsPerPod) {
    close_all(fds, fd_count);
    close(fd);
    copy_text(result.text, sizeof result.text,
              "welcome without pod region and doorbell, or a bad process index");
    return result;
  }
  result.outcome = HelloOutcome::kWelcome;
  result.socket_fd = fd;
  result.pod_fd = fds[0];
  result.doorbell_fd = fds[1];
  result.pod_index = reply.welcome.pod_index;
  result.proc_index = reply.welcome.proc_index;
  result.generation = reply.welcome.arbiter_generation;
  return result;
}

// Takes the pod region and doorbell a welcome brought. A pod region that is the file
// already mapped keeps its mapping; the doorbell replaces the old one under the same
// descriptor number, so a launcher ringing it concurrently never writes to a closed fd.
bool adopt_welcome(HelloResult& hello, const char** why) {
  FileIdentity identity;
  if (!file_identity(hello.pod_fd, &identity)) {
    *why = "cannot stat the pod region";
    return false;
  }
  PodRegion* pod = g_process.pod.load(std::memory_order_acquire);
  if (!pod || !(identity == g_process.pod_file)) {
    PodRegion* mapped = map_pod_region(hello.pod_fd, why);
    if (!mapped) return false;
    pod = mapped;
    g_process.pod_file = identity;
  }
  close(hello.pod_fd);
  hello.pod_fd = -1;
  const int old_doorbell = g_process.doorbell_fd.load(std::memory_order_acquire);
  if (old_doorbell >= 0 && dup3(hello.doorbell_fd, old_doorbell, O_CLOEXEC) >= 0) {
    close(hello.doorbell_fd);
  } else {
    g_process.doorbell_fd.store(hello.doorbell_fd, std::memory_order_release);
  }
  hello.doorbell_fd = -1;
  g_process.proc_index.store(hello.proc_index, std::memory_order_relaxed);
  g_process.pod.store(pod, std::memory_order_release);
  g_process.generation = hello.generation;
  const int old_socket = g_process.socket_fd.exchange(hello.socket_fd, std::memory_order_acq_rel);
  if (old_socket >= 0) close(old_socket);
  g_process.connected.store(1, std::memory_order_release);
  return true;
}

enum class AttachOutcome { kAttached, kRefused, kUnreachable };

// Sends Attach for a binding and installs the route the reply describes. Keeps the current
// route when the arbiter hands back the same region, index and slot.
AttachOutcome attach_locked(Binding* binding) {
  const int fd = g_process.socket_fd.load(std::memory_order_acquire);
  PodRegion* pod = g_process.pod.load(std::memory_order_acquire);
  if (fd < 0 || !pod || !g_process.connected.load(std::memory_order_acquire))
    return AttachOutcome::kUnreachable;
  common::AttachMessage attach{};
  attach.header = common::make_header<common::AttachMessage>(common::MessageType::kAttach);
  copy_text(attach.uuid, sizeof attach.uuid, binding->uuid);
  ArbiterReply reply;
  int fds[1] = {-1};
  int fd_count = 0;
  long received = -1;
  if (wire_send(fd, &attach, sizeof attach))
    received = wire_receive(fd, &reply, sizeof reply, fds, 1, &fd_count);
  if (received <= 0 || !wire_message_valid(reply.header, received)) {
    close_all(fds, fd_count);
    g_process.connected.store(0, std::memory_order_release);
    return AttachOutcome::kUnreachable;
  }
  if (reply.header.type == common::MessageType::kAttachFailed) {
    close_all(fds, fd_count);
    QUANTA_LOG_WARN(
        "the arbiter did not attach %s (%.200s): launches on it run ungated and uncapped",
        binding->uuid, reply.attach_failed.reason);
    return AttachOutcome::kRefused;
  }
  const common::AttachedMessage& attached = reply.attached;
  if (reply.header.type != common::MessageType::kAttached || attached.gpu_index >= kMaxGpus ||
      attached.slot >= common::kMaxSlotsPerGpu || (attached.fd_attached != 0) != (fd_count == 1)) {
    close_all(fds, fd_count);
    QUANTA_LOG_WARN("the arbiter's reply to attaching %s is malformed: launches on it run ungated",
                    binding->uuid);
    return AttachOutcome::kRefused;
  }
  ControlMapping& mapping = g_process.controls[attached.gpu_index];
  if (fd_count == 1) {
    FileIdentity identity;
    const bool known =
        file_identity(fds[0], &identity) && mapping.region && identity == mapping.file;
    if (!known) {
      const char* why = "";
      const ControlRegion* region = map_control_region(fds[0], &why);
      if (!region || region->header.gpu_index != attached.gpu_index) {
        close(fds[0]);
        QUANTA_LOG_WARN("control region for %s rejected (%s): launches on it run ungated",
                        binding->uuid,
                        region ? "its GPU index differs from the attach reply" : why);
        return AttachOutcome::kRefused;
      }
      mapping.region = region;
      mapping.file = identity;
    }
    close(fds[0]);
  }
  if (!mapping.region) {
    QUANTA_LOG_WARN("the arbiter attached %s without ever passing its control region: ungated",
                    binding->uuid);
    return AttachOutcome::kRefused;
  }
  const uint32_t proc_index = g_process.proc_index.load(std::memory_order_relaxed);
  Route* current = binding->route.load(std::memory_order_acquire);
  if (current && current->control == mapping.region && current->gpu_index == attached.gpu_index &&
      current->slot_index == attached.slot &&
      current->channel == &pod->procs[proc_index].gpus[attached.gpu_index]) {
    return AttachOutcome::kAttached;
  }
  Route* route = new_route(mapping.region, pod, proc_index, attached.gpu_index, attached.slot);
  if (!route) {
    QUANTA_LOG_WARN("too many arbiter restarts to remap %s again: keeping the previous mapping",
                    binding->uuid);
    return current ? AttachOutcome::kAttached : AttachOutcome::kRefused;
  }
  binding->route.store(route, std::memory_order_release);
  return AttachOutcome::kAttached;
}

// ---------------------------------------------------------------------------------------
// First use: connect, hello, welcome, start the link thread. Exactly one thread does it;
// others wait (bounded), and a call re-entering from inside it passes ungated.
// ---------------------------------------------------------------------------------------

void connect_first_time() {
  InLink guard;
  if (!g_atfork_registered.exchange(1)) pthread_atfork(nullptr, nullptr, &reset_link_in_child);
  g_process.pid.store(static_cast<uint32_t>(getpid()), std::memory_order_relaxed);
  g_process.socket_lock.lock();
  HelloResult hello = say_hello();
  uint32_t outcome = kUnplaced;
  if (hello.outcome == HelloOutcome::kWelcome) {
    const char* why = "";
    if (adopt_welcome(hello, &why)) {
      outcome = kLinked;
    } else {
      close(hello.socket_fd);
      if (hello.pod_fd >= 0) close(hello.pod_fd);
      if (hello.doorbell_fd >= 0) close(hello.doorbell_fd);
      QUANTA_LOG_WARN(
          "the pod region from the arbiter was rejected (%s): running ungated and uncapped", why);
    }
  } else if (hello.outcome == HelloOutcome::kRefused) {
    QUANTA_LOG_WARN("the arbiter refused this process: %s; running ungated and uncapped",
                    hello.text);
  } else if (hello.outcome == HelloOutcome::kNoArbiter) {
    QUANTA_LOG_INFO("no arbiter at %s (%s): running ungated and uncapped", options().socket_path,
                    hello.text);
  } else {
    QUANTA_LOG_WARN("the arbiter at %s did not answer properly (%s): running ungated and uncapped",
                    options().socket_path, hello.text);
  }
  g_process.socket_lock.unlock();
  if (outcome == kLinked) register_launcher_barrier();
  if (outcome == kLinked && !start_link_thread()) {
    QUANTA_LOG_WARN("cannot start the link thread: running ungated and uncapped");
    g_process.connected.store(0, std::memory_order_release);
    const int fd = g_process.socket_fd.exchange(-1);
    if (fd >= 0) close(fd);  // the arbiter sees us leave and frees our slots
    outcome = kUnplaced;
  }
  g_process.state.store(outcome, std::memory_order_release);
  private_wake_all(&g_process.state);
}

}  // namespace

void ring_doorbell() {
  const int fd = g_process.doorbell_fd.load(std::memory_order_acquire);
  if (fd < 0) return;
  const uint64_t one = 1;
  ssize_t rc = write(fd, &one, sizeof one);
  (void)rc;  // EAGAIN: the counter is saturated, the arbiter will look anyway
}

bool reconnect(bool* refused) {
  *refused = false;
  g_process.socket_lock.lock();
  HelloResult hello = say_hello();
  bool ok = false;
  if (hello.outcome == HelloOutcome::kWelcome) {
    const char* why = "";
    ok = adopt_welcome(hello, &why);
    if (!ok) {
      close(hello.socket_fd);
      if (hello.pod_fd >= 0) close(hello.pod_fd);
      if (hello.doorbell_fd >= 0) close(hello.doorbell_fd);
      QUANTA_LOG_WARN("reconnected, but the pod region was rejected (%s): keeping the previous one",
                      why);
    }
  } else if (hello.outcome == HelloOutcome::kRefused) {
    *refused = true;
    if (!g_process.refused_logged) {
      g_process.refused_logged = true;
      QUANTA_LOG_WARN(
          "the restarted arbiter refused this process (%s): caps stay as they were, gating lapses",
          hello.text);
    }
  }
  if (ok) {
    for (Binding& binding : g_bindings) {
      const uint32_t state = binding.state.load(std::memory_order_acquire);
      if (state != kReady && state != kPending) continue;
      const AttachOutcome outcome = attach_locked(&binding);
      if (outcome == AttachOutcome::kUnreachable) {
        ok = false;
        break;
      }
      if (outcome == AttachOutcome::kAttached) {
        binding.state.store(kReady, std::memory_order_release);
        binding.handled_valid = false;
      }
    }
  }
  g_process.socket_lock.unlock();
  if (ok) {
    g_process.refused_logged = false;
    QUANTA_LOG_INFO("reconnected to the arbiter (generation %llu)",
                    static_cast<unsigned long long>(g_process.generation));
  }
  return ok;
}

bool ensure_linked() {
  uint32_t state = g_process.state.load(std::memory_order_acquire);
  if (__builtin_expect(state == kLinked, 1)) return true;
  if (state == kUnplaced || t_in_link) return false;
  if (state == kUntouched) {
    uint32_t expected = kUntouched;
    if (g_process.state.compare_exchange_strong(expected, kConnecting, std::memory_order_acq_rel)) {
      connect_first_time();
      return g_process.state.load(std::memory_order_acquire) == kLinked;
    }
  }
  const uint64_t give_up = monotonic_ns() + kFirstUseWaitNs;
  while ((state = g_process.state.load(std::memory_order_acquire)) == kConnecting) {
    if (monotonic_ns() > give_up) return false;  // pass ungated rather than hang
    private_wait(&g_process.state, kConnecting, 100 * kNsPerMs);
  }
  return state == kLinked;
}

Binding* ensure_binding(CUdevice device) {
  if (device < 0 || device >= static_cast<int>(kMaxGpus)) return nullptr;
  Binding* binding = &g_bindings[device];
  uint32_t state = binding->state.load(std::memory_order_acquire);
  if (__builtin_expect(state == kReady, 1)) return binding;
  if (state == kEmpty) {
    uint32_t expected = kEmpty;
    if (binding->state.compare_exchange_strong(expected, kAttaching, std::memory_order_acq_rel)) {
      InLink guard;
      uint32_t next = kFailed;
      if (!device_uuid_name(device, binding->uuid, sizeof binding->uuid)) {
        QUANTA_LOG_WARN(
            "cannot read the UUID of device %d: launches on it run ungated and uncapped", device);
      } else {
        g_process.socket_lock.lock();
        const AttachOutcome outcome = attach_locked(binding);
        g_process.socket_lock.unlock();
        next = outcome == AttachOutcome::kAttached  ? kReady
               : outcome == AttachOutcome::kRefused ? kFailed
                                                    : kPending;
      }
      binding->state.store(next, std::memory_order_release);
      private_wake_all(&binding->state);
      g_process.kick.fetch_add(1, std::memory_order_release);
      private_wake_all(&g_process.kick);
      return binding;
    }
  }
  const uint64_t give_up = monotonic_ns() + kFirstUseWaitNs;
  while (binding->state.load(std::memory_order_acquire) == kAttaching && !t_in_link) {
    if (monotonic_ns() > give_up) break;
    private_wait(&binding->state, kAttaching, 100 * kNsPerMs);
  }
  return binding;
}

void session_reset_in_child() {
  const int socket_fd = g_process.socket_fd.exchange(-1);
  if (socket_fd >= 0) close(socket_fd);
  const int doorbell = g_process.doorbell_fd.exchange(-1);
  if (doorbell >= 0) close(doorbell);
  g_process.connected.store(0);
  g_process.pod.store(nullptr);
  g_process.pod_file = FileIdentity{};
  g_process.proc_index.store(0);
  g_process.pid.store(static_cast<uint32_t>(getpid()));
  g_process.socket_lock.reset();
  for (ControlMapping& mapping : g_process.controls) mapping = ControlMapping{};
  g_process.refused_logged = false;
  for (Binding& binding : g_bindings) {
    binding.state.store(kEmpty);
    binding.route.store(nullptr);
    binding.launchers_inside.store(0);
    binding.lapsed.store(0);
    binding.lapse_logged.store(0);
    binding.handled_valid = false;
  }
}

bool link_memory_account(CUdevice device, MemoryAccount* out) {
  if (t_in_link || !ensure_linked()) return false;
  Binding* binding = ensure_binding(device);
  if (!binding) return false;
  const Route* route = binding->route.load(std::memory_order_acquire);
  PodRegion* pod = g_process.pod.load(std::memory_order_acquire);
  if (!route || !pod) return false;
  out->pod_used = &pod->memory_used[route->gpu_index];
  out->process_used = &route->channel->memory_used;
  out->cap = &route->slot->memory_cap;
  return true;
}

}  // namespace quanta::shim
