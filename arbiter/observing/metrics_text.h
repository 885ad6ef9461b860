// The Prometheus text exposition of a NodeFigures snapshot: every metric in
// docs/metrics.md, with DCGM-style labels, base units and escaped label values.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "arbiter/observing/figures.h"

namespace quanta::arbiter {

// Text format 0.0.4 (`Content-Type: text/plain; version=0.0.4`), every family of the
// catalogue in its order, a family's series together.
std::string render_prometheus(const NodeFigures& figures);

// The catalogue's family names, in the order render_prometheus writes them.
std::vector<std::string> metric_families();

// A label value as the text format wants it: backslash, double quote and newline escaped;
// bytes that are not valid UTF-8, and other control characters, become U+FFFD.
std::string escape_label_value(std::string_view value);

}  // namespace quanta::arbiter
