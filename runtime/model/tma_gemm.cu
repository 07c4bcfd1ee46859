// The TMA GEMM (see tma_gemm.h).
//
// Work split. CTA b = tile · splits + slice owns rows [64 · tile, 64 · tile + 64) of W and the
// 64-k pieces [slice · P / splits, (slice + 1) · P / splits) of k (P = ceil(k / 64)). Stage i of
// the CTA is its piece i: W rows × 64 k (8 KiB) and x rows × 64 k (the padded rows R = 16, 32 or
// 64: R · 128 bytes), each one 2-D tensor copy whose box the tensor memory accelerator writes in
// the 128-byte swizzled layout wgmma reads (8-row groups 1024 bytes apart, the 16-byte chunks of
// row r at chunk ^ (r % 8)). W rows past n, x rows past m and k past the end arrive as zeros.
//
// Pipeline. A producer warp and a consumer warpgroup share a ring of S slots. Stage i goes to
// slot i % S and completes on the slot's full mbarrier (phase i / S) once both its copies have
// landed: the producer arms the barrier with both byte counts when it issues the W copy. The
// first S stages' W copies are issued before griddepcontrol.wait, their x copies right after it.
// For each stage the warpgroup issues four wgmma.m64nRk16 (k 16 apart: the descriptors' start
// address 32 bytes apart inside the swizzled rows) as one group and keeps it in flight while it
// waits for the group before, whose slot each consumer warp then releases on the slot's empty
// mbarrier; the producer refills a slot with stage i + S once all four warps have released it
// (with one slot, a stage's group is waited for before its slot is released).
//
// Slices. The splits CTAs of a tile are one cluster, rank = slice. Each puts its partial tile
// into its own shared memory, the cluster synchronises, and each rank adds up 1/splits of the
// tile's elements over the ranks in rank order (distributed shared memory) and writes them to y;
// a second cluster barrier keeps every rank's shared memory alive until the others have read it.
//
// SiLU·mul (TmaGemmArgs::silu_mul). Tile t owns the 32 columns [32 t, 32 t + 32) of y: each
// stage's W piece is two 32-row copies, gate rows 32 t… into the slot's rows 0–31 and up rows
// n / 2 + 32 t… into rows 32–63 (both 1024-byte aligned, so the swizzle is that of one 64-row
// copy). The grid is the same, since ceil(n / 64) = ceil((n / 2) / 32). Every rank puts its
// partial into shared memory as with several slices; thread u < 64 then holds a gate element
// and thread u + 64 its up partner, so a rank adds up its share of the gate elements and their
// partners and writes SiLU(g)·u of both rounded to bf16, as the SiLU·mul kernel would.
//
// Accumulators (wgmma's m64nR float layout): thread (warp w, lane = 4g + t) holds, for each 8-row
// block j of x, d[4j + q] = row 16w + g + 8 · (q / 2) of the W tile times x row 8j + 2t + q % 2.
#include "runtime/cuda/compute_capability.h"
#include "runtime/model/tma_gemm.h"

#include <cooperative_groups.h>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "runtime/cuda/device_helpers.cuh"
#include "runtime/model/internal/pdl_launch.cuh"
#include "runtime/model/internal/prefetch_stage.cuh"
#include "runtime/model/internal/vec.cuh"

