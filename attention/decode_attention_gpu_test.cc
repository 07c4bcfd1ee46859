// GPU tests of the decode and merge kernels against a CPU float64 reference, and of graph
// replay against eager runs.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "attention/attention_params.h"
#include "attention/decode_kernel.h"
#include "attention/internal/test_util.h"
#include "attention/merge_kernel.h"
#include "attention/paged_kv_cache.h"
#include "attention/paged_kv_layout.h"
#include "attention/plan_buffers.h"
#include "attention/rope_frequency.h"
#include "attention/split_kv_planner.h"
#include "gtest/gtest.h"
#include "runtime/cuda/device_buffer.h"
#include "runtime/cuda/device_info.h"
#include "runtime/cuda/gpu_test_util.h"
#include "runtime/cuda/status.h"
#include "runtime/cuda/stream.h"

namespace kiln {
namespace {

using attention_internal::FastRng;
using attention_internal::FromBits;
using attention_internal::NanBits;
using attention_internal::ToBits;

#define ASSERT_OK(expr)                   \
  do {                                    \
    const absl::Status status_ = (expr);  \
    ASSERT_TRUE(status_.ok()) << status_; \
  } while (false)

#define ASSERT_CUDA(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

constexpr uint16_t kOutputPoison = 0xffff;  // NaN in bf16 and fp16

const char* Name(AttentionDtype d) { return d == AttentionDtype::kBf16 ? "bf16" : "fp16"; }

// Relative error tolerance: P and the output are rounded to the element type.
double Tolerance(AttentionDtype d) { return d == AttentionDtype::kBf16 ? 1.5e-2 : 3e-3; }

int SmCount() {
  auto info = DeviceInfo::Query(0);
  return info.ok() ? info->sm_count : 132;
}

// Everything one configuration needs: planner, plan buffers, a KV cache whose whole pool holds
// random values (stale positions included), q and o.
struct Harness {
  AttentionDtype dtype;
  int head_dim;
  int group;
  int kv_heads;
  int block_size;
  SplitKvPlannerOptions options;
  std::unique_ptr<SplitKvPlanner> planner;
  PlanBuffers buffers;
  PagedKvCache cache;
  std::vector<uint16_t> k_host, v_host, q_host;
  std::vector<size_t> stale_rows;  // pool offsets of rows the last step filled with NaN
  DeviceBuffer q, o;
  Stream stream;

