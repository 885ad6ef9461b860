// Policy parsers: every accepted form, and a clear error for every refused one.
#include "common/pod_key.h"
#include "common/policy.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>

using namespace quanta::common;

TEST(PolicyParse, WeightAcceptsOneToThousandOnly) {
  uint32_t w = 0;
  ParseError err;
  EXPECT_TRUE(parse_weight("1", &w, &err));
  EXPECT_EQ(w, 1u);
  EXPECT_TRUE(parse_weight("1000", &w, &err));
  EXPECT_EQ(w, 1000u);
  for (const char* bad : {"0", "1001", "", "2.5", "-1", "4x", "99999999999999999999999"}) {
    EXPECT_FALSE(parse_weight(bad, &w, &err)) << bad;
    EXPECT_NE(std::string(err.text).find("1 to 1000"), std::string::npos) << err.text;
  }
}

TEST(PolicyParse, PriorityNamesTheAllowedClasses) {
  Priority p;
  ParseError err;
  EXPECT_TRUE(parse_priority("interactive", &p, &err));
  EXPECT_EQ(p, Priority::kInteractive);
  EXPECT_TRUE(parse_priority("best-effort", &p, &err));
  EXPECT_EQ(p, Priority::kBestEffort);
  EXPECT_FALSE(parse_priority("realtime", &p, &err));
  EXPECT_NE(std::string(err.text).find("\"realtime\""), std::string::npos);
  EXPECT_NE(std::string(err.text).find("interactive, batch or best-effort"), std::string::npos);
}

TEST(PolicyParse, ShareAcceptsFractionsAndPercentages) {
  uint32_t ppm = 0;
  ParseError err;
  EXPECT_TRUE(parse_share("0.3", &ppm, &err));
  EXPECT_EQ(ppm, 300000u);
  EXPECT_TRUE(parse_share("30%", &ppm, &err));
  EXPECT_EQ(ppm, 300000u);
  EXPECT_TRUE(parse_share("1", &ppm, &err));
  EXPECT_EQ(ppm, kShareScale);
  for (const char* bad : {"0", "1.5", "101%", "abc", "", "0.3x"}) {
    EXPECT_FALSE(parse_share(bad, &ppm, &err)) << bad;
  }
}

TEST(PolicyParse, BytesUnderstandsKubernetesSuffixes) {
  uint64_t b = 0;
  ParseError err;
  EXPECT_TRUE(parse_bytes("10Gi", &b, &err));
  EXPECT_EQ(b, 10ull << 30);
  EXPECT_TRUE(parse_bytes("1.5Gi", &b, &err));
  EXPECT_EQ(b, 3ull << 29);
  EXPECT_TRUE(parse_bytes("2G", &b, &err));
  EXPECT_EQ(b, 2000000000ull);
  EXPECT_TRUE(parse_bytes("4096", &b, &err));
  EXPECT_EQ(b, 4096ull);
  for (const char* bad : {"0", "10GB", "Gi", "", "-5Mi", "99999999999Ti"}) {
    EXPECT_FALSE(parse_bytes(bad, &b, &err)) << bad;
    EXPECT_NE(std::string(err.text).find("Ki, Mi, Gi"), std::string::npos);
  }
}

TEST(PolicyParse, BytesOrZeroIsTheSizeGrammarWithZero) {
  uint64_t b = 7;
  ParseError err;
  EXPECT_TRUE(parse_bytes_or_zero("0", &b, &err));
  EXPECT_EQ(b, 0u);
  EXPECT_TRUE(parse_bytes_or_zero("1.5Gi", &b, &err));
  EXPECT_EQ(b, 3ull << 29);
  EXPECT_TRUE(parse_bytes_or_zero("2G", &b, &err));
  EXPECT_EQ(b, 2000000000ull);
  EXPECT_TRUE(parse_bytes_or_zero("544Mi", &b, &err));
  EXPECT_EQ(b, 544ull << 20);
  for (const char* bad : {"00", "0Mi", "10GB", "", "-1", "measure", "99999999999Ti"}) {
    b = 7;
    EXPECT_FALSE(parse_bytes_or_zero(bad, &b, &err)) << bad;
    EXPECT_EQ(b, 7u) << bad;
    const std::string text = err.text;
    EXPECT_NE(text.find("use 0 or"), std::string::npos) << text;
    EXPECT_NE(text.find(std::string("\"") + bad + "\""), std::string::npos) << text;
  }
}

