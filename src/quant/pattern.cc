// Layer-name patterns of Quark `exclude` and `layer_quant_config` (spec quark-moe.md §16.3):
// exact names, shell globs with Python fnmatch semantics, and `re:` regexes anchored at the start.
#include <fmt/format.h>
#include <re2/re2.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
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

// Longest `re:` pattern accepted (real ones are well under 200 characters).
constexpr size_t kMaxRegexBytes = 4096;
// RE2's memory budget for one compiled pattern (its default is 8 MB).
constexpr int64_t kRegexMaxMem = 8 << 20;

// Python `re` constructs RE2 does not implement, for a clearer message than RE2's.
std::string unsupported_python_syntax(std::string_view body) {
  for (size_t i = 0; i + 1 < body.size(); ++i) {
    if (body[i] == '\\') {
      const char n = body[i + 1];
      if (n >= '1' && n <= '9') return fmt::format("the back-reference '\\{}'", n);
      ++i;  // skip the escaped character
      continue;
    }
    if (body[i] == '(' && body[i + 1] == '?') {
      const std::string_view rest = body.substr(i + 2);
      for (const char* la : {"=", "!", "<=", "<!"})
        if (rest.substr(0, std::strlen(la)) == la) return fmt::format("the look-around '(?{}'", la);
      if (rest.substr(0, 2) == "P=") return "the named back-reference '(?P='";
      if (rest.substr(0, 1) == "(") return "the conditional group '(?('";
    }
  }
  return {};
}

// Compiled regexes, shared by all threads (resolution is called per layer with the same patterns).
// RE2 matches in time linear in the name, with bounded memory and no recursion on the pattern.
// The cache is bounded (a config holds a few patterns; hostile input many): when full it is
// cleared, which is safe because callers hold shared pointers.
std::shared_ptr<const re2::RE2> compiled_regex(std::string_view pattern) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const re2::RE2>, std::less<>> cache;
  constexpr size_t kMaxCached = 1024;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(pattern);
  if (it != cache.end()) return it->second;
  const std::string_view body = pattern.substr(kRegexPrefix.size());
  constexpr std::string_view kSyntax =
      "patterns starting with 're:' are regular expressions in Python re syntax without back-references and "
      "look-around (RE2), matched at the start of the name";
  if (body.size() > kMaxRegexBytes)
    throw Error(fmt::format("invalid regular expression in layer pattern '{}...' ({} bytes): longer than {} bytes",
                            pattern.substr(0, 60), pattern.size(), kMaxRegexBytes));
  if (const std::string bad = unsupported_python_syntax(body); !bad.empty())
    throw Error(fmt::format("unsupported regular expression in layer pattern '{}': {} is not supported ({})", pattern,
                            bad, kSyntax));
  re2::RE2::Options opt;
  opt.set_log_errors(false);
  opt.set_max_mem(kRegexMaxMem);
  auto re = std::make_shared<const re2::RE2>(re2::StringPiece(body.data(), body.size()), opt);
  if (!re->ok())
    throw Error(fmt::format("invalid regular expression in layer pattern '{}': {} ({})", pattern, re->error(),
                            kSyntax));
  if (cache.size() >= kMaxCached) cache.clear();
  return cache.emplace(std::string(pattern), std::move(re)).first->second;
}

}  // namespace

bool quark_pattern_matches(std::string_view pattern, std::string_view name) {
  if (pattern.substr(0, kRegexPrefix.size()) == kRegexPrefix) {
    const std::shared_ptr<const re2::RE2> re = compiled_regex(pattern);
    // Like Python re.match: anchored at the start, not required to consume the whole name.
    return re->Match(re2::StringPiece(name.data(), name.size()), 0, name.size(), re2::RE2::ANCHOR_START, nullptr, 0);
  }
  if (is_glob(pattern)) return glob_matches(pattern, name);
  return pattern == name;
}

}  // namespace qmoe
