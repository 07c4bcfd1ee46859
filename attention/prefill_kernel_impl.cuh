// The prefill attention kernel template and its launcher; included only by the prefill_*.cu
// files that instantiate it (one per dtype and head_dim, so builds parallelise).
#ifndef KILN_ATTENTION_PREFILL_KERNEL_IMPL_CUH_
#define KILN_ATTENTION_PREFILL_KERNEL_IMPL_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "attention/attention_params.h"
#include "attention/prefill_kernel_internal.h"

namespace kiln {
namespace prefill_internal {

constexpr int kThreads = 128;  // four warps
constexpr int kWarps = kThreads / 32;
constexpr int kKvTile = 64;    // keys per K/V tile

template <int kHeadDim, int kTileRows>
struct Shape {
  // Each warp owns kMTiles consecutive 16-row MMA tiles of the query tile. Two tiles per warp
  // (T = 128) let every K/V fragment read from shared memory feed two MMAs, which keeps
  // shared-memory bandwidth under the tensor cores' rate.
  static constexpr int kMTiles = kTileRows / (16 * kWarps);
  static constexpr int kRowBytes = kHeadDim * 2;
  static constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
  static constexpr int kQBytes = kTileRows * kRowBytes;
  static constexpr int kKvBytes = kKvTile * kRowBytes;  // K (or V) of one tile
  static constexpr int kStageBytes = 2 * kKvBytes;
  // Two stages for head_dim 128 (two CTAs per SM still fit), three for head_dim 64.
  static constexpr int kStages = kHeadDim == 128 ? 2 : 3;
  // Two slots of per-key cache offsets (int64) for the tiles the loader fetches next.
  static constexpr int kTableBytes = 2 * kKvTile * 8;
  static constexpr int kSmemBytes =
      kQBytes + kStages * kStageBytes + kTableBytes + 1024;  // + alignment slack
  static constexpr int kRowsPerPass = kThreads / kChunks;  // rows one pass of the CTA loads
  static_assert(kMTiles >= 1 && kMTiles * 16 * kWarps == kTileRows, "tile_rows must be 64 or 128");
  static_assert(kHeadDim == 64 || kHeadDim == 128, "head_dim must be 64 or 128");
};

template <typename T>
struct Dtype;

template <>
struct Dtype<__nv_bfloat16> {
  static __device__ __forceinline__ uint32_t Pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  // d += a * b for one m16n8k16 tile.
  static __device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <>
struct Dtype<__half> {
  static __device__ __forceinline__ uint32_t Pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// 16-byte global→shared copy that bypasses L1; src_bytes = 0 writes zeros and reads nothing,
// which is how rows outside the item (and KV past its end) become harmless zeros.
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}

__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Shared-memory tiles are rows of 16-byte chunks; chunk c of row r sits at c ^ (r % 8). The eight
// rows one ldmatrix phase reads (same logical chunk) then land in eight different bank groups.
__device__ __forceinline__ uint32_t Swizzle(int row, int chunk, int row_bytes) {
  return row * row_bytes + ((chunk ^ (row & 7)) << 4);
}

template <typename T, int kHeadDim, int kTileRows>
__global__ void __launch_bounds__(kThreads, 2)
    PrefillAttentionKernel(const __grid_constant__ KernelArgs args) {
  using S = Shape<kHeadDim, kTileRows>;
  constexpr int kMTiles = S::kMTiles;
  constexpr int kRowBytes = S::kRowBytes;
  constexpr int kDTiles = kHeadDim / 8;  // n8 tiles of the output
  constexpr int kStages = S::kStages;

  const AttentionWorkItem item = args.work_items[blockIdx.x];
  if (item.seq < 0) return;  // padding up to the capacity the capture key fixed
  const int kv_head = blockIdx.y;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int group = args.group;

  const int q_start = args.seq_q_start[item.seq];
  const int q_len = args.seq_q_start[item.seq + 1] - q_start;
  const int kv_len = args.seq_kv_len[item.seq];
  const int prefix = kv_len - q_len;  // KV position of new token 0
  const int first_token = args.group_div.Div(item.row_begin);
  const int last_token = args.group_div.Div(item.row_end - 1);
  // Keys [kv_lo, kv_hi) are visible to some row of the tile; keys below full_hi to every row.
  const int kv_lo = item.kv_begin;
  const int kv_hi = min(item.kv_end, prefix + last_token + 1);
  const int full_hi = min(item.kv_end, prefix + first_token + 1);
  const int num_tiles = kv_hi > kv_lo ? (kv_hi - kv_lo + kKvTile - 1) / kKvTile : 0;

  // The ldmatrix addressing below xors chunk bits into addresses, which needs every tile on a
  // 1 KB boundary; the allocation carries 1 KB of slack to align the start.
  extern __shared__ __align__(1024) uint8_t smem[];
  const uint32_t smem_raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t align_pad = (1024u - (smem_raw & 1023u)) & 1023u;
  const uint32_t smem_q = smem_raw + align_pad;
  const uint32_t smem_kv = smem_q + S::kQBytes;
  // Cache offsets (elements) of the keys of the next tiles, two slots of kKvTile entries.
  int64_t* const offset_table =
      reinterpret_cast<int64_t*>(smem + align_pad + S::kQBytes + kStages * S::kStageBytes);

  const T* q = static_cast<const T*>(args.q);
  const int32_t* block_table =
      args.block_table + static_cast<int64_t>(item.seq) * args.max_blocks_per_seq;

  // Loader mapping: each thread copies one 16-byte chunk column of every kRowsPerPass-th row.
  // kRowsPerPass is a multiple of 8, so the swizzle of all of them is the same.
  const int ld_chunk = tid % S::kChunks;
  const int ld_row0 = tid / S::kChunks;
  const uint32_t ld_swz = Swizzle(ld_row0, ld_chunk, kRowBytes);
  static_assert(S::kRowsPerPass % 8 == 0, "loader rows must keep their swizzle");
  // This thread's chunk column in KV head kv_head of physical block 0; a key adds its offset.
  const int64_t head_offset =
      static_cast<int64_t>(kv_head) * args.block_size * kHeadDim + ld_chunk * 8;
  const T* const k_src = static_cast<const T*>(args.k_cache) + head_offset;
  const T* const v_src = static_cast<const T*>(args.v_cache) + head_offset;

  // Q tile: packed row r of the item is token (row_begin + r) / G, head kv_head * G + g.
#pragma unroll
  for (int i = 0; i < kTileRows / S::kRowsPerPass; ++i) {
    const int r = ld_row0 + i * S::kRowsPerPass;
    const int row = item.row_begin + r;
    const bool valid = row < item.row_end;
    const T* src = q;
    if (valid) {
      const int token = args.group_div.Div(row);
      const int head = kv_head * group + (row - token * group);
      src = q + static_cast<int64_t>(q_start + token) * args.q_stride + head * kHeadDim +
            ld_chunk * 8;
    }
    CpAsync16(smem_q + ld_swz + i * S::kRowsPerPass * kRowBytes, src, valid ? 16 : 0);
  }

  // Offset (elements) of key position pos in the cache, relative to k_src / v_src.
  auto key_offset = [&](int pos, int block) -> int64_t {
    return static_cast<int64_t>(block) * args.block_stride +
           (pos - static_cast<int>(args.block_div.Div(pos)) * args.block_size) * kHeadDim;
  };

  // One K/V tile into a stage. Keys at or past kv_hi are zero-filled (never read), so neither a
  // stale block-table entry nor stale cache contents can reach the result. The first tiles look
  // their blocks up here; later ones read offsets that the first 64 threads looked up one
  // iteration earlier (offset_table), which keeps the block-table latency and the index math
  // off the loop's path.
  auto load_kv = [&](int tile, int stage, bool from_table) {
    const int tile_start = kv_lo + tile * kKvTile;
    const uint32_t k_dst = smem_kv + stage * S::kStageBytes;
    const uint32_t v_dst = k_dst + S::kKvBytes;
    const int64_t* slot = offset_table + (tile & 1) * kKvTile;
#pragma unroll
    for (int i = 0; i < kKvTile / S::kRowsPerPass; ++i) {
      const int r = ld_row0 + i * S::kRowsPerPass;
      const int pos = tile_start + r;
      const bool valid = pos < kv_hi;
      int64_t offset = 0;
      if (from_table) {
        offset = slot[r];
      } else if (valid) {
        offset = key_offset(pos, __ldg(block_table + args.block_div.Div(pos)));
      }
      const uint32_t dst = ld_swz + i * S::kRowsPerPass * kRowBytes;
      CpAsync16(k_dst + dst, k_src + offset, valid ? 16 : 0);
      CpAsync16(v_dst + dst, v_src + offset, valid ? 16 : 0);
    }
  };
  // Threads [0, kKvTile) each own one key of a tile's offset table slot.
  const bool table_thread = tid < kKvTile;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < num_tiles) load_kv(s, s, /*from_table=*/false);
    CpAsyncCommit();  // the first group also carries Q
  }
  if (table_thread && kStages - 1 < num_tiles) {
    const int pos = kv_lo + (kStages - 1) * kKvTile + tid;
    offset_table[((kStages - 1) & 1) * kKvTile + tid] =
        pos < kv_hi ? key_offset(pos, __ldg(block_table + args.block_div.Div(pos))) : 0;
  }

