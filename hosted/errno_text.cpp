#include "hosted/errno_text.h"

#include <cstring>

namespace quanta::hosted {

std::string errno_text(int err) {
  if (err < 0) err = -err;
  char buffer[256];
  // GNU strerror_r: returns the text, in `buffer` or a static string of its own.
  return std::string(::strerror_r(err, buffer, sizeof buffer)) + " (errno " + std::to_string(err) +
         ")";
}

}  // namespace quanta::hosted
