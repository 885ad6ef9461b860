// Rendering of `top` and `explain`, and top's refresh loop (raw terminal input for q, the
// alternate screen, restored on every way out).
#include "quantactl/views.h"

#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <sstream>
#include <vector>

#include "quantactl/text.h"

namespace quanta::ctl {
namespace {

using nlohmann::json;

std::string fmt(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* format, ...) {
  char buf[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buf, sizeof buf, format, args);
  va_end(args);
  return buf;
}

// Lines cut to the terminal's width (they hold no control characters, and the cut counts
// bytes of ASCII columns; a pod name with wide characters may end a line early).
void add_line(std::string& out, const std::string& line, size_t width) {
  if (width != 0 && line.size() > width) {
    size_t cut = width;
    while (cut > 0 && (static_cast<unsigned char>(line[cut]) & 0xc0) == 0x80) --cut;
    out.append(line, 0, cut);
  } else {
    out += line;
  }
  out += '\n';
}

std::string top_delayer(const json& pod) {
  const json& behind = pod.value("behind", json::array());
  double total = 0;
  for (const json& b : behind) total += b.value("seconds", 0.0);
  if (behind.empty() || total <= 0) return "-";
  const json& first = behind[0];
  const std::string who = first.value("pod", "");
  return (who.empty() ? std::string("(nobody)") : hosted::printable(who)) + " " +
         fmt("%.0f%%", 100.0 * first.value("seconds", 0.0) / total);
}

volatile sig_atomic_t g_stop = 0;
volatile sig_atomic_t g_resized = 0;

void on_stop(int) {
  g_stop = 1;
}
void on_resize(int) {
  g_resized = 1;
}

size_t terminal_width() {
  winsize ws{};
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  return 0;
}

// The terminal as it was, restored by the destructor whatever ends the loop.
class RawTerminal {
 public:
  RawTerminal() {
    if (isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &saved_) == 0) {
      termios raw = saved_;
      raw.c_lflag &= static_cast<tcflag_t>(~(ICANON | ECHO));
      raw.c_cc[VMIN] = 0;
      raw.c_cc[VTIME] = 0;
      active_ = tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0;
    }
    std::fputs("\x1b[?1049h\x1b[?25l", stdout);  // alternate screen, cursor hidden
    std::fflush(stdout);
  }
  ~RawTerminal() {
    std::fputs("\x1b[?25h\x1b[?1049l", stdout);
    std::fflush(stdout);
    if (active_) tcsetattr(STDIN_FILENO, TCSANOW, &saved_);
  }

 private:
  termios saved_{};
  bool active_ = false;
};

}  // namespace

