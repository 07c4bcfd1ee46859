// The decode layer kernel (see decode_layer.h).
//
// Threads: 8 compute warps (internal/prefetch_stage.cuh's stage consumers) and one producer warp.
// The launch's projections are a list of GEMM phases; in each, CTA c of G owns output rows
// [c·n/G, (c+1)·n/G), walked in groups of 16 rows, each group's k in stages of 1024. The gate-up
// phase, the largest, is instead cut into units of 8 gate rows and the same 8 up rows (one group:
// the CTA holds both halves of its SiLU·mul outputs), which the producers claim from a counter
// one at a time: a static split ends with its slowest SM (4 µs after the median one in a 15 µs
// phase on an H200), a claimed one within about a unit. The producer walks the same sequence of
// stages over all phases (writing each claimed unit's number beside its slot, and -1 in one
// empty slot at the phase's end) and issues stage i into ring slot i % S once the compute warps
// have released the slot's previous stage (an "empty" mbarrier per slot, one arrival per compute
// warp); the stage completes on the slot's "full" mbarrier. The producer needs no activation, so
// it starts before griddepcontrol.wait and runs ahead through the phase boundaries, up to
// DecodeLayerConfig::run_ahead stages of a phase before the grid barrier that precedes it (the
// barrier passes faster with less traffic in flight).
//
// A phase: stage x (a copy of m rows from global memory through L2, or the (add +) RMSNorm of
// internal/prefetch_stage.cuh), then for every stage wait, multiply, release; at each group's end
// the warps' sums meet in shared memory and 16 × m threads write y (bf16), or 8 × m threads
// SiLU(gate)·up of a gate-up unit. Then the grid barrier. The next phase's norm weights are
// loaded before it (they are static), so the staging after it is one L2 round trip.
//
// Grid barrier: a 64-bit arrival counter (DecodeLayerArgs::grid_sync) that only grows. Every
// launch's CTAs pass the same number of barriers, so between launches the counter is a multiple
// of the grid size G, and before the first barrier of a launch it lies in [base, base + G), where
// thread 0 reads it (its own CTA has not arrived): base is the read rounded down to a multiple
// of G. At each barrier thread 0 adds one (a release reduction: no round trip to wait for) and
// polls with acquire loads until the counter reaches base + G · (barriers passed). One trip to L2
// for the last CTA to arrive, one poll for the others.
#include "runtime/model/decode_layer.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "runtime/cuda/compute_capability.h"
#include "runtime/model/internal/pdl_launch.cuh"
#include "runtime/model/internal/prefetch_stage.cuh"
#include "runtime/model/internal/rope_kv_append.cuh"
#include "runtime/model/internal/vec.cuh"

