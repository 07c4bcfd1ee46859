// Test-only helpers for the prefill attention kernel: work items built the way a planner would
// (with and without KV splits), random paged KV caches with poisoned unused slots, device copies,
// and a CPU float64 reference.
//
//   std::vector<prefill_testing::SeqSpec> seqs = {{/*q_len=*/37, /*kv_len=*/100}, {1, 1}};
//   prefill_testing::Shape shape{AttentionDtype::kBf16, /*head_dim=*/128, /*tile_rows=*/64,
//                                /*num_q_heads=*/8, /*num_kv_heads=*/2, /*block_size=*/16};
//   auto data = prefill_testing::MakeRandomBatch(shape, seqs, /*seed=*/1);
//   auto plan = prefill_testing::BuildPlan(seqs, shape.group(), shape.tile_rows, /*kv_chunk=*/0);
//   ASSERT_OK_AND_ASSIGN(auto dev, prefill_testing::DeviceBatch::Upload(data, plan, capacity));
//   ASSERT_OK(LaunchPrefillAttention(dev.Params(), stream));
//   std::vector<double> ref = prefill_testing::ReferenceOutput(data);
//
// Not thread-safe; host-only except DeviceBatch, which allocates and copies (not during capture).
#ifndef KILN_ATTENTION_PREFILL_TEST_UTIL_H_
#define KILN_ATTENTION_PREFILL_TEST_UTIL_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "attention/attention_params.h"
#include "attention/prefill_kernel.h"
#include "attention/split_kv_planner.h"
#include "runtime/cuda/device_buffer.h"

namespace kiln {
namespace prefill_testing {

// One sequence of a batch: q_len new tokens, kv_len cached tokens including the new ones.
struct SeqSpec {
  int q_len = 0;
  int kv_len = 0;
};

// Model-side shape of a test batch.
struct Shape {
  AttentionDtype dtype = AttentionDtype::kBf16;
  int head_dim = 128;
  int tile_rows = 64;
  int num_q_heads = 8;
  int num_kv_heads = 2;
  int block_size = 16;
  int group() const { return num_q_heads / num_kv_heads; }
};

// Work items and merge items of one batch, built like the planner does. Items are ordered by
// decreasing KV extent, so the longest run first.
struct TestPlan {
  std::vector<AttentionWorkItem> items;
  std::vector<AttentionMergeItem> merges;
  int num_slots = 0;
};

// Returns a plan with one item per (sequence, tile) when kv_chunk is 0. Otherwise each tile's
// visible KV [0, last visible key] is cut at multiples of kv_chunk; a tile that needs one chunk
// keeps partial_slot = -1, a longer one gets one partial slot per chunk and a merge item. With
// extra_empty_chunk, every split tile also gets a chunk past its last visible key, which the
// kernel must report as empty (lse = -inf).
TestPlan BuildPlan(const std::vector<SeqSpec>& seqs, int group, int tile_rows, int kv_chunk,
                   bool extra_empty_chunk = false);

// Plans `seqs` with the real SplitKvPlanner (its prefill part) and returns the part's valid work
// and merge items, with num_slots = the part's slot capacity; `capacity` receives the part's
// work capacity (the grid the capture key fixes). Checks that the planner's per-sequence arrays
// agree with the batch layout the tests use.
absl::StatusOr<TestPlan> PlanWithPlanner(const SplitKvPlanner& planner,
                                         const std::vector<SeqSpec>& seqs, int* capacity);

// Returns min(ceil(max_tokens * G / T) + max_seqs - 1, max_tokens): the most query tiles any
// batch of at most max_seqs sequences and max_tokens tokens can need.
int TileCapacity(int max_tokens, int max_seqs, int group, int tile_rows);

// Converts between float and the 16-bit storage of `dtype` (round to nearest even).
uint16_t FloatToBits(float value, AttentionDtype dtype);
float BitsToFloat(uint16_t bits, AttentionDtype dtype);

// A batch on the host: inputs as 16-bit values, with float copies for the reference.
struct HostBatch {
  Shape shape;
  std::vector<SeqSpec> seqs;
  int num_tokens = 0;      // tokens of the sequences
  int q_rows = 0;          // rows of q and o (>= num_tokens)
  int max_seqs = 0;
  int num_blocks = 0;
  int max_blocks_per_seq = 0;
  std::vector<int32_t> seq_q_start;   // [max_seqs + 1]
  std::vector<int32_t> seq_kv_len;    // [max_seqs]
  std::vector<int32_t> block_table;   // [max_seqs, max_blocks_per_seq]; unused entries invalid
  std::vector<uint16_t> q;            // [q_rows, num_q_heads, head_dim]
  std::vector<uint16_t> k_cache;      // [num_blocks, num_kv_heads, block_size, head_dim]
  std::vector<uint16_t> v_cache;
  std::vector<float> qf, kf, vf;      // the same values as float

