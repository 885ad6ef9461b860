// Driver entry points for contexts: primary contexts, created contexts (every cuCtxCreate
// version), the per-thread context stack and whole-context synchronisation.
#include "tests/simgpu/runtime.h"

using namespace quanta::simgpu;

namespace {

CUresult push_new_context(CUcontext* pctx, unsigned flags, CUdevice dev) {
  SIMGPU_REQUIRE_INIT();
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUctx_st* ctx = nullptr;
  if (CUresult r = create_context(dev, flags, false, &ctx); r != CUDA_SUCCESS) return r;
  context_stack().push_back(ctx);
  *pctx = ctx;
  return CUDA_SUCCESS;
}

CUresult valid_context(CUcontext ctx) {
  SIMGPU_REQUIRE_INIT();
  return has_handle(ctx, HandleKind::Context) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

}  // namespace

extern "C" {

CUresult cuCtxCreate(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  return push_new_context(pctx, flags, dev);
}
CUresult cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  return push_new_context(pctx, flags, dev);
}
CUresult cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam*, int numParams, unsigned int flags,
                        CUdevice dev) {
  if (numParams < 0) return CUDA_ERROR_INVALID_VALUE;
  return push_new_context(pctx, flags, dev);
}
CUresult cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams*, unsigned int flags, CUdevice dev) {
  return push_new_context(pctx, flags, dev);
}

CUresult cuCtxDestroy_v2(CUcontext ctx) {
  if (CUresult r = valid_context(ctx); r != CUDA_SUCCESS) return r;
  if (ctx->primary) return CUDA_ERROR_INVALID_CONTEXT;
  destroy_context(ctx);
  return CUDA_SUCCESS;
}
CUresult cuCtxDestroy(CUcontext ctx) {
  return cuCtxDestroy_v2(ctx);
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
  SIMGPU_REQUIRE_INIT();
  auto& stack = context_stack();
  if (ctx == nullptr) {
    if (!stack.empty()) stack.pop_back();
    return CUDA_SUCCESS;
  }
  if (!has_handle(ctx, HandleKind::Context)) return CUDA_ERROR_INVALID_CONTEXT;
  if (stack.empty())
    stack.push_back(ctx);
  else
    stack.back() = ctx;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext* pctx) {
  SIMGPU_REQUIRE_INIT();
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pctx = current_context();
  return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  if (CUresult r = valid_context(ctx); r != CUDA_SUCCESS) return r;
  context_stack().push_back(ctx);
  return CUDA_SUCCESS;
}
CUresult cuCtxPushCurrent(CUcontext ctx) {
  return cuCtxPushCurrent_v2(ctx);
}

