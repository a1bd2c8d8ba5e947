// SafetensorsFile: header validation (every rule has a failing case), views, open() errors.
#include <gtest/gtest.h>

#include <string>

#include "io_test_util.h"

namespace qmoe::test {
namespace {

// Message of parsing `header` followed by `data_size` bytes; "" when it parsed.
std::string header_error(const std::string& header, size_t data_size) {
  return error_of([&] { parse_bytes(make_raw(header, data_size), "bad.safetensors"); });
}

std::string one_tensor(const std::string& body) { return R"({"t":)" + body + "}"; }

#define EXPECT_HAS(msg, needle) EXPECT_NE((msg).find(needle), std::string::npos) << "message: " << (msg)

TEST(SafetensorsRead, ParsesValidHeaderInOrder) {
  const std::string header =
      R"({"z":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"format":"pt"},)"
      R"("a":{"dtype":"U8","shape":[2,2],"data_offsets":[8,12],"extra":1}})";
  auto f = parse_bytes(make_raw(header, 12));
  ASSERT_EQ(f->tensors().size(), 2u);
  EXPECT_EQ(f->tensors()[0].name, "z");  // header order, not alphabetical
  EXPECT_EQ(f->tensors()[1].name, "a");
  EXPECT_EQ(f->metadata().at("format"), "pt");
  const TensorInfo* a = f->find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, DType::U8);
  EXPECT_EQ(a->shape, (Shape{2, 2}));
  EXPECT_EQ(a->begin, 8u);
  EXPECT_EQ(a->end, 12u);
  EXPECT_EQ(f->find("missing"), nullptr);
  EXPECT_HAS(error_of([&] { f->get("missing"); }), "'missing' not found in mem.safetensors");

  Tensor v = f->get("a");
  EXPECT_EQ(v.nbytes(), 4u);
  EXPECT_EQ(static_cast<int>(v.data_as<uint8_t>()[0]), 8);  // data byte i holds i
  EXPECT_EQ(static_cast<int>(v.data_as<uint8_t>()[3]), 11);
  EXPECT_THROW(v.mutable_data(), Error);  // a read-only view
}

TEST(SafetensorsRead, ViewsOutliveTheFile) {
  TempDir dir;
  const std::string path = dir.file("a.safetensors");
  write_safetensors(path, {{"x", Tensor::from_f32({1.f, 2.f, 3.f}, {3})}});
  Tensor v;
  {
    auto f = SafetensorsFile::open(path);
    v = f->get("x");
  }
  fs::remove(path);  // the mapping stays valid while a view holds it
  EXPECT_EQ(v.data_as<float>()[2], 3.f);
}

TEST(SafetensorsRead, RejectsGapsTrailingBytesAndDuplicateKeysAcceptsEmptyTensors) {
  // checkpoint-format.md §6 (issue #10): contiguous from 0 to the end, unique names. A gap between
  // [0,4] and [8,12], trailing bytes, an empty tensor inside another's range are all errors.
  EXPECT_HAS(header_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                          R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                          12),
             "no gaps");
  EXPECT_HAS(header_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 16), "after the last tensor");
  EXPECT_HAS(header_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                          R"("e":{"dtype":"F32","shape":[0,5],"data_offsets":[2,2]}})",
                          4),
             "overlap");
  EXPECT_EQ(header_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                         R"("e":{"dtype":"F32","shape":[0,5],"data_offsets":[4,4]}})",
                         4),
            "");
  // Zero dimension with a huge other dimension has 0 elements.
  EXPECT_EQ(header_error(one_tensor(R"({"dtype":"F32","shape":[0,9223372036854775807],"data_offsets":[0,0]})"), 0),
            "");
  EXPECT_HAS(header_error(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                          R"("a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})",
                          2),
             "'a' appears more than once");
}