  // This thread's rows: warp rows [warp * 16 * kMTiles, ...), in each 16-row MMA tile the rows
  // lane / 4 (half 0) and lane / 4 + 8 (half 1). limit = the last key position the row may see.
  int limit[kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = warp * 16 * kMTiles + mt * 16 + h * 8 + lane / 4;
      const int token = args.group_div.Div(item.row_begin + r);
      limit[mt][h] = min(prefix + token, item.kv_end - 1);
    }
  }

  float acc_o[kMTiles][kDTiles][4];
  float row_max[kMTiles][2];
  float row_sum[kMTiles][2];  // this thread's share; summed over the quad at the end
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int d = 0; d < kDTiles; ++d) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[mt][d][e] = 0.0f;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      row_max[mt][h] = -INFINITY;
      row_sum[mt][h] = 0.0f;
    }
  }

  // Per-lane ldmatrix addresses (see Swizzle; the row's low three bits are lane % 8 in every case).
  //   Q (A operand):  row lane % 16, chunk 2k + lane / 16.
  //   K (B operand):  key (lane / 16) * 8 + lane % 8, chunk 2k + (lane / 8) % 2.
  //   V (B operand, transposed): key ((lane / 8) % 2) * 8 + lane % 8, chunk 2n + lane / 16.
  // Every tile starts on a 1 KB boundary and rows are 128 or 256 bytes, so the swizzled chunk
  // (2k + bit) ^ (lane % 8) is the k = 0 address xor (2k << 4): one LOP per ldmatrix and no
  // per-k registers.
  const uint32_t q_addr = smem_q + (warp * 16 * kMTiles + lane % 16) * kRowBytes +
                          (((lane / 16) ^ (lane % 8)) << 4);
  const uint32_t k_lane = ((lane / 16) * 8 + lane % 8) * kRowBytes +
                          ((((lane / 8) % 2) ^ (lane % 8)) << 4);
  const uint32_t v_lane = (((lane / 8) % 2) * 8 + lane % 8) * kRowBytes +
                          (((lane / 16) ^ (lane % 8)) << 4);
  const float scale_log2 = args.scale_log2;

  for (int tile = 0; tile < num_tiles; ++tile) {
    CpAsyncWait<kStages - 2>();
    // Tile `tile` has landed for every thread; stage (tile - 1) % kStages and the table slot read
    // last iteration are free; the slot written last iteration is visible.
    __syncthreads();
    if (tile + kStages - 1 < num_tiles) {
      load_kv(tile + kStages - 1, (tile + kStages - 1) % kStages, /*from_table=*/true);
    }
    CpAsyncCommit();
    // Look up the blocks of tile + kStages now; the offsets are stored after this tile's math.
    const int fill_tile = tile + kStages;
    const bool fill = table_thread && fill_tile < num_tiles;
    const int fill_pos = kv_lo + fill_tile * kKvTile + tid;
    int fill_block = 0;
    if (fill && fill_pos < kv_hi) fill_block = __ldg(block_table + args.block_div.Div(fill_pos));

    const int stage = tile % kStages;
    const uint32_t k_addr = smem_kv + stage * S::kStageBytes + k_lane;
    const uint32_t v_addr = smem_kv + stage * S::kStageBytes + S::kKvBytes + v_lane;
    const int tile_start = kv_lo + tile * kKvTile;

    // S = Q K^T for this thread's rows and the tile's 64 keys (8 n8 tiles).
    float acc_s[kMTiles][kKvTile / 8][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int n = 0; n < kKvTile / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_s[mt][n][e] = 0.0f;
      }
    }
