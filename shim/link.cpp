// The arbiter link inside libquanta.so: connects lazily to the tenant socket, attaches each
// device the process uses, runs the launch gate (fast path: plain stores to this thread's
// lines and a few loads) and one link thread per process that drains and releases on
// revoke, notices a lapsed lease and reconnects after an arbiter restart. Every failure
// degrades to ungated pass-through.
#include "shim/link.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/sdt.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/clock.h"
#include "common/futex.h"
#include "common/shm_layout.h"
#include "common/wire.h"
#include "shim/arbiter_wire.h"
#include "shim/log.h"
#include "shim/options.h"
#include "shim/real_driver.h"
#include "shim/spin.h"

#ifndef SYS_futex_waitv
#define SYS_futex_waitv 449
#endif

namespace quanta::shim {

namespace {

using common::ControlRegion;
using common::ControlSlot;
using common::GateChannel;
using common::kMaxGpus;
using common::kNsPerMs;
using common::kNsPerSec;
using common::monotonic_ns;
using common::PodRegion;

constexpr uint64_t kGateWaitSliceNs = 100 * kNsPerMs;    // a blocked launcher re-checks the lease this often
constexpr uint64_t kLinkWaitSliceNs = 50 * kNsPerMs;     // the link thread's loop period at most
constexpr uint64_t kBusyGapNs = 10 * kNsPerMs;           // launch gaps longer than this are idleness
constexpr uint32_t kBusyRunLaunches = 4;                 // short gaps in a row before the estimate counts
constexpr uint64_t kInflightClearSlackNs = 200 * 1000;   // lateness allowed before clearing the estimate
constexpr uint32_t kLaunchFlushBatch = 64;               // thread-local launches published at most this late
constexpr uint32_t kMaxGateThreads = 1024;               // threads with their own gate mark; later ones share a counter
constexpr uint64_t kReconnectEveryNs = 100 * kNsPerMs;   // after the arbiter went away
constexpr uint64_t kRefusedRetryNs = 1000 * kNsPerMs;    // after a reconnect was refused
constexpr uint64_t kDefaultLeaseNs = 1000 * kNsPerMs;    // when a region leaves lease_ns at 0
constexpr uint64_t kFirstUseWaitNs = 5 * kNsPerSec;      // how long a thread waits for another's connect
constexpr int kMaxContexts = 512;
constexpr int kMaxRoutes = kMaxGpus * 8;

#define QUANTA_TLS __attribute__((tls_model("initial-exec"))) thread_local

// ---------------------------------------------------------------------------------------
// Process-private futex helpers and a small lock for the socket (no pthread mutex: its
// symbol versions moved in glibc 2.34 and a lock this simple needs none of its features).
// ---------------------------------------------------------------------------------------

void private_wait(std::atomic<uint32_t>* word, uint32_t expected, uint64_t timeout_ns) {
  timespec ts{static_cast<time_t>(timeout_ns / kNsPerSec), static_cast<long>(timeout_ns % kNsPerSec)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected, &ts, nullptr, 0);
}

void private_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
}

class SocketLock {
 public:
  void lock() {
    uint32_t expected = 0;
    if (word_.compare_exchange_strong(expected, 1, std::memory_order_acquire)) return;
    while (word_.exchange(2, std::memory_order_acquire) != 0) private_wait(&word_, 2, kNsPerSec);
  }
  bool try_lock() {
    uint32_t expected = 0;
    return word_.compare_exchange_strong(expected, 1, std::memory_order_acquire);
  }
  void unlock() {
    if (word_.exchange(0, std::memory_order_release) == 2) private_wake_all(&word_);
  }
  void reset() { word_.store(0, std::memory_order_relaxed); }

