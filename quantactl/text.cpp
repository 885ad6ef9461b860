// Formatting for quantactl's views (escaping is hosted/names.h printable).
#include "quantactl/text.h"

#include <cstdio>

namespace quanta::ctl {
std::string column(std::string_view text, size_t width) {
  const std::string safe = hosted::printable(text);
  // Count characters, not bytes: what is left is valid UTF-8 without control characters.
  std::string out;
  size_t chars = 0;
  for (size_t i = 0; i < safe.size();) {
    size_t n = 1;
    const auto c = static_cast<unsigned char>(safe[i]);
    if (c >= 0xf0) {
      n = 4;
    } else if (c >= 0xe0) {
      n = 3;
    } else if (c >= 0xc0) {
      n = 2;
    }
    if (chars + 1 == width && i + n < safe.size()) {
      out += '~';
      ++chars;
      break;
    }
    out.append(safe, i, n);
    ++chars;
    i += n;
    if (chars == width) break;
  }
  while (chars < width) {
    out += ' ';
    ++chars;
  }
  return out;
}

std::string bytes(uint64_t b) {
  char buf[32];
  if (b >= (1ull << 30)) {
    std::snprintf(buf, sizeof(buf), "%.1fGi", static_cast<double>(b) / (1ull << 30));
  } else if (b >= (1ull << 20)) {
    std::snprintf(buf, sizeof(buf), "%.1fMi", static_cast<double>(b) / (1ull << 20));
  } else if (b >= 1024) {
    std::snprintf(buf, sizeof(buf), "%.1fKi", static_cast<double>(b) / 1024);
  } else {
    std::snprintf(buf, sizeof(buf), "%llu", static_cast<unsigned long long>(b));
  }
  return buf;
}

std::string percent(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * v);
  return buf;
}

std::string seconds(double s) {
  char buf[32];
  if (s < 1.0) {
    std::snprintf(buf, sizeof buf, "%.0f ms", s * 1000.0);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f s", s);
  }
  return buf;
}

}  // namespace quanta::ctl
