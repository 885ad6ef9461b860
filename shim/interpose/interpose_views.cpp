// View wrappers: what a capped pod sees of the GPU's memory. total = the pod's cap,
// free = min(cap − pod usage, the GPU's real free), never below zero and never an error
// because usage passed the cap; a process without a cap sees the real values. NVML
// answers the same for the same physical device (matched by UUID).
#define __CUDA_API_VERSION_INTERNAL 1
#include "shim/interpose/devices.h"
#include "shim/interpose/pod_ledger.h"
#include "shim/interpose/real_driver.h"
#include "shim/interpose/views.h"
#include "shim/interposed.h"
#include "shim/link.h"

using namespace quanta::shim;

namespace quanta::shim {

bool capped_view(CUdevice device, MemoryView* view, ViewCaller caller) noexcept {
  MemoryAccount account;
  const bool found = caller == ViewCaller::nvml ? link_observed_account(device, &account)
                                                : link_memory_account(device, &account);
  if (!found || !account.pod_used || !account.cap) return false;
  const uint64_t cap = account.cap->load(std::memory_order_acquire);
  if (cap == 0) return false;
  const uint64_t used = account.pod_used->load(std::memory_order_acquire);
  view->total = cap;
  view->used = used;
  view->room = used >= cap ? 0 : cap - used;
  return true;
}

}  // namespace quanta::shim

namespace {

template <typename Size>
void apply_view(const MemoryView& view, Size* free, Size* total) {
  constexpr uint64_t kMax = static_cast<Size>(-1);
  const uint64_t real_free = free ? static_cast<uint64_t>(*free) : view.room;
  const uint64_t shown_free = view.room < real_free ? view.room : real_free;
  if (free) *free = static_cast<Size>(shown_free > kMax ? kMax : shown_free);
  if (total) *total = static_cast<Size>(view.total > kMax ? kMax : view.total);
}

}  // namespace

QUANTA_EXPORT CUresult CUDAAPI cuMemGetInfo(unsigned int* free, unsigned int* total) {
  auto real = QUANTA_REAL(cuMemGetInfo);
  if (!real) return driver_entry_missing("cuMemGetInfo");
  const CUresult result = real(free, total);
  CUdevice device;
  MemoryView view;
  if (result == CUDA_SUCCESS && !shim_disabled() && current_device(&device) &&
      capped_view(device, &view)) {
    // The legacy call saturates at 4 GiB - 1; ask the 64-bit one for the real free.
    size_t real_free = 0, real_total = 0;
    auto real_v2 = QUANTA_REAL(cuMemGetInfo_v2);
    if (real_v2 && real_v2(&real_free, &real_total) == CUDA_SUCCESS) {
      view.room = view.room < real_free ? view.room : real_free;
    }
    apply_view(view, free, total);
  }
  return result;
}

QUANTA_EXPORT CUresult CUDAAPI cuMemGetInfo_v2(size_t* free, size_t* total) {
  auto real = QUANTA_REAL(cuMemGetInfo_v2);
  if (!real) return driver_entry_missing("cuMemGetInfo_v2");
  const CUresult result = real(free, total);
  CUdevice device;
  MemoryView view;
  if (result == CUDA_SUCCESS && !shim_disabled() && current_device(&device) &&
      capped_view(device, &view))
    apply_view(view, free, total);
  return result;
}

QUANTA_EXPORT CUresult CUDAAPI cuDeviceTotalMem(unsigned int* bytes, CUdevice dev) {
  auto real = QUANTA_REAL(cuDeviceTotalMem);
  if (!real) return driver_entry_missing("cuDeviceTotalMem");
  const CUresult result = real(bytes, dev);
  MemoryView view;
  if (result == CUDA_SUCCESS && !shim_disabled() && capped_view(dev, &view))
    apply_view<unsigned int>(view, nullptr, bytes);
  return result;
}

QUANTA_EXPORT CUresult CUDAAPI cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  auto real = QUANTA_REAL(cuDeviceTotalMem_v2);
  if (!real) return driver_entry_missing("cuDeviceTotalMem_v2");
  const CUresult result = real(bytes, dev);
  MemoryView view;
  if (result == CUDA_SUCCESS && !shim_disabled() && capped_view(dev, &view))
    apply_view<size_t>(view, nullptr, bytes);
  return result;
}
