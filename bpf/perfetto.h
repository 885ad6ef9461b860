// The session as a Chrome/Perfetto trace (JSON, opened at ui.perfetto.dev or
// chrome://tracing): a track per GPU with a "switches" row and a row per pod process
// showing each quantum (with its handoff and drain), its waits and revokes, plus a track
// of libcuda.so.1 calls (launch to completion, sync waits) for every traced process.
#pragma once

#include <nlohmann/json.hpp>

#include "bpf/session_view.h"

namespace quanta::bpf {

nlohmann::json perfetto_trace(const SessionView& view);

// Processes' rows of non-overlapping spans: a span goes into the first lane where it
// starts after the lane's last end (kernels of a pipelined process overlap).
std::vector<int> assign_lanes(const std::vector<std::pair<uint64_t, uint64_t>>& spans);

// Waits with the holds cut out: a wait ends where its grant begins a quantum.
std::vector<std::pair<uint64_t, uint64_t>> subtract(std::vector<std::pair<uint64_t, uint64_t>> from,
                                                    std::vector<std::pair<uint64_t, uint64_t>> cut);

}  // namespace quanta::bpf
