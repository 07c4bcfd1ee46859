// The prefetch GEMM (see prefetch_gemm.h).
//
// Work split. CTA c owns rows [c·n/G, (c+1)·n/G) of W (G CTAs), all of k: a contiguous range of
// W, so the CTAs stream disjoint memory and balance to one row. The CTA walks its rows in groups
// of 16 (the M of mma.m16n8k16; the last group may be partial) and each group's k in chunks of
// 1024: one stage = 16 rows × 1024 k, copied row by row (cp.async.bulk, one per row, issued by
// the lanes of warp 0) into a ring slot whose rows are padded by 64 bytes, so the fragment loads
// below hit all 32 banks. The 8 warps share every stage: warp w takes the 32-k chunks w, w + 8,
// w + 16 and w + 24, accumulates across the stages of a group in registers, and at the end of a
// group the warps' partial sums meet in shared memory in warp order.
//
// Fragments (as the decode GEMM, internal/decode_gemm_kernel.cuh): a dot product does not care
// about the order of its terms, so lane (g = lane/4, t = lane%4) loads 16 bytes = 8 consecutive
// k of W rows g and g + 8 and of x row g at the same k, and uses them as the A and B elements of
// two k16 steps. Rows of x from m to 7 are zeros.
//
// Pipeline. Stage i goes to slot i % S and completes on the slot's mbarrier (phase i / S). The
// first S stages are issued before griddepcontrol.wait; after each stage every thread passes a
// CTA barrier (all reads of the slot are done) and warp 0 refills the slot with stage i + S. x is
// staged after the wait (it is the previous kernel's output): one bulk copy per row on its own
// mbarrier, so all of it is one L2 round trip; through SiLU·mul, the threads load gate and up and
// store SiLU(gate)·up.
//
// The norm inputs (NormInput below). LaunchFusedAddRmsNorm runs one block of T = 32·ceil(k/8/32)
// threads per row for k ≤ 8192: thread v owns the 8-element vector v, sums its squares in
// element order (float, contracted to FMAs), the block adds them warp by warp (xor butterfly),
// then across warps (the warp sums in lanes 0..T/32-1, zeros above, a butterfly again). The GEMM
// repeats exactly that: its thread v (and v + 256, ...) takes vector v of every row, adds the
// residual, rounds, stores h into the staged x, squares and butterflies within its warp (the same
// 32 vectors as the norm kernel's warp), and the warps' sums per row meet in shared memory; then
// x = h · rsqrt(Σ/k + eps) · weight, rounded, in place.
#include "runtime/cuda/compute_capability.h"
#include "runtime/model/prefetch_gemm.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "runtime/model/internal/pdl_launch.cuh"
#include "runtime/model/internal/vec.cuh"