TEST(SafetensorsRead, RejectsShortFilesAndBadHeaderLength) {
  std::string m = error_of([] { parse_bytes({1, 2, 3}, "tiny.safetensors"); });
  EXPECT_HAS(m, "tiny.safetensors");
  EXPECT_HAS(m, "too short");
  EXPECT_HAS(m, "3 bytes");
  EXPECT_HAS(error_of([] { parse_bytes({}); }), "too short");

  std::vector<uint8_t> bytes;
  put_le64(bytes, 100);
  bytes.resize(20, ' ');
  m = error_of([&] { parse_bytes(bytes); });
  EXPECT_HAS(m, "truncated");
  EXPECT_HAS(m, "header length 100");
  EXPECT_HAS(m, "file size is 20");

  bytes.clear();
  put_le64(bytes, 100'000'001);
  bytes.resize(64, ' ');
  m = error_of([&] { parse_bytes(bytes); });
  EXPECT_HAS(m, "100000001");
  EXPECT_HAS(m, "exceeds");

  bytes.clear();
  put_le64(bytes, ~0ull);  // would overflow 8 + N
  bytes.resize(64, ' ');
  EXPECT_HAS(error_of([&] { parse_bytes(bytes); }), "exceeds");
}

TEST(SafetensorsRead, RejectsInvalidJson) {
  std::string m = header_error("{not json", 0);
  EXPECT_HAS(m, "invalid JSON header in bad.safetensors");
  EXPECT_HAS(header_error("{\"a\":1} trailing", 0), "invalid JSON header");
  EXPECT_HAS(header_error("", 0), "invalid JSON header");
  EXPECT_HAS(header_error("{\"\xff\":1}", 0), "invalid JSON header");  // not UTF-8
  EXPECT_HAS(header_error(std::string(5000, '[') + std::string(5000, ']'), 0), "nested deeper");
  EXPECT_HAS(header_error("[1,2]", 0), "expected a JSON object, found array");
  EXPECT_HAS(header_error("\"str\"", 0), "expected a JSON object, found string");
}

TEST(SafetensorsRead, RejectsBadTensorEntries) {
  EXPECT_HAS(header_error(R"({"t":5})", 0), "tensor 't' in bad.safetensors must be a JSON object");
  EXPECT_HAS(header_error(one_tensor(R"({"shape":[1],"data_offsets":[0,4]})"), 4), "no \"dtype\" field");
  EXPECT_HAS(header_error(one_tensor(R"({"dtype":"F32","data_offsets":[0,4]})"), 4), "no \"shape\" field");
  EXPECT_HAS(header_error(one_tensor(R"({"dtype":"F32","shape":[1]})"), 4), "no \"data_offsets\" field");

  std::string m = header_error(one_tensor(R"({"dtype":"F128","shape":[1],"data_offsets":[0,16]})"), 16);
  EXPECT_HAS(m, "unknown dtype \"F128\"");
  EXPECT_HAS(m, "tensor 't'");
  EXPECT_HAS(header_error(one_tensor(R"({"dtype":"f32","shape":[1],"data_offsets":[0,4]})"), 4), "unknown dtype");
  EXPECT_HAS(header_error(one_tensor(R"({"dtype":7,"shape":[1],"data_offsets":[0,4]})"), 4),
             "dtype must be a string");
}

TEST(SafetensorsRead, RejectsBadShapes) {
  for (const char* shape : {R"("2")", "[1.5]", R"(["2"])", "[-1]", "[null]", "{}", "[[2]]", "[1e3]",
                            "[18446744073709551616]"}) {
    SCOPED_TRACE(shape);
    const std::string m =
        header_error(one_tensor(std::string(R"({"dtype":"U8","shape":)") + shape + R"(,"data_offsets":[0,2]})"), 2);
    EXPECT_HAS(m, "shape");
    EXPECT_HAS(m, "non-negative integers");
  }
  // Dimension beyond int64.
  EXPECT_HAS(header_error(one_tensor(R"({"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,2]})"), 2),
             "non-negative integers");
  // Element count overflows 64 bits.
  EXPECT_HAS(header_error(one_tensor(R"({"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,2]})"), 2),
             "overflows");
  EXPECT_HAS(header_error(one_tensor(R"({"dtype":"U8","shape":[9223372036854775807,2,0],"data_offsets":[0,0]})"), 0),
             "overflows");
  // Element count × bits overflows.
  EXPECT_HAS(header_error(one_tensor(R"({"dtype":"U64","shape":[4611686018427387904],"data_offsets":[0,8]})"), 8),
             "too large");
}