std::string render_top(const json& top, size_t width) {
  std::string out;
  add_line(out,
           fmt("quantactl top: scope %s, generation %llu, up %.0f s",
               hosted::printable(top.value("scope", "?")).c_str(),
               static_cast<unsigned long long>(top.value("generation", 0ull)),
               top.value("uptime_s", 0.0)),
           width);
  for (const json& g : top.value("gpus", json::array())) {
    add_line(out, "", width);
    const std::string holder = g.value("holder", "");
    add_line(out,
             fmt("GPU %u %s  %s  busy %s  held %s  switches %llu  waiting %u  holder %s",
                 g.value("index", 0u), hosted::printable(g.value("uuid", "?")).c_str(),
                 hosted::printable(g.value("model", "")).c_str(),
                 percent(g.value("busy_ratio", 0.0)).c_str(),
                 percent(g.value("held_ratio", 0.0)).c_str(),
                 static_cast<unsigned long long>(g.value("switches", 0ull)), g.value("waiting", 0u),
                 holder.empty() ? "none" : hosted::printable(holder).c_str()),
             width);
    std::string fits;
    for (const json& f : g.value("fits", json::array())) {
      fits += fmt("  %u x (share %s, memory %s)", f.value("pods", 0u),
                  hosted::printable(f.value("share", "")).c_str(),
                  hosted::printable(f.value("memory", "")).c_str());
    }
    add_line(out,
             fmt("  memory %s used, %s capped, %s unpromised of %s; a new batch pod would get %s; "
                 "minimums promised %s; fits:%s",
                 bytes(g.value("memory_used", 0ull)).c_str(),
                 bytes(g.value("memory_caps", 0ull)).c_str(),
                 bytes(g.value("memory_unpromised", 0ull)).c_str(),
                 bytes(g.value("memory_total", 0ull)).c_str(),
                 percent(g.value("new_pod_share", 0.0)).c_str(),
                 percent(g.value("min_share_promised", 0.0)).c_str(), fits.c_str()),
             width);
    const json& pods = g.value("pods", json::array());
    if (pods.empty()) {
      add_line(out, "  (no pods)", width);
      continue;
    }
    add_line(out, fmt("  pods, over the last %.0f s:", g.value("window_s", 0.0)), width);
    add_line(out,
             fmt("  %-24s %-11s %4s %7s %7s %7s %5s %5s %5s %5s %9s  %-30s %s", "POD", "PRIORITY",
                 "W", "TARGET", "SHARE", "UTIL", "RUN", "WAIT", "DRAIN", "IDLE", "WAIT p99",
                 "DELAYED MOSTLY BY", "MEMORY"),
             width);
    for (const json& p : pods) {
      const json& ph = p.value("phases", json::object());
      const uint64_t limit = p.value("memory_limit", 0ull);
      add_line(out,
               fmt("  %s %-11s %4u %7s %7s %7s %4.0f%% %4.0f%% %4.0f%% %4.0f%% %6.1f ms  %s %s/%s",
                   column(p.value("pod", "?"), 24).c_str(), p.value("priority", "?").c_str(),
                   p.value("weight", 0u), percent(p.value("target_share", 0.0)).c_str(),
                   percent(p.value("achieved_share", 0.0)).c_str(),
                   percent(p.value("utilization", 0.0)).c_str(), 100.0 * ph.value("running", 0.0),
                   100.0 * ph.value("waiting", 0.0), 100.0 * ph.value("draining", 0.0),
                   100.0 * ph.value("idle", 0.0), p.value("wait_p99_ms", 0.0),
                   column(top_delayer(p), 30).c_str(), bytes(p.value("memory_used", 0ull)).c_str(),
                   limit == 0 ? "-" : bytes(limit).c_str()),
               width);
    }
  }
  std::string node;
  for (const json& f : top.value("node_fits", json::array())) {
    node += fmt("  %u x (share %s, memory %s)", f.value("pods", 0u),
                hosted::printable(f.value("share", "")).c_str(),
                hosted::printable(f.value("memory", "")).c_str());
  }
  add_line(out, "", width);
  add_line(out, "node: pods that still fit:" + node, width);
  return out;
}