namespace kiln {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kGroupRows = 16;    // rows of W per stage: the M of the MMA
constexpr int kStageK = 1024;     // k per stage
constexpr int kRowPad = 32;       // bf16 per stage row (64 bytes): rows alternate bank halves
constexpr int kStageRowElems = kStageK + kRowPad;
constexpr size_t kStageBytes = size_t{kGroupRows} * kStageRowElems * sizeof(__nv_bfloat16);
constexpr int kChunksPerWarp = kStageK / 32 / kWarps;  // 32-k chunks of a stage per warp
constexpr int kScratchStride = 9;  // floats per scratch row: 8 columns + 1 against bank conflicts
constexpr size_t kScratchBytes = size_t{kWarps} * kGroupRows * kScratchStride * sizeof(float);
// kPrefetchGemmMaxStages 8-byte mbarriers for the ring, then one for x.
constexpr size_t kBarrierBytes = 256;
static_assert((kPrefetchGemmMaxStages + 1) * 8 <= kBarrierBytes, "barrier area too small");
static_assert(kChunksPerWarp * 32 * kWarps == kStageK, "a stage must split evenly over warps");

size_t RoundUp(size_t v, size_t to) { return (v + to - 1) / to * to; }

// bf16 elements per staged x row: k rounded up to 64 plus 32, so consecutive rows start 64
// bytes apart modulo 128 (the fragment loads of rows g and g + 1 then use disjoint banks).
__host__ __device__ constexpr int XRowElems(int k) { return (k + 63) / 64 * 64 + 32; }

size_t XBytes(int m, int k) {
  return RoundUp(static_cast<size_t>(m) * XRowElems(k) * sizeof(__nv_bfloat16), 128);
}

// How the kernel stages x: a bulk copy, through SiLU·mul, or through the (add +) RMSNorm.
enum class Staging { kCopy, kSiluMul, kNorm };

struct Params {
  const __nv_bfloat16* x;  // [m, x_stride]: x, or gate (first k) and up (next k) for SiLU·mul
  const __nv_bfloat16* w;  // [n, k]
  void* y;                 // [m, n]
  int m, n, k;
  int64_t x_stride;  // elements between rows of x
  int stages;        // ring slots
  int x_bytes;       // shared bytes of the staged x (XBytes)
  // kNorm only: residual_in null is kRmsNorm (h = x), else h = bf16(x + residual_in).
  const __nv_bfloat16* residual_in;   // [m, k]
  __nv_bfloat16* residual_out;        // [m, k] or null: h, written by CTA 0
  const __nv_bfloat16* norm_weight;   // [k]
  float eps;
};

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

// A 16-byte load of data the previous kernel wrote: from L2 (this SM's L1 may hold older lines
// of the same buffer), never moved before griddepcontrol.wait (volatile, memory clobber).
__device__ __forceinline__ uint4 LoadCoherent(const void* p) {
  uint4 v;
  asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

// SiLU(gate)·up of 8 packed bf16 values, rounded to bf16 as the SiLU·mul kernel does.
__device__ __forceinline__ uint4 SiluMul(const uint4& gate, const uint4& up) {
  const __nv_bfloat162* g2 = reinterpret_cast<const __nv_bfloat162*>(&gate);
  const __nv_bfloat162* u2 = reinterpret_cast<const __nv_bfloat162*>(&up);
  uint4 out;
  __nv_bfloat162* o2 = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 g = __bfloat1622float2(g2[i]);
    const float2 u = __bfloat1622float2(u2[i]);
    o2[i] = __floats2bfloat162_rn(g.x / (1.0f + expf(-g.x)) * u.x, g.y / (1.0f + expf(-g.y)) * u.y);
  }
  return out;
}

// Sums `value` over the 32 lanes of the warp by an xor butterfly (internal::BlockSum's first
// stage, so the same order and bits); every lane gets the sum.
__device__ __forceinline__ float WarpSum(float value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

// Stages x = RMSNorm(h) * weight into xs with h = x or bf16(x + residual_in) (see the file
// comment for why this order of sums gives LaunchRmsNorm's and LaunchFusedAddRmsNorm's bits).
// `weight_first` holds this thread's first weight vector, loaded before the wait. `partial`
// ([m][32] floats) and `row_scale` ([m]) are shared scratch. Ends with a CTA barrier.
__device__ __forceinline__ void StageNormedX(const Params& p, __nv_bfloat16* xs,
                                             const uint4& weight_first, float* partial,
                                             float* row_scale) {
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
  for (int base = 0; base < norm_threads; base += kThreads) {
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
          const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&h_bits);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float2 f = __bfloat1622float2(h2[i]);
            h[2 * i] = f.x;
            h[2 * i + 1] = f.y;
          }
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
  __syncthreads();
  if (warp < p.m) {
    // internal::BlockSum's second stage, then rms_norm.cu's scale.
    const float total = WarpSum(lane < norm_threads / 32 ? partial[warp * 32 + lane] : 0.0f);
    if (lane == 0) row_scale[warp] = rsqrtf(total / static_cast<float>(p.k) + p.eps);
  }
  __syncthreads();
  for (int v = threadIdx.x; v < vectors; v += kThreads) {
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
  __syncthreads();
}

__device__ __forceinline__ void Mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                    uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void Store(float* p, float v) { *p = v; }
__device__ __forceinline__ void Store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

// At most 80 registers (three CTAs' worth): two CTAs of this kernel and a decode-attention CTA
// (128 threads × 168 registers) fit in an SM's 64 K registers.
template <Staging kStaging, typename OutT>
__global__ void __launch_bounds__(kThreads, 3) PrefetchGemmKernel(const Params p) {
  extern __shared__ __align__(128) unsigned char shared[];
  uint64_t* full = reinterpret_cast<uint64_t*>(shared);  // [stages]
  uint64_t* x_full = full + kPrefetchGemmMaxStages;
  float* scratch = reinterpret_cast<float*>(shared + kBarrierBytes);
  __nv_bfloat16* xs = reinterpret_cast<__nv_bfloat16*>(shared + kBarrierBytes + kScratchBytes);
  unsigned char* ring = shared + kBarrierBytes + kScratchBytes + p.x_bytes;

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;

  // The next kernel may become resident now and start its own independent prologue.
  internal::AllowDependentLaunch();

  const int64_t row_begin = static_cast<int64_t>(blockIdx.x) * p.n / gridDim.x;
  const int rows = static_cast<int>(static_cast<int64_t>(blockIdx.x + 1) * p.n / gridDim.x -
                                    row_begin);
  const int k_stages = (p.k + kStageK - 1) / kStageK;
  const int total = (rows + kGroupRows - 1) / kGroupRows * k_stages;
  const int stages = p.stages;

  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) MbarrierInit(SharedAddress(full + s), 1);
    MbarrierInit(SharedAddress(x_full), 1);
    FenceBarrierInit();
  }
  __syncthreads();

