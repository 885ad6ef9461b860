// The arbiter session: the first connection (exactly one thread does it; others wait,
// bounded), Hello/Welcome, adopting the pod region and doorbell, attaching each device the
// process uses, joining late when the arbiter was unreachable at first use, and
// reconnecting after an arbiter restart. Where the node does not enforce placement every
// failure degrades to ungated pass-through; where it does, CUDA is refused until placed.
#include <fcntl.h>
#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/wire.h"
#include "shim/base/log.h"
#include "shim/base/options.h"
#include "shim/base/text.h"
#include "shim/interpose/charge.h"
#include "shim/interpose/devices.h"
#include "shim/interpose/pod_ledger.h"
#include "shim/link/link_state.h"

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
                 uint32_t gpu_index, uint32_t slot_index, uint32_t owner, uint32_t ledger_epoch) {
  const uint32_t at = g_routes_used.fetch_add(1, std::memory_order_relaxed);
  if (at >= static_cast<uint32_t>(kMaxRoutes)) return nullptr;
  Route* route = &g_routes[at];
  route->control = control;
  route->slot = &control->slots[slot_index];
  route->channel = &pod->procs[proc_index].gpus[gpu_index];
  route->limits = &pod->procs[proc_index].limits[gpu_index];
  route->pod = pod;
  route->gpu_index = gpu_index;
  route->slot_index = slot_index;
  route->owner = owner;
  route->ledger_epoch = ledger_epoch;
  route->entry_made = g_process.entries_made.load(std::memory_order_relaxed);
  return route;
}

MemoryAccount account_of(const Route* route) {
  MemoryAccount account;
  account.pod_used = &route->pod->memory_used[route->gpu_index];
  account.process_used = &route->channel->memory_used;
  account.cap = &route->pod->memory_cap[route->gpu_index];
  account.denied = &route->pod->alloc_denied[route->gpu_index];
  account.epoch = route->ledger_epoch;
  return account;
}

// The route about to be published has fresh ledger words (the restarted arbiter could not
// re-adopt the pod's region or this process's entry, so they read 0): what the process
// holds on the device is charged there first, in one step, then the route is published and
// each charge moved over once (charge.h, move_charges). The memory exists, so it is charged
// even past the cap; the cap then refuses new allocations until the pod is back under it.
void publish_with_charges_moved(Binding* binding, Route* route) {
  const CUdevice device = static_cast<CUdevice>(binding_index(binding));
  const MemoryAccount fresh = account_of(route);
  const uint64_t credit = charges_outside(device, fresh.epoch);
  if (credit != 0) PodLedger::force_reserve(fresh, credit);
  binding->route.store(route, std::memory_order_release);
  const uint64_t moved = move_charges(device, fresh, credit);
  if (moved == 0) return;
  const uint64_t used = fresh.pod_used->load(std::memory_order_acquire);
  const uint64_t cap = fresh.cap->load(std::memory_order_acquire);
  if (cap != 0 && used > cap) {
    QUANTA_LOG_WARN(
        "the restarted arbiter gave this pod a new ledger on %s: charged the %llu bytes this "
        "process holds there, which puts the pod at %llu bytes, over its cap of %llu; memory "
        "already allocated stays, new allocations are refused until the pod is under its cap",
        binding->uuid, static_cast<unsigned long long>(moved),
        static_cast<unsigned long long>(used), static_cast<unsigned long long>(cap));
  } else {
    QUANTA_LOG_INFO(
        "the restarted arbiter gave this pod a new ledger on %s: charged the %llu bytes this "
        "process holds there",
        binding->uuid, static_cast<unsigned long long>(moved));
  }
}

// ---------------------------------------------------------------------------------------
// Owned descriptors (see OwnedFd).
// ---------------------------------------------------------------------------------------

// Moves `fd` to a high number (close-on-exec), below the soft descriptor limit and below
// 1024 so select()-based code never has to see it. Keeps `fd` when that is impossible.
int move_high(int fd) {
  if (fd < 0) return fd;
  rlimit limit{};
  rlim_t ceiling = 1024;
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < ceiling) ceiling = limit.rlim_cur;
  if (ceiling <= 128) return fd;
  const int moved = fcntl(fd, F_DUPFD_CLOEXEC, static_cast<int>(ceiling - 64));
  if (moved < 0) return fd;
  close(fd);
  return moved;
}