  int q_heads() const { return group * kv_heads; }
  int max_tokens() const { return options.key.max_tokens; }
};

struct SetupSpec {
  AttentionDtype dtype = AttentionDtype::kBf16;
  int head_dim = 128;
  int group = 4;
  int kv_heads = 2;
  int block_size = 16;
  AttentionPlanKey key;
  int decode_tile_rows = 0;   // decode part (q_len 1)
  int prefill_tile_rows = 0;  // the decode kernel also runs this part (tile_rows <= 16)
  bool allow_split = true;
  int min_kv_chunk = 64;
  int pool_blocks = 0;
  uint64_t seed = 1;
};

absl::Status MakeSetup(const SetupSpec& spec, std::unique_ptr<Harness>* out) {
  auto s = std::make_unique<Harness>();
  s->dtype = spec.dtype;
  s->head_dim = spec.head_dim;
  s->group = spec.group;
  s->kv_heads = spec.kv_heads;
  s->block_size = spec.block_size;
  SplitKvPlannerOptions& o = s->options;
  o.num_q_heads = spec.group * spec.kv_heads;
  o.num_kv_heads = spec.kv_heads;
  o.head_dim = spec.head_dim;
  o.sm_count = SmCount();
  o.key = spec.key;
  for (PlanPartOptions* p : {&o.decode, &o.prefill}) {
    p->allow_split = spec.allow_split;
    p->min_kv_chunk = spec.min_kv_chunk;
    p->kv_granularity = 16;
  }
  o.decode.tile_rows = spec.decode_tile_rows;
  o.prefill.tile_rows = spec.prefill_tile_rows;
  ASSIGN_OR_RETURN(SplitKvPlanner planner, SplitKvPlanner::Create(o));
  s->planner = std::make_unique<SplitKvPlanner>(std::move(planner));
  ASSIGN_OR_RETURN(s->buffers, PlanBuffers::Create(s->planner->layout()));
  const PagedKvLayout layout{spec.pool_blocks, spec.block_size, spec.kv_heads, spec.head_dim,
                             spec.dtype};
  const int max_blocks = (spec.key.max_kv_len + spec.block_size - 1) / spec.block_size;
  ASSIGN_OR_RETURN(s->cache, PagedKvCache::Create(layout, spec.key.max_seqs, max_blocks));
  ASSIGN_OR_RETURN(s->stream, Stream::Create());
  // The whole pool is random: every block a table may point at holds data.
  FastRng rng(spec.seed);
  s->k_host.resize(layout.PoolBytes() / 2);
  s->v_host.resize(layout.PoolBytes() / 2);
  for (auto& x : s->k_host) x = ToBits(rng.Uniform(-1.f, 1.f), spec.dtype);
  for (auto& x : s->v_host) x = ToBits(rng.Uniform(-1.f, 1.f), spec.dtype);
  RETURN_IF_ERROR(ToStatus(cudaMemcpy(s->cache.k_cache(), s->k_host.data(), layout.PoolBytes(),
                                      cudaMemcpyHostToDevice),
                           "copy K"));
  RETURN_IF_ERROR(ToStatus(cudaMemcpy(s->cache.v_cache(), s->v_host.data(), layout.PoolBytes(),
                                      cudaMemcpyHostToDevice),
                           "copy V"));
  const size_t q_elems =
      static_cast<size_t>(spec.key.max_tokens) * s->q_heads() * spec.head_dim;
  s->q_host.resize(q_elems);
  ASSIGN_OR_RETURN(s->q, DeviceBuffer::Allocate(q_elems * 2, "q"));
  ASSIGN_OR_RETURN(s->o, DeviceBuffer::Allocate(q_elems * 2, "o"));
  *out = std::move(s);
  return absl::OkStatus();
}

// Assigns fresh scattered blocks to `seqs`, writes NaN into every position of those blocks at or
// beyond a sequence's kv_len (stale data must never leak), draws fresh q, and uploads all of it
// with the plan.
absl::Status CopyRow(Harness& s, size_t off) {
  RETURN_IF_ERROR(ToStatus(cudaMemcpy(static_cast<uint16_t*>(s.cache.k_cache()) + off,
                                      &s.k_host[off], s.head_dim * 2, cudaMemcpyHostToDevice),
                           "K row"));
  return ToStatus(cudaMemcpy(static_cast<uint16_t*>(s.cache.v_cache()) + off, &s.v_host[off],
                             s.head_dim * 2, cudaMemcpyHostToDevice),
                  "V row");
}

absl::Status PrepareStep(Harness& s, const std::vector<SeqLens>& seqs, uint64_t seed) {
  // Rows the previous step made stale get fresh random values again.
  FastRng refill(seed ^ 0x5eed);
  for (size_t off : s.stale_rows) {
    for (int d = 0; d < s.head_dim; ++d) {
      s.k_host[off + d] = ToBits(refill.Uniform(-1.f, 1.f), s.dtype);
      s.v_host[off + d] = ToBits(refill.Uniform(-1.f, 1.f), s.dtype);
    }
    RETURN_IF_ERROR(CopyRow(s, off));
  }
  s.stale_rows.clear();
  BlockTable& table = s.cache.block_table();
  for (int i = 0; i < table.max_seqs(); ++i) table.Release(i);
  const PagedKvLayout& layout = s.cache.layout();
  std::vector<int32_t> order(layout.num_blocks);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 gen(static_cast<uint32_t>(seed));
  std::shuffle(order.begin(), order.end(), gen);
  RETURN_IF_ERROR(table.SetFreeOrder(order));
  for (int i = 0; i < static_cast<int>(seqs.size()); ++i) {
    RETURN_IF_ERROR(table.Reserve(i, seqs[i].kv_len));
  }
  const uint16_t nan = NanBits(s.dtype);
  for (int i = 0; i < static_cast<int>(seqs.size()); ++i) {
    const int end = table.blocks_of(i) * s.block_size;
    for (int pos = seqs[i].kv_len; pos < end; ++pos) {
      const int64_t slot = static_cast<int64_t>(table.at(i, pos / s.block_size)) * s.block_size +
                           pos % s.block_size;
      for (int h = 0; h < s.kv_heads; ++h) {
        const size_t off = layout.ElementOffset(slot, h);
        for (int d = 0; d < s.head_dim; ++d) s.k_host[off + d] = s.v_host[off + d] = nan;
        RETURN_IF_ERROR(CopyRow(s, off));
        s.stale_rows.push_back(off);
      }
    }
  }
  FastRng rng(seed * 7 + 3);
  for (auto& x : s.q_host) x = ToBits(rng.Uniform(-2.f, 2.f), s.dtype);
  RETURN_IF_ERROR(ToStatus(cudaMemcpy(s.q.data(), s.q_host.data(), s.q_host.size() * 2,
                                      cudaMemcpyHostToDevice),
                           "copy q"));
  RETURN_IF_ERROR(s.cache.UploadBlockTable(s.stream.get()));
  RETURN_IF_ERROR(s.planner->Plan(seqs, s.buffers.host_plan()).status());
  RETURN_IF_ERROR(s.buffers.Upload(s.stream.get()));
  // On the stream the kernels run on: a default-stream fill could land after their writes.
  return ToStatus(cudaMemsetAsync(s.o.data(), 0xff, s.o.size(), s.stream.get()), "poison o");
}

// Runs every enabled part of the plan through the decode kernel and the merge: fused into the
// decode kernel (merge counters), or as the separate merge kernel.
absl::Status RunParts(const Harness& s, bool fused_merge = true) {
  for (bool decode_part : {true, false}) {
    const PlanPartLayout& part =
        decode_part ? s.planner->layout().decode : s.planner->layout().prefill;
    if (!part.enabled) continue;
    DecodeAttentionParams p;
    p.dtype = s.dtype;
    p.num_q_heads = s.q_heads();
    p.num_kv_heads = s.kv_heads;
    p.head_dim = s.head_dim;
    p.q = s.q.data();
    p.o = s.o.data();
    p.kv = s.cache.device();
    p.plan = decode_part ? s.buffers.decode() : s.buffers.prefill();
    if (!fused_merge) p.plan.merge_counters = nullptr;
    RETURN_IF_ERROR(RunDecodeAttention(p, s.stream.get()));
  }
  return absl::OkStatus();
}

std::vector<uint16_t> ReadOutput(const Harness& s) {
  std::vector<uint16_t> out(s.o.size() / 2);
  cudaMemcpy(out.data(), s.o.data(), s.o.size(), cudaMemcpyDeviceToHost);
  return out;
}

// Compares `out` with a float64 reference over the step's tokens (relative Frobenius error),
// requires exact zeros for rows with no visible KV and untouched poison past the tokens.
void ExpectMatchesReference(const Harness& s, const std::vector<SeqLens>& seqs,
                            const std::vector<uint16_t>& out, const std::string& label) {
  const PagedKvLayout& layout = s.cache.layout();
  const BlockTable& table = s.cache.block_table();
  const int hq = s.q_heads();
  const int d = s.head_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  double err2 = 0, ref2 = 0;
  std::vector<double> kf, vf, q(d), scores, acc(d);
  int first_token = 0;
  for (int i = 0; i < static_cast<int>(seqs.size()); ++i) {
    const SeqLens& sl = seqs[i];
    for (int kvh = 0; kvh < s.kv_heads; ++kvh) {
      // This sequence's K and V rows of this head, through the block table, as doubles.
      kf.assign(static_cast<size_t>(sl.kv_len) * d, 0.0);
      vf.assign(static_cast<size_t>(sl.kv_len) * d, 0.0);
      for (int pos = 0; pos < sl.kv_len && sl.q_len > 0; ++pos) {
        const int64_t slot =
            static_cast<int64_t>(table.at(i, pos / s.block_size)) * s.block_size +
            pos % s.block_size;
        const size_t off = layout.ElementOffset(slot, kvh);
        for (int x = 0; x < d; ++x) {
          kf[static_cast<size_t>(pos) * d + x] = FromBits(s.k_host[off + x], s.dtype);
          vf[static_cast<size_t>(pos) * d + x] = FromBits(s.v_host[off + x], s.dtype);
        }
      }
      for (int j = 0; j < sl.q_len; ++j) {
        const int token = first_token + j;
        const int visible = std::max(0, sl.kv_len - sl.q_len + j + 1);
        for (int g = 0; g < s.group; ++g) {
          const int h = kvh * s.group + g;
          for (int x = 0; x < d; ++x) {
            q[x] = FromBits(s.q_host[(static_cast<size_t>(token) * hq + h) * d + x], s.dtype);
          }
          scores.assign(visible, 0.0);
          double mx = -INFINITY;
          for (int pos = 0; pos < visible; ++pos) {
            const double* k = &kf[static_cast<size_t>(pos) * d];
            double dot = 0;
            for (int x = 0; x < d; ++x) dot += q[x] * k[x];
            scores[pos] = dot * scale;
            mx = std::max(mx, scores[pos]);
          }
          std::fill(acc.begin(), acc.end(), 0.0);
          double sum = 0;
          for (int pos = 0; pos < visible; ++pos) {
            const double p = std::exp(scores[pos] - mx);
            const double* v = &vf[static_cast<size_t>(pos) * d];
            sum += p;
            for (int x = 0; x < d; ++x) acc[x] += p * v[x];
          }
          const uint16_t* orow = &out[(static_cast<size_t>(token) * hq + h) * d];
          for (int x = 0; x < d; ++x) {
            const double ref = visible > 0 ? acc[x] / sum : 0.0;
            const double got = FromBits(orow[x], s.dtype);
            ASSERT_FALSE(std::isnan(got)) << label << ": NaN or unwritten at token " << token
                                          << " head " << h << " dim " << x;
            if (visible == 0) {
              ASSERT_EQ(got, 0.0) << label << ": row without KV must be zero, token " << token;
            }
            err2 += (got - ref) * (got - ref);
            ref2 += ref * ref;
          }
        }
      }
    }
    first_token += sl.q_len;
  }
  const size_t row_elems = static_cast<size_t>(hq) * d;
  for (size_t e = static_cast<size_t>(first_token) * row_elems; e < out.size(); ++e) {
    ASSERT_EQ(out[e], kOutputPoison) << label << ": wrote past the step's tokens at " << e;
  }
  if (ref2 > 0) {
    const double rel = std::sqrt(err2 / ref2);
    EXPECT_LT(rel, Tolerance(s.dtype)) << label << ": relative error " << rel;
  }
}

// ---------------------------------------------------------------------------------------------
// Decode (q_len 1) against the reference, every dtype, head_dim, group and block size, split
// and unsplit, with lengths 0, 1 and block boundaries ± 1.

struct DecodeCase {
  AttentionDtype dtype;
  int head_dim;
  int group;
  int block_size;
};

class DecodeGpuTest : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(DecodeGpuTest, MatchesFloat64Reference) {
  KILN_REQUIRE_GPUS(1);
  const DecodeCase c = GetParam();
  const int bs = c.block_size;
  std::vector<SeqLens> seqs;
  for (int kv : {1, 2, 15, 16, 17, bs - 1, bs, bs + 1, 2 * bs - 1, 2 * bs + 1, 255, 256, 257, 1000,
                 1023, 1025, 3001}) {
    seqs.push_back({1, kv});
  }
  seqs.push_back({0, 9});  // an idle slot with history: no output row
  seqs.push_back({1, 0});  // a token with no KV at all: zeros
  for (int variant = 0; variant < 3; ++variant) {
    const bool split = variant < 2;
    const bool fused = variant == 0;
    SetupSpec spec;
    spec.dtype = c.dtype;
    spec.head_dim = c.head_dim;
    spec.group = c.group;
    spec.block_size = bs;
    spec.key = {24, 24, 4096};
    spec.decode_tile_rows = c.group;
    spec.allow_split = split;
    spec.pool_blocks = 16384 / bs;
    spec.seed = 17 + c.head_dim + c.group * 3 + bs;
    std::unique_ptr<Harness> s;
    ASSERT_OK(MakeSetup(spec, &s));
    for (int round = 0; round < 2; ++round) {
      std::vector<SeqLens> step = seqs;
      std::mt19937 gen(round + 5 * c.group);
      std::shuffle(step.begin(), step.end(), gen);
      ASSERT_OK(PrepareStep(*s, step, 1000 * round + c.head_dim + c.group));
      ASSERT_OK(RunParts(*s, fused));
      ASSERT_OK(s->stream.Synchronize());
      ExpectMatchesReference(
          *s, step, ReadOutput(*s),
          absl::StrCat(Name(c.dtype), " d", c.head_dim, " g", c.group, " bs", bs,
                       split ? (fused ? " split fused" : " split separate") : " unsplit",
                       " round ", round));
      if (HasFatalFailure()) return;
    }
  }
}

std::vector<DecodeCase> AllDecodeCases() {
  std::vector<DecodeCase> cases;
  for (AttentionDtype dt : {AttentionDtype::kBf16, AttentionDtype::kFp16}) {
    for (int d : {64, 128}) {
      for (int g : {1, 3, 4, 5, 7, 8}) {
        for (int bs : {16, 64}) cases.push_back({dt, d, g, bs});
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllShapes, DecodeGpuTest, ::testing::ValuesIn(AllDecodeCases()));

// Short multi-token queries through the decode kernel with 16-row tiles: tiles that straddle
// tokens, causal masking inside a tile, rows that see nothing (kv_len < q_len).
TEST(DecodeGpuTest, SixteenRowTilesMaskCausally) {
  KILN_REQUIRE_GPUS(1);
  for (AttentionDtype dt : {AttentionDtype::kBf16, AttentionDtype::kFp16}) {
    for (int g : {4, 5}) {
      SetupSpec spec;
      spec.dtype = dt;
      spec.head_dim = 128;
      spec.group = g;
      spec.block_size = 16;
      spec.key = {8, 40, 1024};
      spec.prefill_tile_rows = 16;
      spec.min_kv_chunk = 32;
      spec.pool_blocks = 8 * 1024 / 16;
      spec.seed = 5 + g;
      std::unique_ptr<Harness> s;
      ASSERT_OK(MakeSetup(spec, &s));
      const std::vector<SeqLens> seqs = {{2, 2},    {3, 700}, {7, 40}, {1, 17},
                                         {5, 3},    {4, 65},  {6, 1000}, {0, 3}};
      ASSERT_OK(PrepareStep(*s, seqs, 77 + g));
      ASSERT_OK(RunParts(*s));
      ASSERT_OK(s->stream.Synchronize());
      ExpectMatchesReference(*s, seqs, ReadOutput(*s), absl::StrCat(Name(dt), " 16-row g", g));
      if (HasFatalFailure()) return;
    }
  }
}

// 32K context split across the GPU, next to a 1-token and an odd-length sequence.
TEST(DecodeGpuTest, LongContext32K) {
  KILN_REQUIRE_GPUS(1);
  SetupSpec spec;
  spec.dtype = AttentionDtype::kBf16;
  spec.head_dim = 128;
  spec.group = 4;
  spec.kv_heads = 8;
  spec.block_size = 16;
  spec.key = {4, 4, 32768};
  spec.decode_tile_rows = 4;
  spec.min_kv_chunk = 256;
  spec.pool_blocks = (32768 + 16385 + 64) / 16 + 8;
  spec.seed = 32;
  std::unique_ptr<Harness> s;
  ASSERT_OK(MakeSetup(spec, &s));
  const std::vector<SeqLens> seqs = {{1, 32768}, {1, 1}, {1, 16385}};
  ASSERT_OK(PrepareStep(*s, seqs, 3232));
  auto summary = s->planner->Plan(seqs, s->buffers.host_plan());
  ASSERT_TRUE(summary.ok());
  EXPECT_GT(summary->decode.num_merge_items, 0) << "the long sequences should be split";
  ASSERT_OK(s->buffers.Upload(s->stream.get()));
  ASSERT_OK(RunParts(*s));
  ASSERT_OK(s->stream.Synchronize());
  ExpectMatchesReference(*s, seqs, ReadOutput(*s), "32K");
}

// ---------------------------------------------------------------------------------------------
// The merge kernel on hand-made partials: empty chunks weigh 0, all-empty rows are zeros, a
// single chunk is copied exactly, padding items write nothing.

TEST(MergeGpuTest, HandlesEmptyAllEmptyAndSingleSplits) {
  KILN_REQUIRE_GPUS(1);
  for (AttentionDtype dt : {AttentionDtype::kBf16, AttentionDtype::kFp16}) {
    for (int d : {64, 128}) {
      const int kv_heads = 2, group = 4, hq = 8, tile_rows = 8, slots = 6, tokens = 6;
      // Sequences: 0 = tokens [0, 1), 1 = [1, 3), 2 = [3, 4), 3 = [4, 6) (covered by padding).
      const std::vector<int32_t> q_start = {0, 1, 3, 4, 6};
      const std::vector<AttentionMergeItem> items = {
          {0, 0, 4, 0, 3},  // three chunks, the middle one empty (and NaN-filled)
          {1, 0, 8, 3, 2},  // rows 0..3 see nothing in either chunk; rows 4..7 do
          {2, 0, 4, 5, 1},  // one chunk: a copy
          {-1, 0, 0, 0, 0},  // padding
      };
      std::vector<float> po(static_cast<size_t>(slots) * kv_heads * tile_rows * d);
      std::vector<float> plse(static_cast<size_t>(slots) * kv_heads * tile_rows);
      FastRng rng(d + static_cast<int>(dt));
      for (auto& x : po) x = rng.Uniform(-1, 1);
      for (auto& x : plse) x = rng.Uniform(-4, 4);
      auto idx = [&](int slot, int head, int row) {
        return (static_cast<size_t>(slot) * kv_heads + head) * tile_rows + row;
      };
      for (int h = 0; h < kv_heads; ++h) {
        for (int r = 0; r < tile_rows; ++r) {
          plse[idx(1, h, r)] = -INFINITY;
          for (int x = 0; x < d; ++x) po[idx(1, h, r) * d + x] = NAN;
          if (r < 4) {
            plse[idx(3, h, r)] = plse[idx(4, h, r)] = -INFINITY;
            for (int x = 0; x < d; ++x) po[idx(3, h, r) * d + x] = po[idx(4, h, r) * d + x] = 0.f;
          }
        }
      }
      auto d_items = DeviceBuffer::Allocate(items.size() * sizeof(AttentionMergeItem), "items");
      auto d_start = DeviceBuffer::Allocate(q_start.size() * 4, "q_start");
      auto d_po = DeviceBuffer::Allocate(po.size() * 4, "partial_o");
      auto d_lse = DeviceBuffer::Allocate(plse.size() * 4, "partial_lse");
      auto d_o = DeviceBuffer::Allocate(static_cast<size_t>(tokens) * hq * d * 2, "o");
      ASSERT_TRUE(d_items.ok() && d_start.ok() && d_po.ok() && d_lse.ok() && d_o.ok());
      ASSERT_CUDA(
          cudaMemcpy(d_items->data(), items.data(), d_items->size(), cudaMemcpyHostToDevice));
      ASSERT_CUDA(
          cudaMemcpy(d_start->data(), q_start.data(), d_start->size(), cudaMemcpyHostToDevice));
      ASSERT_CUDA(cudaMemcpy(d_po->data(), po.data(), d_po->size(), cudaMemcpyHostToDevice));
      ASSERT_CUDA(cudaMemcpy(d_lse->data(), plse.data(), d_lse->size(), cudaMemcpyHostToDevice));
      ASSERT_CUDA(cudaMemset(d_o->data(), 0xff, d_o->size()));
      AttentionMergeParams m;
      m.dtype = dt;
      m.num_q_heads = hq;
      m.num_kv_heads = kv_heads;
      m.head_dim = d;
      m.o = d_o->data();
      m.plan.seq_q_start = d_start->as<int32_t>();
      m.plan.merge_items = d_items->as<AttentionMergeItem>();
      m.plan.merge_capacity = static_cast<int>(items.size());
      m.plan.tile_rows = tile_rows;
      m.plan.partial_o = d_po->as<float>();
      m.plan.partial_lse = d_lse->as<float>();
      m.plan.slot_capacity = slots;
      ASSERT_OK(LaunchAttentionMerge(m, nullptr));
      ASSERT_CUDA(cudaDeviceSynchronize());
      std::vector<uint16_t> out(static_cast<size_t>(tokens) * hq * d);
      ASSERT_CUDA(cudaMemcpy(out.data(), d_o->data(), d_o->size(), cudaMemcpyDeviceToHost));
      double err2 = 0, ref2 = 0;
      for (int it = 0; it < 3; ++it) {
        const AttentionMergeItem& mi = items[it];
        for (int h = 0; h < kv_heads; ++h) {
          for (int r = mi.row_begin; r < mi.row_end; ++r) {
            double mx = -INFINITY;
            for (int k = 0; k < mi.num_slots; ++k) {
              mx = std::max<double>(mx, plse[idx(mi.first_slot + k, h, r)]);
            }
            const int token = q_start[mi.seq] + r / group;
            const int head = h * group + r % group;
            for (int x = 0; x < d; ++x) {
              double num = 0, den = 0;
              for (int k = 0; k < mi.num_slots; ++k) {
                const double l = plse[idx(mi.first_slot + k, h, r)];
                if (std::isinf(l)) continue;
                const double w = std::exp2(l - mx);
                num += w * po[idx(mi.first_slot + k, h, r) * d + x];
                den += w;
              }
              const double ref = den > 0 ? num / den : 0.0;
              const uint16_t bits = out[(static_cast<size_t>(token) * hq + head) * d + x];
              const double got = FromBits(bits, dt);
              ASSERT_FALSE(std::isnan(got)) << "merge item " << it << " row " << r;
              if (den == 0) {
                ASSERT_EQ(got, 0.0) << "all-empty row must be zero";
              }
              if (mi.num_slots == 1) {
                ASSERT_EQ(bits, ToBits(po[idx(mi.first_slot, h, r) * d + x], dt))
                    << "a single split must be copied exactly";
              }
              err2 += (got - ref) * (got - ref);
              ref2 += ref * ref;
            }
          }
        }
      }
      EXPECT_LT(std::sqrt(err2 / ref2), Tolerance(dt) / 2) << Name(dt) << " d" << d;
      // Tokens 4 and 5 belong to the padding item: untouched.
      for (size_t e = 4 * static_cast<size_t>(hq) * d; e < out.size(); ++e) {
        ASSERT_EQ(out[e], kOutputPoison) << "padding merge item wrote at " << e;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// RoPE + KV append in the kernel: q arrives unrotated and each sequence's new token (position
// kv_len − 1) only as new k and v, its cache slot stale (NaN). The output must match the float64
// reference over the rotated q and K, the slot must then hold the rotated k and the v, and
// nothing else in the cache may change.

// A device copy of `bytes` of host data.
absl::StatusOr<DeviceBuffer> Upload(const void* data, size_t bytes, const char* name) {
  ASSIGN_OR_RETURN(DeviceBuffer buffer, DeviceBuffer::Allocate(bytes, name));
  RETURN_IF_ERROR(
      ToStatus(cudaMemcpy(buffer.data(), data, bytes, cudaMemcpyHostToDevice), name));
  return buffer;
}

// x rotated in place as attention/rope_rotation.cuh does (cos/sin from double, each float
// product and sum rounded on its own), each result rounded to `dtype`.
void RotateRow(uint16_t* x, int head_dim, int position, const RopeFrequencies& freqs,
               AttentionDtype dtype) {
  const int half = head_dim / 2;
  for (int i = 0; i < half; ++i) {
    const double angle = position * RopeFrequency(freqs, i, head_dim);
    const float c = static_cast<float>(std::cos(angle));
    const float sn = static_cast<float>(std::sin(angle));
    const float a = FromBits(x[i], dtype);
    const float b = FromBits(x[i + half], dtype);
    const float ac = a * c, bs = b * sn, bc = b * c, as = a * sn;
    x[i] = ToBits(ac - bs, dtype);
    x[i + half] = ToBits(bc + as, dtype);
  }
}

// Whether a and b are the same value or neighbours (std::cos may round a double's last bit
// differently from the GPU's sincos, which can move the float rounding by one unit).
bool WithinOneUnit(uint16_t a, uint16_t b) {
  return a == b || ((a ^ b) < 0x8000 && (a > b ? a - b : b - a) == 1);
}

class DecodeRopeGpuTest : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(DecodeRopeGpuTest, RotatesQAndAppendsTheNewTokenItself) {
  KILN_REQUIRE_GPUS(1);
  const DecodeCase c = GetParam();
  const double theta = 500000.0;
  const std::vector<SeqLens> seqs = {{1, 1},   {1, 2},   {1, 16},  {1, 17}, {1, 64},
                                     {1, 65},  {1, 300}, {1, 1000}, {1, 0}, {1, 1024}};
  SetupSpec spec;
  spec.dtype = c.dtype;
  spec.head_dim = c.head_dim;
  spec.group = c.group;
  spec.kv_heads = 2;
  spec.block_size = c.block_size;
  spec.key = {static_cast<int>(seqs.size()), static_cast<int>(seqs.size()), 1024};
  spec.decode_tile_rows = c.group;
  spec.pool_blocks = static_cast<int>(seqs.size()) * 1024 / c.block_size + 8;
  spec.seed = 77;
  std::unique_ptr<Harness> s;
  ASSERT_OK(MakeSetup(spec, &s));
  // The first trial splits the long sequences' tiles (fused merge); the second has only short
  // sequences, whose tiles stay whole; the third is the first with Llama 3's frequency scaling
  // (3.2 1B's at head_dim 64, 3.1 8B's at 128); the fourth (bf16) is the first with Qwen3's QK
  // norm of q and the new k before their rotation.
  const int trials = c.dtype == AttentionDtype::kBf16 ? 4 : 3;
  for (int trial = 0; trial < trials; ++trial) {
    SCOPED_TRACE(absl::StrCat("trial ", trial));
    std::vector<SeqLens> step = seqs;
    if (trial == 1) step.resize(3);
    const bool qk_norm = trial == 3;
    const float eps = 1e-6f;
    FastRng weight_rng(40 + trial);
    std::vector<uint16_t> q_norm(s->head_dim), k_norm(s->head_dim);
    for (auto& x : q_norm) x = ToBits(weight_rng.Uniform(0.5f, 1.5f), s->dtype);
    for (auto& x : k_norm) x = ToBits(weight_rng.Uniform(0.5f, 1.5f), s->dtype);
    // x = x / rms(x) · w over the head, rounded once (what the kernel computes in float).
    auto head_norm = [&](uint16_t* x, const std::vector<uint16_t>& w) {
      double sum_sq = 0;
      for (int d = 0; d < s->head_dim; ++d) {
        const double v = FromBits(x[d], s->dtype);
        sum_sq += v * v;
      }
      const double scale = 1.0 / std::sqrt(sum_sq / s->head_dim + eps);
      for (int d = 0; d < s->head_dim; ++d) {
        x[d] = ToBits(static_cast<float>(FromBits(x[d], s->dtype) * scale *
                                         FromBits(w[d], s->dtype)),
                      s->dtype);
      }
    };
    RopeScaling scaling;
    if (trial == 2) scaling = RopeScaling::Llama3(c.head_dim == 64 ? 32 : 8, 1, 4, 8192);
    const RopeFrequencies freqs = RopeFrequencies::Make(theta, scaling);
    ASSERT_OK(PrepareStep(*s, step, 500 + trial));
    const PagedKvLayout& layout = s->cache.layout();
    const BlockTable& table = s->cache.block_table();
    const int kv_row = s->kv_heads * s->head_dim;
    FastRng rng(900 + trial);
    std::vector<uint16_t> new_k(step.size() * kv_row), new_v(step.size() * kv_row);
    for (auto& x : new_k) x = ToBits(rng.Uniform(-1.f, 1.f), s->dtype);
    for (auto& x : new_v) x = ToBits(rng.Uniform(-1.f, 1.f), s->dtype);
    std::vector<int32_t> positions(s->max_tokens(), 0);
    for (size_t i = 0; i < step.size(); ++i) {
      positions[i] = i == 0 ? 0 : static_cast<int32_t>(rng.Next() % 200000);
    }
    // The new slots go stale; the expected cache holds the rotated k and the v there.
    const uint16_t nan = NanBits(s->dtype);
    std::vector<uint16_t> expected_k = s->k_host, expected_v = s->v_host;
    std::vector<size_t> new_rows;
    for (size_t i = 0; i < step.size(); ++i) {
      const int pos = step[i].kv_len - 1;
      if (pos < 0) continue;
      const int64_t slot =
          static_cast<int64_t>(table.at(static_cast<int>(i), pos / s->block_size)) *
              s->block_size + pos % s->block_size;
      for (int h = 0; h < s->kv_heads; ++h) {
        const size_t off = layout.ElementOffset(slot, h);
        uint16_t* k = &new_k[i * kv_row + static_cast<size_t>(h) * s->head_dim];
        const uint16_t* v = &new_v[i * kv_row + static_cast<size_t>(h) * s->head_dim];
        std::vector<uint16_t> rotated(k, k + s->head_dim);
        if (qk_norm) head_norm(rotated.data(), k_norm);
        RotateRow(rotated.data(), s->head_dim, positions[i], freqs, s->dtype);
        for (int d = 0; d < s->head_dim; ++d) {
          s->k_host[off + d] = s->v_host[off + d] = nan;
          expected_k[off + d] = rotated[d];
          expected_v[off + d] = v[d];
        }
        ASSERT_OK(CopyRow(*s, off));
        s->stale_rows.push_back(off);
        new_rows.push_back(off);
      }
    }
    absl::StatusOr<DeviceBuffer> d_k = Upload(new_k.data(), new_k.size() * 2, "new k");
    absl::StatusOr<DeviceBuffer> d_v = Upload(new_v.data(), new_v.size() * 2, "new v");
    absl::StatusOr<DeviceBuffer> d_pos = Upload(positions.data(), positions.size() * 4, "pos");
    absl::StatusOr<DeviceBuffer> d_qn = Upload(q_norm.data(), q_norm.size() * 2, "q norm");
    absl::StatusOr<DeviceBuffer> d_kn = Upload(k_norm.data(), k_norm.size() * 2, "k norm");
    ASSERT_OK(d_k.status());
    ASSERT_OK(d_v.status());
    ASSERT_OK(d_pos.status());
    ASSERT_OK(d_qn.status());
    ASSERT_OK(d_kn.status());
    DecodeAttentionParams p;
    p.dtype = s->dtype;
    p.num_q_heads = s->q_heads();
    p.num_kv_heads = s->kv_heads;
    p.head_dim = s->head_dim;
    p.q = s->q.data();
    p.o = s->o.data();
    p.kv = s->cache.device();
    p.plan = s->buffers.decode();
    p.rope_append.positions = d_pos->as<int32_t>();
    p.rope_append.theta = theta;
    p.rope_append.scaling = scaling;
    p.rope_append.k = d_k->data();
    p.rope_append.v = d_v->data();
    p.rope_append.kv_stride = kv_row;
    if (qk_norm) {
      p.rope_append.q_norm = d_qn->data();
      p.rope_append.k_norm = d_kn->data();
      p.rope_append.qk_norm_eps = eps;
    }
    ASSERT_OK(RunDecodeAttention(p, s->stream.get()));
    ASSERT_OK(s->stream.Synchronize());
    const std::vector<uint16_t> out = ReadOutput(*s);

    // The reference attends with the (normed and) rotated q and the cache as the kernel should
    // leave it.
    for (size_t i = 0; i < step.size(); ++i) {
      for (int h = 0; h < s->q_heads(); ++h) {
        uint16_t* row = &s->q_host[(i * s->q_heads() + h) * s->head_dim];
        if (qk_norm) head_norm(row, q_norm);
        RotateRow(row, s->head_dim, positions[i], freqs, s->dtype);
      }
    }
    std::vector<uint16_t> got_k(s->k_host.size()), got_v(s->v_host.size());
    ASSERT_CUDA(cudaMemcpy(got_k.data(), s->cache.k_cache(), got_k.size() * 2,
                           cudaMemcpyDeviceToHost));
    ASSERT_CUDA(cudaMemcpy(got_v.data(), s->cache.v_cache(), got_v.size() * 2,
                           cudaMemcpyDeviceToHost));
    for (size_t off : new_rows) {
      // Normed, the host's float64 scale may round a value one unit apart before the rotation,
      // which can cancel: within 3/256 of the head's largest value then.
      double largest = 0;
      for (int d = 0; d < s->head_dim; ++d) {
        largest = std::max(largest, std::abs(double{FromBits(expected_k[off + d], s->dtype)}));
      }
      for (int d = 0; d < s->head_dim; ++d) {
        if (qk_norm) {
          ASSERT_LE(std::abs(double{FromBits(got_k[off + d], s->dtype)} -
                             FromBits(expected_k[off + d], s->dtype)),
                    3.0 / 256 * largest)
              << "normed and rotated k at pool offset " << off + d;
        } else {
          ASSERT_TRUE(WithinOneUnit(got_k[off + d], expected_k[off + d]))
              << "rotated k at pool offset " << off + d << ": " << got_k[off + d] << " against "
              << expected_k[off + d];
        }
        got_k[off + d] = expected_k[off + d];
      }
    }
    ASSERT_EQ(got_k, expected_k) << "the kernel changed K outside the new tokens' slots";
    ASSERT_EQ(got_v, expected_v) << "V differs from the new v or changed elsewhere";
    s->k_host = got_k;
    s->v_host = got_v;
    ExpectMatchesReference(*s, step, out, Name(c.dtype));
  }
}

std::vector<DecodeCase> AllRopeCases() {
  std::vector<DecodeCase> cases;
  for (AttentionDtype dtype : {AttentionDtype::kBf16, AttentionDtype::kFp16}) {
    for (int head_dim : {64, 128}) {
      for (int group : {1, 3, 4, 6, 8}) cases.push_back({dtype, head_dim, group, 16});
      cases.push_back({dtype, head_dim, 4, 64});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllShapes, DecodeRopeGpuTest, ::testing::ValuesIn(AllRopeCases()));

// ---------------------------------------------------------------------------------------------
// One graph captured with one distribution, replayed with many others: bit-identical to eager.

TEST(DecodeGraphGpuTest, ReplayWithOtherDistributionsMatchesEagerBitForBit) {
  KILN_REQUIRE_GPUS(1);
  SetupSpec spec;
  spec.dtype = AttentionDtype::kBf16;
  spec.head_dim = 128;
  spec.group = 4;
  spec.kv_heads = 8;
  spec.block_size = 16;
  spec.key = {8, 8, 4096};
  spec.decode_tile_rows = 4;
  spec.min_kv_chunk = 256;
  spec.pool_blocks = 8 * 4096 / 16;
  spec.seed = 8;
  std::unique_ptr<Harness> s;
  ASSERT_OK(MakeSetup(spec, &s));
  ASSERT_TRUE(s->planner->layout().decode.splits());

  const std::vector<SeqLens> capture_seqs = {{1, 100}, {1, 200}};
  ASSERT_OK(PrepareStep(*s, capture_seqs, 1));
  ASSERT_OK(s->stream.Synchronize());
  cudaGraph_t graph = nullptr;
  ASSERT_CUDA(cudaStreamBeginCapture(s->stream.get(), cudaStreamCaptureModeThreadLocal));
  const absl::Status captured = RunParts(*s);
  ASSERT_CUDA(cudaStreamEndCapture(s->stream.get(), &graph));
  ASSERT_OK(captured);
  cudaGraphExec_t exec = nullptr;
  ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));

  std::mt19937 gen(4242);
  int split_steps = 0, unsplit_steps = 0;
  for (int trial = 0; trial < 10; ++trial) {
    const int n = 1 + static_cast<int>(gen() % 8);
    std::vector<SeqLens> seqs(n);
    for (SeqLens& sl : seqs) {
      const int pick = static_cast<int>(gen() % 6);
      const int kv = pick == 0   ? 0
                     : pick == 1 ? 1
                     : pick == 2 ? 4096
                     : pick == 3
                         ? 16 * static_cast<int>(1 + gen() % 100) + static_cast<int>(gen() % 3) - 1
                         : 1 + static_cast<int>(gen() % 4096);
      sl = {kv == 0 ? static_cast<int>(gen() % 2) : 1, kv};
    }
    ASSERT_OK(PrepareStep(*s, seqs, 100 + trial));
    auto summary = s->planner->Plan(seqs, s->buffers.host_plan());
    ASSERT_TRUE(summary.ok());
    (summary->decode.num_merge_items > 0 ? split_steps : unsplit_steps) += 1;
    ASSERT_OK(s->buffers.Upload(s->stream.get()));
    ASSERT_CUDA(cudaGraphLaunch(exec, s->stream.get()));
    ASSERT_OK(s->stream.Synchronize());
    const std::vector<uint16_t> replayed = ReadOutput(*s);
    ASSERT_CUDA(cudaMemsetAsync(s->o.data(), 0xff, s->o.size(), s->stream.get()));
    ASSERT_OK(RunParts(*s));
    ASSERT_OK(s->stream.Synchronize());
    const std::vector<uint16_t> eager = ReadOutput(*s);
    ASSERT_EQ(std::memcmp(replayed.data(), eager.data(), eager.size() * 2), 0)
        << "graph replay differs from eager in trial " << trial;
    ExpectMatchesReference(*s, seqs, replayed, absl::StrCat("graph trial ", trial));
    if (HasFatalFailure()) break;
  }
  EXPECT_GT(split_steps, 0);
  EXPECT_GT(unsplit_steps, 0);
  // The fused merge leaves every counter at zero for the next launch.
  const AttentionPlanPartDevice part = s->buffers.decode();
  ASSERT_NE(part.merge_counters, nullptr);
  std::vector<int32_t> counters(static_cast<size_t>(part.slot_capacity) * spec.kv_heads, -1);
  ASSERT_CUDA(cudaMemcpy(counters.data(), part.merge_counters, counters.size() * 4,
                         cudaMemcpyDeviceToHost));
  for (int32_t c : counters) ASSERT_EQ(c, 0);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

TEST(DecodeGpuTest, RejectsUnsupportedShapesByName) {
  KILN_REQUIRE_GPUS(1);
  DecodeAttentionParams p;
  p.dtype = AttentionDtype::kBf16;
  p.num_q_heads = 18;
  p.num_kv_heads = 2;  // group 9
  p.head_dim = 128;
  int dummy = 0;
  p.q = p.o = &dummy;
  p.kv.k_cache = p.kv.v_cache = &dummy;
  p.kv.block_table = &dummy;
  p.kv.block_size = 16;
  AttentionWorkItem item{};
  p.plan.work_items = &item;
  p.plan.seq_q_start = p.plan.seq_kv_len = &dummy;
  p.plan.work_capacity = 1;
  p.plan.tile_rows = 9;
  absl::Status status = LaunchDecodeAttention(p, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("9 per KV head"), std::string::npos) << status;
  p.num_q_heads = 8;  // group 4
  p.plan.tile_rows = 4;
  p.head_dim = 96;
  status = LaunchDecodeAttention(p, nullptr);
  EXPECT_NE(status.message().find("head_dim 96"), std::string::npos) << status;
  p.head_dim = 128;
  p.kv.block_size = 24;
  status = LaunchDecodeAttention(p, nullptr);
  EXPECT_NE(status.message().find("block_size 24"), std::string::npos) << status;
  p.kv.block_size = 16;
  p.plan.tile_rows = 32;
  status = LaunchDecodeAttention(p, nullptr);
  EXPECT_NE(status.message().find("tile_rows 32"), std::string::npos) << status;
}

}  // namespace
}  // namespace kiln