namespace kiln {
namespace {

namespace cg = cooperative_groups;

using internal::MbarrierArriveExpectTx;
using internal::MbarrierInit;
using internal::MbarrierWait;
using internal::SharedAddress;

// One consumer warpgroup (wgmma) and one producer warp (the tensor copies).
constexpr int kConsumerWarps = 4;
constexpr int kConsumerThreads = kConsumerWarps * 32;
constexpr int kThreads = kConsumerThreads + 32;
constexpr uint32_t kWStageBytes = kTmaGemmTileRows * kTmaGemmStageK * 2;  // 8 KiB
constexpr uint32_t kXRowBytes = kTmaGemmStageK * 2;  // one swizzled row: 128 bytes
// Columns of y per tile with silu_mul: 32 gate rows and their 32 up rows of W.
constexpr int kSiluColumns = kTmaGemmTileRows / 2;
// Dynamic shared memory is aligned to 16 bytes; the swizzled slots need 1024.
constexpr size_t kAlignSlack = 1024;

struct Params {
  __nv_bfloat16* y;  // [m, n], or [m, n / 2] with silu_mul
  int m, n;
  bool silu_mul;  // TmaGemmArgs::silu_mul
  int pieces;  // 64-k pieces of k
  int splits;
  int stages;
  bool next_after_wait;  // TmaGemmArgs::next_after_wait
};

// wgmma's shared-memory matrix descriptor of a K-major operand tile in the 128-byte swizzled
// layout: start address (bits 0–13, in 16-byte units), leading offset (unused by this layout,
// 1), stride between 8-row groups 1024 bytes (bits 32–45), swizzle mode 128 bytes (bits 62–63).
__device__ __forceinline__ uint64_t SwizzledDescriptor(uint32_t address) {
  return static_cast<uint64_t>((address & 0x3FFFF) >> 4) | (uint64_t{1} << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

// Copies the box at (c0 = k, c1 = row) of `map` into shared memory at `dst`, counted on `bar`.
__device__ __forceinline__ void TensorCopy(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                           uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void WgmmaWaitAll() {
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
}
__device__ __forceinline__ void WgmmaWaitAllButOne() {
  asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
}

// Marks the accumulators as written here, so that the compiler reads them only after the wait
// above (the asynchronous wgmma writes them until then).
template <int kCount>
__device__ __forceinline__ void FenceAccumulators(float (&d)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d += A · B for one k16 step: A the 64 × 16 W piece, B the 16 × R x piece (descriptors).
template <int kRows>
struct Wgmma;

template <>
struct Wgmma<16> {
  static __device__ __forceinline__ void Run(float (&d)[8], uint64_t a, uint64_t b) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %10, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7"
        "}, %8, %9, p, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
          "+f"(d[6]), "+f"(d[7])
        : "l"(a), "l"(b), "r"(1));
  }
};

template <>
struct Wgmma<32> {
  static __device__ __forceinline__ void Run(float (&d)[16], uint64_t a, uint64_t b) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
        "}, %16, %17, p, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
          "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
          "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(a), "l"(b), "r"(1));
  }
};

template <>
struct Wgmma<64> {
  static __device__ __forceinline__ void Run(float (&d)[32], uint64_t a, uint64_t b) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, %32, %33, p, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
          "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
          "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
          "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
          "+f"(d[30]), "+f"(d[31])
        : "l"(a), "l"(b), "r"(1));
  }
};

// The consumer warpgroup's main loop: returns in `acc` this CTA's partial tile. Everything in
// it reads what earlier kernels wrote or writes what they read.
template <int kRows>
__device__ __forceinline__ void Consume(const Params& p, uint64_t* full, uint64_t* empty,
                                        uint32_t w_slots, uint32_t x_slots, int count,
                                        float (&acc)[kRows / 2]) {
  constexpr uint32_t kXStageBytes = kRows * kXRowBytes;
  constexpr int kAcc = kRows / 2;
  // Independent accumulator sets: k step `step` of every stage adds into set step % kSets, so
  // the four wgmmas of a stage need not wait for one another (0.1–0.7 µs faster per GEMM than
  // one set, runtime/model/NOTES.md). 64 rows keep two sets within the register budget.
  constexpr int kSets = kRows == 64 ? 2 : 4;
  const int lane = threadIdx.x % 32;
  const int stages = p.stages;
  WaitForPrerequisites();
  float sets[kSets][kAcc];
#pragma unroll
  for (int u = 0; u < kSets; ++u) {
#pragma unroll
    for (int j = 0; j < kAcc; ++j) sets[u][j] = 0.f;
  }
  for (int i = 0; i < count; ++i) {
    const int slot = i % stages;
    MbarrierWait(SharedAddress(full + slot), static_cast<uint32_t>((i / stages) & 1));
    const uint64_t a = SwizzledDescriptor(w_slots + slot * kWStageBytes);
    const uint64_t b = SwizzledDescriptor(x_slots + slot * kXStageBytes);
    WgmmaFence();
#pragma unroll
    for (int step = 0; step < kTmaGemmStageK / 16; ++step) {
      // 16 k = 32 bytes further along the swizzled rows: 2 in the descriptor's 16-byte units.
      Wgmma<kRows>::Run(sets[step % kSets], a + 2 * step, b + 2 * step);
    }
    WgmmaCommit();
    // Stage i's products stay in flight; stage i - 1's are done, so its slot is free. With one
    // slot, stage i + 1 needs this one's slot: wait for its products too.
    int released = i - 1;
    if (stages == 1) {
      WgmmaWaitAll();
      released = i;
    } else {
      WgmmaWaitAllButOne();
    }
    if (released >= 0) {
      __syncwarp();
      if (lane == 0) internal::MbarrierArrive(SharedAddress(empty + released % stages));
    }
  }
  WgmmaWaitAll();
#pragma unroll
  for (int u = 0; u < kSets; ++u) FenceAccumulators(sets[u]);
#pragma unroll
  for (int j = 0; j < kAcc; ++j) {
    acc[j] = sets[0][j];
#pragma unroll
    for (int u = 1; u < kSets; ++u) acc[j] += sets[u][j];
  }
}

// Accumulator j of consumer thread u holds W tile row AccTileRow(u, j) times x row AccXRow(u, j).
__device__ __forceinline__ int AccTileRow(int u, int j) {
  return 16 * (u / 32) + (u % 32) / 4 + 8 * ((j >> 1) & 1);
}
__device__ __forceinline__ int AccXRow(int u, int j) {
  return 8 * (j >> 2) + 2 * (u % 4) + (j & 1);
}

// Writes a consumer thread's accumulators into `partial` in the accumulators' order: element
// e = j · 128 + u.
template <int kAcc>
__device__ __forceinline__ void StashPartial(float* partial, const float (&acc)[kAcc]) {
#pragma unroll
  for (int j = 0; j < kAcc; ++j) partial[j * kConsumerThreads + threadIdx.x] = acc[j];
}

// Returns element e of the tile's partials summed over the cluster's `splits` ranks in rank
// order, every rank's load in flight at once (distributed shared memory).
__device__ __forceinline__ float ClusterSum(cg::cluster_group& cluster, float* partial, int e,
                                            int splits) {
  float part[kTmaGemmMaxSplits];
#pragma unroll
  for (int s = 0; s < kTmaGemmMaxSplits; ++s) {
    if (s < splits) part[s] = *cluster.map_shared_rank(partial + e, s);
  }
  float sum = 0.f;
#pragma unroll
  for (int s = 0; s < kTmaGemmMaxSplits; ++s) {
    if (s < splits) sum += part[s];
  }
  return sum;
}

// Writes y of this CTA's tile: the consumers' `acc` at once with one slice; with several, the
// tile's CTAs (one cluster, rank = slice) each put their partial into their own shared memory
// (`scratch`, the ring's first bytes, free now), and each adds up 1/splits of the tile's
// elements over the cluster's ranks in rank order (distributed shared memory) and writes them.
// Every thread of the CTA calls it.
template <int kRows>
__device__ __forceinline__ void Finish(const Params& p, unsigned char* scratch, int row0,
                                       int slice, const float (&acc)[kRows / 2]) {
  constexpr int kAcc = kRows / 2;
  auto store = [&](int u, int j, float value) {
    const int r = row0 + AccTileRow(u, j);
    const int col = AccXRow(u, j);
    if (r < p.n && col < p.m) {
      p.y[static_cast<int64_t>(col) * p.n + r] = __float2bfloat16_rn(value);
    }
  };
  const bool consumer = threadIdx.x < kConsumerThreads;
  if (p.splits == 1) {
    if (consumer) {
#pragma unroll
      for (int j = 0; j < kAcc; ++j) store(threadIdx.x, j, acc[j]);
    }
    return;
  }
  float* partial = reinterpret_cast<float*>(scratch);
  if (consumer) StashPartial(partial, acc);
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every rank's partial is written
  constexpr int kElements = kConsumerThreads * kAcc;
  const int end = (slice + 1) * kElements / p.splits;
  for (int e = slice * kElements / p.splits + threadIdx.x; e < end; e += kThreads) {
    store(e % kConsumerThreads, e / kConsumerThreads, ClusterSum(cluster, partial, e, p.splits));
  }
  cluster.sync();  // no rank exits, freeing its shared memory, while another still reads it
}

// Writes y = SiLU(gate)·up of this CTA's tile (silu_mul; see the file comment): tile rows 0–31
// are the gate rows of y's columns [col0, col0 + 32), rows 32–63 their up rows. The partial
// tiles go into shared memory (`scratch`, the ring's first bytes) in the accumulators' order as
// in Finish, and each rank adds up its share of the gate elements and their up partners over
// the cluster's ranks in rank order (the same sums as Finish: a lone slice's partial as it is).
// Every thread of the CTA calls it.
template <int kRows>
__device__ __forceinline__ void FinishSiluMul(const Params& p, unsigned char* scratch, int col0,
                                              int slice, const float (&acc)[kRows / 2]) {
  constexpr int kAcc = kRows / 2;
  constexpr int kHalf = kConsumerThreads / 2;  // warps 0–1: gate rows; warps 2–3: up rows
  float* partial = reinterpret_cast<float*>(scratch);
  cg::cluster_group cluster = cg::this_cluster();
  const bool alone = p.splits == 1;
  // Every consumer warp's products are done (their wgmmas read the ring) before it is written.
  __syncthreads();
  if (threadIdx.x < kConsumerThreads) StashPartial(partial, acc);
  if (alone) {
    __syncthreads();
  } else {
    cluster.sync();  // every rank's partial is written
  }
  auto sum = [&](int e) { return alone ? partial[e] : ClusterSum(cluster, partial, e, p.splits); };
  const int half_n = p.n / 2;
  constexpr int kGates = kHalf * kAcc;
  const int end = (slice + 1) * kGates / p.splits;
  for (int q = slice * kGates / p.splits + threadIdx.x; q < end; q += kThreads) {
    const int j = q / kHalf;
    const int u = q % kHalf;
    const int e = j * kConsumerThreads + u;
    const __nv_bfloat16 gate = __float2bfloat16_rn(sum(e));
    const __nv_bfloat16 up = __float2bfloat16_rn(sum(e + kHalf));
    const int c = col0 + AccTileRow(u, j);
    const int row = AccXRow(u, j);
    if (c < half_n && row < p.m) {
      p.y[static_cast<int64_t>(row) * half_n + c] = internal::SiluMul(gate, up);
    }
  }
  if (!alone) cluster.sync();  // no rank exits while another still reads its shared memory
}

template <int kRows>
__global__ void __launch_bounds__(kThreads, 3)
    TmaGemmKernel(const __grid_constant__ CUtensorMap w_map,
                  const __grid_constant__ CUtensorMap x_map, const Params p) {
  constexpr uint32_t kXStageBytes = kRows * kXRowBytes;
  constexpr int kAcc = kRows / 2;
  extern __shared__ unsigned char shared_raw[];
  __shared__ __align__(8) uint64_t full[kTmaGemmMaxStages];   // the stage's copies landed
  __shared__ __align__(8) uint64_t empty[kTmaGemmMaxStages];  // the 4 consumer warps read it
  const uint32_t base = (SharedAddress(shared_raw) + 1023u) & ~1023u;
  const uint32_t w_slots = base;
  const uint32_t x_slots = base + p.stages * kWStageBytes;

  // The next kernel may become resident now and start its own independent prologue, unless it
  // is to wait for this one's wait (below).
  if (!p.next_after_wait) AllowDependentLaunch();

  const int tile = blockIdx.x / p.splits;
  const int slice = blockIdx.x - tile * p.splits;
  const int piece_begin = slice * p.pieces / p.splits;
  const int count = (slice + 1) * p.pieces / p.splits - piece_begin;
  const int row0 = tile * kTmaGemmTileRows;
  const int stages = p.stages;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;

  if (threadIdx.x == kConsumerThreads) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&w_map))
                 : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&x_map))
                 : "memory");
    for (int s = 0; s < stages; ++s) {
      MbarrierInit(SharedAddress(full + s), 1);
      MbarrierInit(SharedAddress(empty + s), kConsumerWarps);
    }
    internal::FenceBarrierInit();
  }
  __syncthreads();

  float acc[kAcc] = {};  // this CTA's partial tile (consumer threads)
  if (warp == kConsumerWarps) {
    // The producer warp. Its lane 0 arms stage i's slot for both copies and issues the W copy
    // (W is written by no kernel, so this is legal before the wait); the x copy follows once x
    // may be read. A slot is refilled once the consumers have released it.
    auto issue_w = [&](int i) {
      const int slot = i % stages;
      const uint32_t bar = SharedAddress(full + slot);
      const uint32_t dst = w_slots + slot * kWStageBytes;
      const int k0 = (piece_begin + i) * kTmaGemmStageK;
      MbarrierArriveExpectTx(bar, kWStageBytes + kXStageBytes);
      if (p.silu_mul) {
        TensorCopy(dst, &w_map, k0, tile * kSiluColumns, bar);
        TensorCopy(dst + kWStageBytes / 2, &w_map, k0, p.n / 2 + tile * kSiluColumns, bar);
      } else {
        TensorCopy(dst, &w_map, k0, row0, bar);
      }
    };
    auto issue_x = [&](int i) {
      const int slot = i % stages;
      TensorCopy(x_slots + slot * kXStageBytes, &x_map, (piece_begin + i) * kTmaGemmStageK, 0,
                 SharedAddress(full + slot));
    };
    const int first = min(stages, count);
    if (lane == 0) {
      for (int i = 0; i < first; ++i) issue_w(i);
    }
    // Every thread waits (pdl_launch.cuh).
    WaitForPrerequisites();
    if (p.next_after_wait) AllowDependentLaunch();
    if (lane == 0) {
      for (int i = 0; i < first; ++i) issue_x(i);
      for (int i = first; i < count; ++i) {
        MbarrierWait(SharedAddress(empty + i % stages),
                     static_cast<uint32_t>((i / stages - 1) & 1));
        issue_w(i);
        issue_x(i);
      }
    }
    __syncwarp();
  } else {
    Consume<kRows>(p, full, empty, w_slots, x_slots, count, acc);
  }
  unsigned char* scratch = shared_raw + (base - SharedAddress(shared_raw));
  if (p.silu_mul) {
    FinishSiluMul<kRows>(p, scratch, tile * kSiluColumns, slice, acc);
  } else {
    Finish<kRows>(p, scratch, row0, slice, acc);
  }
}

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                   const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                   const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiledFn encode_tiled = nullptr;