 private:
  std::atomic<uint32_t> word_{0};  // 0 free, 1 held, 2 held with waiters
};

// ---------------------------------------------------------------------------------------
// State. Fixed tables only: a device binding per CUdevice ordinal, a route per mapping
// generation of a device's gate (never freed, so a launcher holding an old one reads valid
// memory), a context table for device lookups and draining.
// ---------------------------------------------------------------------------------------

enum LinkState : uint32_t { kUntouched = 0, kConnecting = 1, kLinked = 2, kUnplaced = 3 };

// Where one device's gate lives for the current arbiter connection.
struct Route {
  const ControlRegion* control;
  const ControlSlot* slot;
  GateChannel* channel;
  uint32_t gpu_index;
  uint32_t slot_index;
};

enum BindingState : uint32_t {
  kEmpty = 0,      // never used
  kAttaching = 1,  // one thread is attaching it
  kReady = 2,      // has a route
  kPending = 3,    // known, but the arbiter was unreachable: the link thread attaches it later
  kFailed = 4,     // the arbiter or the driver refused: ungated for good
};

struct Binding {
  std::atomic<uint32_t> state{kEmpty};
  std::atomic<Route*> route{nullptr};
  // Launchers past the gate that have no thread mark of their own (see ThreadGate).
  std::atomic<uint32_t> launchers_inside{0};
  std::atomic<uint32_t> lapsed{0};            // the arbiter's heartbeat went stale
  std::atomic<uint32_t> lapse_logged{0};
  // Moving average of the gaps between this process's launches while it is busy: the
  // basis of the queued-work estimate published in GateChannel::inflight_ns.
  std::atomic<uint64_t> gap_average_ns{0};
  std::atomic<uint32_t> busy_run{0};  // consecutive launches at most kBusyGapNs apart
  // Activity stamps: the CLOCK_MONOTONIC_COARSE tick of the last precise stamp, and the
  // channel's launch count then (the gap average divides by launches since).
  std::atomic<uint64_t> stamped_tick{0};
  std::atomic<uint64_t> stamped_launches{0};
  char uuid[common::kUuidLen] = {};
  // Link thread only:
  uint32_t handled_turn = 0;
  bool handled_valid = false;
};

enum ContextState : uint32_t { kCtxFree = 0, kCtxClaiming = 1, kCtxLive = 2, kCtxDraining = 3, kCtxDead = 4 };

struct ContextEntry {
  std::atomic<CUcontext> context{nullptr};
  std::atomic<uint32_t> state{kCtxFree};
  std::atomic<Binding*> binding{nullptr};
};

// A control region mapped for one of the arbiter's GPU indices.
struct ControlMapping {
  const ControlRegion* region = nullptr;
  FileIdentity file;
};

struct Process {
  std::atomic<uint32_t> state{kUntouched};
  std::atomic<uint32_t> epoch{1};  // bumped when cached lookups must be redone
  std::atomic<int> socket_fd{-1};
  std::atomic<int> doorbell_fd{-1};
  std::atomic<uint32_t> connected{0};
  std::atomic<PodRegion*> pod{nullptr};
  std::atomic<uint32_t> proc_index{0};
  std::atomic<uint32_t> pid{0};
  std::atomic<uint32_t> kick{0};  // bumped to wake the link thread (a new binding is ready)
  FileIdentity pod_file;
  uint64_t generation = 0;
  SocketLock socket_lock;
  ControlMapping controls[kMaxGpus];  // under socket_lock
  bool refused_logged = false;
};

Process g_process;
Binding g_bindings[kMaxGpus];
ContextEntry g_contexts[kMaxContexts];
Route g_routes[kMaxRoutes];
std::atomic<uint32_t> g_routes_used{0};
std::atomic<uint32_t> g_atfork_registered{0};

// Per-thread: last context looked up, nesting of launch wrappers, and the re-entrancy
// guard (a driver call made by the link itself must never come back into the gate).
struct LastHit {
  CUcontext context;
  Binding* binding;
  uint32_t epoch;
};
QUANTA_TLS LastHit t_last = {nullptr, nullptr, 0};
// Bindings this thread is inside, innermost last: one per link_gate_enter not yet left (a
// multi-device cooperative launch enters one gate per device before its real call).
constexpr uint32_t kMaxEntered = 16;
QUANTA_TLS uint32_t t_gate_depth = 0;
QUANTA_TLS Binding* t_entered[kMaxEntered] = {};
QUANTA_TLS bool t_in_link = false;

// The revoke handshake (a launcher marks itself inside, then reads the turn; the link thread
// sees the even turn, then waits until no launcher is inside) needs a store-load barrier
// between the mark and the turn read. A lock-prefixed instruction per launch costs tens of
// nanoseconds, so each thread marks a line of its own with a plain store, and the link
// thread, on the rare revoke, issues membarrier(PRIVATE_EXPEDITED): a full barrier on every
// thread of the process, after which each launcher either shows its mark or reads the even
// turn. Where membarrier is unavailable (old kernel, seccomp), the marks are seq_cst stores.
struct alignas(64) ThreadGate {
  std::atomic<uint32_t> owner{0};         // 1 while a live thread owns the record
  std::atomic<uint8_t> inside[kMaxGpus];  // per binding: nesting of this thread's entries
};
ThreadGate g_thread_gates[kMaxGateThreads];
std::atomic<uint32_t> g_thread_gates_used{0};  // records ever claimed (the link thread scans these)
std::atomic<uint32_t> g_asymmetric{0};         // 1: membarrier registered, marks are plain stores
uint64_t g_coarse_tick_ns = 4 * kNsPerMs;       // CLOCK_MONOTONIC_COARSE resolution (link thread)
std::atomic<uint32_t> g_thread_key_state{0};   // 0 none, 1 creating, 2 created, 3 failed
pthread_key_t g_thread_key;
QUANTA_TLS ThreadGate* t_gate = nullptr;
QUANTA_TLS bool t_gate_claimed = false;  // tried once (the record may still be nullptr: pool full)
// Launches counted here and added to GateChannel::launches in batches (at each activity
// stamp, every kLaunchFlushBatch launches and when the thread ends).
QUANTA_TLS uint32_t t_pending_launches[kMaxGpus] = {};

struct InLink {
  bool previous;
  InLink() : previous(t_in_link) { t_in_link = true; }
  ~InLink() { t_in_link = previous; }
};

// ---------------------------------------------------------------------------------------
// Small helpers.
// ---------------------------------------------------------------------------------------

void ring_doorbell() {
  const int fd = g_process.doorbell_fd.load(std::memory_order_acquire);
  if (fd < 0) return;
  const uint64_t one = 1;
  ssize_t rc = write(fd, &one, sizeof one);
  (void)rc;  // EAGAIN: the counter is saturated, the arbiter will look anyway
}

bool lease_stale(const ControlRegion* control, uint64_t now) {
  const uint64_t heartbeat = control->header.heartbeat_ns.load(std::memory_order_acquire);
  uint64_t lease = control->header.lease_ns.load(std::memory_order_relaxed);
  if (lease == 0) lease = kDefaultLeaseNs;
  return now > heartbeat && now - heartbeat > lease;
}

uint64_t coarse_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * kNsPerSec + static_cast<uint64_t>(ts.tv_nsec);
}

uint32_t binding_index(const Binding* binding) { return static_cast<uint32_t>(binding - g_bindings); }

// ---------------------------------------------------------------------------------------
// Thread gate marks (see ThreadGate).
// ---------------------------------------------------------------------------------------

void publish_pending_launches(uint32_t index) {
  const uint32_t pending = t_pending_launches[index];
  if (pending == 0) return;
  t_pending_launches[index] = 0;
  const Route* route = g_bindings[index].route.load(std::memory_order_acquire);
  if (route) route->channel->launches.fetch_add(pending, std::memory_order_relaxed);
}

// pthread key destructor: the thread ends, its counts are published and its record freed.
void thread_gate_exit(void* record) {
  for (uint32_t index = 0; index < kMaxGpus; ++index) publish_pending_launches(index);
  if (record != t_gate || t_gate == nullptr) return;  // no record of its own (pool full)
  t_gate = nullptr;
  static_cast<ThreadGate*>(record)->owner.store(0, std::memory_order_release);
}

