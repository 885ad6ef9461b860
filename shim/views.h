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

// False when `device` has no cap for this process: callers then report real values.
bool capped_view(CUdevice device, MemoryView* view) noexcept;

}  // namespace quanta::shim
