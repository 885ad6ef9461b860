// The physical floor of a handoff: one process-shared futex wake between two processes
// (common/futex.h, the call the shim and arbiter use), measured from the store before
// FUTEX_WAKE to the waiter running again.
#pragma once

#include <string>
#include <vector>

namespace quanta::bench {

// Wake latencies in microseconds of `rounds` one-hop wakes; throws on fork/mmap failure.
std::vector<double> measure_futex_wakes(int rounds);

}  // namespace quanta::bench