namespace {

// The pod the GPU's time went to while this one waited: its name, and its seconds.
struct TopHolder {
  std::string pod;
  double seconds = 0;
};

// The figures of one GPU of the pod's history that the text and its verdict both use.
struct History {
  double span = 0, target = 0, share = 0;
  double running = 0, waiting = 0, draining = 0, idle = 0;  // seconds in each phase
};

History history_of(const json& g) {
  const json& ph = g.value("phases", json::object());
  return History{g.value("span_s", 0.0),        g.value("target_share", 0.0),
                 g.value("achieved_share", 0.0), ph.value("running", 0.0),
                 ph.value("waiting", 0.0),       ph.value("draining", 0.0),
                 ph.value("idle", 0.0)};
}

// "While it waited: ... held it N s; ..." and who held the GPU longest meanwhile.
TopHolder explain_waiting(std::ostringstream& out, const json& g, double waiting) {
  const json& behind = g.value("behind", json::array());
  TopHolder top;
  if (waiting <= 0 || behind.empty()) return top;
  out << "  While it waited:";
  bool first = true;
  for (const json& b : behind) {
    const std::string who = b.value("pod", "");
    const double s = b.value("seconds", 0.0);
    if (!who.empty() && s > top.seconds) {
      top.seconds = s;
      top.pod = who;
    }
    out << (first ? " " : "; ")
        << (who.empty() ? std::string("nobody held the GPU (handoffs, its own ceiling)")
                        : hosted::printable(who) + " held it")
        << " " << seconds(s);
    first = false;
  }
  out << ".\n";
  return top;
}

// The one sentence that says what the figures mean, first match wins: too little history,
// revoke timeouts, idle, outranked, got its share, held at its ceiling, wanted less, or
// waited behind its neighbours.
std::string explain_verdict(const json& g, const History& h, const TopHolder& top) {
  const double span = h.span, target = h.target, share = h.share, waiting = h.waiting;
  const uint64_t timeouts = g.value("revoke_timeouts", 0ull);
  const double wanted = h.running + h.waiting + h.draining;
  if (span < 2) return "Too little history yet to say.";
  if (timeouts > 0) {
    return "It was passed over " + std::to_string(timeouts) +
           " time(s) for not releasing the GPU within revoke_timeout after a revoke: a "
           "stopped or hung "
           "process, not contention.";
  }
  if (wanted < 0.1 * span) return "It was idle most of the time: contention did not slow it.";
  if (target <= 0.001 && waiting > 0.5 * span) {
    return "It was outranked: pods of a higher priority class wanted the GPU, and a pod of its "
           "class gets "
           "nothing while they do.";
  }
  if (share + 0.02 >= target || share >= 0.9 * target) {
    return waiting < 0.05 * span
               ? "It got its share and barely waited."
               : "It got its share. Its waits were its neighbours' turns" +
                     (top.pod.empty() ? std::string(".")
                                      : ", mostly " + hosted::printable(top.pod) + "'s.");
  }
  if (g.value("max_share", 1.0) < 1.0 && share + 0.02 >= g.value("max_share", 1.0))
    return "It was held at its own max-share ceiling, not by its neighbours.";
  if (waiting < 0.2 * span) {
    return "It got less than its target because it wanted the GPU less: it was idle " +
           percent(span > 0 ? h.idle / span : 0) + " of the time.";
  }
  return "It got less than its target (" + percent(share) + " of " + percent(target) +
         "): it waited " + seconds(waiting) +
         (top.pod.empty() ? std::string(".")
                          : ", most of it while " + hosted::printable(top.pod) +
                                " held the GPU (" + seconds(top.seconds) + ").");
}

// The table of the history's slices, newest last, when it has any.
void explain_slices(std::ostringstream& out, const json& g) {
  const json& slices = g.value("slices", json::array());
  if (slices.empty()) return;
  out << "\n  "
      << fmt("%-13s %7s %7s %9s  %s", "SECONDS AGO", "SHARE", "TARGET", "WAITING",
             "DELAYED MOSTLY BY")
      << "\n";
  for (const json& s : slices) {
    const json& b = s.value("behind", json());
    out << "  "
        << fmt("%-13s %7s %7s %9s  %s",
               fmt("%.0f-%.0f", -s.value("from_s", 0.0), -s.value("to_s", 0.0)).c_str(),
               percent(s.value("share", 0.0)).c_str(), percent(s.value("target", 0.0)).c_str(),
               seconds(s.value("waiting_s", 0.0)).c_str(),
               b.is_string() ? (b.get<std::string>().empty()
                                    ? "(nobody)"
                                    : hosted::printable(b.get<std::string>()).c_str())
                             : "-")
        << "\n";
  }
}

// One GPU of the pod's history: its share against its target and neighbours, where its
// time went, its waits and memory, what that means, and the slices.
void explain_gpu(std::ostringstream& out, const std::string& pod, const json& g) {
  const History h = history_of(g);
  const double span = h.span, target = h.target, share = h.share;
  out << "Pod " << pod << " on GPU " << g.value("index", 0u) << " ("
      << hosted::printable(g.value("uuid", "?")) << "), the last " << fmt("%.0f", span) << " s"
      << (g.value("live", true) ? "" : " (it has left the GPU)") << ":\n";
  std::string neighbours;
  for (const json& n : g.value("neighbours", json::array())) {
    neighbours += (neighbours.empty() ? "" : ", ") + hosted::printable(n.value("pod", "?")) +
                  " (weight " + std::to_string(n.value("weight", 0u)) + ", " +
                  n.value("priority", "?") + ", " + percent(n.value("achieved_share", 0.0)) + ")";
  }
  out << "  It held the GPU " << percent(share) << " of the time; its target was "
      << percent(target) << " (weight " << g.value("weight", 0u) << ", "
      << g.value("priority", "?");
  if (g.value("min_share", 0.0) > 0.0) out << ", min-share " << percent(g.value("min_share", 0.0));
  if (g.value("max_share", 1.0) < 1.0) out << ", max-share " << percent(g.value("max_share", 1.0));
  out << ")" << (neighbours.empty() ? ", alone on the GPU" : ", beside " + neighbours) << ".\n";
  out << "  The GPU was busy with its work " << percent(g.value("utilization", 0.0))
      << " of the time ("
      << (g.value("utilization_source", "") == std::string("driver")
              ? "NVML's per-process figure"
              : "its holds; NVML has no per-process figure here")
      << ").\n";
  out << "  It ran " << seconds(h.running) << ", waited " << seconds(h.waiting) << ", drained "
      << seconds(h.draining) << " and was idle " << seconds(h.idle) << ".\n";
  const TopHolder top = explain_waiting(out, g, h.waiting);
  const json& w = g.value("waits", json::object());
  if (w.value("count", 0u) > 0) {
    out << "  " << w.value("count", 0u) << " waits for a grant: median "
        << fmt("%.1f", w.value("median_ms", 0.0)) << " ms, p99 "
        << fmt("%.1f", w.value("p99_ms", 0.0)) << " ms, longest "
        << fmt("%.1f", w.value("max_ms", 0.0)) << " ms.\n";
  }
  const uint64_t limit = g.value("memory_limit", 0ull);
  out << "  Memory: " << bytes(g.value("memory_used", 0ull))
      << (limit ? " of a " + bytes(limit) + " cap" : " (no cap)");
  if (g.value("alloc_denied", 0ull) > 0)
    out << "; " << g.value("alloc_denied", 0ull) << " allocation(s) refused at the cap";
  out << ".\n";
  out << "  In short: " << explain_verdict(g, h, top) << "\n";
  explain_slices(out, g);
  out << "\n";
}

}  // namespace

