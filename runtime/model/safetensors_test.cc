#include "runtime/model/safetensors.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

// Writes a raw file: 8-byte length, `header`, then `data_bytes` bytes.
void WriteRaw(const std::string& path, const std::string& header, size_t data_bytes) {
  std::ofstream f(path, std::ios::binary);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) f.put(static_cast<char>(n >> (8 * i)));
  f << header;
  for (size_t i = 0; i < data_bytes; ++i) f.put(static_cast<char>(i));
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(SafetensorsTest, RoundTripsTensorsAndMetadata) {
  std::mt19937 rng(std::random_device{}());
  std::vector<uint16_t> a(3 * 5);
  std::vector<float> b(7);
  std::vector<int64_t> c(1);
  for (auto& v : a) v = static_cast<uint16_t>(rng());
  for (auto& v : b) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  c[0] = -123456789012345;
  const std::string path = TempPath("round_trip.safetensors");
  std::vector<SafetensorsEntry> entries = {
      {"layer.weight", "BF16", {3, 5}, a.data(), a.size() * 2},
      {"odd \"name\"\\ with\nescapes", "F32", {7}, b.data(), b.size() * 4},
      {"scalar", "I64", {}, c.data(), 8},
      {"empty", "F16", {0, 4}, nullptr, 0},
  };
  ASSERT_TRUE(WriteSafetensors(path, entries, {{"format", "pt"}, {"note", "ü \"q\""}}).ok());

  // The data section starts 8-byte aligned, as other readers expect.
  const std::string raw = ReadAll(path);
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | static_cast<uint8_t>(raw[i]);
  EXPECT_EQ(header_size % 8, 0u);
  EXPECT_EQ(raw.size(), 8 + header_size + a.size() * 2 + b.size() * 4 + 8);

  absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_EQ(reader->tensors().size(), 4u);
  EXPECT_EQ(reader->metadata().at("format"), "pt");
  EXPECT_EQ(reader->metadata().at("note"), "ü \"q\"");

  const SafetensorsTensor* ta = reader->Find("layer.weight");
  ASSERT_NE(ta, nullptr);
  EXPECT_EQ(ta->dtype, "BF16");
  EXPECT_EQ(ta->shape, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(ta->ShapeString(), "[3, 5]");
  std::vector<uint16_t> a2(a.size(), 0xdead);
  ASSERT_TRUE(reader->Read(*ta, a2.data(), a2.size() * 2).ok());
  EXPECT_EQ(a2, a);

  const SafetensorsTensor* tb = reader->Find("odd \"name\"\\ with\nescapes");
  ASSERT_NE(tb, nullptr);
  std::vector<float> b2(b.size(), -7.0f);
  ASSERT_TRUE(reader->Read(*tb, b2.data(), b2.size() * 4).ok());
  EXPECT_EQ(b2, b);

  const SafetensorsTensor* tc = reader->Find("scalar");
  ASSERT_NE(tc, nullptr);
  EXPECT_TRUE(tc->shape.empty());
  int64_t c2 = 0;
  ASSERT_TRUE(reader->Read(*tc, &c2, 8).ok());
  EXPECT_EQ(c2, c[0]);

  const SafetensorsTensor* te = reader->Find("empty");
  ASSERT_NE(te, nullptr);
  EXPECT_EQ(te->bytes(), 0u);
  EXPECT_EQ(reader->Find("missing"), nullptr);

  // A destination that is too small is refused.
  EXPECT_EQ(reader->Read(*ta, a2.data(), 4).code(), absl::StatusCode::kInvalidArgument);
}

TEST(SafetensorsTest, ReadsAHandWrittenHeaderWithUnicodeEscapesAndOtherValues) {
  const std::string path = TempPath("hand.safetensors");
  WriteRaw(path,
           "{ \"__metadata__\" : {\"k\": \"\\u00e9\\ud83d\\ude00\"},\n"
           "  \"t\\u0041\": {\"data_offsets\": [0, 4], \"shape\": [2], \"dtype\": \"BF16\", "
           "\"extra\": [true, false, null, -1.5e3, {\"x\": []}]} }",
           4);
  absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(reader->metadata().at("k"), "\xc3\xa9\xf0\x9f\x98\x80");
  ASSERT_NE(reader->Find("tA"), nullptr);
}

// A block of columns of a row-major matrix, read row by row; touching runs in one read; runs
// that leave the tensor and a file that shrank after Open are errors naming the numbers.
TEST(SafetensorsTest, ReadsBlocksOfColumns) {
  constexpr int kRows = 6, kCols = 10;
  std::vector<uint16_t> m(kRows * kCols);
  for (int i = 0; i < kRows * kCols; ++i) m[i] = static_cast<uint16_t>(1000 + i);
  std::vector<uint16_t> before(7, 7);
  const std::string path = TempPath("strided.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"before", "BF16", {7}, before.data(), 14},
                                      {"m", "BF16", {kRows, kCols}, m.data(), m.size() * 2}})
                  .ok());
  absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  const SafetensorsTensor& t = *reader->Find("m");

  // Rows 1..4, columns 3..7.
  std::vector<uint16_t> block(4 * 5, 0xdead);
  ASSERT_TRUE(reader->ReadStrided(t, (1 * kCols + 3) * 2, 5 * 2, kCols * 2, 4, block.data()).ok());
  for (int r = 0; r < 4; ++r) {
    for (int c = 0; c < 5; ++c) {
      EXPECT_EQ(block[r * 5 + c], m[(1 + r) * kCols + 3 + c]) << r << ", " << c;
    }
  }
  // Whole rows 2..5: runs that touch.
  std::vector<uint16_t> rows(4 * kCols, 0xdead);
  ASSERT_TRUE(reader->ReadStrided(t, 2 * kCols * 2, kCols * 2, kCols * 2, 4, rows.data()).ok());
  EXPECT_TRUE(std::equal(rows.begin(), rows.end(), m.begin() + 2 * kCols));
  // Zero runs read nothing.
  EXPECT_TRUE(reader->ReadStrided(t, 0, 2, 20, 0, nullptr).ok());

  // The last run would end 2 bytes past the tensor.
  absl::Status past = reader->ReadStrided(t, (1 * kCols + 6) * 2, 5 * 2, kCols * 2, 5, block.data());
  EXPECT_EQ(past.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(past.message()), HasSubstr("5 runs of 10 bytes every 20 bytes"));
  EXPECT_THAT(std::string(past.message()), HasSubstr("[6, 10]"));
  absl::Status overlapping = reader->ReadStrided(t, 0, 8, 4, 2, block.data());
  EXPECT_EQ(overlapping.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(overlapping.message()), HasSubstr("stride at least a run"));

  // The file loses its last row after Open.
  std::string raw = ReadAll(path);
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << raw.substr(0, raw.size() - kCols * 2);
  }
  absl::Status shrank = reader->ReadStrided(t, (4 * kCols + 3) * 2, 5 * 2, kCols * 2, 2, block.data());
  EXPECT_EQ(shrank.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(shrank.message()), HasSubstr("shrank"));
  EXPECT_THAT(std::string(shrank.message()), HasSubstr("'m'"));
}

