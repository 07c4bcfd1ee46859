// Causal prefill attention throughput over a paged KV cache (bf16, head_dim 128, 32 query
// heads), for the (batch, length) shapes peers publish: 1 x 8192, 4 x 4096, 16 x 2048, 64 x 512.
// Causal FLOPs per sequence: 4 * len^2 * head_dim * heads / 2. Timed with CUDA events after
// warm-up; the median of the timed launches is reported. Inputs are random (never zeros).
//
//   attention_prefill_benchmark            # GQA 32/8 and MHA 32/32, block size 16
//
// Exits non-zero if any launch fails.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attention/attention_params.h"
#include "attention/prefill_kernel.h"
#include "runtime/cuda/device_buffer.h"
#include "runtime/cuda/event.h"
#include "runtime/cuda/status.h"
#include "runtime/cuda/status_macros.h"
#include "runtime/cuda/stream.h"

namespace kiln {
namespace {

constexpr int kHeadDim = 128;
constexpr int kQHeads = 32;
constexpr int kBlockSize = 16;
constexpr int kWarmup = 3;
constexpr int kTimed = 20;

struct Case {
  int batch;
  int len;
  int kv_heads;
  int tile_rows;
};

// Random bf16 values in [-2, 2) from a fast generator (the sizes here are hundreds of MB).
std::vector<uint16_t> RandomBf16(size_t n, uint64_t seed) {
  std::vector<uint16_t> v(n);
  uint64_t x = seed | 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const float f = static_cast<float>(x >> 40) * (4.0f / 16777216.0f) - 2.0f;
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof(bits));
    v[i] = static_cast<uint16_t>(bits >> 16);
  }
  return v;
}

template <typename T>
absl::StatusOr<DeviceBuffer> Upload(const std::vector<T>& v, const char* name) {
  ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::Allocate(v.size() * sizeof(T), name));
  RETURN_IF_ERROR(CopyHostToDevice(b.data(), v.data(), v.size() * sizeof(T), nullptr));
  return b;
}

absl::StatusOr<double> RunCase(const Case& c, const Stream& stream) {
  const int tokens = c.batch * c.len;
  const int group = kQHeads / c.kv_heads;
  const int blocks_per_seq = (c.len + kBlockSize - 1) / kBlockSize;
  const int num_blocks = c.batch * blocks_per_seq;
  std::mt19937_64 rng(std::random_device{}());

  std::vector<int32_t> physical(num_blocks);
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), rng);
  std::vector<int32_t> q_start(c.batch + 1), kv_len(c.batch, c.len);
  for (int s = 0; s <= c.batch; ++s) q_start[s] = s * c.len;

  // One item per (sequence, query tile), the longest KV first so the tail of the grid is short.
  std::vector<AttentionWorkItem> items;
  const int rows = c.len * group;
  for (int rb = rows - ((rows - 1) % c.tile_rows + 1); rb >= 0; rb -= c.tile_rows) {
    for (int s = 0; s < c.batch; ++s) {
      items.push_back({s, rb, std::min(rb + c.tile_rows, rows), 0, c.len, -1});
    }
  }

  const size_t q_elems = static_cast<size_t>(tokens) * kQHeads * kHeadDim;
  const size_t kv_elems = static_cast<size_t>(num_blocks) * c.kv_heads * kBlockSize * kHeadDim;
  ASSIGN_OR_RETURN(DeviceBuffer q, Upload(RandomBf16(q_elems, rng()), "q"));
  ASSIGN_OR_RETURN(DeviceBuffer k, Upload(RandomBf16(kv_elems, rng()), "k_cache"));
  ASSIGN_OR_RETURN(DeviceBuffer v, Upload(RandomBf16(kv_elems, rng()), "v_cache"));
  ASSIGN_OR_RETURN(DeviceBuffer o, DeviceBuffer::Allocate(q_elems * 2, "o"));
  ASSIGN_OR_RETURN(DeviceBuffer table, Upload(physical, "block_table"));
  ASSIGN_OR_RETURN(DeviceBuffer starts, Upload(q_start, "seq_q_start"));
  ASSIGN_OR_RETURN(DeviceBuffer lens, Upload(kv_len, "seq_kv_len"));
  ASSIGN_OR_RETURN(DeviceBuffer work, Upload(items, "work_items"));

  PrefillAttentionParams p;
  p.dtype = AttentionDtype::kBf16;
  p.head_dim = kHeadDim;
  p.tile_rows = c.tile_rows;
  p.num_q_heads = kQHeads;
  p.num_kv_heads = c.kv_heads;
  p.block_size = kBlockSize;
  p.max_blocks_per_seq = blocks_per_seq;
  p.q = q.data();
  p.o = o.data();
  p.k_cache = k.data();
  p.v_cache = v.data();
  p.block_table = table.as<int32_t>();
  p.seq_q_start = starts.as<int32_t>();
  p.seq_kv_len = lens.as<int32_t>();
  p.work_items = work.as<AttentionWorkItem>();
  p.num_work_items = static_cast<int>(items.size());

  for (int i = 0; i < kWarmup; ++i) RETURN_IF_ERROR(LaunchPrefillAttention(p, stream.get()));
  RETURN_IF_ERROR(stream.Synchronize());
  ASSIGN_OR_RETURN(Event start, Event::Create(Event::kTiming));
  ASSIGN_OR_RETURN(Event stop, Event::Create(Event::kTiming));
  std::vector<float> ms;
  for (int i = 0; i < kTimed; ++i) {
    RETURN_IF_ERROR(start.Record(stream.get()));
    RETURN_IF_ERROR(LaunchPrefillAttention(p, stream.get()));
    RETURN_IF_ERROR(stop.Record(stream.get()));
    RETURN_IF_ERROR(stop.Synchronize());
    ASSIGN_OR_RETURN(float t, Event::ElapsedMs(start, stop));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int Main() {
  auto stream_or = Stream::Create();
  if (!stream_or.ok()) {
    std::fprintf(stderr, "%s\n", stream_or.status().ToString().c_str());
    return 1;
  }
  std::printf("causal prefill, bf16, head_dim %d, %d query heads, KV block size %d, paged\n",
              kHeadDim, kQHeads, kBlockSize);
  std::printf(
      "peers (H200, head_dim 128, causal): FlashAttention-2 ~315 TFLOP/s, cuDNN ~590 at 8K\n");
  std::printf("%6s %6s %8s %5s %10s %9s\n", "batch", "len", "heads", "T", "time(ms)", "TFLOP/s");
  const std::vector<Case> cases = {
      {1, 8192, 8, 128}, {4, 4096, 8, 128}, {16, 2048, 8, 128}, {64, 512, 8, 128},
      {1, 8192, 32, 128}, {4, 4096, 32, 128}, {16, 2048, 32, 128}, {64, 512, 32, 128},
      {1, 8192, 8, 64},
  };
  int failures = 0;
  for (const Case& c : cases) {
    absl::StatusOr<double> ms = RunCase(c, *stream_or);
    if (!ms.ok()) {
      std::fprintf(stderr, "batch %d len %d: %s\n", c.batch, c.len, ms.status().ToString().c_str());
      ++failures;
      continue;
    }
    const double flops =
        4.0 * c.len * static_cast<double>(c.len) * kHeadDim * kQHeads / 2 * c.batch;
    std::printf("%6d %6d %5d/%-2d %5d %10.3f %9.1f\n", c.batch, c.len, kQHeads, c.kv_heads,
                c.tile_rows, *ms, flops / (*ms * 1e-3) / 1e12);
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace kiln

int main() { return kiln::Main(); }
