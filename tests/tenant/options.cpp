// Parses quanta-tenant's command line with CLI11 and turns every rejection into one line
// that names the option, the value given and what is allowed.
#include "tests/tenant/options.h"

#include <CLI/CLI.hpp>
#include <array>
#include <charconv>
#include <cmath>
#include <limits>
#include <map>
#include <utility>

namespace quanta::tenant {
namespace {

template <typename Enum>
using Names = std::vector<std::pair<std::string, Enum>>;

const Names<Lookup> kLookups = {{"direct", Lookup::direct},
                                {"dlsym", Lookup::dlsym},
                                {"getproc", Lookup::getproc},
                                {"getproc-ptds", Lookup::getproc_ptds}};
const Names<ContextKind> kContexts = {{"primary", ContextKind::primary}, {"own", ContextKind::own}};
const Names<StreamKind> kStreams = {{"created", StreamKind::created}, {"null", StreamKind::null}};
const Names<SchedKind> kScheds = {{"auto", SchedKind::automatic},
                                  {"spin", SchedKind::spin},
                                  {"yield", SchedKind::yield},
                                  {"blocking", SchedKind::blocking}};
const Names<AllocFamily> kFamilies = {{"alloc", AllocFamily::alloc},
                                      {"pitch", AllocFamily::pitch},
                                      {"managed", AllocFamily::managed},
                                      {"host", AllocFamily::host},
                                      {"vmm", AllocFamily::vmm},
                                      {"async", AllocFamily::async},
                                      {"pool", AllocFamily::pool},
                                      {"array", AllocFamily::array},
                                      {"array3d", AllocFamily::array3d},
                                      {"mipmapped", AllocFamily::mipmapped},
                                      {"graph-node", AllocFamily::graph_node}};

template <typename Enum>
std::string joined(const Names<Enum>& names) {
  std::string out;
  for (const auto& [name, value] : names) {
    out += (out.empty() ? "" : ", ") + name;
  }
  return out;
}

template <typename Enum>
std::string name_of(const Names<Enum>& names, Enum value) {
  for (const auto& [name, candidate] : names) {
    if (candidate == value) return name;
  }
  return "?";
}

// A rejected value: thrown from parse callbacks so the message stays ours, not CLI11's.
struct BadValue {
  std::string message;
};

template <typename Enum>
void add_choice(CLI::App& app, const std::string& flag, Enum& target, const Names<Enum>& names,
                const std::string& what) {
  app.add_option_function<std::string>(
         flag,
         [&target, &names, flag](const std::string& text) {
           for (const auto& [name, value] : names) {
             if (name == text) {
               target = value;
               return;
             }
           }
           throw BadValue{flag + ": '" + text + "' is not one of: " + joined(names)};
         },
         what + " (" + joined(names) + "; default " + name_of(names, target) + ")")
      ->type_name("NAME");
}

template <typename Number>
void add_number(CLI::App& app, const std::string& flag, Number& target, Number low, Number high,
                const std::string& what) {
  app.add_option_function<std::string>(
         flag,
         [&target, flag, low, high](const std::string& text) {
           Number value{};
           const char* end = text.data() + text.size();
           auto [stop, error] = std::from_chars(text.data(), end, value);
           bool fits = error == std::errc() && stop == end;
           if constexpr (std::is_floating_point_v<Number>) fits = fits && std::isfinite(value);
           if (!fits || value < low || value > high) {
             throw BadValue{flag + ": '" + text + "' is not a number from " +
                            CLI::detail::to_string(low) + " to " + CLI::detail::to_string(high)};
           }
           target = value;
         },
         what + " (" + CLI::detail::to_string(low) + " to " + CLI::detail::to_string(high) +
             "; default " + CLI::detail::to_string(target) + ")")
      ->type_name("N");
}

}  // namespace

std::optional<std::uint64_t> parse_bytes(const std::string& text) {
  std::uint64_t number = 0;
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  auto [stop, error] = std::from_chars(begin, end, number);
  if (error != std::errc() || stop == begin) return std::nullopt;
  static const std::map<std::string, std::uint64_t> kUnits = {{"", 1},
                                                              {"B", 1},
                                                              {"K", 1000},
                                                              {"M", 1000 * 1000},
                                                              {"G", 1000ull * 1000 * 1000},
                                                              {"T", 1000ull * 1000 * 1000 * 1000},
                                                              {"Ki", 1ull << 10},
                                                              {"Mi", 1ull << 20},
                                                              {"Gi", 1ull << 30},
                                                              {"Ti", 1ull << 40}};
  auto unit = kUnits.find(std::string(stop, end));
  if (unit == kUnits.end()) return std::nullopt;
  if (number > std::numeric_limits<std::uint64_t>::max() / unit->second) return std::nullopt;
  return number * unit->second;
}

std::string mode_name(Mode mode) {
  switch (mode) {
    case Mode::batch:
      return "batch";
    case Mode::requests:
      return "requests";
    case Mode::alloc:
      return "alloc";
    case Mode::info:
      return "info";
  }
  return "?";
}
std::string family_name(AllocFamily family) {
  return name_of(kFamilies, family);
}
std::string context_name(ContextKind kind) {
  return name_of(kContexts, kind);
}
std::string stream_name(StreamKind kind) {
  return name_of(kStreams, kind);
}
std::string sched_name(SchedKind kind) {
  return name_of(kScheds, kind);
}

ParseResult parse_options(int argc, char** argv) {
  Options options;
  CLI::App app{
      "quanta-tenant: a GPU workload (closed-loop batch, open-loop requests, allocation patterns, "
      "device info) for Quanta's tests, demo and benchmarks; runs on simgpu and on a real GPU"};
  app.require_subcommand(1);

  add_number(app, "--device", options.device, 0, 1023, "CUDA device index");
  app.add_flag("--json", options.json, "print one JSON object on stdout");
  app.add_option("--pod", options.pod, "pod name, exported as QUANTA_POD")->type_name("NAME");
  app.add_option("--label", options.label, "free text echoed in the report")->type_name("TEXT");
  app.add_option_function<std::string>(
         "--start-at",
         [&options](const std::string& text) {
           std::int64_t value = 0;
           auto [stop, error] = std::from_chars(text.data(), text.data() + text.size(), value);
           if (error != std::errc() || stop != text.data() + text.size() || value < 0) {
             throw BadValue{"--start-at: '" + text +
                            "' is not a CLOCK_REALTIME time in whole nanoseconds (>= 0)"};
           }
           options.start_at_ns = value;
         },
         "start the workload at this CLOCK_REALTIME time (ns since the epoch)")
      ->type_name("NS");
  add_choice(app, "--context", options.context, kContexts, "context");
  add_choice(app, "--stream", options.stream, kStreams, "stream for kernels");
  add_choice(app, "--sched", options.sched, kScheds, "how synchronize calls wait (context flag)");
  add_choice(app, "--lookup", options.lookup, kLookups, "how driver entry points are found");
  add_number(app, "--cuda-version", options.cuda_version, 12000, 99999,
             "CUDA version given to cuGetProcAddress");

  auto* batch =
      app.add_subcommand("batch", "closed loop: keep --depth spin kernels in flight for --seconds");
  auto* requests = app.add_subcommand(
      "requests", "open loop: --rate requests per second, each a kernel and a sync");
  auto* alloc =
      app.add_subcommand("alloc", "allocation pattern of one family; counts successes and denials");
  auto* info = app.add_subcommand("info", "devices, UUIDs and memory as CUDA and NVML report them");
  for (auto* mode : {batch, requests}) {
    add_number(*mode, "--seconds", options.seconds, 0.001, 86400.0, "duration in seconds");
    add_number(*mode, "--kernel-ms", options.kernel_ms, 0.001, 60000.0,
               "length of each spin kernel in ms");
    add_number(*mode, "--warmup", options.warmup, 0, 1000, "untimed 1 us kernels before the start");
  }
  add_number(*batch, "--depth", options.depth, 1, 1024, "kernels in flight at most");
  add_number(*batch, "--think-ms", options.think_ms, 0.0, 60000.0,
             "host work in ms after each completion before the next launch (a training step's "
             "CPU part)");
  batch->add_flag("--launch-times", options.launch_times,
                  "report when each kernel was launched (launch_mono_ns, CLOCK_MONOTONIC)");
  add_number(*requests, "--rate", options.rate, 0.01, 100000.0, "requests per second");
  add_choice(*alloc, "--family", options.family, kFamilies, "allocation family");
  alloc
      ->add_option_function<std::string>(
          "--bytes",
          [&options](const std::string& text) {
            auto bytes = parse_bytes(text);
            if (!bytes || *bytes == 0) {
              throw BadValue{"--bytes: '" + text +
                             "' is not a size: use a positive whole number with an optional suffix "
                             "B, K, M, G, T, Ki, Mi, Gi or Ti"};
            }
            options.bytes = *bytes;
          },
          "bytes per allocation (suffixes K M G T, Ki Mi Gi Ti; default 64Mi)")
      ->type_name("SIZE");
  alloc
      ->add_option_function<std::string>(
          "--count",
          [&options](const std::string& text) {
            std::uint64_t value = 0;
            auto [stop, error] = std::from_chars(text.data(), text.data() + text.size(), value);
            if (error != std::errc() || stop != text.data() + text.size() || value == 0) {
              throw BadValue{"--count: '" + text + "' is not a whole number >= 1"};
            }
            options.count = value;
          },
          "allocations to make (default 1; with --race, until the first denial)")
      ->type_name("N");
  add_number(*alloc, "--hold-ms", options.hold_ms, 0.0, 86400000.0, "hold time in ms");
  alloc->add_flag("--free", options.free_each,
                  "free each allocation (after --hold-ms) before the next");
  alloc->add_flag("--race", options.race, "allocate until the first denial, then report");

  // Common options are accepted after the subcommand too.
  for (auto* mode : {batch, requests, alloc, info}) mode->fallthrough();

  ParseResult result;
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    result.message = app.help();
    return result;
  } catch (const CLI::CallForAllHelp&) {
    result.message = app.help("", CLI::AppFormatMode::All);
    return result;
  } catch (const CLI::ParseError& error) {
    result.exit_code = 2;
    result.message = error.what();
    if (dynamic_cast<const CLI::ExtrasError*>(&error) != nullptr) {
      result.message += " (see --help for each mode's options)";
    }
    if (dynamic_cast<const CLI::RequiredError*>(&error) != nullptr &&
        app.get_subcommands().empty()) {
      result.message = "a mode is required: batch, requests, alloc or info (see --help)";
      // A word where the mode belongs is most likely a misspelt mode.
      for (const std::string& word : app.remaining()) {
        if (!word.empty() && word[0] != '-') {
          result.message =
              "'" + word + "' is not a mode: use batch, requests, alloc or info (see --help)";
          break;
        }
      }
    }
    return result;
  } catch (const BadValue& bad) {
    result.exit_code = 2;
    result.message = bad.message;
    return result;
  }
  if (batch->parsed()) options.mode = Mode::batch;
  if (requests->parsed()) options.mode = Mode::requests;
  if (alloc->parsed()) options.mode = Mode::alloc;
  if (info->parsed()) options.mode = Mode::info;
  if (options.free_each && options.race) {
    result.exit_code = 2;
    result.message =
        "--race and --free: choose one (--race holds every allocation until the first denial)";
    return result;
  }
  if (options.race && options.family == AllocFamily::host && !options.count) {
    result.exit_code = 2;
    result.message =
        "--race with --family host needs --count: pinned host memory has no device limit to race "
        "to";
    return result;
  }
  result.options = options;
  return result;
}

}  // namespace quanta::tenant
