// SplitKvPlanner: the host-side work planner of kiln's attention kernels. From each sequence's
// (q_len, kv_len) it writes a plan in fixed-capacity arrays — work items (sequence, query tile,
// KV chunk), merge items and a per-step header — into a caller-owned plan blob that reaches the
// GPU with one asynchronous copy (see plan_buffers.h). No CUDA dependency.
//
//   kiln::SplitKvPlannerOptions options;
//   options.num_q_heads = 32;
//   options.num_kv_heads = 8;
//   options.head_dim = 128;
//   options.sm_count = 132;
//   options.key = {/*max_seqs=*/64, /*max_tokens=*/64, /*max_kv_len=*/32768};
//   options.decode.tile_rows = 4;      // one token of G = 4 heads per tile
//   ASSIGN_OR_RETURN(kiln::SplitKvPlanner planner, kiln::SplitKvPlanner::Create(options));
//   std::vector<kiln::SeqLens> seqs = {{1, 4096}, {1, 17}};
//   ASSIGN_OR_RETURN(kiln::PlanSummary summary, planner.Plan(seqs, buffers.host_plan()));
//   RETURN_IF_ERROR(buffers.Upload(stream));   // then launch or replay
//
// Graph safety. Everything a captured graph bakes in — the grids (work and merge capacities ×
// num_kv_heads), the tile shape, whether a merge runs, the workspace sizes and the plan's byte
// size — is a function of the options alone (the capture key among them), computed once in
// Create and exposed as layout(). Plan() only fills the arrays; the chunk size it picks lives in
// the uploaded header. Entries past the step's counts are padding (seq = -1) that kernels skip.
//
// Parts. A step may hold decode sequences (q_len 1) and prefill sequences (q_len > 1). When
// options.decode.tile_rows > 0, every q_len-1 sequence goes to the decode part and the others to
// the prefill part; otherwise every sequence goes to the prefill part. Each part has its own tile
// rows, capacities, workspace and header, sized from the key only.
//
// Query tiles. A sequence's q_len tokens × G = num_q_heads / num_kv_heads heads form q_len·G
// packed rows (row = token·G + g), cut into tiles of T rows. The number of tiles of a part is at
// most min(ceil(N·G/T) + B − 1, N) for at most B sequences and N tokens (each sequence wastes
// less than one tile, and with T ≥ G a tile holds at least one token). That closed form sizes the
// grid: a sampled "worst" distribution is not enough ([13, 13] with G = 5, T = 64 needs 4 tiles;
// [1, 25] needs only 3).
//
// KV split. A tile attends to KV positions [0, kv_len − q_len + last token of the tile + 1)
// (the kernel applies the causal mask inside). When a part allows splitting, the planner picks,
// per step, the smallest chunk size (a multiple of kv_granularity, at least min_kv_chunk) such
// that the tiles cut into more than one chunk use at most slot_capacity partial slots; the slot
// capacity is ceil(sm_count · ctas_per_sm / num_kv_heads), the number of work items that fills
// the GPU once. A tile in one chunk writes o directly; a tile in several writes partial slots
// that a merge item combines. Few long sequences therefore spread over the whole GPU, while
// many sequences run unsplit. With aim_by_seqs a step may aim at fewer CTAs per SM than the
// capacity was sized for, by its number of sequences in the part (the grid stays the key's).
//
// Thread-safety: a planner is immutable after Create; Plan() is const and writes only into the
// blob it is given (it keeps its scratch tiles at the end of the blob's work-item array), so
// threads may plan concurrently into different blobs. Plan() allocates nothing. It is host code
// and may be called in any capture phase (it touches no stream).
#ifndef KILN_ATTENTION_SPLIT_KV_PLANNER_H_
#define KILN_ATTENTION_SPLIT_KV_PLANNER_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "attention/attention_params.h"

namespace kiln {

// The capacities a capture key fixes for attention.
struct AttentionPlanKey {
  int max_seqs = 0;    // B: sequences per step (padded batch)
  int max_tokens = 0;  // N: new tokens per step, all sequences together
  int max_kv_len = 0;  // L: longest KV (cached plus new tokens) of any sequence
};

// One sequence of a step: new query tokens and KV length including them (kv_len >= 0; a row
// whose causal range is empty, e.g. kv_len < q_len, attends to nothing and yields zeros).
struct SeqLens {
  int32_t q_len = 0;
  int32_t kv_len = 0;
};

// A split aim for the steps whose part holds at most max_seqs sequences
// (PlanPartOptions::aim_by_seqs).
struct SplitAim {
  int max_seqs = 0;
  int ctas_per_sm = 0;
};

// Returns InvalidArgument, naming `name`[i] and the aim, unless every aim's max_seqs and
// ctas_per_sm are positive and max_seqs strictly ascends.
absl::Status CheckSplitAims(const std::vector<SplitAim>& aims, absl::string_view name);

// Settings of one part (the kernel family that runs it).
struct PlanPartOptions {
  int tile_rows = 0;         // packed query rows per tile (>= G); 0 disables the part
  int kv_granularity = 64;   // chunk sizes are multiples of this (the kernel's KV step)
  int min_kv_chunk = 256;    // no chunk is shorter than this (except a tile's last)
  int ctas_per_sm = 2;       // resident CTAs per SM the split aims to fill (sizes the grid)
  bool allow_split = true;   // false: never split, no merge, no partial workspace
  // Per step: the first rule whose max_seqs is at least the part's sequences sets the aim
  // instead of ctas_per_sm, capped at the slot capacity ctas_per_sm sized. Strictly ascending
  // max_seqs, each value positive; empty: ctas_per_sm for every step.
  std::vector<SplitAim> aim_by_seqs;
};

// Everything the planner needs; all of it is fixed for the planner's lifetime.
struct SplitKvPlannerOptions {
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int sm_count = 0;  // multiprocessors of the GPU (DeviceInfo::sm_count)
  AttentionPlanKey key;
  PlanPartOptions decode;   // q_len-1 sequences, when decode.tile_rows > 0
  PlanPartOptions prefill;  // all other sequences, when prefill.tile_rows > 0
};

// The key-only shape of one part: launch grids, capacities, offsets into the plan blob and
// partial workspace sizes. Identical for every step planned under one key.
struct PlanPartLayout {
  bool enabled = false;
  int tile_rows = 0;
  int max_tiles = 0;        // closed-form query-tile bound of this part
  int max_seqs = 0;         // sequences this part can receive under the key
  int max_tokens = 0;       // tokens this part can receive under the key
  int work_capacity = 0;    // work items (grid.x of the attention kernel; grid.y = kv heads)
  int merge_capacity = 0;   // merge items (grid.x of the merge kernel); 0: no merge launch
  int slot_capacity = 0;    // partial slots; 0 when the part never splits
  size_t header_offset = 0;       // AttentionPlanHeader in the plan blob
  size_t work_items_offset = 0;   // AttentionWorkItem[work_capacity]
  size_t merge_items_offset = 0;  // AttentionMergeItem[merge_capacity]
  size_t partial_o_bytes = 0;     // float [slot_capacity, num_kv_heads, tile_rows, head_dim]
  size_t partial_lse_bytes = 0;   // float [slot_capacity, num_kv_heads, tile_rows]
  size_t merge_counter_bytes = 0; // int32 [slot_capacity, num_kv_heads], zero-initialised

