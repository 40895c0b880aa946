#include "model/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "model/weights.h"

namespace kvstream::model {
namespace {

namespace fs = std::filesystem;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kvstream_st_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string WriteRaw(const std::string& name, const std::string& header, size_t data_bytes,
                       int64_t len_override = -1) {
    std::string path = (dir_ / name).string();
    std::ofstream f(path, std::ios::binary);
    uint64_t n = len_override >= 0 ? uint64_t(len_override) : header.size();
    for (int i = 0; i < 8; ++i) f.put(char(n >> (8 * i)));
    f << header;
    f << std::string(data_bytes, '\x01');
    return path;
  }
  Status OpenStatus(const std::string& path) { return SafetensorsFile::Open(path).status(); }

  fs::path dir_;
};

TEST_F(SafetensorsTest, RoundTripAllDTypes) {
  std::vector<float> f32 = {1.5f, -2.25f, 3.0f, 0.f, 1e-3f, 7.f};
  std::vector<uint16_t> f16, bf16;
  for (float x : f32) {
    f16.push_back(F32ToF16(x));
    bf16.push_back(F32ToBf16(x));
  }
  auto bytes = [](const auto& v) {
    return std::as_bytes(std::span(v.data(), v.size()));
  };
  std::vector<TensorToWrite> ts = {
      TensorFromBytes("a.f32", DType::kF32, {2, 3}, bytes(f32)),
      TensorFromBytes("b.f16", DType::kF16, {6}, bytes(f16)),
      TensorFromBytes("c.bf16", DType::kBF16, {3, 1, 2}, bytes(bf16)),
      TensorFromBytes("d.empty", DType::kF32, {0, 4}, {}),
  };
  const std::string path = (dir_ / "m.safetensors").string();
  ASSERT_TRUE(WriteSafetensors(path, ts, {{"format", "pt"}}).ok());
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->names(), (std::vector<std::string>{"a.f32", "b.f16", "c.bf16", "d.empty"}));
  EXPECT_EQ((*f)->metadata().at("format"), "pt");
  auto a = (*f)->Get("a.f32");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->dtype, DType::kF32);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  for (size_t i = 0; i < f32.size(); ++i) EXPECT_EQ(LoadAsF32(a->bytes.data(), DType::kF32, i), f32[i]);
  auto b = (*f)->Get("b.f16");
  ASSERT_TRUE(b.ok());
  for (size_t i = 0; i < f32.size(); ++i) EXPECT_EQ(LoadAsF32(b->bytes.data(), DType::kF16, i), F16ToF32(f16[i]));
  auto c = (*f)->Get("c.bf16");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->shape, (std::vector<int64_t>{3, 1, 2}));
  for (size_t i = 0; i < f32.size(); ++i) EXPECT_EQ(LoadAsF32(c->bytes.data(), DType::kBF16, i), Bf16ToF32(bf16[i]));
  EXPECT_EQ((*f)->Get("d.empty")->bytes.size(), 0u);
  auto missing = (*f)->Get("nope");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nope"), std::string::npos);
  // Header is 8-byte aligned.
  std::ifstream in(path, std::ios::binary);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(in.get())) << (8 * i);
  EXPECT_EQ(n % 8, 0u);
  // Writer refuses a fill of the wrong size.
  std::vector<TensorToWrite> wrong = {TensorFromBytes("x", DType::kF32, {4}, bytes(f32))};
  EXPECT_FALSE(WriteSafetensors((dir_ / "w.safetensors").string(), wrong).ok());
  EXPECT_FALSE(fs::exists(dir_ / "w.safetensors"));
}

