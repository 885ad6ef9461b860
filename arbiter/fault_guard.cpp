// A fixed table of guarded ranges the signal handler can scan without locks or
// allocation; the handler maps anonymous zero pages over the faulting range (mmap is a
// plain system call, safe in a handler) and returns, so the faulting load completes.
#include "arbiter/fault_guard.h"

#include <signal.h>
#include <sys/mman.h>

#include <atomic>
#include <cstdint>

namespace quanta::arbiter {
namespace {

struct GuardedRange {
  std::atomic<uintptr_t> base{0};
  std::atomic<size_t> size{0};
  std::atomic<bool> faulted{false};
};

constexpr size_t kMaxGuarded = 4096;
GuardedRange g_ranges[kMaxGuarded];

void on_sigbus(int sig, siginfo_t* info, void*) {
  auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  for (GuardedRange& r : g_ranges) {
    uintptr_t base = r.base.load(std::memory_order_acquire);
    size_t size = r.size.load(std::memory_order_acquire);
    if (base == 0 || addr < base || addr >= base + size) continue;
    void* p = mmap(reinterpret_cast<void*>(base), size, PROT_READ | PROT_WRITE,
                   MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) {
      r.faulted.store(true, std::memory_order_release);
      return;
    }
    break;
  }
  // Not ours (or the remap failed): die as SIGBUS would have killed us.
  signal(sig, SIG_DFL);
  raise(sig);
}

}  // namespace

void install_fault_guard() {
  static std::atomic<bool> installed{false};
  if (installed.exchange(true)) return;
  struct sigaction sa {};
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, nullptr);
}

void guard_mapping(void* base, size_t size) {
  for (GuardedRange& r : g_ranges) {
    uintptr_t expected = 0;
    if (r.base.load() != 0) continue;
    r.size.store(size, std::memory_order_release);
    r.faulted.store(false, std::memory_order_release);
    if (r.base.compare_exchange_strong(expected, reinterpret_cast<uintptr_t>(base))) return;
  }
}

void unguard_mapping(void* base) {
  for (GuardedRange& r : g_ranges) {
    if (r.base.load() == reinterpret_cast<uintptr_t>(base)) {
      r.base.store(0, std::memory_order_release);
      r.faulted.store(false, std::memory_order_release);
      return;
    }
  }
}

bool mapping_faulted(const void* base) {
  for (const GuardedRange& r : g_ranges) {
    if (r.base.load(std::memory_order_acquire) == reinterpret_cast<uintptr_t>(base)) {
      return r.faulted.load(std::memory_order_acquire);
    }
  }
  return false;
}

}  // namespace quanta::arbiter
