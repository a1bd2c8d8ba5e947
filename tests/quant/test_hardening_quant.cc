// Hostile config.json / quantization_config / layer patterns (issue #10, classes 1, 2, 3, 7):
// every one is a clear qmoe::Error, quickly, never a crash, hang or silent wrong answer.
#include <fmt/format.h>

#include <chrono>

#include "quant_test_util.h"

namespace qmoe::test {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string nested(int depth, char open = '[', char close = ']') {
  return std::string(static_cast<size_t>(depth), open) + std::string(static_cast<size_t>(depth), close);
}

// Class 1: 100k levels of nesting used to parse, then overflow the stack when serialised.
TEST(HardeningConfig, DeeplyNestedConfigJsonIsRejectedAtParse) {
  for (const std::string& inner : {nested(100000), nested(129), std::string("{\"a\":") + nested(200) + "}"}) {
    const std::string text = R"({"model_type": "qwen3_moe", "quantization_config": )" + inner + "}";
    const std::string msg = error_of([&] { (void)ModelConfig::parse(text, "deep/config.json"); });
    EXPECT_TRUE(contains_ci(msg, "deep/config.json")) << msg;
    EXPECT_TRUE(contains_ci(msg, "nested deeper than 128")) << msg;
  }
  // The same inside a field that is reported with its value: the message stays short.
  Json j = qwen3_json();
  std::string text = j.dump();
  text.insert(text.size() - 1, ",\"mlp_only_layers\":[" + nested(100) + "]");
  const std::string msg = error_of([&] { (void)ModelConfig::parse(text, "c.json"); });
  EXPECT_TRUE(contains_ci(msg, "mlp_only_layers")) << msg;
  EXPECT_LT(msg.size(), 400u) << msg;
}

TEST(HardeningConfig, QuarkConfigNestingAndHugeValuesAreBounded) {
  Json q = quark_json("w_mxfp4");
  std::string text = q.dump();
  text.insert(text.size() - 1, ",\"extra\":" + nested(5000, '{', '}'));
  // '{{{{' is not even valid JSON keys-wise; either way the message is about the input, bounded.
  const std::string msg = error_of([&] { (void)QuarkConfig::parse(text, "q.json"); });
  EXPECT_TRUE(contains_ci(msg, "q.json")) << msg;
  EXPECT_LT(msg.size(), 400u) << msg;
  // A long wrong-typed value is clipped in the message.
  Json big = quark_json("w_mxfp4");
  big["exclude"] = Json::array({Json::array({std::string(100000, 'x')})});
  const std::string m2 = error_of([&] { (void)quark_from(big); });
  EXPECT_TRUE(contains_ci(m2, "exclude[0]")) << m2;
  EXPECT_LT(m2.size(), 400u) << m2;
}

// Class 2: the key-ordered parser is quadratic in an object's size (100k keys: half a minute).
TEST(HardeningConfig, HugeObjectsAreRejectedQuickly) {
  std::string text = R"({"model_type": "qwen3_moe")";
  for (int i = 0; i < 300000; ++i) text += fmt::format(",\"k{}\":{}", i, i);
  text += "}";
  const auto t0 = Clock::now();
  const std::string msg = error_of([&] { (void)ModelConfig::parse(text, "wide/config.json"); });
  EXPECT_LT(seconds_since(t0), 2.0);
  EXPECT_TRUE(contains_ci(msg, "more than 20000 members")) << msg;
}

TEST(HardeningConfig, NulByteIsAnErrorNotTheEndOfTheFile) {
  const std::string text = std::string(R"({"model_type": "qwen3_moe"})") + std::string(1, '\0') + "garbage";
  const std::string msg = error_of([&] { (void)ModelConfig::parse(text, "nul/config.json"); });
  EXPECT_TRUE(contains_ci(msg, "NUL byte")) << msg;
}

// Class 7: nlohmann's bare "[json.exception.out_of_range.406] number overflow".
TEST(HardeningConfig, NumberOverflowIsAPlainMessage) {
  const std::string text = R"({"model_type": "qwen3_moe", "hidden_size": 1e999})";
  const std::string msg = error_of([&] { (void)ModelConfig::parse(text, "big/config.json"); });
  EXPECT_TRUE(contains_ci(msg, "big/config.json")) << msg;
  EXPECT_TRUE(contains_ci(msg, "number overflow")) << msg;
  EXPECT_FALSE(contains_ci(msg, "json.exception")) << msg;
}

// Class 2: absurd sizes fail at parse, before any loop over layers or experts.
TEST(HardeningConfig, AbsurdSizesFailFast) {
  for (const char* key : {"num_hidden_layers", "num_experts", "hidden_size", "moe_intermediate_size"}) {
    Json j = qwen3_json();
    j[key] = 1 << 30;
    if (std::string(key) == "num_experts") j["num_experts_per_tok"] = 2;
    const auto t0 = Clock::now();
    const std::string msg = error_of([&] { (void)model_from(j); });
    EXPECT_LT(seconds_since(t0), 1.0) << key;
    EXPECT_TRUE(contains_ci(msg, key)) << msg;
    EXPECT_TRUE(contains_ci(msg, "limit")) << msg;
  }
  // A huge mlp_only_layers list is not scanned once per layer.
  Json j = qwen3_json();
  j["num_hidden_layers"] = 60000;
  Json list = Json::array();
  for (int i = 0; i < 200000; ++i) list.push_back(i % 2 == 0 ? i : 1);
  j["mlp_only_layers"] = list;
  const std::string text = j.dump();
  const auto t0 = Clock::now();
  const ModelConfig c = ModelConfig::parse(text, "c.json");
  EXPECT_LT(seconds_since(t0), 5.0);
  EXPECT_EQ(c.moe_layers.size(), 29999u);  // every odd layer but layer 1
}

// Class 3: n_shared_experts × moe_intermediate_size overflowed int and dropped the shared expert.
TEST(HardeningConfig, SharedExpertSizeOverflowIsAnError) {
  Json j = {{"model_type", "deepseek_v3"}, {"hidden_size", 64}, {"moe_intermediate_size", 65536},
            {"n_routed_experts", 8},       {"num_experts_per_tok", 2}, {"num_hidden_layers", 2},
            {"n_shared_experts", 65536},   {"n_group", 1}, {"topk_group", 1}};
  const std::string msg = error_of([&] { (void)model_from(j); });
  EXPECT_TRUE(contains_ci(msg, "n_shared_experts")) << msg;
  EXPECT_TRUE(contains_ci(msg, "moe_intermediate_size")) << msg;
  j["n_shared_experts"] = 2;
  EXPECT_EQ(model_from(j).shared_expert_intermediate_size, 2 * 65536);
}

// Classes 1 + 2: `re:` patterns run on RE2: no stack overflow, no exponential backtracking.
TEST(HardeningPattern, NestedQuantifiersMatchInLinearTime) {
  const std::string name = "model.layers.12.mlp.experts.117.down_proj" + std::string(30, 'a') + "!";
  const auto t0 = Clock::now();
  for (const char* p : {"re:(a+)+$", "re:(a|aa)+$", "re:(.*a){20}$", "re:((a*)*)*b", "re:(x+x+)+y"})
    EXPECT_FALSE(quark_pattern_matches(p, name)) << p;
  EXPECT_LT(seconds_since(t0), 1.0);
}

TEST(HardeningPattern, DeeplyNestedRegexIsAnErrorNotACrash) {
  // Over the length limit: an error, not a deep recursion inside the regex engine.
  const std::string deep = "re:" + nested(100000, '(', ')');
  const std::string msg = error_of([&] { (void)quark_pattern_matches(deep, "model.layers.0"); });
  EXPECT_TRUE(contains_ci(msg, "regular expression")) << msg.substr(0, 300);
  EXPECT_LT(msg.size(), 600u);
  // 2000 levels (within the length limit): RE2 parses it without recursion; matching works.
  EXPECT_TRUE(quark_pattern_matches("re:" + nested(2000, '(', ')') + "model", "model.layers.0"));
  // Within the limits, deep nesting works (no recursion on the pattern).
  EXPECT_TRUE(quark_pattern_matches("re:" + nested(500, '(', ')') + "model", "model.layers.0"));
}

TEST(HardeningPattern, PythonOnlySyntaxIsAClearError) {
  for (const char* p : {"re:(a)\\1", "re:model(?=\\.layers)", "re:(?!lm_head).*", "re:(?<=x)y", "re:(?<!x)y",
                        "re:(?P<n>a)(?P=n)"}) {
    const std::string msg = error_of([&] { (void)quark_pattern_matches(p, "model.layers.0"); });
    EXPECT_TRUE(contains_ci(msg, p)) << msg;
    EXPECT_TRUE(contains_ci(msg, "not supported")) << msg;
    EXPECT_TRUE(contains_ci(msg, "back-reference") || contains_ci(msg, "look-around")) << msg;
  }
  // What RE2 shares with Python works as before: groups, classes, named groups, anchors.
  EXPECT_TRUE(quark_pattern_matches("re:(?P<l>model)\\.layers\\.[0-9]+\\.mlp$", "model.layers.3.mlp"));
  EXPECT_TRUE(quark_pattern_matches("re:.*\\.(gate|up)_proj", "model.layers.3.mlp.experts.0.up_proj"));
  EXPECT_FALSE(quark_pattern_matches("re:.*\\.(gate|up)_proj$", "model.layers.3.mlp.experts.0.down_proj"));
}

TEST(HardeningPattern, UnsupportedPatternInConfigNamesTheField) {
  Json q = quark_json("w_mxfp4");
  q["exclude"] = {"lm_head", "re:(?!x).*"};
  const std::string msg = error_of([&] { (void)quark_from(q); });
  EXPECT_TRUE(contains_ci(msg, "exclude[1]")) << msg;
  EXPECT_TRUE(contains_ci(msg, "look-around")) << msg;
}

}  // namespace
}  // namespace qmoe::test