std::string render_explain(const json& e) {
  std::ostringstream out;
  const std::string pod = hosted::printable(e.value("pod", "?"));
  const json& gpus = e.value("gpus", json::array());
  if (gpus.empty()) out << "Pod " << pod << " has no history on any GPU.\n";
  for (const json& g : gpus) explain_gpu(out, pod, g);
  return out.str();
}

int run_top(const std::function<json()>& fetch, uint64_t interval_ms, bool once) {
  if (once) {
    std::fputs(render_top(fetch(), 0).c_str(), stdout);
    return 0;
  }
  struct sigaction stop {};
  stop.sa_handler = on_stop;
  sigaction(SIGINT, &stop, nullptr);
  sigaction(SIGTERM, &stop, nullptr);
  sigaction(SIGHUP, &stop, nullptr);
  if (!isatty(STDOUT_FILENO)) {
    // A pipe or a file: frames one after another, no screen control, no raw keyboard.
    signal(SIGPIPE, SIG_DFL);
    while (!g_stop) {
      std::string frame;
      try {
        frame = render_top(fetch(), 0);
      } catch (const std::exception& e) {
        frame = "quantactl top: " + hosted::printable(e.what()) + " (retrying)\n";
      }
      std::fputs((frame + "\n").c_str(), stdout);
      std::fflush(stdout);
      if (ferror(stdout)) break;
      poll(nullptr, 0, static_cast<int>(interval_ms));
    }
    return 0;
  }
  struct sigaction resize {};
  resize.sa_handler = on_resize;
  sigaction(SIGWINCH, &resize, nullptr);
  RawTerminal terminal;
  bool stdin_open = true;
  while (!g_stop) {
    std::string frame;
    try {
      frame = render_top(fetch(), terminal_width());
    } catch (const std::exception& e) {
      frame = "quantactl top: " + hosted::printable(e.what()) + " (retrying)\n";
    }
    frame += "\n(q quits; refreshed every " + std::to_string(interval_ms) + " ms)\n";
    std::fputs("\x1b[H\x1b[2J", stdout);
    std::fputs(frame.c_str(), stdout);
    std::fflush(stdout);
    // Wait for the next refresh, a key, a resize or a signal.
    pollfd in{stdin_open ? STDIN_FILENO : -1, POLLIN, 0};
    const int ready = poll(&in, 1, static_cast<int>(interval_ms));
    if (ready > 0 && (in.revents & (POLLIN | POLLHUP))) {
      char keys[16];
      const ssize_t n = ::read(STDIN_FILENO, keys, sizeof keys);
      if (n == 0) stdin_open = false;  // input closed: refresh on the timer alone
      for (ssize_t k = 0; k < n; ++k) {
        if (keys[k] == 'q' || keys[k] == 'Q' || keys[k] == 3) g_stop = 1;
      }
    }
    g_resized = 0;
  }
  return 0;
}

}  // namespace quanta::ctl
