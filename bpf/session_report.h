// The two reports of `quanta-trace session`: runqlat-style text for a terminal, and one
// JSON object (the schema is in docs/tracing.md) for scripts and tests.
#pragma once

#include <iosfwd>
#include <nlohmann/json.hpp>

#include "bpf/session_view.h"

namespace quanta::bpf {

void print_report(const SessionView& view, std::ostream& out);
nlohmann::json report_json(const SessionView& view);

}  // namespace quanta::bpf
