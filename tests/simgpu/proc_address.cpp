// cuGetProcAddress's table, built from proc_table.def. This file does not include
// cuda.h: every exported symbol is declared here only to take its address, so the
// pointer handed out is the very address of that variant's export.
#include "tests/simgpu/proc_address.h"

#include <cstring>

#define SIMGPU_PROC(name, version, symbol, kind) void symbol();
extern "C" {
#include "tests/simgpu/proc_table.def"
}
#undef SIMGPU_PROC

namespace quanta::simgpu {
namespace {

enum StreamKind : uint8_t { PLAIN, PER_THREAD };

struct ProcEntry {
  const char* name;
  int version;
  void (*fn)();
  const char* symbol;
  StreamKind kind;
};

#define SIMGPU_PROC(name, version, symbol, kind) {#name, version, &symbol, #symbol, kind},
constexpr ProcEntry kProcTable[] = {
#include "tests/simgpu/proc_table.def"
};
#undef SIMGPU_PROC

}  // namespace

ProcLookup lookup_proc(const char* name, int cuda_version, bool per_thread, void** fn,
                       const char** symbol) {
  const ProcEntry* plain = nullptr;
  const ProcEntry* threaded = nullptr;
  bool known = false;
  for (const ProcEntry& e : kProcTable) {
    if (std::strcmp(e.name, name) != 0) continue;
    known = true;
    if (e.version > cuda_version) continue;
    const ProcEntry*& best = e.kind == PLAIN ? plain : threaded;
    if (best == nullptr || e.version >= best->version) best = &e;
  }
  const ProcEntry* chosen = plain;
  // The per-thread variant wins unless a newer plain version superseded it.
  if (per_thread && threaded != nullptr &&
      (plain == nullptr || threaded->version >= plain->version))
    chosen = threaded;
  if (chosen == nullptr) {
    *fn = nullptr;
    return known ? ProcLookup::VersionNotSufficient : ProcLookup::SymbolNotFound;
  }
  *fn = reinterpret_cast<void*>(chosen->fn);
  if (symbol != nullptr) *symbol = chosen->symbol;
  return ProcLookup::Found;
}

}  // namespace quanta::simgpu
