// A test-only arbiter link for libquanta_testlink.so: memory accounts live in a shared
// file (QUANTA_FAKE_LEDGER, layout in fake_ledger.h) keyed by device UUID, with the cap
// from QUANTA_FAKE_CAP; gate calls are only counted. Lets the ledger, views and every
// lookup path be tested across processes before and apart from the arbiter.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "common/policy.h"
#include "shim/base/options.h"
#include "shim/interpose/devices.h"
#include "shim/interpose/real_driver.h"
#include "shim/link.h"
#include "tests/shim/fake_ledger.h"

namespace quanta::shim {

namespace {

template <typename T>
std::atomic<T>* atomic_at(T* word) {
  static_assert(sizeof(std::atomic<T>) == sizeof(T));
  return reinterpret_cast<std::atomic<T>*>(word);
}

fake_ledger* g_ledger = nullptr;
std::atomic<int> g_state{0};  // 0 unopened, 1 opening, 2 open, 3 none
std::atomic<uint64_t> g_process_used[FAKE_LEDGER_DEVICES];

fake_ledger* ledger() {
  if (g_state.load(std::memory_order_acquire) == 2) return g_ledger;
  int expected = 0;
  if (g_state.compare_exchange_strong(expected, 1)) {
    const char* path = getenv("QUANTA_FAKE_LEDGER");
    int fd = path ? open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600) : -1;
    void* memory = MAP_FAILED;
    if (fd >= 0) {
      if (ftruncate(fd, sizeof(fake_ledger)) == 0)
        memory = mmap(nullptr, sizeof(fake_ledger), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      close(fd);
    }
    if (memory == MAP_FAILED) {
      g_state.store(3, std::memory_order_release);
      return nullptr;
    }
    g_ledger = static_cast<fake_ledger*>(memory);
    g_state.store(2, std::memory_order_release);
    return g_ledger;
  }
  while (g_state.load(std::memory_order_acquire) == 1) {
  }
  return g_state.load(std::memory_order_acquire) == 2 ? g_ledger : nullptr;
}

// The file's slot for this UUID, claimed by whichever process asks first.
fake_device_account* account_for(fake_ledger* file, const CUuuid& uuid, int* index) {
  for (int i = 0; i < FAKE_LEDGER_DEVICES; ++i) {
    fake_device_account& slot = file->devices[i];
    uint32_t state = atomic_at(&slot.state)->load(std::memory_order_acquire);
    if (state == FAKE_SLOT_FREE) {
      uint32_t expected = FAKE_SLOT_FREE;
      if (atomic_at(&slot.state)->compare_exchange_strong(expected, FAKE_SLOT_CLAIMING)) {
        memcpy(slot.uuid, uuid.bytes, 16);
        uint64_t cap = 0;
        if (const char* text = getenv("QUANTA_FAKE_CAP")) common::parse_bytes(text, &cap, nullptr);
        atomic_at(&slot.cap)->store(cap);
        atomic_at(&slot.state)->store(FAKE_SLOT_READY, std::memory_order_release);
      }
    }
    while ((state = atomic_at(&slot.state)->load(std::memory_order_acquire)) ==
           FAKE_SLOT_CLAIMING) {
    }
    if (!memcmp(slot.uuid, uuid.bytes, 16)) {
      *index = i;
      return &slot;
    }
  }
  return nullptr;
}

fake_device_account* account_of_context(CUcontext context) {
  fake_ledger* file = ledger();
  if (!file || !context) return nullptr;
  auto push = QUANTA_REAL(cuCtxPushCurrent_v2);
  auto pop = QUANTA_REAL(cuCtxPopCurrent_v2);
  auto device_of = QUANTA_REAL(cuCtxGetDevice);
  CUdevice device = 0;
  CUcontext popped = nullptr;
  if (!push || !pop || !device_of || push(context) != CUDA_SUCCESS) return nullptr;
  const bool known = device_of(&device) == CUDA_SUCCESS;
  pop(&popped);
  CUuuid uuid;
  int index = 0;
  return known && device_uuid(device, &uuid) ? account_for(file, uuid, &index) : nullptr;
}

}  // namespace

bool link_memory_account(CUdevice device, MemoryAccount* out) {
  fake_ledger* file = ledger();
  CUuuid uuid;
  int index = 0;
  if (!file || !atomic_at(&file->placed)->load() || !device_uuid(device, &uuid)) return false;
  fake_device_account* slot = account_for(file, uuid, &index);
  if (!slot) return false;
  out->pod_used = atomic_at(&slot->pod_used);
  out->process_used = &g_process_used[index];
  out->cap = atomic_at(&slot->cap);
  return true;
}

bool link_observed_account(CUdevice device, MemoryAccount* out) {
  return link_memory_account(device, out);
}

// The fake link never joins late; a test program sets the ledger file's refuse_cuda to
// make it refuse CUDA, so every wrapper's refusal path can be tested without an arbiter.
bool link_may_join(CUdevice) {
  return false;
}

bool link_refuses_cuda() {
  fake_ledger* file = ledger();
  return file && atomic_at(&file->refuse_cuda)->load(std::memory_order_acquire) != 0;
}

LinkSettings link_settings() {
  return LinkSettings{options().count_managed, options().context_overhead_bytes};
}

// Wrappers keep passing the current context: the fake counts gate entries per context.
std::atomic<Binding*> g_sole_binding{nullptr};  // never set: every launch takes link_gate_enter
bool link_gate_enter_sole(Binding*) noexcept {
  return false;
}
void link_gate_leave_sole(Binding*) noexcept {}

bool link_gate_enter(CUcontext context) {
  if (link_refuses_cuda()) return false;
  if (fake_ledger* file = ledger()) {
    atomic_at(&file->gate_enters)->fetch_add(1);
    if (fake_device_account* slot = account_of_context(context))
      atomic_at(&slot->gate_enters)->fetch_add(1);
  }
  return true;
}

GateTry link_gate_try_enter(CUcontext context) {
  return link_gate_enter(context) ? GateTry::kPassed : GateTry::kRefused;
}

bool link_gate_await(CUcontext, const CUcontext*, unsigned) {
  return !link_refuses_cuda();
}

void link_gate_leave(CUcontext context, CUresult, CUstream) {
  if (fake_ledger* file = ledger()) {
    atomic_at(&file->gate_leaves)->fetch_add(1);
    if (fake_device_account* slot = account_of_context(context))
      atomic_at(&slot->gate_leaves)->fetch_add(1);
  }
}

void link_forget_context(CUcontext) {
  if (fake_ledger* file = ledger()) atomic_at(&file->forgotten_contexts)->fetch_add(1);
}

}  // namespace quanta::shim