  // Warp 0 issues stage i into slot i % stages: one bulk copy per row of the group.
  auto issue = [&](int i) {
    const int group = i / k_stages;
    const int k0 = (i - group * k_stages) * kStageK;
    const int group_rows = min(kGroupRows, rows - group * kGroupRows);
    const uint32_t row_bytes = static_cast<uint32_t>(min(kStageK, p.k - k0)) * 2u;
    const int slot = i % stages;
    const uint32_t bar = SharedAddress(full + slot);
    if (lane == 0) MbarrierArriveExpectTx(bar, row_bytes * group_rows);
    __syncwarp();
    if (lane < group_rows) {
      const __nv_bfloat16* src =
          p.w + (row_begin + group * kGroupRows + lane) * static_cast<int64_t>(p.k) + k0;
      const uint32_t dst =
          SharedAddress(ring + slot * kStageBytes + lane * kStageRowElems * sizeof(__nv_bfloat16));
      BulkCopyToShared(dst, src, row_bytes, bar);
    }
  };
  if (warp == 0) {
    for (int i = 0; i < min(stages, total); ++i) issue(i);
  }
  // The norm's weights are written by no kernel either.
  uint4 norm_weight_first = make_uint4(0, 0, 0, 0);
  if constexpr (kStaging == Staging::kNorm) {
    if (threadIdx.x < p.k / 8) {
      norm_weight_first = *reinterpret_cast<const uint4*>(p.norm_weight + 8 * threadIdx.x);
    }
  }

  // Everything below reads what earlier kernels wrote (every CTA waits, see pdl_launch.cuh).
  internal::WaitForPrerequisites();

  // Stage x (m rows of k).
  if constexpr (kStaging == Staging::kNorm) {
    // The scratch is free until the first group's end.
    StageNormedX(p, xs, norm_weight_first, scratch, scratch + kPrefetchGemmMaxRows * 32);
  } else if constexpr (kStaging == Staging::kCopy) {
    if (warp == 0) {
      const uint32_t bar = SharedAddress(x_full);
      const uint32_t row_bytes = static_cast<uint32_t>(p.k) * 2u;
      if (lane == 0) MbarrierArriveExpectTx(bar, row_bytes * p.m);
      __syncwarp();
      if (lane < p.m) {
        BulkCopyToShared(SharedAddress(xs + lane * XRowElems(p.k)), p.x + lane * p.x_stride,
                         row_bytes, bar);
      }
    }
    MbarrierWait(SharedAddress(x_full), 0);
  } else {
    // Through SiLU·mul: several vectors per thread in flight (gate and up for each).
    const int row_elems = XRowElems(p.k);
    const int vectors_per_row = p.k / 8;
    const int vectors = p.m * vectors_per_row;
    constexpr int kBatch = 4;
    for (int base = threadIdx.x; base < vectors; base += kThreads * kBatch) {
      uint4 first[kBatch], second[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int i = base + u * kThreads;
        if (i < vectors) {
          const int r = i / vectors_per_row;
          const __nv_bfloat16* src = p.x + r * p.x_stride + 8 * (i - r * vectors_per_row);
          first[u] = LoadCoherent(src);
          second[u] = LoadCoherent(src + p.k);
        }
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int i = base + u * kThreads;
        if (i < vectors) {
          const int r = i / vectors_per_row;
          *reinterpret_cast<uint4*>(xs + r * row_elems + 8 * (i - r * vectors_per_row)) =
              SiluMul(first[u], second[u]);
        }
      }
    }
    __syncthreads();
  }

