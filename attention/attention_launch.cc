#include "attention/attention_launch.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "attention/decode_kernel.h"
#include "attention/internal/unchecked_launch.h"
#include "attention/merge_kernel.h"
#include "attention/prefill_kernel.h"
#include "runtime/cuda/status_macros.h"

namespace kiln {
namespace {

// The decode kernel serves parts whose tiles hold at most this many rows; wider tiles need the
// prefill kernel.
constexpr int kDecodeKernelMaxTileRows = 16;

bool Enabled(const AttentionPlanPartDevice& part) { return part.work_capacity > 0; }

bool RunsOnDecodeKernel(const AttentionPlanPartDevice& part) {
  return part.tile_rows <= kDecodeKernelMaxTileRows;
}

// Whether the part's split tiles are finished by the merge kernel: the decode kernel merges
// them itself when the part has merge counters.
bool LaunchesMerge(const AttentionPlanPartDevice& part) {
  return Enabled(part) && part.merge_capacity > 0 &&
         !(part.merge_counters != nullptr && RunsOnDecodeKernel(part));
}

// One part's launches (its kernel and merge), each params struct built once and checked
// before anything of the step is enqueued.
struct PartLaunches {
  bool kernel = false;         // the part is enabled: one of the kernels runs
  bool on_decode_kernel = false;
  DecodeAttentionParams decode;
  RopeFrequencies rope_freqs;  // the decode kernel's, derived by its check
  PrefillAttentionParams prefill;
  bool merge = false;          // LaunchesMerge(part)
  AttentionMergeParams merge_params;
};

// Builds the launches of `part` into `launches` and returns what they would refuse, so that a
// refusal comes before anything of the step is enqueued. rope_append: for the decode part only.
absl::Status PreparePart(const AttentionStepParams& p, const AttentionPlanPartDevice& part,
                         const DecodeRopeAppendDevice& rope_append, PartLaunches* launches) {
  // 0 is a part the plan leaves off; a negative count is a corrupt part, not an off one.
  if (part.work_capacity < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Attention step part of tile_rows ", part.tile_rows, " has work_capacity ",
        part.work_capacity, "; pass PlanBuffers' part (0 leaves a part off)"));
  }
  if (!Enabled(part)) return absl::OkStatus();
  launches->kernel = true;
  launches->on_decode_kernel = RunsOnDecodeKernel(part);
  if (launches->on_decode_kernel) {
    launches->decode = DecodeParamsForPart(p, part, rope_append);
    ASSIGN_OR_RETURN(launches->rope_freqs,
                     attention_internal::ValidateDecodeAttention(launches->decode));
  } else {
    launches->prefill = PrefillParamsForPart(p, part);
    RETURN_IF_ERROR(ValidatePrefillAttentionParams(launches->prefill));
    // PrefillParamsForPart passes the workspace only to a part that may split; one that may
    // split without it would have its split tiles written through null.
    if (part.slot_capacity > 0 && (part.partial_o == nullptr || part.partial_lse == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Attention step part of tile_rows ", part.tile_rows, " may split (slot_capacity ",
          part.slot_capacity, ") but has no partial workspace; pass PlanBuffers' part"));
    }
  }
  launches->merge = LaunchesMerge(part);
  if (!launches->merge) return absl::OkStatus();
  launches->merge_params = MergeParamsForPart(p, part);
  return ValidateAttentionMergeParams(launches->merge_params);
}

// Enqueues the kernel of a part that PreparePart accepted.
absl::Status EnqueueKernel(const PartLaunches& launches, cudaStream_t stream) {
  if (!launches.kernel) return absl::OkStatus();
  if (launches.on_decode_kernel) {
    return attention_internal::LaunchDecodeAttentionUnchecked(launches.decode,
                                                              launches.rope_freqs, stream);
  }
  return attention_internal::LaunchPrefillAttentionUnchecked(launches.prefill, stream);
}

// Enqueues the merge of a part that PreparePart accepted.
absl::Status EnqueueMerge(const PartLaunches& launches, cudaStream_t stream) {
  if (!launches.merge) return absl::OkStatus();
  return attention_internal::LaunchAttentionMergeUnchecked(launches.merge_params, stream);
}

}  // namespace