void own(OwnedFd& owned, int fd) {
  FileIdentity identity;
  if (fd >= 0 && file_identity(fd, &identity)) {
    owned.device.store(identity.device, std::memory_order_relaxed);
    owned.inode.store(identity.inode, std::memory_order_relaxed);
  }
  owned.fd.store(fd, std::memory_order_release);
}

bool still_ours(const OwnedFd& owned, int fd) {
  FileIdentity identity;
  return fd >= 0 && file_identity(fd, &identity) &&
         identity.device == owned.device.load(std::memory_order_relaxed) &&
         identity.inode == owned.inode.load(std::memory_order_relaxed);
}

// The number is the application's now: forget it without closing it, and reconnect.
void disown(OwnedFd& owned, int fd, const char* what) {
  int expected = fd;
  if (!owned.fd.compare_exchange_strong(expected, -1, std::memory_order_acq_rel)) return;
  g_process.connected.store(0, std::memory_order_release);
  if (!g_process.stolen_logged) {
    g_process.stolen_logged = true;
    QUANTA_LOG_WARN(
        "descriptor %d (the shim's %s) was closed and reused by the program: leaving it to the "
        "program and reconnecting with new ones",
        fd, what);
  }
}

// Closes an owned descriptor if it is still the link's.
void release_owned(OwnedFd& owned) {
  const int fd = owned.fd.exchange(-1, std::memory_order_acq_rel);
  if (fd >= 0 && still_ours(owned, fd)) close(fd);
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
  uint32_t flags = 0;
  uint32_t count_managed = 1;
  uint64_t context_overhead = 0;
  common::RefusedAction action = common::RefusedAction::kRunOpen;
  char text[common::kMessageTextLen] = {};
};

void close_hello(HelloResult& hello) {
  if (hello.socket_fd >= 0) close(hello.socket_fd);
  if (hello.pod_fd >= 0) close(hello.pod_fd);
  if (hello.doorbell_fd >= 0) close(hello.doorbell_fd);
  hello.socket_fd = hello.pod_fd = hello.doorbell_fd = -1;
}

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
    if (received >= static_cast<long>(sizeof reply.header) &&
        reply.header.magic == common::kWireMagic && reply.header.version != common::kWireVersion) {
      // An arbiter of another release answers in its own protocol: name both.
      snprintf(result.text, sizeof result.text,
               "the arbiter speaks tenant protocol %u, this libquanta.so speaks %u: run the "
               "arbiter release installed with this library, or restart the pod under the "
               "node's arbiter",
               reply.header.version, common::kWireVersion);
      return result;
    }
    if (received == 0) {
      // What an arbiter of an older release does with a Hello of a protocol it does not know.
      snprintf(result.text, sizeof result.text,
               "the arbiter closed the connection without answering this libquanta.so's Hello "
               "(tenant protocol %u), as an arbiter of an older release does",
               common::kWireVersion);
    } else {
      copy_text(result.text, sizeof result.text, "no valid reply to hello");
    }
    return result;
  }
  if (reply.header.type == common::MessageType::kRefused) {
    close_all(fds, fd_count);
    close(fd);
    result.outcome = HelloOutcome::kRefused;
    result.action = reply.refused.action == common::RefusedAction::kDeny
                        ? common::RefusedAction::kDeny
                        : common::RefusedAction::kRunOpen;
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
  result.socket_fd = move_high(fd);
  result.pod_fd = fds[0];
  result.doorbell_fd = move_high(fds[1]);
  result.pod_index = reply.welcome.pod_index;
  result.proc_index = reply.welcome.proc_index;
  result.generation = reply.welcome.arbiter_generation;
  result.flags = reply.welcome.flags;
  result.count_managed = reply.welcome.count_managed;
  result.context_overhead = reply.welcome.context_overhead;
  return result;
}

