// write_safetensors / write_safetensors_index: round trips, exact header bytes, errors.
#include <gtest/gtest.h>

#include <cstring>

#include "io_test_util.h"

namespace qmoe::test {
namespace {

constexpr DType kAllDTypes[] = {
    DType::BOOL, DType::F4,  DType::F6_E2M3, DType::F6_E3M2, DType::U8,   DType::I8,  DType::F8_E5M2,
    DType::F8_E4M3, DType::F8_E8M0, DType::I16, DType::U16, DType::F16, DType::BF16, DType::I32,
    DType::U32, DType::F32, DType::C64, DType::F64, DType::I64, DType::U64,
};

Tensor patterned(DType d, Shape shape, int salt) {
  Tensor t = Tensor::zeros(d, std::move(shape));
  std::byte* p = t.mutable_data();
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<std::byte>((i * 31 + static_cast<size_t>(salt) * 7 + 1) & 0xff);
  return t;
}

std::string header_of(const std::vector<uint8_t>& bytes) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes.at(static_cast<size_t>(i));
  return std::string(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n));
}

TEST(SafetensorsWrite, RoundTripEveryDTypeWithMetadata) {
  TempDir dir;
  std::vector<NamedTensor> tensors;
  int salt = 0;
  for (DType d : kAllDTypes) {
    // [2, 4]: 8 elements, a whole number of bytes for every bit size (4, 6, 8..64).
    tensors.push_back({"t." + std::string(dtype_name(d)), patterned(d, {2, 4}, salt++)});
  }
  tensors.push_back({"empty", Tensor::zeros(DType::F32, {0, 3})});
  tensors.push_back({"empty_f4", Tensor::zeros(DType::F4, {4, 0})});
  tensors.push_back({"scalar", Tensor::from_f32({2.5f}, {})});
  const std::map<std::string, std::string> meta{{"format", "pt"}, {"note", "qmoe \"test\"\n"}};
  const std::string path = dir.file("all.safetensors");
  write_safetensors(path, tensors, meta);
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f->path(), path);
  EXPECT_EQ(f->metadata(), meta);
  ASSERT_EQ(f->tensors().size(), tensors.size());
  for (const auto& nt : tensors) {
    SCOPED_TRACE(nt.name);
    const TensorInfo* info = f->find(nt.name);
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(info->dtype, nt.tensor.dtype());
    EXPECT_EQ(info->shape, nt.tensor.shape());
    const uint64_t expected_bytes = static_cast<uint64_t>(nt.tensor.numel()) * dtype_bits(nt.tensor.dtype()) / 8;
    EXPECT_EQ(info->end - info->begin, expected_bytes);
    Tensor v = f->get(nt.name);
    EXPECT_EQ(v.dtype(), nt.tensor.dtype());
    EXPECT_EQ(v.shape(), nt.tensor.shape());
    ASSERT_EQ(v.nbytes(), nt.tensor.nbytes());
    if (v.nbytes()) {
      EXPECT_EQ(std::memcmp(v.data(), nt.tensor.data(), v.nbytes()), 0);
    }
  }
  EXPECT_EQ(f->find("t.F4")->end - f->find("t.F4")->begin, 4u);
  EXPECT_EQ(f->find("t.F6_E2M3")->end - f->find("t.F6_E2M3")->begin, 6u);
  EXPECT_EQ(f->find("t.U64")->end - f->find("t.U64")->begin, 64u);
  EXPECT_FLOAT_EQ(f->get("scalar").data_as<float>()[0], 2.5f);
}

TEST(SafetensorsWrite, HeaderIsRustOrderCompactAndSpacePadded) {
  TempDir dir;
  const std::string path = dir.file("order.safetensors");
  write_safetensors(path, {{"b", Tensor::from_f32({1.f}, {1})},
                           {"z", patterned(DType::U8, {3}, 1)},
                           {"c", patterned(DType::BF16, {1}, 2)},
                           {"a", Tensor::from_f32({2.f, 3.f}, {2})}});
  const auto bytes = read_bytes(path);
  const std::string expected_json =
      R"({"__metadata__":{"format":"pt"},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},)"
      R"("c":{"dtype":"BF16","shape":[1],"data_offsets":[12,14]},)"
      R"("z":{"dtype":"U8","shape":[3],"data_offsets":[14,17]}})";
  const std::string header = header_of(bytes);
  EXPECT_EQ(header.size() % 8, 0u);
  EXPECT_EQ(header.substr(0, expected_json.size()), expected_json);
  EXPECT_EQ(header.size(), (expected_json.size() + 7) / 8 * 8);
  EXPECT_EQ(header.substr(expected_json.size()), std::string(header.size() - expected_json.size(), ' '));
  ASSERT_EQ(bytes.size(), 8 + header.size() + 17);
  // Data in header order: a (2.f, 3.f), b (1.f), c, z.
  float a[2];
  std::memcpy(a, bytes.data() + 8 + header.size(), 8);
  EXPECT_EQ(a[0], 2.f);
  EXPECT_EQ(a[1], 3.f);

  auto f = SafetensorsFile::open(path);
  std::vector<std::string> names;
  for (const auto& t : f->tensors()) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"a", "b", "c", "z"}));
}

TEST(SafetensorsWrite, EmptyFileWithoutMetadata) {
  TempDir dir;
  const std::string path = dir.file("empty.safetensors");
  write_safetensors(path, {}, {});
  const auto bytes = read_bytes(path);
  EXPECT_EQ(bytes, make_raw("{}      ", 0));
  auto f = SafetensorsFile::open(path);
  EXPECT_TRUE(f->tensors().empty());
  EXPECT_TRUE(f->metadata().empty());
}

