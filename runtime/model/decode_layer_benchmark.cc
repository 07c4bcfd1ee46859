// Times the decode layer kernel alone on the 1B model's shapes: a CUDA graph of 16 back-to-back
// launches (each the previous layer's O through down projections and the next layer's QKV with
// its RoPE + KV append, as in a step's middle pieces, without attention), each with its own
// layer's weights so that nothing stays in L2, for each row count and launch shape.
//
//   bazel run -c opt //runtime/model:decode_layer_benchmark
//       [-- --rows=1,8 --stages=4 --run_ahead=0,3]
//
// Prints microseconds per launch and the weight-read bandwidth (121.6 MB per launch). The
// launch shape ChooseDecodeLayerConfig picks is marked and traced (where each phase's time goes);
// --stages and --run_ahead time other ring depths and run-ahead limits. Exits non-zero on any
// error.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "runtime/cuda/device_buffer.h"
#include "runtime/cuda/stream.h"
#include "runtime/model/decode_layer.h"
#include "runtime/model/internal/benchmark_util.h"
#include "runtime/model/llama_model.h"
#include "runtime/model/llama_shape.h"

ABSL_FLAG(std::string, rows, "1,2,4,8", "Token rows per launch");
ABSL_FLAG(std::string, stages, "", "Ring stages to time besides the chosen ones (e.g. 2,3,5)");
ABSL_FLAG(bool, trace, true, "Also print where the chosen launch shape's time goes");
ABSL_FLAG(std::string, run_ahead, "",
          "Run-ahead limits (stages past a phase's start before its barrier) to time with the "
          "chosen shape, e.g. 0,1,2");

