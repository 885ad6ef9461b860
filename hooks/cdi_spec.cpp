// Building the two CDI forms as JSON values; spec_io.cpp writes them as JSON or YAML.
#include "hooks/cdi_spec.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <tuple>

#include "hooks/devices.h"
#include "hooks/error.h"

namespace quanta::hooks {
namespace {

using nlohmann::json;

// Semantic-version order on "X.Y.Z".
std::tuple<int, int, int> version_parts(const std::string& v) {
  int a = 0, b = 0, c = 0;
  std::sscanf(v.c_str(), "%d.%d.%d", &a, &b, &c);
  return {a, b, c};
}

const std::string& newer(const std::string& a, const std::string& b) {
  return version_parts(a) >= version_parts(b) ? a : b;
}

json device_edits_for(const std::string& uuid_or_all) {
  return json{{"env", json::array({device_marker_name(uuid_or_all) + "=" + uuid_or_all})}};
}

// Appends the arrays of `add` to those of `into` key by key; other members of `add` are set
// when `into` has none. `where` ("" for the spec's own edits, " in device ..." for a
// device's) places `into` in the refusal when one of its members that should be a list is
// something else.
void merge_edits(json& into, const json& add, const std::string& where) {
  for (const auto& [key, value] : add.items()) {
    if (value.is_array()) {
      if (!into.contains(key) || into[key].is_null()) into[key] = json::array();
      if (!into[key].is_array())
        throw HookError("the spec to take over has containerEdits." + key + " of type " +
                        into[key].type_name() + where + ": a list is allowed");
      for (const json& item : value) into[key].push_back(item);
    } else if (!into.contains(key)) {
      into[key] = value;
    }
  }
}

// The containerEdits of a vendor spec or device ({} when absent or null); anything but an
// object is refused rather than dropped, since dropping it would lose the vendor's edits.
json vendor_edits(const json& owner, const std::string& where) {
  if (!owner.contains("containerEdits") || owner["containerEdits"].is_null()) return json::object();
  const json& edits = owner["containerEdits"];
  if (!edits.is_object())
    throw HookError(std::string("the spec to take over has containerEdits of type ") + edits.type_name() +
                    where + ": an object is allowed");
  return edits;
}

}  // namespace

int hook_timeout_seconds(uint64_t hook_timeout_ns) {
  // The runtime's own limit is a backstop behind the hook's (twice its timeout, see
  // [hook] timeout): give the hook room to say why before the runtime kills it.
  return static_cast<int>((2 * hook_timeout_ns + 999'999'999) / 1'000'000'000) + 5;
}

std::vector<HookCommand> quanta_hook_commands(const Layout& layout) {
  const std::vector<std::string> common = {"--config", layout.config, "--prefix", layout.prefix,
                                           "--socket", layout.host_socket};
  auto command = [&](const char* stage, const char* sub) {
    HookCommand c;
    c.stage = stage;
    c.args = {"quanta-hook", "oci", sub};
    c.args.insert(c.args.end(), common.begin(), common.end());
    return c;
  };
  return {command("createRuntime", "create-runtime"),
          command("createContainer", "create-container"), command("poststop", "poststop")};
}

json quanta_container_edits(const CdiOptions& options) {
  json mounts = json::array();
  for (const QuantaMount& m : quanta_mounts(options.layout)) {
    mounts.push_back({{"hostPath", m.host}, {"containerPath", m.container}, {"options", m.options}});
  }
  json hooks = json::array();
  for (const HookCommand& c : quanta_hook_commands(options.layout)) {
    json h{{"hookName", c.stage},
           {"path", options.layout.hook_binary()},
           {"args", c.args},
           {"timeout", hook_timeout_seconds(options.hook_timeout_ns)}};
    h["env"] = hook_environment();
    hooks.push_back(h);
  }
  return json{{"mounts", mounts}, {"hooks", hooks}};
}

json quanta_gpu_spec(const CdiOptions& options, const DeviceTable& table) {
  json devices = json::array();
  for (const GpuEntry& g : table.entries) {
    devices.push_back({{"name", g.name}, {"containerEdits", device_edits_for(g.uuid)}});
    devices.push_back({{"name", g.uuid}, {"containerEdits", device_edits_for(g.uuid)}});
  }
  devices.push_back({{"name", "all"}, {"containerEdits", device_edits_for("all")}});
  json spec{{"cdiVersion", "0.3.0"},
            {"kind", "quanta.dev/gpu"},
            {"devices", devices},
            {"containerEdits", quanta_container_edits(options)}};
  spec["cdiVersion"] = minimum_cdi_version(spec);
  return spec;
}

json take_over_spec(const CdiOptions& options, const json& vendor, const DeviceTable& table) {
  if (!vendor.is_object() || !vendor.contains("kind") || !vendor["kind"].is_string() ||
      !vendor.contains("devices") || !vendor["devices"].is_array() ||
      !vendor.contains("cdiVersion") || !vendor["cdiVersion"].is_string())
    throw HookError("the spec to take over is not a CDI spec (cdiVersion, kind, devices)");
  const std::string kind = vendor["kind"].get<std::string>();
  if (kind == "quanta.dev/gpu")
    throw HookError("the spec to take over is Quanta's own (kind quanta.dev/gpu)");

  json spec = vendor;  // every field the vendor wrote, unknown ones included
  json edits = vendor_edits(vendor, "");
  merge_edits(edits, quanta_container_edits(options), "");
  spec["containerEdits"] = edits;

  json devices = json::array();
  for (const json& d : vendor["devices"]) {
    if (!d.is_object() || !d.contains("name") || !d["name"].is_string())
      throw HookError("the spec to take over has a device without a name");
    json device = d;
    const std::string name = d["name"].get<std::string>();
    const std::string where = " in device " + shown(name);
    json device_edits = vendor_edits(d, where);
    if (name == "all") {
      merge_edits(device_edits, device_edits_for("all"), where);
    } else if (const GpuEntry* g = table.find(name)) {
      merge_edits(device_edits, device_edits_for(g->uuid), where);
    }
    device["containerEdits"] = device_edits;
    devices.push_back(device);
  }
  spec["devices"] = devices;
  spec["cdiVersion"] = minimum_cdi_version(spec, vendor["cdiVersion"].get<std::string>());
  return spec;
}

std::string minimum_cdi_version(const json& spec, const std::string& floor) {
  std::string v = newer(floor, "0.3.0");
  std::vector<const json*> edits;
  if (spec.contains("containerEdits")) edits.push_back(&spec["containerEdits"]);
  const json empty = json::array();
  const json& devices = spec.contains("devices") ? spec["devices"] : empty;
  for (const json& d : devices) {
    if (d.contains("containerEdits")) edits.push_back(&d["containerEdits"]);
    // 0.5.0: device names may start with something other than a letter ("0", "0:1").
    if (d.contains("name") && d["name"].is_string()) {
      const std::string& n = d["name"].get_ref<const std::string&>();
      if (!n.empty() && !std::isalpha(static_cast<unsigned char>(n[0]))) v = newer(v, "0.5.0");
    }
    if (d.contains("annotations")) v = newer(v, "0.6.0");
  }
  if (spec.contains("annotations")) v = newer(v, "0.6.0");
  if (spec.contains("kind") && spec["kind"].is_string()) {
    const std::string& kind = spec["kind"].get_ref<const std::string&>();
    const size_t slash = kind.find('/');
    if (slash != std::string::npos && kind.find('.', slash) != std::string::npos)
      v = newer(v, "0.6.0");  // dots in the class
  }
  for (const json* e : edits) {
    if (!e->is_object()) continue;
    if (e->contains("mounts"))
      for (const json& m : (*e)["mounts"])
        if (m.is_object() && m.contains("type")) v = newer(v, "0.4.0");
    if (e->contains("deviceNodes"))
      for (const json& n : (*e)["deviceNodes"])
        if (n.is_object() && n.contains("hostPath")) v = newer(v, "0.5.0");
    if (e->contains("intelRdt") || e->contains("additionalGids")) v = newer(v, "0.7.0");
  }
  return v;
}

}  // namespace quanta::hooks
