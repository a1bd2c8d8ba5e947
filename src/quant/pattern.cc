// Layer-name patterns of Quark `exclude` and `layer_quant_config` (spec quark-moe.md §16.3):
// exact names, shell globs with Python fnmatch semantics, and `re:` regexes anchored at the start.
#include <fmt/format.h>

#include <map>
#include <mutex>
#include <regex>
#include <string>
#include <vector>

#include "qmoe/config.h"
#include "qmoe/error.h"

namespace qmoe {

namespace {

constexpr std::string_view kRegexPrefix = "re:";

// One glob token: a literal character, `?`, `*`, or a bracket class.
struct GlobToken {
  enum Kind { Literal, AnyChar, Star, Class } kind = Literal;
  char ch = 0;
  bool negate = false;
  std::vector<std::pair<char, char>> ranges;  // inclusive ranges of a class
};

// Tokenize like Python's fnmatch.translate: `[` without a closing `]` is a literal; `[!..]` negates;
// a `]` right after `[` or `[!` is part of the class; `a-z` is a range. `\` is an ordinary character.
std::vector<GlobToken> tokenize_glob(std::string_view p) {
  std::vector<GlobToken> out;
  const size_t n = p.size();
  size_t i = 0;
  while (i < n) {
    const char c = p[i++];
    GlobToken t;
    if (c == '*') {
      if (out.empty() || out.back().kind != GlobToken::Star) {
        t.kind = GlobToken::Star;
        out.push_back(t);
      }
      continue;
    }
    if (c == '?') {
      t.kind = GlobToken::AnyChar;
      out.push_back(t);
      continue;
    }
    if (c == '[') {
      size_t j = i;
      if (j < n && p[j] == '!') ++j;
      if (j < n && p[j] == ']') ++j;
      while (j < n && p[j] != ']') ++j;
      if (j >= n) {  // no closing bracket: literal '['
        t.ch = '[';
        out.push_back(t);
        continue;
      }
      std::string_view body = p.substr(i, j - i);
      i = j + 1;
      t.kind = GlobToken::Class;
      if (!body.empty() && body[0] == '!') {
        t.negate = true;
        body.remove_prefix(1);
      }
      for (size_t k = 0; k < body.size(); ++k) {
        if (k + 2 < body.size() && body[k + 1] == '-') {
          if (body[k] <= body[k + 2]) t.ranges.emplace_back(body[k], body[k + 2]);
          k += 2;
        } else {
          t.ranges.emplace_back(body[k], body[k]);
        }
      }
      out.push_back(t);
      continue;
    }
    t.ch = c;
    out.push_back(t);
  }
  return out;
}

bool token_matches(const GlobToken& t, char c) {
  switch (t.kind) {
    case GlobToken::Literal: return t.ch == c;
    case GlobToken::AnyChar: return true;
    case GlobToken::Class: {
      bool in = false;
      for (const auto& [lo, hi] : t.ranges) in = in || (c >= lo && c <= hi);
      return in != t.negate;
    }
    case GlobToken::Star: return false;
  }
  return false;
}

// Whole-string glob match; every non-star token consumes one character, so the classic
// backtrack-to-last-star algorithm is exact.
bool glob_matches(std::string_view pattern, std::string_view name) {
  const std::vector<GlobToken> toks = tokenize_glob(pattern);
  size_t ti = 0, ni = 0;
  size_t star_ti = std::string_view::npos, star_ni = 0;
  while (ni < name.size()) {
    if (ti < toks.size() && toks[ti].kind == GlobToken::Star) {
      star_ti = ti++;
      star_ni = ni;
    } else if (ti < toks.size() && token_matches(toks[ti], name[ni])) {
      ++ti;
      ++ni;
    } else if (star_ti != std::string_view::npos) {
      ti = star_ti + 1;
      ni = ++star_ni;
    } else {
      return false;
    }
  }
  while (ti < toks.size() && toks[ti].kind == GlobToken::Star) ++ti;
  return ti == toks.size();
}

bool is_glob(std::string_view p) { return p.find_first_of("*?[") != std::string_view::npos; }

// Compiled regexes, shared by all threads (resolution is called per layer with the same patterns).
const std::regex& compiled_regex(std::string_view pattern) {
  static std::mutex mu;
  static std::map<std::string, std::regex, std::less<>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(pattern);
  if (it != cache.end()) return it->second;
  const std::string body(pattern.substr(kRegexPrefix.size()));
  try {
    return cache.emplace(std::string(pattern), std::regex(body, std::regex::ECMAScript)).first->second;
  } catch (const std::regex_error& e) {
    throw Error(fmt::format("invalid regular expression in layer pattern '{}': {} (patterns starting "
                            "with 're:' are ECMAScript regexes matched at the start of the name)",
                            pattern, e.what()));
  }
}

}  // namespace

bool quark_pattern_matches(std::string_view pattern, std::string_view name) {
  if (pattern.substr(0, kRegexPrefix.size()) == kRegexPrefix) {
    const std::regex& re = compiled_regex(pattern);
    // Like Python re.match: anchored at the start, not required to consume the whole name.
    return std::regex_search(name.begin(), name.end(), re, std::regex_constants::match_continuous);
  }
  if (is_glob(pattern)) return glob_matches(pattern, name);
  return pattern == name;
}

}  // namespace qmoe
