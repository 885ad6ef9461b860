// Feeds arbitrary text to the state file parser (what a restarted arbiter reads, whatever
// a crash or a disk left): it never throws, and what it keeps survives a save and a reload
// unchanged, entry for entry.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "arbiter/state/state_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> warnings;
  const quanta::arbiter::SavedState first = quanta::arbiter::parse_state(text, &warnings);
  for (const std::string& w : warnings) {
    if (w.empty()) std::abort();
  }
  warnings.clear();
  const quanta::arbiter::SavedState second =
      quanta::arbiter::parse_state(quanta::arbiter::render_state(first), &warnings);
  if (second.pods.size() != first.pods.size() || second.gpus.size() != first.gpus.size() ||
      second.registrations.size() != first.registrations.size() ||
      second.overrides.size() != first.overrides.size() || second.generation != first.generation)
    std::abort();
  return 0;
}
