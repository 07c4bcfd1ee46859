// Captures small steps into graphs and checks, on a GPU: replay equals eager bit for bit and a
// float64 reference; graphs share the pool (maximum, not sum); a budget overflow names the key;
// illegal operations inside capture are named and the stream recovers; a moved static buffer is
// refused by name, through the key and through Find's graph alike; a graph replayed with a set
// other than the one it came from is refused; Verify catches a launch shape frozen at capture;
// components see kWarmup in warm-ups and kCapture in the capture.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "graph/capture_context.h"
#include "graph/capture_sizes.h"
#include "graph/graph_memory_pool.h"
#include "graph/graph_set.h"
#include "graph/internal/gpu_test_helpers.h"
#include "graph/internal/test_kernels.h"
#include "graph/static_buffers.h"
#include "gtest/gtest.h"
#include "runtime/cuda/capture_check.h"
#include "runtime/cuda/device_buffer.h"
#include "runtime/cuda/gpu_test_util.h"
#include "runtime/cuda/pinned_buffer.h"
#include "runtime/cuda/status.h"
#include "runtime/cuda/stream.h"

namespace kiln {
namespace {

using graph_internal::Download;
using graph_internal::LaunchAffine;
using graph_internal::LaunchFill;
using graph_internal::LaunchSquareAdd;
using graph_internal::LaunchTiles;
using graph_internal::PoisonFloats;
using graph_internal::RandomFloats;
using graph_internal::RelativeError;
using graph_internal::Upload;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int kFloatsPerSeq = 4096;
constexpr float kA = 0.75f, kB = -0.5f;

// y = (a x + b)^2 + x over key.size * kFloatsPerSeq floats, with a + b in pool scratch.
class AffineStep {
 public:
  AffineStep(GraphMemoryPool* pool, const float* x, float* y) : pool_(pool), x_(x), y_(y) {}

  absl::Status operator()(CaptureKey key, cudaStream_t stream) const {
    const int n = key.size * kFloatsPerSeq;
    ASSIGN_OR_RETURN(void* tmp, pool_->Allocate(n * sizeof(float), "affine tmp"));
    ASSIGN_OR_RETURN(void* workspace, pool_->Allocate(key.size * 1024, "workspace"));
    (void)workspace;  // held to show the pool accounts every allocation of a key
    CUDA_RETURN_IF_ERROR(LaunchAffine(x_, static_cast<float*>(tmp), n, kA, kB, stream));
    CUDA_RETURN_IF_ERROR(LaunchSquareAdd(static_cast<float*>(tmp), x_, y_, n, stream));
    return absl::OkStatus();
  }

  static size_t PoolBytes(int size) {
    return PoolArena::AlignUp(size_t{4} * size * kFloatsPerSeq) + PoolArena::AlignUp(size * 1024);
  }

 private:
  GraphMemoryPool* pool_;
  const float* x_;
  float* y_;
};

std::vector<double> AffineReference(const std::vector<float>& x, size_t n) {
  std::vector<double> y(n);
  for (size_t i = 0; i < n; ++i) {
    const double t = double{kA} * x[i] + double{kB};
    y[i] = t * t + x[i];
  }
  return y;
}

class GraphSetGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KILN_REQUIRE_GPUS(1);
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    KILN_ASSERT_OK_AND_ASSIGN(stream_, Stream::Create());
  }

  // Allocates x and y for up to `max_seqs` sequences, fills x with fresh random values and
  // declares both as static buffers.
  void MakeBuffers(int max_seqs) {
    const size_t bytes = size_t{4} * max_seqs * kFloatsPerSeq;
    KILN_ASSERT_OK_AND_ASSIGN(x_, DeviceBuffer::Allocate(bytes, "x"));
    KILN_ASSERT_OK_AND_ASSIGN(y_, DeviceBuffer::Allocate(bytes, "y"));
    x_host_ = RandomFloats(bytes / 4, rng_);
    KILN_ASSERT_OK(Upload(x_.data(), x_host_));
    KILN_ASSERT_OK(buffers_.Bind("x", x_.data(), bytes, BufferRole::kInput));
    KILN_ASSERT_OK(buffers_.Bind("y", y_.data(), bytes, BufferRole::kOutput));
  }

