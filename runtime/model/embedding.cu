#include "runtime/model/embedding.h"

#include <cuda_bf16.h>

#include <cstdint>

#include "runtime/model/internal/pdl_launch.cuh"
#include "runtime/model/internal/vec.cuh"

namespace kiln {
namespace {

// Sets row `row` of `clear` [*, width] to zero, 8 values per store when `vector`.
__device__ void ClearRow(__nv_bfloat16* clear, int width, int64_t row, bool vector) {
  __nv_bfloat16* dst = clear + row * width;
  if (vector) {
    for (int col = threadIdx.x * 8; col < width; col += blockDim.x * 8) {
      *reinterpret_cast<uint4*>(dst + col) = make_uint4(0, 0, 0, 0);
    }
  } else {
    for (int col = threadIdx.x; col < width; col += blockDim.x) dst[col] = __float2bfloat16_rn(0.f);
  }
}

// V bf16 values per access; a vector access copies raw bits (no conversion needed).
template <int V>
__global__ void EmbeddingGatherKernel(const __nv_bfloat16* __restrict__ table, int64_t table_rows,
                                      int width, const int32_t* __restrict__ indices,
                                      __nv_bfloat16* __restrict__ out,
                                      __nv_bfloat16* __restrict__ clear, int clear_width,
                                      bool clear_vector) {
  AllowDependentLaunch();
  WaitForPrerequisites();  // the table may be an activation (the last-token gather)
  const int64_t row = blockIdx.x;
  const int32_t id = indices[row];
  const bool valid = id >= 0 && id < table_rows;
  const __nv_bfloat16* src = table + (valid ? int64_t{id} : 0) * width;
  __nv_bfloat16* dst = out + row * width;
  for (int col = threadIdx.x * V; col < width; col += blockDim.x * V) {
    if constexpr (V == 8) {
      const uint4 value =
          valid ? *reinterpret_cast<const uint4*>(src + col) : make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(dst + col) = value;
    } else {
      dst[col] = valid ? src[col] : __float2bfloat16_rn(0.0f);
    }
  }
  if (clear != nullptr) ClearRow(clear, clear_width, row, clear_vector);
}

}  // namespace

cudaError_t LaunchEmbeddingGather(const __nv_bfloat16* table, int64_t table_rows, int width,
                                  const int32_t* indices, int num_rows, __nv_bfloat16* out,
                                  cudaStream_t stream, __nv_bfloat16* clear, int clear_width) {
  if (num_rows < 0 || width <= 0 || table_rows < 0 || clear_width < 0) {
    return cudaErrorInvalidValue;
  }
  if (num_rows == 0) return cudaSuccess;
  if (table == nullptr || indices == nullptr || out == nullptr) return cudaErrorInvalidValue;
  if (clear_width == 0) clear = nullptr;
  const bool vec = width % 8 == 0 && internal::Aligned16(table) && internal::Aligned16(out);
  const bool clear_vec = clear_width % 8 == 0 && internal::Aligned16(clear);
  const int threads = internal::WarpRoundedThreads(vec ? width / 8 : width, 256);
  return internal::LaunchWithPdl(vec ? EmbeddingGatherKernel<8> : EmbeddingGatherKernel<1>,
                                 dim3(num_rows), dim3(threads), 0, stream, table, table_rows, width,
                                 indices, out, clear, clear_width, clear_vec);
}

}  // namespace kiln
