// Names that tenants, runtimes and operators hand the arbiter (pod keys, container ids,
// cgroup paths, UUIDs): what is accepted at the door, and how any text that came from
// outside is shown in logs and on an operator's terminal (escaped, never raw).
#pragma once

#include <string>
#include <string_view>

namespace quanta::hosted {

// "" when `key` may name a pod: 1 to 255 bytes of letters, digits and . _ - / : @ + =
// (Kubernetes "namespace/name", "uid:<uid>", development names). Otherwise one line
// naming what is wrong and what is allowed; `what` says where the name came from.
std::string check_pod_key(std::string_view key, std::string_view what);

// "" when `text` is valid UTF-8 without control characters and at most `max_bytes`
// long (container ids and names, cgroup paths). Otherwise one error line.
std::string check_text(std::string_view text, std::string_view what, size_t max_bytes);

// Length of the UTF-8 sequence starting at s[i], or 0 when it is not a valid one
// (overlong forms, surrogates and code points past U+10FFFF included).
size_t utf8_length(std::string_view s, size_t i);

// `text` with control characters, C1 controls, bidirectional overrides and invalid UTF-8
// written as \xNN (and \ as \\), so a name can never move an operator's cursor, reorder
// a line or inject a log line. Other UTF-8 stays as it is. `escape_backslash` false is for
// a line whose values were escaped already (a message built from escaped parts): it stays
// one line without its escapes being escaped again.
std::string printable(std::string_view text, bool escape_backslash = true);

}  // namespace quanta::hosted