  // Replays `key` (through `graph`, Find's graph of it, when given) from poisoned y and checks
  // it against the float64 reference.
  void ExpectReplayMatchesReference(const GraphSet& graphs, CaptureKey key,
                                    const GraphSet::Graph* graph = nullptr) {
    const size_t n = size_t{1} * key.size * kFloatsPerSeq;
    KILN_ASSERT_OK(PoisonFloats(y_.data(), n));
    KILN_ASSERT_OK(graph != nullptr ? graphs.Replay(*graph, stream_.get())
                                    : graphs.Replay(key, stream_.get()));
    KILN_ASSERT_OK(stream_.Synchronize());
    std::vector<float> got;
    KILN_ASSERT_OK_AND_ASSIGN(got, Download(y_.data(), n));
    EXPECT_LT(RelativeError(got, AffineReference(x_host_, n)), 1e-6) << KeyName(key);
  }

  Stream stream_;
  std::mt19937 rng_{std::random_device{}()};
  DeviceBuffer x_, y_;
  std::vector<float> x_host_;
  StaticBuffers buffers_;
};

TEST_F(GraphSetGpuTest, ReplayEqualsEagerBitForBitAndTheReference) {
  constexpr int kMaxSeqs = 64;
  MakeBuffers(kMaxSeqs);
  KILN_ASSERT_OK_AND_ASSIGN(CaptureSizes sizes, CaptureSizes::Decode(kMaxSeqs));
  KILN_ASSERT_OK_AND_ASSIGN(GraphMemoryPool pool, GraphMemoryPool::Create(8 << 20));
  std::ostringstream progress;
  GraphSetOptions options;
  options.verify_on_capture = true;
  options.progress = CaptureProgress::kLines;
  options.progress_stream = &progress;
  GraphSet graphs(&pool, options);
  AffineStep step(&pool, x_.as<float>(), y_.as<float>());

  KILN_ASSERT_OK_AND_ASSIGN(
      CaptureSummary summary,
      graphs.CaptureAll(GraphMode::kDecode, sizes, step, stream_.get(), &buffers_));
  EXPECT_EQ(summary.num_graphs, 11);  // 1, 2, 4, 8, 16, ..., 64
  EXPECT_EQ(graphs.size(), 11u);
  EXPECT_EQ(summary.pool_bytes, AffineStep::PoolBytes(kMaxSeqs));
  EXPECT_THAT(progress.str(), HasSubstr("Captured decode/64 (1/11): 2 nodes"));
  EXPECT_THAT(progress.str(), HasSubstr("Captured decode/1 (11/11): 2 nodes"));
  EXPECT_THAT(progress.str(), HasSubstr("Captured 11 graphs in "));
  std::cout << progress.str();
  for (const GraphStats& stats : graphs.AllStats()) {
    EXPECT_EQ(stats.num_nodes, 2u);
    EXPECT_EQ(stats.pool_bytes, AffineStep::PoolBytes(stats.key.size));
    EXPECT_GT(stats.capture_ms, 0.0);
    EXPECT_GT(stats.verify_ms, 0.0);
  }

  // Live batches of random sizes, fresh inputs each time: graph == eager, bit for bit.
  for (int trial = 0; trial < 6; ++trial) {
    const int batch = std::uniform_int_distribution<int>(1, kMaxSeqs)(rng_);
    const CaptureKey key{GraphMode::kDecode, *sizes.PaddedSize(batch)};
    const size_t n = size_t{1} * key.size * kFloatsPerSeq;
    x_host_ = RandomFloats(x_host_.size(), rng_);
    KILN_ASSERT_OK(Upload(x_.data(), x_host_));

    KILN_ASSERT_OK(PoisonFloats(y_.data(), n));
    pool.Begin(key);
    KILN_ASSERT_OK(step(key, stream_.get()));
    pool.End();
    std::vector<float> eager;
    KILN_ASSERT_OK_AND_ASSIGN(eager, Download(y_.data(), n));

    KILN_ASSERT_OK(PoisonFloats(y_.data(), n));
    KILN_ASSERT_OK(graphs.Replay(key, stream_.get()));
    std::vector<float> replayed;
    KILN_ASSERT_OK_AND_ASSIGN(replayed, Download(y_.data(), n));

    EXPECT_EQ(std::memcmp(eager.data(), replayed.data(), n * sizeof(float)), 0)
        << "batch " << batch << " padded to " << key.size;
    EXPECT_LT(RelativeError(replayed, AffineReference(x_host_, n)), 1e-6);
  }
}

