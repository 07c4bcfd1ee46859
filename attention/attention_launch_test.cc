// Host-only checks of RunAttentionStep's argument checks and of the prefill params it derives
// from a plan part; no GPU needed (nothing is launched).
#include "attention/attention_launch.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "attention/decode_kernel.h"
#include "attention/internal/test_util.h"
#include "attention/merge_kernel.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

using ::kiln::attention_internal::HostStandIns;
using ::kiln::attention_internal::SetHostPlanPart;
using ::kiln::attention_internal::SetHostRopeAppend;
using ::kiln::attention_internal::SetHostShapeAndCache;
using ::kiln::attention_internal::SetHostSplit;
using ::testing::HasSubstr;

TEST(AttentionLaunchTest, RejectsMissingBuffersAndParts) {
  AttentionStepParams p;
  EXPECT_THAT(RunAttentionStep(p, nullptr).message(), HasSubstr("q and o"));
  int dummy = 0;
  p.q = &dummy;
  p.o = &dummy;
  const absl::Status s = RunAttentionStep(p, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("neither a decode nor a prefill part"));
}

// Step parameters over host stand-ins `host` (which must outlive them), with a decode and a
// prefill part of one work item and 4 tile rows each: for checks that refuse a step before
// anything touches the pointers.
AttentionStepParams HostStepParams(HostStandIns* host) {
  AttentionStepParams p;
  SetHostShapeAndCache(host, &p);
  SetHostPlanPart(host, &p.decode);
  SetHostPlanPart(host, &p.prefill);
  return p;
}

// RoPE + KV append in the decode kernel: only for decode-only steps, with the new k and v and a
// usable theta and stride; every refusal comes before anything is launched.
TEST(AttentionLaunchTest, RejectsRopeAppendOutsideDecodeOnlyStepsAndBadArguments) {
  HostStandIns host;
  AttentionStepParams p = HostStepParams(&host);
  p.rope_append.positions = &host.buffers[12];
  p.rope_append.theta = 10000.0;
  absl::Status s = RunAttentionStep(p, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("decode-only"));  // a prefill part too
  p.prefill.work_capacity = 0;
  p.decode.tile_rows = 32;
  EXPECT_THAT(RunAttentionStep(p, nullptr).message(), HasSubstr("decode-only"));
  p.decode.tile_rows = 4;
  EXPECT_THAT(RunAttentionStep(p, nullptr).message(), HasSubstr("new k and v"));
  p.rope_append.k = &host.buffers[0];
  p.rope_append.v = &host.buffers[4];
  EXPECT_THAT(RunAttentionStep(p, nullptr).message(), HasSubstr("kv_stride 0"));
  p.rope_append.kv_stride = 132;
  EXPECT_THAT(RunAttentionStep(p, nullptr).message(), HasSubstr("kv_stride 132"));
  p.rope_append.kv_stride = 128;
  p.rope_append.theta = -1.0;
  EXPECT_THAT(RunAttentionStep(p, nullptr).message(), HasSubstr("theta -1"));
  p.rope_append.theta = 10000.0;
  p.rope_append.scaling = RopeScaling::Llama3(0.5, 1.0, 4.0, 8192);
  EXPECT_THAT(RunAttentionStep(p, nullptr).message(),
              HasSubstr("Decode RoPE scaling factor is 0.5"));
  p.rope_append.scaling = RopeScaling();
  // The QK norm: both weights, aligned, bf16, an epsilon above 0.
  p.rope_append.q_norm = &host.buffers[0];
  EXPECT_THAT(RunAttentionStep(p, nullptr).message(), HasSubstr("both q_norm and k_norm"));
  p.rope_append.k_norm = &host.buffers[1];  // 4 bytes in: not 16-byte aligned
  EXPECT_THAT(RunAttentionStep(p, nullptr).message(), HasSubstr("16-byte aligned"));
  p.rope_append.k_norm = &host.buffers[4];
  EXPECT_THAT(RunAttentionStep(p, nullptr).message(), HasSubstr("qk_norm_eps 0"));
  p.rope_append.qk_norm_eps = 1e-6f;
  p.dtype = AttentionDtype::kFp16;
  EXPECT_THAT(RunAttentionStep(p, nullptr).message(), HasSubstr("dtype fp16"));
  p.dtype = AttentionDtype::kBf16;
  p.rope_append.positions = nullptr;  // the norm only comes with the RoPE + KV append
  EXPECT_THAT(RunAttentionStep(p, nullptr).message(), HasSubstr("needs the RoPE + KV append"));
  // A step without a decode part would drop the norm silently: refused like the rotation.
  AttentionStepParams prefill_only = HostStepParams(&host);
  prefill_only.decode.work_capacity = 0;
  prefill_only.rope_append.q_norm = &host.buffers[0];
  prefill_only.rope_append.k_norm = &host.buffers[4];
  prefill_only.rope_append.qk_norm_eps = 1e-6f;
  EXPECT_THAT(RunAttentionStep(prefill_only, nullptr).message(), HasSubstr("decode-only"));
}

