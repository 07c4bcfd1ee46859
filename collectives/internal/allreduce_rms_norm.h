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
// unfused one bit for bit (NaN payloads aside). Each block owns whole rows (the norm needs the
// whole row): block b takes rows b, b + grid, ...; the grid and block shape depend only on tokens
// and hidden.
//
// Two ways to move the partial sums:
//  - pull (the one-shot kernel's protocol): staged (copy into the own staging half, barrier,
//    read every peer's staging) or registered (barrier, read every peer's input, barrier). A
//    barrier costs a flag's one-way trip and the remote read a round trip over NVLink.
//  - push, for rows of at most kPushSlotBytes in all: every rank writes its partial sums into a
//    slot of every peer's push buffer, and each reader polls its own buffer until the values are
//    there. The buffer holds a sentinel (bf16 0xFFFF, a NaN) wherever no value is pending, so the
//    data is its own flag: one one-way trip, no barrier. A writer turns a 0xFFFF lane of its data
//    into 0x7FFF (another NaN), and the reader puts the sentinel back as soon as it consumed a
//    value. Slots alternate with the epoch's parity: a rank writes the same slot again at call
//    N + 2 at the earliest, after its peer finished call N (whose data it needed for call N + 1),
//    so a slot is always cleared before it is written again.
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

// The push path: per rank one buffer of 2 (epoch parity) x world_size (writing rank) slots of
// kPushSlotBytes, filled with 0xFF bytes at creation. 512 KiB covers 128 rows of 2048 (the 1B
// model's decode batches; world 4's one-shot crossover).
constexpr uint64_t kPushSlotBytes = 512 * 1024;

// Returns the bytes of one rank's push buffer.
inline uint64_t PushBufferBytes(int world_size) {
  return 2 * static_cast<uint64_t>(world_size) * kPushSlotBytes;
}

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
  // Push path: every rank's push buffer, indexed by rank (all null: the pull path).
  char* push[kMaxRanks];
};

// Returns the threads per block for rows of `hidden` elements: the same count rms_norm.cu uses
// (a warp multiple covering hidden / 8 packs, at most 1024), which fixes the reduction order.
int AllReduceRmsNormThreads(int hidden);

// Launches the fused kernel for `world_size` ranks with `blocks` blocks (1..kMaxBlocks, at most
// tokens) of AllReduceRmsNormThreads(hidden) threads: the push kernel when args.push is set
// (rows of at most kPushSlotBytes in all), else the pull kernel; with programmatic dependent
// launch where the GPU supports it: the kernel may start while the one before it finishes; it
// reads nothing an earlier kernel wrote (inputs, residual, control words) before
// griddepcontrol.wait. The pull kernel lets the kernel after it start at once, the push kernel
// once its rows are done (allreduce_rms_norm_push.cu says why).
cudaError_t LaunchAllReduceRmsNorm(const AllReduceRmsNormArgs& args, int world_size, int blocks,
                                   cudaStream_t stream);

// The push kernel's launcher (allreduce_rms_norm_push.cu), called by LaunchAllReduceRmsNorm.
cudaError_t LaunchAllReduceRmsNormPush(const AllReduceRmsNormArgs& args, int world_size,
                                       int blocks, cudaStream_t stream);

}  // namespace internal
}  // namespace kiln

#endif  // KILN_COLLECTIVES_INTERNAL_ALLREDUCE_RMS_NORM_H_
