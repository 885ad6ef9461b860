/* A C program with no libstdc++ loads the shim and calls through its wrappers (on the
 * toolkit's stub libcuda, which depends on nothing): the shim itself needs only libc. */
#include <cuda.h>

#include "tests/shim/probe.h"

static int mapped(const char* needle) {
  FILE* maps = fopen("/proc/self/maps", "r");
  char line[4096];
  int found = 0;
  while (maps && fgets(line, sizeof line, maps))
    if (strstr(line, needle)) found = 1;
  if (maps) fclose(maps);
  return found;
}

int main(int argc, char** argv) {
  if (argc < 2 || access(argv[1], R_OK) != 0) {
    fprintf(stderr, "no stub libcuda.so given or readable: skipping\n");
    return PROBE_SKIP;
  }
  void* driver = dlopen(argv[1], RTLD_NOW);
  CHECK(driver != NULL, "dlopen(%s): %s", argv[1], dlerror());
  if (!driver) return probe_result();
  typedef CUresult (*MemGetInfo)(size_t*, size_t*);
  MemGetInfo get_info = (MemGetInfo)dlsym(driver, "cuMemGetInfo_v2");
  CHECK(probe_in_shim((void*)get_info), "cuMemGetInfo_v2 resolved to %s, not the shim's wrapper",
        probe_object_of((void*)get_info));
  size_t free_bytes = 0, total = 0;
  CUresult r = get_info ? get_info(&free_bytes, &total) : CUDA_ERROR_UNKNOWN;
  CHECK(r == CUDA_ERROR_STUB_LIBRARY, "the wrapper returned %d, not the stub driver's own answer",
        (int)r);
  CHECK(!mapped("libstdc++"), "libstdc++ is loaded");
  CHECK(!mapped("libgcc_s"), "libgcc_s is loaded");
  return probe_result();
}
