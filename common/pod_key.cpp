#include "common/pod_key.h"

#include <vector>

namespace quanta::common {

std::pair<std::string, std::string> split_pod_key(const std::string& key) {
  if (key.rfind("uid:", 0) == 0) return {"", key};
  const size_t slash = key.find('/');
  if (slash == std::string::npos) return {"default", key};
  return {key.substr(0, slash), key.substr(slash + 1)};
}

std::string resolve_pod_name(const std::set<std::string>& known, const std::string& wanted,
                             std::string* error) {
  error->clear();
  if (known.count(wanted) != 0) return wanted;
  std::vector<std::string> by_name;
  for (const std::string& k : known) {
    const auto [ns, name] = split_pod_key(k);
    if (ns + "/" + name == wanted) return k;
    if (name == wanted) by_name.push_back(k);
  }
  if (by_name.size() == 1) return by_name[0];
  if (by_name.size() > 1) {
    std::string list;
    for (const std::string& m : by_name) list += (list.empty() ? "" : ", ") + m;
    *error = "pod name " + wanted + " is ambiguous: " + list + "; name it as namespace/name";
  }
  return "";
}

}  // namespace quanta::common
