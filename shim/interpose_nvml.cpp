// NVML view wrappers (placeholder table until the NVML declarations land).
#include "shim/interposed.h"

namespace quanta::shim {

const Interposed* find_interposed_nvml(const char*) noexcept { return nullptr; }

}  // namespace quanta::shim
