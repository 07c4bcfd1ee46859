// Internal: the device-side arguments of the prefill kernel and the per-configuration launchers
// that prefill_kernel.cu dispatches to. Not part of the public API.
#ifndef KILN_ATTENTION_PREFILL_KERNEL_INTERNAL_H_
#define KILN_ATTENTION_PREFILL_KERNEL_INTERNAL_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "attention/attention_params.h"

namespace kiln {
namespace prefill_internal {

// What the kernel reads: the public params reduced to device-side values.
struct KernelArgs {
  const void* q;
  void* o;
  const void* k_cache;
  const void* v_cache;
  const int32_t* block_table;
  const int32_t* seq_q_start;
  const int32_t* seq_kv_len;
  const AttentionWorkItem* work_items;
  float* partial_o;
  float* partial_lse;
  int num_q_heads;
  int num_kv_heads;
  int group;  // G = num_q_heads / num_kv_heads
  int block_size;
  int max_blocks_per_seq;
  float scale_log2;  // softmax_scale * log2(e): scores live in the log2 domain
};

// Launches the kernel for one (dtype, head_dim, tile_rows); defined in prefill_kernel_impl.cuh,
// instantiated in the prefill_<dtype>_hd<head_dim>.cu files. T is __nv_bfloat16 or __half.
template <typename T, int kHeadDim, int kTileRows>
cudaError_t LaunchPrefillKernel(const KernelArgs& args, int num_items, cudaStream_t stream);

// Dynamic shared memory of one configuration (its instantiation is in the same files).
template <typename T, int kHeadDim, int kTileRows>
int SharedMemoryBytes();

}  // namespace prefill_internal
}  // namespace kiln

#endif  // KILN_ATTENTION_PREFILL_KERNEL_INTERNAL_H_
