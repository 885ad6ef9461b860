// The capped memory view of one device, shared by the CUDA and NVML view wrappers so
// both report the same numbers.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace quanta::shim {

struct MemoryView {
  uint64_t total = 0;  // the pod's cap
  uint64_t used = 0;   // the pod's usage on this device (may exceed the cap if it was lowered)
  uint64_t room = 0;   // cap − used, clamped at zero
};

// Who asks: a CUDA view links the process as usual; an NVML view in a process that never
// used CUDA only observes (link_observed_account), so nvidia-smi is never a tenant.
enum class ViewCaller { cuda, nvml };

// False when `device` has no cap for this process: callers then report real values.
bool capped_view(CUdevice device, MemoryView* view, ViewCaller caller = ViewCaller::cuda) noexcept;

}  // namespace quanta::shim