  const int x_row_elems = XRowElems(p.k);
  const __nv_bfloat16* x_row = xs + g * x_row_elems;  // read only by lanes with g < m
  OutT* y = static_cast<OutT*>(p.y);
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (int i = 0; i < total; ++i) {
    const int slot = i % stages;
    const int group = i / k_stages;
    const int k_stage = i - group * k_stages;
    const int k0 = k_stage * kStageK;
    const int group_rows = min(kGroupRows, rows - group * kGroupRows);
    const int vectors = min(kStageK, p.k - k0) / 8;  // 8-k vectors of each row in this stage
    MbarrierWait(SharedAddress(full + slot), static_cast<uint32_t>((i / stages) & 1));

    const __nv_bfloat16* ws =
        reinterpret_cast<const __nv_bfloat16*>(ring + slot * kStageBytes);
    uint4 lo[kChunksPerWarp], hi[kChunksPerWarp], b[kChunksPerWarp];
#pragma unroll
    for (int c = 0; c < kChunksPerWarp; ++c) {
      const int v = 4 * (warp + kWarps * c) + t;
      const uint4 zero = make_uint4(0, 0, 0, 0);
      lo[c] = hi[c] = b[c] = zero;
      if (v < vectors) {
        if (g < group_rows) {
          lo[c] = *reinterpret_cast<const uint4*>(ws + g * kStageRowElems + 8 * v);
        }
        if (g + 8 < group_rows) {
          hi[c] = *reinterpret_cast<const uint4*>(ws + (g + 8) * kStageRowElems + 8 * v);
        }
        if (g < p.m) b[c] = *reinterpret_cast<const uint4*>(x_row + k0 + 8 * v);
      }
    }
#pragma unroll
    for (int c = 0; c < kChunksPerWarp; ++c) {
      Mma(acc, lo[c].x, hi[c].x, lo[c].y, hi[c].y, b[c].x, b[c].y);
      Mma(acc, lo[c].z, hi[c].z, lo[c].w, hi[c].w, b[c].z, b[c].w);
    }

    const bool group_end = k_stage == k_stages - 1;
    if (group_end) {
      // acc: rows g and g + 8 of the group, x rows 2t and 2t + 1.
      float* mine = scratch + warp * kGroupRows * kScratchStride;
      mine[g * kScratchStride + 2 * t] = acc[0];
      mine[g * kScratchStride + 2 * t + 1] = acc[1];
      mine[(g + 8) * kScratchStride + 2 * t] = acc[2];
      mine[(g + 8) * kScratchStride + 2 * t + 1] = acc[3];
      acc[0] = acc[1] = acc[2] = acc[3] = 0.f;
    }
    __syncthreads();  // the slot is read by every warp; the scratch is complete
    if (warp == 0 && i + stages < total) issue(i + stages);
    if (group_end) {
      if (threadIdx.x < kGroupRows * p.m) {
        const int r = threadIdx.x % kGroupRows;
        const int col = threadIdx.x / kGroupRows;
        if (r < group_rows) {
          float sum = 0.f;
#pragma unroll
          for (int w = 0; w < kWarps; ++w) {
            sum += scratch[(w * kGroupRows + r) * kScratchStride + col];
          }
          Store(y + static_cast<int64_t>(col) * p.n + row_begin + group * kGroupRows + r, sum);
        }
      }
      // With one stage per group the next stage's scratch writes would follow at once.
      if (k_stages == 1) __syncthreads();
    }
  }
}