// A prefill part the prefill kernel refuses fails the step before the decode part's kernel is
// enqueued (on a host without a GPU that launch would fail otherwise, not the check).
TEST(AttentionLaunchTest, RefusesABadPrefillPartBeforeLaunchingTheDecodePart) {
  HostStandIns host;
  AttentionStepParams p = HostStepParams(&host);
  p.prefill.tile_rows = 96;  // the planner takes any tile_rows >= G; the kernel 64 or 128
  const absl::Status s = RunAttentionStep(p, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("Prefill tile_rows 96"));
}

// A negative work capacity is a corrupt part, not one left off (0).
TEST(AttentionLaunchTest, RefusesANegativeWorkCapacity) {
  HostStandIns host;
  AttentionStepParams p = HostStepParams(&host);
  p.prefill.work_capacity = -1;
  const absl::Status s = RunAttentionStep(p, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("work_capacity -1"));
}

// The same for every other launch of the step: a second part the decode kernel runs, a prefill
// part that may split without a workspace (its kernel would write split tiles through null),
// and a merge; each refusal names what is wrong and comes before the decode part's kernel is
// enqueued (on a host without a GPU that launch would fail otherwise, not the check).
TEST(AttentionLaunchTest, RefusesEveryLaunchOfTheStepBeforeEnqueueingAny) {
  HostStandIns host;
  AttentionStepParams p = HostStepParams(&host);
  p.prefill.tile_rows = 2;  // run by the decode kernel, which needs at least G = 4 rows
  EXPECT_THAT(RunAttentionStep(p, nullptr).message(), HasSubstr("Decode plan tile_rows 2"));

  p = HostStepParams(&host);
  p.prefill.tile_rows = 64;
  p.prefill.slot_capacity = 2;  // may split, but no partial_o / partial_lse
  absl::Status s = RunAttentionStep(p, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("slot_capacity 2) but has no partial workspace"));

  p.prefill.partial_o = host.partial;
  p.prefill.partial_lse = host.partial;
  p.prefill.merge_capacity = 1;  // the merge kernel runs: it needs the merge items
  EXPECT_THAT(RunAttentionStep(p, nullptr).message(), HasSubstr("Merge needs o"));

  // The decode part splits without a workspace; its merge counters need the header.
  p = HostStepParams(&host);
  p.prefill.work_capacity = 0;
  p.decode.slot_capacity = 2;
  EXPECT_THAT(RunAttentionStep(p, nullptr).message(), HasSubstr("no (16-byte aligned) partial"));
}

