// Internal: the decode GEMM kernel (see decode_gemm.h). Included by the decode_gemm_m*.cu files,
// each of which instantiates one x-tile width for every row-warp count and input/output kind.
//
// Work split. A CTA of 8 warps owns 16·R rows of W (R = row warps, 1, 2 or 4) and a slice of k
// (k / splits; blockIdx.y picks the slice). Warp (r, j) owns rows [16 r, 16 r + 16) of the CTA
// and every (8 / R)-th group of 128 k of the slice, starting at group j. The R row warps that
// share a k group read the same x, so x comes from L2 once per CTA, not once per warp.
//
// Fragments. y^T [n, m] = W [n, k] · x^T [k, m] is an mma.m16n8k16 with A = 16 rows of W and
// B = 8 rows of x (a column-major B is x row-major). A dot product does not care about the order
// of its terms, so a lane's 16-byte load of 8 consecutive k of one W row becomes its A elements
// of two k16 steps, and the lane's B elements are the same 8 k of one x row: lane (g = lane/4,
// t = lane%4) loads W[row g][32c + 8t, +8) and W[row g + 8][32c + 8t, +8) for chunk c of a
// group, which are fragments a0..a7 of steps 2c (k 0..3 of the 8) and 2c + 1 (k 4..7), and
// reads x[8i + g][32c + 8t, +8) from shared memory as b0..b3 of both steps for x tile i. Each
// W load instruction covers 8 rows × 64 contiguous bytes; the 4 chunks of a group are 256
// contiguous bytes of each row.
//
// Pipelining. A warp keeps kDgDepth groups of W (2 × 4 KiB) in flight in registers. The first
// ones are issued before griddepcontrol.wait: W does not depend on earlier kernels, so with
// programmatic dependent launch they stream in while the previous kernel finishes. x is staged
// into shared memory after the wait (through SiLU·mul for the down projection).
//
// Reduction. The warps of a CTA that share rows are summed through shared memory in warp
// order. With splits > 1, each CTA writes its float partial sums to the workspace; the last
// CTA of a row tile to finish (counted with an atomic, threadFenceReduction style) adds the
// splits in index order and writes y, then resets the counter for the next launch. Every sum
// has a fixed order, so y is bitwise reproducible for a given (m, n, k, config).
#ifndef KILN_RUNTIME_MODEL_INTERNAL_DECODE_GEMM_KERNEL_CUH_
#define KILN_RUNTIME_MODEL_INTERNAL_DECODE_GEMM_KERNEL_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/cuda/device_helpers.cuh"
#include "runtime/model/decode_gemm.h"
#include "runtime/model/internal/pdl_launch.cuh"
#include "runtime/model/internal/vec.cuh"