#pragma unroll
    for (int k = 0; k < kHeadDim / 16; ++k) {
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        LdMatrixX4(a[mt], (q_addr ^ (k << 5)) + mt * 16 * kRowBytes);
      }
#pragma unroll
      for (int np = 0; np < kKvTile / 16; ++np) {
        uint32_t b[4];
        LdMatrixX4(b, (k_addr ^ (k << 5)) + np * 16 * kRowBytes);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          Dtype<T>::Mma(acc_s[mt][2 * np], a[mt], b[0], b[1]);
          Dtype<T>::Mma(acc_s[mt][2 * np + 1], a[mt], b[2], b[3]);
        }
      }
    }

    // Causal and chunk-end mask, only on tiles that reach past some row's limit (the diagonal
    // and the chunk's last tile).
    if (tile_start + kKvTile > full_hi) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int n = 0; n < kKvTile / 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = tile_start + n * 8 + (lane % 4) * 2 + (e & 1);
            if (key > limit[mt][e / 2]) acc_s[mt][n][e] = -INFINITY;
          }
        }
      }
    }

    // Online softmax in the log2 domain, with a lazily moved maximum: the exponent base of a row
    // only moves when the tile's maximum exceeds it by more than kRescaleSlack (p then stays
    // below 2^kRescaleSlack, harmless in float and in P's 16-bit type), and the warp rescales
    // its outputs only when one of its rows moved. The result is exact either way, because o and
    // the row sum always share the base; in long prompts most tiles skip the rescale. A row that
    // has seen no key keeps max = -inf and uses base 0, so exp2(-inf - base) = 0, never NaN.
    constexpr float kRescaleSlack = 8.0f;
    float tile_max[kMTiles][2];
    bool moved = false;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < kKvTile / 8; ++n) {
          mx = fmaxf(mx, fmaxf(acc_s[mt][n][2 * h], acc_s[mt][n][2 * h + 1]));
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        tile_max[mt][h] = mx * scale_log2;
        moved |= tile_max[mt][h] > row_max[mt][h] + kRescaleSlack;
      }
    }
    if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float new_max = fmaxf(row_max[mt][h], tile_max[mt][h]);
          const float correction =
              Exp2(row_max[mt][h] - (new_max == -INFINITY ? 0.0f : new_max));
          row_max[mt][h] = new_max;
          row_sum[mt][h] *= correction;
