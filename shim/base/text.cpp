// copy_text and describe_errno: no allocation, no locale.
#include "shim/base/text.h"

#include <cerrno>
#include <cstring>

namespace quanta::shim {

void copy_text(char* out, size_t capacity, const char* text) noexcept {
  if (capacity == 0) return;
  const size_t length = strnlen(text, capacity - 1);
  memcpy(out, text, length);
  out[length] = '\0';
}

void describe_errno(int error, char* out, size_t capacity) noexcept {
  switch (error) {
    case ENOENT:
      copy_text(out, capacity, "no socket there");
      return;
    case ECONNREFUSED:
      copy_text(out, capacity, "connection refused");
      return;
    case EACCES:
      copy_text(out, capacity, "permission denied");
      return;
    case ENAMETOOLONG:
      copy_text(out, capacity, "socket path too long");
      return;
    default:
      break;
  }
  char digits[16];
  int length = 0;
  unsigned value = error < 0 ? 0u : static_cast<unsigned>(error);
  do {
    digits[length++] = static_cast<char>('0' + value % 10);
    value /= 10;
  } while (value != 0 && length < 15);
  char text[32] = "errno ";
  size_t at = 6;
  while (length > 0) text[at++] = digits[--length];
  text[at] = '\0';
  copy_text(out, capacity, text);
}

}  // namespace quanta::shim
