// The name -> variant lookup behind cuGetProcAddress, kept free of cuda.h so the table's
// symbols can be declared by name (see proc_table.def).
#pragma once

#include <cstdint>

namespace quanta::simgpu {

enum class ProcLookup { Found, SymbolNotFound, VersionNotSufficient };

// Picks the export for `name` as the driver would for `cuda_version`: the newest entry at
// or below that version; with `per_thread`, its _ptds/_ptsz variant when one exists.
ProcLookup lookup_proc(const char* name, int cuda_version, bool per_thread, void** fn,
                       const char** symbol = nullptr);

}  // namespace quanta::simgpu
