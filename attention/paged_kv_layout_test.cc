#include "attention/paged_kv_layout.h"

#include <sys/resource.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "attention/internal/sweep_values.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

using attention_internal::Chance;
using attention_internal::CheckRefusal;
using attention_internal::Draw;
using attention_internal::Uniform;
using attention_internal::kInt32Max;
using attention_internal::kInt32Min;

PagedKvLayout Layout(int num_blocks, int block_size) {
  return PagedKvLayout{num_blocks, block_size, /*num_kv_heads=*/2, /*head_dim=*/64,
                       AttentionDtype::kBf16};
}

TEST(PagedKvLayoutTest, ValidatesBlockSizeAndShape) {
  EXPECT_TRUE(Layout(8, 16).Validate().ok());
  EXPECT_TRUE(Layout(8, 64).Validate().ok());
  const absl::Status bad = Layout(8, 24).Validate();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("block_size 24"), std::string::npos) << bad;
  EXPECT_FALSE(Layout(8, 8).Validate().ok());
  EXPECT_FALSE(Layout(0, 16).Validate().ok());
  PagedKvLayout odd = Layout(8, 16);
  odd.head_dim = 60;
  EXPECT_FALSE(odd.Validate().ok());
}

TEST(PagedKvLayoutTest, RefusesMoreSlotsThanInt32Holds) {
  EXPECT_TRUE(Layout((1 << 27) - 1, 16).Validate().ok());
  const absl::Status many = Layout(1 << 27, 16).Validate();  // 2^31 slots
  EXPECT_EQ(many.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(many.message().find("134217728 blocks x 16 tokens"), std::string::npos) << many;
}

TEST(PagedKvLayoutTest, OffsetsFollowBlockHeadTokenOrder) {
  for (int bs : {16, 64}) {
    const PagedKvLayout l = Layout(10, bs);
    EXPECT_EQ(l.BlockElements(), static_cast<size_t>(2 * bs * 64));
    EXPECT_EQ(l.PoolBytes(), static_cast<size_t>(10) * 2 * bs * 64 * 2);
    // slot = block 3, offset 5; head 1.
    const int64_t slot = 3 * bs + 5;
    EXPECT_EQ(l.ElementOffset(slot, 1), static_cast<size_t>(((3 * 2 + 1) * bs + 5) * 64));
    EXPECT_EQ(l.ElementOffset(0, 0), 0u);
  }
}

TEST(BlockTableTest, ReservesGrowsAndReleases) {
  for (int bs : {16, 64}) {
    const PagedKvLayout l = Layout(8, bs);
    std::vector<int32_t> storage(3 * 4, 1234);
    BlockTable table(absl::MakeSpan(storage), /*max_seqs=*/3, /*max_blocks_per_seq=*/4, l);
    for (int32_t e : storage) EXPECT_EQ(e, -1);
    EXPECT_EQ(table.free_blocks(), 8);
    ASSERT_TRUE(table.Reserve(0, bs + 1).ok());  // 2 blocks
    EXPECT_EQ(table.blocks_of(0), 2);
    ASSERT_TRUE(table.Reserve(0, bs).ok());  // already has enough
    EXPECT_EQ(table.blocks_of(0), 2);
    ASSERT_TRUE(table.Reserve(1, 3 * bs).ok());
    ASSERT_TRUE(table.Reserve(0, 4 * bs).ok());  // grows to 4
    EXPECT_EQ(table.free_blocks(), 1);
    EXPECT_EQ(table.max_blocks_in_use(), 4);
    std::set<int32_t> used;
    for (int s = 0; s < 2; ++s) {
      for (int b = 0; b < table.blocks_of(s); ++b) {
        const int32_t block = table.at(s, b);
        EXPECT_GE(block, 0);
        EXPECT_LT(block, 8);
        EXPECT_TRUE(used.insert(block).second) << "block " << block << " given twice";
      }
    }
    const absl::Status full = table.Reserve(2, 2 * bs);
    EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_EQ(table.blocks_of(2), 0);  // nothing taken on failure
    EXPECT_EQ(table.Reserve(2, 5 * bs).code(), absl::StatusCode::kInvalidArgument);
    table.Release(1);
    EXPECT_EQ(table.free_blocks(), 4);
    EXPECT_EQ(table.at(1, 0), -1);
    EXPECT_TRUE(table.Reserve(2, 2 * bs).ok());
  }
}

TEST(BlockTableTest, FreeOrderScattersBlocks) {
  const PagedKvLayout l = Layout(4, 16);
  std::vector<int32_t> storage(2 * 2);
  BlockTable table(absl::MakeSpan(storage), 2, 2, l);
  const std::vector<int32_t> order = {3, 1, 0, 2};
  ASSERT_TRUE(table.SetFreeOrder(order).ok());
  ASSERT_TRUE(table.Reserve(0, 32).ok());
  ASSERT_TRUE(table.Reserve(1, 20).ok());
  EXPECT_EQ(table.at(0, 0), 3);
  EXPECT_EQ(table.at(0, 1), 1);
  EXPECT_EQ(table.at(1, 0), 0);
  EXPECT_EQ(table.at(1, 1), 2);
  EXPECT_FALSE(table.SetFreeOrder(order).ok());  // blocks are in use
  const std::vector<int32_t> repeated = {0, 0, 1, 2};
  table.Release(0);
  table.Release(1);
  EXPECT_EQ(table.SetFreeOrder(repeated).code(), absl::StatusCode::kInvalidArgument);
}

// Sizes near int32's limit, storage shorter than the rows, and an unvalidated layout are refused
// with a Status, never a wrapped block count, a write past the storage or a division by zero.
TEST(BlockTableTest, RefusesWhatWouldOverflowOrWritePastTheStorage) {
  const PagedKvLayout l = Layout(8, 16);
  std::vector<int32_t> storage(2 * 4);
  BlockTable table(absl::MakeSpan(storage), 2, 4, l);
  const absl::Status huge = table.Reserve(0, 2147483647);
  EXPECT_EQ(huge.code(), absl::StatusCode::kInvalidArgument) << huge;
  EXPECT_EQ(table.blocks_of(0), 0);

  std::vector<int32_t> short_storage(4 + 2, 7);  // one row and a half for two sequences
  BlockTable short_table(absl::MakeSpan(short_storage), 2, 4, l);
  EXPECT_TRUE(short_table.Reserve(0, 64).ok());
  const absl::Status past = short_table.Reserve(1, 16);
  EXPECT_EQ(past.code(), absl::StatusCode::kFailedPrecondition) << past;
  EXPECT_EQ(short_table.blocks_of(1), 0);

  std::vector<int32_t> none;
  BlockTable unvalidated(absl::MakeSpan(none), 1, 0, Layout(4, 0));
  EXPECT_EQ(unvalidated.Reserve(0, 1).code(), absl::StatusCode::kFailedPrecondition);
  BlockTable negative(absl::MakeSpan(none), -1, -2, Layout(-3, 16));
  EXPECT_EQ(negative.free_blocks(), 0);
  EXPECT_EQ(negative.Reserve(0, 1).code(), absl::StatusCode::kInvalidArgument);
}

TEST(FillSlotMappingTest, RefusesMoreSequencesThanTheTable) {
  const PagedKvLayout l = Layout(8, 16);
  std::vector<int32_t> storage(2 * 2);
  BlockTable table(absl::MakeSpan(storage), 2, 2, l);
  ASSERT_TRUE(table.Reserve(0, 4).ok());
  ASSERT_TRUE(table.Reserve(1, 4).ok());
  std::vector<int32_t> slots(8);
  const std::vector<SeqLens> three = {{1, 4}, {1, 4}, {1, 4}};
  const absl::Status more = FillSlotMapping(three, table, absl::MakeSpan(slots));
  EXPECT_EQ(more.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(more.message().find("3 sequences; the block table holds 2"), std::string::npos)
      << more;
  const std::vector<SeqLens> two = {{1, 4}, {1, 4}};
  EXPECT_TRUE(FillSlotMapping(two, table, absl::MakeSpan(slots)).ok());
}

TEST(FillSlotMappingTest, MapsNewTokensAndPadsTheRest) {
  const int bs = 16;
  const PagedKvLayout l = Layout(16, bs);
  std::vector<int32_t> storage(3 * 4);
  BlockTable table(absl::MakeSpan(storage), 3, 4, l);
  const std::vector<int32_t> order = {5, 9, 2, 7, 0, 1, 3, 4, 6, 8, 10, 11, 12, 13, 14, 15};
  ASSERT_TRUE(table.SetFreeOrder(order).ok());
  // Sequence 0: 3 new tokens ending at kv_len 18 (positions 15, 16, 17); sequence 1: one
  // decode token at position 40; sequence 2: nothing new.
  const std::vector<SeqLens> seqs = {{3, 18}, {1, 41}, {0, 7}};
  ASSERT_TRUE(table.Reserve(0, 18).ok());  // blocks 5, 9
  ASSERT_TRUE(table.Reserve(1, 41).ok());  // blocks 2, 7, 0
  ASSERT_TRUE(table.Reserve(2, 7).ok());   // block 1
  std::vector<int32_t> slots(6, 99);
  ASSERT_TRUE(FillSlotMapping(seqs, table, absl::MakeSpan(slots)).ok());
  EXPECT_EQ(slots[0], 5 * bs + 15);
  EXPECT_EQ(slots[1], 9 * bs + 0);
  EXPECT_EQ(slots[2], 9 * bs + 1);
  EXPECT_EQ(slots[3], 0 * bs + 8);  // position 40: logical block 2 -> block 0, offset 8
  EXPECT_EQ(slots[4], -1);
  EXPECT_EQ(slots[5], -1);
  std::vector<int32_t> short_slots(2);
  EXPECT_FALSE(FillSlotMapping(seqs, table, absl::MakeSpan(short_slots)).ok());
  const std::vector<SeqLens> unreserved = {{1, 70}};
  EXPECT_FALSE(FillSlotMapping(unreserved, table, absl::MakeSpan(slots)).ok());
}


// --- Adversarial sweeps: layouts, tables and steps with sizes from the whole int32 range,
// each checked against a model written here. Seeded, so a failure reproduces.


std::string Str(int64_t v) { return std::to_string(v); }

// The refusals Validate() must give (strings its message must hold); empty: it must accept.
std::vector<std::vector<std::string>> ModelValidate(const PagedKvLayout& l) {
  std::vector<std::vector<std::string>> bad;
  if (l.num_blocks <= 0) bad.push_back({"num_blocks " + Str(l.num_blocks)});
  if (l.block_size < 16 || (l.block_size & (l.block_size - 1)) != 0) {
    bad.push_back({"block_size " + Str(l.block_size)});
  }
  if (l.num_kv_heads <= 0) bad.push_back({"num_kv_heads " + Str(l.num_kv_heads)});
  if (l.head_dim <= 0 || l.head_dim % 8 != 0) bad.push_back({"head_dim " + Str(l.head_dim)});
  if (l.dtype != AttentionDtype::kBf16 && l.dtype != AttentionDtype::kFp16) {
    bad.push_back({"dtype " + Str(static_cast<int>(l.dtype))});
  }
  if (!bad.empty()) return bad;
  if (int64_t{l.num_blocks} * l.block_size > kInt32Max) {
    bad.push_back({Str(l.num_blocks) + " blocks x " + Str(l.block_size) + " tokens"});
  }
  const unsigned __int128 bytes = static_cast<unsigned __int128>(2) * l.num_blocks *
                                  l.block_size * l.num_kv_heads * l.head_dim;
  if (bytes > static_cast<unsigned __int128>(std::numeric_limits<int64_t>::max())) {
    bad.push_back({Str(l.num_blocks) + " blocks x", "bytes per pool"});
  }
  return bad;
}

// Layouts from the whole int32 range (and unknown dtypes): refused ones name the bad field and
// value; accepted ones report their pool exactly and place every (slot, head) row inside it, at
// the offset the block-head-token order gives.
TEST(PagedKvLayoutSweepTest, ValidateNamesTheFieldAndAcceptedPoolsHoldEveryRow) {
  std::mt19937 rng(4099);
  int accepted = 0, refused = 0;
  for (int trial = 0; trial < 100000; ++trial) {
    PagedKvLayout l;
    l.num_blocks = Draw(rng, 1, 4096, 0.3);
    l.block_size = Chance(rng, 0.7) ? int32_t{16} << Uniform(rng, 0, 4) : Draw(rng, 1, 128, 0.8);
    l.num_kv_heads = Draw(rng, 1, 16, 0.3);
    l.head_dim = Chance(rng, 0.7) ? 8 * Uniform(rng, 1, 32) : Draw(rng, 1, 512, 0.8);
    l.dtype = Chance(rng, 0.5) ? AttentionDtype::kBf16 : AttentionDtype::kFp16;
    if (Chance(rng, 0.03)) l.dtype = static_cast<AttentionDtype>(Draw(rng, 2, 9, 0.5));
    const auto want = ModelValidate(l);
    const absl::Status status = l.Validate();
    const std::string where = "layout {" + Str(l.num_blocks) + ", " + Str(l.block_size) + ", " +
                              Str(l.num_kv_heads) + ", " + Str(l.head_dim) + ", dtype " +
                              Str(static_cast<int>(l.dtype)) + "}";
    if (!want.empty()) {
      ++refused;
      ASSERT_EQ(CheckRefusal(status, absl::StatusCode::kInvalidArgument, want), "") << where;
      continue;
    }
    ASSERT_TRUE(status.ok()) << where << ": " << status;
    ++accepted;
    const unsigned __int128 elements = static_cast<unsigned __int128>(l.num_blocks) *
                                       l.block_size * l.num_kv_heads * l.head_dim;
    ASSERT_EQ(l.BlockElements(), static_cast<size_t>(elements / l.num_blocks)) << where;
    ASSERT_EQ(l.PoolBytes(), static_cast<size_t>(elements * 2)) << where;
    const int64_t slots = int64_t{l.num_blocks} * l.block_size;
    for (int k = 0; k < 8; ++k) {
      const int64_t slot =
          k == 0 ? slots - 1 : std::uniform_int_distribution<int64_t>(0, slots - 1)(rng);
      const int head = k == 1 ? l.num_kv_heads - 1 : Uniform(rng, 0, l.num_kv_heads - 1);
      const unsigned __int128 want_offset =
          (static_cast<unsigned __int128>(slot / l.block_size) * l.num_kv_heads + head) *
              l.block_size * l.head_dim +
          static_cast<unsigned __int128>(slot % l.block_size) * l.head_dim;
      const size_t offset = l.ElementOffset(slot, head);
      ASSERT_EQ(offset, static_cast<size_t>(want_offset)) << where << " slot " << slot;
      ASSERT_LE(want_offset + l.head_dim, elements) << where << " slot " << slot;
    }
  }
  RecordProperty("accepted", accepted);
  RecordProperty("refused", refused);
  EXPECT_GT(accepted, 10000);
  EXPECT_GT(refused, 10000);
}

// A pool whose bytes pass int64 (and so would wrap PoolBytes() into a small allocation that
// succeeds) is refused; the largest one below is accepted with its exact size.
TEST(PagedKvLayoutSweepTest, RefusesPoolsPastInt64Bytes) {
  PagedKvLayout l{1, 1 << 30, 1 << 15, 1 << 16, AttentionDtype::kBf16};  // 2^62 bytes
  ASSERT_TRUE(l.Validate().ok()) << l.Validate();
  EXPECT_EQ(l.PoolBytes(), size_t{1} << 62);
  l.num_kv_heads = 1 << 16;  // 2^63 bytes
  EXPECT_EQ(CheckRefusal(l.Validate(), absl::StatusCode::kInvalidArgument,
                         {{"1 blocks x 1073741824 tokens x 65536 KV heads", "bytes per pool"}}),
            "");
  // 2^10 blocks x 2^20 tokens x 2^20 heads x 2^20 dims: 2^71 bytes, 0 once wrapped to 64 bits.
  l = PagedKvLayout{1 << 10, 1 << 20, 1 << 20, 1 << 20, AttentionDtype::kFp16};
  EXPECT_EQ(l.Validate().code(), absl::StatusCode::kInvalidArgument);
  l.dtype = static_cast<AttentionDtype>(7);
  l.num_kv_heads = 1;
  l.head_dim = 8;
  EXPECT_EQ(CheckRefusal(l.Validate(), absl::StatusCode::kInvalidArgument, {{"dtype 7"}}), "");
}

// The table a model keeps: free stack (back taken first) and each sequence's blocks.
struct TableModel {
  bool valid_layout = false;
  int num_blocks = 0, block_size = 0, max_seqs = 0, max_blocks_per_seq = 0;
  size_t storage = 0;
  std::vector<int32_t> free;
  std::map<int, std::vector<int32_t>> rows;  // per sequence that holds blocks

  bool RowFits(int seq) const {
    return (static_cast<size_t>(seq) + 1) * max_blocks_per_seq <= storage;
  }
};

// Returns "" when `table` and its storage match the model: the same blocks in every row, -1
// past them, every block either free or in exactly one row.
std::string CheckTable(const BlockTable& table, absl::Span<const int32_t> storage,
                       const TableModel& m) {
  if (table.free_blocks() != static_cast<int>(m.free.size())) {
    return "free_blocks " + Str(table.free_blocks()) + " want " + Str(m.free.size());
  }
  size_t used = 0;
  int widest = 0;
  std::vector<bool> seen(m.num_blocks, false);
  for (const auto& [s, blocks] : m.rows) {
    used += blocks.size();
    widest = std::max(widest, static_cast<int>(blocks.size()));
  }
  for (int s = 0; s < m.max_seqs && s < 64; ++s) {
    const auto it = m.rows.find(s);
    const std::vector<int32_t> row = it == m.rows.end() ? std::vector<int32_t>() : it->second;
    if (table.blocks_of(s) != static_cast<int>(row.size())) return "blocks_of " + Str(s);
    if (!m.RowFits(s)) continue;
    for (int b = 0; b < m.max_blocks_per_seq; ++b) {
      const int32_t want = b < static_cast<int>(row.size()) ? row[b] : -1;
      if (storage[static_cast<size_t>(s) * m.max_blocks_per_seq + b] != want) {
        return "row " + Str(s) + " entry " + Str(b);
      }
      if (want >= 0) {
        if (want >= m.num_blocks || seen[want]) return "block " + Str(want) + " twice or unknown";
        seen[want] = true;
      }
    }
  }
  if (table.max_blocks_in_use() != widest) return "max_blocks_in_use";
  if (m.valid_layout && used + m.free.size() != static_cast<size_t>(m.num_blocks)) {
    return "blocks lost or made up";
  }
  for (int32_t seq : {-1, kInt32Min, m.max_seqs, kInt32Max}) {
    if (table.blocks_of(seq) != 0) return "blocks_of outside the table";
  }
  return "";
}

// Random Reserve, Release, SetFreeOrder and FillSlotMapping calls with adversarial arguments on
// tables of adversarial shapes (bad layouts, rows of no blocks, storage shorter or longer than
// the rows), each against the model: the same status code and message, the same blocks, the same
// slots.
TEST(PagedKvLayoutSweepTest, BlockTableAndSlotMappingFollowTheModel) {
  std::mt19937 rng(1337);
  int ok_reserves = 0, refused_reserves = 0, exhausted = 0, ok_maps = 0, refused_maps = 0;
  for (int trial = 0; trial < 400; ++trial) {
    PagedKvLayout layout{Chance(rng, 0.9) ? Uniform(rng, 1, 48) : Draw(rng, 1, 48, 1.0),
                         Chance(rng, 0.9) ? int32_t{16} << Uniform(rng, 0, 2)
                                          : Draw(rng, 1, 64, 1.0),
                         2, 64, AttentionDtype::kBf16};
    // A valid pool stays small enough to model; a bad one keeps its huge count, which the table
    // must not allocate by.
    if (layout.Validate().ok() && layout.num_blocks > 4096) layout.num_blocks = 4096;
    TableModel m;
    m.valid_layout = layout.Validate().ok();
    m.num_blocks = m.valid_layout ? layout.num_blocks : 0;
    m.block_size = layout.block_size;
    const int32_t max_seqs = Chance(rng, 0.9) ? Uniform(rng, 0, 8) : Draw(rng, 0, 8, 1.0);
    const int32_t mbps = Chance(rng, 0.9) ? Uniform(rng, 0, 8) : Draw(rng, 0, 8, 1.0);
    m.max_seqs = std::max(max_seqs, 0);
    m.max_blocks_per_seq = std::max(mbps, 0);
    // Usually exactly the rows; sometimes fewer or more entries (at most 4096 either way).
    const size_t rows_entries =
        std::min<size_t>(4096, static_cast<size_t>(m.max_seqs) * m.max_blocks_per_seq);
    m.storage = Chance(rng, 0.8) ? rows_entries : static_cast<size_t>(Uniform(rng, 0, 4096));
    std::vector<int32_t> storage(m.storage, 12345);
    BlockTable table(absl::MakeSpan(storage), max_seqs, mbps, layout);
    for (int b = m.num_blocks - 1; b >= 0; --b) m.free.push_back(b);
    const std::string where = "trial " + Str(trial) + " layout {" + Str(layout.num_blocks) +
                              ", " + Str(layout.block_size) + "} seqs " + Str(max_seqs) +
                              " x " + Str(mbps) + " storage " + Str(m.storage);
    ASSERT_EQ(CheckTable(table, storage, m), "") << where;
    // Token counts up to one block past the row, within int32.
    const int32_t row_tokens = static_cast<int32_t>(std::min<int64_t>(
        kInt32Max, (int64_t{m.max_blocks_per_seq} + 1) * std::max(m.block_size, 1)));
    for (int op = 0; op < 200; ++op) {
      const int kind = Uniform(rng, 0, 9);
      const int32_t seq = Chance(rng, 0.9) ? Uniform(rng, -1, m.max_seqs) : Draw(rng, 0, 8, 1.0);
      if (kind <= 4) {  // Reserve
        const int32_t tokens =
            Chance(rng, 0.9) ? Uniform(rng, 0, row_tokens) : Draw(rng, 0, 64, 1.0);
        const absl::Status status = table.Reserve(seq, tokens);
        const std::string call = where + " Reserve(" + Str(seq) + ", " + Str(tokens) + ")";
        if (seq < 0 || seq >= m.max_seqs) {
          ASSERT_EQ(CheckRefusal(status, absl::StatusCode::kInvalidArgument,
                                 {{"sequence " + Str(seq)}}), "") << call;
          ++refused_reserves;
        } else if (tokens < 0) {
          ASSERT_EQ(CheckRefusal(status, absl::StatusCode::kInvalidArgument,
                                 {{"num_tokens " + Str(tokens)}}), "") << call;
          ++refused_reserves;
        } else if (!m.valid_layout) {
          ASSERT_EQ(CheckRefusal(status, absl::StatusCode::kFailedPrecondition, {{"layout"}}), "")
              << call;
          ++refused_reserves;
        } else if (!m.RowFits(seq)) {
          ASSERT_EQ(CheckRefusal(status, absl::StatusCode::kFailedPrecondition,
                                 {{"storage holds " + Str(m.storage)}}), "") << call;
          ++refused_reserves;
        } else {
          const int64_t need = (int64_t{tokens} + m.block_size - 1) / m.block_size;
          std::vector<int32_t>& row = m.rows[seq];
          const int64_t more = need - static_cast<int64_t>(row.size());
          if (need > m.max_blocks_per_seq) {
            ASSERT_EQ(CheckRefusal(status, absl::StatusCode::kInvalidArgument,
                                   {{"max_blocks_per_seq " + Str(m.max_blocks_per_seq)}}), "")
                << call;
            ++refused_reserves;
          } else if (more > static_cast<int64_t>(m.free.size())) {
            ASSERT_EQ(CheckRefusal(status, absl::StatusCode::kResourceExhausted,
                                   {{Str(m.free.size()) + " free blocks"}}), "") << call;
            ++exhausted;
          } else {
            ASSERT_TRUE(status.ok()) << call << ": " << status;
            ++ok_reserves;
            for (int64_t i = 0; i < more; ++i) {
              row.push_back(m.free.back());
              m.free.pop_back();
            }
          }
        }
      } else if (kind <= 6) {  // Release
        table.Release(seq);
        if (const auto it = m.rows.find(seq); it != m.rows.end()) {
          for (auto b = it->second.rbegin(); b != it->second.rend(); ++b) m.free.push_back(*b);
          m.rows.erase(it);
        }
      } else if (kind == 7) {  // SetFreeOrder
        std::vector<int32_t> order(m.valid_layout ? m.num_blocks : Uniform(rng, 0, 4));
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), rng);
        const int damage = Uniform(rng, 0, 5);  // 0: a repeat, 1: out of range, 2: one short
        if (damage == 0 && order.size() >= 2) order[1] = order[0];
        if (damage == 1 && !order.empty()) order[0] = Chance(rng, 0.5) ? -1 : m.num_blocks;
        if (damage == 2 && !order.empty()) order.pop_back();
        const absl::Status status = table.SetFreeOrder(order);
        const bool all_free = static_cast<int>(m.free.size()) == m.num_blocks;
        std::vector<int32_t> sorted = order;
        std::sort(sorted.begin(), sorted.end());
        std::vector<int32_t> identity(m.num_blocks);
        std::iota(identity.begin(), identity.end(), 0);
        if (!all_free || static_cast<int>(order.size()) != m.num_blocks) {
          ASSERT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << where << status;
        } else if (sorted != identity) {
          ASSERT_EQ(CheckRefusal(status, absl::StatusCode::kInvalidArgument, {{"permutation"}}),
                    "") << where;
        } else {
          ASSERT_TRUE(status.ok()) << where << status;
          m.free.assign(order.rbegin(), order.rend());
        }
      } else {  // FillSlotMapping
        std::vector<SeqLens> seqs(Uniform(rng, 0, std::min(m.max_seqs, 9) + 1));
        for (SeqLens& sl : seqs) {
          sl.q_len = Chance(rng, 0.95) ? Uniform(rng, 0, 3) : Draw(rng, 0, 3, 1.0);
          sl.kv_len = Chance(rng, 0.95) ? Uniform(rng, 0, row_tokens) : Draw(rng, 0, 64, 1.0);
        }
        std::vector<int32_t> slots(Uniform(rng, 0, 24), 777);
        const absl::Status status = FillSlotMapping(seqs, table, absl::MakeSpan(slots));
        // The model's answer.
        absl::StatusCode code = absl::StatusCode::kOk;
        std::vector<std::string> names;
        std::vector<int32_t> want(slots.size(), -1);
        if (!m.valid_layout) {
          code = absl::StatusCode::kFailedPrecondition;
          names = {"layout"};
        } else if (static_cast<int>(seqs.size()) > m.max_seqs) {
          code = absl::StatusCode::kInvalidArgument;
          names = {Str(seqs.size()) + " sequences"};
        } else {
          size_t t = 0;
          for (int s = 0; s < static_cast<int>(seqs.size()) && code == absl::StatusCode::kOk;
               ++s) {
            const SeqLens& sl = seqs[s];
            if (sl.q_len < 0 || sl.kv_len < 0) {
              code = absl::StatusCode::kInvalidArgument;
              names = {"sequence " + Str(s), "q_len " + Str(sl.q_len)};
              break;
            }
            for (int64_t j = 0; j < sl.q_len; ++j, ++t) {
              if (t >= slots.size()) {
                code = absl::StatusCode::kInvalidArgument;
                names = {Str(slots.size()) + " entries"};
                break;
              }
              const int64_t pos = int64_t{sl.kv_len} - sl.q_len + j;
              if (pos < 0) continue;
              const int64_t logical = pos / m.block_size;
              const std::vector<int32_t>& row = m.rows[s];
              if (logical >= static_cast<int64_t>(row.size())) {
                code = absl::StatusCode::kInvalidArgument;
                names = {"Sequence " + Str(s) + " position " + Str(pos)};
                break;
              }
              want[t] = static_cast<int32_t>(int64_t{row[logical]} * m.block_size +
                                             pos % m.block_size);
            }
          }
        }
        const std::string call = where + " FillSlotMapping of " + Str(seqs.size()) +
                                 " sequences into " + Str(slots.size());
        if (code == absl::StatusCode::kOk) {
          ASSERT_TRUE(status.ok()) << call << ": " << status;
          ASSERT_EQ(slots, want) << call;
          ++ok_maps;
        } else {
          ASSERT_EQ(CheckRefusal(status, code, {names}), "") << call;
          ++refused_maps;
        }
      }
      ASSERT_EQ(CheckTable(table, storage, m), "") << where << " op " << op;
    }
  }
  RecordProperty("ok_reserves", ok_reserves);
  RecordProperty("refused_reserves", refused_reserves);
  RecordProperty("exhausted_reserves", exhausted);
  RecordProperty("ok_maps", ok_maps);
  RecordProperty("refused_maps", refused_maps);
  EXPECT_GT(ok_reserves, 5000);
  EXPECT_GT(refused_reserves, 2000);
  EXPECT_GT(exhausted, 200);
  EXPECT_GT(ok_maps, 2000);
  EXPECT_GT(refused_maps, 1000);
}

