// GPU tests of Gemm (cuBLASLt y = x · Wᵀ) against a CPU float64 reference, for decode and
// prefill shapes of the 1B model and odd sizes, bf16 and float outputs; determinism, capture
// into a graph, and the errors it reports.
#include "runtime/model/gemm.h"

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/cuda/capture_check.h"
#include "runtime/model/bf16.h"
#include "runtime/model/internal/gpu_test_helpers.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;
using testing_internal::Bf16ToDouble;
using testing_internal::DeviceVector;
using testing_internal::GpuTest;
using testing_internal::RelativeError;

const __nv_bfloat16* Bf(const uint16_t* p) { return reinterpret_cast<const __nv_bfloat16*>(p); }

std::vector<double> Reference(const std::vector<uint16_t>& x, const std::vector<uint16_t>& w,
                              int64_t m, int64_t n, int64_t k) {
  const std::vector<double> xd = Bf16ToDouble(x), wd = Bf16ToDouble(w);
  std::vector<double> y(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0.0;
      const double* xr = xd.data() + i * k;
      const double* wr = wd.data() + j * k;
      for (int64_t t = 0; t < k; ++t) acc += xr[t] * wr[t];
      y[i * n + j] = acc;
    }
  }
  return y;
}

class GemmGpuTest : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped()) return;
    absl::StatusOr<std::unique_ptr<Gemm>> g = Gemm::Create();
    ASSERT_TRUE(g.ok()) << g.status();
    gemm_ = *std::move(g);
  }
  std::unique_ptr<Gemm> gemm_;
};

struct Shape { int64_t m, n, k; };

TEST_F(GemmGpuTest, Bf16OutputMatchesReference) {
  // Decode and prefill shapes of the 1B model (qkv, o, gate_up, down), then small and odd ones.
  for (const Shape s : {Shape{1, 3072, 2048}, Shape{1, 2048, 8192}, Shape{7, 16384, 2048},
                        Shape{33, 2048, 2048}, Shape{128, 3072, 2048}, Shape{257, 512, 256},
                        Shape{3, 24, 40}, Shape{13, 100, 72}, Shape{5, 33, 67}, Shape{1, 1, 1}}) {
    SCOPED_TRACE(::testing::Message() << "m " << s.m << " n " << s.n << " k " << s.k);
    const std::vector<uint16_t> x = RandomBf16(s.m * s.k, -1, 1);
    const std::vector<uint16_t> w = RandomBf16(s.n * s.k, -1, 1);
    DeviceVector<uint16_t> d_x(x, stream()), d_w(w, stream()), d_y(s.m * s.n);
    d_y.Poison(stream());
    absl::Status status =
        gemm_->Run(Bf(d_x.get()), Bf(d_w.get()), d_y.get(), s.m, s.n, s.k, stream());
    ASSERT_TRUE(status.ok()) << status;
    const double err =
        RelativeError(Bf16ToDouble(d_y.Download(stream())), Reference(x, w, s.m, s.n, s.k));
    EXPECT_LT(err, 4e-3);
    absl::StatusOr<GemmAlgorithmInfo> algo = gemm_->Algorithm(s.m, s.n, s.k);
    ASSERT_TRUE(algo.ok());
    std::cout << "m " << s.m << " n " << s.n << " k " << s.k << ": rel err " << err << ", "
              << algo->ToString() << "\n";
  }
}

TEST_F(GemmGpuTest, FloatOutputForLogits) {
  for (const Shape s : {Shape{1, 1024, 256}, Shape{3, 128256, 256}, Shape{9, 1001, 64}}) {
    SCOPED_TRACE(::testing::Message() << "m " << s.m << " n " << s.n << " k " << s.k);
    const std::vector<uint16_t> x = RandomBf16(s.m * s.k, -2, 2);
    const std::vector<uint16_t> w = RandomBf16(s.n * s.k, -1, 1);
    DeviceVector<uint16_t> d_x(x, stream()), d_w(w, stream());
    DeviceVector<float> d_y(s.m * s.n);
    d_y.Poison(stream());
    ASSERT_TRUE(gemm_->Run(Bf(d_x.get()), Bf(d_w.get()), d_y.get(), s.m, s.n, s.k, stream(),
                           GemmOutput::kFloat32)
                    .ok());
    const std::vector<float> y = d_y.Download(stream());
    // Products of bf16 values are exact in float; only float accumulation rounds.
    EXPECT_LT(
        RelativeError(std::vector<double>(y.begin(), y.end()), Reference(x, w, s.m, s.n, s.k)),
        1e-5);
  }
}

