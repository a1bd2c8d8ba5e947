// quark_pattern_matches: exact names, shell globs (Python fnmatch semantics), `re:` regexes
// anchored at the start (Python re.match), spec quark-moe.md §16.3.
#include "quant_test_util.h"

namespace qmoe::test {
namespace {

TEST(QuarkPattern, ExactName) {
  EXPECT_TRUE(quark_pattern_matches("lm_head", "lm_head"));
  EXPECT_FALSE(quark_pattern_matches("lm_head", "lm_head.weight"));
  EXPECT_FALSE(quark_pattern_matches("model.layers.0.mlp", "model.layers.0.mlp.experts"));
  EXPECT_FALSE(quark_pattern_matches("", "x"));
  // No substring semantics (vLLM's reversed containment test is not used).
  EXPECT_FALSE(quark_pattern_matches("model.layers.0.mlp.experts.extra", "model.layers.0.mlp.experts"));
}

TEST(QuarkPattern, GlobStar) {
  EXPECT_TRUE(quark_pattern_matches("*.gate", "model.layers.0.mlp.gate"));
  EXPECT_FALSE(quark_pattern_matches("*.gate", "model.layers.0.mlp.experts.0.gate_proj"));
  EXPECT_TRUE(quark_pattern_matches("*", "model.layers.0.mlp.experts"));  // '*' crosses dots
  EXPECT_TRUE(quark_pattern_matches("*", ""));
  EXPECT_TRUE(quark_pattern_matches("*experts*", "model.layers.3.mlp.experts.7.down_proj"));
  EXPECT_TRUE(quark_pattern_matches("model.layers.*.mlp.experts.*.down_proj", "model.layers.12.mlp.experts.7.down_proj"));
  EXPECT_FALSE(quark_pattern_matches("model.layers.*.mlp.experts.*.down_proj", "model.layers.12.mlp.experts.7.up_proj"));
  EXPECT_TRUE(quark_pattern_matches("a*b*c", "aXXbYYbZc"));  // backtracking
  EXPECT_FALSE(quark_pattern_matches("a*b*c", "aXXbYYbZ"));
  EXPECT_TRUE(quark_pattern_matches("**x", "abx"));
}

TEST(QuarkPattern, GlobQuestionMark) {
  EXPECT_TRUE(quark_pattern_matches("model.layers.?.mlp", "model.layers.3.mlp"));
  EXPECT_FALSE(quark_pattern_matches("model.layers.?.mlp", "model.layers.13.mlp"));
  EXPECT_FALSE(quark_pattern_matches("model.layers.?.mlp", "model.layers..mlp"));
}

TEST(QuarkPattern, GlobBracketClass) {
  EXPECT_TRUE(quark_pattern_matches("model.layers.[0-2].mlp", "model.layers.1.mlp"));
  EXPECT_FALSE(quark_pattern_matches("model.layers.[0-2].mlp", "model.layers.5.mlp"));
  EXPECT_TRUE(quark_pattern_matches("model.layers.[!0-2].mlp", "model.layers.5.mlp"));
  EXPECT_FALSE(quark_pattern_matches("model.layers.[!0-2].mlp", "model.layers.0.mlp"));
  EXPECT_TRUE(quark_pattern_matches("w[13]", "w3"));
  EXPECT_FALSE(quark_pattern_matches("w[13]", "w2"));
  EXPECT_TRUE(quark_pattern_matches("x[]]", "x]"));        // ']' first in a class is literal
  EXPECT_TRUE(quark_pattern_matches("x[*", "x[abc"));      // unclosed '[' is a literal
  EXPECT_FALSE(quark_pattern_matches("x[*", "xabc"));
  EXPECT_TRUE(quark_pattern_matches("[*]", "*"));          // bracketed metacharacter is literal
  EXPECT_FALSE(quark_pattern_matches("[*]", "a"));
}

TEST(QuarkPattern, RegexAnchoredAtStart) {
  EXPECT_TRUE(quark_pattern_matches("re:.*mlp.gate$", "model.layers.0.mlp.gate"));
  EXPECT_FALSE(quark_pattern_matches("re:.*mlp.gate$", "model.layers.0.mlp.gate_proj"));
  // Anchored at the start like Python re.match: a match inside the name does not count.
  EXPECT_FALSE(quark_pattern_matches("re:mlp", "model.layers.0.mlp"));
  EXPECT_TRUE(quark_pattern_matches("re:model", "model.layers.0.mlp"));
  EXPECT_TRUE(quark_pattern_matches("re:.*self_attn.*", "model.layers.0.self_attn.q_proj"));
}

TEST(QuarkPattern, RegexIsNotAFullMatch) {
  // A prefix match suffices (re.match, not re.fullmatch) ...
  EXPECT_TRUE(quark_pattern_matches("re:model.layers.0.mlp.experts", "model.layers.0.mlp.experts.3.up_proj"));
  EXPECT_TRUE(quark_pattern_matches("re:model.layers.1", "model.layers.10.mlp.experts"));
  // ... so a regex must anchor itself to stop at a boundary.
  EXPECT_FALSE(quark_pattern_matches("re:model\\.layers\\.1\\.", "model.layers.10.mlp.experts"));
  EXPECT_TRUE(quark_pattern_matches("re:model\\.layers\\.(1|2)\\.", "model.layers.2.mlp.experts"));
}

TEST(QuarkPattern, InvalidRegexThrowsNamingThePattern) {
  const std::string msg = error_of([] { (void)quark_pattern_matches("re:model.(layers", "x"); });
  EXPECT_TRUE(contains_ci(msg, "re:model.(layers")) << msg;
}

}  // namespace
}  // namespace qmoe::test
