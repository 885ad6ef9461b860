// The answers of `quantactl top` and `quantactl explain`, worked out from the node's figures
// and its view (node_view.h). Pure: admin_handlers.cpp takes the view and sends the answer.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

#include "arbiter/figures.h"
#include "arbiter/node_view.h"

namespace quanta::arbiter {

// `top`: every GPU with its live pods' shares, phases, waits and memory over the window, and
// what more the GPU and the node could take.
nlohmann::json top_answer(const NodeFigures& figures);

// `explain`: one pod, named as on every quantactl command (`wanted`), over the last `span_s`
// seconds (1-60, checked by the admin protocol) of each GPU it used: its share against its
// target, where its time went, whom it waited behind, its waits, ten-second slices and the
// pods beside it. A pod that left is told up to its departure. An unknown or ambiguous name
// is an {"ok": false, "error": ...} answer naming the pods known.
nlohmann::json explain_answer(const NodeView& node, const std::string& wanted, double span_s);

}  // namespace quanta::arbiter