// Takes the pod region and doorbell a welcome brought. A pod region that is the file
// already mapped keeps its mapping; the doorbell replaces the old one under the same
// descriptor number (while that number is still the link's), so a launcher ringing it
// concurrently never writes to a closed fd.
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
  const int old_doorbell = g_process.doorbell.fd.load(std::memory_order_acquire);
  if (old_doorbell >= 0 && still_ours(g_process.doorbell, old_doorbell) &&
      dup3(hello.doorbell_fd, old_doorbell, O_CLOEXEC) >= 0) {
    close(hello.doorbell_fd);
    own(g_process.doorbell, old_doorbell);
  } else {
    own(g_process.doorbell, hello.doorbell_fd);
  }
  hello.doorbell_fd = -1;
  g_process.proc_index.store(hello.proc_index, std::memory_order_relaxed);
  // The arbiter wrote this process's pid into its entry as the arbiter sees it (the host's
  // pid namespace) and writes the same into its slots; in a container's own pid namespace
  // getpid() is another number, and the gate would take every slot for someone else's.
  const uint32_t seen_pid = pod->procs[hello.proc_index].pid.load(std::memory_order_acquire);
  if (seen_pid != 0) g_process.pid.store(seen_pid, std::memory_order_relaxed);
  g_process.pod.store(pod, std::memory_order_release);
  g_process.generation = hello.generation;
  g_process.welcome_flags.store(hello.flags, std::memory_order_relaxed);
  if (hello.flags & common::kWelcomeFreshEntry)
    g_process.entries_made.fetch_add(1, std::memory_order_relaxed);
  g_process.welcome_count_managed.store(hello.count_managed, std::memory_order_relaxed);
  g_process.welcome_context_overhead.store(hello.context_overhead, std::memory_order_relaxed);
  release_owned(g_process.socket);
  own(g_process.socket, hello.socket_fd);
  hello.socket_fd = -1;
  g_process.connected.store(1, std::memory_order_release);
  g_process.joined.store(1, std::memory_order_release);
  return true;  // a refusal of CUDA is lifted by the caller, once it has said so
}

// The link's socket, or -1 (and the connection marked lost) when it is gone or no longer
// the link's descriptor. Callers hold socket_lock.
int socket_locked() {
  const int fd = g_process.socket.fd.load(std::memory_order_acquire);
  if (fd < 0 || !g_process.connected.load(std::memory_order_acquire)) return -1;
  if (!still_ours(g_process.socket, fd)) {
    disown(g_process.socket, fd, "arbiter socket");
    return -1;
  }
  return fd;
}

enum class AttachOutcome { kAttached, kRefused, kUnreachable };

// Sends Attach for a binding and installs the route the reply describes. Keeps the current
// route when the arbiter hands back the same region, index and slot.
AttachOutcome attach_locked(Binding* binding) {
  PodRegion* pod = g_process.pod.load(std::memory_order_acquire);
  const int fd = pod ? socket_locked() : -1;
  if (fd < 0) return AttachOutcome::kUnreachable;
  common::AttachMessage attach{};
  attach.header = common::make_header<common::AttachMessage>(common::MessageType::kAttach);
  copy_text(attach.uuid, sizeof attach.uuid, binding->uuid);
  // The device thread's ring_when_quiet, ring_when_grant_unused and end_own_turn.
  attach.flags = common::kAttachReportsQuiet | common::kAttachReportsUnusedGrant |
                 common::kAttachEndsOwnQuantum;
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
      attached.slot >= common::kMaxSlotsPerGpu || attached.owner == 0 ||
      (attached.fd_attached != 0) != (fd_count == 1)) {
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
  GateChannel* channel = &pod->procs[proc_index].gpus[attached.gpu_index];
  // Same ledger words: the arbiter kept the pod's region and this process's entry (a
  // reconnect, or a restart that re-adopted both), and every charge is still there. Otherwise
  // the words are fresh (a new epoch), also when a fresh entry has the index of the old one.
  const bool same_ledger = current && current->pod == pod &&
                           current->gpu_index == attached.gpu_index && current->channel == channel &&
                           current->entry_made ==
                               g_process.entries_made.load(std::memory_order_relaxed);
  if (same_ledger && current->control == mapping.region && current->slot_index == attached.slot &&
      current->owner == attached.owner)
    return AttachOutcome::kAttached;
  const uint32_t epoch = !current      ? 1
                         : same_ledger ? current->ledger_epoch
                                       : current->ledger_epoch + 1;
  Route* route =
      new_route(mapping.region, pod, proc_index, attached.gpu_index, attached.slot,
                attached.owner, epoch);
  if (!route) {
    QUANTA_LOG_WARN("too many arbiter restarts to remap %s again: keeping the previous mapping",
                    binding->uuid);
    return current ? AttachOutcome::kAttached : AttachOutcome::kRefused;
  }
  if (current && !same_ledger) {
    publish_with_charges_moved(binding, route);
  } else {
    binding->route.store(route, std::memory_order_release);
  }
  return AttachOutcome::kAttached;
}

