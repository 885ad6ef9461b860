// Validation of names at the door and escaping of outside text for logs and terminals.
#include "hosted/names.h"

#include <cstdint>
#include <cstdio>

#include "common/shm_layout.h"

namespace quanta::hosted {
namespace {

bool pod_key_char(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-' || c == '/' || c == ':' || c == '@' || c == '+' || c == '=';
}

}  // namespace

size_t utf8_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  size_t n = 0;
  uint32_t cp = 0;
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
    cp = c & 0x1f;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    cp = c & 0x0f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (b(i + k) & 0x3f);
  }
  if ((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10ffff ||
      (cp >= 0xd800 && cp <= 0xdfff))
    return 0;
  return n;
}

std::string check_pod_key(std::string_view key, std::string_view what) {
  if (key.empty()) return std::string(what) + " is empty";
  if (key.size() >= common::kPodKeyLen) {
    return std::string(what) + " \"" + printable(key.substr(0, 64)) + "…\" is " +
           std::to_string(key.size()) + " bytes: at most " +
           std::to_string(common::kPodKeyLen - 1) + " are allowed";
  }
  for (unsigned char c : key) {
    if (!pod_key_char(c)) {
      return std::string(what) + " \"" + printable(key) +
             "\" has a character that is not allowed: use letters, digits and . _ - / : @ + =";
    }
  }
  return "";
}

std::string check_text(std::string_view text, std::string_view what, size_t max_bytes) {
  if (text.size() > max_bytes) {
    return std::string(what) + " is " + std::to_string(text.size()) + " bytes: at most " +
           std::to_string(max_bytes) + " are allowed";
  }
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    const size_t n = utf8_length(text, i);
    if (n == 0 || c < 0x20 || c == 0x7f) {
      return std::string(what) + " \"" + printable(text) +
             "\" is not printable UTF-8 (control characters or invalid bytes)";
    }
    i += n;
  }
  return "";
}

std::string printable(std::string_view text, bool escape_backslash) {
  std::string out;
  out.reserve(text.size());
  auto escape = [&out](unsigned char c) {
    char buf[5];
    std::snprintf(buf, sizeof(buf), "\\x%02x", c);
    out += buf;
  };
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '\\' && escape_backslash) {
      out += "\\\\";
      ++i;
      continue;
    }
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    const size_t n = c < 0x80 ? 0 : utf8_length(text, i);
    if (n == 0) {
      escape(c);
      ++i;
      continue;
    }
    // Valid UTF-8 stays readable, except what moves a terminal or reorders a line: C1
    // controls and the bidirectional overrides and isolates.
    uint32_t cp = c & (n == 2 ? 0x1f : n == 3 ? 0x0f : 0x07);
    for (size_t k = 1; k < n; ++k)
      cp = (cp << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3f);
    const bool hidden = (cp >= 0x80 && cp <= 0x9f) || cp == 0x200e || cp == 0x200f ||
                        (cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069);
    for (size_t k = 0; k < n; ++k) {
      if (hidden) {
        escape(static_cast<unsigned char>(text[i + k]));
      } else {
        out += text[i + k];
      }
    }
    i += n;
  }
  return out;
}

}  // namespace quanta::hosted
