// Feeds arbitrary lines to the admin request parser (what a root client sends) and the
// names a request carries to the door's checks: nothing throws, a refusal always says
// something, and escaped text never carries a control character.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "arbiter/serving/admin_protocol.h"
#include "hosted/names.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string line(reinterpret_cast<const char*>(data), size);
  quanta::arbiter::AdminRequest request;
  const std::string err = quanta::arbiter::parse_admin_request(line, &request);
  if (err.empty() && request.command == quanta::arbiter::AdminRequest::Command::kRegister) {
    (void)quanta::hosted::check_pod_key(request.registration.pod_key(), "pod key");
  }
  (void)quanta::hosted::check_pod_key(line, "pod");
  (void)quanta::hosted::check_text(line, "text", 4096);
  for (const std::string& shown :
       {quanta::hosted::printable(line), quanta::hosted::printable(err)}) {
    for (unsigned char c : shown) {
      if (c < 0x20 || c == 0x7f) std::abort();
    }
  }
  return 0;
}
