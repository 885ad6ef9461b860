// cpu_relax(): the pause hint for the few short spin-waits in the shim (one-time
// initialisation, a table slot being written), which never wait on another process.
#pragma once

namespace quanta::shim {

inline void cpu_relax() noexcept {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

}  // namespace quanta::shim
