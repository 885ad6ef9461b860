// SVG drawing of a session: rows of rectangles on one time axis. Spans outside the window
// are left out and the rest clipped to it, so a long session stays a small file.
#include "bpf/svg_timeline.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <vector>

#include "bpf/perfetto.h"

namespace quanta::bpf {
namespace {

constexpr double kWidth = 1280;
constexpr double kLeft = 250;  // row labels
constexpr double kRight = 24;
constexpr double kRowHeight = 22;
constexpr double kBarHeight = 14;
constexpr const char* kHandoffColor = "#d62728";
constexpr const char* kWaitColor = "#c9c9c9";
constexpr const char* kDrainColor = "#333333";
const char* const kPalette[] = {"#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2",
                                "#edc948", "#9c755f", "#ff9da7", "#bab0ac", "#17becf"};

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        if (static_cast<unsigned char>(c) >= 0x20 || c == '\t') out += c;
    }
  }
  return out;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

std::string time_label(double seconds, double step) {
  char buf[32];
  if (step >= 1) {
    std::snprintf(buf, sizeof buf, "%.0f s", seconds);
  } else if (step >= 0.1) {
    std::snprintf(buf, sizeof buf, "%.1f s", seconds);
  } else if (step >= 0.001) {
    std::snprintf(buf, sizeof buf, "%.0f ms", seconds * 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f ms", seconds * 1e3);
  }
  return buf;
}

// "pod  pid N", shortened to fit the label column; a pod named after its pid says it once.
std::string row_label(const std::string& pod, uint32_t pid) {
  std::string label = pod;
  if (pid != 0 && pod.rfind("pid " + std::to_string(pid), 0) != 0)
    label += "  pid " + std::to_string(pid);
  if (label.size() > 30) label = label.substr(0, 29) + "~";
  return label;
}

double nice_step(double span_s) {
  const double raw = span_s / 8;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * p >= raw) return m * p;
  }
  return 10 * p;
}

struct Window {
  uint64_t start = 0;
  uint64_t end = 0;
};

Window choose_window(const SessionView& view, double window_s) {
  std::vector<uint64_t> grants;  // of the busiest GPU
  for (const GpuKey& key : view.reported_gpus()) {
    std::vector<uint64_t> mine;
    for (const auto& hold : view.model.gpus.at(key).holds) {
      if (!hold.before_session && view.pod_selected(hold.tgid)) mine.push_back(hold.grant_ns);
    }
    if (mine.size() > grants.size()) grants = std::move(mine);
  }
  std::vector<uint64_t> marks = grants;
  if (marks.empty()) {
    for (const auto& [pid, p] : view.processes) {
      if (!view.process_selected(p)) continue;
      for (const auto& s : p.spans) marks.push_back(s.return_ns);
    }
  }
  std::sort(marks.begin(), marks.end());
  Window w{view.model.start_ns, std::max(view.model.end_ns, view.model.start_ns + 1)};
  if (marks.empty()) return w;
  const uint64_t mid = marks[marks.size() / 2];
  uint64_t length = 0;
  if (window_s > 0) {
    length = static_cast<uint64_t>(window_s * 1e9);
  } else {
    const size_t half = 20;
    const size_t lo = marks.size() / 2 > half ? marks.size() / 2 - half : 0;
    const size_t hi = std::min(marks.size() - 1, marks.size() / 2 + half);
    length = std::max<uint64_t>(marks[hi] - marks[lo], 1000000);
  }
  if (length >= w.end - w.start) return w;
  uint64_t start = mid > length / 2 ? mid - length / 2 : 0;
  start = std::clamp(start, w.start, w.end - length);
  return Window{start, start + length};
}

class Canvas {
 public:
  explicit Canvas(Window window) : window_(window) {}

