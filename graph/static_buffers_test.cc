#include "graph/static_buffers.h"

#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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

// Random declarations (names empty, binary, repeated; addresses null, anywhere, at the top of
// the address space; sizes 0 to SIZE_MAX) against a model: Bind accepts exactly the non-empty
// names of non-null ranges of at least one byte that end within the address space, entries keep
// their index, and CheckUnchanged names the first entry that differs from a snapshot.
TEST(StaticBuffersTest, RandomDeclarationsFollowTheModel) {
  using u128 = unsigned __int128;
  std::mt19937_64 rng(23);
  constexpr uintptr_t kTop = std::numeric_limits<uintptr_t>::max();
  auto pick_address = [&]() -> uintptr_t {
    switch (rng() % 4) {
      case 0:
        return 0;
      case 1:
        return kTop - rng() % 4096;
      default:
        return static_cast<uintptr_t>(rng()) | 1;
    }
  };
  auto pick_bytes = [&]() -> size_t {
    switch (rng() % 4) {
      case 0:
        return rng() % 2 == 0 ? 0 : std::numeric_limits<size_t>::max() - rng() % 3;
      case 1:
        return static_cast<size_t>(rng());
      default:
        return 1 + rng() % 4096;
    }
  };
  const std::string names[] = {"", "ids", "logits", std::string("nul\0name", 8), "\xff\xfe",
                               std::string(300, 'n')};
  int accepted = 0, refused = 0, moved = 0;
  for (int registry = 0; registry < 200; ++registry) {
    StaticBuffers buffers;
    struct Model {
      std::string name;
      uintptr_t address;
      size_t bytes;
    };
    std::vector<Model> model;
    std::map<std::string, size_t> index;
    StaticBuffers::Snapshot snapshot;
    size_t snapshot_size = 0;
    for (int op = 0; op < 60; ++op) {
      if (rng() % 8 == 0) {
        snapshot = buffers.Take();
        snapshot_size = model.size();
        ASSERT_TRUE(buffers.CheckUnchanged(snapshot, kKey).ok());
        continue;
      }
      const std::string name = names[rng() % 6];
      const uintptr_t address = pick_address();
      const size_t bytes = pick_bytes();
      const absl::Status status = buffers.Bind(name, reinterpret_cast<void*>(address), bytes,
                                               rng() % 2 == 0 ? BufferRole::kInput
                                                              : BufferRole::kOutput);
      const bool valid = !name.empty() && address != 0 && bytes != 0 &&
                         static_cast<u128>(address) + bytes - 1 <= kTop;
      ASSERT_EQ(status.ok(), valid) << status << " " << address << " " << bytes;
      if (!valid) {
        ++refused;
        ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
        if (!name.empty()) {
          ASSERT_THAT(std::string(status.message()),
                      HasSubstr(absl::StrCat("'", name, "' at 0x", absl::Hex(address), " of ",
                                             bytes, " bytes")));
        }
        continue;
      }
      ++accepted;
      auto [it, inserted] = index.emplace(name, model.size());
      if (inserted) {
        model.push_back({name, address, bytes});
      } else {
        model[it->second].address = address;
        model[it->second].bytes = bytes;
      }
      ASSERT_EQ(buffers.entries().size(), model.size());
      const StaticBuffers::Entry* found = buffers.Find(name);
      ASSERT_NE(found, nullptr);
      ASSERT_EQ(found, &buffers.entries()[it->second]);
      // The first entry of the snapshot that differs now, if any, is the one named.
      int first = -1;
      for (size_t i = 0; i < snapshot_size; ++i) {
        if (reinterpret_cast<uintptr_t>(snapshot.items[i].address) != model[i].address ||
            snapshot.items[i].bytes != model[i].bytes) {
          first = static_cast<int>(i);
          break;
        }
      }
      const absl::Status check = buffers.CheckUnchanged(snapshot, kKey);
      if (first < 0) {
        ASSERT_TRUE(check.ok()) << check;
      } else {
        ++moved;
        ASSERT_EQ(check.code(), absl::StatusCode::kFailedPrecondition);
        ASSERT_THAT(std::string(check.message()),
                    HasSubstr(absl::StrCat("Static buffer '", model[first].name, "' moved")));
      }
    }
    // A snapshot of this registry checked against a fresh one is refused, not read past its end.
    if (!model.empty()) {
      StaticBuffers empty;
      EXPECT_EQ(empty.CheckUnchanged(buffers.Take(), kKey).code(),
                absl::StatusCode::kFailedPrecondition);
    }
  }
  EXPECT_GT(accepted, 2000);
  EXPECT_GT(refused, 2000);
  EXPECT_GT(moved, 100);
  // The range that used to be accepted: 2 bytes at the last address.
  StaticBuffers buffers;
  EXPECT_EQ(buffers.Bind("x", reinterpret_cast<void*>(kTop), 2, BufferRole::kInput).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(buffers.Bind("x", reinterpret_cast<void*>(kTop), 1, BufferRole::kInput).ok());
}

}  // namespace
}  // namespace kiln