// The step enqueues the decode kernel, the prefill kernel, the decode merge, then the prefill
// merge. A refusal of any of them, the last ones included, comes before the first is enqueued
// (on a host without a GPU an earlier launch would fail with a CUDA error instead).
TEST(AttentionLaunchTest, RefusesEachLaunchInEnqueueOrderBeforeTheFirst) {
  HostStandIns host;
  // Both parts split, without merge counters: four launches, every one of them checked.
  const auto base = [&]() {
    AttentionStepParams p = HostStepParams(&host);
    p.prefill.tile_rows = 64;
    SetHostSplit(&host, &p.decode);
    SetHostSplit(&host, &p.prefill);
    return p;
  };
  // The decode part's merge (third in order): its merge items are missing.
  AttentionStepParams p = base();
  p.decode.merge_items = nullptr;
  absl::Status s = RunAttentionStep(p, nullptr);
  EXPECT_EQ(s, ValidateAttentionMergeParams(MergeParamsForPart(p, p.decode)));
  EXPECT_THAT(s.message(), HasSubstr("Merge needs o"));
  // The prefill part's merge (last in order): likewise.
  p = base();
  p.prefill.merge_items = nullptr;
  s = RunAttentionStep(p, nullptr);
  EXPECT_EQ(s, ValidateAttentionMergeParams(MergeParamsForPart(p, p.prefill)));
  // The prefill kernel (second): a tile_rows it is not built for.
  p = base();
  p.prefill.tile_rows = 96;
  EXPECT_THAT(RunAttentionStep(p, nullptr).message(), HasSubstr("Prefill tile_rows 96"));
  // The decode kernel (first): a dtype no kernel is built for, refused by its check rather
  // than by the launch's dispatch.
  p = base();
  p.dtype = static_cast<AttentionDtype>(3);
  EXPECT_THAT(RunAttentionStep(p, nullptr).message(), HasSubstr("Decode dtype 3"));
  p.decode.work_capacity = 0;  // then the prefill kernel's check names it
  EXPECT_THAT(RunAttentionStep(p, nullptr).message(), HasSubstr("Prefill dtype 3"));
}

// The kernels move q, o and the cache in 16-byte vectors and index the block table by rows of
// max_blocks_per_seq: a misaligned tensor or rows of no width are refused, not launched.
TEST(AttentionLaunchTest, RefusesMisalignedTensorsAndEmptyBlockTableRows) {
  HostStandIns host;
  AttentionStepParams p = HostStepParams(&host);
  p.prefill.work_capacity = 0;
  p.q = &host.buffers[1];
  EXPECT_THAT(RunAttentionStep(p, nullptr).message(), HasSubstr("16-byte aligned"));
  p = HostStepParams(&host);
  p.prefill.work_capacity = 0;
  p.kv.v_cache = &host.buffers[2];
  EXPECT_THAT(RunAttentionStep(p, nullptr).message(), HasSubstr("16-byte aligned"));
  p = HostStepParams(&host);
  p.prefill.work_capacity = 0;
  p.kv.max_blocks_per_seq = 0;
  EXPECT_THAT(RunAttentionStep(p, nullptr).message(), HasSubstr("max_blocks_per_seq 0"));
  // A scale the prefill kernel refuses is refused by the decode kernel too (NaN weights).
  p = HostStepParams(&host);
  p.prefill.work_capacity = 0;
  p.sm_scale = std::nanf("");
  EXPECT_THAT(RunAttentionStep(p, nullptr).message(), HasSubstr("Decode sm_scale nan"));
  // The prefill kernel: cp.async reads q, k and v in 16-byte pieces.
  p = HostStepParams(&host);
  p.decode.work_capacity = 0;
  p.prefill.tile_rows = 64;
  p.kv.k_cache = &host.buffers[3];
  EXPECT_THAT(RunAttentionStep(p, nullptr).message(), HasSubstr("16-byte aligned"));
}

TEST(AttentionLaunchTest, MergeRefusesStridesAndPointersItCannotWrite) {
  HostStandIns host;
  AttentionMergeParams m;
  m.num_q_heads = 8;
  m.num_kv_heads = 2;
  m.head_dim = 64;
  m.o = &host.buffers[0];
  SetHostPlanPart(&host, &m.plan);
  SetHostSplit(&host, &m.plan);
  EXPECT_TRUE(ValidateAttentionMergeParams(m).ok());
  m.o_stride = -512;  // rows would be written before o
  EXPECT_THAT(LaunchAttentionMerge(m, nullptr).message(), HasSubstr("o_stride -512"));
  m.o_stride = 100;
  EXPECT_THAT(LaunchAttentionMerge(m, nullptr).message(), HasSubstr("o_stride 100"));
  m.o_stride = 0;
  m.o = &host.buffers[1];
  EXPECT_THAT(LaunchAttentionMerge(m, nullptr).message(), HasSubstr("16-byte aligned"));
  m.o = &host.buffers[0];
  m.head_dim = 96;
  EXPECT_THAT(LaunchAttentionMerge(m, nullptr).message(), HasSubstr("head_dim 96"));
  m.head_dim = 64;
  m.num_q_heads = 65536;
  m.num_kv_heads = 65536;  // the grid's y dimension holds at most 65535
  EXPECT_THAT(ValidateAttentionMergeParams(m).message(), HasSubstr("num_kv_heads 65536"));
  m.plan.merge_capacity = 0;  // no merge: nothing is checked or launched
  EXPECT_TRUE(LaunchAttentionMerge(m, nullptr).ok());
}