TEST(SafetensorsRead, RejectsBadOffsets) {
  for (const char* off : {R"("0,4")", "[0]", "[0,4,8]", "[-1,3]", "[0,4.0]", "[4,0]", "[null,4]", "{}"}) {
    SCOPED_TRACE(off);
    const std::string m =
        header_error(one_tensor(std::string(R"({"dtype":"F32","shape":[1],"data_offsets":)") + off + "}"), 8);
    EXPECT_HAS(m, "data_offsets must be [begin, end]");
    EXPECT_HAS(m, "tensor 't'");
  }
}

TEST(SafetensorsRead, RejectsSizeMismatch) {
  std::string m = header_error(one_tensor(R"({"dtype":"F32","shape":[2,3],"data_offsets":[0,20]})"), 24);
  EXPECT_HAS(m, "tensor 't'");
  EXPECT_HAS(m, "[2, 3]");
  EXPECT_HAS(m, "F32");
  EXPECT_HAS(m, "needs 24 bytes");
  EXPECT_HAS(m, "span 20 bytes");
  // F4: 3 elements = 12 bits, not whole bytes; F6: 4 elements = 3 bytes.
  EXPECT_HAS(header_error(one_tensor(R"({"dtype":"F4","shape":[3],"data_offsets":[0,2]})"), 2),
             "not a whole number of bytes");
  EXPECT_EQ(header_error(one_tensor(R"({"dtype":"F6_E2M3","shape":[4],"data_offsets":[0,3]})"), 3), "");
  EXPECT_HAS(header_error(one_tensor(R"({"dtype":"F6_E2M3","shape":[4],"data_offsets":[0,4]})"), 4), "needs 3 bytes");
}

TEST(SafetensorsRead, RangePastEndIsTruncated) {
  std::string m = header_error(one_tensor(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]})"), 4);
  EXPECT_HAS(m, "truncated");
  EXPECT_HAS(m, "tensor 't'");
  EXPECT_HAS(m, "[0, 8]");
  EXPECT_HAS(m, "holds only 4 bytes");
  // Offsets far beyond the buffer (no overflow in end - begin arithmetic).
  m = header_error(one_tensor(R"({"dtype":"U8","shape":[1],"data_offsets":[18446744073709551614,18446744073709551615]})"),
                   4);
  EXPECT_HAS(m, "truncated");
}

TEST(SafetensorsRead, RejectsOverlaps) {
  std::string m = header_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                               R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                               12);
  EXPECT_HAS(m, "overlap");
  EXPECT_HAS(m, "'a'");
  EXPECT_HAS(m, "'b'");
  EXPECT_HAS(header_error(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                          R"("b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})",
                          4),
             "overlap");
}

TEST(SafetensorsRead, RejectsBadMetadata) {
  EXPECT_HAS(header_error(R"({"__metadata__":"pt"})", 0), "__metadata__ in bad.safetensors must be a JSON object");
  EXPECT_HAS(header_error(R"({"__metadata__":[1]})", 0), "must be a JSON object");
  std::string m = header_error(R"({"__metadata__":{"format":"pt","n":1}})", 0);
  EXPECT_HAS(m, "__metadata__ entry 'n'");
  EXPECT_HAS(m, "must be a string");
  EXPECT_HAS(header_error(R"({"__metadata__":{"x":{"y":"z"}}})", 0), "must be a string");
}

TEST(SafetensorsRead, OpenErrors) {
  TempDir dir;
  EXPECT_HAS(error_of([&] { SafetensorsFile::open(dir.file("nope.safetensors")); }), "cannot open");
  EXPECT_HAS(error_of([&] { SafetensorsFile::open(dir.path().string()); }), "is a directory; expected a regular file");
  write_bytes(dir.file("empty.safetensors"), {});
  EXPECT_HAS(error_of([&] { SafetensorsFile::open(dir.file("empty.safetensors")); }), "too short");
  write_bytes(dir.file("bad.safetensors"), make_raw(one_tensor(R"({"dtype":"F32","shape":[4],"data_offsets":[0,16]})"), 8));
  std::string m = error_of([&] { SafetensorsFile::open(dir.file("bad.safetensors")); });
  EXPECT_HAS(m, dir.file("bad.safetensors"));
  EXPECT_HAS(m, "truncated");
}

}  // namespace
}  // namespace qmoe::test
