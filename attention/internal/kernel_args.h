// Internal: the resolved arguments of kiln's attention kernels and the declarations of their
// explicitly instantiated launchers (defined in the .cu files; dispatched from decode_kernel.cc
// and merge_kernel.cc). Plain C++: host code includes it without nvcc.
#ifndef KILN_ATTENTION_INTERNAL_KERNEL_ARGS_H_
#define KILN_ATTENTION_INTERNAL_KERNEL_ARGS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "attention/attention_params.h"

namespace kiln {
namespace attention_internal {

// Query heads per KV head the decode kernel is built for (DISPATCH_GROUP); each value is one
// instantiation per dtype and head_dim.
#define KILN_DECODE_GROUPS 1, 2, 3, 4, 5, 6, 7, 8

struct DecodeKernelArgs {
  const void* q;          // [tokens, num_q_heads, head_dim], q_stride elements per token
  int64_t q_stride;
  void* o;                // [tokens, num_q_heads, head_dim], o_stride elements per token
  int64_t o_stride;
  const void* k_cache;    // [num_blocks, num_kv_heads, block_size, head_dim]
  const void* v_cache;
  const int32_t* block_table;  // [max_seqs, max_blocks_per_seq]
  int32_t max_blocks_per_seq;
  int32_t log2_block_size;
  const int32_t* seq_q_start;  // [max_seqs + 1]
  const int32_t* seq_kv_len;   // [max_seqs]
  const AttentionWorkItem* work_items;  // [grid.x]
  const AttentionPlanHeader* header;    // this step's chunk size (fused merge)
  int32_t* merge_counters;              // null: no fused merge
  int32_t tile_rows;      // rows per partial slot
  float* partial_o;       // [slots, num_kv_heads, tile_rows, head_dim]
  float* partial_lse;     // [slots, num_kv_heads, tile_rows]
  int32_t num_q_heads;
  int32_t num_kv_heads;
  float scale_log2;       // softmax scale × log2(e)
  // RoPE + KV append in the kernel (DecodeRopeAppendDevice); positions null: none.
  const int32_t* rope_positions;
  RopeFrequencies rope_freqs;
  const void* new_k;      // [tokens, num_kv_heads, head_dim], new_kv_stride elements per token
  const void* new_v;
  int64_t new_kv_stride;
  // QK norm of q and the new k before their rotation (DecodeRopeAppendDevice); null: none.
  const void* q_norm;
  const void* k_norm;
  float qk_norm_eps;
};

struct MergeKernelArgs {
  void* o;                // [tokens, num_q_heads, head_dim], o_stride elements per token
  int64_t o_stride;
  const int32_t* seq_q_start;
  const AttentionMergeItem* merge_items;  // [grid.x]
  const float* partial_o;
  const float* partial_lse;
  int32_t tile_rows;
  int32_t num_q_heads;
  int32_t num_kv_heads;
  int32_t group_size;
};

struct AppendKernelArgs {
  const void* k;          // [max_tokens, num_kv_heads, head_dim], k_stride elements per token
  int64_t k_stride;
  const void* v;
  int64_t v_stride;
  const int32_t* slot_mapping;  // [max_tokens] or null (then derived from the plan arrays)
  const int32_t* seq_q_start;   // [max_seqs + 1]
  const int32_t* seq_kv_len;    // [max_seqs]
  int32_t max_seqs;
  void* k_cache;
  void* v_cache;
  const int32_t* block_table;
  int32_t max_blocks_per_seq;
  int32_t log2_block_size;
  int32_t num_kv_heads;
  int32_t head_dim;
};

// Launches grid (grid_x, num_kv_heads) of the decode kernel; returns the launch error.
template <AttentionDtype kDtype, int kHeadDim, int kGroup>
cudaError_t LaunchDecodeKernel(const DecodeKernelArgs& args, int grid_x, cudaStream_t stream);

// Launches grid (grid_x, num_kv_heads) of the merge kernel; returns the launch error.
template <AttentionDtype kDtype, int kHeadDim>
cudaError_t LaunchMergeKernel(const MergeKernelArgs& args, int grid_x, cudaStream_t stream);

// Launches one CTA per token row of the append kernel; returns the launch error.
cudaError_t LaunchAppendKernel(const AppendKernelArgs& args, int max_tokens, cudaStream_t stream);

}  // namespace attention_internal
}  // namespace kiln

#endif  // KILN_ATTENTION_INTERNAL_KERNEL_ARGS_H_
