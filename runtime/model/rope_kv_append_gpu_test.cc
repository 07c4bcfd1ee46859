// The fused RoPE + KV append against the two kernels it replaces (LaunchRope, then attention's
// AppendKv with the same plan), bit for bit: the rotated q in qkv and both whole cache pools, for
// decode and prefill sequences, an empty sequence, padding rows and unassigned table entries;
// and each appended token's v at the slot a CPU mapping computes.
#include "runtime/model/rope_kv_append.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "attention/attention_params.h"
#include "attention/paged_kv_cache.h"
#include "attention/paged_kv_layout.h"
#include "gtest/gtest.h"
#include "runtime/model/internal/gpu_test_helpers.h"
#include "runtime/model/rope.h"

namespace kiln {
namespace {

using testing_internal::DeviceVector;
using testing_internal::GpuTest;

class RopeKvAppendGpuTest : public GpuTest {};

struct Shape {
  int heads, kv_heads, head_dim, block_size;
  RopeScaling scaling;  // none unless set
};

TEST_F(RopeKvAppendGpuTest, EqualsRopeThenAppendBitForBit) {
  for (const Shape& s : {Shape{4, 2, 64, 16}, Shape{32, 8, 64, 64}, Shape{16, 4, 128, 16},
                         Shape{32, 8, 64, 16, RopeScaling::Llama3(32, 1, 4, 8192)},
                         Shape{16, 4, 128, 16, RopeScaling::Llama3(8, 1, 4, 8192)}}) {
    SCOPED_TRACE(::testing::Message() << "heads " << s.heads << "/" << s.kv_heads << " × "
                                      << s.head_dim << ", block " << s.block_size << ", scaling "
                                      << s.scaling.ToString());
    // Sequences: decodes, a prefill chunk, an empty one, a long one; then padding rows.
    const std::vector<int> q_lens = {1, 1, 7, 0, 20, 1};
    const std::vector<int> kv_lens = {10, 65, 30, 5, 100, RandomInt(1, 300)};
    const int max_seqs = static_cast<int>(q_lens.size()) + 1;  // one unused sequence
    std::vector<int32_t> q_start(max_seqs + 1, 0);
    for (int i = 0; i < max_seqs; ++i) {
      q_start[i + 1] = q_start[i] + (i < static_cast<int>(q_lens.size()) ? q_lens[i] : 0);
    }
    std::vector<int32_t> kv_len(max_seqs, 0);
    std::copy(kv_lens.begin(), kv_lens.end(), kv_len.begin());
    const int real_tokens = q_start[max_seqs];
    const int num_tokens = real_tokens + 5;  // padding rows

    const int max_blocks = (300 + s.block_size - 1) / s.block_size;
    const int num_blocks = max_seqs * max_blocks + 3;
    std::vector<int32_t> blocks(num_blocks);
    for (int i = 0; i < num_blocks; ++i) blocks[i] = i;
    std::shuffle(blocks.begin(), blocks.end(), rng_);
    std::vector<int32_t> table(static_cast<size_t>(max_seqs) * max_blocks, -1);
    int next = 0;
    for (int seq = 0; seq < max_seqs; ++seq) {
      const int used = (kv_len[seq] + s.block_size - 1) / s.block_size;
      for (int b = 0; b < used; ++b) {
        table[static_cast<size_t>(seq) * max_blocks + b] = blocks[next++];
      }
    }
    std::vector<int32_t> positions(num_tokens);
    for (auto& p : positions) p = RandomInt(1, 200000);  // position 0 would not rotate

    const int row = (s.heads + 2 * s.kv_heads) * s.head_dim;
    const std::vector<uint16_t> qkv = RandomBf16(static_cast<size_t>(num_tokens) * row, -2.f, 2.f);
    const PagedKvLayout layout{num_blocks, s.block_size, s.kv_heads, s.head_dim,
                               AttentionDtype::kBf16};
    const size_t pool_elems = layout.PoolBytes() / 2;
    const std::vector<uint16_t> pool = RandomBf16(pool_elems);

    DeviceVector<int32_t> q_start_dev(q_start, stream()), kv_len_dev(kv_len, stream()),
        table_dev(table, stream()), positions_dev(positions, stream());
    DeviceVector<uint16_t> qkv_ref(qkv, stream()), qkv_fused(qkv, stream());
    DeviceVector<uint16_t> k_ref(pool, stream()), v_ref(pool, stream()), k_fused(pool, stream()),
        v_fused(pool, stream());

    AttentionPlanPartDevice plan;
    plan.seq_q_start = q_start_dev.get();
    plan.seq_kv_len = kv_len_dev.get();
    plan.max_seqs = max_seqs;
    const double theta = 500000.0;

    // The two kernels the fused one replaces.
    auto* qkv_r = reinterpret_cast<__nv_bfloat16*>(qkv_ref.get());
    ASSERT_EQ(LaunchRope(qkv_r, positions_dev.get(), num_tokens, s.heads, s.kv_heads, s.head_dim,
                         theta, s.scaling, stream()),
              cudaSuccess);
    AppendKvParams append;
    append.k = qkv_r + s.heads * s.head_dim;
    append.k_stride = row;
    append.v = qkv_r + (s.heads + s.kv_heads) * s.head_dim;
    append.v_stride = row;
    append.max_tokens = num_tokens;
    append.plan = plan;
    PagedKvDevice kv_ref;
    kv_ref.k_cache = k_ref.get();
    kv_ref.v_cache = v_ref.get();
    kv_ref.block_table = table_dev.get();
    kv_ref.max_blocks_per_seq = max_blocks;
    kv_ref.block_size = s.block_size;
    ASSERT_TRUE(AppendKv(append, layout, kv_ref, k_ref.get(), v_ref.get(), stream()).ok());

    RopeKvAppendParams p;
    p.qkv = reinterpret_cast<__nv_bfloat16*>(qkv_fused.get());
    p.positions = positions_dev.get();
    p.num_tokens = num_tokens;
    p.heads = s.heads;
    p.kv_heads = s.kv_heads;
    p.head_dim = s.head_dim;
    p.theta = theta;
    p.rope_scaling = s.scaling;
    p.plan = plan;
    p.kv = kv_ref;
    p.kv.k_cache = k_fused.get();
    p.kv.v_cache = v_fused.get();
    ASSERT_TRUE(RopeKvAppendSupports(p));
    ASSERT_EQ(LaunchRopeKvAppend(p, stream()), cudaSuccess);

    const std::vector<uint16_t> qkv_a = qkv_ref.Download(stream());
    const std::vector<uint16_t> qkv_b = qkv_fused.Download(stream());
    // q rotated identically; v untouched by both.
    for (int t = 0; t < num_tokens; ++t) {
      const size_t at = static_cast<size_t>(t) * row;
      ASSERT_EQ(std::memcmp(&qkv_a[at], &qkv_b[at], 2 * s.heads * s.head_dim), 0) << "token " << t;
      const size_t v_at = at + (s.heads + s.kv_heads) * s.head_dim;
      ASSERT_EQ(std::memcmp(&qkv_b[v_at], &qkv[v_at], 2 * s.kv_heads * s.head_dim), 0);
      // And q really rotated (positions are never all zero here).
      EXPECT_NE(std::memcmp(&qkv_b[at], &qkv[at], 2 * s.heads * s.head_dim), 0) << "token " << t;
    }
    const std::vector<uint16_t> ka = k_ref.Download(stream()), kb = k_fused.Download(stream());
    const std::vector<uint16_t> va = v_ref.Download(stream()), vb = v_fused.Download(stream());
    EXPECT_EQ(std::memcmp(ka.data(), kb.data(), 2 * pool_elems), 0);
    EXPECT_EQ(std::memcmp(va.data(), vb.data(), 2 * pool_elems), 0);

    // Each real token's v sits where a CPU mapping puts it.
    int appended = 0;
    for (int seq = 0; seq < max_seqs; ++seq) {
      for (int j = 0; j < q_start[seq + 1] - q_start[seq]; ++j) {
        const int token = q_start[seq] + j;
        const int pos = kv_len[seq] - (q_start[seq + 1] - q_start[seq]) + j;
        if (pos < 0) continue;
        const int64_t slot =
            int64_t{table[static_cast<size_t>(seq) * max_blocks + pos / s.block_size]} *
                s.block_size +
            pos % s.block_size;
        for (int h = 0; h < s.kv_heads; ++h) {
          const size_t src =
              static_cast<size_t>(token) * row + (s.heads + s.kv_heads + h) * s.head_dim;
          ASSERT_EQ(std::memcmp(&vb[layout.ElementOffset(slot, h)], &qkv[src], 2 * s.head_dim), 0)
              << "token " << token << " head " << h;
        }
        ++appended;
      }
    }
    EXPECT_EQ(appended, real_tokens);
  }
}

TEST_F(RopeKvAppendGpuTest, RefusesMissingInputs) {
  DeviceVector<uint16_t> buf(1024);
  DeviceVector<int32_t> ints(64);
  RopeKvAppendParams p;
  p.qkv = reinterpret_cast<__nv_bfloat16*>(buf.get());
  p.positions = ints.get();
  p.num_tokens = 1;
  p.heads = 2;
  p.kv_heads = 1;
  p.head_dim = 64;
  p.theta = 10000.0;
  p.plan.seq_q_start = ints.get();
  p.plan.seq_kv_len = ints.get();
  p.plan.max_seqs = 1;
  p.kv.k_cache = buf.get();
  p.kv.v_cache = buf.get();
  p.kv.block_table = ints.get();
  p.kv.max_blocks_per_seq = 1;
  p.kv.block_size = 16;
  EXPECT_TRUE(RopeKvAppendSupports(p));
  RopeKvAppendParams bad = p;
  bad.head_dim = 72;  // not a multiple of 16
  EXPECT_FALSE(RopeKvAppendSupports(bad));
  bad = p;
  bad.plan.seq_q_start = nullptr;
  EXPECT_FALSE(RopeKvAppendSupports(bad));
  bad = p;
  bad.kv.block_size = 24;
  EXPECT_FALSE(RopeKvAppendSupports(bad));
  bad = p;
  bad.rope_scaling = RopeScaling::Llama3(8, 4, 1, 8192);  // high_freq_factor below low
  EXPECT_FALSE(RopeKvAppendSupports(bad));
  bad = p;
  bad.theta = 0.0;
  EXPECT_EQ(LaunchRopeKvAppend(bad, stream()), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace kiln