// Encodes the 2-D map of a row-major bf16 matrix [rows, inner] whose rows are `row_bytes`
// apart, with boxes of `box_rows` rows × 64 elements in the 128-byte swizzled layout; reads
// past the matrix fill zeros.
bool EncodeMap(CUtensorMap* map, const __nv_bfloat16* base, int inner, int rows,
               uint64_t row_bytes, int box_rows) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(inner), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {row_bytes};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(kTmaGemmStageK),
                             static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  return encode_tiled(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2,
                      const_cast<__nv_bfloat16*>(base), dims, strides, box, element_strides,
                      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                      CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

cudaError_t Prepare() {
  static const cudaError_t prepared = [] {
    if (!CurrentDeviceIsSm90OrLater()) return cudaSuccess;
    void* symbol = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &symbol, 12000,
                                                     cudaEnableDefault, &found);
    if (e != cudaSuccess) return e;
    if (found != cudaDriverEntryPointSuccess || symbol == nullptr) {
      return cudaErrorSymbolNotFound;
    }
    encode_tiled = reinterpret_cast<EncodeTiledFn>(symbol);
    const size_t most = kTmaGemmMaxSharedBytes;
    for (cudaError_t set : {internal::AllowSharedMemory(TmaGemmKernel<16>, most),
                            internal::AllowSharedMemory(TmaGemmKernel<32>, most),
                            internal::AllowSharedMemory(TmaGemmKernel<64>, most)}) {
      if (set != cudaSuccess) return set;
    }
    return cudaSuccess;
  }();
  return prepared;
}

