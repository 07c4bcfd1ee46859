#include "runtime/model/rope_kv_append.h"

#include <cuda_bf16.h>

#include <cstdint>
#include <limits>

#include "runtime/model/internal/pdl_launch.cuh"
#include "runtime/model/internal/rope_kv_append.cuh"
#include "runtime/model/internal/vec.cuh"

namespace kiln {
namespace {

constexpr int kMaxThreads = 512;

// One CTA per token.
__global__ void __launch_bounds__(kMaxThreads) RopeKvAppendKernel(const internal::RopeKvArgs a) {
  __shared__ float cos_table[internal::kRopeMaxHalf];
  __shared__ float sin_table[internal::kRopeMaxHalf];
  __shared__ int64_t slot_shared;
  const int token = blockIdx.x;
  // Prepared while the QKV projection finishes.
  internal::RopePrologue(a, token, cos_table, sin_table, &slot_shared, threadIdx.x, blockDim.x);
  __syncthreads();
  const int64_t slot = slot_shared;
  WaitForPrerequisites();  // qkv comes from the QKV projection
  // Attention, launched next, reads nothing this kernel writes before its own wait (only KV that
  // earlier steps wrote, and its plan). Letting it in only now keeps its CTAs (and the O
  // projection's, which follow them in) off the SMs while the QKV projection still streams
  // (the QKV TMA GEMM lets this kernel in after its own wait for the same reason): with the
  // QKV projection on the TMA GEMM the step at 16 rows took 1.230-1.237 ms with the launch
  // allowed at the start, 1.201-1.203 with it here (runtime/model/NOTES.md).
  AllowDependentLaunch();
  internal::RopeAppendToken(a, token, slot, cos_table, sin_table, threadIdx.x, blockDim.x);
}

}  // namespace

bool RopeKvAppendSupports(const RopeKvAppendParams& p) {
  const int bs = p.kv.block_size;
  // The kernel indexes a qkv row, and its work units, in int.
  const int64_t row_width = (int64_t{p.heads} + 2 * int64_t{p.kv_heads}) * p.head_dim;
  return p.num_tokens > 0 && p.heads > 0 && p.kv_heads > 0 && p.head_dim > 0 &&
         p.head_dim % 16 == 0 && p.head_dim / 2 <= internal::kRopeMaxHalf &&
         row_width <= std::numeric_limits<int32_t>::max() && IsRopeTheta(p.theta) &&
         p.rope_scaling.Validate().ok() &&
         p.qkv != nullptr && internal::Aligned16(p.qkv) && p.positions != nullptr &&
         p.plan.seq_q_start != nullptr && p.plan.seq_kv_len != nullptr && p.plan.max_seqs > 0 &&
         p.kv.k_cache != nullptr && p.kv.v_cache != nullptr && p.kv.block_table != nullptr &&
         internal::Aligned16(p.kv.k_cache) && internal::Aligned16(p.kv.v_cache) &&
         p.kv.max_blocks_per_seq >= 1 && bs >= 1 && (bs & (bs - 1)) == 0;
}

cudaError_t LaunchRopeKvAppend(const RopeKvAppendParams& p, cudaStream_t stream) {
  if (!RopeKvAppendSupports(p)) return cudaErrorInvalidValue;
  const internal::RopeKvArgs a = internal::MakeRopeKvArgs(p);
  const int units = (p.heads + p.kv_heads) * (p.head_dim / 16) + p.kv_heads * (p.head_dim / 8);
  const int threads = internal::WarpRoundedThreads(units, kMaxThreads);
  return internal::LaunchWithPdl(RopeKvAppendKernel, dim3(p.num_tokens), dim3(threads), 0, stream,
                                 a);
}

}  // namespace kiln
