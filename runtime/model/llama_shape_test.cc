#include "runtime/model/llama_shape.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

TEST(LlamaShapeTest, DefaultIsThe1BShape) {
  const LlamaShape s = LlamaShape::Llama1B();
  EXPECT_EQ(s.hidden, 2048);
  EXPECT_EQ(s.layers, 16);
  EXPECT_EQ(s.heads, 32);
  EXPECT_EQ(s.kv_heads, 8);
  EXPECT_EQ(s.head_dim, 64);
  EXPECT_EQ(s.ffn, 8192);
  EXPECT_EQ(s.vocab, 128256);
  EXPECT_TRUE(s.tie_embeddings);
  EXPECT_EQ(s.rope_theta, 500000.0);
  // Llama 3.2 1B's config.json: rope_scaling llama3, factor 32, low 1, high 4, original 8192.
  EXPECT_EQ(s.rope_scaling, RopeScaling::Llama3(32.0, 1.0, 4.0, 8192));
  EXPECT_TRUE(s.Validate().ok());
  EXPECT_EQ(s.qkv_rows(), 3072);
  EXPECT_EQ(s.kv_width(), 512);
  // Llama 3.2 1B has 1,235,814,400 parameters.
  EXPECT_EQ(s.ParameterCount(), 1235814400);
}

TEST(LlamaShapeTest, TinyIsValidAndUntied) {
  const LlamaShape s = LlamaShape::Tiny();
  EXPECT_TRUE(s.Validate().ok());
  EXPECT_FALSE(s.rope_scaling.enabled());
  EXPECT_EQ(s.layers, 2);
  EXPECT_FALSE(s.tie_embeddings);
  EXPECT_EQ(s.heads * s.head_dim, s.hidden);
  const int64_t tied_params = [&] {
    LlamaShape t = s;
    t.tie_embeddings = true;
    return t.ParameterCount();
  }();
  EXPECT_EQ(s.ParameterCount() - tied_params, int64_t{s.vocab} * s.hidden);
}

TEST(LlamaShapeTest, ValidateNamesTheBadField) {
  LlamaShape s = LlamaShape::Tiny();
  s.kv_heads = 3;
  EXPECT_THAT(std::string(s.Validate().message()), HasSubstr("not a multiple of kv_heads 3"));
  s = LlamaShape::Tiny();
  s.layers = 0;
  EXPECT_THAT(std::string(s.Validate().message()), HasSubstr("LlamaShape.layers is 0"));
  s = LlamaShape::Tiny();
  s.head_dim = 66;
  EXPECT_THAT(std::string(s.Validate().message()), HasSubstr("head_dim is 66"));
  s = LlamaShape::Tiny();
  s.head_dim = 258;
  EXPECT_EQ(s.Validate().code(), absl::StatusCode::kInvalidArgument);
  s = LlamaShape::Tiny();
  s.hidden = 260;
  EXPECT_THAT(std::string(s.Validate().message()), HasSubstr("hidden is 260"));
  s = LlamaShape::Tiny();
  s.rms_eps = 0.0;
  EXPECT_THAT(std::string(s.Validate().message()), HasSubstr("rms_eps"));
  s = LlamaShape::Tiny();
  s.rope_theta = 0.5;
  EXPECT_THAT(std::string(s.Validate().message()), HasSubstr("rope_theta"));
  EXPECT_EQ(s.Validate().code(), absl::StatusCode::kInvalidArgument);
  s = LlamaShape::Tiny();
  s.rope_scaling = RopeScaling::Llama3(8.0, 1.0, 4.0, -1);
  EXPECT_THAT(std::string(s.Validate().message()),
              HasSubstr("LlamaShape.rope_scaling: RoPE scaling original_max_position is -1"));
}

// Sizes whose products overflow (heads + 2 kv_heads in int, QKV rows x hidden, a layer count
// that would build billions of tensors) are refused instead of wrapping into a small shape.
TEST(LlamaShapeTest, ValidateRefusesSizesBeyondAnyModel) {
  LlamaShape s = LlamaShape::Tiny();
  s.heads = 1431655766;  // heads + 2 · kv_heads = 2^32 + 2: 2 in int arithmetic
  s.kv_heads = 1431655766;
  EXPECT_EQ(s.qkv_rows(), int64_t{4294967298} * s.head_dim);
  absl::Status status = s.Validate();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("LlamaShape.heads is 1431655766, above 4096"));
  for (auto [field, set] :
       std::vector<std::pair<const char*, void (*)(LlamaShape&)>>{
           {"hidden", [](LlamaShape& t) { t.hidden = 1 << 30; }},
           {"ffn", [](LlamaShape& t) { t.ffn = 1 << 30; }},
           {"layers", [](LlamaShape& t) { t.layers = 1 << 30; }},
           {"vocab", [](LlamaShape& t) { t.vocab = 1 << 30; }}}) {
    s = LlamaShape::Tiny();
    set(s);
    EXPECT_THAT(std::string(s.Validate().message()),
                HasSubstr(std::string("LlamaShape.") + field + " is 1073741824, above"));
  }
  // The largest shapes every preset lies far inside still validate.
  s = LlamaShape::Tiny();
  s.hidden = s.ffn = 1 << 20;
  s.heads = s.kv_heads = s.layers = 1 << 12;
  s.vocab = 1 << 24;
  EXPECT_TRUE(s.Validate().ok()) << s.Validate();
}

TEST(LlamaShapeTest, ToStringNamesTheRopeScaling) {
  EXPECT_THAT(LlamaShape::Llama1B().ToString(),
              HasSubstr("rope_theta 500000, rope_scaling llama3 x32 (low 1, high 4, original "
                        "8192), rms_eps 1e-05"));
  EXPECT_THAT(LlamaShape::Tiny().ToString(), HasSubstr("rope_scaling none"));
}

}  // namespace
}  // namespace kiln
