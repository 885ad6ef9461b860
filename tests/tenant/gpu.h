// One tenant's hold on a device: driver init, the context (primary like cudart, or its
// own), the stream, and the embedded spin kernel; every failing call becomes a CudaError
// naming the call and the driver's error name.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "tests/tenant/driver.h"
#include "tests/tenant/options.h"

namespace quanta::tenant {

extern const char kSpinPtx[];  // spin.ptx, embedded at build time

class CudaError : public std::runtime_error {
 public:
  CudaError(std::string call, std::string name, CUresult result)
      : std::runtime_error(call + " failed: " + name),
        call_(std::move(call)),
        name_(std::move(name)),
        result_(result) {}
  const std::string& call() const { return call_; }
  const std::string& name() const { return name_; }
  CUresult result() const { return result_; }

 private:
  std::string call_;
  std::string name_;
  CUresult result_;
};

// Throws CudaError unless result is CUDA_SUCCESS.
void check(const Driver& driver, CUresult result, const char* call);

// Throws CudaError(CUDA_ERROR_NOT_FOUND) when the lookup path did not resolve the entry.
template <typename Function>
Function need(const Driver& driver, Function function, const char* name) {
  if (function == nullptr) {
    throw CudaError(name, "not resolved through lookup " + std::string(lookup_name(driver.lookup)),
                    CUDA_ERROR_NOT_FOUND);
  }
  return function;
}

// cuInit(0) once per process.
void init_driver(const Driver& driver);

class Gpu {
 public:
  Gpu(const Driver& driver,
      const Options& options);  // init, device, context (made current), stream
  ~Gpu();
  Gpu(const Gpu&) = delete;
  Gpu& operator=(const Gpu&) = delete;

  void load_spin();  // module from kSpinPtx, function quanta_spin
  void launch_spin(std::uint64_t duration_ns);
  CUstream stream() const { return stream_; }
  CUdevice device() const { return device_; }
  const Driver& driver() const { return driver_; }

 private:
  const Driver& driver_;
  ContextKind context_kind_;
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
  CUstream stream_ = nullptr;
  bool own_stream_ = false;
  CUmodule module_ = nullptr;
  CUfunction spin_ = nullptr;
};

// Creates a context of the given kind on device and makes it current.
CUcontext open_context(const Driver& driver, ContextKind kind, CUdevice device,
                       SchedKind sched = SchedKind::automatic);
void close_context(const Driver& driver, ContextKind kind, CUdevice device, CUcontext context);

}  // namespace quanta::tenant
