/* A stand-in libcuda.so.1 that, like some real drivers, finds its own entry points with
 * dlsym on its own handle and calls through what it got. An interposer that answered
 * those lookups with its wrappers would send the driver back into the wrapper forever
 * (the cuInit loop seen on WSL2); the depth counter turns that into an error code. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>

typedef int (*GetProcAddressFn)(const char*, void**, int, unsigned long long, int*);

static __thread int depth;

int cuInit(unsigned flags) {
  return (int)flags;
}

int cuDeviceGetCount(int* count) {
  *count = 0;
  return 0;
}

int cuGetProcAddress_v2(const char* symbol, void** pfn, int version, unsigned long long flags,
                        int* status) {
  if (++depth > 3) {
    --depth;
    return 9999; /* recursed through an interposer */
  }
  void* self = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  GetProcAddressFn dispatch = (GetProcAddressFn)dlsym(self, "cuGetProcAddress_v2");
  int result = 0;
  if (dispatch != cuGetProcAddress_v2) {
    result = dispatch ? dispatch(symbol, pfn, version, flags, status) : 500;
  } else {
    *pfn = dlsym(self, symbol);
    if (status) *status = 0;
    result = *pfn ? 0 : 500;
  }
  --depth;
  return result;
}