TEST_F(GemmGpuTest, SameShapeSameBitsAndAlgorithm) {
  const Shape s{32, 2048, 8192};
  const std::vector<uint16_t> x = RandomBf16(s.m * s.k), w = RandomBf16(s.n * s.k);
  DeviceVector<uint16_t> d_x(x, stream()), d_w(w, stream()), d_y(s.m * s.n);
  ASSERT_TRUE(gemm_->Run(Bf(d_x.get()), Bf(d_w.get()), d_y.get(), s.m, s.n, s.k, stream()).ok());
  const std::vector<uint16_t> first = d_y.Download(stream());
  const GemmAlgorithmInfo algo = *gemm_->Algorithm(s.m, s.n, s.k);
  for (int i = 0; i < 5; ++i) {
    d_y.Poison(stream());
    ASSERT_TRUE(gemm_->Run(Bf(d_x.get()), Bf(d_w.get()), d_y.get(), s.m, s.n, s.k, stream()).ok());
    ASSERT_EQ(d_y.Download(stream()), first) << "run " << i;
  }
  // A second Gemm object picks the same algorithm for the same shape.
  absl::StatusOr<std::unique_ptr<Gemm>> other = Gemm::Create();
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE((*other)->Prepare(s.m, s.n, s.k).ok());
  EXPECT_EQ((*other)->Algorithm(s.m, s.n, s.k)->ToString(), algo.ToString());
  EXPECT_EQ(gemm_->prepared_shapes(), 1u);
  EXPECT_LE(algo.workspace_bytes, gemm_->workspace_bytes());
}

TEST_F(GemmGpuTest, CapturedGraphReplaysTheSameBits) {
  const Shape s{8, 3072, 2048};
  const std::vector<uint16_t> x = RandomBf16(s.m * s.k), w = RandomBf16(s.n * s.k);
  DeviceVector<uint16_t> d_x(x, stream()), d_w(w, stream()), d_y(s.m * s.n);
  ASSERT_TRUE(gemm_->Run(Bf(d_x.get()), Bf(d_w.get()), d_y.get(), s.m, s.n, s.k, stream()).ok());
  const std::vector<uint16_t> eager = d_y.Download(stream());

  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeGlobal), cudaSuccess);
  absl::Status captured =
      gemm_->Run(Bf(d_x.get()), Bf(d_w.get()), d_y.get(), s.m, s.n, s.k, stream());
  // A shape never prepared is refused during capture, and the capture survives it.
  absl::Status unprepared =
      gemm_->Run(Bf(d_x.get()), Bf(d_w.get()), d_y.get(), s.m + 1, s.n, s.k, stream());
  ASSERT_EQ(cudaStreamEndCapture(stream(), &graph), cudaSuccess);
  ASSERT_TRUE(captured.ok()) << captured;
  EXPECT_EQ(unprepared.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(unprepared.message()), HasSubstr("Gemm::Prepare"));
  EXPECT_THAT(TakeFirstIllegalDuringCapture(), HasSubstr("m=9"));

  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int i = 0; i < 3; ++i) {
    d_y.Poison(stream());
    ASSERT_EQ(cudaGraphLaunch(exec, stream()), cudaSuccess);
    ASSERT_EQ(d_y.Download(stream()), eager) << "replay " << i;
  }
  // New input contents through the same graph.
  const std::vector<uint16_t> x2 = RandomBf16(s.m * s.k);
  d_x.Upload(x2, stream());
  ASSERT_EQ(cudaGraphLaunch(exec, stream()), cudaSuccess);
  EXPECT_LT(RelativeError(Bf16ToDouble(d_y.Download(stream())), Reference(x2, w, s.m, s.n, s.k)),
            4e-3);
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
}

