// How a runner turns a batch into a step of fixed shape: the step keys (one per captured size,
// plus one eager key that takes any batch within the limits), which key a batch pads to, where
// each of the step's inputs lives in the one metadata blob that reaches the device at the step's
// start, and filling that blob.
//
//   ASSIGN_OR_RETURN(kiln::StepKeys keys, kiln::StepKeys::Create(limits, &decode, &prefill));
//   kiln::StepRoute route = keys.Route(lens);            // e.g. 5 decodes -> decode/8
//   const kiln::StepKey& key = keys.key(route.key_index);
//   kiln::MetadataLayout layout = kiln::MetadataLayout::Create(key, plan_bytes, blocks_per_seq);
//   RETURN_IF_ERROR(kiln::FillStepInputs(layout, route, lens, tokens, blocks, pinned_blob));
//   // then the attention planner writes its plan at pinned_blob + layout.plan, and the step's
//   // first kernel copies layout.Fetch()'s bytes to the device (step_fetch.h): at least
//   // layout.UploadBytes(num_seqs).
//
// Keys:
//   decode/B   B sequences of one new token each (B a decode capture size): B token rows, B
//              logits rows; the attention plan has only a decode part.
//   prefill/N  at most N tokens in any mix of prefill chunks and decodes (N a prefill capture
//              size): N token rows, min(N, max_num_seqs) logits rows; the plan has a decode part
//              (for the one-token sequences) and a prefill part.
//   mixed/T    the eager key, T = max_num_batched_tokens: any batch within the limits, run
//              eagerly at its exact token and sequence counts; both plan parts.
// A batch takes the smallest key that holds it: decode-only batches a decode key, other batches
// a prefill key, and a batch above every captured size the eager key.
//
// Host-only (no CUDA). Immutable after creation; thread-safe to read.
#ifndef KILN_RUNTIME_RUNNER_STEP_PLAN_H_
#define KILN_RUNTIME_RUNNER_STEP_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "attention/split_kv_planner.h"
#include "graph/capture_context.h"
#include "graph/capture_sizes.h"

namespace kiln {

// The scheduler limits every step stays within.
struct StepLimits {
  int max_num_seqs = 0;            // sequences in one step
  int max_num_batched_tokens = 0;  // tokens in one step; at least max_num_seqs
};

// One step shape: a capture key and the capacities it fixes.
struct StepKey {
  CaptureKey key;
  int max_tokens = 0;         // token rows (the padded size for a graph key)
  int max_rows = 0;           // sequence capacity (logits rows for a graph key)
  // The fewest sequences of a batch routed here: one more than the next smaller decode size for
  // a decode key, 1 for the others.
  int min_rows = 1;
  bool decode_part = false;   // the attention plan has a decode part
  bool prefill_part = false;  // the attention plan has a prefill part
  bool eager_only = false;    // the eager key: never captured, runs at exact sizes
};

// Where a batch goes: its key and the sizes the step runs at.
struct StepRoute {
  int key_index = -1;  // into StepKeys::keys()
  int num_tokens = 0;  // token rows: the key's size, or the batch's tokens for the eager key
  int num_rows = 0;    // logits rows: the key's rows, or the batch's sequences for the eager key
};

class StepKeys {
 public:
  // Builds the keys: one per size of `decode` and of `prefill` (each may be null: no keys of that
  // kind; neither is kept), then the eager key. InvalidArgument for limits that are not positive,
  // tokens below sequences, or a size above its limit.
  static absl::StatusOr<StepKeys> Create(const StepLimits& limits, const CaptureSizes* decode,
                                         const CaptureSizes* prefill);

  // Returns the route of a batch with these (q_len, kv_len), which should pass Check. Any other
  // batch is still routed safely (no read outside the tables, no overflow): to the eager key,
  // its counts clamped to [0, INT_MAX], which FillStepInputs then refuses.
  StepRoute Route(absl::Span<const SeqLens> seqs) const;

  // Returns OK if the batch fits the limits: 1..max_num_seqs sequences, each q_len ≥ 1 and
  // kv_len ≥ q_len (kv_len counts the new tokens), at most max_num_batched_tokens tokens; else
  // InvalidArgument naming the sequence or limit and the fix.
  absl::Status Check(absl::Span<const SeqLens> seqs) const;

  // Returns the index of the key {mode, size}, or -1.
  int Find(CaptureKey key) const;

  const std::vector<StepKey>& keys() const { return keys_; }
  const StepKey& key(int index) const { return keys_[index]; }
  int eager_index() const { return static_cast<int>(keys_.size()) - 1; }
  const StepLimits& limits() const { return limits_; }

