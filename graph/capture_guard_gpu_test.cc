// CaptureGuard on a GPU: a clean capture yields the launched nodes and sets the phase; a failed
// or abandoned capture leaves the stream usable; errors name what broke the capture.
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "graph/capture_guard.h"
#include "graph/internal/gpu_test_helpers.h"
#include "graph/internal/test_kernels.h"
#include "gtest/gtest.h"
#include "runtime/cuda/capture_check.h"
#include "runtime/cuda/device_buffer.h"
#include "runtime/cuda/gpu_test_util.h"
#include "runtime/cuda/stream.h"

namespace kiln {
namespace {

using graph_internal::Download;
using graph_internal::LaunchFill;
using graph_internal::PoisonFloats;
using ::testing::HasSubstr;

constexpr CaptureKey kKey{GraphMode::kDecode, 4};
constexpr int kN = 1000;

class CaptureGuardGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KILN_REQUIRE_GPUS(1);
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    KILN_ASSERT_OK_AND_ASSIGN(stream_, Stream::Create());
    KILN_ASSERT_OK_AND_ASSIGN(y_, DeviceBuffer::Allocate(kN * sizeof(float), "y"));
  }

  // Captures a fill of `value` and replays it, checking every element.
  void ExpectCaptureAndReplayWork(float value) {
    CaptureGuard guard(stream_.get(), kKey);
    ASSERT_TRUE(guard.ok()) << guard.begin_status();
    ASSERT_EQ(LaunchFill(y_.as<float>(), kN, value, stream_.get()), cudaSuccess);
    OwnedGraph graph;
    KILN_ASSERT_OK_AND_ASSIGN(graph, guard.End());
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph.get(), 0), cudaSuccess);
    KILN_ASSERT_OK(PoisonFloats(y_.data(), kN));
    ASSERT_EQ(cudaGraphLaunch(exec, stream_.get()), cudaSuccess);
    KILN_ASSERT_OK(stream_.Synchronize());
    ASSERT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
    std::vector<float> got;
    KILN_ASSERT_OK_AND_ASSIGN(got, Download(y_.data(), kN));
    for (int i = 0; i < kN; ++i) ASSERT_EQ(got[i], value) << i;
  }

  Stream stream_;
  DeviceBuffer y_;
};