void claim_thread_gate() {
  t_gate_claimed = true;
  uint32_t key_state = g_thread_key_state.load(std::memory_order_acquire);
  if (key_state == 0 && g_thread_key_state.compare_exchange_strong(key_state, 1, std::memory_order_acq_rel)) {
    key_state = pthread_key_create(&g_thread_key, &thread_gate_exit) == 0 ? 2 : 3;
    g_thread_key_state.store(key_state, std::memory_order_release);
  }
  while ((key_state = g_thread_key_state.load(std::memory_order_acquire)) == 1) cpu_relax();
  if (key_state != 2) return;  // no way to free a record at thread exit: use the shared counter
  for (uint32_t i = 0; i < kMaxGateThreads; ++i) {
    uint32_t expected = 0;
    if (!g_thread_gates[i].owner.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) continue;
    // Raised before the first mark, so a link thread that sees the mark scans this record.
    uint32_t used = g_thread_gates_used.load(std::memory_order_relaxed);
    while (used < i + 1 && !g_thread_gates_used.compare_exchange_weak(used, i + 1, std::memory_order_seq_cst)) {
    }
    t_gate = &g_thread_gates[i];
    pthread_setspecific(g_thread_key, t_gate);
    return;
  }
  // Pool full: only the pending launch counts need the destructor.
  pthread_setspecific(g_thread_key, &g_thread_key_state);
}

// Marks this thread inside the gate of `binding`; the caller reads the turn next.
inline void mark_inside(Binding* binding) {
  ThreadGate* gate = t_gate;
  if (__builtin_expect(gate == nullptr, 0)) {
    binding->launchers_inside.fetch_add(1, std::memory_order_seq_cst);
    return;
  }
  std::atomic<uint8_t>& mark = gate->inside[binding_index(binding)];
  const uint8_t value = static_cast<uint8_t>(mark.load(std::memory_order_relaxed) + 1);
  if (__builtin_expect(g_asymmetric.load(std::memory_order_relaxed) != 0, 1)) {
    mark.store(value, std::memory_order_relaxed);
    std::atomic_signal_fence(std::memory_order_seq_cst);  // the compiler keeps the turn read after it
  } else {
    mark.store(value, std::memory_order_seq_cst);
  }
}

inline void mark_outside(Binding* binding) {
  ThreadGate* gate = t_gate;
  if (__builtin_expect(gate == nullptr, 0)) {
    binding->launchers_inside.fetch_sub(1, std::memory_order_release);
    return;
  }
  std::atomic<uint8_t>& mark = gate->inside[binding_index(binding)];
  mark.store(static_cast<uint8_t>(mark.load(std::memory_order_relaxed) - 1), std::memory_order_release);
}

// Link thread, after it saw an even turn: true while a launcher that read the odd turn
// before it may still be submitting.
bool anyone_inside(const Binding* binding) {
  if (binding->launchers_inside.load(std::memory_order_seq_cst) != 0) return true;
  const uint32_t index = binding_index(binding);
  const uint32_t used = g_thread_gates_used.load(std::memory_order_seq_cst);
  for (uint32_t i = 0; i < used; ++i) {
    if (g_thread_gates[i].inside[index].load(std::memory_order_seq_cst) != 0) return true;
  }
  return false;
}

// The heavy half of the asymmetric barrier: after it, every launcher's plain mark store is
// visible or that launcher reads the turn the link thread already saw.
void launcher_barrier() {
  if (!g_asymmetric.load(std::memory_order_relaxed)) return;
  if (syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0) return;
  // Registered expedited membarrier does not fail; should it, marks become seq_cst from
  // now on and the launchers that used a plain store get a millisecond to show it.
  g_asymmetric.store(0, std::memory_order_seq_cst);
  timespec pause{0, static_cast<long>(kNsPerMs)};
  nanosleep(&pause, nullptr);
}

void register_launcher_barrier() {
  if (g_asymmetric.load(std::memory_order_relaxed)) return;
  if (syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0) {
    g_asymmetric.store(1, std::memory_order_seq_cst);
  } else {
    QUANTA_LOG_INFO("membarrier unavailable: each launch marks the gate with a locked store");
  }
}

void copy_text(char* out, size_t capacity, const char* text) {
  size_t length = strnlen(text, capacity - 1);
  memcpy(out, text, length);
  out[length] = '\0';
}

// strerror may allocate in a preloaded library's worst moment; the few reasons a connect
// fails get their own words, anything else its number.
void describe_errno(int error, char* out, size_t capacity) {
  switch (error) {
    case ENOENT: copy_text(out, capacity, "no socket there"); return;
    case ECONNREFUSED: copy_text(out, capacity, "connection refused"); return;
    case EACCES: copy_text(out, capacity, "permission denied"); return;
    case ENAMETOOLONG: copy_text(out, capacity, "socket path too long"); return;
    default: break;
  }
  char digits[16];
  int length = 0;
  unsigned value = error < 0 ? 0u : static_cast<unsigned>(error);
  do {
    digits[length++] = static_cast<char>('0' + value % 10);
    value /= 10;
  } while (value != 0 && length < 15);
  char text[32] = "errno ";
  size_t at = 6;
  while (length > 0) text[at++] = digits[--length];
  text[at] = '\0';
  copy_text(out, capacity, text);
}

// nvidia-smi's form: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, lower-case hex.
void format_uuid(const char* prefix, const unsigned char bytes[16], char out[common::kUuidLen]) {
  static constexpr char kHex[] = "0123456789abcdef";
  size_t at = 0;
  for (const char* p = prefix; *p; ++p) out[at++] = *p;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out[at++] = '-';
    out[at++] = kHex[bytes[i] >> 4];
    out[at++] = kHex[bytes[i] & 15];
  }
  out[at] = '\0';
}

