// Process-local driver state and the helpers every API file shares: initialisation from
// the environment, handle registries, context creation, stream resolution, work
// submission and the allocation table.
#include "tests/simgpu/runtime.h"

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace quanta::simgpu {
namespace {

Runtime* g_runtime = nullptr;

void forget_after_fork() {
  // A forked child owns none of its parent's contexts or device memory: it starts over
  // and must call cuInit again, as with the real driver.
  g_runtime = new Runtime();
  context_stack().clear();
}

// At normal exit the process's contexts and memory leave the device at once, instead of
// waiting for a liveness check to notice the process is gone.
__attribute__((destructor)) void detach_at_exit() {
  if (g_runtime == nullptr || !g_runtime->initialized || g_runtime->pid != getpid()) return;
  for (int d = 0; d < g_runtime->device_count; ++d) forget_process(device_state(d), g_runtime->pid);
  detach_shared_state(g_runtime->state);
}

}  // namespace

Runtime& runtime() {
  static Runtime* instance = [] {
    g_runtime = new Runtime();  // never destroyed: other libraries' destructors may call in
    pthread_atfork(nullptr, nullptr, forget_after_fork);
    return g_runtime;
  }();
  (void)instance;
  return *g_runtime;
}

bool is_initialized() {
  return runtime().initialized;
}

CUresult initialize(unsigned flags) {
  Runtime& rt = runtime();
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  std::call_once(rt.init_once, [&rt] {
    std::string error;
    Config cfg;
    if (!parse_config([](const char* n) -> const char* { return std::getenv(n); }, cfg, error)) {
      std::fprintf(stderr, "%s\n", error.c_str());
      rt.init_result = CUDA_ERROR_INVALID_VALUE;
      return;
    }
    SharedState* state = attach_shared_state(cfg, error);
    if (state == nullptr) {
      std::fprintf(stderr, "%s\n", error.c_str());
      rt.init_result = CUDA_ERROR_OPERATING_SYSTEM;
      return;
    }
    // The device list is the segment's (an earlier process may have set its shape).
    std::vector<std::string> uuids;
    for (uint32_t d = 0; d < state->device_count; ++d)
      uuids.emplace_back(state->devices[d].uuid_text);
    const std::vector<int> visible =
        parse_visible_devices(std::getenv("CUDA_VISIBLE_DEVICES"), uuids);
    if (visible.empty()) {
      // The real driver's answer when CUDA_VISIBLE_DEVICES leaves nothing visible.
      detach_shared_state(state);
      rt.init_result = CUDA_ERROR_NO_DEVICE;
      return;
    }
    for (size_t i = 0; i < visible.size(); ++i) rt.physical[i] = visible[i];
    rt.cfg = std::move(cfg);
    rt.state = state;
    rt.device_count = static_cast<int>(visible.size());
    rt.pid = getpid();
    rt.init_result = CUDA_SUCCESS;
    rt.initialized = true;
  });
  return rt.init_result;
}

int physical_device(CUdevice ordinal) {
  return runtime().physical[ordinal];
}

DeviceState& device_state(CUdevice ordinal) {
  return runtime().state->devices[physical_device(ordinal)];
}

DeviceEngine engine_for(CUdevice ordinal) {
  return DeviceEngine(runtime().state, physical_device(ordinal));
}

DeviceEngine engine_of(const Ticket& ticket) {
  return DeviceEngine(runtime().state, ticket.device);
}

void add_handle(const void* h, HandleKind kind) {
  Runtime& rt = runtime();
  std::lock_guard lock(rt.mu);
  rt.handles[h] = kind;
}

void remove_handle(const void* h) {
  Runtime& rt = runtime();
  std::lock_guard lock(rt.mu);
  rt.handles.erase(h);
}

bool has_handle(const void* h, HandleKind kind) {
  if (h == nullptr) return false;
  Runtime& rt = runtime();
  std::lock_guard lock(rt.mu);
  auto it = rt.handles.find(h);
  return it != rt.handles.end() && it->second == kind;
}

std::vector<CUctx_st*>& context_stack() {
  thread_local std::vector<CUctx_st*> stack;
  return stack;
}

CUctx_st* current_context() {
  auto& stack = context_stack();
  if (stack.empty()) return nullptr;
  CUctx_st* ctx = stack.back();
  return has_handle(ctx, HandleKind::Context) ? ctx : nullptr;
}

CUresult create_context(int device, unsigned flags, bool primary, CUctx_st** out) {
  Runtime& rt = runtime();
  if (device < 0 || device >= rt.device_count) return CUDA_ERROR_INVALID_DEVICE;
  auto ctx = std::make_unique<CUctx_st>();
  ctx->device = device;
  ctx->flags = flags;
  ctx->primary = primary;
  if (!engine_for(device).register_context(rt.pid, ctx->slot, ctx->generation, ctx->context_id))
    return CUDA_ERROR_OUT_OF_MEMORY;
  // The driver's own memory for the context (code, stacks, heaps), as NVML counts it.
  if (rt.cfg.context_bytes > 0) {
    if (!reserve_device_memory(device_state(device), rt.pid, rt.cfg.context_bytes)) {
      engine_for(device).unregister_context(ctx->slot, ctx->generation);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    ctx->memory_bytes = rt.cfg.context_bytes;
  }
  *out = ctx.release();
  add_handle(*out, HandleKind::Context);
  return CUDA_SUCCESS;
}

void destroy_context(CUctx_st* ctx) {
  Runtime& rt = runtime();
  std::vector<CUdeviceptr> owned;
  {
    std::lock_guard lock(rt.mu);
    for (auto& [ptr, a] : rt.allocations) {
      if (a.ctx == ctx && a.kind != AllocKind::Host && a.kind != AllocKind::Vmm)
        owned.push_back(ptr);
    }
  }
  for (CUdeviceptr p : owned) free_device_memory(p);
  engine_for(ctx->device).unregister_context(ctx->slot, ctx->generation);
  if (ctx->memory_bytes > 0) release_device_memory(device_state(ctx->device), rt.pid, ctx->memory_bytes);
  remove_handle(ctx);
  for (auto& c : context_stack()) {
    if (c == ctx) c = nullptr;
  }
  std::erase(context_stack(), nullptr);
  {
    std::lock_guard lock(rt.mu);
    if (rt.primary[ctx->device] == ctx) rt.primary[ctx->device] = nullptr;
  }
  delete ctx;
}

CUresult resolve_stream(CUstream h, CUctx_st*& ctx, CUstream_st*& stream) {
  if (h == nullptr || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
    ctx = current_context();
    stream = nullptr;
    return ctx ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
  }
  if (!has_handle(h, HandleKind::Stream)) return CUDA_ERROR_INVALID_HANDLE;
  stream = h;
  ctx = h->ctx;
  return CUDA_SUCCESS;
}

Ticket enqueue_work(CUctx_st* ctx, CUstream_st* stream, uint64_t duration_ns) {
  if (stream != nullptr && stream->capture != nullptr) {
    // Captured work is recorded, not run: it runs when the graph is launched.
    auto node = std::make_unique<CUgraphNode_st>();
    node->type = GraphNodeType::Kernel;
    node->duration_ns = duration_ns;
    add_graph_node(stream->capture, std::move(node));
    return stream->last;
  }
  Ticket t = engine_for(ctx->device).submit(ctx->slot, ctx->generation, duration_ns);
  if (stream != nullptr) stream->last = t;
  return t;
}

Ticket stream_tail(CUctx_st* ctx, CUstream_st* stream) {
  // Work of one context runs serially in submission order, so a stream's last item
  // completing means everything before it has too; the null stream waits for all.
  if (stream != nullptr) return stream->last;
  return engine_for(ctx->device).tail(ctx->slot, ctx->generation);
}

uint64_t transfer_duration_ns(uint64_t bytes) {
  const uint64_t ns = bytes / 500;  // 500 GB/s = 500 bytes per ns
  return ns < 2000 ? 2000 : ns;
}

CUresult allocate_device_memory(CUctx_st* ctx, size_t bytes, AllocKind kind, CUdeviceptr* out) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  Runtime& rt = runtime();
  const int device = kind == AllocKind::Host ? -1 : ctx->device;
  if (device >= 0 && !reserve_device_memory(device_state(device), rt.pid, bytes))
    return CUDA_ERROR_OUT_OF_MEMORY;
  // Real process-local memory, backed only when touched, so copies round-trip data.
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    if (device >= 0) release_device_memory(device_state(device), rt.pid, bytes);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  {
    std::lock_guard lock(rt.mu);
    rt.allocations[reinterpret_cast<uintptr_t>(p)] = Allocation{bytes, device, ctx, kind, true};
  }
  *out = reinterpret_cast<CUdeviceptr>(p);
  return CUDA_SUCCESS;
}

CUresult free_device_memory(CUdeviceptr ptr) {
  Runtime& rt = runtime();
  Allocation a;
  {
    std::lock_guard lock(rt.mu);
    auto it = rt.allocations.find(static_cast<uintptr_t>(ptr));
    if (it == rt.allocations.end() || it->second.kind == AllocKind::Vmm)
      return CUDA_ERROR_INVALID_VALUE;
    a = it->second;
    rt.allocations.erase(it);
    if (a.pool != nullptr) {
      // Back to the pool: its reserve keeps the memory until a trim gives it back.
      a.pool->used -= std::min(a.pool->used, static_cast<uint64_t>(a.size));
      if (a.pool->destroyed) trim_pool(a.pool, 0);
    }
  }
  if (a.owns_mapping) munmap(reinterpret_cast<void*>(ptr), a.size);
  if (a.device >= 0 && a.pool == nullptr)
    release_device_memory(device_state(a.device), rt.pid, a.size);
  return CUDA_SUCCESS;
}

CUresult allocate_from_pool(CUctx_st* ctx, CUmemPoolHandle_st* pool, size_t bytes,
                            CUdeviceptr* out) {
  if (out == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  Runtime& rt = runtime();
  std::lock_guard lock(rt.mu);
  const uint64_t cached = pool->reserved - pool->used;
  const uint64_t grow = bytes > cached ? bytes - cached : 0;
  if (grow > 0 && !reserve_device_memory(device_state(pool->device), rt.pid, grow))
    return CUDA_ERROR_OUT_OF_MEMORY;
  // The address is new even when the memory is reused: only the reserve is physical.
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    if (grow > 0) release_device_memory(device_state(pool->device), rt.pid, grow);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  pool->reserved += grow;
  pool->used += bytes;
  pool->reserved_high = std::max(pool->reserved_high, pool->reserved);
  pool->used_high = std::max(pool->used_high, pool->used);
  Allocation a{bytes, pool->device, ctx, AllocKind::Pool, true};
  a.pool = pool;
  rt.allocations[reinterpret_cast<uintptr_t>(p)] = a;
  *out = reinterpret_cast<CUdeviceptr>(p);
  return CUDA_SUCCESS;
}

void trim_pool(CUmemPoolHandle_st* pool, uint64_t keep_bytes) {
  Runtime& rt = runtime();
  std::lock_guard lock(rt.mu);
  const uint64_t keep = std::max(pool->used, keep_bytes);
  if (pool->reserved > keep) {
    release_device_memory(device_state(pool->device), rt.pid, pool->reserved - keep);
    pool->reserved = keep;
  }
  if (pool->destroyed && pool->used == 0) {
    std::erase(rt.pools, pool);
    delete pool;
  }
}

void release_pool_memory_at_sync() {
  Runtime& rt = runtime();
  std::lock_guard lock(rt.mu);
  auto release = [&](CUmemPoolHandle_st* pool) {
    if (pool->reserved > pool->threshold) trim_pool(pool, pool->threshold);
  };
  for (int d = 0; d < rt.device_count; ++d) release(&rt.default_pool[d]);
  // trim_pool may delete a destroyed pool: walk a copy.
  const std::vector<CUmemPoolHandle_st*> pools = rt.pools;
  for (CUmemPoolHandle_st* pool : pools) release(pool);
}

CUmemPoolHandle_st* current_pool(int device) {
  Runtime& rt = runtime();
  std::lock_guard lock(rt.mu);
  if (rt.current_pool[device] == nullptr) {
    rt.default_pool[device].device = device;
    rt.default_pool[device].is_default = true;
    rt.current_pool[device] = &rt.default_pool[device];
  }
  return rt.current_pool[device];
}

CUgraphNode_st* add_graph_node(CUgraph_st* graph, std::unique_ptr<CUgraphNode_st> node) {
  CUgraphNode_st* raw = node.get();
  add_handle(raw, HandleKind::GraphNode);
  graph->nodes.push_back(std::move(node));
  return raw;
}

bool find_allocation(uintptr_t ptr, size_t bytes, Allocation* out, uintptr_t* base) {
  Runtime& rt = runtime();
  std::lock_guard lock(rt.mu);
  auto it = rt.allocations.upper_bound(ptr);
  if (it == rt.allocations.begin()) return false;
  --it;
  if (ptr < it->first || ptr + bytes > it->first + it->second.size) return false;
  if (out) *out = it->second;
  if (base) *base = it->first;
  return true;
}

}  // namespace quanta::simgpu