  double x(uint64_t ns) const {
    const double plot = kWidth - kLeft - kRight;
    const double t =
        static_cast<double>(std::clamp(ns, window_.start, window_.end) - window_.start);
    return kLeft + t / static_cast<double>(window_.end - window_.start) * plot;
  }
  bool visible(uint64_t a, uint64_t b) const { return b >= window_.start && a <= window_.end; }

  void rect(uint64_t a, uint64_t b, double y, double h, const std::string& fill,
            const std::string& extra = {}) {
    if (!visible(a, b)) return;
    const double x0 = x(a);
    const double w = std::max(x(b) - x0, 0.6);
    body_ << "<rect x=\"" << num(x0) << "\" y=\"" << num(y) << "\" width=\"" << num(w)
          << "\" height=\"" << num(h) << "\" fill=\"" << fill << "\"" << extra << "/>\n";
  }
  void text(double x, double y, const std::string& s, const std::string& attrs = {}) {
    body_ << "<text x=\"" << num(x) << "\" y=\"" << num(y) << "\"" << attrs << ">" << escape(s)
          << "</text>\n";
  }
  void line(double x0, double y0, double x1, double y1, const std::string& stroke) {
    body_ << "<line x1=\"" << num(x0) << "\" y1=\"" << num(y0) << "\" x2=\"" << num(x1)
          << "\" y2=\"" << num(y1) << "\" stroke=\"" << stroke << "\" stroke-width=\"1\"/>\n";
  }
  void raw(const std::string& s) { body_ << s; }
  std::string body() const { return body_.str(); }
  const Window& window() const { return window_; }

 private:
  Window window_;
  std::ostringstream body_;
};

// A colour per pod, in the order pods are first drawn.
class PodColors {
 public:
  const std::string& of(const std::string& pod) {
    auto it = colors_.find(pod);
    if (it == colors_.end())
      it = colors_.emplace(pod, kPalette[colors_.size() % std::size(kPalette)]).first;
    return it->second;
  }

 private:
  std::map<std::string, std::string> colors_;
};

// The drawing as it goes down the page: `y` is the top of the next row.
struct Drawing {
  const SessionView& view;
  Canvas& canvas;
  PodColors colors;
  double y = 78;
};

// Ticks and their labels across the window, in seconds from the session's start.
void time_axis(Drawing& d, double from_s, double window_len_s) {
  Canvas& c = d.canvas;
  const double step = nice_step(window_len_s);
  const double first_tick = std::ceil(from_s / step) * step;
  for (double t = first_tick; t <= from_s + window_len_s + 1e-12; t += step) {
    const uint64_t ns = d.view.model.start_ns + static_cast<uint64_t>(t * 1e9);
    c.line(c.x(ns), d.y - 6, c.x(ns), d.y, "#888888");
    c.text(c.x(ns), d.y - 10, time_label(t, step),
           " font-size=\"11\" text-anchor=\"middle\" fill=\"#555555\"");
  }
  d.y += 12;
}

using Who = std::pair<std::string, uint32_t>;  // (pod, pid)