TEST(SafetensorsWrite, NamesAreJsonEscaped) {
  TempDir dir;
  const std::string path = dir.file("names.safetensors");
  const std::string odd = "we\"ird\\name\n\x01/\xc3\xa9";
  write_safetensors(path, {{odd, Tensor::from_f32({1.f}, {1})}});
  const std::string header = header_of(read_bytes(path));
  EXPECT_NE(header.find(R"("we\"ird\\name\n\u0001/)" "\xc3\xa9\""), std::string::npos) << header;
  auto f = SafetensorsFile::open(path);
  ASSERT_NE(f->find(odd), nullptr);
  EXPECT_EQ(f->get(odd).data_as<float>()[0], 1.f);
}

TEST(SafetensorsWrite, OverwritesAtomically) {
  TempDir dir;
  const std::string path = dir.file("x.safetensors");
  write_safetensors(path, {{"a", Tensor::from_f32({1.f}, {1})}});
  write_safetensors(path, {{"b", Tensor::from_f32({2.f, 3.f}, {2})}});
  auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f->find("a"), nullptr);
  EXPECT_EQ(f->get("b").data_as<float>()[1], 3.f);
}

TEST(SafetensorsWrite, Errors) {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  auto expect_error = [&](const std::vector<NamedTensor>& ts, const std::string& needle) {
    const std::string msg = error_of([&] { write_safetensors(path, ts); });
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_FALSE(fs::exists(path));
    EXPECT_FALSE(fs::exists(path + ".tmp"));
  };
  expect_error({{"f4", Tensor::zeros(DType::F4, {3})}}, "whole number of bytes");
  expect_error({{"f6", Tensor::zeros(DType::F6_E3M2, {2})}}, "whole number of bytes");
  expect_error({{"a", Tensor::from_f32({1.f}, {1})}, {"a", Tensor::from_f32({1.f}, {1})}}, "appears twice");
  expect_error({{"__metadata__", Tensor::from_f32({1.f}, {1})}}, "reserved");
  expect_error({{"u", Tensor()}}, "undefined");
  expect_error({{"bad\xff", Tensor::from_f32({1.f}, {1})}}, "UTF-8");

  const std::string missing = (dir.path() / "no_such_dir" / "x.safetensors").string();
  const std::string msg = error_of([&] { write_safetensors(missing, {{"a", Tensor::from_f32({1.f}, {1})}}); });
  EXPECT_NE(msg.find("cannot create"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(dir.path() / "no_such_dir"));
}

TEST(SafetensorsWrite, IndexMatchesTransformersJsonDump) {
  TempDir dir;
  const std::string path = dir.file("model.safetensors.index.json");
  write_safetensors_index(path,
                          {{"b.weight", "model-00002-of-00002.safetensors"},
                           {"a.weight", "model-00001-of-00002.safetensors"}},
                          40, 10);
  const auto bytes = read_bytes(path);
  const std::string text(bytes.begin(), bytes.end());
  EXPECT_EQ(text,
            "{\n"
            "  \"metadata\": {\n"
            "    \"total_parameters\": 10,\n"
            "    \"total_size\": 40\n"
            "  },\n"
            "  \"weight_map\": {\n"
            "    \"a.weight\": \"model-00001-of-00002.safetensors\",\n"
            "    \"b.weight\": \"model-00002-of-00002.safetensors\"\n"
            "  }\n"
            "}\n");
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  write_safetensors_index(path, {{"\xc3\xa9", "m.safetensors"}}, 0, 0);
  const auto bytes2 = read_bytes(path);
  const std::string text2(bytes2.begin(), bytes2.end());
  EXPECT_NE(text2.find("\"\\u00e9\": \"m.safetensors\""), std::string::npos) << text2;  // Python ensure_ascii
}

TEST(SafetensorsWrite, ConformanceFilesRewriteLosslessly) {
  // Not byte-identical: the conformance generator orders tensors by element size then name,
  // while write_safetensors follows the Rust writer (dtype enum order), e.g. F32 before I32.
  TempDir dir;
  int checked = 0;
  for (const auto& entry : fs::directory_iterator(conformance_dir())) {
    for (const char* file : {"model.safetensors", "io.safetensors"}) {
      const fs::path p = entry.path() / file;
      if (!fs::exists(p) || entry.path().filename() == "err_truncated_safetensors") continue;
      SCOPED_TRACE(p.string());
      auto f = SafetensorsFile::open(p.string());
      std::vector<NamedTensor> ts;
      for (const auto& t : f->tensors()) ts.push_back({t.name, f->get(t.name)});
      const std::string out = dir.file("rewrite.safetensors");
      write_safetensors(out, ts, f->metadata());
      auto g = SafetensorsFile::open(out);
      EXPECT_EQ(g->metadata(), f->metadata());
      ASSERT_EQ(g->tensors().size(), f->tensors().size());
      for (const auto& t : f->tensors()) {
        const Tensor a = f->get(t.name);
        const Tensor b = g->get(t.name);
        EXPECT_EQ(b.dtype(), a.dtype()) << t.name;
        EXPECT_EQ(b.shape(), a.shape()) << t.name;
        ASSERT_EQ(b.nbytes(), a.nbytes()) << t.name;
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0) << t.name;
      }
      // Data written in Rust order: dtype descending, then name.
      for (size_t i = 1; i < g->tensors().size(); ++i) {
        const TensorInfo& x = g->tensors()[i - 1];
        const TensorInfo& y = g->tensors()[i];
        EXPECT_TRUE(x.dtype > y.dtype || (x.dtype == y.dtype && x.name < y.name)) << x.name << " / " << y.name;
        EXPECT_EQ(x.end, y.begin);
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 10);
}

}  // namespace
}  // namespace qmoe::test