// Returns whether the current device has the bulk-copy engine (compute capability 9.0 or
// later). Asked once per process: kiln runs on one kind of GPU at a time.
bool DeviceHasBulkCopy() { return CurrentDeviceIsSm90OrLater(); }

template <Staging kStaging, typename OutT>
cudaError_t SetAttributes() {
  auto kernel = PrefetchGemmKernel<kStaging, OutT>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kPrefetchGemmMaxSharedBytes));
  if (e != cudaSuccess) return e;
  // The most shared memory per SM, so that a CTA of this kernel finds room beside another.
  return cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                              cudaSharedmemCarveoutMaxShared);
}

cudaError_t Prepare() {
  static const cudaError_t prepared = [] {
    if (!DeviceHasBulkCopy()) return cudaSuccess;
    for (cudaError_t e : {SetAttributes<Staging::kCopy, __nv_bfloat16>(),
                          SetAttributes<Staging::kSiluMul, __nv_bfloat16>(),
                          SetAttributes<Staging::kNorm, __nv_bfloat16>(),
                          SetAttributes<Staging::kCopy, float>(),
                          SetAttributes<Staging::kSiluMul, float>(),
                          SetAttributes<Staging::kNorm, float>()}) {
      if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
  }();
  return prepared;
}

template <typename OutT>
cudaError_t Launch(Staging staging, const Params& p, int ctas, size_t shared,
                   cudaStream_t stream) {
  auto kernel = staging == Staging::kNorm      ? PrefetchGemmKernel<Staging::kNorm, OutT>
                : staging == Staging::kSiluMul ? PrefetchGemmKernel<Staging::kSiluMul, OutT>
                                               : PrefetchGemmKernel<Staging::kCopy, OutT>;
  return internal::LaunchWithPdl(kernel, dim3(ctas), dim3(kThreads), shared, stream, p);
}

bool IsNorm(PrefetchGemmInput input) {
  return input == PrefetchGemmInput::kRmsNorm || input == PrefetchGemmInput::kAddRmsNorm;
}

// Returns whether the `count` elements at `a` and at `b` share any byte.
bool Overlap(const __nv_bfloat16* a, const __nv_bfloat16* b, int64_t count) {
  return a < b + count && b < a + count;
}

}  // namespace

std::string PrefetchGemmConfig::ToString() const {
  return "c" + std::to_string(ctas) + "s" + std::to_string(stages);
}

size_t PrefetchGemmSharedBytes(int m, int k, int stages) {
  return kBarrierBytes + kScratchBytes + XBytes(m, k) + static_cast<size_t>(stages) * kStageBytes;
}

PrefetchGemmConfig ChoosePrefetchGemmConfig(int m, int n, int k, int sm_count, int ctas_per_sm,
                                            size_t shared_budget) {
  PrefetchGemmConfig c;
  if (m < 1 || n < 1 || k < 1 || ctas_per_sm < 1) return c;
  auto ctas_for = [&](int per_sm) {
    return static_cast<int>(
        std::max<int64_t>(1, std::min<int64_t>(int64_t{std::max(sm_count, 1)} * per_sm, n)));
  };
  // The stages one CTA walks through: all of them in the ring means all of its W is copied
  // before the wait.
  auto needed = [&](int ctas) {
    const int64_t rows = (int64_t{n} + ctas - 1) / ctas;
    return (rows + kGroupRows - 1) / kGroupRows * ((int64_t{k} + kStageK - 1) / kStageK);
  };
  const size_t fixed = PrefetchGemmSharedBytes(m, k, 0);
  auto fit = [&](size_t budget) {
    return budget > fixed ? static_cast<int64_t>((budget - fixed) / kStageBytes) : int64_t{0};
  };
  c.ctas = ctas_for(ctas_per_sm);
  int64_t stages = fit(shared_budget);
  // Two stages at least overlap a stage's copy with the previous one's MMAs: past the budget
  // (a large x), one CTA per SM with the whole of its shared memory.
  if (stages < 2 && needed(c.ctas) >= 2) {
    c.ctas = ctas_for(1);
    stages = fit(kPrefetchGemmMaxSharedBytes);
  }
  c.stages = static_cast<int>(std::min<int64_t>({stages, needed(c.ctas), kPrefetchGemmMaxStages}));
  return c;
}