TEST_F(CaptureGuardGpuTest, CapturesTheLaunchedNodesAndSetsThePhase) {
  CaptureGuard guard(stream_.get(), kKey);
  ASSERT_TRUE(guard.ok()) << guard.begin_status();
  EXPECT_TRUE(guard.capturing());
  EXPECT_EQ(CaptureContext::Phase(), CapturePhase::kCapture);
  EXPECT_EQ(CaptureContext::Key(), kKey);
  EXPECT_TRUE(IsCapturing(stream_.get()));
  EXPECT_TRUE(IsCapturing(nullptr));  // the thread is capturing: every stream is unsafe
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(LaunchFill(y_.as<float>(), kN, 1.0f + i, stream_.get()), cudaSuccess);
  }
  absl::StatusOr<OwnedGraph> graph = guard.End();
  ASSERT_TRUE(graph.ok()) << graph.status();
  size_t nodes = 0;
  ASSERT_EQ(cudaGraphGetNodes(graph->get(), nullptr, &nodes), cudaSuccess);
  EXPECT_EQ(nodes, 3u);
  EXPECT_FALSE(guard.capturing());
  EXPECT_EQ(CaptureContext::Phase(), CapturePhase::kEager);
  EXPECT_FALSE(IsCapturing(stream_.get()));
  EXPECT_EQ(guard.End().status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(CaptureGuardGpuTest, DestructorEndsAnUnfinishedCaptureCleanly) {
  {
    CaptureGuard guard(stream_.get(), kKey);
    ASSERT_TRUE(guard.ok());
    ASSERT_EQ(LaunchFill(y_.as<float>(), kN, 3.0f, stream_.get()), cudaSuccess);
    // An illegal call refused by kiln's check: its record must not leak into the next capture.
    EXPECT_FALSE(stream_.Synchronize().ok());
  }
  EXPECT_FALSE(IsCapturing(stream_.get()));
  EXPECT_EQ(CaptureContext::Phase(), CapturePhase::kEager);
  EXPECT_EQ(TakeFirstIllegalDuringCapture(), "");
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  KILN_ASSERT_OK(stream_.Synchronize());
  ExpectCaptureAndReplayWork(4.0f);
}

TEST_F(CaptureGuardGpuTest, IllegalHelperCallIsNamedAndTheNextCaptureWorks) {
  {
    CaptureGuard guard(stream_.get(), kKey);
    ASSERT_TRUE(guard.ok());
    ASSERT_EQ(LaunchFill(y_.as<float>(), kN, 3.0f, stream_.get()), cudaSuccess);
    absl::Status sync = stream_.Synchronize();
    EXPECT_EQ(sync.code(), absl::StatusCode::kFailedPrecondition);
    // The body carries on as if nothing happened; End still names the first illegal call.
    absl::StatusOr<OwnedGraph> graph = guard.End();
    EXPECT_EQ(graph.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(graph.status().message(),
              "Capture of decode/4 failed: Stream::Synchronize (cudaStreamSynchronize) is illegal "
              "during CUDA graph capture; do it before the capture begins or outside the "
              "captured function");
  }
  ExpectCaptureAndReplayWork(5.0f);
}

TEST_F(CaptureGuardGpuTest, RawIllegalCallIsExplainedAndTheNextCaptureWorks) {
  {
    CaptureGuard guard(stream_.get(), kKey);
    ASSERT_TRUE(guard.ok());
    void* p = nullptr;
    const cudaError_t malloc_error = cudaMalloc(&p, 4096);
    EXPECT_NE(malloc_error, cudaSuccess);
    if (malloc_error == cudaSuccess) cudaFree(p);
    absl::StatusOr<OwnedGraph> graph = guard.End();
    EXPECT_EQ(graph.status().code(), absl::StatusCode::kFailedPrecondition) << graph.status();
    EXPECT_THAT(std::string(graph.status().message()), HasSubstr("Capture of decode/4 failed: "));
    EXPECT_THAT(std::string(graph.status().message()), HasSubstr("raw cudaMalloc"));
    std::cout << graph.status() << "\n";
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  ExpectCaptureAndReplayWork(6.0f);
}

TEST_F(CaptureGuardGpuTest, UnjoinedForkIsExplained) {
  KILN_ASSERT_OK_AND_ASSIGN(Stream side, Stream::Create());
  {
    CaptureGuard guard(stream_.get(), kKey);
    ASSERT_TRUE(guard.ok());
    cudaEvent_t fork = nullptr;
    ASSERT_EQ(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming), cudaSuccess);
    ASSERT_EQ(cudaEventRecord(fork, stream_.get()), cudaSuccess);
    ASSERT_EQ(cudaStreamWaitEvent(side.get(), fork, 0), cudaSuccess);
    ASSERT_EQ(LaunchFill(y_.as<float>(), kN, 1.0f, side.get()), cudaSuccess);  // never joined
    absl::StatusOr<OwnedGraph> graph = guard.End();
    EXPECT_EQ(graph.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(graph.status().message()),
                HasSubstr("cudaErrorStreamCaptureUnjoined: work forked onto another stream"));
    cudaEventDestroy(fork);
  }
  EXPECT_FALSE(IsCapturing(side.get()));
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  ExpectCaptureAndReplayWork(7.0f);
}

TEST_F(CaptureGuardGpuTest, DefaultStreamIsRefusedBeforeBeginning) {
  CaptureGuard guard(nullptr, kKey);
  EXPECT_FALSE(guard.ok());
  EXPECT_EQ(guard.begin_status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CaptureContext::Phase(), CapturePhase::kEager);
  EXPECT_EQ(guard.End().status().code(), absl::StatusCode::kInvalidArgument);
  ExpectCaptureAndReplayWork(8.0f);
}

TEST_F(CaptureGuardGpuTest, NestedCaptureOnAnotherStreamIsRefusedAndTheOuterOneKeepsItsChecks) {
  KILN_ASSERT_OK_AND_ASSIGN(Stream other, Stream::Create());
  {
    CaptureGuard outer(stream_.get(), kKey);
    ASSERT_TRUE(outer.ok()) << outer.begin_status();
    ASSERT_EQ(LaunchFill(y_.as<float>(), kN, 1.0f, stream_.get()), cudaSuccess);
    {
      CaptureGuard inner(other.get(), {GraphMode::kPrefill, 16});
      EXPECT_FALSE(inner.ok());
      EXPECT_EQ(inner.begin_status().code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_THAT(std::string(inner.begin_status().message()), HasSubstr("nested"));
      cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
      ASSERT_EQ(cudaStreamIsCapturing(other.get(), &status), cudaSuccess);
      EXPECT_EQ(status, cudaStreamCaptureStatusNone);
    }
    // The refused inner guard left the outer capture's note in place: kiln's helpers still refuse
    // by name, and the outer End reports it.
    EXPECT_EQ(CaptureContext::Phase(), CapturePhase::kCapture);
    EXPECT_EQ(DeviceBuffer::Allocate(16, "after the inner guard").status().code(),
              absl::StatusCode::kFailedPrecondition);
    absl::StatusOr<OwnedGraph> graph = outer.End();
    EXPECT_EQ(graph.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(graph.status().message()), HasSubstr("after the inner guard"));
  }
  ExpectCaptureAndReplayWork(9.0f);
}

TEST_F(CaptureGuardGpuTest, ModeIsConfigurable) {
  // Relaxed mode lets the thread make unsafe calls CUDA-wise; kiln's helpers still refuse them.
  CaptureGuard guard(stream_.get(), kKey, cudaStreamCaptureModeRelaxed);
  ASSERT_TRUE(guard.ok());
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  ASSERT_EQ(cudaStreamIsCapturing(stream_.get(), &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusActive);
  ASSERT_EQ(LaunchFill(y_.as<float>(), kN, 1.0f, stream_.get()), cudaSuccess);
  EXPECT_EQ(DeviceBuffer::Allocate(16, "relaxed").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(guard.End().status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace kiln
