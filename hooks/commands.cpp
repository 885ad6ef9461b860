// The commands behind main: loading the node config, the layout they share, writing specs,
// hooks.d files and node files, and running a hook stage under its backstop.
#include "hooks/commands.h"

#include <signal.h>
#include <syslog.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "config/node_config.h"
#include "hooks/cdi_spec.h"
#include "hooks/error.h"
#include "hooks/hooksd.h"
#include "hooks/layout.h"
#include "hooks/spec_io.h"
#include "hooks/stages.h"

namespace quanta::hooks {
namespace {

std::string absolute(const std::string& path) {
  return std::filesystem::absolute(path).lexically_normal().string();
}

// The config named, or the built-in defaults when the default path does not exist.
config::NodeConfig load(const CommonArgs& c) {
  if (!c.config_given && !std::filesystem::exists(c.config)) return config::NodeConfig{};
  try {
    return config::load_config(c.config);
  } catch (const config::ConfigError& e) {
    throw HookError(e.what());
  }
}

Layout layout_of(const CommonArgs& c, const config::NodeConfig& config) {
  Layout l;
  l.prefix = absolute(c.prefix);
  l.host_socket = c.socket.empty() ? config.tenant_socket : c.socket;
  if (l.host_socket.empty() || l.host_socket[0] != '/' || l.host_socket.back() == '/')
    throw HookError("the tenant socket " + shown(l.host_socket) +
                    " is not allowed: use an absolute path to the socket file");
  l.config = absolute(c.config);
  return l;
}

CdiOptions options_of(const CommonArgs& c, const config::NodeConfig& config) {
  CdiOptions o;
  o.layout = layout_of(c, config);
  o.hook_timeout_ns = config.hook.timeout_ns;
  return o;
}

// Every file a generator writes is named on stderr (stdout may carry the spec itself).
void wrote(const std::string& path) {
  std::fprintf(stderr, "quanta-hook: wrote %s\n", printable(path).c_str());
}

void write_node_files(const config::NodeConfig& config, const Layout& layout) {
  write_file_atomically(layout.node_conf(), node_conf_text(config, layout), 0644);
  wrote(layout.node_conf());
  write_file_atomically(layout.preload(), preload_text(), 0644);
  wrote(layout.preload());
  write_file_atomically(layout.container_conf_placeholder(), container_conf_placeholder_text(), 0644);
  wrote(layout.container_conf_placeholder());
}

void write_output(const std::string& output, const std::string& text) {
  if (output == "-") {
    std::cout << text << std::flush;
  } else {
    write_file_atomically(output, text, 0644);
    wrote(output);
  }
}

std::string folder_of(const std::string& path) {
  return std::filesystem::weakly_canonical(absolute(path)).parent_path().string();
}

// The backstop behind [hook] timeout: a stage stuck anywhere (a hung driver inside NVML)
// ends with one line instead of blocking the runtime until its own limit.
char g_timeout_line[256];
void on_alarm(int) {
  ssize_t ignored = ::write(STDERR_FILENO, g_timeout_line, std::strlen(g_timeout_line));
  (void)ignored;
  _exit(1);
}

void arm_backstop(uint64_t timeout_ns, const std::string& stage) {
  const unsigned seconds = static_cast<unsigned>((2 * timeout_ns + 999'999'999) / 1'000'000'000);
  std::snprintf(g_timeout_line, sizeof(g_timeout_line),
                "quanta-hook: %s gave up after %us (twice [hook] timeout): something it "
                "waited for (the NVIDIA driver, the arbiter) hangs\n",
                stage.c_str(), seconds);
  signal(SIGALRM, on_alarm);
  alarm(seconds);
}

}  // namespace

void check_take_over_priority(const std::string& vendor_spec, const std::string& output,
                              const std::string& dirs) {
  std::vector<std::string> list;
  for (size_t start = 0; start <= dirs.size();) {
    size_t end = dirs.find(',', start);
    if (end == std::string::npos) end = dirs.size();
    if (end > start)
      list.push_back(std::filesystem::weakly_canonical(absolute(dirs.substr(start, end - start))).string());
    start = end + 1;
  }
  const std::string from = folder_of(vendor_spec), to = folder_of(output);
  auto rank = [&list](const std::string& d) {
    for (size_t i = 0; i < list.size(); ++i)
      if (list[i] == d) return static_cast<int>(i);
    return -1;
  };
  if (from == to)
    throw HookError("--output " + output + " is in the same CDI folder as " + vendor_spec +
                    ": two specs naming the same devices in one folder conflict and CDI drops "
                    "both; write the take-over to a folder of higher priority (" + dirs + ")");
  if (rank(to) < 0)
    throw HookError("--output " + output + " is not in one of the CDI folders " + dirs +
                    " (pass --spec-dirs as the runtime is configured)");
  if (rank(from) >= 0 && rank(to) < rank(from))
    throw HookError("--output " + output + " is in a folder of lower priority than " + vendor_spec +
                    " (" + dirs + ", lowest first): the vendor's devices would win");
}

void cdi_generate(const CdiGenerateArgs& a) {
  const config::NodeConfig config = load(a.common);
  const CdiOptions options = options_of(a.common, config);
  nlohmann::json spec;
  std::string default_output = "/var/run/cdi/quanta";
  if (a.take_over.empty()) {
    spec = quanta_gpu_spec(options, load_nvml_devices());
  } else {
    const nlohmann::json vendor = read_spec_file(a.take_over);
    DeviceTable table;
    try {
      table = load_nvml_devices();
    } catch (const HookError& e) {
      std::fprintf(stderr,
                   "quanta-hook: %s; the take-over's devices named by index or GPU:INSTANCE get "
                   "no QUANTA_DEVICE_* marker (the hook reads their device nodes instead)\n",
                   e.what());
    }
    spec = take_over_spec(options, vendor, table);
    std::string kind = spec["kind"].get<std::string>();
    for (char& ch : kind) ch = ch == '/' ? '_' : ch;
    default_output += "-" + kind;
  }
  std::string output = a.output;
  const SpecFormat format = !a.format.empty()                  ? parse_format(a.format)
                            : output.empty() || output == "-" ? SpecFormat::kYaml
                                                              : format_of_path(output);
  if (output.empty()) output = default_output + (format == SpecFormat::kJson ? ".json" : ".yaml");
  if (output != "-" && format_of_path(output) != format)
    throw HookError("--format " + a.format + " does not match the extension of " + output +
                    " (CDI picks the parser by the extension)");
  if (!a.take_over.empty() && output != "-")
    check_take_over_priority(a.take_over, output, a.spec_dirs);
  if (!a.spec_only) write_node_files(config, options.layout);
  write_output(output, to_text(spec, format));
}

void hooksd_generate(const HooksdGenerateArgs& a) {
  if (a.format != "json")
    throw HookError("--format " + shown(a.format) + " is not allowed: hooks.d files are json");
  const config::NodeConfig config = load(a.common);
  const CdiOptions options = options_of(a.common, config);
  if (!a.spec_only) write_node_files(config, options.layout);
  for (const auto& [name, file] : hooksd_files(options)) {
    if (a.output == "-") {
      std::cout << file.dump() << "\n";
    } else {
      write_file_atomically(a.output + "/" + name, file.dump(2) + "\n", 0644);
      wrote(a.output + "/" + name);
    }
  }
}

void run_stage(const std::string& stage, const CommonArgs& args) {
  // Runtimes differ in what they do with a hook's stderr (runc shows it when the hook
  // fails, crun only into run.oci.hooks.stderr): every line also goes to syslog, so
  // `journalctl -t quanta-hook` on the node has them all.
  openlog("quanta-hook", LOG_PID, LOG_DAEMON);
  StageContext ctx;
  auto print_notes = [&ctx] {
    for (const std::string& n : ctx.notes) {
      const std::string line = printable(n);
      std::fprintf(stderr, "quanta-hook: %s\n", line.c_str());
      syslog(LOG_NOTICE, "%s", line.c_str());
    }
  };
  try {
    ctx.config = load(args);
    ctx.layout = layout_of(args, ctx.config);
    arm_backstop(ctx.config.hook.timeout_ns, stage);
    ctx.state = read_oci_state(STDIN_FILENO);
    if (stage == "create-runtime") create_runtime(ctx);
    if (stage == "create-container") create_container(ctx);
    if (stage == "poststop") poststop(ctx);
  } catch (const HookError& e) {
    print_notes();
    syslog(LOG_ERR, "%s: %s", stage.c_str(), e.what());
    throw;
  }
  print_notes();
}

}  // namespace quanta::hooks
