#include "graph/static_buffers.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

constexpr CaptureKey kKey{GraphMode::kDecode, 16};

// Host memory stands in for device buffers: the registry only compares addresses.
TEST(StaticBuffersTest, SnapshotMatchesUntilABufferMoves) {
  std::vector<char> ids(1024), logits(4096), moved(4096);
  StaticBuffers buffers;
  ASSERT_TRUE(buffers.Bind("input_ids", ids.data(), ids.size(), BufferRole::kInput).ok());
  ASSERT_TRUE(buffers.Bind("logits", logits.data(), logits.size(), BufferRole::kOutput).ok());
  const StaticBuffers::Snapshot snapshot = buffers.Take();
  EXPECT_TRUE(buffers.CheckUnchanged(snapshot, kKey).ok());

  ASSERT_TRUE(buffers.Bind("logits", moved.data(), moved.size(), BufferRole::kOutput).ok());
  EXPECT_EQ(buffers.entries().size(), 2u);  // re-declared in place, not added
  absl::Status status = buffers.CheckUnchanged(snapshot, kKey);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("Static buffer 'logits' moved"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("decode/16"));

  ASSERT_TRUE(buffers.Bind("logits", logits.data(), logits.size(), BufferRole::kOutput).ok());
  EXPECT_TRUE(buffers.CheckUnchanged(snapshot, kKey).ok());
}

TEST(StaticBuffersTest, ResizeInPlaceIsAChange) {
  std::vector<char> kv(8192);
  StaticBuffers buffers;
  ASSERT_TRUE(buffers.Bind("kv", kv.data(), 4096, BufferRole::kInput).ok());
  const StaticBuffers::Snapshot snapshot = buffers.Take();
  ASSERT_TRUE(buffers.Bind("kv", kv.data(), 8192, BufferRole::kInput).ok());
  absl::Status status = buffers.CheckUnchanged(snapshot, kKey);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("'kv'"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("(8192 bytes)"));
}

TEST(StaticBuffersTest, BuffersDeclaredAfterTheSnapshotAreIgnored) {
  std::vector<char> a(64), b(64);
  StaticBuffers buffers;
  ASSERT_TRUE(buffers.Bind("a", a.data(), a.size(), BufferRole::kInput).ok());
  const StaticBuffers::Snapshot snapshot = buffers.Take();
  ASSERT_TRUE(buffers.Bind("b", b.data(), b.size(), BufferRole::kOutput).ok());
  EXPECT_TRUE(buffers.CheckUnchanged(snapshot, kKey).ok());
  ASSERT_NE(buffers.Find("b"), nullptr);
  EXPECT_EQ(buffers.Find("b")->role, BufferRole::kOutput);
  EXPECT_EQ(buffers.Find("c"), nullptr);
}

TEST(StaticBuffersTest, SnapshotOfALargerRegistryIsRefused) {
  std::vector<char> a(64), b(64);
  StaticBuffers buffers;
  ASSERT_TRUE(buffers.Bind("a", a.data(), a.size(), BufferRole::kInput).ok());
  ASSERT_TRUE(buffers.Bind("b", b.data(), b.size(), BufferRole::kOutput).ok());
  const StaticBuffers::Snapshot snapshot = buffers.Take();
  buffers = StaticBuffers();  // the owner rebuilt its registry
  ASSERT_TRUE(buffers.Bind("a", a.data(), a.size(), BufferRole::kInput).ok());
  absl::Status status = buffers.CheckUnchanged(snapshot, kKey);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("has 2 buffers but the registry has 1"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("capture decode/16 again"));
}

TEST(StaticBuffersTest, InvalidDeclarationsAreRefused) {
  std::vector<char> a(64);
  StaticBuffers buffers;
  EXPECT_EQ(buffers.Bind("", a.data(), 64, BufferRole::kInput).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(buffers.Bind("null", nullptr, 64, BufferRole::kInput).code(),
            absl::StatusCode::kInvalidArgument);
  absl::Status empty = buffers.Bind("empty", a.data(), 0, BufferRole::kInput);
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(empty.message()), HasSubstr("'empty'"));
  EXPECT_TRUE(buffers.entries().empty());
}

}  // namespace
}  // namespace kiln
