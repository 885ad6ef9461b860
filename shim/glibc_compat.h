// Pins the libc symbols libquanta.so uses to their oldest versions, so the library loads
// on any glibc >= 2.17 although it is built on a newer one (glibc 2.34 moved the dl* and
// pthread_* functions into libc under new versions). Force-included into every shim TU.
#pragma once

#if defined(__x86_64__)
#define QUANTA_GLIBC_BASE "GLIBC_2.2.5"
#elif defined(__aarch64__)
#define QUANTA_GLIBC_BASE "GLIBC_2.17"
#else
#error "libquanta.so supports x86_64 and aarch64"
#endif

#define QUANTA_PIN_GLIBC(sym) __asm__(".symver " #sym "," #sym "@" QUANTA_GLIBC_BASE)

// dlsym is not pinned: libquanta.so defines it (interpose_lookup.cpp). Shim code reaches
// glibc's through real_dlsym() (real_driver.h), found with dlvsym.

// Functions with no version old enough to pin, so the shim must not call them:
// stat/fstat/lstat/fstatat (GLIBC_2.33; use syscall(SYS_fstat, fd, &st) or
// syscall(SYS_newfstatat, ...)), gettid (2.30; use syscall(SYS_gettid)), memfd_create
// (2.27), getrandom (2.25), pidfd_open (2.36), and thread_local objects with
// destructors (__cxa_thread_atexit_impl, 2.18). tests/shim/check_exports.sh catches them.

QUANTA_PIN_GLIBC(dlopen);
QUANTA_PIN_GLIBC(dlclose);
QUANTA_PIN_GLIBC(dlvsym);
QUANTA_PIN_GLIBC(dladdr);
QUANTA_PIN_GLIBC(dlerror);
QUANTA_PIN_GLIBC(pthread_create);
QUANTA_PIN_GLIBC(pthread_join);
QUANTA_PIN_GLIBC(pthread_detach);
QUANTA_PIN_GLIBC(pthread_once);
QUANTA_PIN_GLIBC(pthread_key_create);
QUANTA_PIN_GLIBC(pthread_key_delete);
QUANTA_PIN_GLIBC(pthread_getspecific);
QUANTA_PIN_GLIBC(pthread_setspecific);
QUANTA_PIN_GLIBC(pthread_sigmask);
QUANTA_PIN_GLIBC(pthread_atfork);
QUANTA_PIN_GLIBC(pthread_mutex_trylock);
QUANTA_PIN_GLIBC(pthread_mutexattr_init);
QUANTA_PIN_GLIBC(pthread_mutexattr_settype);
QUANTA_PIN_GLIBC(pthread_mutexattr_setpshared);
QUANTA_PIN_GLIBC(pthread_condattr_setpshared);
QUANTA_PIN_GLIBC(pthread_attr_setstacksize);
