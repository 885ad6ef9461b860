// Gate wrappers: every launch API, and the memsets and device-to-device copies that run
// as kernels, ask the arbiter link for the GPU before the real call and report after it.
// Fast path, in a process that sees one device: a few loads and two stores to this
// thread's own line (link_gate_enter_sole). Otherwise the link's gate, after one
// cuCtxGetCurrent where the process sees several devices.
#define __CUDA_API_VERSION_INTERNAL 1
#include "shim/interpose/devices.h"
#include "shim/interpose/held_memory.h"
#include "shim/interpose/real_driver.h"
#include "shim/interposed.h"
#include "shim/link.h"

using namespace quanta::shim;

namespace {

// One gated call: the context is read once and given to both halves of the gate, with the
// stream the work goes to (the gate follows its completion while that matters). A process
// that sees one device does not read it: its gate is that device's whatever the context.
// g_sole_binding is set only by a gate lookup, which a disabled shim never makes.
template <typename Real, typename... Args>
inline CUresult gated_call(const char* name, Real real, CUstream stream, Args... args) noexcept {
  if (__builtin_expect(!real, 0)) return driver_entry_missing(name);
  Binding* sole = g_sole_binding.load(std::memory_order_acquire);
  if (__builtin_expect(sole != nullptr, 1)) {
    if (link_gate_enter_sole(sole)) {
      const CUresult result = real(args...);
      link_gate_leave_sole(sole);
      return result;
    }
  } else if (shim_disabled()) {
    return real(args...);
  }
  const CUcontext context = sole != nullptr ? nullptr : current_context();
  if (__builtin_expect(!link_gate_enter(context), 0)) return CUDA_ERROR_DEVICE_UNAVAILABLE;
  const CUresult result = real(args...);
  link_gate_leave(context, result, stream);
  return result;
}

// The stream of a per-thread-default-stream variant (_ptsz, _ptds): no stream means the
// thread's own.
inline CUstream per_thread(CUstream stream) {
  return stream ? stream : CU_STREAM_PER_THREAD;
}

}  // namespace

// QUANTA_GATED(name, (parameters), stream expression, arguments...)
#define QUANTA_GATED(name, params, stream, ...)                       \
  QUANTA_EXPORT CUresult CUDAAPI name params {                        \
    return gated_call(#name, QUANTA_REAL(name), stream, __VA_ARGS__); \
  }

#define QUANTA_LAUNCH_KERNEL_PARAMS                                                   \
  (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, \
   unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,            \
   unsigned int sharedMemBytes, CUstream hStream, void** kernelParams, void** extra)
QUANTA_GATED(cuLaunchKernel, QUANTA_LAUNCH_KERNEL_PARAMS, hStream, f, gridDimX, gridDimY, gridDimZ,
             blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams, extra)
QUANTA_GATED(cuLaunchKernel_ptsz, QUANTA_LAUNCH_KERNEL_PARAMS, per_thread(hStream), f, gridDimX,
             gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream,
             kernelParams, extra)

QUANTA_GATED(cuLaunchKernelEx,
             (const CUlaunchConfig* config, CUfunction f, void** kernelParams, void** extra),
             config ? config->hStream : nullptr, config, f, kernelParams, extra)
QUANTA_GATED(cuLaunchKernelEx_ptsz,
             (const CUlaunchConfig* config, CUfunction f, void** kernelParams, void** extra),
             per_thread(config ? config->hStream : nullptr), config, f, kernelParams, extra)

#define QUANTA_COOPERATIVE_PARAMS                                                     \
  (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, \
   unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,            \
   unsigned int sharedMemBytes, CUstream hStream, void** kernelParams)
QUANTA_GATED(cuLaunchCooperativeKernel, QUANTA_COOPERATIVE_PARAMS, hStream, f, gridDimX, gridDimY,
             gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams)
QUANTA_GATED(cuLaunchCooperativeKernel_ptsz, QUANTA_COOPERATIVE_PARAMS, per_thread(hStream), f,
             gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream,
             kernelParams)

// One launch on several devices: every stream's context is gated before the real call, and
// never by holding one gate while waiting at another (which would keep a GPU this process
// holds from being released, for as long as another GPU is busy elsewhere). Each gate is
// entered only if that needs no waiting; at the first that would, the ones entered are left,
// that one is waited for outside every gate, and all are tried again.
QUANTA_EXPORT CUresult CUDAAPI cuLaunchCooperativeKernelMultiDevice(
    CUDA_LAUNCH_PARAMS* launchParamsList, unsigned int numDevices, unsigned int flags) {
  auto real = QUANTA_REAL(cuLaunchCooperativeKernelMultiDevice);
  if (!real) return driver_entry_missing("cuLaunchCooperativeKernelMultiDevice");
  constexpr unsigned kMaxDevices = 64;
  if (shim_disabled() || !launchParamsList || numDevices == 0 || numDevices > kMaxDevices)
    return real(launchParamsList, numDevices, flags);
  auto stream_context = QUANTA_REAL(cuStreamGetCtx);
  CUcontext contexts[kMaxDevices];
  for (unsigned i = 0; i < numDevices; ++i) {
    CUcontext context = nullptr;
    if (!stream_context || !launchParamsList[i].hStream ||
        stream_context(launchParamsList[i].hStream, &context) != CUDA_SUCCESS)
      context = current_context();
    contexts[i] = context;
  }
  for (;;) {
    unsigned entered = 0;
    GateTry outcome = GateTry::kPassed;
    for (; entered < numDevices; ++entered) {
      outcome = link_gate_try_enter(contexts[entered]);
      if (outcome != GateTry::kPassed) break;
    }
    if (outcome == GateTry::kPassed) break;
    for (unsigned i = entered; i-- > 0;)
      link_gate_leave(contexts[i], CUDA_ERROR_DEVICE_UNAVAILABLE, nullptr);
    if (outcome == GateTry::kRefused || !link_gate_await(contexts[entered], contexts, entered))
      return CUDA_ERROR_DEVICE_UNAVAILABLE;
  }
  const CUresult result = real(launchParamsList, numDevices, flags);
  for (unsigned i = numDevices; i-- > 0;)
    link_gate_leave(contexts[i], result, launchParamsList[i].hStream);
  return result;
}

// A graph launch also tells the ledger, whose frees captured in that graph are refunded
// once the launch has run (held_memory.h; one atomic load when there are none).
QUANTA_EXPORT CUresult CUDAAPI cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
  const CUresult result =
      gated_call("cuGraphLaunch", QUANTA_REAL(cuGraphLaunch), hStream, hGraphExec, hStream);
  if (result == CUDA_SUCCESS && !shim_disabled()) note_graph_launched(hGraphExec, hStream);
  return result;
}
QUANTA_EXPORT CUresult CUDAAPI cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
  const CUresult result =
      gated_call("cuGraphLaunch_ptsz", QUANTA_REAL(cuGraphLaunch_ptsz), per_thread(hStream),
                 hGraphExec, hStream);
  if (result == CUDA_SUCCESS && !shim_disabled()) note_graph_launched(hGraphExec, hStream);
  return result;
}

