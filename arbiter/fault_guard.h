// Survives a tenant truncating its pod region under the arbiter. Tenants hold the pod
// region O_RDWR (they must, to map it writable), so they can also ftruncate it; the
// arbiter's next read of that mapping would raise SIGBUS and take every tenant's gating
// down. Guarded mappings are instead replaced with zero pages on such a fault and flagged.
#pragma once

#include <cstddef>

namespace quanta::arbiter {

// Installs the SIGBUS handler (once per process).
void install_fault_guard();
// Registers / forgets a mapping that a tenant may shrink.
void guard_mapping(void* base, size_t size);
void unguard_mapping(void* base);
// True once a fault replaced this mapping's pages (the tenants' writes no longer show).
bool mapping_faulted(const void* base);

}  // namespace quanta::arbiter
