// `drain` and `undrain` on the admin socket (quantactl drain GPU): hold new grants back on
// one GPU or MIG instance so it can be re-partitioned, and say when it is idle. The set of
// drained UUIDs is kept in <state_dir>/<scope>.drained so a restarted arbiter (a rolling
// upgrade mid-drain) keeps them drained.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "arbiter/serving/admin_service.h"

namespace quanta::arbiter {
namespace {

using nlohmann::json;

std::string drained_file(const config::NodeConfig& config) {
  return config.state_dir + "/" + config.scope + ".drained";
}

}  // namespace

std::set<std::string> load_drained(const config::NodeConfig& config) {
  std::set<std::string> uuids;
  std::ifstream in(drained_file(config));
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) uuids.insert(line);
  }
  return uuids;
}

void AdminService::save_drained() const {
  const std::string path = drained_file(config_);
  const std::string tmp = path + ".tmp";
  std::error_code ec;
  {
    std::ofstream out(tmp);
    for (const auto& gpu : gpus_) {
      if (gpu->sched->drain_requested()) out << gpu->uuid << "\n";
    }
    if (!out) {
      spdlog::warn("cannot write {}: the drain will not survive an arbiter restart", tmp);
      return;
    }
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) spdlog::warn("cannot replace {}: {}", path, ec.message());
}

json AdminService::drain(const AdminRequest& request, bool on) {
  const std::string cmd = on ? "drain" : "undrain";
  const std::string& wanted = request.gpu;
  const Gpu* gpu = nullptr;
  const bool index = !wanted.empty() && std::all_of(wanted.begin(), wanted.end(), [](char c) {
    return std::isdigit(static_cast<unsigned char>(c)) != 0;
  });
  for (const auto& g : gpus_) {
    if (index ? wanted == std::to_string(g->index) : wanted == g->uuid) gpu = g.get();
  }
  if (gpu == nullptr) {
    std::string list;
    for (const auto& g : gpus_) {
      list += (list.empty() ? "" : ", ") + std::to_string(g->index) + " " + g->uuid;
    }
    return json{{"ok", false},
                {"error", cmd + " needs \"gpu\": the index or UUID of a managed GPU (got \"" +
                              wanted + "\"); managed: " + list}};
  }
  if (gpu->sched->drain_requested() != on) {
    control_.set_draining(gpu->index, on);  // the holder is revoked (or a waiter granted) now
    save_drained();
    if (on) {
      spdlog::info("GPU {} {} draining: no new grants until undrain", gpu->index, gpu->uuid);
    } else {
      spdlog::info("GPU {} {} undrained: grants resume", gpu->index, gpu->uuid);
    }
  }
  return json{{"ok", true},
              {"gpu", gpu->index},
              {"uuid", gpu->uuid},
              {"draining", gpu->sched->drain_requested()},
              {"idle", gpu->sched->idle()},
              {"tenants", gpu->slot_pids.size()}};
}

}  // namespace quanta::arbiter