// The device's UUID as the arbiter names it. A MIG instance is told apart from its GPU
// the way the driver allows: the legacy cuDeviceGetUuid answers with the parent GPU's
// UUID, the _v2 entry with the instance's own.
bool device_uuid(CUdevice device, char out[common::kUuidLen]) {
  auto get_v2 = QUANTA_REAL(cuDeviceGetUuid_v2);
  if (!get_v2) return false;
  CUuuid uuid{};
  if (get_v2(&uuid, device) != CUDA_SUCCESS) return false;
  const char* prefix = "GPU-";
  using GetUuidV1 = CUresult (*)(CUuuid*, CUdevice);
  static std::atomic<void*> v1_cache{nullptr};
  auto get_v1 = cached_real<GetUuidV1>(v1_cache, "cuDeviceGetUuid", &real_driver_symbol);
  CUuuid parent{};
  if (get_v1 && get_v1(&parent, device) == CUDA_SUCCESS && memcmp(parent.bytes, uuid.bytes, 16) != 0) prefix = "MIG-";
  format_uuid(prefix, reinterpret_cast<const unsigned char*>(uuid.bytes), out);
  return true;
}

// The device a context belongs to, without disturbing the caller's current context for
// longer than the lookup.
bool context_device(CUcontext context, CUdevice* device) {
  using GetDeviceV2 = CUresult (*)(CUdevice*, CUcontext);
  static std::atomic<void*> v2_cache{nullptr};
  if (auto get_v2 = cached_real<GetDeviceV2>(v2_cache, "cuCtxGetDevice_v2", &real_driver_symbol)) {
    if (get_v2(device, context) == CUDA_SUCCESS) return true;
  }
  auto get_current = QUANTA_REAL(cuCtxGetCurrent);
  auto get_device = QUANTA_REAL(cuCtxGetDevice);
  auto push = QUANTA_REAL(cuCtxPushCurrent_v2);
  auto pop = QUANTA_REAL(cuCtxPopCurrent_v2);
  if (!get_current || !get_device || !push || !pop) return false;
  CUcontext current = nullptr;
  if (get_current(&current) != CUDA_SUCCESS) return false;
  if (current == context) return get_device(device) == CUDA_SUCCESS;
  if (push(context) != CUDA_SUCCESS) return false;
  const bool ok = get_device(device) == CUDA_SUCCESS;
  CUcontext popped = nullptr;
  pop(&popped);
  return ok;
}

Route* new_route(const ControlRegion* control, PodRegion* pod, uint32_t proc_index, uint32_t gpu_index,
                 uint32_t slot_index) {
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

union Reply {
  common::MessageHeader header;
  common::WelcomeMessage welcome;
  common::RefusedMessage refused;
  common::AttachedMessage attached;
  common::AttachFailedMessage attach_failed;
};

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
  Reply reply;
  int fds[2] = {-1, -1};
  int fd_count = 0;
  long received = -1;
  if (wire_send(fd, &hello, sizeof hello)) received = wire_receive(fd, &reply, sizeof reply, fds, 2, &fd_count);
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
    copy_text(result.text, sizeof result.text, "welcome without pod region and doorbell, or a bad process index");
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
  if (fd < 0 || !pod || !g_process.connected.load(std::memory_order_acquire)) return AttachOutcome::kUnreachable;
  common::AttachMessage attach{};
  attach.header = common::make_header<common::AttachMessage>(common::MessageType::kAttach);
  copy_text(attach.uuid, sizeof attach.uuid, binding->uuid);
  Reply reply;
  int fds[1] = {-1};
  int fd_count = 0;
  long received = -1;
  if (wire_send(fd, &attach, sizeof attach)) received = wire_receive(fd, &reply, sizeof reply, fds, 1, &fd_count);
  if (received <= 0 || !wire_message_valid(reply.header, received)) {
    close_all(fds, fd_count);
    g_process.connected.store(0, std::memory_order_release);
    return AttachOutcome::kUnreachable;
  }
  if (reply.header.type == common::MessageType::kAttachFailed) {
    close_all(fds, fd_count);
    QUANTA_LOG_WARN("the arbiter did not attach %s (%.200s): launches on it run ungated and uncapped", binding->uuid,
                    reply.attach_failed.reason);
    return AttachOutcome::kRefused;
  }
  const common::AttachedMessage& attached = reply.attached;
  if (reply.header.type != common::MessageType::kAttached || attached.gpu_index >= kMaxGpus ||
      attached.slot >= common::kMaxSlotsPerGpu || (attached.fd_attached != 0) != (fd_count == 1)) {
    close_all(fds, fd_count);
    QUANTA_LOG_WARN("the arbiter's reply to attaching %s is malformed: launches on it run ungated", binding->uuid);
    return AttachOutcome::kRefused;
  }
  ControlMapping& mapping = g_process.controls[attached.gpu_index];
  if (fd_count == 1) {
    FileIdentity identity;
    const bool known = file_identity(fds[0], &identity) && mapping.region && identity == mapping.file;
    if (!known) {
      const char* why = "";
      const ControlRegion* region = map_control_region(fds[0], &why);
      if (!region || region->header.gpu_index != attached.gpu_index) {
        close(fds[0]);
        QUANTA_LOG_WARN("control region for %s rejected (%s): launches on it run ungated", binding->uuid,
                        region ? "its GPU index differs from the attach reply" : why);
        return AttachOutcome::kRefused;
      }
      mapping.region = region;
      mapping.file = identity;
    }
    close(fds[0]);
  }
  if (!mapping.region) {
    QUANTA_LOG_WARN("the arbiter attached %s without ever passing its control region: ungated", binding->uuid);
    return AttachOutcome::kRefused;
  }
  const uint32_t proc_index = g_process.proc_index.load(std::memory_order_relaxed);
  Route* current = binding->route.load(std::memory_order_acquire);
  if (current && current->control == mapping.region && current->gpu_index == attached.gpu_index &&
      current->slot_index == attached.slot && current->channel == &pod->procs[proc_index].gpus[attached.gpu_index]) {
    return AttachOutcome::kAttached;
  }
  Route* route = new_route(mapping.region, pod, proc_index, attached.gpu_index, attached.slot);
  if (!route) {
    QUANTA_LOG_WARN("too many arbiter restarts to remap %s again: keeping the previous mapping", binding->uuid);
    return current ? AttachOutcome::kAttached : AttachOutcome::kRefused;
  }
  binding->route.store(route, std::memory_order_release);
  return AttachOutcome::kAttached;
}

