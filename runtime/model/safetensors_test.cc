#include "runtime/model/safetensors.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/config/quoted.h"
#include "runtime/model/internal/odd_names.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;
using testing_internal::ExpectQuotedStatus;
using testing_internal::kOddName;
using testing_internal::kOddNameEscaped;
using testing_internal::QuotedAsIs;

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
  const std::string path = TempPath("nope.safetensors");
  absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(std::string(reader.status().message()),
            "Cannot open safetensors file \"" + path + "\": No such file or directory");
}

// A directory, a FIFO (whose open would wait for a writer for ever) or a device is refused
// before it is opened.
TEST(SafetensorsTest, PathsThatAreNotFilesAreRefusedBeforeOpening) {
  const std::string dir = TempPath("a-directory.safetensors");
  std::filesystem::create_directories(dir);
  const std::string fifo = TempPath("a-fifo.safetensors");
  std::filesystem::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const auto& [path, kind] : std::vector<std::pair<std::string, std::string>>{
           {dir, "a directory"}, {fifo, "a FIFO"}, {"/dev/zero", "a device"}}) {
    const absl::Status status = SafetensorsReader::Open(path).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_EQ(std::string(status.message()),
              "Safetensors path \"" + path + "\" is " + kind +
                  ", not a file; pass a .safetensors file")
        << status;
  }
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
      {"{\"t\": {\"dtype\": \"Q4\", \"shape\": [2], \"data_offsets\": [0, 4]}}",
       "Safetensors tensor 't' has dtype 'Q4', which safetensors does not define"},
      // A dtype is quoted, escaped: an empty one, one holding an ESC, a right-to-left override.
      {"{\"t\": {\"dtype\": \"\", \"shape\": [2], \"data_offsets\": [0, 4]}}",
       "Safetensors tensor 't' has dtype '', which safetensors does not define"},
      {"{\"t\": {\"dtype\": \"\\u001b[2J\\u202eBF16\", \"shape\": [2], "
       "\"data_offsets\": [0, 4]}}",
       "Safetensors tensor 't' has dtype '\\x1b[2J\\u202eBF16', which safetensors does not "
       "define"},
      {"{\"t\": {\"dtype\": 16, \"shape\": [2], \"data_offsets\": [0, 4]}}",
       "Safetensors tensor 't' has dtype a number, which safetensors does not define"},
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
      // Bytes that are not printable are named by value, never copied into the message.
      {"{\"t\": \x01}", "unexpected byte 0x01"},
      {"{\"t\n\": 1}", "a control character (byte 0x0a) in a string"},
      {"{\"t\": \"\\\x7f\"}", "an unknown escape: '\\' before byte 0x7f"},
      // A header is UTF-8: a stray byte, an overlong '/', a surrogate, a cut-off sequence.
      {"{\"t\xff\": 1}", "a string that is not UTF-8 (byte 0xff)"},
      {"{\"t\xc0\xaf\": 1}", "a string that is not UTF-8 (byte 0xc0)"},
      {"{\"t\xed\xa0\x80\": 1}", "a string that is not UTF-8 (byte 0xed)"},
      {"{\"t\xe2\x82\": 1}", "a string that is not UTF-8 (byte 0xe2)"},
  };
  for (const auto& c : cases) {
    WriteRaw(path, c.header, 8);
    absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
    EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss) << c.header;
    EXPECT_THAT(std::string(reader.status().message()), HasSubstr(c.expect)) << c.header;
    EXPECT_TRUE(IsOneCleanLine(reader.status().message())) << reader.status();
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

// ---- Robustness: every truncation and single-byte mutation of a valid file either opens as a
// consistent file or fails with DataLoss naming the file; never a crash, a hang or a read out of
// bounds (run these under ASan and UBSan).

