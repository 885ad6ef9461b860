// The context table: which device binding each CUDA context's launches go through (found
// once per context, then cached per thread), forgotten when the context is destroyed (its
// entry is reused by a later context), and walked by the link thread to drain a device's
// work on a revoke. Lookups are lock-free; registering, once per context, takes a small
// lock so two threads registering at once never make two entries.
#include <sched.h>

#include "shim/base/log.h"
#include "shim/base/spin.h"
#include "shim/interpose/devices.h"
#include "shim/interpose/real_driver.h"
#include "shim/link/link_state.h"

namespace quanta::shim {

QUANTA_TLS constinit LastHit t_last = {nullptr, nullptr, 0};
std::atomic<Binding*> g_sole_binding{nullptr};

namespace {

enum ContextState : uint32_t {
  kCtxFree = 0,
  kCtxClaiming = 1,
  kCtxLive = 2,
  kCtxDraining = 3,
  kCtxDead = 4
};

struct ContextEntry {
  std::atomic<CUcontext> context{nullptr};
  std::atomic<uint32_t> state{kCtxFree};
  std::atomic<Binding*> binding{nullptr};
};

ContextEntry g_contexts[kMaxContexts];
SocketLock g_register_lock;

size_t context_hash(CUcontext context) {
  auto bits = reinterpret_cast<uintptr_t>(context);
  bits ^= bits >> 17;
  bits *= 0x9e3779b97f4a7c15ull;
  return static_cast<size_t>(bits >> 40) % kMaxContexts;
}

// Records which binding a context's launches go through (once per context). An entry
// stays on its probe chain for good (lookups stop at a never-used one), so a destroyed
// context's entry is reused in place: for the same address (a new context the driver put
// there) or, when this context has no entry yet, for it.
Binding* register_context(CUcontext context) {
  CUdevice device = -1;
  {
    InLink guard;
    if (!context_device(context, &device)) return nullptr;
  }
  Binding* binding = ensure_binding(device);
  if (!binding) return nullptr;
  g_register_lock.lock();
  const size_t start = context_hash(context);
  ContextEntry* reusable = nullptr;
  ContextEntry* found = nullptr;
  for (size_t probe = 0; probe < static_cast<size_t>(kMaxContexts); ++probe) {
    ContextEntry& entry = g_contexts[(start + probe) % kMaxContexts];
    const CUcontext key = entry.context.load(std::memory_order_acquire);
    if (key == context) {
      found = &entry;
      break;
    }
    if (key == nullptr) {
      if (!reusable) reusable = &entry;
      break;  // the end of the chain: the context has no entry
    }
    if (!reusable && entry.state.load(std::memory_order_acquire) == kCtxDead) reusable = &entry;
  }
  Binding* result = binding;
  if (found) {
    uint32_t state = found->state.load(std::memory_order_acquire);
    if (state == kCtxDead &&
        found->state.compare_exchange_strong(state, kCtxClaiming, std::memory_order_acq_rel)) {
      found->binding.store(binding, std::memory_order_release);
      found->state.store(kCtxLive, std::memory_order_release);
    }
  } else if (reusable) {
    // Claimed before its key changes, so a lookup that sees the new key waits for it to be
    // live, and one still looking for the old key moves on.
    reusable->state.store(kCtxClaiming, std::memory_order_release);
    reusable->binding.store(binding, std::memory_order_release);
    reusable->context.store(context, std::memory_order_release);
    reusable->state.store(kCtxLive, std::memory_order_release);
  } else {
    result = nullptr;
  }
  g_register_lock.unlock();
  if (!result)
    QUANTA_LOG_WARN("more than %d live CUDA contexts: the newest run ungated", kMaxContexts);
  return result;
}

Binding* lookup_context(CUcontext context) {
  const size_t start = context_hash(context);
  for (size_t probe = 0; probe < static_cast<size_t>(kMaxContexts); ++probe) {
    ContextEntry& entry = g_contexts[(start + probe) % kMaxContexts];
    CUcontext key = entry.context.load(std::memory_order_acquire);
    if (key == nullptr) return nullptr;
    if (key != context) continue;
    uint32_t state;
    while ((state = entry.state.load(std::memory_order_acquire)) == kCtxFree ||
           state == kCtxClaiming)
      cpu_relax();
    if (entry.context.load(std::memory_order_acquire) != context) continue;  // reused meanwhile
    return state == kCtxDead ? nullptr : entry.binding.load(std::memory_order_acquire);
  }
  return nullptr;
}

// Asked once: the devices a process sees are fixed once the driver is initialised (and it
// is, where a context exists).
std::atomic<uint32_t> g_device_count_asked{0};
void note_sole_device(Binding* binding) {
  if (g_device_count_asked.load(std::memory_order_acquire) != 0 ||
      g_device_count_asked.exchange(1, std::memory_order_acq_rel) != 0)
    return;
  auto count = QUANTA_REAL(cuDeviceGetCount);
  int devices = 0;
  InLink guard;
  if (count && count(&devices) == CUDA_SUCCESS && devices == 1)
    g_sole_binding.store(binding, std::memory_order_release);
}

}  // namespace

Binding* binding_for_context_slow(CUcontext context, uint32_t epoch) {
  if (context == nullptr) {
    auto get_current = QUANTA_REAL(cuCtxGetCurrent);
    if (!get_current || get_current(&context) != CUDA_SUCCESS || context == nullptr) return nullptr;
    if (t_last.context == context && t_last.epoch == epoch) return t_last.binding;
  }
  if (!ensure_linked()) return nullptr;
  Binding* binding = lookup_context(context);
  if (!binding) binding = register_context(context);
  t_last = LastHit{context, binding, epoch};
  if (binding) note_sole_device(binding);
  return binding;
}

// Finishes this process's work on the device of `binding`: every context it launched on
// there is synchronised, so the next tenant's quantum starts on an idle engine.
void drain_contexts(Binding* binding) {
  auto push = QUANTA_REAL(cuCtxPushCurrent_v2);
  auto pop = QUANTA_REAL(cuCtxPopCurrent_v2);
  auto synchronize = QUANTA_REAL(cuCtxSynchronize);
  if (!push || !pop || !synchronize) return;
  for (ContextEntry& entry : g_contexts) {
    if (entry.binding.load(std::memory_order_acquire) != binding) continue;
    uint32_t expected = kCtxLive;
    if (!entry.state.compare_exchange_strong(expected, kCtxDraining, std::memory_order_acq_rel))
      continue;
    CUcontext context = entry.context.load(std::memory_order_acquire);
    if (push(context) == CUDA_SUCCESS) {
      synchronize();  // a failure here is the application's to see on its own next call
      CUcontext popped = nullptr;
      pop(&popped);
    }
    entry.state.store(kCtxLive, std::memory_order_release);
  }
}

void contexts_reset_in_child() {
  g_register_lock.reset();
  for (ContextEntry& entry : g_contexts) {
    entry.state.store(kCtxFree);
    entry.binding.store(nullptr);
    entry.context.store(nullptr);
  }
  t_last = LastHit{nullptr, nullptr, 0};
  g_sole_binding.store(nullptr);
  g_device_count_asked.store(0);
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
