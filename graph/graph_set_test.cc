// Host tests of GraphSet's checks that come before any CUDA call: an empty step function, and
// keys with no graph (Find's null among them); and, at compile time, that only a set makes or
// copies a Graph. Capture and replay themselves, through the key and through Find's graph (and
// the refusal of another set's graph), are tested on a GPU (graph_set_gpu_test.cc).
#include "graph/graph_set.h"

#include <climits>
#include <random>
#include <string>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "graph/capture_context.h"
#include "graph/capture_sizes.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

constexpr CaptureKey kKey{GraphMode::kDecode, 8};

TEST(GraphSetTest, AnEmptyStepFunctionIsInvalidArgument) {
  // Calling it would throw std::bad_function_call out of the library.
  GraphSet graphs;
  const absl::Status status = graphs.Capture(kKey, StepFn(), nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("decode/8 got an empty step function"));
  EXPECT_FALSE(graphs.Contains(kKey));
  EXPECT_EQ(graphs.Find(kKey), nullptr);

  absl::StatusOr<CaptureSizes> sizes = CaptureSizes::Decode(8);
  ASSERT_TRUE(sizes.ok()) << sizes.status();
  absl::StatusOr<CaptureSummary> all =
      graphs.CaptureAll(GraphMode::kDecode, *sizes, KeyedStepFn(), nullptr);
  EXPECT_EQ(all.status().code(), absl::StatusCode::kInvalidArgument) << all.status();
  EXPECT_THAT(std::string(all.status().message()), HasSubstr("empty step function"));
  EXPECT_EQ(graphs.size(), 0u);
}