// Writes a small valid file with WriteSafetensors and returns its bytes: tensors of four dtypes,
// a scalar, an empty tensor and metadata, so that mutations reach every kind of header value.
// The names make the header 313 bytes, padded with 7 spaces to 320, so that a length field a
// few bytes short still ends the header after its JSON.
std::string SmallValidFile(const std::string& path) {
  std::vector<uint16_t> a(2 * 3);
  std::vector<float> b(3);
  std::vector<uint8_t> c(5);
  int64_t d = -42;
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint16_t>(0x3f80 + i);
  for (size_t i = 0; i < b.size(); ++i) b[i] = 0.5f * static_cast<float>(i) - 1.0f;
  for (size_t i = 0; i < c.size(); ++i) c[i] = static_cast<uint8_t>(200 + i);
  EXPECT_TRUE(WriteSafetensors(path,
                               {{"w", "BF16", {2, 3}, a.data(), a.size() * 2},
                                {"b", "F32", {3}, b.data(), b.size() * 4},
                                {"none", "F16", {0, 7}, nullptr, 0},
                                {"u8", "U8", {5}, c.data(), c.size()},
                                {"s", "I64", {}, &d, 8}},
                               {{"format", "pt"}})
                  .ok());
  return ReadAll(path);
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

// Writes `bytes` to `path` and opens it. A file Open accepts must be what its header says: each
// tensor's data lies inside the file, holds the bytes its dtype and shape need, and reads back,
// and the tensors' bytes add up to the data section. A file it refuses is DataLoss, with a
// message that names the file, quoted, and holds only printable ASCII (the path is ASCII; header
// bytes are quoted by value). `what` describes the input for failure messages. Returns whether the
// file opened.
bool OpensConsistentlyOrFailsCleanly(const std::string& path, const std::string& bytes,
                                     const std::string& what) {
  WriteBytes(path, bytes);
  absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
  if (!reader.ok()) {
    EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss)
        << what << ": " << reader.status();
    const std::string message(reader.status().message());
    EXPECT_THAT(message, HasSubstr("\"" + path + "\"")) << what;
    EXPECT_TRUE(std::all_of(message.begin(), message.end(),
                            [](char c) { return c >= 0x20 && c < 0x7f; }))
        << what << ": " << absl::CHexEscape(message);
    return false;
  }
  EXPECT_GE(bytes.size(), 8u) << what;
  if (bytes.size() < 8) return true;
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_LE(header_size, bytes.size() - 8) << what;
  if (header_size > bytes.size() - 8) return true;
  const uint64_t data_size = bytes.size() - 8 - header_size;
  uint64_t held = 0;  // the tensors' bytes, which must add up to the data section
  for (const SafetensorsTensor& t : reader->tensors()) {
    held += t.bytes();
    const std::string tensor = absl::StrCat(what, ", tensor '", absl::CHexEscape(t.name), "'");
    EXPECT_LE(t.data_begin, t.data_end) << tensor;
    EXPECT_LE(t.data_end, data_size) << tensor;
    // The file is small, so a count that passes data_size is wrong whether or not it overflows.
    uint64_t expected = SafetensorsDtypeSize(t.dtype);
    EXPECT_NE(expected, 0u) << tensor << ": dtype " << t.dtype;
    for (const int64_t dim : t.shape) {
      EXPECT_GE(dim, 0) << tensor;
      if (dim < 0 || (dim > 0 && expected > data_size / static_cast<uint64_t>(dim))) {
        expected = data_size + 1;
        break;
      }
      expected *= static_cast<uint64_t>(dim);
    }
    EXPECT_EQ(t.bytes(), expected) << tensor << " of shape " << t.ShapeString();
    if (t.data_begin > t.data_end || t.data_end > data_size) continue;
    EXPECT_EQ(reader->Find(t.name), &t) << tensor;
    // Exactly the tensor's bytes, so that ASan catches a read that writes past them.
    std::vector<char> dst(t.bytes());
    const absl::Status read = reader->Read(t, dst.data(), dst.size());
    EXPECT_TRUE(read.ok()) << tensor << ": " << read;
  }
  EXPECT_EQ(held, data_size) << what;
  return true;
}

TEST(SafetensorsTest, EveryTruncationIsDataLoss) {
  const std::string path = TempPath("truncations.safetensors");
  const std::string valid = SmallValidFile(path);
  ASSERT_TRUE(OpensConsistentlyOrFailsCleanly(path, valid, "the whole file"));
  // Every length short of the whole file: inside the length field, the header and the data.
  for (size_t length = 0; length < valid.size(); ++length) {
    EXPECT_FALSE(OpensConsistentlyOrFailsCleanly(path, valid.substr(0, length),
                                                 absl::StrCat("the first ", length, " of ",
                                                              valid.size(), " bytes")))
        << "the first " << length << " bytes opened";
  }
}

