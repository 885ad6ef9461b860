// quanta-arbiter's entry point: command line, config, logging; everything else is
// Arbiter's. Errors reach here as exceptions and end the process with one clear line.
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>

#include "arbiter/arbiter.h"
#include "arbiter/config.h"

int main(int argc, char** argv) {
  CLI::App app{
      "quanta-arbiter: hands out GPU time quanta and memory caps to the pods on this node"};
  std::string config_path;
  bool foreground = false;
  std::string level = "info";
  app.add_option(
      "--config", config_path,
      "node config (default /etc/quanta/quanta.toml, else the source tree's config/quanta.toml)");
  app.add_flag("--foreground", foreground,
               "stay attached and log to stderr (otherwise detach and log to "
               "<state_dir>/quanta-arbiter.log)");
  app.add_option("--log-level", level, "trace, debug, info, warn or error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  CLI11_PARSE(app, argc, argv);

  try {
    if (config_path.empty()) {
      config_path = std::filesystem::exists("/etc/quanta/quanta.toml") ? "/etc/quanta/quanta.toml"
                                                                       : QUANTA_SOURCE_CONFIG;
    }
    quanta::arbiter::NodeConfig config = quanta::arbiter::load_config(config_path);
    spdlog::set_default_logger(spdlog::stderr_color_mt("quanta-arbiter-stderr"));
    spdlog::set_level(spdlog::level::from_str(level));
    spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
    // Every tenant costs a connection, a doorbell and a pidfd: take all the descriptors allowed.
    rlimit files{};
    if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
      files.rlim_cur = files.rlim_max;
      setrlimit(RLIMIT_NOFILE, &files);
    }
    if (!foreground) {
      // Detach before the Arbiter exists: its signalfd's epoll registration belongs to the
      // process that made it, so a child forked afterwards would never see SIGTERM.
      std::filesystem::create_directories(config.state_dir);
      const std::string log_path = config.state_dir + "/quanta-arbiter.log";
      auto file = spdlog::basic_logger_mt("quanta-arbiter", log_path);
      file->set_level(spdlog::level::from_str(level));
      spdlog::set_default_logger(file);
      spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %l %v");
      spdlog::flush_on(spdlog::level::info);
      std::fprintf(stderr, "quanta-arbiter: detaching; log in %s\n", log_path.c_str());
      if (daemon(0, 0) != 0) throw std::runtime_error("cannot detach (daemon failed)");
    }
    quanta::arbiter::Arbiter arbiter(config);
    arbiter.run();
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());  // reaches the log file once detached
    std::fprintf(stderr, "quanta-arbiter: %s\n", e.what());
    return 1;
  }
  return 0;
}