namespace kiln {
namespace {

using benchmark_internal::ValueOrDie;

constexpr int kLayers = 16;
constexpr int kContext = 1024;
constexpr int kBlockSize = 64;

// A buffer of `elements` bf16 values of magnitude below 0.03 with varied bits (never zeros),
// copied from one host pattern.
DeviceBuffer Random(int64_t elements, uint32_t seed) {
  static const std::vector<uint16_t> pattern = [] {
    std::vector<uint16_t> p(1 << 20);
    uint32_t h = 12345;
    for (uint16_t& v : p) {
      h = h * 1664525u + 1013904223u;
      const float f = (static_cast<int>(h >> 8) % 2001 - 1000) * 3e-5f;
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      v = static_cast<uint16_t>(bits >> 16);
    }
    return p;
  }();
  DeviceBuffer b = ValueOrDie(DeviceBuffer::Allocate(elements * 2, "benchmark buffer"));
  const int64_t n = static_cast<int64_t>(pattern.size());
  for (int64_t at = 0; at < elements; at += n) {
    // Each chunk starts at a different point of the pattern.
    const int64_t shift = (seed * 7919 + at / n * 104729) % (n / 2);
    const int64_t count = std::min(n - shift, elements - at);
    CHECK_CUDA(cudaMemcpy(b.as<uint16_t>() + at, pattern.data() + shift, count * 2,
                          cudaMemcpyHostToDevice));
    if (count < std::min(n, elements - at)) {
      CHECK_CUDA(cudaMemcpy(b.as<uint16_t>() + at + count, pattern.data(),
                            (std::min(n, elements - at) - count) * 2, cudaMemcpyHostToDevice));
    }
  }
  return b;
}

// Replays the launches once more with per-CTA stamps and prints where a launch's time goes:
// medians over CTAs and launches (the first launch left out) of each interval, in µs.
void PrintTrace(std::vector<DecodeLayerArgs> launches, const DecodeLayerConfig& c,
                cudaStream_t stream) {
  const size_t per_launch = static_cast<size_t>(c.ctas) * kDecodeLayerTraceSlots;
  DeviceBuffer trace =
      ValueOrDie(DeviceBuffer::Allocate(per_launch * launches.size() * 8, "trace"));
  for (size_t l = 0; l < launches.size(); ++l) {
    launches[l].trace = trace.as<uint64_t>() + l * per_launch;
  }
  benchmark_internal::TimeGraph(
      stream,
      [&] {
        for (const DecodeLayerArgs& a : launches) CHECK_CUDA(LaunchDecodeLayer(a, c, stream));
      },
      1, 1);
  std::vector<uint64_t> t(per_launch * launches.size());
  CHECK_CUDA(cudaMemcpy(t.data(), trace.data(), t.size() * 8, cudaMemcpyDeviceToHost));
  const char* names[] = {"start->waited", "O stage x",   "O products",   "O barrier",
                         "GU stage x",    "GU products", "GU barrier",   "D stage x",
                         "D products",    "D barrier",   "QKV stage x",  "QKV products",
                         "QKV barrier"};
  std::vector<std::vector<double>> d(kDecodeLayerTraceSlots);
  std::vector<double> launch_us, gap_us;
  for (size_t l = 1; l < launches.size(); ++l) {
    const uint64_t* base = t.data() + l * per_launch;
    uint64_t first = ~uint64_t{0}, last = 0;
    for (int cta = 0; cta < c.ctas; ++cta) {
      const uint64_t* s = base + cta * kDecodeLayerTraceSlots;
      for (int i = 1; i < kDecodeLayerTraceSlots; ++i) d[i].push_back((s[i] - s[i - 1]) * 1e-3);
      first = std::min(first, s[1]);
      last = std::max(last, s[kDecodeLayerTraceSlots - 1]);
    }
    launch_us.push_back((last - first) * 1e-3);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  auto max_of = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
  std::printf("      trace (%s): waited -> last barrier %.2f us; per interval median / max:\n",
              c.ToString().c_str(), median(launch_us));
  for (int i = 1; i < kDecodeLayerTraceSlots; ++i) {
    std::printf("        %-14s %7.2f %7.2f\n", names[i - 1], median(d[i]), max_of(d[i]));
  }
}

int Main() {
  std::vector<int> rows, run_aheads, stages;
  if (!benchmark_internal::ParseIntList("rows", absl::GetFlag(FLAGS_rows), 1,
                                        kDecodeLayerMaxRows, &rows) ||
      !benchmark_internal::ParseIntList("run_ahead", absl::GetFlag(FLAGS_run_ahead), 0,
                                        kDecodeLayerMaxStages, &run_aheads) ||
      !benchmark_internal::ParseIntList("stages", absl::GetFlag(FLAGS_stages), 1,
                                        kDecodeLayerMaxStages, &stages)) {
    return 2;
  }
  const DecodeLayerShape s = DecodeLayerShapeOf(LlamaShape::Llama1B());
  int device = 0, sms = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t h = s.hidden, f = s.ffn, q = s.qkv_rows();
  const double weight_bytes = 2.0 * (h * s.q_width + 2 * f * h + h * f + q * h);
  std::vector<DeviceBuffer> o, gate_up, down, qkv_w, norms;
  for (int l = 0; l < kLayers; ++l) {
    o.push_back(Random(h * s.q_width, 10 * l + 1));
    gate_up.push_back(Random(2 * f * h, 10 * l + 2));
    down.push_back(Random(h * f, 10 * l + 3));
    qkv_w.push_back(Random(q * h, 10 * l + 4));
    norms.push_back(Random(2 * h, 10 * l + 5));
  }
  const int max_m = kDecodeLayerMaxRows;
  DeviceBuffer attn = Random(max_m * h, 7), hidden = Random(max_m * h, 8),
               residual = Random(max_m * h, 9), mid = Random(max_m * h, 10),
               act = Random(max_m * f, 11), qkv = Random(max_m * q, 12);
  // One sequence per row, each 1024 tokens long after this step's token.
  const int blocks_per_seq = kContext / kBlockSize;
  const int64_t kv_elems = int64_t{max_m} * blocks_per_seq * s.kv_heads * kBlockSize * s.head_dim;
  DeviceBuffer k_cache = Random(kv_elems, 13), v_cache = Random(kv_elems, 14);
  std::vector<int32_t> table(max_m * blocks_per_seq), q_start(max_m + 1), kv_len(max_m),
      positions(max_m);
  for (int i = 0; i < max_m * blocks_per_seq; ++i) table[i] = i;
  for (int i = 0; i <= max_m; ++i) q_start[i] = i;
  for (int i = 0; i < max_m; ++i) {
    kv_len[i] = kContext;
    positions[i] = kContext - 1;
  }
  DeviceBuffer meta = ValueOrDie(DeviceBuffer::Allocate(
      4 * (table.size() + q_start.size() + kv_len.size() + positions.size()), "metadata"));
  int32_t* d_table = meta.as<int32_t>();
  int32_t* d_q_start = d_table + table.size();
  int32_t* d_kv_len = d_q_start + q_start.size();
  int32_t* d_positions = d_kv_len + kv_len.size();
  CHECK_CUDA(cudaMemcpy(d_table, table.data(), 4 * table.size(), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(d_q_start, q_start.data(), 4 * q_start.size(), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(d_kv_len, kv_len.data(), 4 * kv_len.size(), cudaMemcpyHostToDevice));
  CHECK_CUDA(
      cudaMemcpy(d_positions, positions.data(), 4 * positions.size(), cudaMemcpyHostToDevice));
  DeviceBuffer sync = ValueOrDie(DeviceBuffer::Allocate(kDecodeLayerSyncBytes, "grid barrier"));
  CHECK_CUDA(cudaMemset(sync.data(), 0, sync.size()));
  CHECK_CUDA(cudaDeviceSynchronize());
  Stream stream = ValueOrDie(Stream::Create());

  std::printf("decode layer kernel, %d SMs: 16 launches of O + gate-up + down + QKV (%.1f MB of "
              "weights each), context %d\n%5s %10s %8s %10s %8s\n",
              sms, weight_bytes / 1e6, kContext, "rows", "config", "KiB", "us/launch", "TB/s");
  for (int m : rows) {
    const DecodeLayerConfig chosen = ChooseDecodeLayerConfig(m, s, sms);
    std::vector<DecodeLayerConfig> configs = {chosen};
    for (int r : run_aheads) {
      DecodeLayerConfig c = chosen;
      c.run_ahead = r;
      configs.push_back(c);
    }
    for (int st : stages) {
      DecodeLayerConfig c = chosen;
      c.stages = st;
      c.shared_bytes = DecodeLayerSharedBytes(m, s, st);
      configs.push_back(c);
    }
    for (size_t ci = 0; ci < configs.size(); ++ci) {
      const DecodeLayerConfig& c = configs[ci];
      std::vector<DecodeLayerArgs> launches;
      for (int l = 0; l < kLayers; ++l) {
        DecodeLayerArgs a;
        a.m = m;
        a.shape = s;
        a.finish = true;
        a.o = o[l].as<__nv_bfloat16>();
        a.post_norm = norms[l].as<__nv_bfloat16>();
        a.gate_up = gate_up[l].as<__nv_bfloat16>();
        a.down = down[l].as<__nv_bfloat16>();
        a.start = true;
        a.norm = norms[l].as<__nv_bfloat16>() + h;
        a.qkv_w = qkv_w[(l + 1) % kLayers].as<__nv_bfloat16>();
        a.positions = d_positions;
        a.plan.seq_q_start = d_q_start;
        a.plan.seq_kv_len = d_kv_len;
        a.plan.max_seqs = max_m;
        a.kv.k_cache = k_cache.data();
        a.kv.v_cache = v_cache.data();
        a.kv.block_table = d_table;
        a.kv.max_blocks_per_seq = blocks_per_seq;
        a.kv.block_size = kBlockSize;
        a.attn = attn.as<__nv_bfloat16>();
        a.hidden = hidden.as<__nv_bfloat16>();
        a.residual = residual.as<__nv_bfloat16>();
        a.mid_residual = mid.as<__nv_bfloat16>();
        a.act = act.as<__nv_bfloat16>();
        a.qkv = qkv.as<__nv_bfloat16>();
        a.grid_sync = sync.as<uint32_t>();
        a.work_set = l % 2;
        a.previous_work_set = 1 - l % 2;
        launches.push_back(a);
      }
      if (!DecodeLayerSupports(launches[0], c)) {
        std::printf("%5d %10s %8zu %10s\n", m, c.ToString().c_str(), c.shared_bytes / 1024,
                    "n/a");
        continue;
      }
      const double ms = benchmark_internal::TimeGraph(
          stream.get(),
          [&] {
            for (const DecodeLayerArgs& a : launches) {
              CHECK_CUDA(LaunchDecodeLayer(a, c, stream.get()));
            }
          },
          3, 15);
      const double us = ms * 1e3 / kLayers;
      std::printf("%5d %10s %8zu %10.2f %8.2f%s\n", m, c.ToString().c_str(),
                  c.shared_bytes / 1024, us, weight_bytes / (us * 1e-6) / 1e12,
                  ci == 0 ? "  (chosen)" : "");
      std::fflush(stdout);
      if (absl::GetFlag(FLAGS_trace)) {
        PrintTrace(launches, c, stream.get());
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return kiln::Main();
}