TEST(SafetensorsTest, HeaderByteMutationsOpenConsistentlyOrAreDataLoss) {
  const std::string path = TempPath("mutations.safetensors");
  const std::string valid = SmallValidFile(path);
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | static_cast<uint8_t>(valid[i]);
  ASSERT_LE(8 + header_size, valid.size());
  // JSON's structural characters, a digit, a sign, a space, an escape, and bytes JSON never has.
  const char kValues[] = {'\x00', '\xff', '{', '}', '[', ']', '"', ',', ':',
                          '9',    '0',    '-', ' ', '\\', '.', 'e', '\x80', '\n'};
  int mutations = 0;
  int opened = 0;
  for (size_t at = 0; at < 8 + header_size; ++at) {
    for (const char value : kValues) {
      if (valid[at] == value) continue;
      std::string mutated = valid;
      mutated[at] = value;
      ++mutations;
      opened += OpensConsistentlyOrFailsCleanly(
          path, mutated,
          absl::StrCat("byte ", at, " '", absl::CHexEscape(valid.substr(at, 1)), "' -> '",
                       absl::CHexEscape(std::string(1, value)), "'"));
    }
  }
  // Mutations in names and metadata values keep the file valid; most others break it.
  EXPECT_GT(opened, 0);
  EXPECT_LT(opened, mutations / 2);
  std::printf("%d single-byte mutations of %llu header bytes: %d opened\n", mutations,
              static_cast<unsigned long long>(8 + header_size), opened);

  // The length field set to every value within 16 of the true one opens only with the true one:
  // one a few bytes short ends the header inside its padding, after the JSON, and would move
  // every tensor's data.
  ASSERT_EQ(valid[8 + header_size - 1], ' ') << "the header needs padding for this check";
  for (uint64_t length = header_size - 16; length <= header_size + 16; ++length) {
    std::string mutated = valid;
    for (int i = 0; i < 8; ++i) mutated[i] = static_cast<char>(length >> (8 * i));
    EXPECT_EQ(OpensConsistentlyOrFailsCleanly(path, mutated,
                                              absl::StrCat("header length ", length, " of ",
                                                           header_size)),
              length == header_size)
        << "header length " << length << " of " << header_size;
  }
}

// The format wants every data byte held by a tensor: bytes after the last one (a length field
// that ends the header in its padding leaves some) or between two are DataLoss; empty tensors
// may sit anywhere the others leave no gap.
TEST(SafetensorsTest, DataBytesNoTensorHoldsAreDataLoss) {
  const std::string path = TempPath("unheld.safetensors");
  WriteRaw(path, "{\"t\": {\"dtype\": \"BF16\", \"shape\": [2], \"data_offsets\": [0, 4]}}",
           8);
  absl::Status status = SafetensorsReader::Open(path).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("ends in data bytes [4, 8) that no tensor holds"));

  WriteRaw(path,
           "{\"a\": {\"dtype\": \"BF16\", \"shape\": [1], \"data_offsets\": [0, 2]},"
           " \"b\": {\"dtype\": \"BF16\", \"shape\": [1], \"data_offsets\": [4, 6]}}",
           6);
  status = SafetensorsReader::Open(path).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("data bytes [2, 4) that no tensor holds (before tensor 'b')"));

  // The length field one byte short: the header still parses (it ends in spaces), but its last
  // space would become the first data byte.
  std::string raw = SmallValidFile(path);
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | static_cast<uint8_t>(raw[i]);
  ASSERT_EQ(raw[8 + header_size - 1], ' ');
  for (int i = 0; i < 8; ++i) raw[i] = static_cast<char>((header_size - 1) >> (8 * i));
  WriteBytes(path, raw);
  status = SafetensorsReader::Open(path).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(std::string(status.message()),
              HasSubstr(absl::StrCat("its header length ", header_size - 1,
                                     " or its size is wrong")));

  WriteRaw(path,
           "{\"e0\": {\"dtype\": \"F16\", \"shape\": [0], \"data_offsets\": [0, 0]},"
           " \"a\": {\"dtype\": \"BF16\", \"shape\": [1], \"data_offsets\": [0, 2]},"
           " \"e2\": {\"dtype\": \"F16\", \"shape\": [3, 0], \"data_offsets\": [2, 2]},"
           " \"b\": {\"dtype\": \"BF16\", \"shape\": [1], \"data_offsets\": [2, 4]},"
           " \"e4\": {\"dtype\": \"F16\", \"shape\": [0], \"data_offsets\": [4, 4]}}",
           4);
  absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(reader->tensors().size(), 5u);
}