TEST(GraphSetTest, KeysNeverCapturedAreFailedPrecondition) {
  GraphSet graphs;
  const absl::Status replay = graphs.Replay(kKey, nullptr);
  EXPECT_EQ(replay.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(replay.message()), HasSubstr("No graph for decode/8"));
  EXPECT_EQ(graphs.Verify({GraphMode::kPrefill, 64}, nullptr).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(graphs.Stats(kKey), nullptr);
  graphs.Erase(kKey);  // no-op
  EXPECT_TRUE(graphs.AllStats().empty());
}

// A caller's attempt to make a Graph: as a subclass, whose constructors would call Graph's.
struct ForgedGraph : GraphSet::Graph {};

// Find looks a key up without checking it: a key with no graph, valid or not, is null (the bad
// key's InvalidArgument is Replay(key)'s, which still gives it). A Graph comes only from Find:
// a caller can neither make one (no aggregate `Graph{}`, no default constructor, no subclass)
// nor copy one that Find returned (a copy would be a bare Graph that Replay(graph) reads as the
// set's whole record), so Replay(graph) never sees a key without a graph.
TEST(GraphSetTest, FindOfAKeyWithoutAGraphIsNull) {
  static_assert(!std::is_aggregate_v<GraphSet::Graph>, "GraphSet::Graph{} must not compile");
  static_assert(!std::is_default_constructible_v<GraphSet::Graph>, "only GraphSet makes a Graph");
  static_assert(!std::is_copy_constructible_v<GraphSet::Graph>, "a copy would be sliced");
  static_assert(!std::is_move_constructible_v<GraphSet::Graph>, "a move would be sliced");
  static_assert(!std::is_copy_assignable_v<GraphSet::Graph>, "an assignment would be sliced");
  static_assert(!std::is_default_constructible_v<ForgedGraph>, "a subclass makes no Graph");
  static_assert(!std::is_copy_constructible_v<ForgedGraph>, "a subclass copies no Graph");
  GraphSet graphs;
  for (const CaptureKey key :
       {kKey, CaptureKey{GraphMode::kPrefill, 64}, CaptureKey{GraphMode::kMixed, 1},
        CaptureKey{GraphMode::kDecode, CaptureSizes::kMaxLimit}}) {
    EXPECT_EQ(graphs.Find(key), nullptr) << KeyName(key);
    EXPECT_FALSE(graphs.Contains(key)) << KeyName(key);
    EXPECT_EQ(graphs.Replay(key, nullptr).code(), absl::StatusCode::kFailedPrecondition)
        << KeyName(key);
  }
  for (const CaptureKey key :
       {CaptureKey{static_cast<GraphMode>(4), 1}, CaptureKey{GraphMode::kDecode, 0},
        CaptureKey{GraphMode::kPrefill, -8}, CaptureKey{GraphMode::kMixed, INT_MAX}}) {
    EXPECT_EQ(graphs.Find(key), nullptr) << KeyName(key);
    EXPECT_EQ(graphs.Replay(key, nullptr).code(), absl::StatusCode::kInvalidArgument)
        << KeyName(key);
  }
  EXPECT_EQ(graphs.size(), 0u);
}

// Replay looks the key up first and checks it only when it has no graph (a key with a graph
// passed the check at Capture): a bad key still gets the check's InvalidArgument, never "No
// graph", also where it hashes like a valid key ({mode 4, size 1} and decode/2).
TEST(GraphSetTest, ReplayOfABadKeyIsInvalidArgumentNotNoGraph) {
  GraphSet graphs;
  for (const CaptureKey key : {CaptureKey{static_cast<GraphMode>(4), 1},
                               CaptureKey{GraphMode::kDecode, 0},
                               CaptureKey{GraphMode::kPrefill, -8},
                               CaptureKey{GraphMode::kMixed, CaptureSizes::kMaxLimit + 1}}) {
    const absl::Status replay = graphs.Replay(key, nullptr);
    EXPECT_EQ(replay.code(), absl::StatusCode::kInvalidArgument) << replay;
    EXPECT_THAT(std::string(replay.message()),
                HasSubstr(absl::StrCat("GraphSet::Replay of key ", KeyName(key), " (mode ",
                                       static_cast<int>(key.mode), ", size ", key.size,
                                       "): the mode must be a GraphMode")));
  }
  const absl::Status absent = graphs.Replay({GraphMode::kDecode, 2}, nullptr);
  EXPECT_EQ(absent.code(), absl::StatusCode::kFailedPrecondition) << absent;
  EXPECT_THAT(std::string(absent.message()), HasSubstr("No graph for decode/2"));
}

TEST(GraphSetTest, KeysOutsideTheCaptureSizesAreInvalidArgumentBeforeAnythingRuns) {
  // Random and extreme keys (sizes from INT_MIN to INT_MAX, modes outside GraphMode): Capture
  // refuses a key CaptureSizes could never give before the step runs once (no warm-up, no CUDA
  // call), and Replay and Verify refuse it too instead of "capture it first"; a valid key that
  // has no graph is FailedPrecondition naming it. Lookups never crash.
  std::mt19937 rng(29);
  const int sizes[] = {INT_MIN, INT_MIN + 1, -65536, -1, 0, 1, 2, CaptureSizes::kMaxLimit,
                       CaptureSizes::kMaxLimit + 1, INT_MAX};
  GraphSet graphs;
  int refused = 0, absent = 0;
  for (int i = 0; i < 5000; ++i) {
    const int raw_mode =
        rng() % 4 == 0 ? static_cast<int>(rng() % 7) - 2 : static_cast<int>(rng() % 3);
    const int pick = static_cast<int>(rng() % 3);
    const CaptureKey key{static_cast<GraphMode>(raw_mode),
                         pick == 0   ? sizes[rng() % 10]
                         : pick == 1 ? static_cast<int>(rng())
                                     : 1 + static_cast<int>(rng() % CaptureSizes::kMaxLimit)};
    const bool valid = raw_mode >= 0 && raw_mode <= 2 && key.size >= 1 &&
                       key.size <= CaptureSizes::kMaxLimit;
    int runs = 0;
    const absl::Status replay = graphs.Replay(key, nullptr);
    const absl::Status verify = graphs.Verify(key, nullptr);
    EXPECT_FALSE(graphs.Contains(key));
    EXPECT_EQ(graphs.Find(key), nullptr);
    EXPECT_EQ(graphs.Stats(key), nullptr);
    graphs.Erase(key);
    if (valid) {
      ++absent;
      EXPECT_EQ(replay.code(), absl::StatusCode::kFailedPrecondition) << replay;
      EXPECT_THAT(std::string(replay.message()), HasSubstr("No graph for " + KeyName(key)));
      EXPECT_EQ(verify.code(), absl::StatusCode::kFailedPrecondition) << verify;
      continue;
    }
    ++refused;
    const absl::Status capture = graphs.Capture(
        key,
        [&runs](cudaStream_t) {
          ++runs;
          return absl::OkStatus();
        },
        nullptr);
    for (const absl::Status& s : {capture, replay, verify}) {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      EXPECT_THAT(std::string(s.message()),
                  HasSubstr(absl::StrCat("key ", KeyName(key), " (mode ", raw_mode, ", size ",
                                         key.size, ")")))
          << s;
    }
    EXPECT_EQ(runs, 0) << KeyName(key);
  }
  EXPECT_GT(refused, 1000);
  EXPECT_GT(absent, 1000);
  EXPECT_EQ(graphs.size(), 0u);
  EXPECT_TRUE(graphs.AllStats().empty());
}

TEST(GraphSetTest, NegativeWarmupsAreInvalidArgumentBeforeAnythingRuns) {
  for (int warmups : {-1, -2, INT_MIN}) {
    GraphSetOptions options;
    options.warmups = warmups;
    GraphSet graphs(nullptr, options);
    int runs = 0;
    const absl::Status status = graphs.Capture(
        kKey,
        [&runs](cudaStream_t) {
          ++runs;
          return absl::OkStatus();
        },
        nullptr);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()),
                HasSubstr(absl::StrCat("warmups ", warmups, " for decode/8 is negative")));
    EXPECT_EQ(runs, 0);
    EXPECT_EQ(graphs.Find(kKey), nullptr);
  }
}

}  // namespace
}  // namespace kiln