 private:
  StepLimits limits_;
  std::vector<StepKey> keys_;
  // decode_index_[b]: the decode key of b sequences (the smallest size >= b), for b up to the
  // largest decode size; prefill_index_[t] likewise for t tokens.
  std::vector<int> decode_index_;
  std::vector<int> prefill_index_;
};

// Returns the attention planner options of `key` for a model and GPU: decode tiles of G rows
// (one token of each query-head group), prefill tiles of `prefill_tile_rows`, plan capacities from
// the key and `max_kv_len`. With num_kv_heads < 1 the decode part is left off (no division by
// it); SplitKvPlanner::Create refuses the head counts.
SplitKvPlannerOptions PlannerOptionsFor(const StepKey& key, int num_q_heads, int num_kv_heads,
                                        int head_dim, int sm_count, int max_kv_len,
                                        int prefill_tile_rows = 64);

// Returns the decode-attention split's aim that sizes the key's grid (SplitKvPlanner's
// decode.ctas_per_sm) under `aims` (RunnerOptions::decode_split_by_rows: a decode sequence is one
// row; aims[i] holds the counts above aims[i - 1].max_seqs up to its own, `otherwise` those above
// every rule). A decode key takes the largest aim of its batches' counts, min_rows to max_rows,
// since a step can aim lower than its key but not higher; a key with a prefill part takes the
// aim of max_rows (its decode part holds any count up to it, and the largest aim of them all
// would widen every mixed step's grid).
int DecodeCtasPerSm(const StepKey& key, const std::vector<SplitAim>& aims, int otherwise);

// Sets the key's decode split in `decode` (SplitKvPlanner's decode part) under `aims` and
// `otherwise` (as DecodeCtasPerSm): ctas_per_sm = DecodeCtasPerSm, which sizes the grid, and
// aim_by_seqs = `aims`, then `otherwise` for the counts above them up to the key's max_rows.
// Without that last rule the planner would aim those counts at ctas_per_sm, which for a key that
// also takes counts of a larger aim is that larger aim, not `otherwise` (a decode key of 32 rows
// that takes batches of 1–32 would split 25–32 sequences for 4 CTAs per SM under the default
// rules). The other fields of `decode` are left alone.
void SetDecodeSplit(const StepKey& key, const std::vector<SplitAim>& aims, int otherwise,
                    PlanPartOptions* decode);

// Where a key's step inputs sit in the metadata blob (byte offsets, each 256-byte aligned):
//   token_ids        int32 [max_tokens]            -1 past the step's tokens
//   positions        int32 [max_tokens]            0 past the step's tokens
//   last_token_rows  int32 [max_rows]              row of each sequence's last token; -1 after
//   plan             the attention plan blob        (plan_bytes)
//   block_table      int32 [max_rows, max_blocks_per_seq]   row i: sequence i's blocks, -1 after
// The block table comes last so a step can fetch only the rows of its sequences.
//
// How the step's first kernel copies a blob from pinned host memory (LaunchFetchStepMetadata,
// step_fetch.h): bytes [0, fixed_bytes) whatever the step; then, when row_bytes > 0, the first
// num_seqs rows of row_bytes each from table_offset, where num_seqs is the index of the first
// negative entry of the int32 [max_rows] at last_token_rows (FillStepInputs writes -1 after the
// step's sequences), or max_rows. All offsets and sizes are multiples of 4.
struct MetadataFetch {
  size_t fixed_bytes = 0;
  size_t table_offset = 0;
  size_t row_bytes = 0;  // 0: the whole table lies within fixed_bytes
  size_t last_token_rows = 0;
  int max_rows = 0;
};

// A block table of at most this many bytes is fetched whole, in the same read over PCIe as the
// rest of the blob; a larger one after the step's sequences were counted, a second read.
inline constexpr size_t kWholeTableFetchBytes = 64 * 1024;

struct MetadataLayout {
  size_t token_ids = 0;
  size_t positions = 0;
  size_t last_token_rows = 0;
  size_t plan = 0;
  size_t block_table = 0;
  size_t bytes = 0;  // the whole layout
  int max_tokens = 0;
  int max_rows = 0;
  int max_blocks_per_seq = 0;

  static MetadataLayout Create(const StepKey& key, size_t plan_bytes, int max_blocks_per_seq);

  // Returns the bytes a step of `num_seqs` sequences must upload: everything before the block
  // table and the table's first num_seqs rows.
  size_t UploadBytes(int num_seqs) const {
    return block_table + static_cast<size_t>(num_seqs) * max_blocks_per_seq * sizeof(int32_t);
  }

  // Returns how a step's first kernel fetches this layout's blob (MetadataFetch).
  MetadataFetch Fetch() const;
};

// Whether FillStepInputs reads every token and block id to refuse a negative one.
enum class StepIds {
  kCheck,  // refuse a negative id (-1 marks padding rows and unused table entries)
  // The caller already refused them: every token id lies in [0, vocab) and every block id came
  // from a SequenceTable, which hands out only [0, num_blocks) (Runner::Step). FillStepInputs
  // then only copies the ids; a negative one would be written as it is.
  kCheckedByCaller,
};

// Writes a step's token ids, positions, last-token rows and block-table rows into `blob` (laid out
// by `layout`, at least layout.bytes): `tokens[i]` are sequence i's new tokens (seqs[i].q_len of
// them), `blocks[i]` its KV blocks in position order, which must cover seqs[i].kv_len tokens
// of `block_size`. Rows past route.num_tokens / num_rows are padding (see MetadataLayout).
// InvalidArgument when the step does not fit the layout or the route, a sequence brings no
// token or has kv_len < q_len (its positions would be negative), a token count disagrees with
// q_len, a token or block id is negative (-1 marks padding; only with StepIds::kCheck), a block
// list is too short or too long for a row, block_size is not positive, or `blob` is null; every
// check comes before the first write, so a refused step leaves `blob` as it was. Block ids are
// not checked against the pool (the layout does not know it): they come from a SequenceTable.
absl::Status FillStepInputs(const MetadataLayout& layout, const StepRoute& route,
                            absl::Span<const SeqLens> seqs,
                            absl::Span<const absl::Span<const int32_t>> tokens,
                            absl::Span<const absl::Span<const int32_t>> blocks, int block_size,
                            void* blob, StepIds id_check = StepIds::kCheck);

}  // namespace kiln

#endif  // KILN_RUNTIME_RUNNER_STEP_PLAN_H_
