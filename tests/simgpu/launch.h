// Kernel launch helpers shared by direct launches and graph launches: resolving a
// CUfunction (or a CUkernel passed as one) and the duration a launch costs the device.
#pragma once

#include <cstdint>

#include "tests/simgpu/runtime.h"

namespace quanta::simgpu {

CUfunc_st* resolve_function(CUfunction f);
// `quanta_spin*`: the first parameter as unsigned long long nanoseconds; others: 5 us.
uint64_t kernel_duration_ns(const CUfunc_st* fn, void** kernelParams, void** extra);
CUresult launch(CUfunction f, CUstream h, void** kernelParams, void** extra);

}  // namespace quanta::simgpu
