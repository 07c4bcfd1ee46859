// Internal: the paged split-kv decode attention kernel. Included by the decode_kernel_*.cu files,
// each of which instantiates one dtype and head dimension for every supported group size.
//
// One CTA computes one work item (a tile of up to 16 packed query rows, row = token·G + g, and
// one KV chunk) for one KV head (blockIdx.y). The 16 rows are the M dimension of the
// tensor-core tile mma.m16n8k16, so the G query heads of a KV head (and, for small q_len, several
// tokens) share every K and V element that is read: KV is read once per KV head, at the cost of
// idle tensor-core rows, which are far from the bottleneck (decode is bound by KV bytes).
//
// Each of the 4 warps takes every 4th step of 16 KV tokens of the chunk with its own online
// softmax state; the warps are combined through shared memory at the end. K and V reach
// registers straight from global memory with 16-byte loads laid out to match the MMA fragments,
// so no shared-memory staging is needed:
//   QK^T: lane (gid = lane/4, tig = lane%4) loads K[token gid (+8)][32c + 8tig, +8) for c <
//         D/32; the 8 elements feed two k-steps. Q is loaded once in the same dimension order
//         (a dot product does not care about the order of its terms).
//   PV:   lane loads V[tokens 2tig, 2tig+1, 2tig+8, 2tig+9][64h + 8gid, +8); byte permutes pair
//         two tokens' values of one dimension into a B fragment. Output column gid of n-tile
//         (h, e) is then dimension 64h + 8gid + e, so each lane ends with 16 contiguous
//         dimensions of its rows.
// A step of 16 tokens lies inside one block (block_size is a power of two >= 16 and steps are
// 16-aligned), so one block-table entry per step serves all its loads; it is fetched a round
// ahead. A warp holds kBuffers steps' K and V in registers (two for head_dim 64, one for 128):
// a set's next K (V) is loaded right after its K (V) was consumed, so kBuffers steps of loads fly
// while the warp computes. Two sets took the 1B model's batch-32 call (head_dim 64, 1024 tokens)
// from 21.7 to 20.6 us on an H200 (decode_perf_notes.md); head_dim 128 has no registers to spare.
//
// With RoPE + KV append in the kernel (DecodeRopeAppendDevice), the same layouts put both
// elements of every rotate-half pair (d, d + D/2) in one lane: q is rotated in registers after
// its load, and the new token's K (rotated) and V replace the fragments loaded for the step that
// holds it, in the lanes that hold that token; the CTA of the tile's first rows stores them.
#ifndef KILN_ATTENTION_INTERNAL_DECODE_KERNEL_CUH_
#define KILN_ATTENTION_INTERNAL_DECODE_KERNEL_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "attention/attention_params.h"
#include "attention/internal/kernel_args.h"
#include "attention/internal/merge.cuh"
#include "attention/internal/mma.cuh"
#include "attention/qk_norm_math.cuh"
#include "attention/rope_rotation.cuh"
#include "runtime/cuda/compute_capability.h"
#include "runtime/cuda/device_helpers.cuh"