TEST(PolicyParse, DurationRequiresAUnit) {
  uint64_t ns = 0;
  ParseError err;
  EXPECT_TRUE(parse_duration("20ms", &ns, &err));
  EXPECT_EQ(ns, 20000000ull);
  EXPECT_TRUE(parse_duration("500us", &ns, &err));
  EXPECT_EQ(ns, 500000ull);
  EXPECT_TRUE(parse_duration("1.5s", &ns, &err));
  EXPECT_EQ(ns, 1500000000ull);
  for (const char* bad : {"20", "0ms", "ms", "20 ms", "20min"}) {
    EXPECT_FALSE(parse_duration(bad, &ns, &err)) << bad;
    EXPECT_NE(std::string(err.text).find("ns, us, ms"), std::string::npos);
  }
}

// Every refusal is one line that still says what is allowed: the text it quotes has its
// control characters and backslashes escaped and is cut at 64 characters.
TEST(PolicyParse, ARefusalQuotesTheTextEscapedOnOneLine) {
  ParseError err;
  uint32_t w = 0;
  EXPECT_FALSE(parse_weight("3\n", &w, &err));
  EXPECT_NE(std::string(err.text).find("weight \"3\\x0a\" is not allowed"), std::string::npos)
      << err.text;
  Priority p;
  EXPECT_FALSE(parse_priority("batch\r\x1b[2J\\", &p, &err));
  EXPECT_NE(std::string(err.text).find("\"batch\\x0d\\x1b[2J\\\\\""), std::string::npos)
      << err.text;
  uint64_t bytes = 0;
  EXPECT_FALSE(parse_bytes(std::string(200, '\n'), &bytes, &err));
  const std::string cut(err.text);
  std::string sixteen;  // 64 characters of escapes
  for (int i = 0; i < 16; ++i) sixteen += "\\x0a";
  EXPECT_NE(cut.find("memory size \"" + sixteen + "\" is not allowed: use a positive number"),
            std::string::npos)
      << cut;
  EXPECT_EQ(cut.find_first_of("\n\r\x1b"), std::string::npos) << cut;
}

// Every quantactl command and quanta-trace --pod name a pod the same way.
TEST(PodKey, APodIsNamedByItsKeyItsNamespaceAndNameOrItsNameAlone) {
  using quanta::common::resolve_pod_name;
  const std::set<std::string> known = {"ml/train", "web/api", "prod/api", "dev-pod", "uid:1234"};
  std::string error;
  EXPECT_EQ(resolve_pod_name(known, "ml/train", &error), "ml/train");
  EXPECT_EQ(resolve_pod_name(known, "train", &error), "ml/train");
  EXPECT_EQ(resolve_pod_name(known, "dev-pod", &error), "dev-pod");
  EXPECT_EQ(resolve_pod_name(known, "default/dev-pod", &error), "dev-pod");
  EXPECT_EQ(resolve_pod_name(known, "uid:1234", &error), "uid:1234");
  EXPECT_TRUE(error.empty());
  EXPECT_EQ(resolve_pod_name(known, "api", &error), "");
  EXPECT_EQ(error, "pod name api is ambiguous: prod/api, web/api; name it as namespace/name");
  EXPECT_EQ(resolve_pod_name(known, "nothing", &error), "");
  EXPECT_TRUE(error.empty());
  EXPECT_EQ(quanta::common::split_pod_key("dev-pod"),
            std::make_pair(std::string("default"), std::string("dev-pod")));
}