TEST_F(GraphSetGpuTest, PoolIsSharedAcrossSizesMaximumNotSum) {
  MakeBuffers(64);
  KILN_ASSERT_OK_AND_ASSIGN(CaptureSizes sizes,
                            CaptureSizes::FromList({8, 64, 16, 32}, 64, "max_num_seqs"));
  KILN_ASSERT_OK_AND_ASSIGN(GraphMemoryPool pool, GraphMemoryPool::Create(4 << 20));
  GraphSetOptions options;
  options.progress = CaptureProgress::kQuiet;
  GraphSet graphs(&pool, options);
  AffineStep step(&pool, x_.as<float>(), y_.as<float>());
  KILN_ASSERT_OK(
      graphs.CaptureAll(GraphMode::kDecode, sizes, step, stream_.get(), &buffers_).status());

  size_t max_over_keys = 0, sum_over_keys = 0;
  for (int size : {8, 16, 32, 64}) {
    const CaptureKey key{GraphMode::kDecode, size};
    ASSERT_NE(graphs.Stats(key), nullptr);
    EXPECT_EQ(graphs.Stats(key)->pool_bytes, AffineStep::PoolBytes(size));
    EXPECT_EQ(pool.HighWater(key), AffineStep::PoolBytes(size));
    max_over_keys = std::max(max_over_keys, pool.HighWater(key));
    sum_over_keys += pool.HighWater(key);
  }
  EXPECT_EQ(pool.high_water_bytes(), max_over_keys);
  EXPECT_EQ(pool.high_water_bytes(), AffineStep::PoolBytes(64));
  EXPECT_LT(pool.high_water_bytes(), sum_over_keys);
  std::cout << pool.ToString() << "; the sum over keys would be " << FormatBytes(sum_over_keys)
            << "\n";

  // The graphs' scratch overlaps; replayed one at a time they are all still right.
  for (int size : {8, 64, 16, 32, 8}) {
    ExpectReplayMatchesReference(graphs, {GraphMode::kDecode, size});
  }
}

TEST_F(GraphSetGpuTest, BudgetExceededNamesTheKeyAndTheNextCaptureWorks) {
  MakeBuffers(64);
  constexpr size_t kBudget = 256 << 10;
  KILN_ASSERT_OK_AND_ASSIGN(GraphMemoryPool pool, GraphMemoryPool::Create(kBudget));
  AffineStep step(&pool, x_.as<float>(), y_.as<float>());
  auto bound = [&step](CaptureKey key) {
    return [&step, key](cudaStream_t s) { return step(key, s); };
  };
  for (int warmups : {2, 0}) {  // caught in a warm-up, and caught inside the capture
    GraphSetOptions options;
    options.warmups = warmups;
    GraphSet graphs(&pool, options);
    const CaptureKey big{GraphMode::kDecode, 64};
    absl::Status status = graphs.Capture(big, bound(big), stream_.get(), &buffers_);
    EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr("decode/64"));
    EXPECT_THAT(std::string(status.message()), HasSubstr("'affine tmp' asks 1048576 bytes"));
    EXPECT_THAT(std::string(status.message()), HasSubstr("budget of 262144 bytes"));
    EXPECT_FALSE(graphs.Contains(big));
    EXPECT_FALSE(IsCapturing(stream_.get()));

    const CaptureKey small{GraphMode::kDecode, 8};
    KILN_ASSERT_OK(graphs.Capture(small, bound(small), stream_.get(), &buffers_));
    ExpectReplayMatchesReference(graphs, small);
  }
}

// One illegal operation inside the captured function, the words its error must contain, and
// whether kiln's capture check names it (the raw CUDA calls are named by the function's status).
struct IllegalCase {
  const char* label;
  std::function<absl::Status(cudaStream_t, const Stream&, GraphMemoryPool&, void* device)> op;
  std::vector<const char*> expected;
};

