// Internal to //collectives:custom_allreduce: the one-shot all-reduce fused with the residual add
// and RMSNorm that follow it in a transformer layer, for bf16 rows:
//
//   sum      = bf16(Σ_rank partial[rank])              (float, ranks in order 0..W-1)
//   residual = bf16(sum + residual)                     (written back)
//   out      = bf16(residual / sqrt(mean(residual²) + eps) · weight)
//
// The arithmetic is that of the one-shot kernel followed by runtime/model's
// LaunchFusedAddRmsNorm (rms_norm.cu), operation for operation and in the same reduction order
// (threads per row, chunks per thread, warp then block sum), so the fused result equals the
// unfused one bit for bit. Each block owns whole rows (the norm needs the whole row): block b
// takes rows b, b + grid, ...; the grid and block shape depend only on tokens and hidden.
#ifndef KILN_COLLECTIVES_INTERNAL_ALLREDUCE_RMS_NORM_H_
#define KILN_COLLECTIVES_INTERNAL_ALLREDUCE_RMS_NORM_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "collectives/internal/custom_allreduce_kernels.h"

namespace kiln {
namespace internal {

// Rows are split into chunks of blockDim.x packs of 8 bf16; at most this many per thread, and
// at most kRmsNormMaxThreads threads per block: hidden ≤ 8 × 4 × 1024 = 32768.
constexpr int kRmsNormChunks = 4;
constexpr int kRmsNormMaxThreads = 1024;
constexpr int64_t kRmsNormMaxHidden = int64_t{8} * kRmsNormChunks * kRmsNormMaxThreads;

struct AllReduceRmsNormArgs {
  // in: this rank's partial sums [tokens, hidden]; out: the normed rows [tokens, hidden];
  // packs = tokens * hidden / 8. Barriers, staging, registration and the epoch as in the
  // one-shot all-reduce.
  CustomAllReduceArgs base;
  void* residual;        // [tokens, hidden] bf16, read and written
  const void* weight;    // [hidden] bf16
  int tokens;
  int hidden;            // a multiple of 8, at most kRmsNormMaxHidden
  float eps;
};

// Returns the threads per block for rows of `hidden` elements: the same count rms_norm.cu uses
// (a warp multiple covering hidden / 8 packs, at most 1024), which fixes the reduction order.
int AllReduceRmsNormThreads(int hidden);

// Launches the fused kernel for `world_size` ranks with `blocks` blocks (1..kMaxBlocks, at most
// tokens) of AllReduceRmsNormThreads(hidden) threads, with programmatic dependent launch where
// the GPU supports it: the kernel may start while the one before it finishes; it reads nothing
// an earlier kernel wrote (inputs, residual, control words) before griddepcontrol.wait, and
// lets the kernel after it start its independent prologue at once.
cudaError_t LaunchAllReduceRmsNorm(const AllReduceRmsNormArgs& args, int world_size, int blocks,
                                   cudaStream_t stream);

}  // namespace internal
}  // namespace kiln

#endif  // KILN_COLLECTIVES_INTERNAL_ALLREDUCE_RMS_NORM_H_
