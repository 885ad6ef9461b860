// Parsers for the textual policy forms shared by quanta-hook (annotations), the arbiter's
// node config and quantactl. Each error names the offending text and the allowed form.
#include "common/policy.h"

#include <cstdio>
#include <cstring>

namespace quanta::common {
namespace {

template <typename... Args>
bool fail(ParseError* err, const char* fmt, Args... args) {
  if (err != nullptr) std::snprintf(err->text, sizeof(err->text), fmt, args...);
  return false;
}

// Parses "123" or "123.456" into an integer part and a fraction scaled to 1e9. Returns
// the number of characters consumed (0 when no digit was found).
struct Decimal {
  uint64_t whole = 0;
  uint64_t frac_nano = 0;  // fractional part × 1e9
  bool overflow = false;
};

// What follows the first `used` characters ("" when none were used). Not substr(), which
// may throw: these parsers also run inside libquanta.so, built without exceptions.
std::string_view rest_of(std::string_view text, size_t used) {
  return used == 0 ? std::string_view() : std::string_view(text.data() + used, text.size() - used);
}

size_t parse_decimal(std::string_view s, Decimal* d) {
  size_t i = 0;
  bool any = false;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
    uint64_t digit = static_cast<uint64_t>(s[i] - '0');
    if (d->whole > (UINT64_MAX - digit) / 10) d->overflow = true;
    d->whole = d->whole * 10 + digit;
    any = true;
    ++i;
  }
  if (i < s.size() && s[i] == '.') {
    ++i;
    uint64_t scale = 100000000;
    bool frac_any = false;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
      d->frac_nano += static_cast<uint64_t>(s[i] - '0') * scale;
      scale /= 10;
      frac_any = true;
      ++i;
    }
    if (!frac_any) return 0;
    any = true;
  }
  return any ? i : 0;
}

// The offending text as a message quotes it: at most 64 characters, control characters and
// backslashes escaped, so that every message stays one line whatever the text holds.
struct Quoted {
  char text[65];
};

Quoted quoted(std::string_view s) {
  Quoted q{};
  size_t n = 0;
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    char piece[5] = {ch, 0, 0, 0, 0};
    size_t len = 1;
    if (c < 0x20 || c == 0x7f) {
      len = static_cast<size_t>(std::snprintf(piece, sizeof(piece), "\\x%02x", c));
    } else if (c == '\\') {
      piece[1] = '\\';
      len = 2;
    }
    if (n + len > sizeof(q.text) - 1) break;
    std::memcpy(q.text + n, piece, len);
    n += len;
  }
  return q;
}

}  // namespace

bool parse_weight(std::string_view text, uint32_t* out, ParseError* err) {
  Decimal d;
  size_t used = parse_decimal(text, &d);
  if (used == 0 || used != text.size() || d.frac_nano != 0 || d.overflow || d.whole < kMinWeight ||
      d.whole > kMaxWeight) {
    return fail(err, "weight \"%s\" is not allowed: use a whole number from %u to %u",
                quoted(text).text, kMinWeight, kMaxWeight);
  }
  *out = static_cast<uint32_t>(d.whole);
  return true;
}

bool parse_priority(std::string_view text, Priority* out, ParseError* err) {
  if (text == "interactive") {
    *out = Priority::kInteractive;
  } else if (text == "batch") {
    *out = Priority::kBatch;
  } else if (text == "best-effort") {
    *out = Priority::kBestEffort;
  } else {
    return fail(err, "priority \"%s\" is not allowed: use interactive, batch or best-effort",
                quoted(text).text);
  }
  return true;
}

bool parse_share(std::string_view text, uint32_t* out_ppm, ParseError* err) {
  Decimal d;
  size_t used = parse_decimal(text, &d);
  bool percent = used != 0 && used + 1 == text.size() && text[used] == '%';
  uint64_t ppm = 0;
  if (used != 0 && !d.overflow && (used == text.size() || percent)) {
    if (percent) {
      ppm = d.whole * 10000 + d.frac_nano / 100000;
    } else {
      ppm = d.whole * kShareScale + d.frac_nano / 1000;
    }
  }
  if (ppm == 0 || ppm > kShareScale || d.whole > 100) {
    return fail(err,
                "share \"%s\" is not allowed: use a fraction greater than 0 and at most 1 "
                "(\"0.3\") or a percentage (\"30%%\")",
                quoted(text).text);
  }
  *out_ppm = static_cast<uint32_t>(ppm);
  return true;
}

