// Device, context, stream and spin-kernel setup shared by every workload mode.
#include "tests/tenant/gpu.h"

namespace quanta::tenant {

void check(const Driver& driver, CUresult result, const char* call) {
  if (result != CUDA_SUCCESS) {
    throw CudaError(call, error_name(driver, result), result);
  }
}

void init_driver(const Driver& driver) {
  check(driver, need(driver, driver.Init, "cuInit")(0), "cuInit");
}

namespace {

unsigned int sched_flags(SchedKind sched) {
  switch (sched) {
    case SchedKind::automatic:
      return CU_CTX_SCHED_AUTO;
    case SchedKind::spin:
      return CU_CTX_SCHED_SPIN;
    case SchedKind::yield:
      return CU_CTX_SCHED_YIELD;
    case SchedKind::blocking:
      return CU_CTX_SCHED_BLOCKING_SYNC;
  }
  return CU_CTX_SCHED_AUTO;
}

}  // namespace

CUcontext open_context(const Driver& driver, ContextKind kind, CUdevice device, SchedKind sched) {
  CUcontext context = nullptr;
  const unsigned int flags = sched_flags(sched);
  if (kind == ContextKind::primary) {
    // Like cudaSetDeviceFlags: only meaningful before the primary context is active.
    if (sched != SchedKind::automatic) {
      check(driver,
            need(driver, driver.DevicePrimaryCtxSetFlags, "cuDevicePrimaryCtxSetFlags")(device,
                                                                                        flags),
            "cuDevicePrimaryCtxSetFlags");
    }
    check(driver,
          need(driver, driver.DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain")(&context, device),
          "cuDevicePrimaryCtxRetain");
    check(driver, need(driver, driver.CtxSetCurrent, "cuCtxSetCurrent")(context),
          "cuCtxSetCurrent");
  } else if (driver.CtxCreate_v4 != nullptr) {
    check(driver, driver.CtxCreate_v4(&context, nullptr, flags, device), "cuCtxCreate_v4");
  } else if (driver.CtxCreate_v3 != nullptr) {
    check(driver, driver.CtxCreate_v3(&context, nullptr, 0, flags, device), "cuCtxCreate_v3");
  } else {
    check(driver, need(driver, driver.CtxCreate_v2, "cuCtxCreate")(&context, flags, device),
          "cuCtxCreate_v2");
  }
  return context;
}

void close_context(const Driver& driver, ContextKind kind, CUdevice device, CUcontext context) {
  if (context == nullptr) return;
  if (kind == ContextKind::primary) {
    if (driver.DevicePrimaryCtxRelease != nullptr) driver.DevicePrimaryCtxRelease(device);
  } else if (driver.CtxDestroy != nullptr) {
    driver.CtxDestroy(context);
  }
}

Gpu::Gpu(const Driver& driver, const Options& options)
    : driver_(driver), context_kind_(options.context) {
  init_driver(driver_);
  check(driver_, need(driver_, driver_.DeviceGet, "cuDeviceGet")(&device_, options.device),
        "cuDeviceGet");
  context_ = open_context(driver_, context_kind_, device_, options.sched);
  if (options.stream == StreamKind::created) {
    check(driver_,
          need(driver_, driver_.StreamCreate, "cuStreamCreate")(&stream_, CU_STREAM_NON_BLOCKING),
          "cuStreamCreate");
    own_stream_ = true;
  }
}

Gpu::~Gpu() {
  // Teardown errors are not the workload's result; the driver reclaims at exit anyway.
  if (own_stream_ && driver_.StreamDestroy != nullptr) driver_.StreamDestroy(stream_);
  if (module_ != nullptr && driver_.ModuleUnload != nullptr) driver_.ModuleUnload(module_);
  close_context(driver_, context_kind_, device_, context_);
}

void Gpu::load_spin() {
  check(driver_, need(driver_, driver_.ModuleLoadData, "cuModuleLoadData")(&module_, kSpinPtx),
        "cuModuleLoadData");
  check(driver_,
        need(driver_, driver_.ModuleGetFunction, "cuModuleGetFunction")(&spin_, module_,
                                                                        "quanta_spin"),
        "cuModuleGetFunction(quanta_spin)");
  need(driver_, driver_.LaunchKernel, "cuLaunchKernel");
}

void Gpu::launch_spin(std::uint64_t duration_ns) {
  unsigned long long parameter = duration_ns;
  void* parameters[] = {&parameter};
  // One block of one thread: the kernel only watches the clock.
  check(driver_, driver_.LaunchKernel(spin_, 1, 1, 1, 1, 1, 1, 0, stream_, parameters, nullptr),
        "cuLaunchKernel");
}

}  // namespace quanta::tenant