// A device just got its account (first attach, or the first after joining late): what the
// process allocated on it before is charged now.
void charge_earlier_allocations(Binding* binding) {
  const CUdevice device = static_cast<CUdevice>(binding_index(binding));
  const Route* route = binding->route.load(std::memory_order_acquire);
  if (!route) return;
  const MemoryAccount account = account_of(route);
  const uint64_t charged = charge_allocations_made_before_joining(device, account);
  if (charged != 0) {
    QUANTA_LOG_INFO("charged %llu bytes allocated on %s before this process joined the arbiter",
                    static_cast<unsigned long long>(charged), binding->uuid);
  }
}

// Denial (link_refuses_cuda) and its one-time line.
void deny(const char* why) {
  g_process.denied.store(1, std::memory_order_release);
  if (g_process.deny_logged) return;
  g_process.deny_logged = true;
  QUANTA_LOG_ERROR(
      "this node enforces placement and %s: CUDA is refused to this process (contexts and "
      "launches fail with CUDA_ERROR_DEVICE_UNAVAILABLE, allocations with "
      "CUDA_ERROR_OUT_OF_MEMORY) until the arbiter places it; retrying",
      why);
}

// A hello that brought no welcome, before the process ever joined: deny, or run ungated
// and uncapped while the link keeps trying (a refusal to run open ends the trying).
void note_not_placed(const HelloResult& hello) {
  char why[common::kMessageTextLen + 96];
  if (hello.outcome == HelloOutcome::kRefused) {
    if (hello.action != common::RefusedAction::kDeny) {
      g_process.denied.store(0, std::memory_order_release);
      g_process.gave_up.store(1, std::memory_order_release);
      QUANTA_LOG_WARN("the arbiter refused this process: %s; running ungated and uncapped",
                      hello.text);
      return;
    }
    snprintf(why, sizeof why, "the arbiter refused it (%.200s)", hello.text);
    deny(why);
  } else if (options().unplaced_closed) {
    snprintf(why, sizeof why, "the arbiter at %.100s cannot be reached (%.120s)",
             options().socket_path, hello.text);
    deny(why);
  }
}

// ---------------------------------------------------------------------------------------
// Observing: NVML views in a process that never used CUDA. A Hello and an observe-only
// Attach per device, the connection closed right after: no slot, no link thread, no
// descriptor kept. The usage is the pod region's live word; the cap a snapshot refreshed at
// most once a second.
// ---------------------------------------------------------------------------------------

struct ObservedDevice {
  std::atomic<uint64_t> cap{0};
  std::atomic<uint32_t> gpu_index{0};
  std::atomic<uint64_t> fetched_ns{0};  // 0: never observed
};

struct Observer {
  SocketLock lock;
  std::atomic<PodRegion*> pod{nullptr};
  FileIdentity pod_file;  // under lock
  ObservedDevice devices[kMaxGpus];
};

Observer g_observer;
constexpr uint64_t kObservedCapRefreshNs = kNsPerSec;

