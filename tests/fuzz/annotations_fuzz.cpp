// Arbitrary annotations (KEY=VALUE lines): every quanta.dev/* one validated by the node
// config's parser or refused in one line naming it.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "hooks/annotations.h"
#include "tests/fuzz/fuzz_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace quanta::hooks;
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::map<std::string, std::string> annotations;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(start, end - start);
    const size_t eq = line.find('=');
    if (eq != std::string::npos) annotations[line.substr(0, eq)] = line.substr(eq + 1);
    start = end + 1;
  }
  try {
    const PodPolicy p = validate_annotations(annotations, quanta::common::Policy{});
    if (p.resolved.weight < quanta::common::kMinWeight || p.resolved.weight > quanta::common::kMaxWeight) std::abort();
    if (p.resolved.max_share_ppm == 0 || p.resolved.max_share_ppm > quanta::common::kShareScale) std::abort();
  } catch (const HookError& e) {
    check_refusal(e);
    if (std::string(e.what()).find("annotation ") != 0) std::abort();  // it names the annotation
  }
  return 0;
}
