// The session as a self-contained SVG timeline for a person (no scripts, no external
// fonts or images): per GPU a row of handoffs and a row per pod process with its quanta,
// waits, drains and revokes; then every traced process's libcuda.so.1 calls.
#pragma once

#include <string>

#include "bpf/session_view.h"

namespace quanta::bpf {

// `window_s` > 0: that many seconds around the middle of the activity; 0: a window that
// holds about forty quanta of the busiest GPU (the whole session if it is shorter).
std::string svg_timeline(const SessionView& view, double window_s);

}  // namespace quanta::bpf