namespace kiln {
namespace internal {

// Resolved arguments of one launch.
struct DecodeGemmParams {
  const __nv_bfloat16* x;  // [m, x_stride]: x, or gate (first k) and up (next k) for SiLU·mul
  const __nv_bfloat16* w;  // [n, k]
  void* y;                 // [m, n] bf16 or float
  float* partials;         // [splits, m, n] when splits > 1
  int32_t* counters;       // [tiles] when splits > 1
  int m, n, k;
  int64_t x_stride;        // elements between rows of x
  int k_split;             // k per CTA
  int splits;
};

constexpr int kDgWarps = 8;
constexpr int kDgThreads = kDgWarps * 32;
constexpr int kDgGroupK = 128;  // k per group: 4 chunks of 32
constexpr int kDgDepth = 2;     // groups of W in flight per warp
constexpr int kDgPad = 32;      // bf16 padding per staged x row: rows alternate bank halves
constexpr int kDgStageBatch = 4;  // x vectors a thread loads before it stores the first

// LoadCoherent of one float (the split-K partials other CTAs wrote).
__device__ __forceinline__ float DgLoadCoherentFloat(const float* p) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void DgStore(float* p, float v) { *p = v; }
__device__ __forceinline__ void DgStore(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

// Returns the dynamic shared memory a launch needs: the staged x, or the reduction scratch,
// which reuses it.
inline size_t DecodeGemmSharedBytes(int m, int k_split, int x_tiles) {
  const size_t staged = static_cast<size_t>(m) * (k_split + kDgPad) * sizeof(__nv_bfloat16);
  const size_t scratch = static_cast<size_t>(kDgWarps) * 16 * (8 * x_tiles + 1) * sizeof(float);
  return staged > scratch ? staged : scratch;
}

template <int kXTiles, int kRowWarps, bool kSiluMul, typename OutT>
// Two CTAs per SM (at most 128 registers): a CTA of the next kernel, launched early by PDL, finds
// room beside one of this kernel's CTAs.
__global__ void __launch_bounds__(kDgThreads, 2)
    DecodeGemmKernel(const DecodeGemmParams p) {
  constexpr int kKWarps = kDgWarps / kRowWarps;
  constexpr int kRows = 16 * kRowWarps;
  constexpr int kCols = 8 * kXTiles;
  extern __shared__ __align__(16) unsigned char dg_shared[];
  __shared__ int dg_last;

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int row_warp = warp / kKWarps;
  const int k_warp = warp - row_warp * kKWarps;
  const int tile = blockIdx.x;
  const int split = blockIdx.y;
  // n is a multiple of 16: a warp's rows are all in or all out.
  const int n0 = tile * kRows + row_warp * 16;
  const int k_begin = split * p.k_split;
  const int groups = p.k_split / kDgGroupK;
  const int my_groups =
      (n0 < p.n && k_warp < groups) ? (groups - k_warp + kKWarps - 1) / kKWarps : 0;

  AllowDependentLaunch();

  // W rows g and g + 8 of this warp, from this lane's 8 k of the slice's first chunk.
  const uint4* w_lo = reinterpret_cast<const uint4*>(
      p.w + static_cast<int64_t>(n0 + g) * p.k + k_begin + 8 * t);
  const uint4* w_hi = w_lo + p.k;  // 8 rows further: 8 k / 8 elements per uint4
  uint4 wr[kDgDepth][4][2];
  auto load_group = [&](uint4 (&dst)[4][2], int group) {
    const int64_t at = static_cast<int64_t>(group) * (kDgGroupK / 8);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      dst[c][0] = LoadStreaming(w_lo + at + 4 * c);
      dst[c][1] = LoadStreaming(w_hi + at + 4 * c);
    }
  };
#pragma unroll
  for (int d = 0; d < kDgDepth; ++d) {
    if (d < my_groups) load_group(wr[d], k_warp + d * kKWarps);
  }

  WaitForPrerequisites();

  // Stage this CTA's k slice of x (m rows) in shared memory.
  __nv_bfloat16* xs = reinterpret_cast<__nv_bfloat16*>(dg_shared);
  const int row_elems = p.k_split + kDgPad;
  const int m = p.m;
  {
    // kDgStageBatch vectors per thread in flight before the first is stored.
    const int vectors_per_row = p.k_split / 8;
    const int vectors = m * vectors_per_row;
    for (int base = threadIdx.x; base < vectors; base += kDgThreads * kDgStageBatch) {
      uint4 first[kDgStageBatch], second[kDgStageBatch];
#pragma unroll
      for (int u = 0; u < kDgStageBatch; ++u) {
        const int i = base + u * kDgThreads;
        if (i < vectors) {
          const int r = i / vectors_per_row;
          const __nv_bfloat16* src =
              p.x + r * p.x_stride + k_begin + 8 * (i - r * vectors_per_row);
          first[u] = LoadCoherent(src);
          if constexpr (kSiluMul) second[u] = LoadCoherent(src + p.k);
        }
      }
#pragma unroll
      for (int u = 0; u < kDgStageBatch; ++u) {
        const int i = base + u * kDgThreads;
        if (i < vectors) {
          const int r = i / vectors_per_row;
          uint4 value = first[u];
          if constexpr (kSiluMul) value = SiluMul(first[u], second[u]);
          *reinterpret_cast<uint4*>(xs + r * row_elems + 8 * (i - r * vectors_per_row)) = value;
        }
      }
    }
  }
  __syncthreads();

  float acc[kXTiles][4];
#pragma unroll
  for (int i = 0; i < kXTiles; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;

  for (int i0 = 0; i0 < my_groups; i0 += kDgDepth) {
#pragma unroll
    for (int d = 0; d < kDgDepth; ++d) {
      const int i = i0 + d;
      if (i < my_groups) {
        const int group = k_warp + i * kKWarps;
        const __nv_bfloat16* xg = xs + group * kDgGroupK + 8 * t;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          uint4 b[kXTiles];
#pragma unroll
          for (int xt = 0; xt < kXTiles; ++xt) {
            const int r = 8 * xt + g;
            b[xt] = r < m ? *reinterpret_cast<const uint4*>(xg + r * row_elems + 32 * c)
                          : make_uint4(0, 0, 0, 0);
          }
          const uint4 lo = wr[d][c][0];
          const uint4 hi = wr[d][c][1];
#pragma unroll
          for (int xt = 0; xt < kXTiles; ++xt) {
            Mma(acc[xt], lo.x, hi.x, lo.y, hi.y, b[xt].x, b[xt].y);
            Mma(acc[xt], lo.z, hi.z, lo.w, hi.w, b[xt].z, b[xt].w);
          }
        }
        if (i + kDgDepth < my_groups) load_group(wr[d], k_warp + (i + kDgDepth) * kKWarps);
      }
    }
  }

  // Sum the k warps of each row warp in warp order. Scratch rows are padded by one float so
  // the column-wise reads below hit distinct banks.
  __syncthreads();  // every warp is done with the staged x
  float* scratch = reinterpret_cast<float*>(dg_shared);
  constexpr int kStride = kCols + 1;
  {
    float* mine = scratch + warp * 16 * kStride;
#pragma unroll
    for (int xt = 0; xt < kXTiles; ++xt) {
      const int col = 8 * xt + 2 * t;
      mine[g * kStride + col] = acc[xt][0];
      mine[g * kStride + col + 1] = acc[xt][1];
      mine[(g + 8) * kStride + col] = acc[xt][2];
      mine[(g + 8) * kStride + col + 1] = acc[xt][3];
    }
  }
  __syncthreads();

  OutT* y = static_cast<OutT*>(p.y);
  const int outputs = kRows * m;
  for (int e = threadIdx.x; e < outputs; e += kDgThreads) {
    const int r = e % kRows;
    const int col = e / kRows;
    const int n_index = tile * kRows + r;
    if (n_index >= p.n) continue;
    const int rw = r / 16;
    const int rr = r - rw * 16;
    float sum = 0.f;
#pragma unroll
    for (int kw = 0; kw < kKWarps; ++kw) {
      sum += scratch[((rw * kKWarps + kw) * 16 + rr) * kStride + col];
    }
    if (p.splits == 1) {
      DgStore(y + static_cast<int64_t>(col) * p.n + n_index, sum);
    } else {
      p.partials[(static_cast<int64_t>(split) * m + col) * p.n + n_index] = sum;
    }
  }
  if (p.splits == 1) return;

  // The last CTA of this row tile adds the splits in order. The CTA barrier orders every thread's
  // partials before thread 0's count, whose release publishes them and whose acquire (for the last
  // arriver) makes every split's visible to its CTA after the second barrier.
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t* counter = p.counters + tile;
    const bool last = CountAcqRel(counter) == p.splits - 1;
    if (last) *counter = 0;  // every split has counted: ready for the next launch
    dg_last = last;
  }
  __syncthreads();
  if (!dg_last) return;
  for (int e = threadIdx.x; e < outputs; e += kDgThreads) {
    const int r = e % kRows;
    const int col = e / kRows;
    const int n_index = tile * kRows + r;
    if (n_index >= p.n) continue;
    float sum = 0.f;
    for (int s = 0; s < p.splits; ++s) {
      sum += DgLoadCoherentFloat(p.partials + (static_cast<int64_t>(s) * m + col) * p.n + n_index);
    }
    DgStore(y + static_cast<int64_t>(col) * p.n + n_index, sum);
  }
}

template <int kXTiles, int kRowWarps, bool kSiluMul, typename OutT>
cudaError_t LaunchDecodeGemmKernel(const DecodeGemmParams& p, cudaStream_t stream) {
  auto kernel = DecodeGemmKernel<kXTiles, kRowWarps, kSiluMul, OutT>;
  const size_t shared = DecodeGemmSharedBytes(p.m, p.k_split, kXTiles);
  // Raised once per kernel, on its first launch (eager: the model and the runner warm every
  // shape up before capturing it), so any supported slice fits beside the static shared memory.
  static const cudaError_t raised = AllowSharedMemory(kernel, kDecodeGemmMaxSharedBytes);
  if (raised != cudaSuccess) return raised;
  constexpr int kRows = 16 * kRowWarps;
  const dim3 grid((p.n + kRows - 1) / kRows, p.splits);
  return LaunchWithPdl(kernel, grid, dim3(kDgThreads), shared, stream, p);
}

// Dispatches the row-warp count and the input/output kind for x tiles kXTiles.
template <int kXTiles>
cudaError_t LaunchDecodeGemmTiles(const DecodeGemmParams& p, int row_warps, bool silu_mul,
                                  bool float_output, cudaStream_t stream) {
  using bf16 = __nv_bfloat16;
#define KILN_DG_CASE_(RW)                                                              \
  case RW:                                                                             \
    if (float_output) return LaunchDecodeGemmKernel<kXTiles, RW, false, float>(p, stream); \
    if (silu_mul) return LaunchDecodeGemmKernel<kXTiles, RW, true, bf16>(p, stream);   \
    return LaunchDecodeGemmKernel<kXTiles, RW, false, bf16>(p, stream);
  switch (row_warps) {
    KILN_DG_CASE_(1)
    KILN_DG_CASE_(2)
    KILN_DG_CASE_(4)
    default:
      return cudaErrorInvalidValue;
  }
#undef KILN_DG_CASE_
}

}  // namespace internal
}  // namespace kiln

#endif  // KILN_RUNTIME_MODEL_INTERNAL_DECODE_GEMM_KERNEL_CUH_
