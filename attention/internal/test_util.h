// Internal, tests and benchmarks only: host conversions between float and the 16-bit element
// types, a fast seeded generator for filling large host arrays, and params over host stand-ins
// for host-only tests of the launchers' checks.
//
//   HostStandIns s;
//   DecodeAttentionParams p;
//   SetHostShapeAndCache(&s, &p);
//   SetHostPlanPart(&s, &p.plan);
//   EXPECT_TRUE(ValidateDecodeAttentionParams(p).ok());
#ifndef KILN_ATTENTION_INTERNAL_TEST_UTIL_H_
#define KILN_ATTENTION_INTERNAL_TEST_UTIL_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "attention/attention_params.h"
#include "attention/rope_frequency.h"

namespace kiln {
namespace attention_internal {

// Bits of `x` rounded to nearest even in `dtype`.
inline uint16_t ToBits(float x, AttentionDtype dtype) {
  if (dtype == AttentionDtype::kBf16) {
    const __nv_bfloat16_raw raw = __float2bfloat16_rn(x);
    return raw.x;
  }
  const __half_raw raw = __float2half_rn(x);
  return raw.x;
}

// The float value of 16-bit `bits` in `dtype`.
inline float FromBits(uint16_t bits, AttentionDtype dtype) {
  if (dtype == AttentionDtype::kBf16) {
    __nv_bfloat16_raw raw;
    raw.x = bits;
    return __bfloat162float(__nv_bfloat16(raw));
  }
  __half_raw raw;
  raw.x = bits;
  return __half2float(__half(raw));
}

// A quiet NaN in `dtype`: stale or unwritten memory in tests.
inline uint16_t NanBits(AttentionDtype dtype) {
  return dtype == AttentionDtype::kBf16 ? 0x7fc0 : 0x7e00;
}

// xorshift64*: fast, seeded, good enough for test data.
class FastRng {
 public:
  explicit FastRng(uint64_t seed) : state_(seed * 0x9e3779b97f4a7c15ull + 1) {}
  uint64_t Next() {
    state_ ^= state_ >> 12;
    state_ ^= state_ << 25;
    state_ ^= state_ >> 27;
    return state_ * 0x2545f4914f6cdd1dull;
  }
  // Uniform in [lo, hi).
  float Uniform(float lo, float hi) {
    return lo + (hi - lo) * static_cast<float>(Next() >> 40) * (1.f / 16777216.f);
  }

 private:
  uint64_t state_;
};

// Host memory that stands in for the device buffers of attention params in host-only tests: the
// launchers' checks test pointers for null and 16-byte alignment and never read them, and such
// tests launch nothing. Every array starts 16-byte aligned. Layout of `buffers` as the Set*
// helpers below use it: q at 0, o at 4, k_cache at 8, v_cache at 12, block_table at 16,
// seq_q_start at 20, seq_kv_len at 24, RoPE positions at 32, new k at 36, new v at 40.
struct HostStandIns {
  alignas(16) int32_t buffers[64] = {};
  alignas(16) float partial[64] = {};
  alignas(16) AttentionWorkItem work_items[4] = {};
  alignas(16) AttentionMergeItem merge_items[4] = {};
  alignas(16) AttentionPlanHeader header = {};
  alignas(16) int32_t merge_counters[4] = {};
};

// Sets in `p` a shape every check accepts (8 query heads over 2 KV heads, head_dim 64), q, o and
// a paged cache of 16-token blocks, 4 per sequence, all pointing into `s`, which must outlive
// `p`. `Params`: DecodeAttentionParams or AttentionStepParams. Thread-compatible.
template <typename Params>
void SetHostShapeAndCache(HostStandIns* s, Params* p) {
  p->num_q_heads = 8;
  p->num_kv_heads = 2;
  p->head_dim = 64;
  p->q = &s->buffers[0];
  p->o = &s->buffers[4];
  p->kv.k_cache = &s->buffers[8];
  p->kv.v_cache = &s->buffers[12];
  p->kv.block_table = &s->buffers[16];
  p->kv.block_size = 16;
  p->kv.max_blocks_per_seq = 4;
}

// Sets `part` to one work item of 4 tile rows in `s` (which must outlive it), without a
// workspace or merge. Thread-compatible.
inline void SetHostPlanPart(HostStandIns* s, AttentionPlanPartDevice* part) {
  part->work_items = s->work_items;
  part->seq_q_start = &s->buffers[20];
  part->seq_kv_len = &s->buffers[24];
  part->work_capacity = 1;
  part->tile_rows = 4;
}

// Lets `part` split: 2 slots of the partial workspace in `s` (partial_o, then partial_lse 32
// floats on) and one merge item; the header and merge counters are left as they are. `s` must
// outlive `part`. Thread-compatible.
inline void SetHostSplit(HostStandIns* s, AttentionPlanPartDevice* part) {
  part->slot_capacity = 2;
  part->merge_capacity = 1;
  part->merge_items = s->merge_items;
  part->partial_o = s->partial;
  part->partial_lse = s->partial + 32;
}

// Sets in `r` a RoPE + KV append every check accepts: positions, the new k and v in `s` (which
// must outlive `r`) with 128 elements between tokens, RoPE base `theta` and `scaling`.
// Thread-compatible.
inline void SetHostRopeAppend(HostStandIns* s, double theta, const RopeScaling& scaling,
                              DecodeRopeAppendDevice* r) {
  r->positions = &s->buffers[32];
  r->theta = theta;
  r->scaling = scaling;
  r->k = &s->buffers[36];
  r->v = &s->buffers[40];
  r->kv_stride = 128;
}

}  // namespace attention_internal
}  // namespace kiln

#endif  // KILN_ATTENTION_INTERNAL_TEST_UTIL_H_