namespace kiln {
namespace {

using internal::kGroupRows;
using internal::kStageBytes;
using internal::kStageK;
using internal::kStageRowElems;
using internal::kStageThreads;
using internal::XBytes;
using internal::XRowElems;

constexpr int kComputeWarps = internal::kStageWarps;
constexpr int kThreads = kStageThreads + 32;  // + the producer warp
constexpr int kMaxPhases = 4;
constexpr int kMaxWidth = 8192;  // hidden, q_width and ffn (the norm staging's limit)

// Shared memory: barriers, the group scratch, the RoPE tables, x, then the ring.
// full and empty mbarriers per slot, the claimed unit of each slot (int32), the count of grid
// barriers passed (int32, padded).
constexpr size_t kBarrierBytes = 2 * kDecodeLayerMaxStages * 8 + kDecodeLayerMaxStages * 4 + 16;
constexpr size_t kRopeBytes = 2 * internal::kRopeMaxHalf * sizeof(float) + 16;
constexpr size_t kFixedBytes = kBarrierBytes + internal::kScratchBytes + kRopeBytes;
// A claimed unit of the gate-up phase: kUnitPairs gate rows and the same up rows, one stage group.
constexpr int kUnitPairs = kGroupRows / 2;
// Room left beside the kernel on an SM for one decode-attention CTA (head_dim 128 takes ~35 KB
// of static shared memory) and the per-CTA reservations.
constexpr size_t kPreferredSharedBytes = 188 * 1024;
constexpr size_t kMaxSharedBytes = 227 * 1024;
constexpr int kDefaultRunAhead = 2;

enum class Staging : int { kCopy, kNorm };

struct Phase {
  const __nv_bfloat16* w;  // [parts · n, k]
  int n, k;
  // 1: CTA c owns rows [c·n/G, (c+1)·n/G). 2: gate rows [0, n) and up rows [n, 2n), y =
  // SiLU(gate)·up, in units of kUnitPairs pairs that the CTAs claim from Params::counter.
  int parts;
  Staging staging;
  internal::NormStaging x;  // kCopy uses x, x_stride, m and k only
  __nv_bfloat16* y;        // [m, n]
};

struct Params {
  int m;
  int num_phases;
  Phase phases[kMaxPhases];
  int stages;
  int x_bytes;
  // After the phases: RoPE + KV append (rope.qkv set) or the final norm (final.norm_weight set,
  // written to normed by CTA 0).
  internal::RopeKvArgs rope;
  internal::NormStaging final;
  __nv_bfloat16* normed;
  uint32_t* grid_sync;
  uint32_t* counter;  // the claimed units of this launch's gate-up phase (zero at its start)
  uint32_t* clear;    // the previous launch's counter, cleared after the wait
  int run_ahead;      // DecodeLayerConfig::run_ahead
  uint64_t* trace;
};

// Records stamp `slot` of this CTA where tracing is on (thread 0 only).
__device__ __forceinline__ void Stamp(const Params& p, int slot) {
  if (p.trace != nullptr && threadIdx.x == 0) {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    p.trace[blockIdx.x * kDecodeLayerTraceSlots + slot] = t;
  }
}

__device__ __forceinline__ void ComputeSync() {
  asm volatile("bar.sync 1, %0;" ::"n"(kStageThreads) : "memory");
}

__device__ __forceinline__ uint64_t LoadRelaxed(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ uint64_t LoadAcquire(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void AddRelease(uint64_t* p, uint64_t v) {
  asm volatile("red.release.gpu.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// The compute threads of every CTA meet here (see the file comment). `target` is thread 0's
// count of the arrivals that complete the previous barrier.
__device__ __forceinline__ void GridBarrier(uint64_t* counter, uint64_t& target) {
  ComputeSync();
  if (threadIdx.x == 0) {
    target += gridDim.x;
    // Release: this CTA's writes (ordered before by the CTA barrier) reach the others first.
    AddRelease(counter, 1);
    // Acquire: the others' writes before their arrivals are visible to this CTA after the CTA
    // barrier below. (An acquire load per poll: 0.2–0.3 µs per barrier less than relaxed polls
    // and a fence after them on an H200, runtime/model/NOTES.md.)
    while (LoadAcquire(counter) < target) {
    }
  }
  ComputeSync();
}

// This CTA's rows of a phase: [begin, begin + rows).
struct RowRange {
  int64_t begin;
  int rows;
};

__device__ __forceinline__ RowRange RowsOf(const Phase& ph) {
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * ph.n / gridDim.x;
  const int64_t end = static_cast<int64_t>(blockIdx.x + 1) * ph.n / gridDim.x;
  return {begin, static_cast<int>(end - begin)};
}

__device__ __forceinline__ int KStages(const Phase& ph) { return (ph.k + kStageK - 1) / kStageK; }

// The producer warp's ring position.
struct Ring {
  uint64_t* full;
  uint64_t* empty;
  int32_t* unit;  // [stages]: the claimed unit a slot holds, -1: the phase's end
  unsigned char* slots;
  int stages;
  const volatile int* passed;  // grid barriers the compute warps have passed
  int i = 0;  // stage counter over the whole launch

  // Waits until slot i % stages is free; returns it.
  __device__ __forceinline__ int Acquire() {
    const int slot = i % stages;
    if (i >= stages) {
      internal::MbarrierWait(internal::SharedAddress(empty + slot),
                             static_cast<uint32_t>((i / stages - 1) & 1));
    }
    return slot;
  }

  // Issues W rows row(0..rows-1) at k [k0, k0 + 1024) into the next slot (the producer warp).
  template <typename RowOf>
  __device__ __forceinline__ void Issue(const Phase& ph, int k0, int rows, RowOf row_of,
                                        int32_t unit_id) {
    const int lane = threadIdx.x % 32;
    const int slot = Acquire();
    const uint32_t row_bytes = static_cast<uint32_t>(min(kStageK, ph.k - k0)) * 2u;
    const uint32_t bar = internal::SharedAddress(full + slot);
    if (lane == 0) {
      unit[slot] = unit_id;
      internal::MbarrierArriveExpectTx(bar, row_bytes * rows);
    }
    __syncwarp();
    if (lane < rows) {
      const __nv_bfloat16* src = ph.w + row_of(lane) * static_cast<int64_t>(ph.k) + k0;
      const uint32_t dst = internal::SharedAddress(slots + slot * kStageBytes +
                                                   lane * kStageRowElems * sizeof(__nv_bfloat16));
      internal::BulkCopyToShared(dst, src, row_bytes, bar);
    }
    ++i;
  }

  // Marks the end of a claimed phase in the next slot (no data).
  __device__ __forceinline__ void IssueEnd() {
    const int slot = Acquire();
    if (threadIdx.x % 32 == 0) {
      unit[slot] = -1;
      internal::MbarrierArrive(internal::SharedAddress(full + slot));
    }
    __syncwarp();
    ++i;
  }
};

// The producer warp: every stage of every phase, in the compute warps' order.
__device__ void Produce(const Params& p, Ring ring) {
  const int lane = threadIdx.x % 32;
  for (int f = 0; f < p.num_phases; ++f) {
    const Phase& ph = p.phases[f];
    const int k_stages = KStages(ph);
    // Past run_ahead stages of phase f, wait until the barrier after phase f − 1 has passed.
    const int phase_start = ring.i;
    auto gate = [&] {
      if (f > 0 && ring.i - phase_start == p.run_ahead) {
        while (*ring.passed < f) __nanosleep(64);
      }
    };
    if (ph.parts == 1) {
      const RowRange range = RowsOf(ph);
      const int groups = (range.rows + kGroupRows - 1) / kGroupRows;
      for (int group = 0; group < groups; ++group) {
        const int group_rows = min(kGroupRows, range.rows - group * kGroupRows);
        const int64_t row0 = range.begin + group * kGroupRows;
        for (int ks = 0; ks < k_stages; ++ks) {
          gate();
          ring.Issue(ph, ks * kStageK, group_rows, [&](int r) { return row0 + r; }, 0);
        }
      }
      continue;
    }
    const int units = ph.n / kUnitPairs;
    for (;;) {
      uint32_t claimed = 0;
      if (lane == 0) claimed = atomicAdd(p.counter, 1u);
      const int u = static_cast<int>(__shfl_sync(0xffffffffu, claimed, 0));
      if (u >= units) break;
      // Slot rows 0..7: gate rows 8u.., rows 8..15: the same up rows.
      const int64_t gate0 = int64_t{u} * kUnitPairs;
      for (int ks = 0; ks < k_stages; ++ks) {
        gate();
        ring.Issue(
            ph, ks * kStageK, kGroupRows,
            [&](int r) { return r < kUnitPairs ? gate0 + r : ph.n + gate0 + r - kUnitPairs; }, u);
      }
    }
    gate();
    ring.IssueEnd();
  }
}

// Copies m rows of k from global memory (written by an earlier kernel or, before the last grid
// barrier, by any CTA) into xs, through L2.
__device__ __forceinline__ void StageCopiedX(const internal::NormStaging& x, __nv_bfloat16* xs) {
  const int vectors_per_row = x.k / 8;
  const int row_elems = XRowElems(x.k);
  const int vectors = x.m * vectors_per_row;
  // Up to eight 16-byte loads per thread in flight.
  constexpr int kBatch = 8;
  for (int base = threadIdx.x; base < vectors; base += kStageThreads * kBatch) {
    uint4 v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = base + u * kStageThreads;
      if (i < vectors) {
        const int r = i / vectors_per_row;
        v[u] = internal::LoadCoherent(x.x + r * x.x_stride + 8 * (i - r * vectors_per_row));
      }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = base + u * kStageThreads;
      if (i < vectors) {
        const int r = i / vectors_per_row;
        *reinterpret_cast<uint4*>(xs + r * row_elems + 8 * (i - r * vectors_per_row)) = v[u];
      }
    }
  }
  ComputeSync();
}

// This thread's first norm weight vector of a phase (loaded ahead: the weights are static).
__device__ __forceinline__ uint4 FirstNormWeight(const internal::NormStaging& x) {
  return x.norm_weight != nullptr && static_cast<int>(threadIdx.x) < x.k / 8
             ? *reinterpret_cast<const uint4*>(x.norm_weight + 8 * threadIdx.x)
             : make_uint4(0, 0, 0, 0);
}

// At most 128 registers per thread, so that a decode-attention CTA (128 threads × 168 registers)
// fits beside one CTA of this kernel.
__global__ void __maxnreg__(128) DecodeLayerKernel(const Params p) {
  extern __shared__ __align__(128) unsigned char shared[];
  uint64_t* full = reinterpret_cast<uint64_t*>(shared);  // [stages]
  uint64_t* empty = full + kDecodeLayerMaxStages;         // [stages]
  int32_t* unit = reinterpret_cast<int32_t*>(empty + kDecodeLayerMaxStages);  // [stages]
  float* scratch = reinterpret_cast<float*>(shared + kBarrierBytes);
  float* cos_table = reinterpret_cast<float*>(shared + kBarrierBytes + internal::kScratchBytes);
  float* sin_table = cos_table + internal::kRopeMaxHalf;
  int64_t* rope_slot = reinterpret_cast<int64_t*>(sin_table + internal::kRopeMaxHalf);
  __nv_bfloat16* xs = reinterpret_cast<__nv_bfloat16*>(shared + kFixedBytes);
  unsigned char* slots = shared + kFixedBytes + p.x_bytes;

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  // Grid barriers passed, for the producer's run-ahead limit.
  int& passed = *reinterpret_cast<int*>(unit + kDecodeLayerMaxStages);

  // The next kernel (attention) may become resident now; it waits for this one to complete.
  AllowDependentLaunch();
  Stamp(p, 0);

  if (threadIdx.x == 0) {
    for (int s = 0; s < p.stages; ++s) {
      internal::MbarrierInit(internal::SharedAddress(full + s), 1);
      internal::MbarrierInit(internal::SharedAddress(empty + s), kComputeWarps);
    }
    internal::FenceBarrierInit();
    passed = 0;
  }
  __syncthreads();

  if (warp == kComputeWarps) {
    // W is written by no kernel: no wait. The gate-up units are claimed from a counter this
    // launch's predecessor cleared before its CTAs left the SMs this one runs on.
    Ring ring{full, empty, unit, slots, p.stages, &passed};
    Produce(p, ring);
    return;
  }

  const bool rope = p.rope.qkv != nullptr && static_cast<int>(blockIdx.x) < p.m;
  if (rope) {
    // Positions, the plan and the block table come from the step's upload.
    internal::RopePrologue(p.rope, blockIdx.x, cos_table, sin_table, rope_slot, threadIdx.x,
                           kStageThreads);
  }
  uint4 weight_first = FirstNormWeight(p.phases[0].x);

  // Everything below reads what earlier kernels wrote (every CTA waits, see pdl_launch.cuh).
  WaitForPrerequisites();
  Stamp(p, 1);
  uint64_t* arrivals = reinterpret_cast<uint64_t*>(p.grid_sync);
  uint64_t target = 0;
  if (threadIdx.x == 0) {
    const uint64_t seen = LoadRelaxed(arrivals);
    target = seen - seen % gridDim.x;
    // The previous launch has completed: its claims are over.
    if (blockIdx.x == 0 && p.clear != nullptr) atomicExch(p.clear, 0u);
  }

  const int g = lane / 4;
  int i = 0;  // stage counter, as the producer's
  // Waits for the next stage; returns its slot.
  auto next_stage = [&]() {
    const int slot = i % p.stages;
    internal::MbarrierWait(internal::SharedAddress(full + slot),
                           static_cast<uint32_t>((i / p.stages) & 1));
    return slot;
  };
  // Releases the slot to the producer (each warp once its reads are done).
  auto release = [&](int slot) {
    __syncwarp();
    if (lane == 0) internal::MbarrierArrive(internal::SharedAddress(empty + slot));
    ++i;
  };
  for (int f = 0; f < p.num_phases; ++f) {
    const Phase& ph = p.phases[f];
    if (ph.staging == Staging::kNorm) {
      internal::StageNormedX(ph.x, xs, weight_first, scratch,
                             scratch + internal::kMaxXRows * 32, [] { ComputeSync(); });
    } else {
      StageCopiedX(ph.x, xs);
    }
    Stamp(p, 2 + 3 * f);
    const __nv_bfloat16* x_row = xs + g * XRowElems(ph.k);  // read only by lanes with g < m
    const int k_stages = KStages(ph);
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    // Multiplies the k stages of one group (the first one's slot already waited for).
    auto group = [&](int slot, int group_rows) {
      for (int ks = 0; ks < k_stages; ++ks) {
        if (ks > 0) slot = next_stage();
        const int k0 = ks * kStageK;
        internal::MmaStage(acc, reinterpret_cast<const __nv_bfloat16*>(slots + slot * kStageBytes),
                           x_row, k0, min(kStageK, ph.k - k0) / 8, group_rows, p.m);
        release(slot);
      }
      internal::StashGroup(acc, scratch);
      ComputeSync();  // the scratch is complete
    };
    if (ph.parts == 1) {
      const RowRange range = RowsOf(ph);
      const int groups = (range.rows + kGroupRows - 1) / kGroupRows;
      for (int gr = 0; gr < groups; ++gr) {
        const int group_rows = min(kGroupRows, range.rows - gr * kGroupRows);
        group(next_stage(), group_rows);
        if (threadIdx.x < kGroupRows * p.m) {
          const int r = threadIdx.x % kGroupRows;
          const int col = threadIdx.x / kGroupRows;
          if (r < group_rows) {
            ph.y[col * int64_t{ph.n} + range.begin + gr * kGroupRows + r] =
                __float2bfloat16_rn(internal::GroupSum(scratch, r, col));
          }
        }
        ComputeSync();  // the scratch is read
      }
    } else {
      for (;;) {
        const int slot = next_stage();
        const int u = unit[slot];
        if (u < 0) {
          release(slot);
          break;
        }
        group(slot, kGroupRows);
        if (threadIdx.x < kUnitPairs * p.m) {
          const int r = threadIdx.x % kUnitPairs;
          const int col = threadIdx.x / kUnitPairs;
          // Both halves rounded to bf16 as the GEMM's output, then as the SiLU·mul kernel.
          const __nv_bfloat16 gate = __float2bfloat16_rn(internal::GroupSum(scratch, r, col));
          const __nv_bfloat16 up =
              __float2bfloat16_rn(internal::GroupSum(scratch, r + kUnitPairs, col));
          ph.y[col * int64_t{ph.n} + int64_t{u} * kUnitPairs + r] = internal::SiluMul(gate, up);
        }
        ComputeSync();  // the scratch is read
      }
    }
    Stamp(p, 3 + 3 * f);
    // The next phase's norm weights are static: loaded before the barrier.
    if (f + 1 < p.num_phases) weight_first = FirstNormWeight(p.phases[f + 1].x);
    GridBarrier(arrivals, target);
    if (threadIdx.x == 0) *reinterpret_cast<volatile int*>(&passed) = f + 1;
    Stamp(p, 4 + 3 * f);
  }

  if (rope) {
    internal::RopeAppendToken(p.rope, blockIdx.x, *rope_slot, cos_table, sin_table, threadIdx.x,
                              kStageThreads);
  }
  if (p.final.norm_weight != nullptr && blockIdx.x == 0) {
    internal::StageNormedX(p.final, xs, FirstNormWeight(p.final), scratch,
                           scratch + internal::kMaxXRows * 32, [] { ComputeSync(); });
    const int vectors_per_row = p.final.k / 8;
    const int row_elems = XRowElems(p.final.k);
    for (int j = threadIdx.x; j < p.m * vectors_per_row; j += kStageThreads) {
      const int r = j / vectors_per_row;
      const int v = j - r * vectors_per_row;
      *reinterpret_cast<uint4*>(p.normed + r * int64_t{p.final.k} + 8 * v) =
          *reinterpret_cast<const uint4*>(xs + r * row_elems + 8 * v);
    }
  }
}

bool DeviceHasBulkCopy() { return CurrentDeviceIsSm90OrLater(); }

bool Aligned(const void* p) { return p != nullptr && internal::Aligned16(p); }

bool WidthOk(int width) { return width >= 16 && width % 16 == 0 && width <= kMaxWidth; }

int MaxK(const DecodeLayerShape& s) { return std::max({s.hidden, s.q_width, s.ffn}); }

size_t SharedBytes(int m, const DecodeLayerShape& s, int stages) {
  return kFixedBytes + XBytes(m, MaxK(s)) + static_cast<size_t>(stages) * kStageBytes;
}

// Fills the phases of `a` into `p`.
void BuildPhases(const DecodeLayerArgs& a, Params& p) {
  const DecodeLayerShape& s = a.shape;
  auto copy = [&](const __nv_bfloat16* x, int k) {
    internal::NormStaging st = {};
    st.x = x;
    st.x_stride = k;
    st.m = a.m;
    st.k = k;
    return st;
  };
  auto norm = [&](const __nv_bfloat16* x, const __nv_bfloat16* residual_in,
                  __nv_bfloat16* residual_out, const __nv_bfloat16* weight) {
    internal::NormStaging st = copy(x, s.hidden);
    st.residual_in = residual_in;
    st.residual_out = residual_out;
    st.norm_weight = weight;
    st.eps = s.eps;
    return st;
  };
  p.num_phases = 0;
  auto add = [&](const __nv_bfloat16* w, int n, int k, int parts, Staging staging,
                 const internal::NormStaging& x, __nv_bfloat16* y) {
    Phase& ph = p.phases[p.num_phases++];
    ph.w = w;
    ph.n = n;
    ph.k = k;
    ph.parts = parts;
    ph.staging = staging;
    ph.x = x;
    ph.y = y;
  };
  if (a.finish) {
    add(a.o, s.hidden, s.q_width, 1, Staging::kCopy, copy(a.attn, s.q_width), a.hidden);
    add(a.gate_up, s.ffn, s.hidden, 2, Staging::kNorm,
        norm(a.hidden, a.residual, a.mid_residual, a.post_norm), a.act);
    add(a.down, s.hidden, s.ffn, 1, Staging::kCopy, copy(a.act, s.ffn), a.hidden);
  }
  p.rope = {};
  p.final = {};
  p.normed = nullptr;
  if (a.start) {
    const internal::NormStaging x = a.finish
                                        ? norm(a.hidden, a.mid_residual, a.residual, a.norm)
                                        : norm(a.residual, nullptr, nullptr, a.norm);
    add(a.qkv_w, s.qkv_rows(), s.hidden, 1, Staging::kNorm, x, a.qkv);
    RopeKvAppendParams r;
    r.qkv = a.qkv;
    r.positions = a.positions;
    r.num_tokens = a.m;
    r.heads = s.heads;
    r.kv_heads = s.kv_heads;
    r.head_dim = s.head_dim;
    r.theta = s.theta;
    r.rope_scaling = s.rope_scaling;
    r.plan = a.plan;
    r.kv = a.kv;
    p.rope = internal::MakeRopeKvArgs(r);
  } else if (a.final_norm) {
    p.final = norm(a.hidden, a.mid_residual, a.residual, a.norm);
    p.normed = a.normed;
  }
}

}  // namespace

size_t DecodeLayerSharedBytes(int m, const DecodeLayerShape& shape, int stages) {
  return SharedBytes(m, shape, stages);
}

std::string DecodeLayerConfig::ToString() const {
  return "c" + std::to_string(ctas) + "s" + std::to_string(stages) +
         (run_ahead < stages ? "r" + std::to_string(run_ahead) : "");
}

DecodeLayerConfig ChooseDecodeLayerConfig(int m, const DecodeLayerShape& shape, int sm_count) {
  DecodeLayerConfig c;
  if (m < 1 || m > kDecodeLayerMaxRows || sm_count < 1 || !WidthOk(MaxK(shape))) return c;
  c.ctas = sm_count;
  const size_t fixed = SharedBytes(m, shape, 0);
  auto fit = [&](size_t budget) {
    return budget > fixed ? static_cast<int>((budget - fixed) / kStageBytes) : 0;
  };
  int stages = fit(kPreferredSharedBytes);
  if (stages < 2) stages = fit(kMaxSharedBytes);
  c.stages = std::min(stages, kDecodeLayerMaxStages);
  c.shared_bytes = SharedBytes(m, shape, c.stages);
  // Two stages of each phase before the barrier that ends the phase before it: the barrier passes
  // faster with less traffic in flight (decode_layer_benchmark: 43.3 against 45.5 µs per launch at
  // one row on an H200, runtime/model/NOTES.md).
  c.run_ahead = std::min(kDefaultRunAhead, c.stages);
  // Every CTA must be resident at once for the grid barriers.
  int per_sm = 0;
  if (!DeviceHasBulkCopy() || PrepareDecodeLayer() != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, DecodeLayerKernel, kThreads,
                                                    c.shared_bytes) != cudaSuccess ||
      per_sm < 1) {
    c.stages = 0;
  }
  return c;
}

cudaError_t PrepareDecodeLayer() {
  static const cudaError_t prepared = [] {
    if (!DeviceHasBulkCopy()) return cudaSuccess;
    return internal::AllowSharedMemory(DecodeLayerKernel, kMaxSharedBytes);
  }();
  return prepared;
}

bool DecodeLayerSupports(const DecodeLayerArgs& a, const DecodeLayerConfig& c) {
  const DecodeLayerShape& s = a.shape;
  if (a.m < 1 || a.m > kDecodeLayerMaxRows || !WidthOk(s.hidden) || !WidthOk(s.q_width) ||
      !WidthOk(s.ffn) || s.heads < 1 || s.kv_heads < 1 || s.head_dim < 16 ||
      s.head_dim % 16 != 0 || s.head_dim / 2 > internal::kRopeMaxHalf ||
      s.heads * s.head_dim != s.q_width || !IsRopeTheta(s.theta) ||
      !s.rope_scaling.Validate().ok() || !(s.eps >= 0.0f)) {
    return false;
  }
  if (!a.finish && !a.start) return false;
  if (a.start && a.final_norm) return false;
  if (c.stages < 2 || c.stages > kDecodeLayerMaxStages || c.ctas < 1 || c.run_ahead < 0 ||
      c.shared_bytes != SharedBytes(a.m, s, c.stages) || c.shared_bytes > kMaxSharedBytes) {
    return false;
  }
  if (a.grid_sync == nullptr || (reinterpret_cast<uintptr_t>(a.grid_sync) & 7u) != 0) return false;
  if (c.shared_bytes <= kMaxSharedBytes / 2) return false;
  if (a.work_set < 0 || a.work_set >= kDecodeLayerWorkSets || a.previous_work_set < -1 ||
      a.previous_work_set >= kDecodeLayerWorkSets || a.previous_work_set == a.work_set) {
    return false;
  }
  if (!Aligned(a.hidden) || !Aligned(a.residual) || !Aligned(a.norm)) return false;
  if (a.finish && (!Aligned(a.o) || !Aligned(a.post_norm) || !Aligned(a.gate_up) ||
                   !Aligned(a.down) || !Aligned(a.attn) || !Aligned(a.mid_residual) ||
                   !Aligned(a.act))) {
    return false;
  }
  if (a.start) {
    const int bs = a.kv.block_size;
    if (!Aligned(a.qkv_w) || !Aligned(a.qkv) || a.positions == nullptr ||
        a.plan.seq_q_start == nullptr || a.plan.seq_kv_len == nullptr || a.plan.max_seqs < 1 ||
        !Aligned(a.kv.k_cache) || !Aligned(a.kv.v_cache) || a.kv.block_table == nullptr ||
        a.kv.max_blocks_per_seq < 1 || bs < 1 || (bs & (bs - 1)) != 0) {
      return false;
    }
  }
  if (a.final_norm && (!a.finish || !Aligned(a.normed))) return false;
  if (!DeviceHasBulkCopy() || PrepareDecodeLayer() != cudaSuccess) return false;
  // One CTA per SM (more than half of an SM's shared memory each): every CTA resident at once for
  // the grid barriers, and the same grid size for every launch (the barrier counter's base).
  int device = 0;
  int sms = 0;
  return cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess &&
         c.ctas == sms;
}

cudaError_t LaunchDecodeLayer(const DecodeLayerArgs& a, const DecodeLayerConfig& c,
                              cudaStream_t stream) {
  if (!DecodeLayerSupports(a, c)) return cudaErrorInvalidValue;
  Params p = {};
  p.m = a.m;
  p.stages = c.stages;
  p.x_bytes = static_cast<int>(XBytes(a.m, MaxK(a.shape)));
  p.grid_sync = a.grid_sync;
  p.counter = a.grid_sync + 2 + a.work_set;
  p.clear = a.previous_work_set >= 0 ? a.grid_sync + 2 + a.previous_work_set : nullptr;
  p.run_ahead = c.run_ahead;
  p.trace = a.trace;
  BuildPhases(a, p);
  return internal::LaunchWithPdl(DecodeLayerKernel, dim3(c.ctas), dim3(kThreads), c.shared_bytes,
                                 stream, p);
}

}  // namespace kiln