// A tensor's data range in a hand-made header: U8 values, so its bytes are its shape.
struct Range {
  std::string name;
  uint64_t begin = 0;
  uint64_t end = 0;
};

std::string RangesHeader(const std::vector<Range>& ranges) {
  std::string header = "{";
  for (const Range& r : ranges) {
    if (header.size() > 1) header += ", ";
    absl::StrAppend(&header, "\"", r.name, "\": {\"dtype\": \"U8\", \"shape\": [",
                    r.end - r.begin, "], \"data_offsets\": [", r.begin, ", ", r.end, "]}");
  }
  return header + "}";
}

// What Open reports for ranges inside a data section of `data_size` bytes, as three passes in
// offset order: the first overlap of a range with the one before it; else the first hole; else
// bytes after the last range. Empty when the ranges tile the section.
std::string ExpectedRangeError(std::vector<Range> ranges, uint64_t data_size) {
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].begin < ranges[i - 1].end) {
      return absl::StrCat("tensors '", ranges[i - 1].name, "' and '", ranges[i].name,
                          "' overlap in");
    }
  }
  uint64_t covered = 0;
  for (const Range& r : ranges) {
    if (r.begin > covered) {
      return absl::StrCat("has data bytes [", covered, ", ", r.begin,
                          ") that no tensor holds (before tensor '", r.name, "')");
    }
    covered = std::max(covered, r.end);
  }
  if (covered != data_size) {
    return absl::StrCat("ends in data bytes [", covered, ", ", data_size, ") that no tensor holds");
  }
  return "";
}

// Open checks overlaps, holes and the data section's end over the ranges in offset order, and
// names an overlap anywhere before a hole, a hole before bytes after the last tensor.
TEST(SafetensorsTest, OverlapsHolesAndUnheldEndsAreNamedAsInOffsetOrderPasses) {
  const std::string path = TempPath("ranges.safetensors");
  // A hole before an overlap: the overlap is named.
  const std::vector<Range> hole_then_overlap = {{"a", 0, 2}, {"b", 4, 6}, {"c", 5, 8}};
  WriteRaw(path, RangesHeader(hole_then_overlap), 8);
  absl::Status status = SafetensorsReader::Open(path).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("tensors 'b' and 'c' overlap in"));
  // A hole and unheld bytes at the end: the hole is named.
  const std::vector<Range> hole_and_tail = {{"a", 0, 2}, {"b", 4, 6}};
  WriteRaw(path, RangesHeader(hole_and_tail), 9);
  status = SafetensorsReader::Open(path).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("data bytes [2, 4) that no tensor holds (before tensor 'b')"));

  // Random layouts of up to six ranges (empty ones included, no two alike, so that the order of
  // equal ranges never decides a name), tiled or not.
  std::mt19937 rng(std::random_device{}());
  const uint32_t seed = rng();
  rng.seed(seed);
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  int opened = 0, overlaps = 0, holes = 0, ends = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int n = std::uniform_int_distribution<int>(1, 6)(rng);
    const bool tile = trial % 3 == 0;
    std::vector<Range> ranges;
    uint64_t at = 0;
    while (static_cast<int>(ranges.size()) < n) {
      Range r;
      r.name = absl::StrCat("t", ranges.size());
      r.begin = tile ? at : std::uniform_int_distribution<uint64_t>(0, 12)(rng);
      r.end = r.begin + std::uniform_int_distribution<uint64_t>(tile ? 1 : 0, 4)(rng);
      const bool repeated = std::any_of(ranges.begin(), ranges.end(), [&](const Range& o) {
        return o.begin == r.begin && o.end == r.end;
      });
      if (repeated) continue;
      at = r.end;
      ranges.push_back(r);
    }
    std::shuffle(ranges.begin(), ranges.end(), rng);  // header order is not offset order
    uint64_t data_size = 0;
    for (const Range& r : ranges) data_size = std::max(data_size, r.end);
    data_size += std::uniform_int_distribution<uint64_t>(0, trial % 2)(rng);
    const std::string header = RangesHeader(ranges);
    WriteRaw(path, header, data_size);
    const std::string want = ExpectedRangeError(ranges, data_size);
    const absl::Status got = SafetensorsReader::Open(path).status();
    if (want.empty()) {
      EXPECT_TRUE(got.ok()) << header << ": " << got;
      ++opened;
      continue;
    }
    EXPECT_EQ(got.code(), absl::StatusCode::kDataLoss) << header << ": " << got;
    EXPECT_THAT(std::string(got.message()), HasSubstr(want)) << header;
    overlaps += absl::StrContains(want, "overlap");
    holes += absl::StrContains(want, "before tensor");
    ends += absl::StrContains(want, "ends in");
  }
  EXPECT_GT(opened, 0);
  EXPECT_GT(overlaps, 0);
  EXPECT_GT(holes, 0);
  EXPECT_GT(ends, 0);
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