  // Returns the float K (or V) element of sequence s at KV position pos.
  const float* K(int s, int pos, int kv_head) const;
  const float* V(int s, int pos, int kv_head) const;
};

// Fixed sizes for batches that must share device buffers (graph replays): 0 means "just enough".
struct BatchSizes {
  int num_tokens = 0;          // q rows (>= the batch's tokens; the rest are random padding)
  int max_seqs = 0;            // rows of block_table, entries of seq_kv_len
  int max_blocks_per_seq = 0;
  int num_blocks = 0;
};

// Returns a batch with fresh random q, K and V (uniform in [-2, 2]) for `seqs`, blocks scattered
// over a cache with spare blocks; every cache slot no sequence owns holds NaN, and block-table
// entries past a sequence's end point far outside the cache, so a read there shows. Sequences
// past seqs.size() (up to sizes.max_seqs) are empty.
HostBatch MakeRandomBatch(const Shape& shape, const std::vector<SeqSpec>& seqs, uint64_t seed,
                          const BatchSizes& sizes = {});

// Returns float64 attention of sequence s, token j (0-based among its new tokens), query head h
// over keys [kv_begin, kv_end) intersected with its causal range: the normalised output
// [head_dim] in `out` and the log2-sum-exp of the scaled scores (-inf when no key is visible).
double ReferenceRow(const HostBatch& batch, int s, int j, int h, int kv_begin, int kv_end,
                    float softmax_scale, double* out);

// Returns the float64 reference output [num_tokens, num_q_heads, head_dim], threaded.
std::vector<double> ReferenceOutput(const HostBatch& batch, float softmax_scale);

// Returns the largest per-token relative error ||o - ref|| / ||ref|| over the first
// `num_tokens` tokens (each token's norm over all heads); infinity if any value is NaN or Inf.
double MaxTokenRelativeError(const std::vector<float>& out, const std::vector<double>& ref,
                             int num_tokens, int token_elems);

// Device copies of a batch and a plan, and the params that launch the kernel over them.
class DeviceBatch {
 public:
  // Uploads `batch` and `plan` (items padded with seq = -1 to `capacity`), allocates o with
  // q_rows rows and partial buffers for max(plan's slots, max_slots) slots.
  static absl::StatusOr<DeviceBatch> Upload(const HostBatch& batch, const TestPlan& plan,
                                            int capacity, int max_slots = 0);

  // Returns params for the whole capacity (grid.x = capacity).
  PrefillAttentionParams Params() const;

  // Fills o and the partial buffers with NaN.
  absl::Status Poison(cudaStream_t stream);

  // Copies o ([q_rows, heads, head_dim]) to the host as float (synchronous).
  absl::StatusOr<std::vector<float>> DownloadOutput(cudaStream_t stream) const;
  absl::StatusOr<std::vector<float>> DownloadPartialO(cudaStream_t stream) const;
  absl::StatusOr<std::vector<float>> DownloadPartialLse(cudaStream_t stream) const;
  // Copies o as raw 16-bit values (for bit-exact comparisons).
  absl::StatusOr<std::vector<uint16_t>> DownloadOutputBits(cudaStream_t stream) const;

  // Copies `batch` and `plan` (padded to the capacity) into the buffers allocated at Upload,
  // which keep their addresses (for graph replays with new contents); the batch must have the
  // same sizes as the uploaded one and the plan at most its slots.
  absl::Status Update(const HostBatch& batch, const TestPlan& plan, cudaStream_t stream);

  int capacity() const { return capacity_; }
  void* o() const { return o_.data(); }

 private:
  Shape shape_;
  int capacity_ = 0;
  int q_rows_ = 0;
  int max_seqs_ = 0;
  int max_blocks_per_seq_ = 0;
  int num_slots_ = 0;
  DeviceBuffer q_, o_, k_, v_, block_table_, q_start_, kv_len_, items_, partial_o_, partial_lse_;
};

}  // namespace prefill_testing
}  // namespace kiln

#endif  // KILN_ATTENTION_PREFILL_TEST_UTIL_H_
