// cuGetProcAddress and cuGetProcAddress_v2: the entry points cudart and frameworks use to
// find every other driver function by name, CUDA version and default-stream flavour.
#include "tests/simgpu/cuda_api.h"
#include "tests/simgpu/proc_address.h"

using namespace quanta::simgpu;

extern "C" {

CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult* symbolStatus) {
  if (symbol == nullptr || pfn == nullptr || cudaVersion < 0) return CUDA_ERROR_INVALID_VALUE;
  const cuuint64_t known_flags =
      CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  if ((flags & ~known_flags) != 0) return CUDA_ERROR_INVALID_VALUE;
  // CU_GET_PROC_ADDRESS_DEFAULT means legacy in the driver: only cuda.h's inline wrapper
  // (compiled with per-thread default streams) turns it into the per-thread flag.
  const bool per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  const ProcLookup found = lookup_proc(symbol, cudaVersion, per_thread, pfn);
  if (symbolStatus != nullptr) {
    switch (found) {
      case ProcLookup::Found:
        *symbolStatus = CU_GET_PROC_ADDRESS_SUCCESS;
        break;
      case ProcLookup::SymbolNotFound:
        *symbolStatus = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        break;
      case ProcLookup::VersionNotSufficient:
        *symbolStatus = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
        break;
    }
  }
  return found == ProcLookup::Found ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
  return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, nullptr);
}

}  // extern "C"
