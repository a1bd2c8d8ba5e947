// Deterministic mutation fuzzing of SafetensorsFile::from_bytes: every mutated input is either
// accepted with all views inside the buffer, or rejected with qmoe::Error — never a crash
// (CI runs this under ASan/UBSan). tests/fuzz/fuzz_safetensors.cc is the libFuzzer version.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <random>

#include "io_test_util.h"

namespace qmoe::test {
namespace {

uint64_t get_len(const std::vector<uint8_t>& b) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | b[static_cast<size_t>(i)];
  return n;
}

void set_len(std::vector<uint8_t>& b, uint64_t n) {
  for (int i = 0; i < 8; ++i) b[static_cast<size_t>(i)] = static_cast<uint8_t>(n >> (8 * i));
}

// The header's [8, 8+N) region clipped to the buffer; empty when there is none.
std::pair<size_t, size_t> header_span(const std::vector<uint8_t>& b) {
  if (b.size() < 8) return {8, 8};
  const uint64_t n = get_len(b);
  return {8, static_cast<size_t>(std::min<uint64_t>(8 + std::min<uint64_t>(n, b.size()), b.size()))};
}

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}

  void mutate(std::vector<uint8_t>& b) {
    switch (pick(10)) {
      case 0:  // flip one bit anywhere
        if (!b.empty()) b[pick(b.size())] ^= static_cast<uint8_t>(1u << pick(8));
        break;
      case 1: {  // overwrite a header byte with a JSON-significant character or a random byte
        static const std::string kChars = "{}[]\",:-0123456789eE.\\ nt";
        auto [lo, hi] = header_span(b);
        if (hi > lo) b[lo + pick(hi - lo)] = pick(4) ? static_cast<uint8_t>(kChars[pick(kChars.size())])
                                                      : static_cast<uint8_t>(pick(256));
        break;
      }
      case 2:  // truncate
        b.resize(pick(b.size() + 1));
        break;
      case 3:  // edit the header length
        if (b.size() >= 8) {
          const uint64_t n = get_len(b);
          const uint64_t choices[] = {n + 1 + pick(16), n - 1 - pick(std::min<uint64_t>(n, 16)), rng_(),
                                      pick(b.size() + 1), 0, 100'000'001, 100'000'000, ~0ull};
          set_len(b, choices[pick(std::size(choices))]);
        }
        break;
      case 4: {  // change one digit in the header (shapes and offsets), keeping the length
        auto [lo, hi] = header_span(b);
        std::vector<size_t> digits;
        for (size_t i = lo; i < hi; ++i)
          if (b[i] >= '0' && b[i] <= '9') digits.push_back(i);
        if (!digits.empty()) b[digits[pick(digits.size())]] = static_cast<uint8_t>('0' + pick(10));
        break;
      }
      case 5: {  // insert a token into the header, keeping the length field consistent
        static const char* kTokens[] = {"-", "1", "0", "99999999999999999999", "18446744073709551615", "1.5", "null",
                                        "\"", "[", "]", "{", "}", ",", "\"F4\"", "[]", "{}", "\"shape\":[]",
                                        "\"__metadata__\":{\"a\":1},", "\"x\":{\"dtype\":\"U8\",\"shape\":[1],"
                                        "\"data_offsets\":[0,1]},"};
        auto [lo, hi] = header_span(b);
        if (hi <= lo) break;
        const std::string tok = kTokens[pick(std::size(kTokens))];
        const size_t at = lo + pick(hi - lo + 1);
        b.insert(b.begin() + static_cast<std::ptrdiff_t>(at), tok.begin(), tok.end());
        set_len(b, get_len(b) + tok.size());
        break;
      }
      case 6: {  // delete a few header bytes, keeping the length field consistent
        auto [lo, hi] = header_span(b);
        if (hi <= lo) break;
        const size_t at = lo + pick(hi - lo);
        const size_t n = std::min<size_t>(1 + pick(8), hi - at);
        b.erase(b.begin() + static_cast<std::ptrdiff_t>(at), b.begin() + static_cast<std::ptrdiff_t>(at + n));
        set_len(b, get_len(b) - n);
        break;
      }
      case 7: {  // swap a dtype name for another one
        static const char* kNames[] = {"F32", "BF16", "F4", "F6_E3M2", "U8", "I64", "F64", "BOOL", "F8_E8M0", "XX"};
        auto [lo, hi] = header_span(b);
        std::string h(b.begin() + static_cast<std::ptrdiff_t>(lo), b.begin() + static_cast<std::ptrdiff_t>(hi));
        const size_t pos = h.find("\"dtype\":\"", pick(h.size() + 1));
        if (pos == std::string::npos) break;
        const size_t start = pos + 9, end = h.find('"', start);
        if (end == std::string::npos) break;
        const std::string name = kNames[pick(std::size(kNames))];
        h.replace(start, end - start, name);
        b.erase(b.begin() + static_cast<std::ptrdiff_t>(lo), b.begin() + static_cast<std::ptrdiff_t>(hi));
        b.insert(b.begin() + static_cast<std::ptrdiff_t>(lo), h.begin(), h.end());
        set_len(b, get_len(b) - (hi - lo) + h.size());
        break;
      }
      case 8:  // append bytes
        for (size_t n = 1 + pick(32); n > 0; --n) b.push_back(static_cast<uint8_t>(pick(256)));
        break;
      default:  // random byte anywhere
        if (!b.empty()) b[pick(b.size())] = static_cast<uint8_t>(pick(256));
        break;
    }
  }

 private:
  uint64_t pick(uint64_t n) { return n == 0 ? 0 : rng_() % n; }
  std::mt19937_64 rng_;
};

