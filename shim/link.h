// The seam inside libquanta.so between interposition (wrappers, memory ledger, views)
// and the arbiter link (tenant socket, shared regions, launch gate). Wrappers call only
// these functions; the link rooms (session.cpp, gate.cpp, contexts.cpp, …, sharing
// link_state.h) implement them. Everything here is freestanding C++.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstdint>

namespace quanta::shim {

// Pod-wide ledger words for one GPU, living in shared memory that the arbiter created.
// pod_used is shared by every process of the pod (the compare-and-swap target);
// process_used is this process's part, which the arbiter returns when the process dies.
struct MemoryAccount {
  std::atomic<uint64_t>* pod_used = nullptr;
  std::atomic<uint64_t>* process_used = nullptr;
  const std::atomic<uint64_t>* cap = nullptr;  // bytes; 0 = no cap. Arbiter-written only.
};

// Connects to the arbiter on first use (never from the library constructor, so a process
// that never calls CUDA pays nothing). Returns false when this process is not placed (no
// arbiter, refused, unregistered): it then runs ungated and uncapped. Thread-safe; cheap
// after the first call.
bool link_memory_account(CUdevice device, MemoryAccount* out);

// Launch gate for the device that `context` belongs to. Called by every launch wrapper
// before the real driver call; returns once this process may submit (at once on the fast
// path: it holds the grant and no revoke is pending). Never fails: when the arbiter is
// unreachable or its lease lapsed, launches pass ungated.
void link_gate_enter(CUcontext context);

// Called after the real launch returned, with its result, so the gate can account work
// in flight (and release early when the holder went idle).
void link_gate_leave(CUcontext context, CUresult launched);

// Called when a context is destroyed, so the link forgets it and drains nothing on it.
void link_forget_context(CUcontext context);

}  // namespace quanta::shim