namespace kiln {
namespace attention_internal {

// Programmatic dependent launch (sm_90+, runtime/cuda/device_helpers.cuh): the kernel is
// launched while the one before it finishes. It reads its work item (plan metadata, uploaded
// before the step) first, lets the next kernel launch, loads the tokens of its first KV steps
// that earlier steps wrote, and waits for the kernels before it before reading q or a token this
// step appends. Every CTA with an item waits, and so does CTA (0, 0) when it is
// padding (padding entries follow the plan's items, so that is a step with no item), so the
// kernel completes only after its predecessor; the other padding CTAs leave at once and free
// their slots for CTAs with work.
//
// Returns whether the current device runs programmatic dependent launches (compute capability
// 9.0 or later); asked once per process.
inline bool DecodeSupportsProgrammaticLaunch() { return CurrentDeviceIsSm90OrLater(); }

// Rotates 8 consecutive pairs of a head held as packed words: lo holds elements i..i+7 of the
// first half, hi their partners i + d/2.., cos_i / sin_i the pairs' tables from i.
template <class Ops>
__device__ __forceinline__ void RopeRotateWords(uint32_t (&lo)[4], uint32_t (&hi)[4],
                                                const float* cos_i, const float* sin_i) {
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const float2 x = Ops::Unpack(lo[w]);
    const float2 y = Ops::Unpack(hi[w]);
    float lo0, hi0, lo1, hi1;
    RopeRotate(x.x, y.x, cos_i[2 * w], sin_i[2 * w], &lo0, &hi0);
    RopeRotate(x.y, y.y, cos_i[2 * w + 1], sin_i[2 * w + 1], &lo1, &hi1);
    lo[w] = Ops::Pack(lo0, lo1);
    hi[w] = Ops::Pack(hi0, hi1);
  }
}

constexpr int kDecodeWarps = 4;
constexpr int kDecodeThreads = kDecodeWarps * 32;
constexpr int kDecodeRows = 16;  // M of the MMA tile: the most rows a work item may have
constexpr int kStepTokens = 16;  // KV tokens per warp step (two n-tiles of 8)

// Resident CTAs per SM: 2 for head_dim 128 (212 registers); 3 for head_dim 64 (168 registers with
// its two register sets, none spilled): a decode step is bound by the serial 16-token steps of
// each warp, so a third of the warps more in flight cuts it.
// kRope: 0, none; 1, RoPE + KV append in the kernel (args.rope_positions set); 2, the same with
// the QK norm of q and the new k before their rotation (args.q_norm set; bf16 only). A template
// parameter so that a kernel without them has none of their code (the double-precision sincos
// alone makes the compiler keep a call frame; the norm's registers spill some of the others).
template <AttentionDtype kDtype, int kHeadDim, int kGroup, int kRope>
__global__ void __launch_bounds__(kDecodeThreads, kHeadDim == 64 ? 3 : 2)
    DecodeAttentionKernel(const DecodeKernelArgs args) {
  static_assert(kHeadDim == 64 || kHeadDim == 128, "head_dim 64 or 128");
  static_assert(kGroup >= 1 && kGroup <= kDecodeRows, "group size 1..16");
  using Ops = DtypeOps<kDtype>;
  constexpr int kKLoads = kHeadDim / 32;  // 16-byte K loads per token row per lane
  constexpr int kVLoads = kHeadDim / 64;  // 16-byte V loads per token per lane
  constexpr int kOTiles = kHeadDim / 8;   // n-tiles of the output
  constexpr unsigned kFull = 0xffffffffu;

  const AttentionWorkItem item = args.work_items[blockIdx.x];
  AllowDependentLaunch();
  if (item.seq < 0) {  // padding: the grid is sized by the capture key
    if (blockIdx.x == 0 && blockIdx.y == 0) WaitForPrerequisites();  // the step has no item
    return;
  }
  const int kv_head = blockIdx.y;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int gid = lane >> 2;
  const int tig = lane & 3;

  const int q_start = args.seq_q_start[item.seq];
  const int q_len = args.seq_q_start[item.seq + 1] - q_start;
  const int kv_len = args.seq_kv_len[item.seq];
  const int num_rows = item.row_end - item.row_begin;
  const int kv_begin = item.kv_begin;
  const int kv_end = item.kv_end;
  // Token j of the sequence sees KV positions [0, causal_base + j).
  const int causal_base = kv_len - q_len + 1;

  const int base0 = kv_begin & ~(kStepTokens - 1);
  const int num_steps =
      kv_end > kv_begin ? (kv_end - base0 + kStepTokens - 1) / kStepTokens : 0;
  const int32_t* table =
      args.block_table + static_cast<int64_t>(item.seq) * args.max_blocks_per_seq;
  const int log2_bs = args.log2_block_size;
  const int in_block_mask = (1 << log2_bs) - 1;
  const int64_t block_stride = (static_cast<int64_t>(args.num_kv_heads) * kHeadDim) << log2_bs;
  const int64_t head_offset = (static_cast<int64_t>(kv_head) * kHeadDim) << log2_bs;
  const uint16_t* k_pool = static_cast<const uint16_t*>(args.k_cache) + head_offset;
  const uint16_t* v_pool = static_cast<const uint16_t*>(args.v_cache) + head_offset;

  // RoPE + KV append in the kernel (kRope; a decode part, so q_len is 1: every row is token
  // q_start, and the token this step appends is position kv_len − 1). new_base is the first token
  // of the step that holds the new token where this CTA's chunk holds it, else −1; the lanes that
  // load that step take the new K (rotated) and V from new_k / new_v instead of the cache, and
  // the CTA of the tile's first rows writes them into the cache slot (none where the block table
  // maps no block there, as the RoPE + KV append kernel).
  constexpr bool rope = kRope != 0;
  const int new_pos = kv_len - 1;
  const int new_base =
      rope && new_pos >= kv_begin && new_pos < kv_end ? new_pos & ~(kStepTokens - 1) : -1;
  const bool append = item.row_begin == 0;
  constexpr int kHalfLoads = kKLoads / 2;  // a lane's K loads of the first half of a head
  __shared__ float s_cos[kHeadDim / 2];
  __shared__ float s_sin[kHeadDim / 2];
  // QK norm (bf16 only) of q and the new k before their rotation: the weights, q's then k's,
  // staged before the wait; a head's values lie in its quad's lanes (attention/qk_norm_math.cuh).
  constexpr bool kQkNorm = kRope == 2;
  static_assert(!kQkNorm || kDtype == AttentionDtype::kBf16, "the QK norm runs bf16");
  __shared__ __align__(16) uint16_t s_qk_norm[kQkNorm ? 2 * kHeadDim : 8];
  const unsigned quad = 0xfu << (lane & ~3);
  // Norms the head whose pieces (8 values at 32c + 8tig) `piece` holds with weight `side` (0: q,
  // 1: k) and returns them normed; every lane of the quad calls it.
  auto norm_head = [&](uint4 (&piece)[kKLoads], int side) {
    float s = 0.f;
#pragma unroll
    for (int c = 0; c < kKLoads; ++c) s = QkNormSumSquares(piece[c], s);
    const float scale = QkNormScale(QkNormQuadSum(s, quad), kHeadDim, args.qk_norm_eps);
#pragma unroll
    for (int c = 0; c < kKLoads; ++c) {
      const uint4 w =
          *reinterpret_cast<const uint4*>(s_qk_norm + side * kHeadDim + 32 * c + 8 * tig);
      piece[c] = QkNormApply(piece[c], w, scale);
    }
  };
  const int64_t new_row = static_cast<int64_t>(q_start) * args.new_kv_stride + kv_head * kHeadDim;
  // The new token's cache slot in `pool` at dimension `dim` of the head, when the step at `base`
  // lies in `block` (patch_k / patch_v write it there).
  auto new_slot = [&](const uint16_t* pool, int block, int base, int dim) {
    return const_cast<uint16_t*>(pool) + static_cast<int64_t>(block) * block_stride +
           static_cast<int64_t>((base & in_block_mask) + new_pos - base) * kHeadDim + dim;
  };
  // Lane (gid, tig) holds token gid (+ 8) of a K step at dimensions 32c + 8tig: a rotate-half
  // pair (c, c + kHalfLoads) is in one lane. Called by the lanes that own the new token, with
  // the n-tile `own` that holds it.
  auto patch_k = [&](uint32_t (&dst)[2][kKLoads][4], int own, int block, int base) {
    const uint16_t* src = static_cast<const uint16_t*>(args.new_k) + new_row + 8 * tig;
    uint16_t* slot = new_slot(k_pool, block, base, 8 * tig);
    // With the QK norm, the whole head first (the quad of token gid holds it), normed.
    uint4 piece[kQkNorm ? kKLoads : 1];
    if constexpr (kQkNorm) {
#pragma unroll
      for (int c = 0; c < kKLoads; ++c) piece[c] = *reinterpret_cast<const uint4*>(src + 32 * c);
      norm_head(piece, 1);
    }
#pragma unroll
    for (int c = 0; c < kHalfLoads; ++c) {
      uint32_t lo[4], hi[4];
      if constexpr (kQkNorm) {
        ToWords(piece[c], lo);
        ToWords(piece[c + kHalfLoads], hi);
      } else {
        ToWords(*reinterpret_cast<const uint4*>(src + 32 * c), lo);
        ToWords(*reinterpret_cast<const uint4*>(src + 32 * (c + kHalfLoads)), hi);
      }
      RopeRotateWords<Ops>(lo, hi, s_cos + 32 * c + 8 * tig, s_sin + 32 * c + 8 * tig);
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        if (t != own) continue;
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          dst[t][c][w] = lo[w];
          dst[t][c + kHalfLoads][w] = hi[w];
        }
      }
      if (append && block >= 0) {
        *reinterpret_cast<uint4*>(slot + 32 * c) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
        *reinterpret_cast<uint4*>(slot + 32 * (c + kHalfLoads)) =
            make_uint4(hi[0], hi[1], hi[2], hi[3]);
      }
    }
  };
  // Lane (gid, tig) holds tokens 2tig, 2tig + 1, 2tig + 8, 2tig + 9 of a V step at dimensions
  // 64c + 8gid. Called by the lanes that own the new token, with the index `own` of it among
  // their four.
  auto patch_v = [&](uint32_t (&dst)[4][kVLoads][4], int own, int block, int base) {
    const uint16_t* src = static_cast<const uint16_t*>(args.new_v) + new_row + 8 * gid;
    uint16_t* slot = new_slot(v_pool, block, base, 8 * gid);
#pragma unroll
    for (int c = 0; c < kVLoads; ++c) {
      const uint4 x = *reinterpret_cast<const uint4*>(src + 64 * c);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        if (u == own) ToWords(x, dst[u][c]);
      }
      if (append && block >= 0) *reinterpret_cast<uint4*>(slot + 64 * c) = x;
    }
  };

  // kBuffers register sets of a step's K and V: a warp walks its steps in rounds of kBuffers,
  // and each set is refilled with the step kBuffers rounds ahead as soon as it is consumed, so
  // kBuffers steps of loads fly per warp. Two for head_dim 64 (32 more registers); one for 128,
  // which has no registers to spare.
  constexpr int kBuffers = kHeadDim == 64 ? 2 : 1;
  constexpr int kStride = kBuffers * kDecodeWarps;  // steps between a set's refills
  // Zeros at first: a masked token's registers may be read (its score is then replaced) before
  // any load fills them.
  uint32_t kr[kBuffers][2][kKLoads][4] = {};  // [set][n-tile][load][word]
  // [set][token 2tig, 2tig+1, 2tig+8, 2tig+9][load][word]
  uint32_t vr[kBuffers][4][kVLoads][4] = {};

  // A lane loads the step's tokens in [lo, hi) only: the others are masked (their scores become
  // -inf and their V is zeroed below, whatever the registers hold), so a token outside
  // [kv_begin, kv_end) is never read, and the first step's tokens are loaded in two parts around
  // the wait (those earlier steps wrote before it, those this step appends after it).
  auto load_k = [&](uint32_t (&dst)[2][kKLoads][4], int block, int base, int lo, int hi) {
    const uint16_t* p = k_pool + static_cast<int64_t>(block) * block_stride +
                        static_cast<int64_t>((base & in_block_mask) + gid) * kHeadDim + 8 * tig;
    // The n-tile whose token this lane takes from new_k instead (patch_k), else -1: its cache
    // slot is not loaded (nothing valid there yet, and the patch need not wait for it).
    const int off = new_pos - base;
    const int own = rope && base == new_base && gid == (off & 7) ? off >> 3 : -1;
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const int token = base + gid + 8 * t;
      if (t == own || token < lo || token >= hi) continue;
#pragma unroll
      for (int c = 0; c < kKLoads; ++c) {
        ToWords(LoadStreaming(p + t * 8 * kHeadDim + 32 * c), dst[t][c]);
      }
    }
    if (own >= 0 && new_pos >= lo && new_pos < hi) patch_k(dst, own, block, base);
  };
  auto load_v = [&](uint32_t (&dst)[4][kVLoads][4], int block, int base, int lo, int hi) {
    const uint16_t* p = v_pool + static_cast<int64_t>(block) * block_stride +
                        static_cast<int64_t>((base & in_block_mask) + 2 * tig) * kHeadDim +
                        8 * gid;
    // The token of this lane's four that it takes from new_v instead (patch_v), else -1.
    const int off = new_pos - base;
    const int own = rope && base == new_base && tig == ((off & 7) >> 1)
                        ? ((off >> 3) << 1) | (off & 1)
                        : -1;
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int token = (u >> 1) * 8 + (u & 1);
      if (u == own || base + 2 * tig + token < lo || base + 2 * tig + token >= hi) continue;
#pragma unroll
      for (int c = 0; c < kVLoads; ++c) {
        ToWords(LoadStreaming(p + token * kHeadDim + 64 * c), dst[u][c]);
      }
    }
    if (own >= 0 && new_pos >= lo && new_pos < hi) patch_v(dst, own, block, base);
  };
  // The block-table entry of a step (one per step: a step lies inside one block).
  auto block_of = [&](int step) { return table[(base0 + step * kStepTokens) >> log2_bs]; };

  // Every load of a step stays inside the step's block, which holds at least one token of
  // [kv_begin, kv_end); tokens outside that range are masked and not read. block_next[b] is the
  // block of the step set b is refilled with next, fetched one round ahead.
  //
  // The plan and the block table are uploaded before the step, and the KV of tokens the step
  // did not append ([0, kv_len - q_len)) was written by earlier steps: a first step's tokens
  // below that are loaded before the wait, while the kernels before this one finish. Only the
  // tokens this step appends (written by the RoPE + KV append before, a round trip to L2) are
  // loaded after it, so the step that holds them no longer waits for its older tokens' DRAM
  // round trip after the wait.
  const int written_end = kv_len - q_len;
  const int old_end = min(written_end, kv_end);
  const int new_begin = max(written_end, kv_begin);
  int block_next[kBuffers] = {};
  int block_first[kBuffers] = {};
  // Loads set b's first step: its tokens in [lo, hi).
  auto load_first = [&](int b, int lo, int hi) {
    const int step = warp + b * kDecodeWarps;
    load_k(kr[b], block_first[b], base0 + step * kStepTokens, lo, hi);
    load_v(vr[b], block_first[b], base0 + step * kStepTokens, lo, hi);
  };
  if (rope) {  // positions come from the step's upload, not from a kernel of the step
    const int position = args.rope_positions[q_start];
    for (int i = threadIdx.x; i < kHeadDim / 2; i += kDecodeThreads) {
      RopeCosSin(position, i, kHeadDim, args.rope_freqs, &s_cos[i], &s_sin[i]);
    }
    if constexpr (kQkNorm) {  // weights: static data, staged before the wait
      for (int i = threadIdx.x; i < 2 * kHeadDim / 8; i += kDecodeThreads) {
        const uint16_t* w =
            static_cast<const uint16_t*>(i < kHeadDim / 8 ? args.q_norm : args.k_norm);
        const int at = 8 * (i % (kHeadDim / 8));
        *reinterpret_cast<uint4*>(s_qk_norm + 8 * i) = *reinterpret_cast<const uint4*>(w + at);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int b = 0; b < kBuffers; ++b) {
    const int step = warp + b * kDecodeWarps;
    if (step < num_steps) {
      block_first[b] = block_of(step);
      if (step + kStride < num_steps) block_next[b] = block_of(step + kStride);
      load_first(b, kv_begin, old_end);
    }
  }
  WaitForPrerequisites();
#pragma unroll
  for (int b = 0; b < kBuffers; ++b) {
    const int base = base0 + (warp + b * kDecodeWarps) * kStepTokens;
    if (warp + b * kDecodeWarps < num_steps && base + kStepTokens > new_begin && base < kv_end) {
      load_first(b, new_begin, kv_end);
    }
  }

  // Q fragments of rows gid and gid + 8, and each row's exclusive KV limit.
  const uint16_t* q = static_cast<const uint16_t*>(args.q);
  uint32_t qf[kKLoads][2][4];
  int limit[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int m = gid + 8 * h;
    if (m < num_rows) {
      const int r = item.row_begin + m;
      const int j = r / kGroup;
      const int g = r - j * kGroup;
      const uint16_t* row = q + static_cast<int64_t>(q_start + j) * args.q_stride +
                            static_cast<int64_t>(kv_head * kGroup + g) * kHeadDim + 8 * tig;
      if constexpr (kQkNorm) {
        uint4 piece[kKLoads];
#pragma unroll
        for (int c = 0; c < kKLoads; ++c) piece[c] = *reinterpret_cast<const uint4*>(row + 32 * c);
        norm_head(piece, 0);  // m depends on gid only: the quad is here
#pragma unroll
        for (int c = 0; c < kKLoads; ++c) ToWords(piece[c], qf[c][h]);
      } else {
#pragma unroll
        for (int c = 0; c < kKLoads; ++c) {
          ToWords(*reinterpret_cast<const uint4*>(row + 32 * c), qf[c][h]);
        }
      }
      if (rope) {
#pragma unroll
        for (int c = 0; c < kHalfLoads; ++c) {
          RopeRotateWords<Ops>(qf[c][h], qf[c + kHalfLoads][h], s_cos + 32 * c + 8 * tig,
                               s_sin + 32 * c + 8 * tig);
        }
      }
      limit[h] = min(kv_end, causal_base + j);
    } else {
#pragma unroll
      for (int c = 0; c < kKLoads; ++c) {
        qf[c][h][0] = qf[c][h][1] = qf[c][h][2] = qf[c][h][3] = 0u;
      }
      limit[h] = kv_end;
    }
  }
  // The first row has the smallest limit: a step entirely below it (and at or after kv_begin)
  // needs no mask.
  const int unmasked_end = min(kv_end, causal_base + item.row_begin / kGroup);

  float o[kOTiles][4];
#pragma unroll
  for (int t = 0; t < kOTiles; ++t) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.f;
  float row_max[2] = {NegativeInfinity(), NegativeInfinity()};
  float row_sum[2] = {0.f, 0.f};

  for (int round = warp; round < num_steps; round += kStride) {
#pragma unroll
    for (int b = 0; b < kBuffers; ++b) {
      const int step = round + b * kDecodeWarps;
      if (step >= num_steps) break;
      const int base = base0 + step * kStepTokens;
      const int next_base = base + kStride * kStepTokens;
      const bool has_next = step + kStride < num_steps;
      const int block_after = step + 2 * kStride < num_steps ? block_of(step + 2 * kStride) : 0;

      // S = Q K^T for tokens base + [0, 8) (n-tile 0) and base + [8, 16) (n-tile 1).
      float s[2][4];
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.f;
#pragma unroll
        for (int c = 0; c < kKLoads; ++c) {
          const uint32_t a0[4] = {qf[c][0][0], qf[c][1][0], qf[c][0][1], qf[c][1][1]};
          Ops::Mma(s[t], a0, kr[b][t][c][0], kr[b][t][c][1]);
          const uint32_t a1[4] = {qf[c][0][2], qf[c][1][2], qf[c][0][3], qf[c][1][3]};
          Ops::Mma(s[t], a1, kr[b][t][c][2], kr[b][t][c][3]);
        }
      }
      if (has_next) load_k(kr[b], block_next[b], next_base, kv_begin, kv_end);

      // Online softmax in base 2. s[t][i]: row gid + 8 * (i >> 1), token
      // base + 8t + 2tig + (i & 1).
#pragma unroll
      for (int t = 0; t < 2; ++t) {
#pragma unroll
        for (int i = 0; i < 4; ++i) s[t][i] *= args.scale_log2;
      }
      if (base < kv_begin || base + kStepTokens > unmasked_end) {
#pragma unroll
        for (int t = 0; t < 2; ++t) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int token = base + 8 * t + 2 * tig + (i & 1);
            if (token < kv_begin || token >= limit[i >> 1]) s[t][i] = NegativeInfinity();
          }
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = fmaxf(fmaxf(s[0][2 * h], s[0][2 * h + 1]), fmaxf(s[1][2 * h], s[1][2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 2));
        const float new_max = fmaxf(row_max[h], mx);
        // A row with nothing visible yet keeps max -inf; subtracting 0 keeps its p at 0, not NaN.
        const float shift = new_max == NegativeInfinity() ? 0.f : new_max;
        const float alpha = FastExp2(row_max[h] - shift);
        row_max[h] = new_max;
        float sum = 0.f;
#pragma unroll
        for (int t = 0; t < 2; ++t) {
          s[t][2 * h] = FastExp2(s[t][2 * h] - shift);
          s[t][2 * h + 1] = FastExp2(s[t][2 * h + 1] - shift);
          sum += s[t][2 * h] + s[t][2 * h + 1];
        }
        row_sum[h] = row_sum[h] * alpha + sum;
#pragma unroll
        for (int n = 0; n < kOTiles; ++n) {
          o[n][2 * h] *= alpha;
          o[n][2 * h + 1] *= alpha;
        }
      }
      // P as the A fragment: k = token, rows as in S (the accumulator layout of two n-tiles is
      // the A layout of one k16 step).
      const uint32_t pa[4] = {Ops::Pack(s[0][0], s[0][1]), Ops::Pack(s[0][2], s[0][3]),
                              Ops::Pack(s[1][0], s[1][1]), Ops::Pack(s[1][2], s[1][3])};

      // Tokens outside [kv_begin, kv_end) may hold stale bits (even NaN): zero their V so that
      // p = 0 contributes exactly nothing.
      if (base < kv_begin || base + kStepTokens > kv_end) {
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const int token = base + (u >> 1) * 8 + 2 * tig + (u & 1);
          if (token < kv_begin || token >= kv_end) {
#pragma unroll
            for (int c = 0; c < kVLoads; ++c) {
              vr[b][u][c][0] = vr[b][u][c][1] = vr[b][u][c][2] = vr[b][u][c][3] = 0u;
            }
          }
        }
      }
      // O += P V: n-tile (c, e) takes element e of each lane's 8 dimensions.
#pragma unroll
      for (int c = 0; c < kVLoads; ++c) {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const unsigned selector = (e & 1) ? 0x7632u : 0x5410u;
          const uint32_t b0 = __byte_perm(vr[b][0][c][e >> 1], vr[b][1][c][e >> 1], selector);
          const uint32_t b1 = __byte_perm(vr[b][2][c][e >> 1], vr[b][3][c][e >> 1], selector);
          Ops::Mma(o[c * 8 + e], pa, b0, b1);
        }
      }
      if (has_next) load_v(vr[b], block_next[b], next_base, kv_begin, kv_end);
      block_next[b] = block_after;
    }
  }

  // Combine the four warps: each warp leaves its rows' maximum, sum and unscaled outputs in
  // shared memory, and after one CTA barrier each (row, 8 dimensions) cell scales and adds the
  // four (the products rounded on their own, as when each warp scaled its outputs itself).
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    row_sum[h] += __shfl_xor_sync(kFull, row_sum[h], 1);
    row_sum[h] += __shfl_xor_sync(kFull, row_sum[h], 2);
  }
  __shared__ float s_max[kDecodeWarps][kDecodeRows];
  __shared__ float s_sum[kDecodeWarps][kDecodeRows];
  // Rows padded by 4 floats to spread the lanes' 16-byte stores over the banks.
  __shared__ __align__(16) float s_out[kDecodeWarps][kDecodeRows][kHeadDim + 4];
  if (tig == 0) {
    s_max[warp][gid] = row_max[0];
    s_max[warp][gid + 8] = row_max[1];
    s_sum[warp][gid] = row_sum[0];
    s_sum[warp][gid + 8] = row_sum[1];
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = gid + 8 * h;
#pragma unroll
    for (int c = 0; c < kVLoads; ++c) {
      float* dst = &s_out[warp][row][64 * c + 16 * tig];
      *reinterpret_cast<float4*>(dst + 0) = make_float4(o[c * 8 + 0][2 * h], o[c * 8 + 1][2 * h],
                                                        o[c * 8 + 2][2 * h], o[c * 8 + 3][2 * h]);
      *reinterpret_cast<float4*>(dst + 4) = make_float4(o[c * 8 + 4][2 * h], o[c * 8 + 5][2 * h],
                                                        o[c * 8 + 6][2 * h], o[c * 8 + 7][2 * h]);
      *reinterpret_cast<float4*>(dst + 8) =
          make_float4(o[c * 8 + 0][2 * h + 1], o[c * 8 + 1][2 * h + 1], o[c * 8 + 2][2 * h + 1],
                      o[c * 8 + 3][2 * h + 1]);
      *reinterpret_cast<float4*>(dst + 12) =
          make_float4(o[c * 8 + 4][2 * h + 1], o[c * 8 + 5][2 * h + 1], o[c * 8 + 6][2 * h + 1],
                      o[c * 8 + 7][2 * h + 1]);
    }
  }
  __syncthreads();

  constexpr int kChunks = kHeadDim / 8;
  for (int task = threadIdx.x; task < kDecodeRows * kChunks; task += kDecodeThreads) {
    const int row = task / kChunks;
    const int chunk = task - row * kChunks;
    if (row >= num_rows) continue;
    float total_max = NegativeInfinity();
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) total_max = fmaxf(total_max, s_max[w][row]);
    float total_sum = 0.f;
    float acc[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = 0.f;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) {
      const float m = s_max[w][row];
      // A warp that saw nothing of this row weighs 0.
      const float scale = m == NegativeInfinity() ? 0.f : FastExp2(m - total_max);
      if (m != NegativeInfinity()) total_sum += s_sum[w][row] * scale;
      const float4 a = *reinterpret_cast<const float4*>(&s_out[w][row][8 * chunk]);
      const float4 b = *reinterpret_cast<const float4*>(&s_out[w][row][8 * chunk + 4]);
      acc[0] += __fmul_rn(a.x, scale);
      acc[1] += __fmul_rn(a.y, scale);
      acc[2] += __fmul_rn(a.z, scale);
      acc[3] += __fmul_rn(a.w, scale);
      acc[4] += __fmul_rn(b.x, scale);
      acc[5] += __fmul_rn(b.y, scale);
      acc[6] += __fmul_rn(b.z, scale);
      acc[7] += __fmul_rn(b.w, scale);
    }
    // A row that saw no KV at all (empty chunk or fully masked) yields zeros, never NaN.
    const float inv = total_sum > 0.f ? 1.f / total_sum : 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] *= inv;
    if (item.partial_slot < 0) {
      const int r = item.row_begin + row;
      const int j = r / kGroup;
      const int g = r - j * kGroup;
      uint16_t* out = static_cast<uint16_t*>(args.o) +
                      static_cast<int64_t>(q_start + j) * args.o_stride +
                      static_cast<int64_t>(kv_head * kGroup + g) * kHeadDim + 8 * chunk;
      const uint4 packed = make_uint4(Ops::Pack(acc[0], acc[1]), Ops::Pack(acc[2], acc[3]),
                                      Ops::Pack(acc[4], acc[5]), Ops::Pack(acc[6], acc[7]));
      *reinterpret_cast<uint4*>(out) = packed;
    } else {
      const int64_t slot_row =
          (static_cast<int64_t>(item.partial_slot) * args.num_kv_heads + kv_head) *
              args.tile_rows +
          row;
      float* out = args.partial_o + slot_row * kHeadDim + 8 * chunk;
      *reinterpret_cast<float4*>(out) = make_float4(acc[0], acc[1], acc[2], acc[3]);
      *reinterpret_cast<float4*>(out + 4) = make_float4(acc[4], acc[5], acc[6], acc[7]);
      if (chunk == 0) {
        args.partial_lse[slot_row] =
            total_sum > 0.f ? total_max + __log2f(total_sum) : NegativeInfinity();
      }
    }
  }

  // Fused merge: the last chunk of a split tile to finish merges it: the CTA barrier orders every
  // thread's partials before thread 0's count, whose release publishes them and whose acquire
  // (for the last arriver) makes everyone's visible to its CTA after the second barrier.
  if (item.partial_slot >= 0 && args.merge_counters != nullptr) {
    __shared__ int s_first_slot;
    __shared__ int s_num_slots;
    __syncthreads();
    if (threadIdx.x == 0) {
      const int chunk = args.header->kv_chunk_size;
      const int first = item.partial_slot - kv_begin / chunk;
      const int tile_end = max(0, causal_base + (item.row_end - 1) / kGroup);
      const int num_slots = (tile_end + chunk - 1) / chunk;
      int32_t* counter =
          args.merge_counters + static_cast<int64_t>(first) * args.num_kv_heads + kv_head;
      const bool last = CountAcqRel(counter) == num_slots - 1;
      if (last) *counter = 0;  // every chunk has counted: ready for the next launch
      s_first_slot = last ? first : -1;
      s_num_slots = num_slots;
    }
    __syncthreads();
    if (s_first_slot >= 0) {
      MergeRows<kDtype, kHeadDim>(args.partial_o, args.partial_lse, args.num_kv_heads,
                                  args.tile_rows, s_first_slot, s_num_slots, kv_head,
                                  item.row_begin, num_rows, q_start, kGroup,
                                  static_cast<uint16_t*>(args.o), args.o_stride, threadIdx.x,
                                  kDecodeThreads);
    }
  }
}

