// Process-local driver state: initialisation, handle registries, contexts and the
// per-thread context stack, and the allocation table. Everything shared between
// processes lives in SharedState; this file holds what only this process can see.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "tests/simgpu/config.h"
#include "tests/simgpu/cuda_api.h"
#include "tests/simgpu/engine.h"
#include "tests/simgpu/shared_state.h"

namespace quanta::simgpu {

enum class HandleKind : uint8_t {
  Context,
  Stream,
  Event,
  Module,
  Function,
  Library,
  Kernel,
  Graph,
  GraphExec,
  GraphNode,
  Pool,
  Array,
  MipmappedArray,
  MemHandle
};

}  // namespace quanta::simgpu

struct CUctx_st {
  int device = 0;
  int slot = -1;
  uint64_t generation = 0;
  uint64_t context_id = 0;
  unsigned flags = 0;
  bool primary = false;
  int primary_refs = 0;
  uint64_t memory_bytes = 0;  // SIMGPU_CONTEXT_MEMORY charged at its creation
};

struct CUstream_st {
  CUctx_st* ctx = nullptr;
  quanta::simgpu::Ticket last;
  unsigned flags = 0;
  int priority = 0;
  // While a capture is active: the graph its work is recorded into instead of run.
  CUgraph_st* capture = nullptr;
  uint64_t capture_id = 0;
};

// A stream-ordered memory pool (cuMemPoolCreate, or a device's default pool). `reserved`
// is the physical memory it holds, charged to its device; `used` the bytes of its live
// allocations. Freed memory stays reserved (cached for reuse) until a synchronisation
// finds more than `threshold` reserved, or cuMemPoolTrimTo, or the pool is destroyed.
struct CUmemPoolHandle_st {
  int device = 0;
  bool is_default = false;
  bool destroyed = false;  // destroyed while allocations were live: goes with the last
  uint64_t reserved = 0;
  uint64_t used = 0;
  uint64_t threshold = 0;  // CU_MEMPOOL_ATTR_RELEASE_THRESHOLD
  uint64_t reserved_high = 0;
  uint64_t used_high = 0;
};

enum class GraphNodeType : uint8_t { Kernel, MemAlloc, MemFree, Empty };

struct CUgraphNode_st {
  GraphNodeType type = GraphNodeType::Empty;
  uint64_t duration_ns = 0;
  CUdeviceptr dptr = 0;
};

struct CUgraph_st {
  std::vector<std::unique_ptr<CUgraphNode_st>> nodes;
};

struct CUevent_st {
  CUctx_st* ctx = nullptr;
  unsigned flags = 0;
  bool recorded = false;
  quanta::simgpu::Ticket ticket;
  bool time_known = false;
  uint64_t time_ns = 0;
};

struct CUfunc_st {
  std::string name;
  bool spin = false;
  CUmod_st* module = nullptr;
};

struct CUmod_st {
  CUctx_st* ctx = nullptr;
  std::map<std::string, std::unique_ptr<CUfunc_st>> functions;
  std::map<std::string, std::pair<CUdeviceptr, size_t>> globals;
};

struct CUkern_st {
  CUfunc_st* function = nullptr;
  CUlib_st* library = nullptr;
};

struct CUlib_st {
  std::unique_ptr<CUmod_st> module;
  std::map<std::string, std::unique_ptr<CUkern_st>> kernels;
};

namespace quanta::simgpu {

enum class AllocKind : uint8_t { Device, Pitch, Managed, Host, Pool, Vmm, Array, Global };

struct Allocation {
  size_t size = 0;
  int device = -1;  // -1: host memory, not charged to a device
  CUctx_st* ctx = nullptr;
  AllocKind kind = AllocKind::Device;
  bool owns_mapping = true;            // false for VMM ranges (the reservation owns the VA)
  CUmemPoolHandle_st* pool = nullptr;  // Pool: the pool whose reserve holds the memory
  void* vmm_handle = nullptr;          // Vmm: the physical allocation mapped there
};

struct Runtime {
  std::once_flag init_once;
  CUresult init_result = CUDA_ERROR_NOT_INITIALIZED;
  bool initialized = false;
  Config cfg;
  SharedState* state = nullptr;
  int device_count = 0;  // CUDA ordinals: the devices CUDA_VISIBLE_DEVICES leaves visible
  // Device-list index (NVML index, shared-state slot) behind each CUDA ordinal. Read only
  // through physical_device().
  int physical[kMaxDevices] = {};
  int32_t pid = 0;

