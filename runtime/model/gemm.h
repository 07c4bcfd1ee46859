// y = x · Wᵀ through cuBLASLt for kiln's projections: x [m, k] bf16 row-major, W [n, k] bf16
// row-major (PyTorch's Linear layout, [out_features, in_features]), y [m, n] bf16 or float,
// float accumulation.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<kiln::Gemm> gemm, kiln::Gemm::Create());
//   size_t planner_bytes = gemm->workspace_bytes();                 // for the memory planner
//   RETURN_IF_ERROR(gemm->Prepare(num_tokens, qkv_rows, hidden));   // outside capture
//   RETURN_IF_ERROR(gemm->Run(x, w_qkv, qkv, num_tokens, qkv_rows, hidden, stream));
//
// Per (m, n, k, output type) it builds the matmul and layout descriptors once and asks
// cuBLASLt's heuristic for an algorithm once, then always uses that algorithm, so a shape
// computes the same bits on every call (in-place split-K reduction is excluded; the other
// reduction schemes reduce in a fixed order). Different m may pick different algorithms, so a
// row's result can depend on how many rows are computed with it: pad eager steps to the
// same m as the graph when bitwise equality with a graph matters.
//
// The workspace is one device buffer allocated by Create and never grown, so Run allocates
// nothing and may be called during capture for a prepared shape; a shape first seen during
// capture is FailedPrecondition (prepare it, or run it once eagerly, before capturing).
// Pointers must be 16-byte aligned (InvalidArgument otherwise).
// Not thread-safe: one Gemm per thread (or external locking); bound to the device that was
// current at Create.
#ifndef KILN_RUNTIME_MODEL_GEMM_H_
#define KILN_RUNTIME_MODEL_GEMM_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kiln {

enum class GemmOutput {
  kBf16,     // y is bf16 (every projection)
  kFloat32,  // y is float (logits for exact greedy sampling)
};

// The most candidates Gemm::Candidates asks cuBLASLt's heuristic for.
inline constexpr int kMaxGemmCandidates = 256;

// What cuBLASLt chose for one shape, for logs and tests.
struct GemmAlgorithmInfo {
  int algo_id = 0;
  int tile_id = 0;
  int splitk = 1;
  int reduction_scheme = 0;
  size_t workspace_bytes = 0;  // what the algorithm uses of the fixed workspace

  std::string ToString() const;
};

class Gemm {
 public:
  // 32 MiB: cuBLASLt's recommendation for Hopper; every decode and prefill shape fits.
  static constexpr size_t kDefaultWorkspaceBytes = size_t{32} << 20;

  // Creates a cuBLASLt handle and a workspace of `workspace_bytes` on the current device.
  // Not callable during capture (it allocates).
  static absl::StatusOr<std::unique_ptr<Gemm>> Create(
      size_t workspace_bytes = kDefaultWorkspaceBytes);

  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // Returns the size of the fixed workspace (device memory the planner must count).
  size_t workspace_bytes() const;

  // Builds descriptors and picks the algorithm for y [m, n] = x [m, k] · W [n, k]ᵀ, if not yet
  // done. InvalidArgument for non-positive sizes or when cuBLASLt has no algorithm for the
  // shape; FailedPrecondition when called during capture for a new shape.
  absl::Status Prepare(int64_t m, int64_t n, int64_t k, GemmOutput output = GemmOutput::kBf16);

  // Enqueues y = x · Wᵀ on `stream` (preparing the shape first when outside capture). m == 0
  // does nothing. `y` is bf16 or float according to `output`. InvalidArgument for a null or
  // not 16-byte aligned pointer and what Prepare refuses.
  absl::Status Run(const __nv_bfloat16* x,  // [m, k]
                   const __nv_bfloat16* w,  // [n, k]
                   void* y,                 // [m, n]
                   int64_t m, int64_t n, int64_t k, cudaStream_t stream,
                   GemmOutput output = GemmOutput::kBf16);

  // Returns the algorithm chosen for a prepared shape, or NotFound.
  absl::StatusOr<GemmAlgorithmInfo> Algorithm(int64_t m, int64_t n, int64_t k,
                                              GemmOutput output = GemmOutput::kBf16) const;

  // Returns up to `max_count` algorithms cuBLASLt's heuristic offers for the shape, its best
  // guess (what Prepare takes) first, for benchmarks that time them. Outside capture only.
  absl::StatusOr<std::vector<GemmAlgorithmInfo>> Candidates(int64_t m, int64_t n, int64_t k,
                                                            GemmOutput output, int max_count);

  // Makes candidate `index` of Candidates(m, n, k, output, ...) the shape's algorithm from now
  // on. OutOfRange when the heuristic offers fewer; outside capture only.
  absl::Status UseCandidate(int64_t m, int64_t n, int64_t k, GemmOutput output, int index);

  // Returns how many shapes are prepared.
  size_t prepared_shapes() const;

 private:
  struct Impl;
  explicit Gemm(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln

#endif  // KILN_RUNTIME_MODEL_GEMM_H_