// One process's row on a GPU: its waits (less its holds), its quanta with their drains and
// revokes, and the handoffs into its grants.
void process_row(Drawing& d, const GpuModel& gpu, const Who& who,
                 const std::vector<const HoldRecord*>& holds,
                 const std::vector<std::pair<uint64_t, uint64_t>>& waits) {
  Canvas& c = d.canvas;
  const double y = d.y;
  const std::string color = d.colors.of(who.first);
  c.text(24, y + 15, row_label(who.first, who.second), " font-size=\"12\"");
  std::vector<std::pair<uint64_t, uint64_t>> held;
  for (const HoldRecord* hold : holds) held.emplace_back(hold->grant_ns, hold->end_ns);
  for (const auto& [a, b] : subtract(waits, held)) c.rect(a, b, y + 7, kBarHeight - 8, kWaitColor);
  for (const HoldRecord* hold : holds) {
    c.rect(hold->grant_ns, hold->end_ns, y + 4, kBarHeight, color);
    if (hold->released && hold->drain_begin_ns >= hold->grant_ns &&
        hold->drain_begin_ns <= hold->end_ns)
      c.rect(hold->drain_begin_ns, hold->end_ns, y + 4, kBarHeight, kDrainColor,
             " fill-opacity=\"0.55\"");
    if (hold->revoke_ns >= hold->grant_ns && hold->revoke_ns <= hold->end_ns &&
        c.visible(hold->revoke_ns, hold->revoke_ns)) {
      const double rx = c.x(hold->revoke_ns);
      c.raw("<path d=\"M" + num(rx - 3) + " " + num(y + 1) + " L" + num(rx + 3) + " " + num(y + 1) +
            " L" + num(rx) + " " + num(y + 5) + " Z\" fill=\"#000000\"/>\n");
    }
  }
  for (const SwitchRecord& sw : gpu.switches) {
    if (sw.complete && d.view.pod_of(sw.to_tgid) == who.first && sw.to_tgid == who.second)
      c.rect(std::max(sw.grant_ns, sw.start_ns), sw.end_ns, y + 4, kBarHeight, kHandoffColor);
  }
  d.y += kRowHeight;
}

// A GPU's title, its handoffs row, and a row per selected process that held or waited for it.
void gpu_rows(Drawing& d, const GpuKey& key, const GpuModel& gpu) {
  Canvas& c = d.canvas;
  const SessionView& view = d.view;
  c.text(12, d.y + 15, view.gpu_label(key), " font-size=\"13\" font-weight=\"bold\"");
  d.y += kRowHeight;
  // Handoffs: the time between one tenant's release and the next one's first launch.
  c.text(24, d.y + 14, "handoffs", " font-size=\"12\" fill=\"#555555\"");
  for (const SwitchRecord& sw : gpu.switches) {
    if (sw.complete && view.pod_selected(sw.to_tgid))
      c.rect(sw.start_ns, sw.end_ns, d.y + 6, 8, kHandoffColor);
  }
  d.y += kRowHeight;
  std::map<Who, std::vector<const HoldRecord*>> rows;
  std::map<Who, std::vector<std::pair<uint64_t, uint64_t>>> waits;
  for (const auto& hold : gpu.holds) {
    if (view.pod_selected(hold.tgid)) rows[{view.pod_of(hold.tgid), hold.tgid}].push_back(&hold);
  }
  for (const auto& wait : gpu.waits) {
    if (view.pod_selected(wait.tgid)) {
      rows[{view.pod_of(wait.tgid), wait.tgid}];
      waits[{view.pod_of(wait.tgid), wait.tgid}].emplace_back(wait.begin_ns, wait.end_ns);
    }
  }
  for (const auto& [who, holds] : rows) process_row(d, gpu, who, holds, waits[who]);
  d.y += 8;
}

// Driver calls of every traced process with a call in the window, a row each.
void driver_rows(Drawing& d) {
  Canvas& c = d.canvas;
  bool driver_title = false;
  for (const auto& [pid, p] : d.view.processes) {
    if (!d.view.process_selected(p) || p.spans.empty()) continue;
    bool any = false;
    for (const auto& s : p.spans)
      any = any || c.visible(s.oldest_launch_ns ? s.oldest_launch_ns : s.entry_ns, s.return_ns);
    if (!any) continue;
    if (!driver_title) {
      c.text(12, d.y + 15, "libcuda.so.1 calls: launch to completion (light), sync waits (dark)",
             " font-size=\"13\" font-weight=\"bold\"");
      d.y += kRowHeight;
      driver_title = true;
    }
    const std::string color = d.colors.of(p.pod);
    c.text(24, d.y + 15, row_label(p.pod, pid) + (p.managed ? " (shim)" : " (native)"),
           " font-size=\"12\"");
    for (const auto& s : p.spans) {
      if (s.oldest_launch_ns && s.oldest_launch_ns < s.return_ns)
        c.rect(s.oldest_launch_ns, s.return_ns, d.y + 4, kBarHeight, color,
               " fill-opacity=\"0.45\"");
      if (!s.query) c.rect(s.entry_ns, s.return_ns, d.y + 8, kBarHeight - 8, color);
    }
    d.y += kRowHeight;
  }
}

