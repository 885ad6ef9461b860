/* Second definer of shim_probe_value; asks for the *next* one after itself, which glibc
 * must resolve relative to this library (the caller), not relative to libquanta.so. */
#define _GNU_SOURCE
#include <dlfcn.h>

int shim_probe_value(void) {
  return 2;
}

void* shim_probe_next_after_b(void) {
  /* Not a tail call: the call must come from this library's own code. */
  void* volatile next = dlsym(RTLD_NEXT, "shim_probe_value");
  return next;
}
