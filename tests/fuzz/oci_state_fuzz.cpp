// Arbitrary bytes as the OCI state on a hook's stdin: a parsed state or a one-line refusal.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "hooks/json_fields.h"
#include "hooks/oci_state.h"
#include "tests/fuzz/fuzz_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace quanta::hooks;
  try {
    const OciState s = parse_oci_state(std::string_view(reinterpret_cast<const char*>(data), size));
    if (s.id.empty() || s.bundle.empty() || s.bundle[0] != '/' || s.pid < 0) std::abort();
    check_container_id(s.id);  // what parsing accepted, the id check accepts too
  } catch (const HookError& e) {
    check_refusal(e);
  }
  return 0;
}
