// The node config: every key read, defaults when absent, and bad files refused with
// file:line:column, the key, the value and what is allowed. The shipped config/quanta.toml
// must load as is.
#include "config/node_config.h"

#include <gtest/gtest.h>

#include <string>

namespace quanta::config {
namespace {

std::string refusal(const std::string& text) {
  try {
    parse_config(text, "test.toml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(Config, EmptyFileGivesDefaults) {
  NodeConfig c = parse_config("", "empty.toml");
  EXPECT_EQ(c.scope, "quanta");
  EXPECT_EQ(c.tenant_socket, "/run/quanta/tenant.sock");
  EXPECT_EQ(c.admin_socket, "/run/quanta-admin/admin.sock") << "out of the folder containers mount";
  EXPECT_EQ(c.state_dir, "/var/lib/quanta");
  EXPECT_FALSE(c.allow_unregistered);
  EXPECT_TRUE(c.gpus.empty());
  EXPECT_EQ(c.scheduler.quantum_ns, 20'000'000u);
  EXPECT_EQ(c.scheduler.revoke_timeout_ns, 500'000'000u);
  EXPECT_EQ(c.scheduler.lease_ns, 1'000'000'000u);
  EXPECT_EQ(c.scheduler.idle_release_ns, 2'000'000u);
  EXPECT_TRUE(c.scheduler.drain_overlap);
  EXPECT_EQ(c.scheduler.quantum_slack_ppm, 100'000u);
  EXPECT_EQ(c.defaults.weight, 1u);
  EXPECT_EQ(c.defaults.priority, common::Priority::kBatch);
  EXPECT_EQ(c.defaults.max_share_ppm, common::kShareScale);
  EXPECT_EQ(c.defaults.memory_limit, 0u);
}

TEST(Config, EveryKeyIsRead) {
  NodeConfig c = parse_config(R"(
[node]
scope = "t1"
tenant_socket = "/tmp/x/tenant.sock"
admin_socket = "/tmp/x/admin.sock"
state_dir = "/tmp/x/state"
allow_unregistered = true
gpus = ["GPU-a", "MIG-b"]

[scheduler]
quantum = "10ms"
quantum_min = "500us"
quantum_max = "50ms"
revoke_timeout = "200ms"
lease = "400ms"
idle_release = "1ms"
drain_overlap = false
quantum_slack = "5%"

[defaults]
weight = 2
priority = "interactive"
max_share = 0.5
memory_limit = "1Gi"
quantum = "5ms"

[pod."heavy"]
weight = 4
max_share = "30%"

[pod."capped"]
memory_limit = 1048576
priority = "best-effort"
)",
                              "full.toml");
  EXPECT_EQ(c.scope, "t1");
  EXPECT_EQ(c.tenant_socket, "/tmp/x/tenant.sock");
  EXPECT_EQ(c.admin_socket, "/tmp/x/admin.sock");
  EXPECT_EQ(c.state_dir, "/tmp/x/state");
  EXPECT_TRUE(c.allow_unregistered);
  ASSERT_EQ(c.gpus.size(), 2u);
  EXPECT_EQ(c.gpus[1], "MIG-b");
  EXPECT_EQ(c.scheduler.quantum_ns, 10'000'000u);
  EXPECT_EQ(c.scheduler.quantum_min_ns, 500'000u);
  EXPECT_EQ(c.scheduler.quantum_max_ns, 50'000'000u);
  EXPECT_EQ(c.scheduler.revoke_timeout_ns, 200'000'000u);
  EXPECT_EQ(c.scheduler.lease_ns, 400'000'000u);
  EXPECT_EQ(c.scheduler.idle_release_ns, 1'000'000u);
  EXPECT_FALSE(c.scheduler.drain_overlap);
  EXPECT_EQ(c.scheduler.quantum_slack_ppm, 50'000u);
  EXPECT_EQ(c.defaults.weight, 2u);
  EXPECT_EQ(c.defaults.priority, common::Priority::kInteractive);
  EXPECT_EQ(c.defaults.max_share_ppm, 500'000u);
  EXPECT_EQ(c.defaults.memory_limit, 1ull << 30);
  EXPECT_EQ(c.defaults.quantum_ns, 5'000'000u);
  common::Policy heavy = c.policy_for("heavy");
  EXPECT_EQ(heavy.weight, 4u);
  EXPECT_EQ(heavy.max_share_ppm, 300'000u);
  EXPECT_EQ(heavy.priority, common::Priority::kInteractive) << "unset keys come from [defaults]";
  common::Policy capped = c.policy_for("capped");
  EXPECT_EQ(capped.memory_limit, 1048576u);
  EXPECT_EQ(capped.priority, common::Priority::kBestEffort);
  EXPECT_EQ(c.policy_for("unknown").weight, 2u);
}

TEST(Config, BadValueNamesPlaceKeyValueAndAllowed) {
  std::string e = refusal("[defaults]\nweight = 0\n");
  EXPECT_NE(e.find("test.toml:2:10"), std::string::npos) << e;
  EXPECT_NE(e.find("defaults.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("\"0\""), std::string::npos) << e;
  EXPECT_NE(e.find("1 to 1000"), std::string::npos) << e;

  e = refusal("[scheduler]\n\nquantum = \"fast\"\n");
  EXPECT_NE(e.find("test.toml:3:11"), std::string::npos) << e;
  EXPECT_NE(e.find("scheduler.quantum"), std::string::npos) << e;
  EXPECT_NE(e.find("\"fast\""), std::string::npos) << e;
  EXPECT_NE(e.find("ns, us, ms"), std::string::npos) << e;

  e = refusal("[pod.\"a\"]\npriority = \"urgent\"\n");
  EXPECT_NE(e.find("test.toml:2:12"), std::string::npos) << e;
  EXPECT_NE(e.find("pod.\"a\".priority"), std::string::npos) << e;
  EXPECT_NE(e.find("interactive, batch or best-effort"), std::string::npos) << e;

  e = refusal("[defaults]\nmax_share = 1.5\n");
  EXPECT_NE(e.find("defaults.max_share"), std::string::npos) << e;
  EXPECT_NE(e.find("at most 1"), std::string::npos) << e;

  e = refusal("[defaults]\nmemory_limit = \"10Gb\"\n");
  EXPECT_NE(e.find("defaults.memory_limit"), std::string::npos) << e;
  EXPECT_NE(e.find("Gi"), std::string::npos) << e;

  e = refusal("[node]\nallow_unregistered = \"yes\"\n");
  EXPECT_NE(e.find("node.allow_unregistered"), std::string::npos) << e;
  EXPECT_NE(e.find("true or false"), std::string::npos) << e;

  e = refusal("[node]\nscope = \"a/b\"\n");
  EXPECT_NE(e.find("node.scope"), std::string::npos) << e;

  e = refusal("[node]\ngpus = \"GPU-a\"\n");
  EXPECT_NE(e.find("node.gpus"), std::string::npos) << e;

  e = refusal("[scheduler]\nquantum = 20\n");
  EXPECT_NE(e.find("scheduler.quantum"), std::string::npos) << e;
  EXPECT_NE(e.find("unit"), std::string::npos) << e;
}

TEST(Config, UnknownKeysAreRefused) {
  std::string e = refusal("[node]\nscoop = \"x\"\n");
  EXPECT_NE(e.find("test.toml:2:1"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown key \"scoop\""), std::string::npos) << e;
  EXPECT_NE(e.find("scope"), std::string::npos) << e;

  e = refusal("[schedular]\n");
  EXPECT_NE(e.find("unknown key \"schedular\""), std::string::npos) << e;

  e = refusal("[pod.\"a\"]\nwieght = 3\n");
  EXPECT_NE(e.find("unknown key \"wieght\""), std::string::npos) << e;
}

TEST(Config, QuantumOutsideItsBoundsIsRefused) {
  std::string e = refusal("[scheduler]\nquantum = \"200ms\"\n");
  EXPECT_NE(e.find("scheduler.quantum"), std::string::npos) << e;
  EXPECT_NE(e.find("quantum_min <= quantum <= quantum_max"), std::string::npos) << e;
}

TEST(Config, QuantumSlackIsAPartOfTheQuantumUpToHalf) {
  EXPECT_EQ(parse_config("[scheduler]\nquantum_slack = \"0%\"\n", "t").scheduler.quantum_slack_ppm,
            0u);
  EXPECT_EQ(parse_config("[scheduler]\nquantum_slack = 0\n", "t").scheduler.quantum_slack_ppm, 0u);
  EXPECT_EQ(parse_config("[scheduler]\nquantum_slack = 0.25\n", "t").scheduler.quantum_slack_ppm,
            250'000u);
  EXPECT_EQ(parse_config("[scheduler]\nquantum_slack = \"50%\"\n", "t").scheduler.quantum_slack_ppm,
            500'000u);

  std::string e = refusal("[scheduler]\nquantum_slack = \"60%\"\n");
  EXPECT_NE(e.find("test.toml:2:17"), std::string::npos) << e;
  EXPECT_NE(e.find("scheduler.quantum_slack"), std::string::npos) << e;
  EXPECT_NE(e.find("more than half a quantum"), std::string::npos) << e;
  EXPECT_NE(e.find("\"0%\" to \"50%\""), std::string::npos) << e;

  e = refusal("[scheduler]\nquantum_slack = \"2ms\"\n");
  EXPECT_NE(e.find("scheduler.quantum_slack"), std::string::npos) << e;
  EXPECT_NE(e.find("\"0%\" to \"50%\""), std::string::npos) << e;

  e = refusal("[scheduler]\nquantum_slack = true\n");
  EXPECT_NE(e.find("scheduler.quantum_slack"), std::string::npos) << e;
}

TEST(Config, SyntaxErrorGivesPlace) {
  std::string e = refusal("[node]\nscope = \n");
  EXPECT_EQ(e.rfind("test.toml:2:", 0), 0u) << e;
}

TEST(Config, MissingFileIsRefusedClearly) {
  try {
    load_config("/nonexistent/quanta.toml");
    FAIL() << "accepted a missing file";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/quanta.toml"), std::string::npos);
  }
}

TEST(Config, ShippedConfigLoads) {
  NodeConfig c = load_config(QUANTA_SOURCE_DIR "/config/quanta.toml");
  EXPECT_EQ(c.scope, "quanta");
  EXPECT_FALSE(c.allow_unregistered);
  EXPECT_EQ(c.scheduler.quantum_ns, 20'000'000u);
  EXPECT_TRUE(c.enforce.enforce);
  EXPECT_TRUE(c.shim.measure_context_overhead);
  EXPECT_EQ(c.enforce.over_cap, OverCapAction::kKill)
      << "the shipped node must hold a cap against a pod that lies";
}

TEST(Config, PolicyValuesAcceptQuantactlSpelling) {
  common::Policy p;
  EXPECT_EQ(apply_policy_value(&p, "max-share", "0.25"), "");
  EXPECT_EQ(p.max_share_ppm, 250'000u);
  EXPECT_EQ(apply_policy_value(&p, "memory-limit", "2Gi"), "");
  EXPECT_EQ(p.memory_limit, 2ull << 30);
  EXPECT_EQ(apply_policy_value(&p, "memory-limit", "none"), "");
  EXPECT_EQ(p.memory_limit, 0u);
  EXPECT_EQ(apply_policy_value(&p, "quanta.dev/priority", "interactive"), "");
  EXPECT_EQ(p.priority, common::Priority::kInteractive);
  EXPECT_NE(apply_policy_value(&p, "colour", "red").find("allowed keys"), std::string::npos);
}

TEST(Config, EnforceShimAndMetricsSectionsParseAndRefuseBadValues) {
  NodeConfig c = parse_config(
      "[enforce]\nenforce = false\nunplaced = \"closed\"\nover_cap = \"kill\"\n"
      "[shim]\ncontext_overhead = \"64Mi\"\ncount_managed = false\n"
      "[metrics]\nlisten = \"127.0.0.1:0\"\n",
      "test.toml");
  EXPECT_FALSE(c.enforce.enforce);
  EXPECT_EQ(c.enforce.unplaced, UnplacedAction::kClosed);
  EXPECT_EQ(c.enforce.over_cap, OverCapAction::kKill);
  EXPECT_EQ(c.shim.context_overhead, 64u << 20);
  EXPECT_FALSE(c.shim.measure_context_overhead);
  EXPECT_FALSE(c.shim.count_managed);
  EXPECT_EQ(c.metrics.listen, "127.0.0.1:0");

  NodeConfig d = parse_config("", "test.toml");
  EXPECT_TRUE(d.enforce.enforce);
  EXPECT_EQ(d.enforce.unplaced, UnplacedAction::kClosedIfCapped);
  EXPECT_EQ(d.enforce.over_cap, OverCapAction::kKill);
  EXPECT_TRUE(d.shim.measure_context_overhead);
  EXPECT_TRUE(d.metrics.listen.empty());

  std::string e = refusal("[enforce]\nunplaced = \"maybe\"\n");
  EXPECT_NE(e.find("enforce.unplaced"), std::string::npos) << e;
  EXPECT_NE(e.find("closed-if-capped"), std::string::npos) << e;
  e = refusal("[enforce]\nover_cap = \"warn\"\n");
  EXPECT_NE(e.find("\"report\", \"deny\" or \"kill\""), std::string::npos) << e;
  e = refusal("[shim]\ncontext_overhead = \"lots\"\n");
  EXPECT_NE(e.find("shim.context_overhead"), std::string::npos) << e;
  EXPECT_NE(e.find("use 0 or a number of bytes"), std::string::npos) << e;
  EXPECT_NE(e.find("\"measure\""), std::string::npos) << e;
  EXPECT_EQ(parse_config("[shim]\ncontext_overhead = \"0\"\n", "t.toml").shim.context_overhead, 0u);
  EXPECT_EQ(parse_config("[shim]\ncontext_overhead = \"1.5Gi\"\n", "t.toml").shim.context_overhead,
            3ull << 29);
  e = refusal("[metrics]\nlisten = \"9400\"\n");
  EXPECT_NE(e.find("HOST:PORT"), std::string::npos) << e;
  e = refusal("[metrics]\nlisten = \"host:99999\"\n");
  EXPECT_NE(e.find("metrics.listen"), std::string::npos) << e;
}

TEST(Config, NvmlIntervalAndPodNamesAreChecked) {
  EXPECT_EQ(parse_config("[node]\nnvml_interval = \"250ms\"\n", "n.toml").nvml_interval_ns,
            250'000'000u);
  EXPECT_EQ(parse_config("", "n.toml").nvml_interval_ns, 1'000'000'000u);
  EXPECT_EQ(parse_config("[node]\nnvml_interval = 0\n", "n.toml").nvml_interval_ns, 0u);
  const std::string fast = refusal("[node]\nnvml_interval = \"10ms\"\n");
  EXPECT_NE(fast.find("node.nvml_interval"), std::string::npos) << fast;
  EXPECT_NE(fast.find("100ms to 60s, or 0"), std::string::npos) << fast;
  const std::string old = refusal("[enforce]\nnvml_poll = \"1s\"\n");
  EXPECT_NE(old.find("nvml_poll"), std::string::npos) << old;
  const std::string name = refusal("[pod.\"bad name\"]\nweight = 2\n");
  EXPECT_NE(name.find("pod.\"bad name\""), std::string::npos) << name;
  EXPECT_NE(name.find("letters, digits"), std::string::npos) << name;
}

TEST(Config, NiceIsAWholeNumberAsNiceTakesIt) {
  EXPECT_EQ(parse_config("", "n.toml").nice, -10);
  EXPECT_EQ(parse_config("[node]\nnice = 5\n", "n.toml").nice, 5);
  EXPECT_EQ(parse_config("[node]\nnice = -20\n", "n.toml").nice, -20);
  for (const char* value : {"-21", "20", "\"high\"", "1.5", "true"}) {
    const std::string e = refusal(std::string("[node]\nnice = ") + value + "\n");
    EXPECT_NE(e.find("test.toml:2:8: node.nice = "), std::string::npos) << e;
    EXPECT_NE(e.find("from -20 (first to run) to 19 (last)"), std::string::npos) << e;
  }
}

// Found by the node-config fuzzer: toml++ assumes a table name starts with a key character
// (undefined behaviour when it does not), so such a header is refused before parsing.
TEST(Config, TableHeaderWithoutANameIsRefusedBeforeParsing) {
  for (const char* text : {"[=sr]\n", "[node]\nscope = \"a\"\n  [ =x]\n", "[[=x]]\n", "[.a]\n",
                           "\xEF\xBB\xBF[$x]\n", "[\nquantum = 1\n", "[[ \n",
                           "[node]\ns\xEF\xBB\xAF"
                           "cope = \"t\"\n"}) {
    const std::string e = refusal(text);
    EXPECT_NE(e.find("a table header names no table"), std::string::npos) << text << ": " << e;
  }
  EXPECT_NE(refusal("[node]\nscope = \"a\"\n[=x]\n").find("test.toml:3:"), std::string::npos);
  // Inside a multi-line string such a line is text, not a header.
  const std::string inside = refusal("[node]\nscope = \"\"\"\n[=x]\n\"\"\"\n");
  EXPECT_EQ(inside.find("a table header names no table"), std::string::npos) << inside;
  EXPECT_NO_THROW(
      parse_config("[node]\n[ \"scheduler\" ]\n[pod.\"a/b\"]\nweight = 2\n", "test.toml"));
  const std::string quoted = refusal("[node]\nallow_unregistered = fal\n");
  EXPECT_EQ(quoted.find('\n'), std::string::npos) << quoted;
  EXPECT_NO_THROW(parse_config("# caf\xC3\xA9\n[node]\nscope = \"q\" # \xC3\xA9\n", "test.toml"));
}

// A character outside ASCII in a bare token is a syntax error with its place, also where
// the token runs into a quote (44"§"), which starts no string there.
TEST(Config, ACharacterOutsideAsciiWhereASpaceMayStandIsRefusedWithItsPlace) {
  for (const char* text : {
           "[node]\nlisten = [44\"\xC2\xA7\"]\n",      // U+00A7
           "[node]\nlisten = [44\"\xE3\x80\x81\"]\n",  // U+3001
           "[node]\nlisten = [44\"\xEF\xBB\xBE\"]\n",  // U+FEFE
       }) {
    const std::string e = refusal(text);
    EXPECT_EQ(e.rfind("test.toml:2:", 0), 0u) << text << ": " << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
  static const char kFoundByFuzzing[] =
      "Zsc= [4444444444444\"'||\x00\x00`@\x00\x1A\xC5\xA5||||||||||||||||"
      "]\x00||||||||||||||au'qa+' \n";
  const std::string found_by_fuzzing =
      refusal(std::string(kFoundByFuzzing, sizeof kFoundByFuzzing - 1));
  EXPECT_EQ(found_by_fuzzing.rfind("test.toml:1:", 0), 0u) << found_by_fuzzing;
}

// The TOML parser asks whether a character outside ASCII is a space wherever a space may
// stand, as at the start of the line after a multi-line string's line-ending backslash. The
// answer is "no" for every block of Unicode (cmake/QuantaDeps.cmake), so it stays text.
TEST(Config, ALineEndingBackslashKeepsTheNextLinesFirstCharacterOutsideAscii) {
  for (const char* next : {"\xC2\xA7", "\xE3\x80\x81", "\xEF\xBB\xBE"}) {
    const NodeConfig c = parse_config(
        std::string("[node]\nstate_dir = \"\"\"/var/lib/\\\n  ") + next + "\"\"\"\n", "test.toml");
    EXPECT_EQ(c.state_dir, std::string("/var/lib/") + next);
  }
}

// A bracket that closes the other kind is refused before the parser reads it (which would
// assert that an array's value never starts with '}'), naming both lines; strings,
// comments and multi-line strings do not count, and line-ending backslashes keep the count.
TEST(Config, ABracketClosingTheOtherKindIsRefusedWithBothLines) {
  const struct {
    const char* text;
    const char* refusal;
  } cases[] = {
      {"[node]\nlisten = [}]\n", "test.toml:2:11: '}' closes the '[' opened at 2:10"},
      {"[node]\nlisten = [1,\n# a comment ]\n}]\n",
       "test.toml:4:1: '}' closes the '[' opened at 2:10"},
      {"[node]\nlisten = [\t}\n", "test.toml:2:12: '}' closes the '[' opened at 2:10"},
      {"[node]\nlisten = [[1],}\n", "test.toml:2:15: '}' closes the '[' opened at 2:10"},
      {"[node]\nlisten = {a = [}]}\n", "test.toml:2:16: '}' closes the '[' opened at 2:15"},
      {"[node]\nlisten = {\xC3\xA9 = 1]\n", "test.toml:2:11: a table header names no table"},
      {"[node]\nlisten = {a = 1]\n", "test.toml:2:16: ']' closes the '{' opened at 2:10"},
      {"[node]\nscope = \"\"\"a\\\n  b]\"\"\"\nlisten = [\"}\", '}',\n}\n",
       "test.toml:5:1: '}' closes the '[' opened at 4:10"},
      {"[node]\nscope = \"a\\\nlisten = [}\n", "test.toml:3:11: '}' closes the '[' opened at 3:10"},
  };
  for (const auto& c : cases) {
    const std::string e = refusal(c.text);
    EXPECT_EQ(e.rfind(c.refusal, 0), 0u) << c.text << ": " << e;
  }
  EXPECT_NO_THROW(parse_config("[node]\ngpus = [ \"u-1\", # ]\n  'u}2' ]\n", "test.toml"));
  const std::string quoted = refusal("[pod.\"a]}\"]\n");
  EXPECT_EQ(quoted.find("closes the"), std::string::npos) << quoted;
}

// A date, a space and one digit is refused before the parser reads it (which would assert
// that the digit does not end the value); a date and a time with a space between load.
TEST(Config, ADateFollowedByOneDigitIsRefusedWithItsLine) {
  for (const char* text :
       {"[node]\nlisten = 1979-05-27 0\n", "[node]\nlisten = [1979-05-27 7]\n",
        "[node]\nlisten = 4464-6'-`8 0\n", "[node]\nlisten=1979-0_5-27 1,\n",
        "[node]\nlisten=4464-08-=\\ 4\n", "[node]\nlisten = 1979-05-27 0 # a comment\n"}) {
    const std::string e = refusal(text);
    EXPECT_EQ(e.rfind("test.toml:2:", 0), 0u) << text << ": " << e;
    EXPECT_NE(e.find(": a date is followed by a space and one digit: a time after a date is "
                     "HH:MM:SS"),
              std::string::npos)
        << text << ": " << e;
  }
  for (const char* text :
       {"[node]\nlisten = 1979-05-27 07:32:00\n", "[node]\nlisten = 1979-05-27\n",
        "[node]\nlisten = \"1979-05-27 0\"\n", "# 1979-05-27 0\n"}) {
    const std::string e = refusal(text);
    EXPECT_EQ(e.find("a date is followed"), std::string::npos) << text << ": " << e;
  }
}

// A refusal is one line whatever the file's strings and quoted keys hold: newlines and
// control characters in them are shown escaped.
TEST(Config, ARefusalQuotingAStringOrKeyWithANewlineIsOneLine) {
  for (const char* text : {"[pod.\"a\\nb\"]\nweight = 3\n", "[node]\n\"a\\nb\" = 1\n",
                           "[node]\nscope = \"a\\nb\\u0007\"\n", "[pod.\"a\"]\n\"x\\ny\" = 1\n",
                           "[pod.\"a\"]\nweight = \"3\\n\"\n", "[node]\nlisten = \"\\n\"\n",
                           "[pod.\"a\"]\nmemory_limit = \"1\\rGi\"\n"}) {
    const std::string e = refusal(text);
    EXPECT_EQ(e.rfind("test.toml:", 0), 0u) << text << ": " << e;
    EXPECT_EQ(e.find_first_of("\n\r\x07"), std::string::npos) << text << ": " << e;
  }
  EXPECT_NE(refusal("[pod.\"a\\nb\"]\n").find("pod.\"a\\x0ab\""), std::string::npos);
}

TEST(Config, HookTimeoutParsesAndIsBounded) {
  EXPECT_EQ(parse_config("", "test.toml").hook.timeout_ns, 5'000'000'000u);
  EXPECT_EQ(parse_config("[hook]\ntimeout = \"750ms\"\n", "test.toml").hook.timeout_ns,
            750'000'000u);
  std::string e = refusal("[hook]\ntimeout = \"2h\"\n");
  EXPECT_NE(e.find("hook.timeout"), std::string::npos) << e;
  e = refusal("[hook]\ntimeout = \"5ms\"\n");
  EXPECT_NE(e.find("10ms to 60s"), std::string::npos) << e;
  e = refusal("[hook]\nretries = 3\n");
  EXPECT_NE(e.find("allowed keys are timeout"), std::string::npos) << e;
}

// --- what pods may ask for -------------------------------------------------------------------

TEST(ConfigBounds, BoundsAndNamespaceTablesAreReadAndNamespacesInheritTheNodes) {
  NodeConfig c = parse_config(
      "[bounds]\nmax_weight = 10\npriorities = [\"batch\", \"best-effort\"]\nmax_min_share = "
      "\"20%\"\n"
      "namespace_min_share = \"40%\"\nmemory_limit = \"required\"\nmax_memory_limit = \"40Gi\"\n"
      "[namespace.\"ml-prod\"]\nmax_weight = 100\npriorities = [\"interactive\", \"batch\"]\n",
      "b.toml");
  EXPECT_EQ(c.bounds.max_weight, 10u);
  EXPECT_FALSE(c.bounds.allows(common::Priority::kInteractive));
  EXPECT_TRUE(c.bounds.allows(common::Priority::kBestEffort));
  EXPECT_EQ(c.bounds.max_min_share_ppm, 200'000u);
  EXPECT_EQ(c.bounds.namespace_min_share_ppm, 400'000u);
  EXPECT_TRUE(c.bounds.memory_limit_required);
  EXPECT_EQ(c.bounds.max_memory_limit, 40ull << 30);
  const PolicyBounds& ml = c.bounds_for("ml-prod");
  EXPECT_EQ(ml.max_weight, 100u);
  EXPECT_TRUE(ml.allows(common::Priority::kInteractive));
  EXPECT_FALSE(ml.allows(common::Priority::kBestEffort));
  EXPECT_EQ(ml.max_memory_limit, 40ull << 30) << "unset keys come from [bounds]";
  EXPECT_EQ(&c.bounds_for("other"), &c.bounds);
}

TEST(ConfigBounds, BadBoundsAndDefaultsOutsideThemAreRefused) {
  EXPECT_NE(refusal("[bounds]\nmax_weight = 0\n").find("bounds.max_weight"), std::string::npos);
  EXPECT_NE(refusal("[bounds]\npriorities = [\"urgent\"]\n").find("bounds.priorities"),
            std::string::npos);
  EXPECT_NE(refusal("[bounds]\nmemory_limit = \"maybe\"\n").find("use \"required\""),
            std::string::npos);
  EXPECT_NE(refusal("[namespace.\"Bad_Name\"]\nmax_weight = 2\n").find("lowercase"),
            std::string::npos);
  EXPECT_NE(refusal("[bounds]\nfoo = 1\n").find("allowed keys are max_weight"), std::string::npos);
  const std::string e = refusal("[defaults]\nweight = 5\n[namespace.\"a\"]\nmax_weight = 2\n");
  EXPECT_NE(e.find("[defaults] weight 5 is beyond [namespace.\"a\"]"), std::string::npos) << e;
}

TEST(ConfigBounds, APolicyBeyondItsBoundsNamesTheAnnotationValueAndWhatIsAllowed) {
  PolicyBounds b;
  b.max_weight = 10;
  b.priorities = 1u << static_cast<uint32_t>(common::Priority::kBatch);
  b.max_min_share_ppm = 200'000;
  b.max_memory_limit = 8ull << 30;
  common::Policy p;
  p.memory_limit = 1ull << 30;
  EXPECT_EQ(bounds_error(b, "[bounds]", p, {}), "");
  common::Policy heavy = p;
  heavy.weight = 1000;
  EXPECT_EQ(bounds_error(b, "[bounds]", heavy, {{"weight", "1000"}}),
            "annotation quanta.dev/weight = \"1000\" is beyond the node's bounds: [bounds] allows "
            "weight 1 to 10");
  common::Policy urgent = p;
  urgent.priority = common::Priority::kInteractive;
  EXPECT_NE(bounds_error(b, "[namespace.\"t\"]", urgent, {{"priority", "interactive"}})
                .find("allows priority batch"),
            std::string::npos);
  common::Policy greedy = p;
  greedy.min_share_ppm = common::kShareScale;
  EXPECT_NE(
      bounds_error(b, "[bounds]", greedy, {{"min-share", "100%"}}).find("min-share up to 0.2"),
      std::string::npos);
  common::Policy uncapped = p;
  uncapped.memory_limit = 0;
  EXPECT_NE(bounds_error(b, "[bounds]", uncapped, {{"memory-limit", "none"}})
                .find("annotation quanta.dev/memory-limit = \"none\" is beyond"),
            std::string::npos)
      << "memory-limit: none cannot escape a ceiling";
  common::Policy big = p;
  big.memory_limit = 80ull << 30;
  EXPECT_NE(
      bounds_error(b, "[bounds]", big, {{"memory-limit", "80Gi"}}).find("memory-limit up to 8Gi"),
      std::string::npos);
  PolicyBounds required;
  required.memory_limit_required = true;
  EXPECT_NE(bounds_error(required, "[bounds]", common::Policy{}, {})
                .find("no quanta.dev/memory-limit annotation"),
            std::string::npos);
}

}  // namespace
}  // namespace quanta::config