TEST_F(GraphSetGpuTest, IllegalOperationsAreNamedAndTheStreamRecovers) {
  MakeBuffers(8);
  KILN_ASSERT_OK_AND_ASSIGN(GraphMemoryPool pool,
                            GraphMemoryPool::Create(/*budget_bytes=*/8 << 20,
                                                    /*reserve_bytes=*/1 << 20));
  std::vector<float> pageable(1024, 1.5f);
  const std::vector<IllegalCase> cases = {
      {"Stream::Synchronize",
       [](cudaStream_t, const Stream& stream, GraphMemoryPool&, void*) {
         return stream.Synchronize();
       },
       {"Stream::Synchronize (cudaStreamSynchronize) is illegal during CUDA graph capture"}},
      {"pageable CopyHostToDevice",
       [&pageable](cudaStream_t s, const Stream&, GraphMemoryPool&, void* device) {
         return CopyHostToDevice(device, pageable.data(), 4096, s);
       },
       {"Copy of 4096 bytes from pageable host memory to device is illegal"}},
      {"DeviceBuffer::Allocate",
       [](cudaStream_t, const Stream&, GraphMemoryPool&, void*) {
         return DeviceBuffer::Allocate(4096, "late").status();
       },
       {"cudaMalloc of 'late' is illegal"}},
      {"pool Reserve",
       [](cudaStream_t, const Stream&, GraphMemoryPool& pool, void*) {
         return pool.Reserve(2 << 20);
       },
       {"Graph memory pool growth from 1048576 to 2097152 bytes is illegal"}},
      {"pool Allocate beyond the reserved region",
       [](cudaStream_t, const Stream&, GraphMemoryPool& pool, void*) {
         return pool.Allocate(4 << 20, "big").status();
       },
       {"Graph memory pool growth for 'big'", "is illegal"}},
      {"raw cudaMalloc",
       [](cudaStream_t, const Stream&, GraphMemoryPool&, void*) {
         void* p = nullptr;
         CUDA_RETURN_IF_ERROR(cudaMalloc(&p, 4096));
         cudaFree(p);
         return absl::OkStatus();
       },
       {"cudaMalloc(&p, 4096) failed", "cudaErrorStreamCaptureUnsupported"}},
      {"raw cudaStreamSynchronize",
       [](cudaStream_t s, const Stream&, GraphMemoryPool&, void*) {
         CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
         return absl::OkStatus();
       },
       {"cudaStreamSynchronize(s) failed", "cudaErrorStreamCaptureUnsupported"}},
      {"raw cudaStreamSynchronize, result ignored",
       [](cudaStream_t s, const Stream&, GraphMemoryPool&, void*) {
         (void)cudaStreamSynchronize(s);
         return absl::OkStatus();
       },
       {"cudaErrorStreamCapture", "invalidated the capture"}},
  };

  GraphSetOptions options;
  options.warmups = 0;  // warm-ups are eager, where all of these are legal
  GraphSet graphs(&pool, options);
  const CaptureKey key{GraphMode::kDecode, 8};
  AffineStep good(&pool, x_.as<float>(), y_.as<float>());
  for (const IllegalCase& c : cases) {
    SCOPED_TRACE(c.label);
    absl::Status status = graphs.Capture(
        key,
        [&](cudaStream_t s) -> absl::Status {
          RETURN_IF_ERROR(good(key, s));  // legal work first, then the illegal operation
          return c.op(s, stream_, pool, y_.data());
        },
        stream_.get(), &buffers_);
    EXPECT_FALSE(status.ok());
    EXPECT_THAT(std::string(status.message()), HasSubstr("Capture of decode/8 failed: "));
    for (const char* expected : c.expected) {
      EXPECT_THAT(std::string(status.message()), HasSubstr(expected));
    }
    std::cout << c.label << " -> " << status << "\n";
    EXPECT_FALSE(graphs.Contains(key));
    EXPECT_EQ(pool.reserved_bytes(), size_t{1} << 20);  // refused, not done
    // Nothing is left behind: not capturing, no phase, no record, no sticky error.
    EXPECT_FALSE(IsCapturing(stream_.get()));
    EXPECT_EQ(CaptureContext::Phase(), CapturePhase::kEager);
    EXPECT_EQ(TakeFirstIllegalDuringCapture(), "");
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    KILN_ASSERT_OK(stream_.Synchronize());
    // The same stream captures a good step and replays it right.
    KILN_ASSERT_OK(graphs.Capture(
        key, [&](cudaStream_t s) { return good(key, s); }, stream_.get(), &buffers_));
    ExpectReplayMatchesReference(graphs, key);
  }
}

