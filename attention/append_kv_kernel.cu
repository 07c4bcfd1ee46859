// The append kernel: copies a step's new K and V rows into their paged-cache slots (see
// paged_kv_cache.h). bf16 and fp16 are both 2-byte elements, so one kernel moves either.
#include <cuda_runtime.h>

#include <cstdint>

#include "attention/internal/kernel_args.h"
#include "attention/paged_kv_slot.cuh"

namespace kiln {
namespace attention_internal {
namespace {

constexpr int kAppendThreads = 128;

// One CTA per token row of the (padded) step; 16 bytes per thread and copy.
__global__ void __launch_bounds__(kAppendThreads) AppendKvKernel(const AppendKernelArgs args) {
  const int token = blockIdx.x;
  int64_t slot;
  if (args.slot_mapping != nullptr) {
    slot = args.slot_mapping[token];
  } else {
    slot = PagedKvSlotOf(token, args.seq_q_start, args.max_seqs, args.seq_kv_len,
                         args.block_table, args.max_blocks_per_seq, args.log2_block_size);
  }
  if (slot < 0) return;  // a padding row, or no slot
  const int64_t block = slot >> args.log2_block_size;
  const int64_t offset = slot & ((1 << args.log2_block_size) - 1);
  const int vectors_per_head = args.head_dim / 8;
  const int vectors = args.num_kv_heads * vectors_per_head;
  const uint16_t* k = static_cast<const uint16_t*>(args.k) + token * args.k_stride;
  const uint16_t* v = static_cast<const uint16_t*>(args.v) + token * args.v_stride;
  uint16_t* k_cache = static_cast<uint16_t*>(args.k_cache);
  uint16_t* v_cache = static_cast<uint16_t*>(args.v_cache);
  for (int i = threadIdx.x; i < vectors; i += kAppendThreads) {
    const int head = i / vectors_per_head;
    const int d = (i - head * vectors_per_head) * 8;
    const int64_t dst =
        (((block * args.num_kv_heads + head) << args.log2_block_size) + offset) * args.head_dim +
        d;
    const int64_t src = static_cast<int64_t>(head) * args.head_dim + d;
    *reinterpret_cast<uint4*>(k_cache + dst) = *reinterpret_cast<const uint4*>(k + src);
    *reinterpret_cast<uint4*>(v_cache + dst) = *reinterpret_cast<const uint4*>(v + src);
  }
}

}  // namespace

cudaError_t LaunchAppendKernel(const AppendKernelArgs& args, int max_tokens,
                               cudaStream_t stream) {
  AppendKvKernel<<<max_tokens, kAppendThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace attention_internal
}  // namespace kiln
