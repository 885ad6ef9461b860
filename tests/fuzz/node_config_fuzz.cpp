// Feeds arbitrary text to the node config parser: it either returns a config or throws
// config::ConfigError with one line naming file:line:column; nothing else may escape, and an
// accepted config keeps its invariants.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "config/node_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    quanta::config::NodeConfig c = quanta::config::parse_config(text, "fuzz.toml");
    const auto& s = c.scheduler;
    if (s.quantum_min_ns > s.quantum_ns || s.quantum_ns > s.quantum_max_ns) std::abort();
    if (s.lease_ns < 4'000'000) std::abort();
    if (c.scope.empty() || c.scope.size() > 32) std::abort();
  } catch (const quanta::config::ConfigError& e) {
    const std::string what = e.what();
    if (what.empty() || what.find('\n') != std::string::npos) std::abort();
  }
  return 0;
}
