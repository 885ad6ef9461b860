// Feeds arbitrary text to every policy parser (annotations, node config and quantactl
// share them): each either accepts with a value in range or refuses with a message.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "common/policy.h"

namespace {

using namespace quanta::common;

void check_message(bool ok, const ParseError& err) {
  // A refusal always says something on one line; the buffer is always terminated.
  if (std::memchr(err.text, '\0', sizeof(err.text)) == nullptr) std::abort();
  if (!ok && err.text[0] == '\0') std::abort();
  for (const char* c = err.text; !ok && *c != '\0'; ++c) {
    if (static_cast<unsigned char>(*c) < 0x20 || *c == 0x7f) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  {
    ParseError err;
    uint32_t weight = 0;
    bool ok = parse_weight(text, &weight, &err);
    check_message(ok, err);
    if (ok && (weight < kMinWeight || weight > kMaxWeight)) std::abort();
  }
  {
    ParseError err;
    Priority priority{};
    check_message(parse_priority(text, &priority, &err), err);
  }
  {
    ParseError err;
    uint32_t ppm = 0;
    bool ok = parse_share(text, &ppm, &err);
    check_message(ok, err);
    if (ok && (ppm == 0 || ppm > kShareScale)) std::abort();
  }
  {
    ParseError err;
    uint64_t bytes = 0;
    check_message(parse_bytes(text, &bytes, &err), err);
  }
  {
    ParseError err;
    uint64_t ns = 0;
    check_message(parse_duration(text, &ns, &err), err);
  }
  return 0;
}