DecodeAttentionParams DecodeParamsForPart(const AttentionStepParams& p,
                                          const AttentionPlanPartDevice& part,
                                          const DecodeRopeAppendDevice& rope_append) {
  DecodeAttentionParams d;
  d.dtype = p.dtype;
  d.num_q_heads = p.num_q_heads;
  d.num_kv_heads = p.num_kv_heads;
  d.head_dim = p.head_dim;
  d.sm_scale = p.sm_scale;
  d.q = p.q;
  d.q_stride = p.q_stride;
  d.o = p.o;
  d.o_stride = p.o_stride;
  d.kv = p.kv;
  d.plan = part;
  d.rope_append = rope_append;
  return d;
}

AttentionMergeParams MergeParamsForPart(const AttentionStepParams& p,
                                        const AttentionPlanPartDevice& part) {
  AttentionMergeParams m;
  m.dtype = p.dtype;
  m.num_q_heads = p.num_q_heads;
  m.num_kv_heads = p.num_kv_heads;
  m.head_dim = p.head_dim;
  m.o = p.o;
  m.o_stride = p.o_stride;
  m.plan = part;
  return m;
}

PrefillAttentionParams PrefillParamsForPart(const AttentionStepParams& params,
                                            const AttentionPlanPartDevice& part) {
  PrefillAttentionParams p;
  p.dtype = params.dtype;
  p.head_dim = params.head_dim;
  p.tile_rows = part.tile_rows;
  p.num_q_heads = params.num_q_heads;
  p.num_kv_heads = params.num_kv_heads;
  p.block_size = params.kv.block_size;
  p.max_blocks_per_seq = params.kv.max_blocks_per_seq;
  p.softmax_scale = params.sm_scale;
  p.q = params.q;
  p.q_stride = params.q_stride;
  p.o = params.o;
  p.o_stride = params.o_stride;
  p.k_cache = params.kv.k_cache;
  p.v_cache = params.kv.v_cache;
  p.block_table = params.kv.block_table;
  p.seq_q_start = part.seq_q_start;
  p.seq_kv_len = part.seq_kv_len;
  p.work_items = part.work_items;
  p.num_work_items = part.work_capacity;
  if (part.slot_capacity > 0) {
    p.partial_o = part.partial_o;
    p.partial_lse = part.partial_lse;
  }
  return p;
}

absl::Status RunAttentionStep(const AttentionStepParams& params, cudaStream_t stream) {
  if (params.q == nullptr || params.o == nullptr) {
    return absl::InvalidArgumentError("Attention step q and o must be set; one is null");
  }
  if (!Enabled(params.decode) && !Enabled(params.prefill)) {
    return absl::InvalidArgumentError(
        "Attention step has neither a decode nor a prefill part; pass PlanBuffers::decode() "
        "and/or prefill() of an enabled plan part");
  }
  // The QK norm runs only with the rotation, so it too needs a decode-only step (a step without
  // a decode part would drop it silently).
  const DecodeRopeAppendDevice& r = params.rope_append;
  if ((r.positions != nullptr || r.q_norm != nullptr || r.k_norm != nullptr) &&
      (!Enabled(params.decode) || Enabled(params.prefill) ||
       params.decode.tile_rows > kDecodeKernelMaxTileRows)) {
    return absl::InvalidArgumentError(
        "Attention step with rope_append needs a decode-only plan (a decode part, no prefill "
        "part, tiles of at most 16 rows): the decode kernel rotates only q_len-1 tokens; run "
        "RoPE and the KV append before attention for other steps");
  }
  // Every launch of the step is built and checked before anything is enqueued: otherwise a
  // part or merge refused later would fail the step after the decode part's kernel had already
  // run (or been captured into the graph). The launches then enqueue what was checked, without
  // checking it again.
  PartLaunches decode, prefill;
  RETURN_IF_ERROR(PreparePart(params, params.decode, params.rope_append, &decode));
  RETURN_IF_ERROR(PreparePart(params, params.prefill, DecodeRopeAppendDevice{}, &prefill));
  // Both kernels first (they write disjoint rows of o and separate workspaces), then the
  // merges, which read the partials the kernels wrote earlier on this stream.
  RETURN_IF_ERROR(EnqueueKernel(decode, stream));
  RETURN_IF_ERROR(EnqueueKernel(prefill, stream));
  RETURN_IF_ERROR(EnqueueMerge(decode, stream));
  return EnqueueMerge(prefill, stream);
}

}  // namespace kiln