int Pieces(int k) { return (k + kTmaGemmStageK - 1) / kTmaGemmStageK; }
int Tiles(int n) { return (n + kTmaGemmTileRows - 1) / kTmaGemmTileRows; }

}  // namespace

std::string TmaGemmConfig::ToString() const {
  return "k" + std::to_string(splits) + "s" + std::to_string(stages);
}

int TmaGemmPaddedRows(int m) { return m <= 16 ? 16 : m <= 32 ? 32 : 64; }

size_t TmaGemmSharedBytes(int m, int stages) {
  const size_t stage = kWStageBytes + static_cast<size_t>(TmaGemmPaddedRows(m)) * kXRowBytes;
  return kAlignSlack + static_cast<size_t>(stages) * stage;
}

TmaGemmConfig ChooseTmaGemmConfig(int m, int n, int k, int sm_count, int ctas_per_sm,
                                  int max_splits) {
  TmaGemmConfig c;
  if (m < 1 || m > kTmaGemmMaxRows || n < 1 || k < 8 || k % 8 != 0 || ctas_per_sm < 1 ||
      max_splits < 1 || max_splits > kTmaGemmMaxSplits) {
    return c;
  }
  const int pieces = Pieces(k);
  const int64_t target = int64_t{std::max(sm_count, 1)} * ctas_per_sm;
  c.splits = static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>({target / Tiles(n), pieces, max_splits})));
  const int per_cta = (pieces + c.splits - 1) / c.splits;
  const size_t budget = ctas_per_sm < 2   ? kTmaGemmMaxSharedBytes
                        : c.splits > 1    ? kTmaGemmClusterBytes
                                          : kTmaGemmCoResidentBytes;
  const size_t stage = TmaGemmSharedBytes(m, 1) - kAlignSlack;
  const int fit = static_cast<int>((budget - kAlignSlack) / stage);
  c.stages = std::min({per_cta, fit, kTmaGemmMaxStages});
  return c;
}

