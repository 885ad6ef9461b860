// The arbiter's CPU priority ([node] nice): every switch of every GPU waits for the arbiter
// to run, so under CPU load its wake-ups set the node's handoff tails.
#pragma once

#include <string>

namespace quanta::arbiter {

// Sets the nice value of the calling thread, which threads started after it inherit:
// call it before the arbiter starts any. Returns "" when set, else why not (lowering the
// value needs CAP_SYS_NICE).
std::string set_nice(int nice);

// The calling thread's nice value.
int current_nice();

}  // namespace quanta::arbiter