#pragma unroll
          for (int d = 0; d < kDTiles; ++d) {
            acc_o[mt][d][2 * h] *= correction;
            acc_o[mt][d][2 * h + 1] *= correction;
          }
        }
      }
    }
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float base = row_max[mt][h] == -INFINITY ? 0.0f : row_max[mt][h];
        float sum = 0.0f;
#pragma unroll
        for (int n = 0; n < kKvTile / 8; ++n) {
#pragma unroll
          for (int e = 2 * h; e < 2 * h + 2; ++e) {
            const float p = Exp2(fmaf(acc_s[mt][n][e], scale_log2, -base));
            acc_s[mt][n][e] = p;
            sum += p;
          }
        }
        row_sum[mt][h] += sum;
      }
    }

    // O += P V: P's accumulator layout is the A-operand layout once packed to 16 bits.
#pragma unroll
    for (int k = 0; k < kKvTile / 16; ++k) {
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        a[mt][0] = Dtype<T>::Pack(acc_s[mt][2 * k][0], acc_s[mt][2 * k][1]);
        a[mt][1] = Dtype<T>::Pack(acc_s[mt][2 * k][2], acc_s[mt][2 * k][3]);
        a[mt][2] = Dtype<T>::Pack(acc_s[mt][2 * k + 1][0], acc_s[mt][2 * k + 1][1]);
        a[mt][3] = Dtype<T>::Pack(acc_s[mt][2 * k + 1][2], acc_s[mt][2 * k + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < kHeadDim / 16; ++dp) {
        uint32_t b[4];
        LdMatrixX4Trans(b, (v_addr ^ (dp << 5)) + k * 16 * kRowBytes);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          Dtype<T>::Mma(acc_o[mt][2 * dp], a[mt], b[0], b[1]);
          Dtype<T>::Mma(acc_o[mt][2 * dp + 1], a[mt], b[2], b[3]);
        }
      }
    }
    if (fill) {
      offset_table[(fill_tile & 1) * kKvTile + tid] =
          fill_pos < kv_hi ? key_offset(fill_pos, fill_block) : 0;
    }
  }
  CpAsyncWait<0>();  // nothing may still be copying into shared memory when the CTA exits

  // Epilogue: finish the row sums over the quad, normalise, write o or the partial slot.
  const int rows_in_item = item.row_end - item.row_begin;
  T* o = static_cast<T*>(args.o);
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = row_sum[mt][h];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
      const int r = warp * 16 * kMTiles + mt * 16 + h * 8 + lane / 4;
      if (r >= rows_in_item) continue;
      const int row = item.row_begin + r;
      const int col = (lane % 4) * 2;
      if (item.partial_slot < 0) {
        const int token = args.group_div.Div(row);
        const int head = kv_head * group + (row - token * group);
        T* dst = o + static_cast<int64_t>(q_start + token) * args.o_stride + head * kHeadDim;
#pragma unroll
        for (int d = 0; d < kDTiles; ++d) {
          *reinterpret_cast<uint32_t*>(dst + d * 8 + col) =
              Dtype<T>::Pack(acc_o[mt][d][2 * h] * inv, acc_o[mt][d][2 * h + 1] * inv);
        }
      } else {
        const int64_t slot_row =
            (static_cast<int64_t>(item.partial_slot) * args.num_kv_heads + kv_head) * kTileRows + r;
        float* dst = args.partial_o + slot_row * kHeadDim;
#pragma unroll
        for (int d = 0; d < kDTiles; ++d) {
          *reinterpret_cast<float2*>(dst + d * 8 + col) =
              make_float2(acc_o[mt][d][2 * h] * inv, acc_o[mt][d][2 * h + 1] * inv);
        }
        if (lane % 4 == 0) {
          args.partial_lse[slot_row] = sum > 0.0f ? row_max[mt][h] + __log2f(sum) : -INFINITY;
        }
      }
    }
  }
}