TEST(AttentionLaunchTest, DecodeAttentionSupportsShapeNamesWhatIsBuilt) {
  EXPECT_TRUE(DecodeAttentionSupportsShape(32, 8, 64).ok());
  EXPECT_TRUE(DecodeAttentionSupportsShape(40, 8, 128).ok());  // 5 per KV head
  EXPECT_TRUE(DecodeAttentionSupportsShape(8, 8, 128).ok());
  EXPECT_TRUE(DecodeAttentionSupportsShape(24, 8, 128).ok());  // Llama 3.2 3B
  EXPECT_TRUE(DecodeAttentionSupportsShape(28, 4, 128).ok());  // Qwen2.5 7B
  EXPECT_TRUE(DecodeAttentionSupportsShape(12, 2, 128).ok());  // Qwen2.5 1.5B
  EXPECT_THAT(DecodeAttentionSupportsShape(36, 4, 128).message(),
              HasSubstr("36 query heads over 4 KV heads (9 per KV head); it is built for 1, 2, "
                        "3, 4, 5, 6, 7, 8"));
  EXPECT_THAT(DecodeAttentionSupportsShape(32, 8, 96).message(), HasSubstr("head_dim 96"));
  EXPECT_THAT(DecodeAttentionSupportsShape(30, 8, 64).message(),
              HasSubstr("query heads a multiple of KV heads"));
  EXPECT_EQ(DecodeAttentionSupportsShape(32, 0, 64).code(), absl::StatusCode::kInvalidArgument);
  // The KV head is the grid's y dimension: refused before a launch (or a capture) would fail.
  EXPECT_THAT(DecodeAttentionSupportsShape(65536, 65536, 64).message(),
              HasSubstr("num_kv_heads 65536 is above 65535"));
}

TEST(AttentionLaunchTest, PrefillParamsComeFromThePart) {
  alignas(16) int buffers[20] = {};
  AttentionStepParams p;
  p.dtype = AttentionDtype::kFp16;
  p.num_q_heads = 32;
  p.num_kv_heads = 8;
  p.head_dim = 128;
  p.sm_scale = 0.5f;
  p.q = &buffers[0];
  p.q_stride = 6144;
  p.o = &buffers[4];
  p.kv.k_cache = &buffers[8];
  p.kv.v_cache = &buffers[12];
  p.kv.block_table = &buffers[16];
  p.kv.block_size = 16;
  p.kv.max_blocks_per_seq = 512;
  AttentionPlanPartDevice part;
  part.seq_q_start = &buffers[17];
  part.seq_kv_len = &buffers[18];
  part.work_items = reinterpret_cast<const AttentionWorkItem*>(&buffers[19]);
  part.work_capacity = 300;
  part.tile_rows = 128;
  float partial = 0;
  part.partial_o = &partial;
  part.partial_lse = &partial;
  part.slot_capacity = 0;  // never splits: the kernel gets no workspace

  const PrefillAttentionParams q = PrefillParamsForPart(p, part);
  EXPECT_EQ(q.dtype, AttentionDtype::kFp16);
  EXPECT_EQ(q.tile_rows, 128);
  EXPECT_EQ(q.num_work_items, 300);
  EXPECT_EQ(q.block_size, 16);
  EXPECT_EQ(q.max_blocks_per_seq, 512);
  EXPECT_EQ(q.q_stride, 6144);
  EXPECT_EQ(q.softmax_scale, 0.5f);
  EXPECT_EQ(q.work_items, part.work_items);
  EXPECT_EQ(q.partial_o, nullptr);
  EXPECT_TRUE(ValidatePrefillAttentionParams(q).ok());

  part.slot_capacity = 4;
  EXPECT_EQ(PrefillParamsForPart(p, part).partial_o, &partial);
}

