#include "runtime/model/gemm.h"

#include <cublasLt.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/cuda/capture_check.h"
#include "runtime/cuda/cublas_status.h"
#include "runtime/cuda/device_buffer.h"
#include "runtime/cuda/status.h"

namespace kiln {
namespace {

using ShapeKey = std::tuple<int64_t, int64_t, int64_t, int>;

std::string ShapeName(int64_t m, int64_t n, int64_t k, GemmOutput output) {
  return absl::StrCat("GEMM m=", m, " n=", n, " k=", k,
                      output == GemmOutput::kBf16 ? " (bf16 out)" : " (float out)");
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

GemmAlgorithmInfo Describe(const cublasLtMatmulAlgo_t& algo, size_t workspace) {
  GemmAlgorithmInfo info;
  info.workspace_bytes = workspace;
  auto get = [&](cublasLtMatmulAlgoConfigAttributes_t attr, int& out) {
    uint32_t value = 0;
    size_t written = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &value, sizeof(value), &written) ==
        CUBLAS_STATUS_SUCCESS) {
      out = static_cast<int>(value);
    }
  };
  get(CUBLASLT_ALGO_CONFIG_ID, info.algo_id);
  get(CUBLASLT_ALGO_CONFIG_TILE_ID, info.tile_id);
  get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM, info.splitk);
  get(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, info.reduction_scheme);
  return info;
}

// The descriptors and algorithm of one shape. Owns the cuBLASLt descriptors.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr;  // W: k x n column-major (= [n, k] row-major), transposed
  cublasLtMatrixLayout_t b = nullptr;  // x: k x m column-major (= [m, k] row-major)
  cublasLtMatrixLayout_t d = nullptr;  // y: n x m column-major (= [m, n] row-major)
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  }
};

}  // namespace

struct Gemm::Impl {
  cublasLtHandle_t handle = nullptr;
  DeviceBuffer workspace;
  absl::flat_hash_map<ShapeKey, std::unique_ptr<Plan>> plans;

  ~Impl() {
    if (handle != nullptr) cublasLtDestroy(handle);
  }

  absl::StatusOr<const Plan*> Get(int64_t m, int64_t n, int64_t k, GemmOutput output,
                                  cudaStream_t stream);
  // Builds the shape's descriptors and asks the heuristic for up to `count` algorithms, best
  // guess first; the plan takes the first and `found` (when set) receives them all.
  absl::StatusOr<std::unique_ptr<Plan>> Build(
      int64_t m, int64_t n, int64_t k, GemmOutput output, int count = 1,
      std::vector<cublasLtMatmulHeuristicResult_t>* found = nullptr);
};

std::string GemmAlgorithmInfo::ToString() const {
  return absl::StrFormat("algo %d tile %d split-k %d reduction %d workspace %d bytes", algo_id,
                         tile_id, splitk, reduction_scheme, workspace_bytes);
}

Gemm::Gemm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Gemm::~Gemm() = default;

absl::StatusOr<std::unique_ptr<Gemm>> Gemm::Create(size_t workspace_bytes) {
  RETURN_IF_ERROR(CheckNotCapturing(nullptr, "Gemm::Create"));
  auto impl = std::make_unique<Impl>();
  CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&impl->handle));
  if (workspace_bytes > 0) {
    ASSIGN_OR_RETURN(impl->workspace, DeviceBuffer::Allocate(workspace_bytes, "GEMM workspace"));
  }
  return std::unique_ptr<Gemm>(new Gemm(std::move(impl)));
}

size_t Gemm::workspace_bytes() const { return impl_->workspace.size(); }
size_t Gemm::prepared_shapes() const { return impl_->plans.size(); }