TEST_F(SafetensorsTest, MalformedFiles) {
  auto expect = [&](const std::string& path, StatusCode code, const std::string& needle) {
    Status s = OpenStatus(path);
    EXPECT_EQ(s.code(), code) << path << ": " << s.ToString();
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.ToString();
  };
  const std::string ok_hdr = R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  ASSERT_TRUE(OpenStatus(WriteRaw("ok.safetensors", ok_hdr, 8)).ok());
  // Shorter than 8 bytes.
  {
    std::ofstream f(dir_ / "short.safetensors", std::ios::binary);
    f << "abc";
  }
  expect((dir_ / "short.safetensors").string(), StatusCode::kDataLoss, "truncated");
  expect(WriteRaw("hdrlen.safetensors", ok_hdr, 8, 1 << 20), StatusCode::kDataLoss, "past the end");
  expect(WriteRaw("hugelen.safetensors", ok_hdr, 8, int64_t(1) << 62), StatusCode::kDataLoss,
         "past the end");
  expect(WriteRaw("trunc.safetensors", ok_hdr, 5), StatusCode::kDataLoss, "truncated");
  expect(WriteRaw("json.safetensors", R"({"t": {"dtype": )", 0), StatusCode::kInvalidArgument, "JSON");
  expect(WriteRaw("arr.safetensors", "[1,2]", 0), StatusCode::kInvalidArgument, "not an object");
  expect(WriteRaw("dtype.safetensors", R"({"t":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8),
         StatusCode::kNotSupported, "I64");
  expect(WriteRaw("span.safetensors", R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 12),
         StatusCode::kInvalidArgument, "needs 12");
  expect(WriteRaw("rev.safetensors", R"({"t":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8),
         StatusCode::kInvalidArgument, "end < begin");
  expect(WriteRaw("overlap.safetensors",
                  R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                      "b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
         StatusCode::kDataLoss, "overlap");
  expect(WriteRaw("range.safetensors", R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[100,108]}})", 8),
         StatusCode::kDataLoss, "truncated");
  expect(WriteRaw("neg.safetensors", R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
         StatusCode::kInvalidArgument, "shape");
  expect(WriteRaw("offs.safetensors", R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8),
         StatusCode::kInvalidArgument, "data_offsets");
  expect(WriteRaw("meta.safetensors", R"({"__metadata__":{"a":1}})", 0), StatusCode::kInvalidArgument,
         "__metadata__");
  expect((dir_ / "absent.safetensors").string(), StatusCode::kNotFound, "absent");
}

TEST_F(SafetensorsTest, CheckpointDirectoryAndIndex) {
  std::vector<float> x = {1, 2, 3, 4};
  auto bytes = std::as_bytes(std::span(x));
  ASSERT_TRUE(WriteSafetensors((dir_ / "model-00001-of-00002.safetensors").string(),
                               {TensorFromBytes("a", DType::kF32, {4}, bytes)}).ok());
  ASSERT_TRUE(WriteSafetensors((dir_ / "model-00002-of-00002.safetensors").string(),
                               {TensorFromBytes("b", DType::kF32, {2, 2}, bytes)}).ok());
  // Without index: every file in the directory.
  auto ck = SafetensorsCheckpoint::Open(dir_.string());
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  EXPECT_EQ((*ck)->names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE((*ck)->GetChecked("b", {2, 2}).ok());
  auto wrong = (*ck)->GetChecked("b", {4});
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.status().message().find("expected shape [4], got [2, 2]"), std::string::npos)
      << wrong.status().ToString();
  EXPECT_EQ((*ck)->Get("c").status().code(), StatusCode::kNotFound);
  const uint64_t id1 = (*ck)->identity();
  // With an index.
  {
    std::ofstream f(dir_ / "model.safetensors.index.json");
    f << R"({"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                             "b": "model-00002-of-00002.safetensors"}})";
  }
  auto ck2 = SafetensorsCheckpoint::Open(dir_.string());
  ASSERT_TRUE(ck2.ok()) << ck2.status().ToString();
  EXPECT_EQ((*ck2)->names().size(), 2u);
  EXPECT_EQ((*ck2)->identity(), id1);
  {
    std::ofstream f(dir_ / "model.safetensors.index.json");
    f << R"({"weight_map": {"a": "model-00002-of-00002.safetensors"}})";
  }
  EXPECT_EQ(SafetensorsCheckpoint::Open(dir_.string()).status().code(), StatusCode::kDataLoss);
  {
    std::ofstream f(dir_ / "model.safetensors.index.json");
    f << R"({"weight_map": {"a": "missing.safetensors"}})";
  }
  EXPECT_EQ(SafetensorsCheckpoint::Open(dir_.string()).status().code(), StatusCode::kNotFound);
  fs::remove(dir_ / "model.safetensors.index.json");
  // A tensor in two files.
  ASSERT_TRUE(WriteSafetensors((dir_ / "dup.safetensors").string(),
                               {TensorFromBytes("a", DType::kF32, {4}, bytes)}).ok());
  EXPECT_EQ(SafetensorsCheckpoint::Open(dir_.string()).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SafetensorsCheckpoint::Open((dir_ / "nodir").string()).status().code(), StatusCode::kNotFound);
}