// Under g_observer.lock. Keeps the previous snapshot when the arbiter cannot answer.
void observe(CUdevice device, uint64_t now) {
  char uuid[common::kUuidLen];
  if (!device_uuid_name(device, uuid, sizeof uuid)) return;
  HelloResult hello = say_hello();
  if (hello.outcome != HelloOutcome::kWelcome) return;
  FileIdentity identity;
  if (file_identity(hello.pod_fd, &identity) &&
      (!g_observer.pod.load(std::memory_order_relaxed) || !(identity == g_observer.pod_file))) {
    const char* why = "";
    if (PodRegion* mapped = map_pod_region(hello.pod_fd, &why)) {
      g_observer.pod.store(mapped, std::memory_order_release);
      g_observer.pod_file = identity;
    }
  }
  common::AttachMessage attach{};
  attach.header = common::make_header<common::AttachMessage>(common::MessageType::kAttach);
  copy_text(attach.uuid, sizeof attach.uuid, uuid);
  attach.flags = common::kAttachObserve;
  ArbiterReply reply;
  int fds[1] = {-1};
  int fd_count = 0;
  long received = -1;
  if (wire_send(hello.socket_fd, &attach, sizeof attach))
    received = wire_receive(hello.socket_fd, &reply, sizeof reply, fds, 1, &fd_count);
  close_all(fds, fd_count);
  close_hello(hello);
  if (received <= 0 || !wire_message_valid(reply.header, received) ||
      reply.header.type != common::MessageType::kAttached || reply.attached.gpu_index >= kMaxGpus ||
      reply.attached.slot != common::kNoSlot)
    return;
  ObservedDevice& observed = g_observer.devices[device];
  observed.cap.store(reply.attached.memory_cap, std::memory_order_relaxed);
  observed.gpu_index.store(reply.attached.gpu_index, std::memory_order_relaxed);
  observed.fetched_ns.store(now, std::memory_order_release);
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
  uint32_t outcome = kLinked;  // joined, or the link thread keeps trying to join
  if (hello.outcome == HelloOutcome::kWelcome) {
    const char* why = "";
    if (!adopt_welcome(hello, &why)) {
      close_hello(hello);
      hello.outcome = HelloOutcome::kBroken;
      copy_text(hello.text, sizeof hello.text, why);
      QUANTA_LOG_WARN(
          "the pod region from the arbiter was rejected (%s): running ungated and "
          "uncapped until it sends a usable one; retrying",
          why);
      note_not_placed(hello);
    }
  } else if (hello.outcome == HelloOutcome::kRefused &&
             hello.action == common::RefusedAction::kRunOpen) {
    note_not_placed(hello);
    outcome = kUnplaced;  // the arbiter decided: no link thread, no retries
  } else if (hello.outcome == HelloOutcome::kRefused) {
    note_not_placed(hello);
  } else {
    if (!options().unplaced_closed) {
      if (hello.outcome == HelloOutcome::kNoArbiter) {
        // A warning: a pod that runs unmanaged must be visible at the default level.
        QUANTA_LOG_WARN(
            "no arbiter at %s (%s): running ungated and uncapped until it is "
            "reachable; retrying",
            options().socket_path, hello.text);
      } else {
        QUANTA_LOG_WARN(
            "the arbiter at %s did not answer properly (%s): running ungated and "
            "uncapped until it does; retrying",
            options().socket_path, hello.text);
      }
    }
    note_not_placed(hello);
  }
  g_process.socket_lock.unlock();
  if (outcome == kLinked) register_launcher_barrier();
  if (outcome == kLinked && !start_link_thread()) {
    QUANTA_LOG_WARN("cannot start the link thread: running ungated and uncapped");
    g_process.connected.store(0, std::memory_order_release);
    g_process.socket_lock.lock();
    release_owned(g_process.socket);  // the arbiter sees us leave and frees our slots
    g_process.socket_lock.unlock();
    g_process.gave_up.store(1, std::memory_order_release);
    outcome = kUnplaced;
  }
  g_process.state.store(outcome, std::memory_order_release);
  private_wake_all(&g_process.state);
}

}  // namespace