absl::StatusOr<std::unique_ptr<Plan>> Gemm::Impl::Build(
    int64_t m, int64_t n, int64_t k, GemmOutput output, int count,
    std::vector<cublasLtMatmulHeuristicResult_t>* found) {
  auto plan = std::make_unique<Plan>();
  const cudaDataType_t out_type = output == GemmOutput::kBf16 ? CUDA_R_16BF : CUDA_R_32F;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transpose = CUBLAS_OP_T;
  const cublasOperation_t no_transpose = CUBLAS_OP_N;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(transpose)));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &no_transpose, sizeof(no_transpose)));
  // Column-major view of row-major data: y [m, n] row-major is yᵀ (n x m, ld n) column-major,
  // and yᵀ = W · xᵀ with W read as the transpose of its k x n column-major storage.
  CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_16BF, k, n, k));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_16BF, k, m, k));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->d, out_type, n, m, n));

  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
  std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>,
                  decltype(&cublasLtMatmulPreferenceDestroy)>
      pref_owner(pref, &cublasLtMatmulPreferenceDestroy);
  const uint64_t max_workspace = workspace.size();
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace, sizeof(max_workspace)));
  // In-place split-K accumulates into the output through counters; keep to schemes whose
  // reduction order is fixed.
  const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE |
                           CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof(schemes)));
  // Callers pass 16-byte-aligned pointers (checked in Run), not cuBLASLt's default 256.
  const uint32_t alignment = 16;
  for (auto attr :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmulPreferenceSetAttribute(pref, attr, &alignment, sizeof(alignment)));
  }
  std::vector<cublasLtMatmulHeuristicResult_t> results(std::max(count, 1));
  int returned = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(handle, plan->desc, plan->a, plan->b, plan->d, plan->d, pref,
                                     static_cast<int>(results.size()), results.data(), &returned);
  if (status != CUBLAS_STATUS_SUCCESS || returned == 0 ||
      results[0].state != CUBLAS_STATUS_SUCCESS) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuBLASLt has no algorithm for ", ShapeName(m, n, k, output), " within a ",
        workspace.size(), "-byte workspace (", CublasStatusName(status),
        "); use sizes that keep rows 16-byte aligned (multiples of 8) or a larger workspace"));
  }
  plan->algo = results[0].algo;
  plan->workspace = results[0].workspaceSize;
  if (found != nullptr) {
    found->clear();
    for (int i = 0; i < returned; ++i) {
      if (results[i].state == CUBLAS_STATUS_SUCCESS) found->push_back(results[i]);
    }
  }
  return plan;
}

absl::StatusOr<const Plan*> Gemm::Impl::Get(int64_t m, int64_t n, int64_t k, GemmOutput output,
                                            cudaStream_t stream) {
  if (m <= 0 || n <= 0 || k <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(ShapeName(m, n, k, output),
                                                   " has a non-positive size; sizes must be > 0"));
  }
  const ShapeKey key{m, n, k, static_cast<int>(output)};
  auto it = plans.find(key);
  if (it != plans.end()) return it->second.get();
  if (IsCapturing(stream)) {
    RecordIllegalDuringCapture(absl::StrCat("first use of ", ShapeName(m, n, k, output)));
    return absl::FailedPreconditionError(absl::StrCat(
        ShapeName(m, n, k, output), " is first used during capture; call Gemm::Prepare for it "
        "(or run it once eagerly) before capturing"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Plan> plan, Build(m, n, k, output));
  const Plan* raw = plan.get();
  plans.emplace(key, std::move(plan));
  return raw;
}

absl::Status Gemm::Prepare(int64_t m, int64_t n, int64_t k, GemmOutput output) {
  return impl_->Get(m, n, k, output, nullptr).status();
}

absl::Status Gemm::Run(const __nv_bfloat16* x, const __nv_bfloat16* w, void* y, int64_t m,
                       int64_t n, int64_t k, cudaStream_t stream, GemmOutput output) {
  if (m == 0) return absl::OkStatus();
  if (x == nullptr || w == nullptr || y == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s got a null pointer (x %p, w %p, y %p); pass device buffers of the shape",
        ShapeName(m, n, k, output), static_cast<const void*>(x), static_cast<const void*>(w), y));
  }
  if (!Aligned16(x) || !Aligned16(w) || !Aligned16(y)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s got a pointer that is not 16-byte aligned (x %p, w %p, y %p); allocate or offset "
        "buffers in multiples of 16 bytes",
        ShapeName(m, n, k, output), static_cast<const void*>(x), static_cast<const void*>(w), y));
  }
  ASSIGN_OR_RETURN(const Plan* plan, impl_->Get(m, n, k, output, stream));
  const float alpha = 1.0f;
  const float beta = 0.0f;
  return ToStatus(cublasLtMatmul(impl_->handle, plan->desc, &alpha, w, plan->a, x, plan->b, &beta,
                                 y, plan->d, y, plan->d, &plan->algo, impl_->workspace.data(),
                                 plan->workspace, stream),
                  ShapeName(m, n, k, output));
}

