/* dlsym through the shim: honours the handle (a hit in libcuda or NVML becomes the
 * wrapper of exactly that name; anything else is glibc's answer), keeps RTLD_NEXT
 * relative to the real caller, reports misses through dlerror, and never recurses. */
#include "tests/shim/probe.h"

int shim_probe_value(void);
void* shim_probe_next_after_b(void);

static void expect_wrapper(void* handle, const char* name) {
  void* p = dlsym(handle, name);
  CHECK(probe_in_shim(p) && !strcmp(probe_symbol_of(p), name),
        "dlsym(%s) gave %s:%s, not the shim's wrapper", name, probe_object_of(p),
        probe_symbol_of(p));
}

int main(void) {
  void* cuda = dlopen("libcuda.so.1", RTLD_NOW);
  void* nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
  void* libm = dlopen("libm.so.6", RTLD_NOW);
  CHECK(cuda && nvml && libm, "cannot open the simulated driver, NVML or libm");
  if (!cuda || !nvml || !libm) return probe_result();

  /* The driver's handle: wrapped names map to the wrapper of exactly that variant. */
  const char* wrapped[] = {"cuMemAlloc",          "cuMemAlloc_v2",    "cuLaunchKernel",
                           "cuLaunchKernel_ptsz", "cuGetProcAddress", "cuGetProcAddress_v2",
                           "cuMemGetInfo",        "cuCtxCreate_v4"};
  for (size_t i = 0; i < sizeof wrapped / sizeof wrapped[0]; ++i) expect_wrapper(cuda, wrapped[i]);
  expect_wrapper(nvml, "nvmlDeviceGetMemoryInfo");
  expect_wrapper(nvml, "nvmlDeviceGetMemoryInfo_v2");

  /* Unwrapped names on the driver's handle are the driver's own. */
  void* name_fn = dlsym(cuda, "cuDeviceGetName");
  CHECK(!strcmp(probe_object_of(name_fn), "libcuda.so.1") &&
            !strcmp(probe_symbol_of(name_fn), "cuDeviceGetName"),
        "cuDeviceGetName resolved to %s:%s", probe_object_of(name_fn), probe_symbol_of(name_fn));
  void* export_table = dlsym(cuda, "cuGetExportTable");
  CHECK(!strcmp(probe_object_of(export_table), "libcuda.so.1"),
        "cuGetExportTable was intercepted (%s)", probe_object_of(export_table));

  /* A miss is glibc's miss: NULL and a dlerror message. */
  dlerror();
  CHECK(dlsym(cuda, "cuNoSuchEntryPoint") == NULL, "a missing symbol resolved");
  CHECK(dlerror() != NULL, "a missing symbol left no dlerror message");

  /* Unrelated libraries are untouched. */
  void* cos_fn = dlsym(libm, "cos");
  CHECK(cos_fn && !strcmp(probe_object_of(cos_fn), "libm.so.6"), "cos resolved to %s",
        probe_object_of(cos_fn));

  /* RTLD_DEFAULT finds the global scope, where the preloaded wrappers come first. */
  expect_wrapper(RTLD_DEFAULT, "cuMemFree_v2");
  int (*first_definer)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "shim_probe_value");
  CHECK(first_definer && first_definer() == 1 &&
            !strcmp(probe_object_of((void*)first_definer), "libshim_probe_a.so"),
        "RTLD_DEFAULT found shim_probe_value in %s", probe_object_of((void*)first_definer));

  /* RTLD_NEXT is relative to the caller: from this program the next definer is
   * libshim_probe_a; from libshim_probe_b there is none after it. */
  int (*next_from_main)(void) = (int (*)(void))dlsym(RTLD_NEXT, "shim_probe_value");
  CHECK(next_from_main && next_from_main() == 1, "RTLD_NEXT from the program found %s",
        probe_object_of((void*)next_from_main));
  void* next_from_b = shim_probe_next_after_b();
  CHECK(next_from_b == NULL,
        "RTLD_NEXT from libshim_probe_b found %s: resolved relative to the wrong caller",
        probe_object_of(next_from_b));
  CHECK(shim_probe_value() == 1, "symbol order changed");

  /* Many lookups, some nested in the driver's own initialisation: no recursion, no hang. */
  for (int i = 0; i < 10000; ++i) CHECK(dlsym(cuda, "cuInit") != NULL, "cuInit vanished");
  int (*init)(unsigned) = (int (*)(unsigned))dlsym(cuda, "cuInit");
  CHECK(init && init(0) == 0, "cuInit through dlsym failed");
  return probe_result();
}