void ring_doorbell() {
  const int fd = g_process.doorbell.fd.load(std::memory_order_acquire);
  if (fd < 0) return;
  if (!still_ours(g_process.doorbell, fd)) {
    disown(g_process.doorbell, fd, "doorbell");
    return;
  }
  const uint64_t one = 1;
  ssize_t rc = write(fd, &one, sizeof one);
  (void)rc;  // EAGAIN: the counter is saturated, the arbiter will look anyway
}

bool socket_still_ours() {
  return socket_locked() >= 0;
}

Rejoin reconnect() {
  g_process.socket_lock.lock();
  const bool was_joined = g_process.joined.load(std::memory_order_acquire) != 0;
  HelloResult hello = say_hello();
  Rejoin outcome = Rejoin::kUnreachable;
  bool ok = false;
  if (hello.outcome == HelloOutcome::kWelcome) {
    const char* why = "";
    ok = adopt_welcome(hello, &why);
    if (!ok) {
      close_hello(hello);
      QUANTA_LOG_WARN("the arbiter's pod region was rejected (%s): %s", why,
                      was_joined ? "keeping the previous one" : "still not placed");
    }
  } else if (hello.outcome == HelloOutcome::kBroken && was_joined && !g_process.unanswered_logged) {
    // After a rollback to a release that does not speak this protocol: the process keeps its
    // pod region and the caps the last arbiter set in it, and says once why gating stays off.
    g_process.unanswered_logged = true;
    QUANTA_LOG_WARN(
        "the arbiter at %s does not place this process again (%s): launches stay ungated and "
        "memory stays capped where the last arbiter set it; restart the pod to run it under the "
        "arbiter now installed, or install this libquanta.so's release again; retrying",
        options().socket_path, hello.text);
  } else if (hello.outcome == HelloOutcome::kRefused) {
    outcome =
        hello.action == common::RefusedAction::kDeny ? Rejoin::kRefusedDeny : Rejoin::kRefusedOpen;
    if (!was_joined) {
      note_not_placed(hello);
    } else if (!g_process.refused_logged) {
      g_process.refused_logged = true;
      QUANTA_LOG_WARN(
          "the restarted arbiter refused this process (%s): caps stay as they were, gating lapses",
          hello.text);
    }
    if (was_joined && hello.action == common::RefusedAction::kDeny)
      deny("the restarted arbiter refused it");
  }
  if (ok) {
    for (Binding& binding : g_bindings) {
      const uint32_t state = binding.state.load(std::memory_order_acquire);
      if (state != kReady && state != kPending) continue;
      const bool had_route = binding.route.load(std::memory_order_acquire) != nullptr;
      const AttachOutcome attached = attach_locked(&binding);
      if (attached == AttachOutcome::kUnreachable) {
        ok = false;
        break;
      }
      if (attached == AttachOutcome::kAttached) {
        binding.state.store(kReady, std::memory_order_release);
        binding.handled_valid = false;
        binding.ended_turn.store(0, std::memory_order_seq_cst);  // a turn of the old route
        if (!had_route) charge_earlier_allocations(&binding);
      } else if (!had_route) {
        binding.state.store(kFailed, std::memory_order_release);
      }
    }
  }
  g_process.socket_lock.unlock();
  if (ok) {
    g_process.refused_logged = false;
  g_process.unanswered_logged = false;
    g_process.unanswered_logged = false;
    const bool was_denied = g_process.deny_logged;
    g_process.deny_logged = false;
    if (was_joined && !was_denied) {
      QUANTA_LOG_INFO("reconnected to the arbiter (generation %llu)",
                      static_cast<unsigned long long>(g_process.generation));
    } else if (was_denied) {
      QUANTA_LOG_WARN(
          "the arbiter at %s placed this process (generation %llu): CUDA is allowed "
          "from now on, gated and capped",
          options().socket_path, static_cast<unsigned long long>(g_process.generation));
    } else {
      QUANTA_LOG_INFO(
          "joined the arbiter at %s (generation %llu): launches are gated and memory "
          "capped from now on",
          options().socket_path, static_cast<unsigned long long>(g_process.generation));
    }
    g_process.denied.store(0, std::memory_order_release);  // after the line that says so
    outcome = Rejoin::kJoined;
  }
  return outcome;
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
      bool attached = false;
      if (!device_uuid_name(device, binding->uuid, sizeof binding->uuid)) {
        QUANTA_LOG_WARN(
            "cannot read the UUID of device %d: launches on it run ungated and uncapped", device);
      } else {
        g_process.socket_lock.lock();
        const AttachOutcome outcome = attach_locked(binding);
        g_process.socket_lock.unlock();
        attached = outcome == AttachOutcome::kAttached;
        next = attached ? kReady : outcome == AttachOutcome::kRefused ? kFailed : kPending;
      }
      binding->state.store(next, std::memory_order_release);
      if (attached) charge_earlier_allocations(binding);
      if (attached) start_device_thread(binding);
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
  release_owned(g_process.socket);
  release_owned(g_process.doorbell);
  g_process.connected.store(0);
  g_process.joined.store(0);
  g_process.gave_up.store(0);
  g_process.denied.store(0);
  g_process.welcome_flags.store(0);
  g_process.pod.store(nullptr);
  g_process.pod_file = FileIdentity{};
  g_process.proc_index.store(0);
  g_process.pid.store(static_cast<uint32_t>(getpid()));
  g_process.socket_lock.reset();
  for (ControlMapping& mapping : g_process.controls) mapping = ControlMapping{};
  g_process.refused_logged = false;
  g_process.unanswered_logged = false;
  g_process.deny_logged = false;
  g_process.stolen_logged = false;
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
  // One route holds the ledger words and their epoch together (a restart publishes another).
  const Route* route = binding->route.load(std::memory_order_acquire);
  if (!route) return false;
  *out = account_of(route);
  return true;
}