absl::StatusOr<GemmAlgorithmInfo> Gemm::Algorithm(int64_t m, int64_t n, int64_t k,
                                                  GemmOutput output) const {
  auto it = impl_->plans.find(ShapeKey{m, n, k, static_cast<int>(output)});
  if (it == impl_->plans.end()) {
    return absl::NotFoundError(absl::StrCat(ShapeName(m, n, k, output), " is not prepared"));
  }
  return Describe(it->second->algo, it->second->workspace);
}

absl::StatusOr<std::vector<GemmAlgorithmInfo>> Gemm::Candidates(int64_t m, int64_t n, int64_t k,
                                                                GemmOutput output,
                                                                int max_count) {
  RETURN_IF_ERROR(CheckNotCapturing(nullptr, "Gemm::Candidates"));
  if (m <= 0 || n <= 0 || k <= 0 || max_count < 1 || max_count > kMaxGemmCandidates) {
    return absl::InvalidArgumentError(absl::StrCat(
        ShapeName(m, n, k, output), " with max_count ", max_count,
        ": sizes must be > 0 and the count in [1, ", kMaxGemmCandidates, "]"));
  }
  std::vector<cublasLtMatmulHeuristicResult_t> found;
  RETURN_IF_ERROR(impl_->Build(m, n, k, output, max_count, &found).status());
  std::vector<GemmAlgorithmInfo> infos;
  for (const auto& r : found) infos.push_back(Describe(r.algo, r.workspaceSize));
  return infos;
}

absl::Status Gemm::UseCandidate(int64_t m, int64_t n, int64_t k, GemmOutput output, int index) {
  RETURN_IF_ERROR(CheckNotCapturing(nullptr, "Gemm::UseCandidate"));
  if (m <= 0 || n <= 0 || k <= 0 || index < 0) {
    return absl::InvalidArgumentError(absl::StrCat(ShapeName(m, n, k, output), " candidate ",
                                                   index, ": sizes must be > 0, the index >= 0"));
  }
  if (index >= kMaxGemmCandidates) {
    return absl::OutOfRangeError(absl::StrCat(ShapeName(m, n, k, output), " candidate ", index,
                                              " does not exist (at most ", kMaxGemmCandidates,
                                              " are asked for)"));
  }
  std::vector<cublasLtMatmulHeuristicResult_t> found;
  ASSIGN_OR_RETURN(std::unique_ptr<Plan> plan, impl_->Build(m, n, k, output, index + 1, &found));
  if (index >= static_cast<int>(found.size())) {
    return absl::OutOfRangeError(absl::StrCat(ShapeName(m, n, k, output), " has ", found.size(),
                                              " candidates; candidate ", index,
                                              " does not exist"));
  }
  plan->algo = found[index].algo;
  plan->workspace = found[index].workspaceSize;
  impl_->plans[ShapeKey{m, n, k, static_cast<int>(output)}] = std::move(plan);
  return absl::OkStatus();
}

}  // namespace kiln