TEST_F(GraphSetGpuTest, MovedStaticBufferIsRefusedByName) {
  MakeBuffers(8);
  KILN_ASSERT_OK_AND_ASSIGN(GraphMemoryPool pool, GraphMemoryPool::Create(1 << 20));
  GraphSet graphs(&pool);
  AffineStep step(&pool, x_.as<float>(), y_.as<float>());
  const CaptureKey key{GraphMode::kDecode, 8};
  KILN_ASSERT_OK(graphs.Capture(
      key, [&](cudaStream_t s) { return step(key, s); }, stream_.get(), &buffers_));
  ExpectReplayMatchesReference(graphs, key);

  // The owner reallocates x and re-declares it: the graph would read the old address.
  KILN_ASSERT_OK_AND_ASSIGN(DeviceBuffer moved, DeviceBuffer::Allocate(x_.size(), "x moved"));
  KILN_ASSERT_OK(buffers_.Bind("x", moved.data(), moved.size(), BufferRole::kInput));
  absl::Status status = graphs.Replay(key, stream_.get());
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("Static buffer 'x' moved"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("capture decode/8 again"));
  EXPECT_EQ(graphs.Verify(key, stream_.get()).code(), absl::StatusCode::kFailedPrecondition);

  KILN_ASSERT_OK(buffers_.Bind("x", x_.data(), x_.size(), BufferRole::kInput));
  ExpectReplayMatchesReference(graphs, key);

  // Moving the pool's region is refused the same way.
  KILN_ASSERT_OK(pool.Reserve(512 << 10));
  status = graphs.Replay(key, stream_.get());
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("re-reserved"));

  absl::Status unknown = graphs.Replay({GraphMode::kPrefill, 8}, stream_.get());
  EXPECT_EQ(unknown.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(unknown.message()), HasSubstr("No graph for prefill/8"));
}

// Find looks a key up once; replaying its graph computes what replaying the key computes, and
// refuses what Replay(key) refuses (a moved static buffer, a re-reserved pool) with the same
// status.
TEST_F(GraphSetGpuTest, ReplayOfFindsGraphEqualsReplayOfTheKey) {
  MakeBuffers(8);
  KILN_ASSERT_OK_AND_ASSIGN(GraphMemoryPool pool, GraphMemoryPool::Create(1 << 20));
  GraphSet graphs(&pool);
  AffineStep step(&pool, x_.as<float>(), y_.as<float>());
  const CaptureKey key{GraphMode::kDecode, 8}, small{GraphMode::kDecode, 4};
  for (const CaptureKey k : {key, small}) {  // largest first
    KILN_ASSERT_OK(graphs.Capture(
        k, [&step, k](cudaStream_t s) { return step(k, s); }, stream_.get(), &buffers_));
  }
  EXPECT_EQ(graphs.Find({GraphMode::kDecode, 2}), nullptr);
  EXPECT_EQ(graphs.Find({GraphMode::kPrefill, 8}), nullptr);
  const GraphSet::Graph* graph = graphs.Find(key);
  const GraphSet::Graph* small_graph = graphs.Find(small);
  ASSERT_NE(graph, nullptr);
  ASSERT_NE(small_graph, nullptr);
  EXPECT_NE(small_graph, graph);
  ExpectReplayMatchesReference(graphs, key, graph);
  ExpectReplayMatchesReference(graphs, small, small_graph);

  KILN_ASSERT_OK_AND_ASSIGN(DeviceBuffer moved, DeviceBuffer::Allocate(x_.size(), "x moved"));
  KILN_ASSERT_OK(buffers_.Bind("x", moved.data(), moved.size(), BufferRole::kInput));
  absl::Status status = graphs.Replay(*graph, stream_.get());
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("Static buffer 'x' moved"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("capture decode/8 again"));
  EXPECT_EQ(status, graphs.Replay(key, stream_.get()));

  KILN_ASSERT_OK(buffers_.Bind("x", x_.data(), x_.size(), BufferRole::kInput));
  ExpectReplayMatchesReference(graphs, key, graph);

  KILN_ASSERT_OK(pool.Reserve(512 << 10));
  status = graphs.Replay(*graph, stream_.get());
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("re-reserved after decode/8"));
  EXPECT_EQ(status, graphs.Replay(key, stream_.get()));
}