template <typename T, int kHeadDim, int kTileRows>
int SharedMemoryBytes() {
  return Shape<kHeadDim, kTileRows>::kSmemBytes;
}

template <typename T, int kHeadDim, int kTileRows>
cudaError_t LaunchPrefillKernel(const KernelArgs& args, int num_items, cudaStream_t stream) {
  constexpr int kSmem = Shape<kHeadDim, kTileRows>::kSmemBytes;
  auto* kernel = &PrefillAttentionKernel<T, kHeadDim, kTileRows>;
  // Shared memory past 48 KB must be opted into once per device; the flags remember which
  // devices did (a set bit is never cleared, so a race only repeats an idempotent call).
  static std::atomic<uint64_t> configured{0};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const uint64_t bit = device < 64 ? (uint64_t{1} << device) : 0;
  if (bit == 0 || (configured.load(std::memory_order_acquire) & bit) == 0) {
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    if (err != cudaSuccess) return err;
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                               cudaSharedmemCarveoutMaxShared);
    if (err != cudaSuccess) return err;
    configured.fetch_or(bit, std::memory_order_release);
  }
  const dim3 grid(num_items, args.num_kv_heads);
  kernel<<<grid, kThreads, kSmem, stream>>>(args);
  return cudaGetLastError();
}

#define KILN_INSTANTIATE_PREFILL(T, HEAD_DIM, TILE_ROWS)                                       \
  template cudaError_t LaunchPrefillKernel<T, HEAD_DIM, TILE_ROWS>(const KernelArgs&, int,    \
                                                                    cudaStream_t);            \
  template int SharedMemoryBytes<T, HEAD_DIM, TILE_ROWS>();

}  // namespace prefill_internal
}  // namespace kiln

#endif  // KILN_ATTENTION_PREFILL_KERNEL_IMPL_CUH_
