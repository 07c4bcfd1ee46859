// y = x · Wᵀ for a few rows of x (decode steps of small batches), as a bandwidth-bound
// matrix-vector kernel: x [m, k] bf16, W [n, k] bf16 (PyTorch's Linear layout), y [m, n] bf16 or
// float, float accumulation, m ≤ kSkinnyGemmMaxRows.
//
//   if (kiln::SkinnyGemmSupports(m, k, x, w, y)) {
//     CUDA_RETURN_IF_ERROR(
//         kiln::LaunchSkinnyGemm(x, w, y, m, n, k, /*float_output=*/false, stream));
//   }
//
// Why: at m ≤ 8 a projection reads each weight once and does almost no arithmetic, so its time is
// the weight bytes over memory bandwidth. cuBLASLt's heuristic picks tiles without split-K for
// the small projections of a 1B model (qkv 3072 × 2048, o 2048 × 2048) and reaches 1.4–2 TB/s
// there (runtime/model/NOTES.md). Here one warp owns one output column (a row of W): its lanes
// stream the row with 16-byte loads that bypass L1 (each weight is read once), keep several
// loads in flight, multiply with the m rows of x (small, re-read from L1/L2) and reduce with warp
// shuffles. Every weight of the grid is in flight at once for these sizes, which is what a
// memory-bound kernel needs.
//
// On Hopper it is launched with programmatic dependent launch: it streams its first weights
// (independent of earlier kernels) before griddepcontrol.wait, so they overlap the kernel before
// it when that kernel allows dependents early (kiln's RMSNorm and SiLU·mul do). x is read after
// the wait. From 4 rows on, re-reading x per weight row makes it slower than cuBLASLt on an H200
// (runtime/runner/NOTES.md); the model uses it up to 2 rows.
//
// The reduction order is fixed (each lane sums its vectors in order, then a fixed butterfly), so
// the result is bitwise reproducible and depends only on (m, n, k): a graph and an eager run of
// the same shape agree bit for bit. The launch shape is ceil(n / 8) blocks of 256 threads and
// depends only on n. Callable during capture; thread-safe.
#ifndef KILN_RUNTIME_MODEL_SKINNY_GEMM_H_
#define KILN_RUNTIME_MODEL_SKINNY_GEMM_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace kiln {

// The most rows of x the kernel takes.
inline constexpr int kSkinnyGemmMaxRows = 8;

// Returns whether LaunchSkinnyGemm supports the shape: 1 ≤ m ≤ kSkinnyGemmMaxRows, k a positive
// multiple of 8, and x, w, y set and 16-byte aligned.
bool SkinnyGemmSupports(int64_t m, int64_t k, const void* x, const void* w, const void* y);

// Enqueues y [m, n] = x [m, k] · W [n, k]ᵀ on `stream`; y is float when `float_output`, else bf16
// (rounded once from the float sum). Returns cudaErrorInvalidValue for an unsupported shape
// (see SkinnyGemmSupports) or n < 1, else the launch's error.
cudaError_t LaunchSkinnyGemm(const __nv_bfloat16* x,  // [m, k]
                             const __nv_bfloat16* w,  // [n, k]
                             void* y,                 // [m, n]
                             int64_t m, int64_t n, int64_t k, bool float_output,
                             cudaStream_t stream);

}  // namespace kiln

#endif  // KILN_RUNTIME_MODEL_SKINNY_GEMM_H_
