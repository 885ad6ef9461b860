// Bounded string helpers for the freestanding shim: copying into fixed buffers and naming
// an errno without strerror (which may allocate in a preloaded library's worst moment).
#pragma once

#include <cstddef>

namespace quanta::shim {

// Copies at most capacity - 1 bytes of `text` and terminates `out`.
void copy_text(char* out, size_t capacity, const char* text) noexcept;

// The few reasons a connect fails in words, anything else as "errno N".
void describe_errno(int error, char* out, size_t capacity) noexcept;

}  // namespace quanta::shim