// ---------------------------------------------------------------------------------------
// Fork: the child is a new process to the arbiter. It keeps no link and connects lazily.
// ---------------------------------------------------------------------------------------

void reset_in_child() {
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
    binding.stamped_tick.store(0);
    binding.stamped_launches.store(0);
    binding.lapsed.store(0);
    binding.lapse_logged.store(0);
    binding.gap_average_ns.store(0);
    binding.busy_run.store(0);
    binding.handled_valid = false;
  }
  for (ContextEntry& entry : g_contexts) {
    entry.state.store(kCtxFree);
    entry.binding.store(nullptr);
    entry.context.store(nullptr);
  }
  // Only this thread lives on in the child: every record is free again, and the
  // membarrier registration is redone when the child links.
  for (ThreadGate& gate : g_thread_gates) {
    gate.owner.store(0);
    for (std::atomic<uint8_t>& mark : gate.inside) mark.store(0);
  }
  g_thread_gates_used.store(0);
  g_asymmetric.store(0);
  if (g_thread_key_state.load() == 2) pthread_setspecific(g_thread_key, nullptr);
  t_gate = nullptr;
  t_gate_claimed = false;
  for (uint32_t& pending : t_pending_launches) pending = 0;
  t_last = LastHit{nullptr, nullptr, 0};
  t_gate_depth = 0;
  t_in_link = false;
  g_process.epoch.fetch_add(1);
  g_process.state.store(kUntouched, std::memory_order_release);
}

// ---------------------------------------------------------------------------------------
// The link thread.
// ---------------------------------------------------------------------------------------

// Finishes this process's work on the device of `binding`: every context it launched on
// there is synchronised, so the next tenant's quantum starts on an idle engine.
void drain(Binding* binding) {
  auto push = QUANTA_REAL(cuCtxPushCurrent_v2);
  auto pop = QUANTA_REAL(cuCtxPopCurrent_v2);
  auto synchronize = QUANTA_REAL(cuCtxSynchronize);
  if (!push || !pop || !synchronize) return;
  for (ContextEntry& entry : g_contexts) {
    if (entry.binding.load(std::memory_order_acquire) != binding) continue;
    uint32_t expected = kCtxLive;
    if (!entry.state.compare_exchange_strong(expected, kCtxDraining, std::memory_order_acq_rel)) continue;
    CUcontext context = entry.context.load(std::memory_order_acquire);
    if (push(context) == CUDA_SUCCESS) {
      synchronize();  // a failure here is the application's to see on its own next call
      CUcontext popped = nullptr;
      pop(&popped);
    }
    entry.state.store(kCtxLive, std::memory_order_release);
  }
}

// Link thread: clears the estimate once the process stopped launching for that long, so an
// idle holder is released. Returns how soon it wants to look again (0: nothing pending).
// A stamp made while nobody waited (stamped_tick set) may be up to one coarse tick older
// than the latest launch, so it counts from the end of that tick.
uint64_t expire_inflight(const Binding* binding, const Route* route, uint64_t now) {
  GateChannel* channel = route->channel;
  const uint64_t estimate = channel->inflight_ns.load(std::memory_order_relaxed);
  if (estimate == 0) return 0;
  const uint64_t stale = binding->stamped_tick.load(std::memory_order_relaxed) != 0 ? g_coarse_tick_ns : 0;
  const uint64_t expires =
      channel->last_launch_ns.load(std::memory_order_relaxed) + stale + estimate + kInflightClearSlackNs;
  if (now >= expires) {
    channel->inflight_ns.store(0, std::memory_order_relaxed);
    return 0;
  }
  return expires - now;
}

// A revoke: wait until no launcher of this process is inside the gate (later ones see the
// even turn and block), drain, then publish the release and wake the arbiter.
void release(Binding* binding, const Route* route, uint32_t turn) {
  launcher_barrier();
  for (uint32_t spins = 0; anyone_inside(binding); ++spins) {
    if (spins < 64) {
      cpu_relax();
    } else if (spins < 1024) {
      sched_yield();
    } else {
      timespec pause{0, 20000};
      nanosleep(&pause, nullptr);
    }
  }
  drain(binding);
  route->channel->released_turn.store(turn, std::memory_order_release);
  ring_doorbell();
  DTRACE_PROBE2(quanta, release, route->gpu_index, route->slot_index);
  binding->handled_turn = turn;
  binding->handled_valid = true;
}

void check_lease(Binding* binding, const Route* route, uint64_t now) {
  const bool stale = lease_stale(route->control, now);
  const uint32_t was = binding->lapsed.load(std::memory_order_relaxed);
  if (stale && !was) {
    binding->lapsed.store(1, std::memory_order_relaxed);
    if (!binding->lapse_logged.exchange(1, std::memory_order_relaxed)) {
      QUANTA_LOG_WARN("the arbiter's lease on %s lapsed: launches run ungated until it is back (memory caps stay)",
                      binding->uuid);
    }
  } else if (!stale && was) {
    binding->lapsed.store(0, std::memory_order_relaxed);
    binding->lapse_logged.store(0, std::memory_order_relaxed);
    QUANTA_LOG_INFO("the arbiter's lease on %s is back: gating resumed", binding->uuid);
  }
}