// Memsets: legacy (32-bit sizes), _v2, _v2_ptds, Async and Async_ptsz of each width.
#define QUANTA_GATED_MEMSET(base, value_type)                                                      \
  QUANTA_GATED(base, (CUdeviceptr_v1 dstDevice, value_type value, unsigned int N), nullptr,        \
               dstDevice, value, N)                                                                \
  QUANTA_GATED(base##_v2, (CUdeviceptr dstDevice, value_type value, size_t N), nullptr, dstDevice, \
               value, N)                                                                           \
  QUANTA_GATED(base##_v2_ptds, (CUdeviceptr dstDevice, value_type value, size_t N),                \
               CU_STREAM_PER_THREAD, dstDevice, value, N)                                          \
  QUANTA_GATED(base##Async, (CUdeviceptr dstDevice, value_type value, size_t N, CUstream hStream), \
               hStream, dstDevice, value, N, hStream)                                              \
  QUANTA_GATED(base##Async_ptsz,                                                                   \
               (CUdeviceptr dstDevice, value_type value, size_t N, CUstream hStream),              \
               per_thread(hStream), dstDevice, value, N, hStream)
QUANTA_GATED_MEMSET(cuMemsetD8, unsigned char)
QUANTA_GATED_MEMSET(cuMemsetD16, unsigned short)
QUANTA_GATED_MEMSET(cuMemsetD32, unsigned int)

#define QUANTA_GATED_MEMSET_2D(base, value_type)                                               \
  QUANTA_GATED(base,                                                                           \
               (CUdeviceptr_v1 dstDevice, unsigned int dstPitch, value_type value,             \
                unsigned int Width, unsigned int Height),                                      \
               nullptr, dstDevice, dstPitch, value, Width, Height)                             \
  QUANTA_GATED(                                                                                \
      base##_v2,                                                                               \
      (CUdeviceptr dstDevice, size_t dstPitch, value_type value, size_t Width, size_t Height), \
      nullptr, dstDevice, dstPitch, value, Width, Height)                                      \
  QUANTA_GATED(                                                                                \
      base##_v2_ptds,                                                                          \
      (CUdeviceptr dstDevice, size_t dstPitch, value_type value, size_t Width, size_t Height), \
      CU_STREAM_PER_THREAD, dstDevice, dstPitch, value, Width, Height)                         \
  QUANTA_GATED(base##Async,                                                                    \
               (CUdeviceptr dstDevice, size_t dstPitch, value_type value, size_t Width,        \
                size_t Height, CUstream hStream),                                              \
               hStream, dstDevice, dstPitch, value, Width, Height, hStream)                    \
  QUANTA_GATED(base##Async_ptsz,                                                               \
               (CUdeviceptr dstDevice, size_t dstPitch, value_type value, size_t Width,        \
                size_t Height, CUstream hStream),                                              \
               per_thread(hStream), dstDevice, dstPitch, value, Width, Height, hStream)
QUANTA_GATED_MEMSET_2D(cuMemsetD2D8, unsigned char)
QUANTA_GATED_MEMSET_2D(cuMemsetD2D16, unsigned short)
QUANTA_GATED_MEMSET_2D(cuMemsetD2D32, unsigned int)

QUANTA_GATED(cuMemcpyDtoD,
             (CUdeviceptr_v1 dstDevice, CUdeviceptr_v1 srcDevice, unsigned int ByteCount), nullptr,
             dstDevice, srcDevice, ByteCount)
QUANTA_GATED(cuMemcpyDtoD_v2, (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount),
             nullptr, dstDevice, srcDevice, ByteCount)
QUANTA_GATED(cuMemcpyDtoD_v2_ptds, (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount),
             CU_STREAM_PER_THREAD, dstDevice, srcDevice, ByteCount)
QUANTA_GATED(cuMemcpyDtoDAsync,
             (CUdeviceptr_v1 dstDevice, CUdeviceptr_v1 srcDevice, unsigned int ByteCount,
              CUstream hStream),
             hStream, dstDevice, srcDevice, ByteCount, hStream)
QUANTA_GATED(cuMemcpyDtoDAsync_v2,
             (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream),
             hStream, dstDevice, srcDevice, ByteCount, hStream)
QUANTA_GATED(cuMemcpyDtoDAsync_v2_ptsz,
             (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream),
             per_thread(hStream), dstDevice, srcDevice, ByteCount, hStream)