// The writer's messages quote the names and dtypes it is given, escaped.
TEST(SafetensorsTest, WriterQuotesOddNamesAndDtypes) {
  const std::string path = TempPath("writer-odd.safetensors");
  const std::string quoted = absl::StrCat("'", kOddNameEscaped, "'");
  std::vector<uint16_t> a(4, 0);
  const absl::Status twice = WriteSafetensors(path, {{kOddName, "BF16", {4}, a.data(), 8},
                                                     {kOddName, "BF16", {4}, a.data(), 8}});
  EXPECT_EQ(std::string(twice.message()),
            "Safetensors tensor " + quoted + " appears twice; names must be unique");
  const absl::Status dtype = WriteSafetensors(path, {{"a", kOddName, {4}, a.data(), 8}});
  EXPECT_EQ(std::string(dtype.message()),
            "Safetensors tensor 'a' has dtype " + quoted +
                "; use one of BF16, F16, F32, F64, I8..I64, U8..U64, BOOL, F8_E4M3, F8_E5M2");
  const absl::Status bytes = WriteSafetensors(path, {{kOddName, "BF16", {3}, a.data(), 8}});
  EXPECT_EQ(std::string(bytes.message()), "Safetensors tensor " + quoted +
                                              " has 8 bytes of data but dtype BF16 and shape "
                                              "[3] need 6");
  const absl::Status no_data = WriteSafetensors(path, {{kOddName, "BF16", {4}, nullptr, 8}});
  EXPECT_EQ(std::string(no_data.message()),
            "Safetensors tensor " + quoted + " has no data pointer");
  for (const absl::Status& status : {twice, dtype, bytes, no_data}) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_TRUE(IsOneCleanLine(status.message())) << absl::CHexEscape(status.message());
  }
}