CUresult cuCtxPopCurrent_v2(CUcontext* pctx) {
  SIMGPU_REQUIRE_INIT();
  auto& stack = context_stack();
  if (stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (pctx != nullptr) *pctx = stack.back();
  stack.pop_back();
  return CUDA_SUCCESS;
}
CUresult cuCtxPopCurrent(CUcontext* pctx) {
  return cuCtxPopCurrent_v2(pctx);
}

CUresult cuCtxGetDevice(CUdevice* device) {
  SIMGPU_REQUIRE_CONTEXT(ctx);
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *device = ctx->device;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice_v2(CUdevice* device, CUcontext ctx) {
  if (ctx == nullptr) return cuCtxGetDevice(device);
  if (CUresult r = valid_context(ctx); r != CUDA_SUCCESS) return r;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *device = ctx->device;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetFlags(unsigned int* flags) {
  SIMGPU_REQUIRE_CONTEXT(ctx);
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *flags = ctx->flags;
  return CUDA_SUCCESS;
}

CUresult cuCtxSetFlags(unsigned int flags) {
  SIMGPU_REQUIRE_CONTEXT(ctx);
  ctx->flags = flags;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetId(CUcontext ctx, unsigned long long* ctxId) {
  SIMGPU_REQUIRE_INIT();
  if (ctx == nullptr) ctx = current_context();
  if (!has_handle(ctx, HandleKind::Context)) return CUDA_ERROR_INVALID_CONTEXT;
  if (ctxId == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *ctxId = ctx->context_id;
  return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize() {
  SIMGPU_REQUIRE_CONTEXT(ctx);
  engine_for(ctx->device).wait(stream_tail(ctx, nullptr));
  release_pool_memory_at_sync();
  return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize_v2(CUcontext ctx) {
  if (ctx == nullptr) return cuCtxSynchronize();
  if (CUresult r = valid_context(ctx); r != CUDA_SUCCESS) return r;
  engine_for(ctx->device).wait(stream_tail(ctx, nullptr));
  release_pool_memory_at_sync();
  return CUDA_SUCCESS;
}

CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int* version) {
  SIMGPU_REQUIRE_INIT();
  if (ctx == nullptr) ctx = current_context();
  if (!has_handle(ctx, HandleKind::Context)) return CUDA_ERROR_INVALID_CONTEXT;
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *version = 3020;  // what the real driver reports for contexts of the current API
  return CUDA_SUCCESS;
}

CUresult cuCtxGetLimit(size_t* pvalue, CUlimit limit) {
  SIMGPU_REQUIRE_CONTEXT(ctx);
  (void)ctx;
  if (pvalue == nullptr) return CUDA_ERROR_INVALID_VALUE;
  switch (limit) {
    case CU_LIMIT_STACK_SIZE:
      *pvalue = 1024;
      break;
    case CU_LIMIT_PRINTF_FIFO_SIZE:
      *pvalue = 1 << 20;
      break;
    case CU_LIMIT_MALLOC_HEAP_SIZE:
      *pvalue = 8 << 20;
      break;
    default:
      *pvalue = 0;
      break;
  }
  return CUDA_SUCCESS;
}

CUresult cuCtxSetLimit(CUlimit, size_t) {
  SIMGPU_REQUIRE_CONTEXT(ctx);
  (void)ctx;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetStreamPriorityRange(int* leastPriority, int* greatestPriority) {
  SIMGPU_REQUIRE_INIT();
  if (leastPriority) *leastPriority = 0;
  if (greatestPriority) *greatestPriority = -5;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetCacheConfig(CUfunc_cache* pconfig) {
  SIMGPU_REQUIRE_INIT();
  if (pconfig == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pconfig = CU_FUNC_CACHE_PREFER_NONE;
  return CUDA_SUCCESS;
}

CUresult cuCtxSetCacheConfig(CUfunc_cache) {
  SIMGPU_REQUIRE_INIT();
  return CUDA_SUCCESS;
}

// Primary contexts: one per device per process, reference counted, never on the stack
// until the caller makes it current.
CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  SIMGPU_REQUIRE_INIT();
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Runtime& rt = runtime();
  if (dev < 0 || dev >= rt.device_count) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard lock(rt.mu);
  if (rt.primary[dev] == nullptr) {
    CUctx_st* ctx = nullptr;
    if (CUresult r = create_context(dev, 0, true, &ctx); r != CUDA_SUCCESS) return r;
    rt.primary[dev] = ctx;
  }
  rt.primary[dev]->primary_refs++;
  *pctx = rt.primary[dev];
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  SIMGPU_REQUIRE_INIT();
  Runtime& rt = runtime();
  if (dev < 0 || dev >= rt.device_count) return CUDA_ERROR_INVALID_DEVICE;
  CUctx_st* to_destroy = nullptr;
  {
    std::lock_guard lock(rt.mu);
    CUctx_st* ctx = rt.primary[dev];
    if (ctx == nullptr || ctx->primary_refs == 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (--ctx->primary_refs == 0) to_destroy = ctx;
  }
  if (to_destroy) destroy_context(to_destroy);
  return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  return cuDevicePrimaryCtxRelease_v2(dev);
}

CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  SIMGPU_REQUIRE_INIT();
  Runtime& rt = runtime();
  if (dev < 0 || dev >= rt.device_count) return CUDA_ERROR_INVALID_DEVICE;
  CUctx_st* ctx = nullptr;
  {
    std::lock_guard lock(rt.mu);
    ctx = rt.primary[dev];
  }
  if (ctx) destroy_context(ctx);
  return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
  return cuDevicePrimaryCtxReset_v2(dev);
}

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
  SIMGPU_REQUIRE_INIT();
  Runtime& rt = runtime();
  if (dev < 0 || dev >= rt.device_count) return CUDA_ERROR_INVALID_DEVICE;
  if (flags == nullptr || active == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(rt.mu);
  CUctx_st* ctx = rt.primary[dev];
  *active = ctx != nullptr && ctx->primary_refs > 0;
  *flags = ctx ? ctx->flags : 0;
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) {
  SIMGPU_REQUIRE_INIT();
  Runtime& rt = runtime();
  if (dev < 0 || dev >= rt.device_count) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard lock(rt.mu);
  if (rt.primary[dev]) rt.primary[dev]->flags = flags;
  return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags) {
  return cuDevicePrimaryCtxSetFlags_v2(dev, flags);
}

}  // extern "C"
