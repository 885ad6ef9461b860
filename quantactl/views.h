// quantactl's contention views: `top` (a refreshing table per GPU of each pod's share,
// target, utilisation, time running/waiting/draining and who delayed it, plus what capacity
// is left) and `explain POD` (the pod's last minute in words and figures). They render the
// arbiter's `top` and `explain` answers (docs/quantactl-status.md); nothing here is live.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace quanta::ctl {

// One frame of `quantactl top`, lines cut to `width` columns.
std::string render_top(const nlohmann::json& top, size_t width);

// `quantactl explain`: the figures, then what they mean.
std::string render_explain(const nlohmann::json& explain);

// Redraws render_top every `interval_ms` until q, Ctrl-C or SIGTERM (the terminal is
// restored on the way out); `once` prints a single frame without clearing the screen.
// `fetch` asks the arbiter for `top` and throws on failure.
int run_top(const std::function<nlohmann::json()>& fetch, uint64_t interval_ms, bool once);

}  // namespace quanta::ctl
