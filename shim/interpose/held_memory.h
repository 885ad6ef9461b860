// Memory the driver still holds after the program freed it, and when it really lets go:
// stream-ordered pools keep freed memory cached until a synchronisation above their
// release threshold, cuMemPoolTrimTo or their destruction; a free captured into a graph
// frees nothing until the graph has run. (Released VMM handles still mapped are tracked on
// their table records, interpose_memory.cpp.)
#pragma once

#include <cuda.h>

#include <cstdint>

#include "shim/link.h"

namespace quanta::shim {

// ---- Pools ------------------------------------------------------------------------------
// Each pool the process allocates from has a slot: `used` (bytes in its live allocations,
// as the shim recorded them) and `charged` (what the pod ledger holds for the pool, never
// below `used`). An allocation raises `used` and charges only what `charged` lacks, so
// memory the pool reuses is not charged twice; a free lowers `used` only. The charge comes
// down when the driver's CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT does (pool_settle). Updates
// are compare-and-swap loops on the slot; only adding a slot takes a lock.

// Reserves room for `bytes` from `pool` (memory on `device`, charged to `account`).
// False, with nothing changed, when the pod's cap would be passed. On true `*slot` names
// the pool's slot for pool_return.
// The slot pool_reserve names when every slot is taken: the allocation is then charged and
// refunded like a plain one.
constexpr uint32_t kNoPoolSlot = 256;

bool pool_reserve(CUmemoryPool pool, CUdevice device, const MemoryAccount& account, uint64_t bytes,
                  uint32_t* slot) noexcept;

// An allocation of `bytes` from the slot's pool was freed (or never made): the pool keeps
// the memory, so the charge stays until the pool gives it back.
void pool_return(uint32_t slot, uint64_t bytes) noexcept;

// Brings the pool's charge down to what the driver still reserves for it (never below what
// is in use). After cuMemPoolTrimTo, and for every pool at each synchronisation.
void pool_settle(CUmemoryPool pool) noexcept;

// The pool is destroyed: the driver gives its cache back now and each live allocation at
// its free.
void pool_destroyed(CUmemoryPool pool) noexcept;

// After an arbiter restart that gave the process a fresh ledger on `device` (charge.h,
// move_charges): what its pools there hold charged to any ledger but `epoch`, and the move
// itself (each pool marked with `epoch`, its charge returned for the caller to make there).
// Until its pool is moved, a settle gives nothing back (the current ledger holds none of it).
uint64_t pool_charges_outside(CUdevice device, uint32_t epoch) noexcept;
uint64_t pool_move_charges(CUdevice device, uint32_t epoch) noexcept;

// ---- Frees captured into graphs ---------------------------------------------------------

// True while `stream` is capturing (its work becomes graph nodes).
bool stream_is_capturing(CUstream stream) noexcept;

// A tracked pointer's cuMemFreeAsync was captured on `stream`: its record and charge stay
// until a launch of the graph the capture makes has completed.
void note_captured_free(uint64_t pointer, CUstream stream) noexcept;
void note_capture_ended(CUstream stream, CUgraph graph) noexcept;  // graph null: abandoned
void note_graph_instantiated(CUgraph graph, CUgraphExec exec) noexcept;
void note_graph_launched(CUgraphExec exec, CUstream stream) noexcept;
void note_graph_destroyed(CUgraph graph) noexcept;
void note_graph_exec_destroyed(CUgraphExec exec) noexcept;

// ---- Synchronisation --------------------------------------------------------------------

// After cuStreamSynchronize, cuEventSynchronize or cuCtxSynchronize: frees captured in
// graphs whose launch has completed are refunded, then every pool holding more than it
// uses is settled (the driver releases pool memory above the threshold at these calls).
// Returns at once when no pool holds a cache and no captured free waits.
void settle_held_memory() noexcept;

}  // namespace quanta::shim