  // Returns true if the part splits KV (and so launches a merge).
  bool splits() const { return merge_capacity > 0; }
};

// A named buffer of the plan or its workspace, so a size check names what overflowed.
struct PlanBufferSize {
  const char* name;
  size_t bytes;
};

// The key-only layout of a whole plan: one blob holding the per-sequence arrays and each
// part's header and items (16-byte aligned sections), plus the partial workspaces.
struct PlanLayout {
  int max_seqs = 0;
  int group_size = 0;               // G = num_q_heads / num_kv_heads
  size_t seq_q_start_offset = 0;    // int32 [max_seqs + 1]: first token of each sequence
  size_t seq_kv_len_offset = 0;     // int32 [max_seqs]
  size_t plan_bytes = 0;            // size of the blob (one upload)
  PlanPartLayout decode;
  PlanPartLayout prefill;

  // Returns every buffer with its name ("plan", "decode partial_o", "decode merge counters",
  // ...) and size; buffers of a disabled or unsplit part have size 0.
  std::vector<PlanBufferSize> Buffers() const;
};

// What one Plan() call produced, per part.
struct PlanPartSummary {
  int num_seqs = 0;
  int num_tiles = 0;
  int num_work_items = 0;
  int num_merge_items = 0;
  int kv_chunk_size = 0;
};

struct PlanSummary {
  int num_seqs = 0;
  int num_tokens = 0;
  PlanPartSummary decode;
  PlanPartSummary prefill;
};

// Typed views of a plan blob laid out by a PlanLayout. They do not own memory.
struct PlanPartView {
  AttentionPlanHeader* header = nullptr;
  AttentionWorkItem* work_items = nullptr;
  AttentionMergeItem* merge_items = nullptr;
};

// Returns the views of `part` inside `blob` (laid out by the layout that owns `part`).
PlanPartView ViewPart(void* blob, const PlanPartLayout& part);

// Returns the closed-form tile bound min(ceil(n·g/t) + b − 1, n) (0 when b or n is 0), for at
// most `b` sequences and `n` tokens, `g` rows per token and `t` rows per tile (t >= g). Any
// non-positive argument gives 0; with t < g the bound is min(ceil(n·g/t) + b − 1,
// n·ceil(g/t)), saturated at INT32_MAX.
int MaxQueryTiles(int b, int n, int g, int t);

class SplitKvPlanner {
 public:
  // Validates `options` and computes the layout. InvalidArgument names a bad option, including
  // a key or options whose counts would not fit the plan's int32 fields (max_tokens × G packed
  // rows, max_kv_len rounded up to kv_granularity, work items per part).
  static absl::StatusOr<SplitKvPlanner> Create(const SplitKvPlannerOptions& options);

  // Returns the key-only layout (grids, capacities, sizes).
  const PlanLayout& layout() const { return layout_; }
  const SplitKvPlannerOptions& options() const { return options_; }

  // Plans one step into `blob` (layout().plan_bytes bytes, 16-byte aligned, e.g.
  // PlanBuffers::host_plan()). Sequence i of `seqs` is index i of the kernels' per-sequence
  // arrays and of the block table. InvalidArgument when the step exceeds the key (more
  // sequences than max_seqs, more tokens than max_tokens, a kv_len above max_kv_len) or a
  // sequence has no part to go to; the blob is then unspecified. No allocation.
  absl::StatusOr<PlanSummary> Plan(absl::Span<const SeqLens> seqs, void* blob) const;

 private:
  SplitKvPlanner(const SplitKvPlannerOptions& options, const PlanLayout& layout)
      : options_(options), layout_(layout) {}

  // Cuts the sequences routed to one part into tiles, chooses the chunk size and writes the
  // part's items, merges, padding and header into `view`.
  absl::Status PlanPart(absl::Span<const SeqLens> seqs, bool decode_part,
                        const PlanPartOptions& part_options, const PlanPartLayout& part,
                        PlanPartView view, PlanPartSummary* summary) const;

  SplitKvPlannerOptions options_;
  PlanLayout layout_;
};

}  // namespace kiln

#endif  // KILN_ATTENTION_SPLIT_KV_PLANNER_H_
