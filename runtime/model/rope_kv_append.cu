#include "runtime/model/rope_kv_append.h"

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

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
  internal::AllowDependentLaunch();
  // Prepared while the QKV projection finishes.
  internal::RopePrologue(a, token, cos_table, sin_table, &slot_shared, threadIdx.x, blockDim.x);
  __syncthreads();
  const int64_t slot = slot_shared;
  internal::WaitForPrerequisites();  // qkv comes from the QKV projection
  internal::RopeAppendToken(a, token, slot, cos_table, sin_table, threadIdx.x, blockDim.x);
}

int Log2(int power_of_two) {
  int log = 0;
  while ((1 << log) < power_of_two) ++log;
  return log;
}

}  // namespace

bool RopeKvAppendSupports(const RopeKvAppendParams& p) {
  const int bs = p.kv.block_size;
  return p.num_tokens > 0 && p.heads > 0 && p.kv_heads > 0 && p.head_dim > 0 &&
         p.head_dim % 16 == 0 && p.head_dim / 2 <= internal::kRopeMaxHalf && p.theta > 0.0 &&
         p.qkv != nullptr && internal::Aligned16(p.qkv) && p.positions != nullptr &&
         p.plan.seq_q_start != nullptr && p.plan.seq_kv_len != nullptr && p.plan.max_seqs > 0 &&
         p.kv.k_cache != nullptr && p.kv.v_cache != nullptr && p.kv.block_table != nullptr &&
         bs >= 1 && (bs & (bs - 1)) == 0;
}

cudaError_t LaunchRopeKvAppend(const RopeKvAppendParams& p, cudaStream_t stream) {
  if (!RopeKvAppendSupports(p)) return cudaErrorInvalidValue;
  internal::RopeKvArgs a;
  a.qkv = p.qkv;
  a.positions = p.positions;
  a.heads = p.heads;
  a.kv_heads = p.kv_heads;
  a.head_dim = p.head_dim;
  a.log2_theta = std::log2(p.theta);
  a.seq_q_start = p.plan.seq_q_start;
  a.seq_kv_len = p.plan.seq_kv_len;
  a.max_seqs = p.plan.max_seqs;
  a.k_cache = static_cast<uint16_t*>(const_cast<void*>(p.kv.k_cache));
  a.v_cache = static_cast<uint16_t*>(const_cast<void*>(p.kv.v_cache));
  a.block_table = p.kv.block_table;
  a.max_blocks_per_seq = p.kv.max_blocks_per_seq;
  a.log2_block_size = Log2(p.kv.block_size);
  const int units = (p.heads + p.kv_heads) * (p.head_dim / 16) + p.kv_heads * (p.head_dim / 8);
  const int threads = internal::WarpRoundedThreads(units, kMaxThreads);
  return internal::LaunchWithPdl(RopeKvAppendKernel, dim3(p.num_tokens), dim3(threads), 0, stream,
                                 a);
}

}  // namespace kiln
