// The weight-streaming GEMV core shared by the prefetch GEMM (prefetch_gemm.cu) and the decode
// layer kernel (decode_layer.cu): the bulk-copy and mbarrier primitives, the ring stage of W
// (16 rows × 1024 k, rows padded by 64 bytes), the tensor-core product of one stage with up to 8
// rows of x, the per-group reduction over the 8 compute warps, and the staging of x through the
// (add +) RMSNorm. Both kernels use these same pieces in the same order, so a row of y has the
// same bits whichever of them computes it. sm_90 only (the bulk-copy engine). Included by .cu
// files only.
//
// Fragments (as the decode GEMM, decode_gemm_kernel.cuh): a dot product does not care about the
// order of its terms, so lane (g = lane/4, t = lane%4) loads 16 bytes = 8 consecutive k of W rows
// g and g + 8 and of x row g at the same k, and uses them as the A and B elements of two k16
// steps. Rows of x from m to 7 are zeros. The 8 compute warps share every stage: warp w takes the
// 32-k chunks w, w + 8, w + 16 and w + 24, accumulates across the stages of a group of rows in
// registers, and at the group's end the warps' partial sums meet in shared memory in warp order.
//
// The norm staging (StageNormedX). LaunchFusedAddRmsNorm runs one block of T = 32·ceil(k/8/32)
// threads per row for k ≤ 8192: thread v owns the 8-element vector v, sums its squares in element
// order (float, contracted to FMAs), the block adds them warp by warp (xor butterfly), then across
// warps (the warp sums in lanes 0..T/32-1, zeros above, a butterfly again). StageNormedX repeats
// exactly that: its thread v (and v + 256, ...) takes vector v of every row, adds the residual,
// rounds, stores h into the staged x, squares and butterflies within its warp (the same 32 vectors
// as the norm kernel's warp), and the warps' sums per row meet in shared memory; then x = h ·
// rsqrt(Σ/k + eps) · weight, rounded, in place.
#ifndef KILN_RUNTIME_MODEL_INTERNAL_PREFETCH_STAGE_CUH_
#define KILN_RUNTIME_MODEL_INTERNAL_PREFETCH_STAGE_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "runtime/model/internal/vec.cuh"

namespace kiln {
namespace internal {

constexpr int kStageWarps = 8;                  // compute warps sharing a stage
constexpr int kStageThreads = kStageWarps * 32;
constexpr int kGroupRows = 16;    // rows of W per stage: the M of the MMA
constexpr int kStageK = 1024;     // k per stage
constexpr int kRowPad = 32;       // bf16 per stage row (64 bytes): rows alternate bank halves
constexpr int kStageRowElems = kStageK + kRowPad;
constexpr size_t kStageBytes = size_t{kGroupRows} * kStageRowElems * sizeof(__nv_bfloat16);
constexpr int kChunksPerWarp = kStageK / 32 / kStageWarps;  // 32-k chunks of a stage per warp
constexpr int kScratchStride = 9;  // floats per scratch row: 8 columns + 1 against bank conflicts
constexpr size_t kScratchBytes = size_t{kStageWarps} * kGroupRows * kScratchStride * sizeof(float);
constexpr int kMaxXRows = 8;       // rows of x: the N of the MMA
static_assert(kChunksPerWarp * 32 * kStageWarps == kStageK, "a stage must split evenly over warps");

// bf16 elements per staged x row: k rounded up to 64 plus 32, so consecutive rows start 64
// bytes apart modulo 128 (the fragment loads of rows g and g + 1 then use disjoint banks).
__host__ __device__ constexpr int XRowElems(int k) { return (k + 63) / 64 * 64 + 32; }

// Shared bytes of m staged x rows of k, rounded up to 128 (what follows stays 128-byte aligned).
inline size_t XBytes(int m, int k) {
  const size_t bytes = static_cast<size_t>(m) * XRowElems(k) * sizeof(__nv_bfloat16);
  return (bytes + 127) / 128 * 128;
}

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void MbarrierInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

// Makes the initialised barriers visible to the bulk-copy engine (the async proxy).
__device__ __forceinline__ void FenceBarrierInit() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// Arrives once (the barrier's only arrival per phase) and adds `bytes` to the phase's expected
// transaction count; the phase completes when the copies have delivered them.
__device__ __forceinline__ void MbarrierArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}

// One plain arrival (for barriers that count threads, not bytes).
__device__ __forceinline__ void MbarrierArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void MbarrierWait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n"
        " .reg .pred p;\n"
        " mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (done == 0);
}