// Parses `bytes` from an exact-size heap copy; on success checks every view lies inside it.
// Returns true when accepted.
bool check_input(const std::vector<uint8_t>& bytes) {
  const size_t size = bytes.size();
  std::shared_ptr<uint8_t[]> buf(new uint8_t[size ? size : 1]);
  std::copy(bytes.begin(), bytes.end(), buf.get());
  std::shared_ptr<SafetensorsFile> f;
  try {
    f = SafetensorsFile::from_bytes(std::shared_ptr<const void>(buf, buf.get()), buf.get(), size, "fuzz");
  } catch (const Error&) {
    return false;
  }
  const uint64_t n = get_len(bytes);
  const std::byte* data_begin = reinterpret_cast<const std::byte*>(buf.get()) + 8 + n;
  const std::byte* data_end = reinterpret_cast<const std::byte*>(buf.get()) + size;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& t : f->tensors()) {
    EXPECT_LE(t.begin, t.end) << t.name;
    EXPECT_LE(t.end, static_cast<uint64_t>(data_end - data_begin)) << t.name;
    Tensor v = f->get(t.name);
    EXPECT_EQ(v.nbytes(), t.end - t.begin) << t.name;
    EXPECT_EQ(v.numel(), shape_numel(t.shape));
    EXPECT_GE(v.data(), data_begin);
    EXPECT_LE(v.data() + v.nbytes(), data_end);
    unsigned sum = 0;  // touch every byte: ASan reports any read outside the buffer
    for (size_t i = 0; i < v.nbytes(); ++i) sum += static_cast<unsigned>(v.data()[i]);
    (void)sum;
    if (t.end > t.begin) ranges.emplace_back(t.begin, t.end);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) EXPECT_LE(ranges[i - 1].second, ranges[i].first);
  return true;
}

TEST(SafetensorsFuzz, SeededMutationsAreAcceptedSafelyOrRejected) {
  TempDir dir;
  const std::string path = dir.file("seed.safetensors");
  write_safetensors(path,
                    {{"w", Tensor::from_f32({1, 2, 3, 4, 5, 6}, {2, 3})},
                     {"b", Tensor::zeros(DType::BF16, {4})},
                     {"q", Tensor::zeros(DType::F4, {2, 4})},
                     {"s", Tensor::zeros(DType::F6_E3M2, {4})},
                     {"e", Tensor::zeros(DType::U8, {0, 4})},
                     {"i", Tensor::zeros(DType::I64, {})}},
                    {{"format", "pt"}, {"k", "v"}});
  const std::vector<uint8_t> seed = read_bytes(path);
  ASSERT_TRUE(check_input(seed));

  const int iterations = std::getenv("QMOE_TEST_SMALL") ? 1000 : 3000;
  Mutator mutator(20240531);
  std::mt19937_64 count_rng(7);
  int accepted = 0;
  int rejected = 0;
  for (int it = 0; it < iterations && !HasFailure(); ++it) {
    std::vector<uint8_t> bytes = seed;
    for (int m = 1 + static_cast<int>(count_rng() % 3); m > 0; --m) mutator.mutate(bytes);
    SCOPED_TRACE(::testing::Message() << "iteration " << it);
    (check_input(bytes) ? accepted : rejected)++;
  }
  RecordProperty("accepted", accepted);
  RecordProperty("rejected", rejected);
  // Both outcomes must occur, or the mutations are not exercising the validator.
  EXPECT_GT(accepted, iterations / 50) << "accepted " << accepted << ", rejected " << rejected;
  EXPECT_GT(rejected, iterations / 2) << "accepted " << accepted << ", rejected " << rejected;
}

}  // namespace
}  // namespace qmoe::test