TEST(SafetensorsTest, MissingFileIsNotFound) {
  absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(TempPath("nope.safetensors"));
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(reader.status().message()), HasSubstr("nope.safetensors"));
}

TEST(SafetensorsTest, TruncatedFileIsDataLossNamingTheTensor) {
  std::vector<uint16_t> a(64, 1), b(64, 2);
  const std::string path = TempPath("truncated.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"first", "BF16", {64}, a.data(), 128},
                                      {"second", "BF16", {64}, b.data(), 128}})
                  .ok());
  std::string raw = ReadAll(path);
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << raw.substr(0, raw.size() - 10);
  }
  absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(reader.status().message()), HasSubstr("'second'"));
  EXPECT_THAT(std::string(reader.status().message()), HasSubstr("truncated"));

  // Cut inside the header, and below the length field.
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << raw.substr(0, 20);
  }
  EXPECT_EQ(SafetensorsReader::Open(path).status().code(), absl::StatusCode::kDataLoss);
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << raw.substr(0, 5);
  }
  EXPECT_EQ(SafetensorsReader::Open(path).status().code(), absl::StatusCode::kDataLoss);
}

TEST(SafetensorsTest, MalformedHeadersAreDataLoss) {
  const std::string path = TempPath("bad.safetensors");
  const struct {
    std::string header;
    std::string expect;
  } cases[] = {
      {"{\"t\": {\"dtype\": \"BF16\", \"shape\": [2], \"data_offsets\": [0, 4]}", "expected ','"},
      {"{\"t\": {\"dtype\": \"BF16\", \"shape\": [2]}}", "lacks \"data_offsets\""},
      {"{\"t\": {\"dtype\": \"Q4\", \"shape\": [2], \"data_offsets\": [0, 4]}}", "dtype Q4"},
      {"{\"t\": {\"dtype\": \"BF16\", \"shape\": [3], \"data_offsets\": [0, 4]}}",
       "need 6"},
      {"{\"t\": {\"dtype\": \"BF16\", \"shape\": [-2], \"data_offsets\": [0, 4]}}",
       "non-negative integer"},
      {"{\"t\": {\"dtype\": \"BF16\", \"shape\": [2.5], \"data_offsets\": [0, 4]}}",
       "non-negative integer"},
      {"{\"t\": {\"dtype\": \"BF16\", \"shape\": [2], \"data_offsets\": [4, 0]}}",
       "end before they begin"},
      // 2^62 x 8 elements: the byte count overflows, which is no count of "0 bytes needed".
      {"{\"t\": {\"dtype\": \"BF16\", \"shape\": [4611686018427387904, 8], "
       "\"data_offsets\": [0, 4]}}",
       "overflow 64 bits"},
      {"{\"a\": {\"dtype\": \"BF16\", \"shape\": [2], \"data_offsets\": [0, 4]},"
       " \"b\": {\"dtype\": \"BF16\", \"shape\": [2], \"data_offsets\": [2, 6]}}",
       "overlap"},
      {"{\"t\": {\"dtype\": \"BF16\", \"shape\": [2], \"data_offsets\": [0, 4]},"
       " \"t\": {\"dtype\": \"BF16\", \"shape\": [2], \"data_offsets\": [4, 8]}}",
       "twice"},
      {"[1, 2]", "expected an object"},
      {"{\"t\": \"x\\q\"}", "unknown escape"},
      {"{\"t\": \"\\ud800\"}", "lone high surrogate"},
      {"{\"__metadata__\": {\"k\": 1}}", "metadata values are strings"},
      {"{} x", "trailing characters"},
      {std::string(40, '[') + std::string(40, ']'), "nesting"},
  };
  for (const auto& c : cases) {
    WriteRaw(path, c.header, 8);
    absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
    EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss) << c.header;
    EXPECT_THAT(std::string(reader.status().message()), HasSubstr(c.expect)) << c.header;
  }
  // A length field far beyond the file.
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    for (int i = 0; i < 8; ++i) f.put(static_cast<char>(0x7f));
    f << "{}";
  }
  absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(reader.status().message()), HasSubstr("declares a header"));
}

TEST(SafetensorsTest, WriterRejectsBadEntries) {
  const std::string path = TempPath("reject.safetensors");
  std::vector<uint16_t> a(4, 0);
  EXPECT_THAT(std::string(WriteSafetensors(path, {{"a", "BF16", {4}, a.data(), 8},
                                                  {"a", "BF16", {4}, a.data(), 8}})
                              .message()),
              HasSubstr("appears twice"));
  EXPECT_THAT(std::string(WriteSafetensors(path, {{"a", "BF16", {3}, a.data(), 8}}).message()),
              HasSubstr("need 6"));
  EXPECT_THAT(std::string(WriteSafetensors(path, {{"a", "bfloat16", {4}, a.data(), 8}}).message()),
              HasSubstr("dtype 'bfloat16'"));
  EXPECT_EQ(WriteSafetensors(path, {{"", "BF16", {4}, a.data(), 8}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(WriteSafetensors("/nonexistent-dir/x.safetensors", {}).ok());
}

}  // namespace
}  // namespace kiln
