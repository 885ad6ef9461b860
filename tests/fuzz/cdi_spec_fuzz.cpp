// Arbitrary bytes as a vendor's CDI spec (YAML when the first byte is even, else JSON), taken
// over as `cdi generate --take-over` does, and the result written and read back.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "hooks/cdi_spec.h"
#include "hooks/spec_io.h"
#include "tests/fuzz/fuzz_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace quanta::hooks;
  if (size == 0) return 0;
  const SpecFormat format = data[0] % 2 == 0 ? SpecFormat::kYaml : SpecFormat::kJson;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    const nlohmann::json vendor = parse_spec_text(text, format, "fuzz.spec");
    CdiOptions options;
    DeviceTable table;
    table.entries = {{"0", "GPU-00000000-0000-0000-0000-000000000000", 0, false}};
    const nlohmann::json spec = take_over_spec(options, vendor, table);
    const std::string again = to_text(spec, SpecFormat::kYaml);
    if (parse_spec_text(again, SpecFormat::kYaml, "again") != spec) std::abort();
  } catch (const HookError& e) {
    check_refusal(e);
  }
  return 0;
}