// Copies `bytes` (a multiple of 16, both addresses 16-byte aligned) from global memory into this
// CTA's shared memory; completion is counted on `bar`. W is written by no kernel, so this is
// legal before griddepcontrol.wait.
__device__ __forceinline__ void BulkCopyToShared(uint32_t dst, const void* src, uint32_t bytes,
                                                 uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

// x [m, k] = RMSNorm(h) · weight staged for the MMAs, h = x or bf16(x + residual_in).
struct NormStaging {
  const __nv_bfloat16* x;             // [m, x_stride]
  int64_t x_stride;                   // elements between rows of x
  int m, k;                           // k ≤ 8192, a multiple of 8
  const __nv_bfloat16* residual_in;   // [m, k] or null (h = x)
  __nv_bfloat16* residual_out;        // [m, k] or null: h, written by CTA 0
  const __nv_bfloat16* norm_weight;   // [k]
  float eps;
};

// Stages x = RMSNorm(h) * weight into xs (rows XRowElems(k) apart) by the kStageThreads compute
// threads (threadIdx.x < kStageThreads); see the file comment for why this order of sums gives
// LaunchRmsNorm's and LaunchFusedAddRmsNorm's bits. `weight_first` holds this thread's first
// weight vector, loaded before the wait. `partial` ([m][32] floats) and `row_scale` ([m]) are
// shared scratch. `sync()` is a barrier over the compute threads; it ends with one.
template <typename Sync>
__device__ __forceinline__ void StageNormedX(const NormStaging& p, __nv_bfloat16* xs,
                                             const uint4& weight_first, float* partial,
                                             float* row_scale, Sync sync) {
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int vectors = p.k / 8;                      // per row: the norm kernel's busy threads
  const int norm_threads = (vectors + 31) / 32 * 32;  // its block (WarpRoundedThreads)
  const int row_elems = XRowElems(p.k);
  const bool add = p.residual_in != nullptr;
  const bool write_residual = p.residual_out != nullptr && blockIdx.x == 0;
  // Four rows' loads in flight per thread at a time.
  constexpr int kBatch = 4;
  // The loop bounds are the same for every thread, so whole warps reach the shuffles.
  for (int base = 0; base < norm_threads; base += kStageThreads) {
    const int v = base + threadIdx.x;
    const bool mine = v < vectors;
    for (int r0 = 0; r0 < p.m; r0 += kBatch) {
      uint4 delta[kBatch], residual[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int r = r0 + u;
        if (mine && r < p.m) {
          delta[u] = LoadCoherent(p.x + r * p.x_stride + 8 * v);
          if (add) residual[u] = LoadCoherent(p.residual_in + r * int64_t{p.k} + 8 * v);
        }
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int r = r0 + u;
        if (r >= p.m) break;
        float sum_sq = 0.0f;
        if (mine) {
          // rms_norm.cu: v = x (+ residual, stored and re-read as bf16), sum_sq += v * v.
          float h[8];
          uint4 h_bits = delta[u];
          const __nv_bfloat162* d2 = reinterpret_cast<const __nv_bfloat162*>(&delta[u]);
          if (add) {
            const __nv_bfloat162* r2 = reinterpret_cast<const __nv_bfloat162*>(&residual[u]);
            __nv_bfloat162* h2 = reinterpret_cast<__nv_bfloat162*>(&h_bits);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const float2 a = __bfloat1622float2(d2[i]);
              const float2 b = __bfloat1622float2(r2[i]);
              h2[i] = __floats2bfloat162_rn(a.x + b.x, a.y + b.y);
            }
          }
          UnpackBf16x8(h_bits, h);
#pragma unroll
          for (int i = 0; i < 8; ++i) sum_sq += h[i] * h[i];
          *reinterpret_cast<uint4*>(xs + r * row_elems + 8 * v) = h_bits;
          if (write_residual) {
            *reinterpret_cast<uint4*>(p.residual_out + r * int64_t{p.k} + 8 * v) = h_bits;
          }
        }
        // The norm kernel's warp base / 32 + warp: its sum of squares (zeros past the row).
        sum_sq = WarpSum(sum_sq);
        if (lane == 0 && v < norm_threads) partial[r * 32 + v / 32] = sum_sq;
      }
    }
  }
  sync();
  if (warp < p.m) {
    // BlockSum's second stage, then rms_norm.cu's scale.
    const float total = WarpSum(lane < norm_threads / 32 ? partial[warp * 32 + lane] : 0.0f);
    if (lane == 0) row_scale[warp] = rsqrtf(total / static_cast<float>(p.k) + p.eps);
  }
  sync();
  for (int v = threadIdx.x; v < vectors; v += kStageThreads) {
    const uint4 w_bits =
        v == threadIdx.x ? weight_first
                         : *reinterpret_cast<const uint4*>(p.norm_weight + 8 * v);
    const __nv_bfloat162* w2 = reinterpret_cast<const __nv_bfloat162*>(&w_bits);
    for (int r = 0; r < p.m; ++r) {
      const float scale = row_scale[r];
      uint4* slot = reinterpret_cast<uint4*>(xs + r * row_elems + 8 * v);
      uint4 bits = *slot;
      __nv_bfloat162* h2 = reinterpret_cast<__nv_bfloat162*>(&bits);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 h = __bfloat1622float2(h2[i]);
        const float2 w = __bfloat1622float2(w2[i]);
        // rms_norm.cu: v * scale * weight, left to right, one rounding.
        h2[i] = __floats2bfloat162_rn(h.x * scale * w.x, h.y * scale * w.y);
      }
      *slot = bits;
    }
  }
  sync();
}