// What each colour and mark means, in one line under the plot.
void legend(Drawing& d) {
  Canvas& c = d.canvas;
  d.y += 14;
  const double y = d.y;
  double lx = kLeft;
  auto entry = [&](const std::string& fill, const std::string& label,
                   const std::string& extra = {}) {
    c.raw("<rect x=\"" + num(lx) + "\" y=\"" + num(y) + "\" width=\"18\" height=\"10\" fill=\"" +
          fill + "\"" + extra + "/>\n");
    c.text(lx + 24, y + 9, label, " font-size=\"11\"");
    lx += 30 + 6.5 * static_cast<double>(label.size());
  };
  entry(kPalette[0], "quantum (colour per pod)");
  entry(kWaitColor, "waiting at the gate");
  entry(kDrainColor, "draining after a revoke", " fill-opacity=\"0.55\"");
  entry(kHandoffColor, "handoff (release -> first launch)");
  c.raw("<path d=\"M" + num(lx) + " " + num(y) + " L" + num(lx + 8) + " " + num(y) + " L" +
        num(lx + 4) + " " + num(y + 6) + " Z\" fill=\"#000000\"/>\n");
  c.text(lx + 14, y + 9, "revoke", " font-size=\"11\"");
  d.y += 26;
}

// The SVG document: `height` tall, titled, around the drawn body.
std::string svg_document(const std::string& body, double height, const std::string& subtitle) {
  std::ostringstream svg;
  svg << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << num(kWidth) << "\" height=\""
      << num(height) << "\" viewBox=\"0 0 " << num(kWidth) << " " << num(height)
      << "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n"
      << "<rect x=\"0\" y=\"0\" width=\"" << num(kWidth) << "\" height=\"" << num(height)
      << "\" fill=\"#ffffff\"/>\n";
  svg << "<text x=\"12\" y=\"26\" font-size=\"17\" font-weight=\"bold\">quanta-trace "
         "session</text>\n"
      << "<text x=\"12\" y=\"46\" font-size=\"12\" fill=\"#555555\">" << escape(subtitle)
      << "</text>\n"
      << body << "</svg>\n";
  return svg.str();
}

}  // namespace

std::string svg_timeline(const SessionView& view, double window_s) {
  const Window window = choose_window(view, window_s);
  Canvas c(window);
  Drawing d{view, c, {}};
  const double window_len_s = static_cast<double>(window.end - window.start) / 1e9;
  const double session_s = static_cast<double>(view.model.end_ns - view.model.start_ns) / 1e9;
  const double from_s = static_cast<double>(window.start - view.model.start_ns) / 1e9;
  time_axis(d, from_s, window_len_s);
  const double rows_top = d.y;
  for (const GpuKey& key : view.reported_gpus()) {
    const GpuModel& gpu = view.model.gpus.at(key);
    if (gpu.holds.empty() && gpu.waits.empty()) continue;  // idle all session: nothing to draw
    gpu_rows(d, key, gpu);
  }
  driver_rows(d);
  // Frame around the plot area.
  c.line(kLeft, rows_top - 4, kLeft, d.y, "#bbbbbb");
  legend(d);
  char subtitle[256];
  std::snprintf(subtitle, sizeof subtitle, "showing %s from t = %s of a %s session",
                time_label(window_len_s, window_len_s).c_str(),
                time_label(from_s, window_len_s).c_str(), time_label(session_s, 1).c_str());
  return svg_document(c.body(), d.y, subtitle);
}

}  // namespace quanta::bpf
