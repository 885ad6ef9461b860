/* cuGetProcAddress through the shim: the real driver picks the variant (by cudaVersion
 * and the per-thread default-stream flag), the shim returns its wrapper of exactly that
 * exported variant, and passes through what it does not wrap. `disabled` mode
 * (QUANTA_DISABLE=1) expects the driver's own entries. */
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include "tests/shim/probe.h"

struct expectation {
  const char* symbol;
  int version;
  cuuint64_t flags;
  const char* exported; /* the variant the driver selects */
  int wrapped;          /* the shim wraps that variant */
};

static const struct expectation kCases[] = {
    {"cuMemAlloc", 2000, CU_GET_PROC_ADDRESS_DEFAULT, "cuMemAlloc", 1},
    {"cuMemAlloc", 12000, CU_GET_PROC_ADDRESS_DEFAULT, "cuMemAlloc_v2", 1},
    {"cuMemFree", 3010, CU_GET_PROC_ADDRESS_DEFAULT, "cuMemFree", 1},
    {"cuMemGetInfo", 2000, CU_GET_PROC_ADDRESS_DEFAULT, "cuMemGetInfo", 1},
    {"cuMemGetInfo", 13000, CU_GET_PROC_ADDRESS_DEFAULT, "cuMemGetInfo_v2", 1},
    {"cuCtxCreate", 3020, CU_GET_PROC_ADDRESS_DEFAULT, "cuCtxCreate_v2", 1},
    {"cuCtxCreate", 11040, CU_GET_PROC_ADDRESS_DEFAULT, "cuCtxCreate_v3", 1},
    {"cuCtxCreate", 12080, CU_GET_PROC_ADDRESS_DEFAULT, "cuCtxCreate_v4", 1},
    {"cuLaunchKernel", 12000, CU_GET_PROC_ADDRESS_DEFAULT, "cuLaunchKernel", 1},
    {"cuLaunchKernel", 12000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, "cuLaunchKernel", 1},
    {"cuLaunchKernel", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuLaunchKernel_ptsz",
     1},
    {"cuMemsetD8", 12000, CU_GET_PROC_ADDRESS_DEFAULT, "cuMemsetD8_v2", 1},
    {"cuMemsetD8", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemsetD8_v2_ptds", 1},
    {"cuMemAllocAsync", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
     "cuMemAllocAsync_ptsz", 1},
    {"cuGraphLaunch", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuGraphLaunch_ptsz",
     1},
    {"cuGraphInstantiate", 11000, CU_GET_PROC_ADDRESS_DEFAULT, "cuGraphInstantiate_v2", 1},
    {"cuGraphInstantiate", 12000, CU_GET_PROC_ADDRESS_DEFAULT, "cuGraphInstantiateWithFlags", 1},
    {"cuGetProcAddress", 11030, CU_GET_PROC_ADDRESS_DEFAULT, "cuGetProcAddress", 1},
    {"cuGetProcAddress", 12000, CU_GET_PROC_ADDRESS_DEFAULT, "cuGetProcAddress_v2", 1},
    {"cuDeviceGetName", 12000, CU_GET_PROC_ADDRESS_DEFAULT, "cuDeviceGetName", 0},
    {"cuStreamSynchronize", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
     "cuStreamSynchronize_ptsz", 1},
    {"cuStreamQuery", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuStreamQuery_ptsz",
     0},
    {"cuGetExportTable", 12000, CU_GET_PROC_ADDRESS_DEFAULT, "cuGetExportTable", 0},
};

static void check_case(const struct expectation* c, void* p, int disabled, const char* via) {
  const int want_shim = c->wrapped && !disabled;
  const char* object = probe_object_of(p);
  CHECK(want_shim ? probe_in_shim(p) : !strcmp(object, "libcuda.so.1"),
        "%s(%s, %d, %llu) gave an entry in %s", via, c->symbol, c->version,
        (unsigned long long)c->flags, object);
  CHECK(!strcmp(probe_symbol_of(p), c->exported),
        "%s(%s, %d, %llu) gave %s, expected the variant %s", via, c->symbol, c->version,
        (unsigned long long)c->flags, probe_symbol_of(p), c->exported);
  if (want_shim)
    CHECK(p == dlsym(RTLD_DEFAULT, c->exported), "%s: not the exported wrapper", c->exported);
}

int main(int argc, char** argv) {
  const int disabled = argc > 1 && !strcmp(argv[1], "disabled");
  CHECK_CU(cuInit(0));
  for (size_t i = 0; i < sizeof kCases / sizeof kCases[0]; ++i) {
    const struct expectation* c = &kCases[i];
    void* p = NULL;
    CUdriverProcAddressQueryResult status;
    CUresult r = cuGetProcAddress_v2(c->symbol, &p, c->version, c->flags, &status);
    CHECK(r == CUDA_SUCCESS && status == CU_GET_PROC_ADDRESS_SUCCESS,
          "cuGetProcAddress_v2(%s) returned %d", c->symbol, (int)r);
    if (r == CUDA_SUCCESS) check_case(c, p, disabled, "cuGetProcAddress_v2");
    p = NULL;
    r = cuGetProcAddress(c->symbol, &p, c->version, c->flags);
    CHECK(r == CUDA_SUCCESS, "cuGetProcAddress(%s) returned %d", c->symbol, (int)r);
    if (r == CUDA_SUCCESS) check_case(c, p, disabled, "cuGetProcAddress");
  }
  /* What the driver refuses is refused unchanged. */
  void* p = NULL;
  CUdriverProcAddressQueryResult status;
  CHECK(cuGetProcAddress_v2("cuCtxCreate", &p, 1000, 0, &status) == CUDA_ERROR_NOT_FOUND &&
            status == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT,
        "a too-old cudaVersion was not refused as the driver refuses it");
  CHECK(cuGetProcAddress_v2("cuNoSuchThing", &p, 13000, 0, &status) == CUDA_ERROR_NOT_FOUND &&
            status == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
        "an unknown symbol was not refused as the driver refuses it");
  return probe_result();
}