// Every message that names a file quotes its path, escaped on one clean line: a path holding an
// ESC, a newline and U+009B, given to Open (a missing file, a directory, each kind of bad file),
// to a read after the file changed, and to the writer.
TEST(SafetensorsTest, OddPathsAreQuotedInEveryMessage) {
  const std::string base = TempPath("");
  ASSERT_TRUE(QuotedAsIs(base));
  const std::string dir = base + kOddName;
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(std::filesystem::create_directories(dir));
  const std::string path = absl::StrCat(dir, "/", kOddName, ".safetensors");
  const std::string quoted =
      absl::StrCat("\"", base, kOddNameEscaped, "/", kOddNameEscaped, ".safetensors\"");
  // Each message is `want` exactly.
  auto expect = [](const absl::Status& status, absl::StatusCode code, const std::string& want) {
    ExpectQuotedStatus(status, code, ::testing::Eq(want));
  };
  auto open_with = [&](const std::string& header, size_t data_bytes) {
    WriteRaw(path, header, data_bytes);
    return SafetensorsReader::Open(path).status();
  };
  const std::string bf16_2 = R"({"dtype": "BF16", "shape": [2], "data_offsets": )";

  std::filesystem::remove(path);
  expect(SafetensorsReader::Open(path).status(), absl::StatusCode::kNotFound,
         "Cannot open safetensors file " + quoted + ": No such file or directory");
  std::filesystem::create_directory(path);
  expect(SafetensorsReader::Open(path).status(), absl::StatusCode::kInvalidArgument,
         "Safetensors path " + quoted + " is a directory, not a file; pass a .safetensors file");
  std::filesystem::remove(path);
  WriteBytes(path, "abc");
  expect(SafetensorsReader::Open(path).status(), absl::StatusCode::kDataLoss,
         "Safetensors file " + quoted +
             " has 3 bytes, fewer than the 8-byte header length; it is truncated or not a "
             "safetensors file");
  WriteBytes(path, std::string("\x20\0\0\0\0\0\0\0{}", 10));
  expect(SafetensorsReader::Open(path).status(), absl::StatusCode::kDataLoss,
         "Safetensors file " + quoted +
             " declares a header of 32 bytes but has 2 after the length field; it is truncated "
             "or not a safetensors file");
  expect(open_with("{\"t\": }", 0), absl::StatusCode::kDataLoss,
         "Malformed safetensors header: unexpected character '}' at header byte 6 in " + quoted);
  expect(open_with("[1, 2]", 0), absl::StatusCode::kDataLoss,
         "Safetensors header of " + quoted + " is an array; expected an object");
  expect(open_with("{\"t\": " + bf16_2 + "[0, 4]}, \"t\": " + bf16_2 + "[4, 8]}}", 8),
         absl::StatusCode::kDataLoss, "Safetensors header of " + quoted + " lists 't' twice");
  expect(open_with("{\"__metadata__\": 1}", 0), absl::StatusCode::kDataLoss,
         "Safetensors __metadata__ of " + quoted + " is a number; expected an object");
  expect(open_with("{\"__metadata__\": {\"k\": 1}}", 0), absl::StatusCode::kDataLoss,
         "Safetensors __metadata__ key 'k' of " + quoted +
             " is a number; metadata values are strings");
  // A shape that disagrees with the tensor's bytes.
  expect(open_with(R"({"t": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 4]}})", 4),
         absl::StatusCode::kDataLoss,
         "Safetensors tensor 't' holds 4 bytes but dtype BF16 and shape [3] need 6; the file is "
         "corrupt in " + quoted);
  expect(open_with("{\"t\": " + bf16_2 + "[4, 8]}}", 6), absl::StatusCode::kDataLoss,
         "Safetensors tensor 't' ends at data byte 8 but " + quoted +
             " has only 6 bytes of data; the file is truncated (download it again)");
  expect(open_with("{\"a\": " + bf16_2 + "[0, 4]}, \"b\": " + bf16_2 + "[2, 6]}}", 6),
         absl::StatusCode::kDataLoss,
         "Safetensors tensors 'a' and 'b' overlap in " + quoted + "; the file is corrupt");
  expect(open_with("{\"a\": " + bf16_2 + "[0, 4]}, \"b\": " + bf16_2 + "[6, 10]}}", 10),
         absl::StatusCode::kDataLoss,
         "Safetensors file " + quoted +
             " has data bytes [4, 6) that no tensor holds (before tensor 'b'), which the format "
             "does not allow; the file is corrupt (download it again)");
  const std::string tail_header = "{\"a\": " + bf16_2 + "[0, 4]}}";
  expect(open_with(tail_header, 6), absl::StatusCode::kDataLoss,
         absl::StrCat("Safetensors file ", quoted,
                      " ends in data bytes [4, 6) that no tensor holds, which the format does "
                      "not allow; its header length ",
                      tail_header.size(), " or its size is wrong (download it again)"));

  // Reads after Open: the file shrank, then is gone.
  std::vector<uint16_t> values(8, 0x3f80);
  ASSERT_TRUE(WriteSafetensors(path, {{"w", "BF16", {8}, values.data(), 16}}).ok());
  absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  const std::string whole = ReadAll(path);
  WriteBytes(path, whole.substr(0, whole.size() - 4));
  std::vector<uint16_t> dst(8);
  expect(reader->Read(*reader->Find("w"), dst.data(), 16), absl::StatusCode::kDataLoss,
         "Read stopped at byte 12 of tensor 'w' (16 bytes) in " + quoted +
             "; the file shrank since it was opened");
  std::filesystem::remove(path);
  expect(reader->Read(*reader->Find("w"), dst.data(), 16), absl::StatusCode::kNotFound,
         "Cannot open safetensors file " + quoted + ": No such file or directory");

  // The writer, into a directory that does not exist.
  const std::string missing_dir = absl::StrCat(dir, "/", kOddName, "/x.safetensors");
  expect(WriteSafetensors(missing_dir, {}), absl::StatusCode::kNotFound,
         absl::StrCat("Cannot open for writing \"", base, kOddNameEscaped, "/", kOddNameEscaped,
                      "/x.safetensors\": No such file or directory"));
}

}  // namespace
}  // namespace kiln