// Looks at the socket without taking a message: end of stream means the arbiter is gone.
// Anything unexpected that arrived on it is read and discarded with its descriptors.
void check_socket() {
  if (!g_process.connected.load(std::memory_order_acquire)) return;
  if (!g_process.socket_lock.try_lock()) return;  // a request is in flight: it will notice
  const int fd = g_process.socket_fd.load(std::memory_order_acquire);
  char probe;
  const ssize_t peeked = recv(fd, &probe, 1, MSG_PEEK | MSG_DONTWAIT);
  if (peeked == 0 || (peeked < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
    g_process.connected.store(0, std::memory_order_release);
    QUANTA_LOG_WARN("lost the arbiter connection: memory caps stay, gating lapses with the lease; reconnecting");
  } else if (peeked > 0) {
    Reply stray;
    int fds[4];
    int count = 0;
    wire_receive(fd, &stray, sizeof stray, fds, 4, &count);
    close_all(fds, count);
  }
  g_process.socket_lock.unlock();
}

// After the arbiter went away: hello again and re-attach every device this process knows.
// Returns false while the arbiter is still unreachable.
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
      QUANTA_LOG_WARN("reconnected, but the pod region was rejected (%s): keeping the previous one", why);
    }
  } else if (hello.outcome == HelloOutcome::kRefused) {
    *refused = true;
    if (!g_process.refused_logged) {
      g_process.refused_logged = true;
      QUANTA_LOG_WARN("the restarted arbiter refused this process (%s): caps stay as they were, gating lapses",
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
    QUANTA_LOG_INFO("reconnected to the arbiter (generation %llu)", static_cast<unsigned long long>(g_process.generation));
  }
  return ok;
}

struct WaitEntry {  // struct futex_waitv, spelled out for older kernel headers
  uint64_t val;
  uint64_t uaddr;
  uint32_t flags;
  uint32_t reserved;
};
constexpr uint32_t kFutex32 = 2;
constexpr uint32_t kFutexPrivate = 128;

// Sleeps until a watched turn word changes, the kick word changes, or the slice ends.
void wait_for_change(WaitEntry* entries, int count, uint64_t timeout_ns, bool* waitv_missing) {
  if (!*waitv_missing) {
    timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    const uint64_t end = static_cast<uint64_t>(deadline.tv_sec) * kNsPerSec + static_cast<uint64_t>(deadline.tv_nsec) +
                         timeout_ns;
    deadline.tv_sec = static_cast<time_t>(end / kNsPerSec);
    deadline.tv_nsec = static_cast<long>(end % kNsPerSec);
    const long rc = syscall(SYS_futex_waitv, entries, count, 0, &deadline, CLOCK_MONOTONIC);
    if (rc >= 0 || errno != ENOSYS) return;
    *waitv_missing = true;
    QUANTA_LOG_INFO("futex_waitv unavailable (Linux < 5.16): the link thread polls revokes every millisecond");
  }
  // Older kernels: wait on the first turn word briefly, poll the rest.
  if (count > 1) {
    common::futex_wait(reinterpret_cast<const std::atomic<uint32_t>*>(entries[1].uaddr),
                       static_cast<uint32_t>(entries[1].val), kNsPerMs);
  } else {
    timespec pause{0, static_cast<long>(kNsPerMs)};
    nanosleep(&pause, nullptr);
  }
}

void* link_thread_main(void*) {
  t_in_link = true;
  prctl(PR_SET_NAME, "quanta-link", 0, 0, 0);
  timespec resolution;
  if (clock_getres(CLOCK_MONOTONIC_COARSE, &resolution) == 0)
    g_coarse_tick_ns = static_cast<uint64_t>(resolution.tv_sec) * kNsPerSec + static_cast<uint64_t>(resolution.tv_nsec);
  bool waitv_missing = false;
  uint64_t next_reconnect = 0;
  WaitEntry entries[1 + kMaxGpus];
  for (;;) {
    int count = 0;
    entries[count++] = WaitEntry{g_process.kick.load(std::memory_order_acquire),
                                 reinterpret_cast<uint64_t>(&g_process.kick), kFutex32 | kFutexPrivate, 0};
    for (Binding& binding : g_bindings) {
      const Route* route = binding.route.load(std::memory_order_acquire);
      if (!route || binding.state.load(std::memory_order_acquire) != kReady) continue;
      const uint32_t turn = route->slot->turn.load(std::memory_order_seq_cst);
      if (!(turn & 1u) && !(binding.handled_valid && binding.handled_turn == turn)) {
        release(&binding, route, turn);
      }
      entries[count++] = WaitEntry{route->slot->turn.load(std::memory_order_acquire),
                                   reinterpret_cast<uint64_t>(&route->slot->turn), kFutex32, 0};
    }
    // While this process holds a GPU others wait for, look again when its queued-work
    // estimate would expire, so an idle holder is released promptly.
    uint64_t timeout = kLinkWaitSliceNs;
    uint64_t now = monotonic_ns();
    for (Binding& binding : g_bindings) {
      const Route* route = binding.route.load(std::memory_order_acquire);
      if (!route) continue;
      const uint64_t again = expire_inflight(&binding, route, now);
      if (again != 0 && again < timeout) timeout = again;
    }
    wait_for_change(entries, count, timeout, &waitv_missing);

    now = monotonic_ns();
    for (Binding& binding : g_bindings) {
      const Route* route = binding.route.load(std::memory_order_acquire);
      if (!route) continue;
      check_lease(&binding, route, now);
      expire_inflight(&binding, route, now);
    }
    check_socket();
    if (!g_process.connected.load(std::memory_order_acquire) && now >= next_reconnect) {
      bool refused = false;
      if (!reconnect(&refused)) next_reconnect = now + (refused ? kRefusedRetryNs : kReconnectEveryNs);
    }
  }
  return nullptr;
}

bool start_link_thread() {
  sigset_t all, previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);  // signals stay with the application's threads
  pthread_t thread;
  const int rc = pthread_create(&thread, nullptr, &link_thread_main, nullptr);
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  if (rc != 0) return false;
  pthread_detach(thread);
  return true;
}

// ---------------------------------------------------------------------------------------
// First use: connect, hello, welcome, start the link thread. Exactly one thread does it;
// others wait (bounded), and a call re-entering from inside it passes ungated.
// ---------------------------------------------------------------------------------------

