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
  std::atomic<uint64_t>* denied = nullptr;     // allocations refused at the cap
  // Which ledger these words are, per device: it changes when an arbiter restart hands the
  // process a fresh pod region or process entry instead of re-adopting its old ones. A
  // charge records it, so its refund and the move to the new ledger each happen once.
  uint32_t epoch = 0;
};

// Connects to the arbiter on first use (never from the library constructor, so a process
// that never calls CUDA pays nothing). Returns false when this process has no account on
// `device` now: not placed yet (the arbiter unreachable: see link_may_join), refused, or
// the device not attached. It then runs uncapped there. Thread-safe; cheap after the first
// call.
bool link_memory_account(CUdevice device, MemoryAccount* out);

// The account an NVML memory view reads. In a process that has used CUDA it is
// link_memory_account's; a process that only uses NVML (nvidia-smi, an exporter) observes
// its pod's usage and cap without becoming a tenant (no slot, never scheduled).
bool link_observed_account(CUdevice device, MemoryAccount* out);

// True while this process may still join the arbiter on `device` (unreachable so far, or
// refused for now by an enforcing node): allocations it makes meanwhile are recorded and
// charged to its pod when it joins (charge.h, charge_allocations_made_before_joining).
bool link_may_join(CUdevice device);

// True while the node enforces placement and this process is not placed: the arbiter
// refused it (RefusedAction::kDeny), or it cannot be reached and the container's unplaced
// rule is closed. CUDA is refused meanwhile (contexts and launches
// CUDA_ERROR_DEVICE_UNAVAILABLE, allocations CUDA_ERROR_OUT_OF_MEMORY); the link keeps
// trying to join and serves the process normally once placed.
bool link_refuses_cuda();

// Settings the memory wrappers apply: the arbiter's (its Welcome) where the node enforces,
// else the QUANTA_* variables where given, else the arbiter's, else the built-in defaults.
struct LinkSettings {
  bool count_managed;         // cuMemAllocManaged counts against the cap
  uint64_t context_overhead;  // bytes charged per CUDA context
};
LinkSettings link_settings();

// Launch gate for the device that `context` belongs to. Called by every launch wrapper
// before the real driver call; returns once this process may submit (at once on the fast
// path: it holds the grant and no revoke is pending). When the arbiter is unreachable or
// its lease lapsed, launches pass ungated. False only while link_refuses_cuda(): the
// wrapper then returns CUDA_ERROR_DEVICE_UNAVAILABLE without calling the driver (and does
// not call link_gate_leave).
bool link_gate_enter(CUcontext context);

// The binding of the one device this process can see, once a launch found it (nullptr while
// unknown, and in a process that sees several; the driver is asked how many it sees only
// once). Every context is then on that device, so launch wrappers pass no context (nullptr:
// the current one) to the gate instead of asking the driver.
struct Binding;
extern std::atomic<Binding*> g_sole_binding;

// The gate's fast path on that one device: this thread has a gate record of its own, the
// process holds the grant, nobody waits and no in-flight limit binds, so the launch needs
// only this thread's mark (no completion event). True: marked, call link_gate_leave_sole
// after the real call; false (nothing marked): the launch goes through link_gate_enter.
bool link_gate_enter_sole(Binding* sole) noexcept;
// Leaves the gate, then counts the launch, so a revoke waiting for launchers inside never
// waits for the counting.
void link_gate_leave_sole(Binding* sole) noexcept;

// Called after the real launch returned, with its result and the stream its work went to
// (CU_STREAM_PER_THREAD for a per-thread-default-stream variant given no stream), so the
// gate can account work in flight.
void link_gate_leave(CUcontext context, CUresult launched, CUstream stream);

// For a launch that needs several GPUs at once (cuLaunchCooperativeKernelMultiDevice): enters
// the gate of `context` only if that needs no waiting. kBusy: this process does not hold that
// GPU now; it has asked for it, entered nothing, and must not wait while inside other gates
// (leave them, link_gate_await this one, then try all again), so it never holds one GPU's
// gate while it waits at another's.
enum class GateTry { kPassed, kBusy, kRefused };
GateTry link_gate_try_enter(CUcontext context);
// Waits, inside no gate, until this process may submit on the device of `context`; meanwhile
// the devices of `holding` (the gates the launch left and will enter again) show the arbiter
// a launch pending, so grants it holds there are not taken back as idle while it waits (they
// are still revoked at a quantum's end, and released at once: no gate is entered). False only
// while link_refuses_cuda().
bool link_gate_await(CUcontext context, const CUcontext* holding, unsigned count);

// Called when a context is destroyed, so the link forgets it and drains nothing on it.
void link_forget_context(CUcontext context);

}  // namespace quanta::shim
