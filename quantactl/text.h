// Text for quantactl's terminal views: names tenants chose made safe to print (no raw
// control characters reach the operator's terminal), sizes, percentages and columns.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "hosted/names.h"

namespace quanta::ctl {

// Names tenants chose, escaped for the terminal (names.h).
using quanta::hosted::printable;

// hosted::printable(text) cut to `width` characters (a trailing '~' marks the cut), padded.
std::string column(std::string_view text, size_t width);

std::string bytes(uint64_t b);  // "1.5Gi", "300.0Mi", "512"
std::string percent(double v);  // "57.1%"
std::string seconds(double s);  // "850 ms", "12.3 s"

}  // namespace quanta::ctl