TEST_F(SafetensorsTest, HfCheckpointLoadsAndNamesBadTensors) {
  ModelSpec spec;
  spec.model = "tiny";
  spec.seed = 9;
  spec.weight_dtype = DType::kBF16;
  auto dummy = OpenWeights(spec);
  ASSERT_TRUE(dummy.ok());
  const std::string ck_dir = (dir_ / "ck").string();
  ASSERT_TRUE(WriteHfCheckpoint(**dummy, DType::kBF16, ck_dir).ok());
  ModelSpec load = spec;
  load.model = ck_dir;
  auto loaded = OpenWeights(load);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_FALSE((*loaded)->is_dummy());
  EXPECT_EQ((*loaded)->config().num_layers, 2);
  EXPECT_NE((*loaded)->config().weights_id, 0u);
  ASSERT_EQ((*loaded)->tensors().size(), (*dummy)->tensors().size());
  for (size_t i = 0; i < (*dummy)->tensors().size(); ++i) {
    std::vector<std::byte> a, b;
    DType da, db;
    ASSERT_TRUE((*dummy)->ReadRaw((*dummy)->tensors()[i], &a, &da).ok());
    ASSERT_TRUE((*loaded)->ReadRaw((*loaded)->tensors()[i], &b, &db).ok());
    EXPECT_EQ(da, db);
    EXPECT_TRUE(a == b) << (*dummy)->tensors()[i].name;
  }
  // A checkpoint missing a tensor names it; a wrong shape names expected vs got.
  std::vector<TensorToWrite> ts;
  std::vector<std::vector<std::byte>> keep;
  for (const auto& t : (*dummy)->tensors()) {
    if (t.name == "model.layers.1.mlp.up_proj.weight") continue;
    std::vector<int64_t> shape = t.shape;
    if (t.name == "model.norm.weight") shape = {shape[0] / 2, 2};
    keep.emplace_back();
    DType d;
    ASSERT_TRUE((*dummy)->ReadRaw(t, &keep.back(), &d).ok());
    ts.push_back(TensorFromBytes(t.name, d, shape, keep.back()));
  }
  const std::string bad_dir = (dir_ / "bad").string();
  fs::create_directories(bad_dir);
  fs::copy_file(fs::path(ck_dir) / "config.json", fs::path(bad_dir) / "config.json");
  ASSERT_TRUE(WriteSafetensors((fs::path(bad_dir) / "model.safetensors").string(), ts).ok());
  load.model = bad_dir;
  auto bad = OpenWeights(load);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("model.layers.1.mlp.up_proj.weight"), std::string::npos)
      << bad.status().ToString();
  ts.clear();
  // Only the shape error now: add the missing tensor back.
  keep.clear();
  for (const auto& t : (*dummy)->tensors()) {
    std::vector<int64_t> shape = t.shape;
    if (t.name == "model.norm.weight") shape = {shape[0] / 2, 2};
    keep.emplace_back();
    DType d;
    ASSERT_TRUE((*dummy)->ReadRaw(t, &keep.back(), &d).ok());
    ts.push_back(TensorFromBytes(t.name, d, shape, keep.back()));
  }
  ASSERT_TRUE(WriteSafetensors((fs::path(bad_dir) / "model.safetensors").string(), ts).ok());
  auto bad2 = OpenWeights(load);
  ASSERT_FALSE(bad2.ok());
  EXPECT_NE(bad2.status().message().find("model.norm.weight': expected shape [256], got [128, 2]"),
            std::string::npos)
      << bad2.status().ToString();
  // Truncated checkpoint file.
  fs::resize_file(fs::path(ck_dir) / "model.safetensors",
                  fs::file_size(fs::path(ck_dir) / "model.safetensors") - 10);
  load.model = ck_dir;
  auto trunc = OpenWeights(load);
  EXPECT_EQ(trunc.status().code(), StatusCode::kDataLoss) << trunc.status().ToString();
}

}  // namespace
}  // namespace kvstream::model
