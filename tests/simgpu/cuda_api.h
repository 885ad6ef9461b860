// cuda.h as the driver itself sees it: __CUDA_API_VERSION_INTERNAL turns off the
// name remapping (cuMemAlloc -> cuMemAlloc_v2, ...) so every exported name, legacy and
// versioned, is declared with its own exact prototype.
#pragma once

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