  std::recursive_mutex mu;  // guards everything below
  std::unordered_map<const void*, HandleKind> handles;
  CUctx_st* primary[kMaxDevices] = {};
  std::map<uintptr_t, Allocation> allocations;
  // Pools this process created (live or destroyed with allocations outstanding), and
  // each device's default and current pool.
  std::vector<CUmemPoolHandle_st*> pools;
  CUmemPoolHandle_st default_pool[kMaxDevices];
  CUmemPoolHandle_st* current_pool[kMaxDevices] = {};
  uint64_t next_capture_id = 1;
};

Runtime& runtime();
// Runs cuInit's work once; returns its result.
CUresult initialize(unsigned flags);
bool is_initialized();

// The one mapping from a CUDA ordinal (CUdevice, CUctx_st::device, Allocation::device)
// to the device it runs on: its index in the shared device list, which NVML, the
// execution log and tickets use. `ordinal` must be valid (0 <= ordinal < device_count).
int physical_device(CUdevice ordinal);
DeviceState& device_state(CUdevice ordinal);
DeviceEngine engine_for(CUdevice ordinal);
// The engine a ticket came from (tickets carry the physical device).
DeviceEngine engine_of(const Ticket& ticket);

void add_handle(const void* h, HandleKind kind);
void remove_handle(const void* h);
bool has_handle(const void* h, HandleKind kind);

// Context stack of the calling thread.
std::vector<CUctx_st*>& context_stack();
CUctx_st* current_context();

// Creates, registers and returns a context on `device` (shared registry slot included).
CUresult create_context(int device, unsigned flags, bool primary, CUctx_st** out);
void destroy_context(CUctx_st* ctx);

// The context and stream object a stream handle designates; legacy and per-thread
// default streams map to the current context's null stream (stream == nullptr).
CUresult resolve_stream(CUstream h, CUctx_st*& ctx, CUstream_st*& stream);
// Queues device work of `duration_ns` and records it as the stream's last item.
Ticket enqueue_work(CUctx_st* ctx, CUstream_st* stream, uint64_t duration_ns);
// The ticket a stream synchronisation waits for.
Ticket stream_tail(CUctx_st* ctx, CUstream_st* stream);

// Device time for copying or setting `bytes`: ~500 GB/s, at least 2 us.
uint64_t transfer_duration_ns(uint64_t bytes);

// Allocation helpers shared by every allocation family.
CUresult allocate_device_memory(CUctx_st* ctx, size_t bytes, AllocKind kind, CUdeviceptr* out);
// Frees a device allocation; a pool allocation goes back to its pool, which keeps it.
CUresult free_device_memory(CUdeviceptr ptr);
// An allocation of `bytes` from `pool`: served from what the pool has cached, the rest
// newly reserved (and charged to the device).
CUresult allocate_from_pool(CUctx_st* ctx, CUmemPoolHandle_st* pool, size_t bytes,
                            CUdeviceptr* out);
// Gives back what `pool` holds beyond max(its live allocations, keep_bytes).
void trim_pool(CUmemPoolHandle_st* pool, uint64_t keep_bytes);
// Every stream, event or context synchronisation ends here: each pool holding more than
// its release threshold gives back what is above max(threshold, used).
void release_pool_memory_at_sync();
// The pool cuMemAllocAsync on `device` uses (cuDeviceSetMemPool, else the default pool).
CUmemPoolHandle_st* current_pool(int device);
// Appends a node to a graph and registers it as a handle.
CUgraphNode_st* add_graph_node(CUgraph_st* graph, std::unique_ptr<CUgraphNode_st> node);
// Finds the allocation containing [ptr, ptr+bytes) and copies it out; false if none.
bool find_allocation(uintptr_t ptr, size_t bytes, Allocation* out = nullptr,
                     uintptr_t* base = nullptr);

}  // namespace quanta::simgpu

#define SIMGPU_REQUIRE_INIT()                                                   \
  do {                                                                          \
    if (!::quanta::simgpu::is_initialized()) return CUDA_ERROR_NOT_INITIALIZED; \
  } while (0)

#define SIMGPU_REQUIRE_CONTEXT(ctx)                    \
  SIMGPU_REQUIRE_INIT();                               \
  CUctx_st* ctx = ::quanta::simgpu::current_context(); \
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT
