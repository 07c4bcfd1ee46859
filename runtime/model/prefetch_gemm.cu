// The prefetch GEMM (see prefetch_gemm.h).
//
// Work split. CTA c owns rows [c·n/G, (c+1)·n/G) of W (G CTAs), all of k: a contiguous range of
// W, so the CTAs stream disjoint memory and balance to one row. The CTA walks its rows in groups
// of 16 (the M of mma.m16n8k16; the last group may be partial) and each group's k in chunks of
// 1024: one stage = 16 rows × 1024 k, copied row by row (cp.async.bulk, one per row, issued by
// the lanes of warp 0) into a ring slot. With the SiLU·mul output the CTA owns rows
// [c·F/G, (c+1)·F/G) of y (F = n / 2) instead and walks two groups for each 16 of them: 16 gate
// rows of W, then their 16 up rows (F further on); a thread keeps its gate sum in a register
// from the first group's end to the second's, where it writes SiLU(gate)·up. With row halves
// (a CTA of at most 8 rows, m ≤ 4) a stage is 8 rows × 2048 k: stage row r holds k [0, 1024) of
// row r and stage row r + 8 k [1024, 2048) of it, the MMA's columns [0, m) are x's rows at the
// first 1024 k and columns [m, 2m) the same rows at the next, and y of row r is the sum of the
// two products' (r, col) and (r + 8, col + m) elements. Without it a CTA of 8 rows fills half of
// each stage; with it the same shared memory carries twice the weights. The stage's layout,
// its products on the tensor cores, the reduction over the 8 warps and the norm staging are
// internal/prefetch_stage.cuh's (shared with the decode layer kernel).
//
// Pipeline. Stage i goes to slot i % S and completes on the slot's mbarrier (phase i / S). The
// first S stages are issued before griddepcontrol.wait; after each stage every thread passes a
// CTA barrier (all reads of the slot are done) and warp 0 refills the slot with stage i + S. x is
// staged after the wait (it is the previous kernel's output): one bulk copy per row on its own
// mbarrier, so all of it is one L2 round trip; through SiLU·mul, the threads load gate and up and
// store SiLU(gate)·up.
#include "runtime/cuda/compute_capability.h"
#include "runtime/model/prefetch_gemm.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "runtime/model/internal/pdl_launch.cuh"
#include "runtime/model/internal/prefetch_stage.cuh"
#include "runtime/model/internal/vec.cuh"

namespace kiln {
namespace {

using internal::kGroupRows;
using internal::kStageBytes;
using internal::kStageK;
using internal::kStageRowElems;
using internal::XBytes;
using internal::XRowElems;

constexpr int kThreads = internal::kStageThreads;
constexpr size_t kScratchBytes = internal::kScratchBytes;
// kPrefetchGemmMaxStages 8-byte mbarriers for the ring, then one for x.
constexpr size_t kBarrierBytes = 256;
static_assert((kPrefetchGemmMaxStages + 1) * 8 <= kBarrierBytes, "barrier area too small");

// How the kernel stages x: a bulk copy, through SiLU·mul, or through the (add +) RMSNorm.
enum class Staging { kCopy, kSiluMul, kNorm };

struct Params {
  const __nv_bfloat16* x;  // [m, x_stride]: x, or gate (first k) and up (next k) for SiLU·mul
  const __nv_bfloat16* w;  // [n, k]
  void* y;                 // [m, n]
  int m, n, k;
  int64_t x_stride;  // elements between rows of x
  int out_rows;      // y's columns (its row stride): n, or F = n / 2 with the SiLU·mul output
  int stages;        // ring slots
  bool row_halves;   // PrefetchGemmConfig::row_halves: a CTA's ≤ 8 rows, each as two k halves
  int x_bytes;       // shared bytes of the staged x (XBytes)
  // kNorm only: residual_in null is kRmsNorm (h = x), else h = bf16(x + residual_in).
  const __nv_bfloat16* residual_in;   // [m, k]
  __nv_bfloat16* residual_out;        // [m, k] or null: h, written by CTA 0
  const __nv_bfloat16* norm_weight;   // [k]
  float eps;
};

using internal::BulkCopyToShared;
using internal::LoadCoherent;
using internal::MbarrierArriveExpectTx;
using internal::MbarrierInit;
using internal::MbarrierWait;
using internal::SharedAddress;

__device__ __forceinline__ void Store(float* p, float v) { *p = v; }
__device__ __forceinline__ void Store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

// At most 80 registers (three CTAs' worth): two CTAs of this kernel and a decode-attention CTA
// (128 threads × 168 registers) fit in an SM's 64 K registers. kSiluOut: y [m, F] is
// SiLU(gate)·up of W's gate rows [0, F) and up rows [F, n) (bf16 y, copied x).
template <Staging kStaging, typename OutT, bool kSiluOut = false>
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

  // The next kernel may become resident now and start its own independent prologue.
  AllowDependentLaunch();

