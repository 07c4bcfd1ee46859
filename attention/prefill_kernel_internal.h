// Internal: the device-side arguments of the prefill kernel and the per-configuration launchers
// that prefill_kernel.cu dispatches to. Not part of the public API.
#ifndef KILN_ATTENTION_PREFILL_KERNEL_INTERNAL_H_
#define KILN_ATTENTION_PREFILL_KERNEL_INTERNAL_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "attention/attention_params.h"

namespace kiln {
namespace prefill_internal {

#if defined(__CUDACC__)
#define KILN_PREFILL_HD __host__ __device__ __forceinline__
#else
#define KILN_PREFILL_HD inline
#endif

// Division of non-negative int32 values by a divisor fixed at launch: a multiply-high, an add and
// a shift instead of the ~20 instructions of a run-time integer division (the kernel divides
// every KV position by the block size and every query row by the group size). Round-up
// multiplier method: with l = ceil(log2 d) and m = floor(2^32 (2^l - d) / d) + 1,
// n / d = (mulhi(n, m) + n) >> l for 0 <= n < 2^31.
struct FastDiv {
  uint32_t divisor = 1;
  uint32_t multiplier = 1;
  uint32_t shift = 0;

  static FastDiv Make(uint32_t d) {
    FastDiv f;
    f.divisor = d;
    while ((uint64_t{1} << f.shift) < d) ++f.shift;
    f.multiplier = static_cast<uint32_t>(
        ((uint64_t{1} << 32) * ((uint64_t{1} << f.shift) - d)) / d + 1);
    return f;
  }
  KILN_PREFILL_HD uint32_t Div(uint32_t n) const {
    const uint32_t hi = static_cast<uint32_t>((static_cast<uint64_t>(n) * multiplier) >> 32);
    return (hi + n) >> shift;
  }
};

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
  int64_t q_stride;  // elements between tokens of q
  int64_t o_stride;  // elements between tokens of o
  int num_q_heads;
  int num_kv_heads;
  int group;  // G = num_q_heads / num_kv_heads
  FastDiv group_div;
  int block_size;
  FastDiv block_div;
  int64_t block_stride;  // elements of one physical KV block: num_kv_heads * block_size * head_dim
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

#undef KILN_PREFILL_HD

#endif  // KILN_ATTENTION_PREFILL_KERNEL_INTERNAL_H_