TEST_F(GemmGpuTest, EveryCandidateMatchesReferenceAndSticks) {
  // The decode shapes whose algorithm the decode GEMM benchmark compares: each candidate the
  // heuristic offers computes the product, and UseCandidate pins it (Algorithm reports it).
  for (const Shape s : {Shape{32, 3072, 2048}, Shape{128, 2048, 8192}, Shape{5, 33, 67}}) {
    SCOPED_TRACE(::testing::Message() << "m " << s.m << " n " << s.n << " k " << s.k);
    const std::vector<uint16_t> x = RandomBf16(s.m * s.k, -1, 1);
    const std::vector<uint16_t> w = RandomBf16(s.n * s.k, -1, 1);
    const std::vector<double> reference = Reference(x, w, s.m, s.n, s.k);
    DeviceVector<uint16_t> d_x(x, stream()), d_w(w, stream()), d_y(s.m * s.n);
    absl::StatusOr<std::vector<GemmAlgorithmInfo>> candidates =
        gemm_->Candidates(s.m, s.n, s.k, GemmOutput::kBf16, 8);
    ASSERT_TRUE(candidates.ok()) << candidates.status();
    ASSERT_FALSE(candidates->empty());
    ASSERT_LE(candidates->size(), 8u);
    for (int c = 0; c < static_cast<int>(candidates->size()); ++c) {
      SCOPED_TRACE(::testing::Message()
                   << "candidate " << c << ": " << (*candidates)[c].ToString());
      ASSERT_TRUE(gemm_->UseCandidate(s.m, s.n, s.k, GemmOutput::kBf16, c).ok());
      absl::StatusOr<GemmAlgorithmInfo> used = gemm_->Algorithm(s.m, s.n, s.k);
      ASSERT_TRUE(used.ok());
      EXPECT_EQ(used->algo_id, (*candidates)[c].algo_id);
      EXPECT_EQ(used->tile_id, (*candidates)[c].tile_id);
      EXPECT_EQ(used->splitk, (*candidates)[c].splitk);
      d_y.Poison(stream());
      absl::Status status =
          gemm_->Run(Bf(d_x.get()), Bf(d_w.get()), d_y.get(), s.m, s.n, s.k, stream());
      ASSERT_TRUE(status.ok()) << status;
      EXPECT_LT(RelativeError(Bf16ToDouble(d_y.Download(stream())), reference), 4e-3);
    }
    const int count = static_cast<int>(candidates->size());
    absl::Status past = gemm_->UseCandidate(s.m, s.n, s.k, GemmOutput::kBf16, count + 100);
    EXPECT_EQ(past.code(), absl::StatusCode::kOutOfRange) << past;
    EXPECT_THAT(std::string(past.message()), HasSubstr("does not exist"));
  }
  EXPECT_EQ(gemm_->Candidates(4, 8, 8, GemmOutput::kBf16, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gemm_->Candidates(4, 8, 8, GemmOutput::kBf16, kMaxGemmCandidates + 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gemm_->UseCandidate(4, 8, 8, GemmOutput::kBf16, -1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gemm_->UseCandidate(4, 8, 8, GemmOutput::kBf16, 2147483647).code(),
            absl::StatusCode::kOutOfRange);
}

TEST_F(GemmGpuTest, ReportsBadArguments) {
  DeviceVector<uint16_t> buf(4096);
  const __nv_bfloat16* p = Bf(buf.get());
  absl::Status misaligned = gemm_->Run(p + 1, p, buf.get(), 2, 8, 8, stream());
  EXPECT_EQ(misaligned.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(misaligned.message()), HasSubstr("16-byte aligned"));
  for (const absl::Status& null : {gemm_->Run(nullptr, p, buf.get(), 2, 8, 8, stream()),
                                   gemm_->Run(p, nullptr, buf.get(), 2, 8, 8, stream()),
                                   gemm_->Run(p, p, nullptr, 2, 8, 8, stream())}) {
    EXPECT_EQ(null.code(), absl::StatusCode::kInvalidArgument) << null;
    EXPECT_THAT(std::string(null.message()), HasSubstr("null pointer"));
  }
  EXPECT_EQ(gemm_->Prepare(4, 0, 8).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(gemm_->Run(p, p, buf.get(), 0, 8, 8, stream()).ok());  // empty batch: nothing to do
  EXPECT_EQ(gemm_->Algorithm(77, 77, 77).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace kiln