bool parse_bytes(std::string_view text, uint64_t* out, ParseError* err) {
  struct Suffix {
    const char* name;
    uint64_t factor;
  };
  static constexpr Suffix kSuffixes[] = {
      {"Ki", 1ull << 10}, {"Mi", 1ull << 20}, {"Gi", 1ull << 30}, {"Ti", 1ull << 40},
      {"k", 1000ull},     {"K", 1000ull},     {"M", 1000000ull},  {"G", 1000000000ull},
      {"T", 1000000000000ull}, {"", 1},
  };
  Decimal d;
  size_t used = parse_decimal(text, &d);
  const std::string_view suffix = rest_of(text, used);
  if (used != 0 && !d.overflow) {
    for (const Suffix& s : kSuffixes) {
      if (suffix != s.name) continue;
      unsigned __int128 bytes = static_cast<unsigned __int128>(d.whole) * s.factor +
                                static_cast<unsigned __int128>(d.frac_nano) * s.factor / 1000000000u;
      if (bytes > 0 && bytes <= UINT64_MAX) {
        *out = static_cast<uint64_t>(bytes);
        return true;
      }
      break;
    }
  }
  return fail(err,
              "memory size \"%s\" is not allowed: use a positive number of bytes with an "
              "optional suffix Ki, Mi, Gi, Ti, k, M, G or T (\"10Gi\")",
              quoted(text).text);
}

bool parse_bytes_or_zero(std::string_view text, uint64_t* out, ParseError* err) {
  if (text == "0") {
    *out = 0;
    return true;
  }
  if (parse_bytes(text, out, nullptr)) return true;
  return fail(err,
              "memory size \"%s\" is not allowed: use 0 or a number of bytes with an optional "
              "suffix Ki, Mi, Gi, Ti, k, M, G or T (\"544Mi\")",
              quoted(text).text);
}

bool parse_duration(std::string_view text, uint64_t* out_ns, ParseError* err) {
  struct Unit {
    const char* name;
    uint64_t ns;
  };
  static constexpr Unit kUnits[] = {{"ns", 1},          {"us", 1000},
                                    {"µs", 1000},       {"ms", 1000000},
                                    {"s", 1000000000},  {"m", 60000000000ull},
                                    {"h", 3600000000000ull}};
  Decimal d;
  size_t used = parse_decimal(text, &d);
  const std::string_view unit = rest_of(text, used);
  if (used != 0 && !d.overflow) {
    for (const Unit& u : kUnits) {
      if (unit != u.name) continue;
      unsigned __int128 ns = static_cast<unsigned __int128>(d.whole) * u.ns +
                             static_cast<unsigned __int128>(d.frac_nano) * u.ns / 1000000000u;
      if (ns > 0 && ns <= UINT64_MAX) {
        *out_ns = static_cast<uint64_t>(ns);
        return true;
      }
      break;
    }
  }
  return fail(err,
              "duration \"%s\" is not allowed: use a positive number with a unit ns, us, ms, "
              "s, m or h (\"20ms\")",
              quoted(text).text);
}

bool parse_command_duration(std::string_view text, uint64_t* out_ns, ParseError* err) {
  Decimal d;
  const size_t used = parse_decimal(text, &d);
  if (used != 0 && used == text.size()) {
    const unsigned __int128 ns = static_cast<unsigned __int128>(d.whole) * 1000000000u + d.frac_nano;
    if (!d.overflow && ns > 0 && ns <= UINT64_MAX) {
      *out_ns = static_cast<uint64_t>(ns);
      return true;
    }
  } else if (parse_duration(text, out_ns, err)) {
    return true;
  }
  return fail(err,
              "duration \"%s\" is not allowed: use a positive number of seconds (\"30\") or a "
              "number with a unit ns, us, ms, s, m or h (\"500ms\", \"2s\", \"5m\")",
              quoted(text).text);
}

const char* priority_name(Priority p) {
  switch (p) {
    case Priority::kInteractive:
      return "interactive";
    case Priority::kBatch:
      return "batch";
    case Priority::kBestEffort:
      return "best-effort";
  }
  return "unknown";
}

}  // namespace quanta::common