// Peak resident memory of this process, in bytes.
int64_t PeakRssBytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return int64_t{usage.ru_maxrss} * 1024;
}

// Counts near int32's limit with 16 entries of storage and a layout of 2^31 - 1 blocks of one
// token: the table allocates by what it can hold (no blocks, one row), not by the counts, and
// refuses every call it cannot serve instead of dividing by a zero block size.
TEST(PagedKvLayoutSweepTest, HugeCountsAllocateNothingAndAreRefused) {
  const int64_t before = PeakRssBytes();
  std::vector<int32_t> storage(16);
  const PagedKvLayout one_token_blocks{kInt32Max, 1, 2, 64, AttentionDtype::kBf16};
  BlockTable bad(absl::MakeSpan(storage), kInt32Max, kInt32Max, one_token_blocks);
  EXPECT_EQ(bad.free_blocks(), 0);
  EXPECT_FALSE(bad.layout_status().ok());
  EXPECT_EQ(CheckRefusal(bad.Reserve(0, 1), absl::StatusCode::kFailedPrecondition,
                         {{"block_size 1"}}),
            "");
  EXPECT_EQ(bad.blocks_of(kInt32Max - 1), 0);
  bad.Release(kInt32Max - 1);

  const PagedKvLayout zero_block_size{8, 0, 2, 64, AttentionDtype::kBf16};
  BlockTable zero(absl::MakeSpan(storage), 2, 8, zero_block_size);
  std::vector<int32_t> slots(4);
  const std::vector<SeqLens> step = {{1, 17}};
  EXPECT_EQ(CheckRefusal(FillSlotMapping(step, zero, absl::MakeSpan(slots)),
                         absl::StatusCode::kFailedPrecondition, {{"block_size 0"}}),
            "");

  const PagedKvLayout good{8, 16, 2, 64, AttentionDtype::kBf16};
  BlockTable wide(absl::MakeSpan(storage), kInt32Max, 8, good);  // storage for 2 rows
  EXPECT_TRUE(wide.Reserve(1, 128).ok());
  EXPECT_EQ(wide.Reserve(2, 1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(wide.Reserve(kInt32Max - 1, 0).code(), absl::StatusCode::kFailedPrecondition);
  std::vector<int32_t> no_storage;
  BlockTable no_columns(absl::MakeSpan(no_storage), kInt32Max, 0, good);
  EXPECT_TRUE(no_columns.Reserve(kInt32Max - 1, 0).ok());
  EXPECT_EQ(no_columns.Reserve(kInt32Max - 1, 1).code(), absl::StatusCode::kInvalidArgument);
  const std::vector<SeqLens> negative = {{-1, 4}};
  EXPECT_EQ(CheckRefusal(FillSlotMapping(negative, wide, absl::MakeSpan(slots)),
                         absl::StatusCode::kInvalidArgument, {{"sequence 0", "q_len -1"}}),
            "");
  const std::vector<SeqLens> huge = {{0, 0}, {kInt32Max, kInt32Max}};  // 4 slots, then past
  EXPECT_EQ(CheckRefusal(FillSlotMapping(huge, wide, absl::MakeSpan(slots)),
                         absl::StatusCode::kInvalidArgument, {{"4 entries"}}),
            "");
  // Sized by the counts, these tables would take 2^31 entries each (8 GiB apiece).
  EXPECT_LT(PeakRssBytes() - before, int64_t{256} << 20);
}

}  // namespace
}  // namespace kiln
