// Gate wrappers: every launch API, and the memsets and device-to-device copies that run
// as kernels, ask the arbiter link for the GPU before the real call and report after it.
// Fast path: the link's couple of atomic loads plus one cuCtxGetCurrent.
#define __CUDA_API_VERSION_INTERNAL 1
#include "shim/devices.h"
#include "shim/interposed.h"
#include "shim/link.h"
#include "shim/real_driver.h"

using namespace quanta::shim;

namespace {

// One gated call: the context is read once and given to both halves of the gate.
template <typename Real, typename... Args>
inline CUresult gated_call(const char* name, Real real, Args... args) noexcept {
  if (__builtin_expect(!real, 0)) return driver_entry_missing(name);
  if (shim_disabled()) return real(args...);
  const CUcontext context = current_context();
  link_gate_enter(context);
  const CUresult result = real(args...);
  link_gate_leave(context, result);
  return result;
}

}  // namespace

#define QUANTA_GATED(name, params, ...)                       \
  QUANTA_EXPORT CUresult CUDAAPI name params {                \
    return gated_call(#name, QUANTA_REAL(name), __VA_ARGS__); \
  }

#define QUANTA_LAUNCH_KERNEL_PARAMS                                                   \
  (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, \
   unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,            \
   unsigned int sharedMemBytes, CUstream hStream, void** kernelParams, void** extra)
QUANTA_GATED(cuLaunchKernel, QUANTA_LAUNCH_KERNEL_PARAMS, f, gridDimX, gridDimY, gridDimZ,
             blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams, extra)
QUANTA_GATED(cuLaunchKernel_ptsz, QUANTA_LAUNCH_KERNEL_PARAMS, f, gridDimX, gridDimY, gridDimZ,
             blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams, extra)

QUANTA_GATED(cuLaunchKernelEx,
             (const CUlaunchConfig* config, CUfunction f, void** kernelParams, void** extra),
             config, f, kernelParams, extra)
QUANTA_GATED(cuLaunchKernelEx_ptsz,
             (const CUlaunchConfig* config, CUfunction f, void** kernelParams, void** extra),
             config, f, kernelParams, extra)

#define QUANTA_COOPERATIVE_PARAMS                                                     \
  (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, \
   unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,            \
   unsigned int sharedMemBytes, CUstream hStream, void** kernelParams)
QUANTA_GATED(cuLaunchCooperativeKernel, QUANTA_COOPERATIVE_PARAMS, f, gridDimX, gridDimY, gridDimZ,
             blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams)
QUANTA_GATED(cuLaunchCooperativeKernel_ptsz, QUANTA_COOPERATIVE_PARAMS, f, gridDimX, gridDimY,
             gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams)

// One launch on several devices: every stream's context is gated before the real call.
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
    link_gate_enter(context);
  }
  const CUresult result = real(launchParamsList, numDevices, flags);
  for (unsigned i = 0; i < numDevices; ++i) link_gate_leave(contexts[i], result);
  return result;
}

QUANTA_GATED(cuGraphLaunch, (CUgraphExec hGraphExec, CUstream hStream), hGraphExec, hStream)
QUANTA_GATED(cuGraphLaunch_ptsz, (CUgraphExec hGraphExec, CUstream hStream), hGraphExec, hStream)

// Memsets: legacy (32-bit sizes), _v2, _v2_ptds, Async and Async_ptsz of each width.
#define QUANTA_GATED_MEMSET(base, value_type)                                                      \
  QUANTA_GATED(base, (CUdeviceptr_v1 dstDevice, value_type value, unsigned int N), dstDevice,      \
               value, N)                                                                           \
  QUANTA_GATED(base##_v2, (CUdeviceptr dstDevice, value_type value, size_t N), dstDevice, value,   \
               N)                                                                                  \
  QUANTA_GATED(base##_v2_ptds, (CUdeviceptr dstDevice, value_type value, size_t N), dstDevice,     \
               value, N)                                                                           \
  QUANTA_GATED(base##Async, (CUdeviceptr dstDevice, value_type value, size_t N, CUstream hStream), \
               dstDevice, value, N, hStream)                                                       \
  QUANTA_GATED(base##Async_ptsz,                                                                   \
               (CUdeviceptr dstDevice, value_type value, size_t N, CUstream hStream), dstDevice,   \
               value, N, hStream)
QUANTA_GATED_MEMSET(cuMemsetD8, unsigned char)
QUANTA_GATED_MEMSET(cuMemsetD16, unsigned short)
QUANTA_GATED_MEMSET(cuMemsetD32, unsigned int)

#define QUANTA_GATED_MEMSET_2D(base, value_type)                                               \
  QUANTA_GATED(base,                                                                           \
               (CUdeviceptr_v1 dstDevice, unsigned int dstPitch, value_type value,             \
                unsigned int Width, unsigned int Height),                                      \
               dstDevice, dstPitch, value, Width, Height)                                      \
  QUANTA_GATED(                                                                                \
      base##_v2,                                                                               \
      (CUdeviceptr dstDevice, size_t dstPitch, value_type value, size_t Width, size_t Height), \
      dstDevice, dstPitch, value, Width, Height)                                               \
  QUANTA_GATED(                                                                                \
      base##_v2_ptds,                                                                          \
      (CUdeviceptr dstDevice, size_t dstPitch, value_type value, size_t Width, size_t Height), \
      dstDevice, dstPitch, value, Width, Height)                                               \
  QUANTA_GATED(base##Async,                                                                    \
               (CUdeviceptr dstDevice, size_t dstPitch, value_type value, size_t Width,        \
                size_t Height, CUstream hStream),                                              \
               dstDevice, dstPitch, value, Width, Height, hStream)                             \
  QUANTA_GATED(base##Async_ptsz,                                                               \
               (CUdeviceptr dstDevice, size_t dstPitch, value_type value, size_t Width,        \
                size_t Height, CUstream hStream),                                              \
               dstDevice, dstPitch, value, Width, Height, hStream)
QUANTA_GATED_MEMSET_2D(cuMemsetD2D8, unsigned char)
QUANTA_GATED_MEMSET_2D(cuMemsetD2D16, unsigned short)
QUANTA_GATED_MEMSET_2D(cuMemsetD2D32, unsigned int)

QUANTA_GATED(cuMemcpyDtoD,
             (CUdeviceptr_v1 dstDevice, CUdeviceptr_v1 srcDevice, unsigned int ByteCount),
             dstDevice, srcDevice, ByteCount)
QUANTA_GATED(cuMemcpyDtoD_v2, (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount),
             dstDevice, srcDevice, ByteCount)
QUANTA_GATED(cuMemcpyDtoD_v2_ptds, (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount),
             dstDevice, srcDevice, ByteCount)
QUANTA_GATED(cuMemcpyDtoDAsync,
             (CUdeviceptr_v1 dstDevice, CUdeviceptr_v1 srcDevice, unsigned int ByteCount,
              CUstream hStream),
             dstDevice, srcDevice, ByteCount, hStream)
QUANTA_GATED(cuMemcpyDtoDAsync_v2,
             (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream),
             dstDevice, srcDevice, ByteCount, hStream)
QUANTA_GATED(cuMemcpyDtoDAsync_v2_ptsz,
             (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream),
             dstDevice, srcDevice, ByteCount, hStream)