bool link_observed_account(CUdevice device, MemoryAccount* out) {
  if (t_in_link) return false;
  if (g_process.state.load(std::memory_order_acquire) != kUntouched)
    return link_memory_account(device, out);  // a CUDA process: its own account
  if (device < 0 || device >= static_cast<int>(kMaxGpus)) return false;
  ObservedDevice& observed = g_observer.devices[device];
  const uint64_t now = monotonic_ns();
  const uint64_t fetched = observed.fetched_ns.load(std::memory_order_acquire);
  if (fetched == 0 || now - fetched > kObservedCapRefreshNs) {
    InLink guard;
    g_observer.lock.lock();
    if (observed.fetched_ns.load(std::memory_order_acquire) == fetched) observe(device, now);
    g_observer.lock.unlock();
  }
  PodRegion* pod = g_observer.pod.load(std::memory_order_acquire);
  if (observed.fetched_ns.load(std::memory_order_acquire) == 0 || !pod) return false;
  out->pod_used = &pod->memory_used[observed.gpu_index.load(std::memory_order_relaxed)];
  out->process_used = nullptr;
  out->cap = &observed.cap;
  return true;
}

bool link_may_join(CUdevice device) {
  if (g_process.state.load(std::memory_order_acquire) != kLinked) return false;
  if (g_process.gave_up.load(std::memory_order_acquire)) return false;
  if (!g_process.joined.load(std::memory_order_acquire)) return true;
  if (device < 0 || device >= static_cast<int>(kMaxGpus)) return false;
  return g_bindings[device].state.load(std::memory_order_acquire) == kPending;
}

bool link_refuses_cuda() {
  if (t_in_link || !ensure_linked()) return false;
  return g_process.denied.load(std::memory_order_acquire) != 0;
}

LinkSettings link_settings() {
  const Options& opts = options();
  LinkSettings settings{opts.count_managed, opts.context_overhead_bytes};
  if (t_in_link || !ensure_linked() || !g_process.joined.load(std::memory_order_acquire))
    return settings;
  const bool enforced = opts.enforced || (g_process.welcome_flags.load(std::memory_order_relaxed) &
                                          common::kWelcomeEnforced);
  if (enforced || !opts.count_managed_set)
    settings.count_managed = g_process.welcome_count_managed.load(std::memory_order_relaxed) != 0;
  if (enforced || !opts.context_overhead_set)
    settings.context_overhead = g_process.welcome_context_overhead.load(std::memory_order_relaxed);
  return settings;
}

}  // namespace quanta::shim