// --- Adversarial sweep of RunAttentionStep's checks. Seeded, so a failure reproduces.

// The step's answer composed from the public checks of each launch, in the order the header
// gives (arguments, then the decode part, the prefill part, each with its merge). A substring
// stands for the step's own checks.
struct StepAnswer {
  absl::Status status;   // a launch's refusal, to be returned verbatim
  std::string own;       // or a substring of the step's own refusal
};

StepAnswer ComposeStep(const AttentionStepParams& p) {
  const auto enabled = [](const AttentionPlanPartDevice& part) { return part.work_capacity > 0; };
  if (p.q == nullptr || p.o == nullptr) return {absl::OkStatus(), "q and o"};
  if (!enabled(p.decode) && !enabled(p.prefill)) return {absl::OkStatus(), "neither"};
  const DecodeRopeAppendDevice& r = p.rope_append;
  if ((r.positions != nullptr || r.q_norm != nullptr || r.k_norm != nullptr) &&
      (!enabled(p.decode) || enabled(p.prefill) || p.decode.tile_rows > 16)) {
    return {absl::OkStatus(), "decode-only"};
  }
  for (bool decode : {true, false}) {
    const AttentionPlanPartDevice& part = decode ? p.decode : p.prefill;
    if (part.work_capacity < 0) return {absl::OkStatus(), "work_capacity"};
    if (!enabled(part)) continue;
    const bool on_decode_kernel = part.tile_rows <= 16;
    absl::Status s;
    if (on_decode_kernel) {
      s = ValidateDecodeAttentionParams(
          DecodeParamsForPart(p, part, decode ? r : DecodeRopeAppendDevice{}));
    } else {
      s = ValidatePrefillAttentionParams(PrefillParamsForPart(p, part));
      if (s.ok() && part.slot_capacity > 0 &&
          (part.partial_o == nullptr || part.partial_lse == nullptr)) {
        return {absl::OkStatus(), "no partial workspace"};
      }
    }
    if (!s.ok()) return {s, ""};
    if (part.merge_capacity > 0 && !(part.merge_counters != nullptr && on_decode_kernel)) {
      s = ValidateAttentionMergeParams(MergeParamsForPart(p, part));
      if (!s.ok()) return {s, ""};
    }
  }
  return {absl::OkStatus(), ""};
}