// A graph replays only with the set whose Find returned it: another set, even one that holds a
// graph of the same key, refuses it with InvalidArgument naming the fix and launches nothing.
TEST_F(GraphSetGpuTest, ReplayOfAnotherSetsGraphIsInvalidArgument) {
  MakeBuffers(8);
  KILN_ASSERT_OK_AND_ASSIGN(GraphMemoryPool pool, GraphMemoryPool::Create(1 << 20));
  GraphSet first(&pool), second(&pool);  // one replays at a time, so they may share the pool
  AffineStep step(&pool, x_.as<float>(), y_.as<float>());
  const CaptureKey key{GraphMode::kDecode, 8}, small{GraphMode::kDecode, 4};
  for (const CaptureKey k : {key, small}) {
    KILN_ASSERT_OK(first.Capture(
        k, [&step, k](cudaStream_t s) { return step(k, s); }, stream_.get(), &buffers_));
  }
  KILN_ASSERT_OK(second.Capture(
      key, [&step, key](cudaStream_t s) { return step(key, s); }, stream_.get(), &buffers_));
  const GraphSet::Graph* first_graph = first.Find(key);
  const GraphSet::Graph* first_small = first.Find(small);
  const GraphSet::Graph* second_graph = second.Find(key);
  ASSERT_NE(first_graph, nullptr);
  ASSERT_NE(first_small, nullptr);
  ASSERT_NE(second_graph, nullptr);
  EXPECT_EQ(second.Find(small), nullptr);

  const size_t n = size_t{1} * key.size * kFloatsPerSeq;
  struct Case {
    const GraphSet* set;
    const GraphSet::Graph* graph;
    std::string key;
  };
  for (const Case& c : {Case{&second, first_graph, "decode/8"},
                        Case{&second, first_small, "decode/4"},
                        Case{&first, second_graph, "decode/8"}}) {
    SCOPED_TRACE(c.key);
    KILN_ASSERT_OK(PoisonFloats(y_.data(), n));
    const absl::Status status = c.set->Replay(*c.graph, stream_.get());
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()),
                HasSubstr("GraphSet::Replay got the graph of " + c.key +
                          " that another GraphSet holds; replay a graph with the set that Find "
                          "returned it from"));
    KILN_ASSERT_OK(stream_.Synchronize());
    std::vector<float> got;
    KILN_ASSERT_OK_AND_ASSIGN(got, Download(y_.data(), n));
    ASSERT_EQ(got.size(), n);
    size_t written = 0;  // elements that lost PoisonFloats' 0xFF bytes
    for (const float v : got) {
      uint32_t bits = 0;
      std::memcpy(&bits, &v, sizeof(bits));
      written += bits != 0xFFFFFFFFu;
    }
    EXPECT_EQ(written, 0u) << "a refused replay launched the graph";
  }
  // Each set still replays its own graphs.
  ExpectReplayMatchesReference(first, key, first_graph);
  ExpectReplayMatchesReference(first, small, first_small);
  ExpectReplayMatchesReference(second, key, second_graph);
}

// A step over `capacity` rows whose batch has *num_rows live rows. `grid_from_contents` computes
// the grid from the host's copy of the batch at call time (frozen into a graph at capture);
// otherwise from the key (right for any batch the key covers).
struct TilesStep {
  const float* x;
  float* y;
  const int* num_rows_device;
  const int* num_rows_host;
  bool grid_from_contents;