// acc += this warp's share of one stage: W rows [0, group_rows) of the slot `ws` times x rows
// [0, m) at k [k0, k0 + 8 · vectors) (`x_row` is staged x row g; read only where g < m). Slot
// row g + 8 is read where g < hi_rows (group_rows − 8 when hi_rows is negative).
__device__ __forceinline__ void MmaStage(float (&acc)[4], const __nv_bfloat16* ws,
                                         const __nv_bfloat16* x_row, int k0, int vectors,
                                         int group_rows, int m, int hi_rows = -1) {
  if (hi_rows < 0) hi_rows = group_rows - 8;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  uint4 lo[kChunksPerWarp], hi[kChunksPerWarp], b[kChunksPerWarp];
#pragma unroll
  for (int c = 0; c < kChunksPerWarp; ++c) {
    const int v = 4 * (warp + kStageWarps * c) + t;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    lo[c] = hi[c] = b[c] = zero;
    if (v < vectors) {
      if (g < group_rows) {
        lo[c] = *reinterpret_cast<const uint4*>(ws + g * kStageRowElems + 8 * v);
      }
      if (g < hi_rows) {
        hi[c] = *reinterpret_cast<const uint4*>(ws + (g + 8) * kStageRowElems + 8 * v);
      }
      if (g < m) b[c] = *reinterpret_cast<const uint4*>(x_row + k0 + 8 * v);
    }
  }
#pragma unroll
  for (int c = 0; c < kChunksPerWarp; ++c) {
    Mma(acc, lo[c].x, hi[c].x, lo[c].y, hi[c].y, b[c].x, b[c].y);
    Mma(acc, lo[c].z, hi[c].z, lo[c].w, hi[c].w, b[c].z, b[c].w);
  }
}

// At a group's end: stores this warp's acc (rows g and g + 8 of the group, x rows 2t and
// 2t + 1) into `scratch` and clears it.
__device__ __forceinline__ void StashGroup(float (&acc)[4], float* scratch) {
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  float* mine = scratch + warp * kGroupRows * kScratchStride;
  mine[g * kScratchStride + 2 * t] = acc[0];
  mine[g * kScratchStride + 2 * t + 1] = acc[1];
  mine[(g + 8) * kScratchStride + 2 * t] = acc[2];
  mine[(g + 8) * kScratchStride + 2 * t + 1] = acc[3];
  acc[0] = acc[1] = acc[2] = acc[3] = 0.f;
}

// Returns y of group row r and x row col: the warps' stashed sums in warp order.
__device__ __forceinline__ float GroupSum(const float* scratch, int r, int col) {
  float sum = 0.f;
#pragma unroll
  for (int w = 0; w < kStageWarps; ++w) sum += scratch[(w * kGroupRows + r) * kScratchStride + col];
  return sum;
}

}  // namespace internal
}  // namespace kiln

#endif  // KILN_RUNTIME_MODEL_INTERNAL_PREFETCH_STAGE_CUH_