void connect_first_time() {
  InLink guard;
  if (!g_atfork_registered.exchange(1)) pthread_atfork(nullptr, nullptr, &reset_in_child);
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
      QUANTA_LOG_WARN("the pod region from the arbiter was rejected (%s): running ungated and uncapped", why);
    }
  } else if (hello.outcome == HelloOutcome::kRefused) {
    QUANTA_LOG_WARN("the arbiter refused this process: %s; running ungated and uncapped", hello.text);
  } else if (hello.outcome == HelloOutcome::kNoArbiter) {
    QUANTA_LOG_INFO("no arbiter at %s (%s): running ungated and uncapped", options().socket_path, hello.text);
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

// True when this process is linked to an arbiter (possibly disconnected for now).
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

// The binding of a device ordinal, attached on first use. Never nullptr for an ordinal in
// range once linked; its route may be nullptr (ungated).
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
      if (!device_uuid(device, binding->uuid)) {
        QUANTA_LOG_WARN("cannot read the UUID of device %d: launches on it run ungated and uncapped", device);
      } else {
        g_process.socket_lock.lock();
        const AttachOutcome outcome = attach_locked(binding);
        g_process.socket_lock.unlock();
        next = outcome == AttachOutcome::kAttached ? kReady
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

size_t context_hash(CUcontext context) {
  auto bits = reinterpret_cast<uintptr_t>(context);
  bits ^= bits >> 17;
  bits *= 0x9e3779b97f4a7c15ull;
  return static_cast<size_t>(bits >> 40) % kMaxContexts;
}

// Records which binding a context's launches go through (once per context).
Binding* register_context(CUcontext context) {
  CUdevice device = -1;
  {
    InLink guard;
    if (!context_device(context, &device)) return nullptr;
  }
  Binding* binding = ensure_binding(device);
  if (!binding) return nullptr;
  const size_t start = context_hash(context);
  for (size_t probe = 0; probe < static_cast<size_t>(kMaxContexts); ++probe) {
    ContextEntry& entry = g_contexts[(start + probe) % kMaxContexts];
    CUcontext key = entry.context.load(std::memory_order_acquire);
    if (key == nullptr) {
      if (!entry.context.compare_exchange_strong(key, context, std::memory_order_acq_rel)) {
        if (key != context) continue;  // another context took it
      } else {
        entry.binding.store(binding, std::memory_order_release);
        entry.state.store(kCtxLive, std::memory_order_release);
        return binding;
      }
    }
    if (key != context) continue;
    uint32_t state = entry.state.load(std::memory_order_acquire);
    if (state == kCtxDead && entry.state.compare_exchange_strong(state, kCtxClaiming, std::memory_order_acq_rel)) {
      entry.binding.store(binding, std::memory_order_release);
      entry.state.store(kCtxLive, std::memory_order_release);
    }
    return binding;  // live, draining or being claimed by another thread: same binding
  }
  QUANTA_LOG_WARN("more than %d CUDA contexts: the newest run ungated", kMaxContexts);
  return nullptr;
}

Binding* lookup_context(CUcontext context) {
  const size_t start = context_hash(context);
  for (size_t probe = 0; probe < static_cast<size_t>(kMaxContexts); ++probe) {
    ContextEntry& entry = g_contexts[(start + probe) % kMaxContexts];
    CUcontext key = entry.context.load(std::memory_order_acquire);
    if (key == nullptr) return nullptr;
    if (key != context) continue;
    uint32_t state;
    while ((state = entry.state.load(std::memory_order_acquire)) == kCtxFree || state == kCtxClaiming) cpu_relax();
    return state == kCtxDead ? nullptr : entry.binding.load(std::memory_order_acquire);
  }
  return nullptr;
}

// The binding a launch on `context` goes through: a couple of thread-local loads when the
// same thread launches on the same context again.
Binding* binding_for_context(CUcontext context) {
  if (context == nullptr) {
    auto get_current = QUANTA_REAL(cuCtxGetCurrent);
    if (!get_current || get_current(&context) != CUDA_SUCCESS || context == nullptr) return nullptr;
  }
  const uint32_t epoch = g_process.epoch.load(std::memory_order_acquire);
  if (__builtin_expect(t_last.context == context && t_last.epoch == epoch, 1)) return t_last.binding;
  if (!ensure_linked()) return nullptr;
  Binding* binding = lookup_context(context);
  if (!binding) binding = register_context(context);
  t_last = LastHit{context, binding, epoch};
  return binding;
}

// Launch statistics and the queued-work estimate. The arbiter revokes a holder early only
// when inflight_ns is 0 and it launched nothing for idle_release; a process that launches
// once per completed kernel (gaps as long as its kernels) must not look idle between
// launches, so while launches keep coming at most kBusyGapNs apart the estimate is two
// average gaps, and the link thread clears it once that long passed without a launch.
//
// A precise clock read per launch costs more than the rest of the gate, so launches are
// counted per thread and last_launch_ns is stamped precisely only when someone can use it:
// at every launch while other tenants wait for this GPU (ControlHeader::waiters; the arbiter
// decides idleness only then, and counts from the moment it published the waiters), and
// otherwise at the first launch of each coarse clock tick (4 ms here), which keeps the
// estimate alive for the adaptive quantum. The gap average divides the time between stamps
// by the launches between them.
void stamp_launch(Binding* binding, const Route* route, uint32_t index, uint64_t tick) {
  GateChannel* channel = route->channel;
  const uint32_t pending = t_pending_launches[index];
  t_pending_launches[index] = 0;
  const uint64_t launches = channel->launches.fetch_add(pending, std::memory_order_relaxed) + pending;
  const uint64_t now = monotonic_ns();
  binding->stamped_tick.store(tick, std::memory_order_relaxed);
  const uint64_t previous = channel->last_launch_ns.load(std::memory_order_relaxed);
  const uint64_t previous_launches = binding->stamped_launches.load(std::memory_order_relaxed);
  binding->stamped_launches.store(launches, std::memory_order_relaxed);
  channel->last_launch_ns.store(now, std::memory_order_relaxed);
  if (previous == 0 || now <= previous) return;
  const uint64_t count = launches > previous_launches ? launches - previous_launches : 1;
  const uint64_t gap = (now - previous) / count;
  if (gap >= kBusyGapNs) {
    if (binding->busy_run.load(std::memory_order_relaxed) != 0) binding->busy_run.store(0, std::memory_order_relaxed);
    return;
  }
  uint64_t average = binding->gap_average_ns.load(std::memory_order_relaxed);
  average = average - average / 8 + gap / 8;
  binding->gap_average_ns.store(average, std::memory_order_relaxed);
  // A single short gap is no stream (a request that waited at the gate, then the next one
  // on schedule): only a run of them says work keeps being queued.
  const uint32_t run = binding->busy_run.load(std::memory_order_relaxed);
  if (run < kBusyRunLaunches) {
    binding->busy_run.store(run + 1, std::memory_order_relaxed);
    return;
  }
  const uint64_t estimate = 2 * average + 1;
  if (channel->inflight_ns.load(std::memory_order_relaxed) != estimate)
    channel->inflight_ns.store(estimate, std::memory_order_relaxed);
}

inline void note_launch(Binding* binding, const Route* route) {
  const uint32_t index = binding_index(binding);
  const uint32_t pending = ++t_pending_launches[index];
  if (route->control->header.waiters.load(std::memory_order_relaxed) != 0) {
    stamp_launch(binding, route, index, 0);
    return;
  }
  const uint64_t tick = coarse_ns();
  if (__builtin_expect(tick == binding->stamped_tick.load(std::memory_order_relaxed), 1)) {
    if (__builtin_expect(pending >= kLaunchFlushBatch, 0)) publish_pending_launches(index);
    return;
  }
  stamp_launch(binding, route, index, tick);
}

void record_wait(const Route* route, uint64_t waited_ns) {
  GateChannel* channel = route->channel;
  channel->gate_waits.fetch_add(1, std::memory_order_relaxed);
  channel->gate_wait_ns.fetch_add(waited_ns, std::memory_order_relaxed);
  uint64_t max = channel->gate_wait_max_ns.load(std::memory_order_relaxed);
  while (waited_ns > max &&
         !channel->gate_wait_max_ns.compare_exchange_weak(max, waited_ns, std::memory_order_relaxed)) {
  }
  DTRACE_PROBE3(quanta, gate_wait_end, route->gpu_index, route->slot_index, waited_ns);
}

// The slow path: ask for the GPU, wake the arbiter, sleep on the turn word. Returns with
// this thread marked inside, either granted or passing because the lease lapsed or the
// slot is no longer this process's.
void gate_slow(Binding* binding, const Route* route) {
  const uint64_t begin = monotonic_ns();
  DTRACE_PROBE2(quanta, gate_wait_begin, route->gpu_index, route->slot_index);
  const uint32_t pid = g_process.pid.load(std::memory_order_relaxed);
  uint64_t rang_at = 0;
  for (;;) {
    const Route* current = binding->route.load(std::memory_order_acquire);
    if (current) route = current;
    mark_inside(binding);
    const uint32_t turn = route->slot->turn.load(std::memory_order_seq_cst);
    if (turn & 1u) {
      route->channel->want.store(0, std::memory_order_relaxed);
      break;
    }
    mark_outside(binding);
    const uint64_t now = monotonic_ns();
    if (lease_stale(route->control, now)) {
      binding->lapsed.store(1, std::memory_order_relaxed);
      if (!binding->lapse_logged.exchange(1, std::memory_order_relaxed)) {
        QUANTA_LOG_WARN("the arbiter's lease on %s lapsed: launches run ungated until it is back (memory caps stay)",
                        binding->uuid);
      }
      mark_inside(binding);
      break;
    }
    if (route->slot->pid.load(std::memory_order_relaxed) != pid) {
      mark_inside(binding);  // not ours now: ungated
      break;
    }
    if (rang_at == 0 || now - rang_at >= kGateWaitSliceNs) {
      route->channel->want.store(1, std::memory_order_seq_cst);
      ring_doorbell();
      rang_at = now;
    }
    common::futex_wait(&route->slot->turn, turn, kGateWaitSliceNs);
  }
  record_wait(route, monotonic_ns() - begin);
  note_launch(binding, route);
}

}  // namespace

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

void link_gate_enter(CUcontext context) {
  const uint32_t depth = t_gate_depth++;
  if (depth >= kMaxEntered) return;  // deeper than any real caller goes: ungated
  t_entered[depth] = nullptr;
  if (t_in_link) return;
  Binding* binding = binding_for_context(context);
  if (!binding) return;
  if (__builtin_expect(!t_gate_claimed, 0)) claim_thread_gate();
  t_entered[depth] = binding;
  mark_inside(binding);
  const Route* route = binding->route.load(std::memory_order_acquire);
  if (!route) return;  // device not attached: ungated
  const uint32_t turn = route->slot->turn.load(std::memory_order_seq_cst);
  if (__builtin_expect(turn & 1u, 1)) {
    note_launch(binding, route);
    return;
  }
  if (binding->lapsed.load(std::memory_order_relaxed) && lease_stale(route->control, monotonic_ns())) {
    note_launch(binding, route);
    return;
  }
  mark_outside(binding);
  gate_slow(binding, route);
}

void link_gate_leave(CUcontext /*context*/, CUresult /*launched*/) {
  if (t_gate_depth == 0) return;
  const uint32_t depth = --t_gate_depth;
  if (depth >= kMaxEntered) return;
  Binding* binding = t_entered[depth];
  t_entered[depth] = nullptr;
  if (binding) mark_outside(binding);
}

void link_forget_context(CUcontext context) {
  if (context == nullptr) return;
  const size_t start = context_hash(context);
  for (size_t probe = 0; probe < static_cast<size_t>(kMaxContexts); ++probe) {
    ContextEntry& entry = g_contexts[(start + probe) % kMaxContexts];
    CUcontext key = entry.context.load(std::memory_order_acquire);
    if (key == nullptr) return;
    if (key != context) continue;
    // Wait out a drain in progress on this context before the driver destroys it.
    for (;;) {
      uint32_t state = entry.state.load(std::memory_order_acquire);
      if (state == kCtxDead || state == kCtxFree) break;
      if (state == kCtxDraining || state == kCtxClaiming) {
        sched_yield();
        continue;
      }
      if (entry.state.compare_exchange_weak(state, kCtxDead, std::memory_order_acq_rel)) break;
    }
    g_process.epoch.fetch_add(1, std::memory_order_release);
    return;
  }
}

}  // namespace quanta::shim
