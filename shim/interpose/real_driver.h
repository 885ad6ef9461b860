// The real CUDA driver and NVML behind libquanta.so: finds them without help
// (libcuda.so.1 already loaded, else next in the library search order), hands out their
// entry points by exact exported name, cached, and never resolves to the shim's own exports.
#pragma once

#include <cuda.h>

#include <atomic>

namespace quanta::shim {

// The real libcuda entry exported as `name` (exact variant: "cuMemAlloc_v2",
// "cuLaunchKernel_ptsz"), or nullptr when the driver or that symbol is absent. Loads
// libcuda.so.1 when no one has yet: call it only on a path a CUDA call reached.
void* real_driver_symbol(const char* name) noexcept;

// The same for libnvidia-ml.so.1.
void* real_nvml_symbol(const char* name) noexcept;

// glibc's own dlsym (the shim exports an override of dlsym), and its address.
void* real_dlsym(void* handle, const char* name) noexcept;
void* real_dlsym_function() noexcept;

// Handles of the real libraries when they are loaded already, else nullptr; never loads.
void* loaded_driver_handle() noexcept;
void* loaded_nvml_handle() noexcept;

// Which object an address lies in. Never loads anything.
enum class ObjectKind { other, cuda_driver, nvml, shim };
ObjectKind object_of(const void* address) noexcept;

// Typed, cached access to one real entry: the first call resolves, later calls are one
// load. Use through QUANTA_REAL / QUANTA_REAL_NVML, which give each name its own cache.
template <typename Fn>
inline Fn cached_real(std::atomic<void*>& cache, const char* name,
                      void* (*resolve)(const char*) noexcept) noexcept {
  void* entry = cache.load(std::memory_order_acquire);
  if (__builtin_expect(entry == nullptr, 0)) {
    entry = resolve(name);
    if (entry) cache.store(entry, std::memory_order_release);
  }
  return reinterpret_cast<Fn>(entry);
}

}  // namespace quanta::shim

// QUANTA_REAL(cuMemAlloc_v2) is the real driver's cuMemAlloc_v2, typed from cuda.h's
// prototype of exactly that name (nullptr when absent). Legacy names (cuMemAlloc,
// cuCtxCreate) need __CUDA_API_VERSION_INTERNAL defined before cuda.h is included.
#define QUANTA_REAL(fn)                           \
  (::quanta::shim::cached_real<decltype(&::fn)>(  \
      []() noexcept -> std::atomic<void*>& {      \
        static std::atomic<void*> cache{nullptr}; \
        return cache;                             \
      }(),                                        \
      #fn, &::quanta::shim::real_driver_symbol))
#define QUANTA_REAL_NVML(fn)                      \
  (::quanta::shim::cached_real<decltype(&::fn)>(  \
      []() noexcept -> std::atomic<void*>& {      \
        static std::atomic<void*> cache{nullptr}; \
        return cache;                             \
      }(),                                        \
      #fn, &::quanta::shim::real_nvml_symbol))