bool PrefetchGemmSupportsShape(int m, int n, int k, const PrefetchGemmConfig& c) {
  if (m < 1 || m > kPrefetchGemmMaxRows || n < 1 || k < 8 || k % 8 != 0) return false;
  if (c.ctas < 1 || c.ctas > n || c.stages < 1 || c.stages > kPrefetchGemmMaxStages) return false;
  return PrefetchGemmSharedBytes(m, k, c.stages) <= kPrefetchGemmMaxSharedBytes &&
         DeviceHasBulkCopy();
}

bool PrefetchGemmSupportsNormShape(int m, int n, int k, const PrefetchGemmConfig& c) {
  return k <= kPrefetchGemmMaxNormK && PrefetchGemmSupportsShape(m, n, k, c);
}

bool PrefetchGemmSupports(const PrefetchGemmArgs& a, const PrefetchGemmConfig& c) {
  const bool shape = IsNorm(a.input) ? PrefetchGemmSupportsNormShape(a.m, a.n, a.k, c)
                                     : PrefetchGemmSupportsShape(a.m, a.n, a.k, c);
  if (!shape || a.x == nullptr || a.w == nullptr || a.y == nullptr || !internal::Aligned16(a.x) ||
      !internal::Aligned16(a.w) || !internal::Aligned16(a.y)) {
    return false;
  }
  if (!IsNorm(a.input)) return true;
  const bool add = a.input == PrefetchGemmInput::kAddRmsNorm;
  if (a.norm_weight == nullptr || !internal::Aligned16(a.norm_weight)) return false;
  if (add && (a.residual_in == nullptr || a.residual_out == nullptr ||
              !internal::Aligned16(a.residual_in))) {
    return false;
  }
  if (a.residual_out == nullptr) return true;
  const int64_t count = int64_t{a.m} * a.k;
  return internal::Aligned16(a.residual_out) && !Overlap(a.residual_out, a.x, count) &&
         !(add && Overlap(a.residual_out, a.residual_in, count));
}

cudaError_t PreparePrefetchGemm() { return Prepare(); }

cudaError_t LaunchPrefetchGemm(const PrefetchGemmArgs& a, const PrefetchGemmConfig& c,
                               cudaStream_t stream) {
  if (!PrefetchGemmSupports(a, c)) return cudaErrorInvalidValue;
  const cudaError_t prepared = Prepare();
  if (prepared != cudaSuccess) return prepared;
  Params p;
  p.x = a.x;
  p.w = a.w;
  p.y = a.y;
  p.m = a.m;
  p.n = a.n;
  p.k = a.k;
  p.x_stride = a.input == PrefetchGemmInput::kSiluMul ? 2 * int64_t{a.k} : a.k;
  p.stages = c.stages;
  p.x_bytes = static_cast<int>(XBytes(a.m, a.k));
  p.residual_in = a.input == PrefetchGemmInput::kAddRmsNorm ? a.residual_in : nullptr;
  p.residual_out = IsNorm(a.input) ? a.residual_out : nullptr;
  p.norm_weight = a.norm_weight;
  p.eps = a.eps;
  const size_t shared = PrefetchGemmSharedBytes(a.m, a.k, c.stages);
  const Staging staging = IsNorm(a.input)                       ? Staging::kNorm
                          : a.input == PrefetchGemmInput::kSiluMul ? Staging::kSiluMul
                                                                 : Staging::kCopy;
  return a.float_output ? Launch<float>(staging, p, c.ctas, shared, stream)
                        : Launch<__nv_bfloat16>(staging, p, c.ctas, shared, stream);
}

}  // namespace kiln
