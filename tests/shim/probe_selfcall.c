/* The driver's own dlsym lookups (made from inside libcuda) are never redirected to the
 * shim's wrappers, so a driver that dispatches through dlsym cannot recurse; the
 * program's lookups still get the wrappers. Runs on selfcall_driver.c as libcuda.so.1. */
#include "tests/shim/probe.h"

typedef int (*GetProcAddressFn)(const char*, void**, int, unsigned long long, int*);

int main(void) {
  void* driver = dlopen("libcuda.so.1", RTLD_NOW);
  CHECK(driver != NULL, "cannot open the self-calling driver: %s", dlerror());
  if (!driver) return probe_result();
  GetProcAddressFn get = (GetProcAddressFn)dlsym(driver, "cuGetProcAddress_v2");
  CHECK(probe_in_shim((void*)get), "the program's dlsym did not get the wrapper (%s)",
        probe_object_of((void*)get));
  void* entry = NULL;
  int status = -1;
  int result = get ? get("cuDeviceGetCount", &entry, 12000, 0, &status) : -1;
  CHECK(result == 0,
        "cuGetProcAddress_v2 returned %d (9999: the driver's own lookup came back to the shim)",
        result);
  CHECK(entry && !strcmp(probe_symbol_of(entry), "cuDeviceGetCount"), "got %s:%s",
        probe_object_of(entry), probe_symbol_of(entry));
  return probe_result();
}
