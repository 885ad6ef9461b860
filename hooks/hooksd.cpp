// hooks.d 1.0.0 documents: {version, hook {path, args, env, timeout}, when, stages}.
#include "hooks/hooksd.h"

namespace quanta::hooks {

std::vector<std::pair<std::string, nlohmann::json>> hooksd_files(const CdiOptions& options) {
  std::vector<std::pair<std::string, nlohmann::json>> files;
  for (const HookCommand& c : quanta_hook_commands(options.layout)) {
    nlohmann::json hook{{"path", options.layout.hook_binary()},
                        {"args", c.args},
                        {"timeout", hook_timeout_seconds(options.hook_timeout_ns)}};
    hook["env"] = hook_environment();
    std::string name = "quanta-";
    for (char ch : c.stage) {
      if (ch >= 'A' && ch <= 'Z') {
        name += '-';
        name += static_cast<char>(ch - 'A' + 'a');
      } else {
        name += ch;
      }
    }
    files.emplace_back(name + ".json",
                       nlohmann::json{{"version", "1.0.0"},
                                      {"hook", hook},
                                      {"when", {{"annotations", {{"^quanta\\.dev/", ".*"}}}}},
                                      {"stages", nlohmann::json::array({c.stage})}});
  }
  return files;
}

}  // namespace quanta::hooks