  absl::Status operator()(CaptureKey key, cudaStream_t stream) const {
    const int rows = grid_from_contents ? *num_rows_host : key.size;
    const int tiles = (rows + graph_internal::kRowsPerTile - 1) / graph_internal::kRowsPerTile;
    CUDA_RETURN_IF_ERROR(LaunchTiles(x, y, num_rows_device, tiles, stream));
    return absl::OkStatus();
  }
};

TEST_F(GraphSetGpuTest, VerifyCatchesALaunchShapeFrozenAtCapture) {
  constexpr int kCapacity = 256;
  KILN_ASSERT_OK_AND_ASSIGN(DeviceBuffer x, DeviceBuffer::Allocate(kCapacity * 4, "x"));
  KILN_ASSERT_OK_AND_ASSIGN(DeviceBuffer y_frozen, DeviceBuffer::Allocate(kCapacity * 4, "y"));
  KILN_ASSERT_OK_AND_ASSIGN(DeviceBuffer y_keyed, DeviceBuffer::Allocate(kCapacity * 4, "y"));
  KILN_ASSERT_OK_AND_ASSIGN(DeviceBuffer rows_dev, DeviceBuffer::Allocate(sizeof(int), "rows"));
  KILN_ASSERT_OK_AND_ASSIGN(PinnedHostBuffer rows_pinned,
                            PinnedHostBuffer::Allocate(sizeof(int), "rows"));
  const std::vector<float> x_host = RandomFloats(kCapacity, rng_);
  KILN_ASSERT_OK(Upload(x.data(), x_host));
  int* rows_host = rows_pinned.as<int>();

  StaticBuffers frozen_buffers, keyed_buffers;
  for (StaticBuffers* b : {&frozen_buffers, &keyed_buffers}) {
    KILN_ASSERT_OK(b->Bind("x", x.data(), x.size(), BufferRole::kInput));
    KILN_ASSERT_OK(b->Bind("num_rows", rows_dev.data(), sizeof(int), BufferRole::kInput));
  }
  KILN_ASSERT_OK(frozen_buffers.Bind("y", y_frozen.data(), y_frozen.size(), BufferRole::kOutput));
  KILN_ASSERT_OK(keyed_buffers.Bind("y", y_keyed.data(), y_keyed.size(), BufferRole::kOutput));

  // ReplayPrepare: the batch's row count reaches the device by an async copy from pinned memory.
  auto prepare = [&](CaptureKey key, int rows) -> absl::Status {
    ReplayPrepareScope scope(key);
    EXPECT_EQ(CaptureContext::Phase(), CapturePhase::kReplayPrepare);
    *rows_host = rows;
    return CopyHostToDevice(rows_dev.data(), rows_host, sizeof(int), stream_.get());
  };

  GraphSetOptions options;
  options.verify_on_capture = true;
  GraphSet graphs(nullptr, options);
  const CaptureKey frozen{GraphMode::kPrefill, kCapacity};
  const CaptureKey keyed{GraphMode::kMixed, kCapacity};
  TilesStep frozen_step{x.as<float>(), y_frozen.as<float>(), rows_dev.as<int>(), rows_host, true};
  TilesStep keyed_step{x.as<float>(), y_keyed.as<float>(), rows_dev.as<int>(), rows_host, false};

  // Captured with 80 rows (2 tiles): both graphs equal eager for the batch they saw.
  KILN_ASSERT_OK(prepare(frozen, 80));
  KILN_ASSERT_OK(graphs.Capture(
      frozen, [&](cudaStream_t s) { return frozen_step(frozen, s); }, stream_.get(),
      &frozen_buffers));
  KILN_ASSERT_OK(graphs.Capture(
      keyed, [&](cudaStream_t s) { return keyed_step(keyed, s); }, stream_.get(), &keyed_buffers));

  // The next batch has 200 rows (4 tiles). The frozen graph still launches 2.
  KILN_ASSERT_OK(prepare(frozen, 200));
  absl::Status stale = graphs.Verify(frozen, stream_.get());
  EXPECT_EQ(stale.code(), absl::StatusCode::kInternal);
  // Row 128, the first row of the third tile: its float is bytes 512..515. The first of them
  // that differs is 512 unless the eager float's low byte happens to equal the poison (0xa5,
  // one draw of x in 256), then the next.
  const std::string prefix =
      "Graph prefill/256 differs from an eager run: output 'y' first differs at byte offset ";
  const std::string message(stale.message());
  ASSERT_THAT(message, HasSubstr(prefix));
  const int offset = std::atoi(message.c_str() + message.find(prefix) + prefix.size());
  EXPECT_GE(offset, 512) << message;
  EXPECT_LT(offset, 516) << message;
  std::cout << stale << "\n";
  KILN_ASSERT_OK(graphs.Verify(keyed, stream_.get()));

  // And the graph whose grid comes from the key replays right for this batch.
  KILN_ASSERT_OK(PoisonFloats(y_keyed.data(), kCapacity));
  KILN_ASSERT_OK(graphs.Replay(keyed, stream_.get()));
  std::vector<float> got;
  KILN_ASSERT_OK_AND_ASSIGN(got, Download(y_keyed.data(), kCapacity));
  for (int r = 0; r < kCapacity; ++r) {
    const float want = r < 200 ? 2.0f * x_host[r] + 1.0f : 0.0f;
    ASSERT_EQ(got[r], want) << "row " << r;
  }
}