  // The CTA's outputs: rows [row_begin, row_begin + rows) of y's columns, 16 to a group of W
  // rows (kHalves groups: the gate rows, then their up rows, with the SiLU·mul output).
  constexpr int kHalves = kSiluOut ? 2 : 1;
  const int64_t row_begin = static_cast<int64_t>(blockIdx.x) * p.out_rows / gridDim.x;
  const int rows = static_cast<int>(static_cast<int64_t>(blockIdx.x + 1) * p.out_rows / gridDim.x -
                                    row_begin);
  // With row halves a stage holds 2 · kStageK of k: slot row r < 8 the first kStageK of W row r,
  // slot row r + 8 the next kStageK of it; x's two halves are MMA columns [0, m) and [m, 2m).
  const int stage_k = p.row_halves ? 2 * kStageK : kStageK;
  const int k_stages = (p.k + stage_k - 1) / stage_k;
  const int total = (rows + kGroupRows - 1) / kGroupRows * kHalves * k_stages;
  const int stages = p.stages;

  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) MbarrierInit(SharedAddress(full + s), 1);
    MbarrierInit(SharedAddress(x_full), 1);
    internal::FenceBarrierInit();
  }
  __syncthreads();

  // Warp 0 issues stage i into slot i % stages: one bulk copy per row of the group.
  auto issue = [&](int i) {
    const int group = i / k_stages;
    const int k0 = (i - group * k_stages) * stage_k;
    const int out_group = group / kHalves;
    const int group_rows = min(kGroupRows, rows - out_group * kGroupRows);
    const uint32_t row_bytes = static_cast<uint32_t>(min(kStageK, p.k - k0)) * 2u;
    const int slot = i % stages;
    const uint32_t bar = SharedAddress(full + slot);
    if (lane == 0) MbarrierArriveExpectTx(bar, row_bytes * group_rows * (p.row_halves ? 2 : 1));
    __syncwarp();
    if (p.row_halves) {
      // Lane r < 8 copies the first half of row r's stage, lane r + 8 the second.
      const int r = lane % 8;
      if (lane < 16 && r < group_rows) {
        const __nv_bfloat16* src =
            p.w + (row_begin + r) * static_cast<int64_t>(p.k) + k0 + (lane / 8) * kStageK;
        const uint32_t dst = SharedAddress(ring + slot * kStageBytes +
                                           lane * kStageRowElems * sizeof(__nv_bfloat16));
        BulkCopyToShared(dst, src, row_bytes, bar);
      }
    } else if (lane < group_rows) {
      // The up half of a SiLU·mul output's pair of groups lies F rows further on.
      const int64_t w_row =
          row_begin + out_group * kGroupRows + lane + (group % kHalves) * int64_t{p.out_rows};
      const __nv_bfloat16* src = p.w + w_row * static_cast<int64_t>(p.k) + k0;
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
  WaitForPrerequisites();

  // Stage x (m rows of k).
  if constexpr (kStaging == Staging::kNorm) {
    // The scratch is free until the first group's end.
    internal::NormStaging norm;
    norm.x = p.x;
    norm.x_stride = p.x_stride;
    norm.m = p.m;
    norm.k = p.k;
    norm.residual_in = p.residual_in;
    norm.residual_out = p.residual_out;
    norm.norm_weight = p.norm_weight;
    norm.eps = p.eps;
    internal::StageNormedX(norm, xs, norm_weight_first, scratch,
                           scratch + kPrefetchGemmMaxRows * 32, [] { __syncthreads(); });
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
              internal::SiluMul(first[u], second[u]);
        }
      }
    }
    __syncthreads();
  }

  const int x_row_elems = XRowElems(p.k);
  // MMA column g is x row g (g < m), or with row halves x row g − m's second half (m ≤ g < 2m).
  const __nv_bfloat16* x_row =
      p.row_halves && g >= p.m ? xs + (g - p.m) * x_row_elems + kStageK : xs + g * x_row_elems;
  const int x_cols = p.row_halves ? 2 * p.m : p.m;
  OutT* y = static_cast<OutT*>(p.y);
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  float gate = 0.f;  // SiLU·mul output: this thread's gate sum, between a pair's two group ends
  for (int i = 0; i < total; ++i) {
    const int slot = i % stages;
    const int group = i / k_stages;
    const int k_stage = i - group * k_stages;
    const int k0 = k_stage * stage_k;
    const int out_group = group / kHalves;
    const int group_rows = min(kGroupRows, rows - out_group * kGroupRows);
    const int vectors = min(kStageK, p.k - k0) / 8;  // 8-k vectors of each row in this stage
    MbarrierWait(SharedAddress(full + slot), static_cast<uint32_t>((i / stages) & 1));

    const __nv_bfloat16* ws =
        reinterpret_cast<const __nv_bfloat16*>(ring + slot * kStageBytes);
    // With row halves, stage row r + 8 is row r's second half wherever row r is there.
    internal::MmaStage(acc, ws, x_row, k0, vectors, group_rows, x_cols,
                       p.row_halves ? group_rows : group_rows - 8);
    const bool group_end = k_stage == k_stages - 1;
    if (group_end) internal::StashGroup(acc, scratch);
    __syncthreads();  // the slot is read by every warp; the scratch is complete
    if (warp == 0 && i + stages < total) issue(i + stages);
    if (group_end) {
      if (threadIdx.x < kGroupRows * p.m) {
        const int r = threadIdx.x % kGroupRows;
        const int col = threadIdx.x / kGroupRows;
        if (r < group_rows) {
          const float sum =
              p.row_halves ? internal::GroupSum(scratch, r, col) +
                             internal::GroupSum(scratch, r + 8, col + p.m)
                       : internal::GroupSum(scratch, r, col);
          OutT* out = y + static_cast<int64_t>(col) * p.out_rows + row_begin +
                      out_group * kGroupRows + r;
          if constexpr (!kSiluOut) {
            Store(out, sum);
          } else if (group % 2 == 0) {
            gate = sum;
          } else {
            // The bits of the plain GEMM (its bf16 gate and up) followed by the SiLU·mul kernel.
            *out = internal::SiluMul(__float2bfloat16_rn(gate), __float2bfloat16_rn(sum));
          }
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

template <Staging kStaging, typename OutT, bool kSiluOut = false>
cudaError_t SetAttributes() {
  return internal::AllowSharedMemory(PrefetchGemmKernel<kStaging, OutT, kSiluOut>,
                                     kPrefetchGemmMaxSharedBytes);
}

cudaError_t Prepare() {
  static const cudaError_t prepared = [] {
    if (!DeviceHasBulkCopy()) return cudaSuccess;
    for (cudaError_t e : {SetAttributes<Staging::kCopy, __nv_bfloat16>(),
                          SetAttributes<Staging::kSiluMul, __nv_bfloat16>(),
                          SetAttributes<Staging::kNorm, __nv_bfloat16>(),
                          SetAttributes<Staging::kCopy, float>(),
                          SetAttributes<Staging::kSiluMul, float>(),
                          SetAttributes<Staging::kNorm, float>(),
                          SetAttributes<Staging::kCopy, __nv_bfloat16, true>()}) {
      if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
  }();
  return prepared;
}

template <typename OutT>
cudaError_t Launch(Staging staging, bool silu_out, const Params& p, int ctas, size_t shared,
                   cudaStream_t stream) {
  auto kernel = staging == Staging::kNorm      ? PrefetchGemmKernel<Staging::kNorm, OutT>
                : staging == Staging::kSiluMul ? PrefetchGemmKernel<Staging::kSiluMul, OutT>
                : silu_out ? PrefetchGemmKernel<Staging::kCopy, __nv_bfloat16, true>  // bf16 y
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
  return "c" + std::to_string(ctas) + "s" + std::to_string(stages) + (row_halves ? "h" : "");
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
  if (a.silu_mul_output && (a.input != PrefetchGemmInput::kPlain || a.float_output ||
                            a.n % 2 != 0 || c.ctas > a.n / 2)) {
    return false;
  }
  if (c.row_halves &&
      (IsNorm(a.input) || !PrefetchGemmTakesRowHalves(a.m, a.n, a.k, c.ctas, a.silu_mul_output))) {
    return false;
  }
  if (!IsNorm(a.input)) return true;
  const bool add = a.input == PrefetchGemmInput::kAddRmsNorm;
  // As the norm kernel: a negative or NaN eps would give NaN for rows of small values.
  if (a.norm_weight == nullptr || !internal::Aligned16(a.norm_weight) || !(a.eps >= 0.0f)) {
    return false;
  }
  if (add && (a.residual_in == nullptr || a.residual_out == nullptr ||
              !internal::Aligned16(a.residual_in))) {
    return false;
  }
  if (a.residual_out == nullptr) return true;
  const int64_t count = int64_t{a.m} * a.k;
  return internal::Aligned16(a.residual_out) && !Overlap(a.residual_out, a.x, count) &&
         !(add && Overlap(a.residual_out, a.residual_in, count));
}

bool PrefetchGemmTakesRowHalves(int m, int n, int k, int ctas, bool silu_mul_output) {
  return !silu_mul_output && m >= 1 && 2 * m <= internal::kMaxXRows && ctas >= 1 &&
         k % (2 * kStageK) == 0 && (int64_t{n} + ctas - 1) / ctas <= kGroupRows / 2;
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
  p.out_rows = a.silu_mul_output ? a.n / 2 : a.n;
  p.stages = c.stages;
  p.row_halves = c.row_halves;
  p.x_bytes = static_cast<int>(XBytes(a.m, a.k));
  p.residual_in = a.input == PrefetchGemmInput::kAddRmsNorm ? a.residual_in : nullptr;
  p.residual_out = IsNorm(a.input) ? a.residual_out : nullptr;
  p.norm_weight = a.norm_weight;
  p.eps = a.eps;
  const size_t shared = PrefetchGemmSharedBytes(a.m, a.k, c.stages);
  const Staging staging = IsNorm(a.input)                       ? Staging::kNorm
                          : a.input == PrefetchGemmInput::kSiluMul ? Staging::kSiluMul
                                                                 : Staging::kCopy;
  return a.float_output
             ? Launch<float>(staging, a.silu_mul_output, p, c.ctas, shared, stream)
             : Launch<__nv_bfloat16>(staging, a.silu_mul_output, p, c.ctas, shared, stream);
}

}  // namespace kiln