bool TmaGemmSupportsShape(int m, int n, int k, const TmaGemmConfig& c) {
  if (m < 1 || m > kTmaGemmMaxRows || n < 1 || k < 8 || k % 8 != 0) return false;
  if (c.splits < 1 || c.splits > std::min(kTmaGemmMaxSplits, Pieces(k))) return false;
  if (c.stages < 1 || c.stages > kTmaGemmMaxStages) return false;
  return TmaGemmSharedBytes(m, c.stages) <= kTmaGemmMaxSharedBytes &&
         CurrentDeviceIsSm90OrLater();
}

bool TmaGemmSupports(const TmaGemmArgs& a, const TmaGemmConfig& c) {
  return TmaGemmSupportsShape(a.m, a.n, a.k, c) && (!a.silu_mul || a.n % 2 == 0) &&
         a.x != nullptr && a.w != nullptr && a.y != nullptr && internal::Aligned16(a.x) &&
         internal::Aligned16(a.w) && internal::Aligned16(a.y);
}

cudaError_t PrepareTmaGemm() { return Prepare(); }

cudaError_t LaunchTmaGemm(const TmaGemmArgs& a, const TmaGemmConfig& c, cudaStream_t stream) {
  if (!TmaGemmSupports(a, c)) return cudaErrorInvalidValue;
  const cudaError_t prepared = Prepare();
  if (prepared != cudaSuccess) return prepared;
  const int rows = TmaGemmPaddedRows(a.m);
  CUtensorMap w_map, x_map;
  const int w_box_rows = a.silu_mul ? kSiluColumns : kTmaGemmTileRows;
  if (!EncodeMap(&w_map, a.w, a.k, a.n, uint64_t{2} * a.k, w_box_rows) ||
      !EncodeMap(&x_map, a.x, a.k, a.m, uint64_t{2} * a.k, rows)) {
    return cudaErrorInvalidValue;
  }
  Params p;
  p.y = a.y;
  p.m = a.m;
  p.n = a.n;
  p.silu_mul = a.silu_mul;
  p.pieces = Pieces(a.k);
  p.splits = c.splits;
  p.stages = c.stages;
  p.next_after_wait = a.next_after_wait;
  const dim3 grid(static_cast<unsigned>(Tiles(a.n) * c.splits));
  const size_t shared = TmaGemmSharedBytes(a.m, c.stages);
  // A tile's slices form one cluster (rank = slice), which adds up their partials.
  const unsigned cluster = static_cast<unsigned>(c.splits);
  auto kernel = rows == 16   ? TmaGemmKernel<16>
                : rows == 32 ? TmaGemmKernel<32>
                             : TmaGemmKernel<64>;
  return internal::LaunchWithPdlInClusters(kernel, grid, dim3(kThreads), cluster, shared, stream,
                                           w_map, x_map, p);
}

}  // namespace kiln
