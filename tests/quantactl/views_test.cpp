// quantactl's terminal views: names tenants chose cannot drive the operator's terminal,
// `explain` gives its verdicts from the arbiter's answer, `top` fits its width.
#include "quantactl/views.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "quantactl/text.h"

namespace quanta::ctl {
namespace {

TEST(CtlText, TenantChosenNamesCannotDriveTheTerminal) {
  EXPECT_EQ(printable("demo/heavy"), "demo/heavy");
  EXPECT_EQ(printable("x\x1b]0;pwned\x07y"), "x\\x1b]0;pwned\\x07y");
  EXPECT_EQ(printable("\x1b[2J"), "\\x1b[2J");
  EXPECT_EQ(printable("c1\xc2\x9b"
                      "31m"),
            "c1\\xc2\\x9b31m")
      << "C1 CSI as UTF-8";
  EXPECT_EQ(printable("bad\xff"), "bad\\xff");
  EXPECT_EQ(printable("tab\there\r"), "tab\\x09here\\x0d");
  EXPECT_EQ(printable("a\\x1b"), "a\\\\x1b") << "a literal backslash cannot forge an escape";
  EXPECT_EQ(printable("caf\xc3\xa9"), "caf\xc3\xa9");
  EXPECT_EQ(column("abcdef", 4), "abc~");
  EXPECT_EQ(column("ab", 4), "ab  ");
  EXPECT_EQ(column("\xc3\xa9\xc3\xa9", 3), "\xc3\xa9\xc3\xa9 ");
}

nlohmann::json explain_of(double share, double target, double running, double waiting, double idle,
                          uint64_t timeouts = 0) {
  nlohmann::json g = {
      {"index", 0},
      {"uuid", "GPU-1"},
      {"span_s", 60.0},
      {"live", true},
      {"weight", 1},
      {"priority", "batch"},
      {"max_share", 1.0},
      {"target_share", target},
      {"achieved_share", share},
      {"utilization", share},
      {"utilization_source", "driver"},
      {"phases", {{"running", running}, {"waiting", waiting}, {"draining", 0.0}, {"idle", idle}}},
      {"behind",
       {{{"pod", "demo/heavy"}, {"seconds", waiting * 0.7}},
        {{"pod", "demo/medium"}, {"seconds", waiting * 0.3}}}},
      {"waits", {{"count", 10}, {"median_ms", 5.0}, {"p99_ms", 9.0}, {"max_ms", 12.0}}},
      {"revoke_timeouts", timeouts},
      {"neighbours", nlohmann::json::array()},
      {"slices", nlohmann::json::array()}};
  return {{"ok", true}, {"pod", "demo/light"}, {"gpus", {g}}};
}

TEST(CtlViews, ExplainSaysWhetherThePodGotItsShareAndWhoDelayedIt) {
  std::string text = render_explain(explain_of(0.142, 0.143, 8.5, 51.0, 0.5));
  EXPECT_NE(
      text.find("It got its share. Its waits were its neighbours' turns, mostly demo/heavy's."),
      std::string::npos)
      << text;
  EXPECT_NE(text.find("demo/heavy held it 35.7 s"), std::string::npos) << text;
  text = render_explain(explain_of(0.05, 0.30, 3.0, 50.0, 7.0));
  EXPECT_NE(text.find("It got less than its target (5.0% of 30.0%): it waited 50.0 s, most of it "
                      "while demo/heavy "
                      "held the GPU (35.0 s)."),
            std::string::npos)
      << text;
  text = render_explain(explain_of(0.02, 0.30, 1.0, 1.0, 58.0));
  EXPECT_NE(text.find("idle most of the time"), std::string::npos) << text;
  text = render_explain(explain_of(0.10, 0.50, 6.0, 30.0, 24.0, 3));
  EXPECT_NE(text.find("passed over 3 time(s)"), std::string::npos) << text;
  nlohmann::json evil = explain_of(0.1, 0.1, 1, 1, 1);
  evil["pod"] = "ev\x1b[2Jil";
  text = render_explain(evil);
  EXPECT_EQ(text.find('\x1b'), std::string::npos);
  EXPECT_NE(text.find("ev\\x1b[2Jil"), std::string::npos);
}

TEST(CtlViews, TopShowsEachPodAndEscapesItsName) {
  nlohmann::json top = {
      {"ok", true},
      {"scope", "s"},
      {"generation", 1},
      {"uptime_s", 3.0},
      {"node_fits", {{{"share", "0.25"}, {"memory", "25%"}, {"pods", 2}}}},
      {"gpus",
       {{{"index", 0},
         {"uuid", "GPU-1"},
         {"model", "m"},
         {"holder", "a/b"},
         {"window_s", 5.0},
         {"fits", {{{"share", "0.25"}, {"memory", "25%"}, {"pods", 2}}}},
         {"pods",
          {{{"pod", "a/\x1b[31mred"},
            {"priority", "batch"},
            {"weight", 2},
            {"target_share", 0.5},
            {"achieved_share", 0.49},
            {"utilization", 0.4},
            {"phases", {{"running", 0.5}, {"waiting", 0.5}, {"draining", 0.0}, {"idle", 0.0}}},
            {"behind", {{{"pod", "a/b"}, {"seconds", 2.5}}}},
            {"wait_p99_ms", 12.5}}}}}}}};
  const std::string frame = render_top(top, 0);
  EXPECT_EQ(frame.find('\x1b'), std::string::npos);
  EXPECT_NE(frame.find("a/\\x1b[31mred"), std::string::npos) << frame;
  EXPECT_NE(frame.find("a/b 100%"), std::string::npos) << frame;
  EXPECT_NE(frame.find("2 x (share 0.25, memory 25%)"), std::string::npos) << frame;
  const std::string narrow = render_top(top, 60);
  for (size_t start = 0, nl; (nl = narrow.find('\n', start)) != std::string::npos; start = nl + 1) {
    EXPECT_LE(nl - start, 60u) << narrow.substr(start, nl - start);
  }
}

}  // namespace
}  // namespace quanta::ctl
