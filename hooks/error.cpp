// HookError's helpers for showing untrusted text in its one line. The escaping rule is the
// hosted helpers' (hosted/names.h printable): one rule for every line Quanta writes about text a
// pod or an image chose.
#include "hooks/error.h"

#include "hosted/names.h"

namespace quanta::hooks {

std::string printable(const std::string& text) {
  // A line built from parts that shown() escaped already: its backslashes stay as they are.
  return hosted::printable(text, /*escape_backslash=*/false);
}

std::string shown(const std::string& text) {
  // At most 200 bytes of the value, cut on a character boundary, then escaped and quoted.
  size_t cut = text.size();
  if (cut > 200) {
    cut = 200;
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xc0) == 0x80) --cut;
  }
  std::string out = "\"";
  for (char c : hosted::printable(std::string_view(text).substr(0, cut))) {
    if (c == '"') out += '\\';
    out += c;
  }
  return out + (cut < text.size() ? "…\"" : "\"");
}

}  // namespace quanta::hooks