// Steps whose fields are replaced by adversarial values one to four at a time: RunAttentionStep
// refuses exactly when one of its launches would (or its own checks do), with that launch's
// message, before anything is enqueued. Steps every check accepts are counted, not launched.
TEST(AttentionLaunchTest, SweepRefusesEveryStepOneOfItsLaunchesWould) {
  std::mt19937 rng(8128);
  HostStandIns host;
  const std::vector<const void*> pointers = {&host.buffers[0], &host.buffers[16], nullptr,
                                             &host.buffers[1], &host.buffers[2], &host.buffers[32]};
  const auto ptr = [&]() { return const_cast<void*>(pointers[rng() % pointers.size()]); };
  const std::vector<int> ints = {std::numeric_limits<int>::min(), -1, 0, 1, 2, 3, 4, 5, 7, 8,
                                 9, 15, 16, 17, 31, 32, 63, 64, 65, 96, 127, 128, 129,
                                 65535, 65536, 1 << 20, std::numeric_limits<int>::max()};
  const auto pick_int = [&]() { return ints[rng() % ints.size()]; };
  const std::vector<int64_t> strides = {0, -8, 8, 100, 512, 516, 520, 1 << 20,
                                        std::numeric_limits<int64_t>::max()};
  const std::vector<float> scales = {0.0f, 0.125f, -1.0f, std::nanf(""),
                                     std::numeric_limits<float>::infinity()};
  int refused = 0, accepted = 0;
  for (int trial = 0; trial < 30000; ++trial) {
    AttentionStepParams p = HostStepParams(&host);
    // Valid bases: decode-only, prefill-only on the prefill kernel, or both, each able to
    // split with a workspace and (for the decode kernel) merge counters.
    switch (rng() % 3) {
      case 0: p.prefill.work_capacity = 0; break;
      case 1: p.decode.work_capacity = 0; p.prefill.tile_rows = 64; break;
      default: p.prefill.tile_rows = rng() % 2 ? 16 : 128;
    }
    for (AttentionPlanPartDevice* part : {&p.decode, &p.prefill}) {
      part->header = &host.header;
      part->merge_items = host.merge_items;
      if (rng() % 2) {
        SetHostSplit(&host, part);
        if (rng() % 2) part->merge_counters = host.merge_counters;
      }
    }
    if (p.prefill.work_capacity == 0 && rng() % 2) {
      SetHostRopeAppend(&host, 500000.0, RopeScaling(), &p.rope_append);
    }
    const int mutations = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < mutations; ++m) {
      AttentionPlanPartDevice& part = rng() % 2 ? p.decode : p.prefill;
      switch (rng() % 24) {
        case 0: p.dtype = static_cast<AttentionDtype>(static_cast<int>(rng() % 4) - 1); break;
        case 1: p.num_q_heads = pick_int(); break;
        case 2: p.num_kv_heads = pick_int(); break;
        case 3: p.head_dim = pick_int(); break;
        case 4: p.sm_scale = scales[rng() % scales.size()]; break;
        case 5: p.q = ptr(); break;
        case 6: p.o = ptr(); break;
        case 7: p.q_stride = strides[rng() % strides.size()]; break;
        case 8: p.o_stride = strides[rng() % strides.size()]; break;
        case 9: p.kv.k_cache = ptr(); break;
        case 10: p.kv.block_table = static_cast<const int32_t*>(ptr()); break;
        case 11: p.kv.block_size = pick_int(); break;
        case 12: p.kv.max_blocks_per_seq = pick_int(); break;
        case 13: part.work_capacity = pick_int(); break;
        case 14: part.tile_rows = pick_int(); break;
        case 15: part.slot_capacity = pick_int(); break;
        case 16: part.merge_capacity = pick_int(); break;
        case 17: part.partial_o = static_cast<float*>(ptr()); break;
        case 18: part.partial_lse = static_cast<float*>(ptr()); break;
        case 19: part.merge_counters = rng() % 2 ? nullptr : host.merge_counters; break;
        case 20: part.header = rng() % 2 ? nullptr : &host.header; break;
        case 21: part.merge_items = rng() % 2 ? nullptr : host.merge_items; break;
        case 22: part.work_items = rng() % 2 ? nullptr : host.work_items; break;
        default:
          switch (rng() % 6) {
            case 0: p.rope_append.positions = static_cast<const int32_t*>(ptr()); break;
            case 1: p.rope_append.theta = rng() % 2 ? -1.0 : std::nan(""); break;
            case 2: p.rope_append.kv_stride = strides[rng() % strides.size()]; break;
            case 3: p.rope_append.q_norm = ptr(); break;
            case 4: p.rope_append.scaling = RopeScaling::Llama3(0.5, 1.0, 4.0, 8192); break;
            default: p.rope_append.k = ptr();
          }
      }
    }
    const StepAnswer want = ComposeStep(p);
    if (want.status.ok() && want.own.empty()) {
      ++accepted;  // every launch would go ahead: not run on host buffers
      continue;
    }
    ++refused;
    const absl::Status got = RunAttentionStep(p, nullptr);
    const std::string where = "trial " + std::to_string(trial) + ": " + got.ToString();
    ASSERT_EQ(got.code(), absl::StatusCode::kInvalidArgument) << where;
    ASSERT_FALSE(got.message().empty()) << where;
    if (!want.status.ok()) {
      ASSERT_EQ(got, want.status) << where;
    } else {
      ASSERT_THAT(std::string(got.message()), HasSubstr(want.own)) << where;
    }
  }
  RecordProperty("refused", refused);
  RecordProperty("accepted_not_launched", accepted);
  EXPECT_GT(refused, 15000);
  EXPECT_GT(accepted, 1000);
}

}  // namespace
}  // namespace kiln
