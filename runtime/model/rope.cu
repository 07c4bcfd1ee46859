#include "runtime/model/rope.h"

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "absl/status/statusor.h"
#include "attention/rope_rotation.cuh"
#include "runtime/model/internal/vec.cuh"

namespace kiln {
namespace {

constexpr int kMaxHalf = 128;  // head_dim <= 256

// One block per token. Threads first build the token's cos/sin table in shared memory (half a
// head's worth, shared by all heads), then each thread rotates V pairs of one head: V values
// from the first half and the V partners from the second half.
template <int V>
__global__ void RopeKernel(__nv_bfloat16* __restrict__ qkv, const int32_t* __restrict__ positions,
                           int rotated_heads, int row_width, int head_dim, RopeFrequencies freqs) {
  __shared__ float cos_table[kMaxHalf];
  __shared__ float sin_table[kMaxHalf];
  const int half = head_dim / 2;
  const int position = positions[blockIdx.x];
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    RopeCosSin(position, i, head_dim, freqs, &cos_table[i], &sin_table[i]);
  }
  __syncthreads();
  __nv_bfloat16* row = qkv + int64_t{blockIdx.x} * row_width;
  const int units_per_head = half / V;
  const int units = rotated_heads * units_per_head;
  for (int u = threadIdx.x; u < units; u += blockDim.x) {
    const int head = u / units_per_head;
    const int i = (u - head * units_per_head) * V;
    __nv_bfloat16* lo = row + head * head_dim + i;
    __nv_bfloat16* hi = lo + half;
    float a[V], b[V];
    internal::LoadBf16<V>(lo, a);
    internal::LoadBf16<V>(hi, b);
    float out_lo[V], out_hi[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      RopeRotate(a[j], b[j], cos_table[i + j], sin_table[i + j], &out_lo[j], &out_hi[j]);
    }
    internal::StoreBf16<V>(lo, out_lo);
    internal::StoreBf16<V>(hi, out_hi);
  }
}

}  // namespace

cudaError_t LaunchRope(__nv_bfloat16* qkv, const int32_t* positions, int num_tokens, int heads,
                       int kv_heads, int head_dim, double theta, const RopeScaling& scaling,
                       cudaStream_t stream) {
  if (num_tokens < 0 || heads <= 0 || kv_heads <= 0 || head_dim <= 0 || head_dim % 2 != 0 ||
      head_dim / 2 > kMaxHalf || !IsRopeTheta(theta)) {
    return cudaErrorInvalidValue;
  }
  // One derivation both checks the scaling and gives the frequencies.
  const absl::StatusOr<RopeFrequencies> freqs = RopeFrequencies::MakeValidated(theta, scaling);
  if (!freqs.ok()) return cudaErrorInvalidValue;
  // The kernel indexes a row in int: wider rows would wrap.
  if ((int64_t{heads} + 2 * int64_t{kv_heads}) * head_dim > std::numeric_limits<int32_t>::max()) {
    return cudaErrorInvalidValue;
  }
  if (num_tokens == 0) return cudaSuccess;
  if (qkv == nullptr || positions == nullptr) return cudaErrorInvalidValue;
  const int rotated_heads = heads + kv_heads;  // q heads then k heads, contiguous
  const int row_width = (heads + 2 * kv_heads) * head_dim;
  const int half = head_dim / 2;
  if (half % 8 == 0 && row_width % 8 == 0 && internal::Aligned16(qkv)) {
    const int threads = internal::WarpRoundedThreads(int64_t{rotated_heads} * half / 8, 512);
    RopeKernel<8><<<num_tokens, threads, 0, stream>>>(qkv, positions, rotated_heads, row_width,
                                                      head_dim, *freqs);
  } else {
    const int threads = internal::WarpRoundedThreads(int64_t{rotated_heads} * half, 512);
    RopeKernel<1><<<num_tokens, threads, 0, stream>>>(qkv, positions, rotated_heads, row_width,
                                                      head_dim, *freqs);
  }
  return cudaGetLastError();
}

}  // namespace kiln