// A component that changes behaviour under capture, the way a collective does: eager paths
// write 1, the captured path writes 2. It reads the phase on every call and records it.
class PhaseAwareComponent {
 public:
  absl::Status Run(float* y, int n, cudaStream_t stream) {
    const CapturePhase phase = CaptureContext::Phase();
    seen_.push_back(phase);
    keys_.push_back(CaptureContext::Key());
    const float value = phase == CapturePhase::kCapture ? 2.0f : 1.0f;
    CUDA_RETURN_IF_ERROR(LaunchFill(y, n, value, stream));
    return absl::OkStatus();
  }
  std::vector<CapturePhase> seen_;
  std::vector<CaptureKey> keys_;
};

TEST_F(GraphSetGpuTest, ComponentsSeeWarmupThenCaptureAndTheCapturedBranchIsReplayed) {
  MakeBuffers(8);
  PhaseAwareComponent component;
  GraphSet graphs;  // two warm-ups by default
  const CaptureKey key{GraphMode::kDecode, 8};
  const int n = 8 * kFloatsPerSeq;
  KILN_ASSERT_OK(graphs.Capture(
      key, [&](cudaStream_t s) { return component.Run(y_.as<float>(), n, s); }, stream_.get(),
      &buffers_));
  EXPECT_THAT(component.seen_,
              ElementsAre(CapturePhase::kWarmup, CapturePhase::kWarmup, CapturePhase::kCapture));
  for (const CaptureKey& k : component.keys_) EXPECT_EQ(k, key);
  EXPECT_EQ(CaptureContext::Phase(), CapturePhase::kEager);

  // The warm-ups left 1s behind; the replay writes the capture-time decision, 2.
  KILN_ASSERT_OK(PoisonFloats(y_.data(), n));
  KILN_ASSERT_OK(graphs.Replay(key, stream_.get()));
  std::vector<float> got;
  KILN_ASSERT_OK_AND_ASSIGN(got, Download(y_.data(), n));
  for (int i = 0; i < n; ++i) ASSERT_EQ(got[i], 2.0f) << i;

  // Verify (eager writes 1) flags the difference; with verify-on-capture the graph is refused.
  absl::Status verify = graphs.Verify(key, stream_.get());
  EXPECT_EQ(verify.code(), absl::StatusCode::kInternal);
  // 1.0f is 00 00 80 3f and 2.0f is 00 00 00 40 in memory: the first differing byte is byte 2.
  EXPECT_THAT(std::string(verify.message()),
              HasSubstr("output 'y' first differs at byte offset 2 (graph 0x00, eager 0x80"));
  GraphSetOptions options;
  options.verify_on_capture = true;
  GraphSet verified(nullptr, options);
  absl::Status refused = verified.Capture(
      key, [&](cudaStream_t s) { return component.Run(y_.as<float>(), n, s); }, stream_.get(),
      &buffers_);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInternal);
  EXPECT_FALSE(verified.Contains(key));
}

}  // namespace
}  // namespace kiln