template <AttentionDtype kDtype, int kHeadDim, int kGroup>
cudaError_t LaunchDecodeKernel(const DecodeKernelArgs& args, int grid_x, cudaStream_t stream) {
  // With programmatic dependent launch where the GPU has it (see the kernel's start).
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(grid_x, args.num_kv_heads);
  config.blockDim = dim3(kDecodeThreads);
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = DecodeSupportsProgrammaticLaunch() ? 1 : 0;
  if (args.rope_positions != nullptr) {
    if constexpr (kDtype == AttentionDtype::kBf16) {
      if (args.q_norm != nullptr) {
        return cudaLaunchKernelEx(&config, DecodeAttentionKernel<kDtype, kHeadDim, kGroup, 2>,
                                  args);
      }
    }
    return cudaLaunchKernelEx(&config, DecodeAttentionKernel<kDtype, kHeadDim, kGroup, 1>, args);
  }
  return cudaLaunchKernelEx(&config, DecodeAttentionKernel<kDtype, kHeadDim, kGroup, 0>, args);
}

#define KILN_INSTANTIATE_DECODE_ONE_(DTYPE, HEAD_DIM, GROUP)                                \
  template cudaError_t LaunchDecodeKernel<DTYPE, HEAD_DIM, GROUP>(const DecodeKernelArgs&, \
                                                                   int, cudaStream_t);

// Instantiates the decode kernel of one dtype and head dimension for every supported group.
#define KILN_INSTANTIATE_DECODE(DTYPE, HEAD_DIM)  \
  KILN_INSTANTIATE_DECODE_ONE_(DTYPE, HEAD_DIM, 1) \
  KILN_INSTANTIATE_DECODE_ONE_(DTYPE, HEAD_DIM, 2) \
  KILN_INSTANTIATE_DECODE_ONE_(DTYPE, HEAD_DIM, 3) \
  KILN_INSTANTIATE_DECODE_ONE_(DTYPE, HEAD_DIM, 4) \
  KILN_INSTANTIATE_DECODE_ONE_(DTYPE, HEAD_DIM, 5) \
  KILN_INSTANTIATE_DECODE_ONE_(DTYPE, HEAD_DIM, 6) \
  KILN_INSTANTIATE_DECODE_ONE_(DTYPE, HEAD_DIM, 7) \
  KILN_INSTANTIATE_DECODE_ONE_(DTYPE, HEAD_DIM, 8)

}  // namespace attention_internal
}  // namespace kiln

#endif  // KILN_ATTENTION_INTERNAL_DECODE_KERNEL_CUH_
