// All-reduce benchmark in nccl-tests' format: one-shot, registered one-shot (graphs only),
// two-shot, auto (AutoCommunicator's choice) and NCCL, eager and in CUDA graphs, 4 KB to 64 MB.
// It starts one process per visible GPU itself (RunBenchmarkOnEveryGpu in
// collectives/testing/multiprocess_benchmark_util.h); rank 0 prints. Every output is checked
// against the exact sum of integer-valued inputs; the program exits non-zero if any value is
// wrong on any rank (3), or if a rank fails (1); a bad flag exits 2 before any rank starts.
//
//   bazel run -c opt //collectives:allreduce_benchmark -- --world_size=4
//   .gpu_collectives/bin/collectives_allreduce_benchmark --modes=graph --max_bytes=4194304
//
// Times: CUDA events around a batch of calls (eager) or of graph replays (graph: each graph holds
// --ops_per_graph all-reduces, so launch gaps are those of a real decode step), after warm-up;
// the median over --samples batches, per all-reduce. algbw = bytes / time; busbw = algbw *
// 2 (n - 1) / n, as nccl-tests define them.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "collectives/allreduce_config.pb.h"
#include "collectives/allreduce_policy.h"
#include "collectives/auto_communicator.h"
#include "collectives/communicator.h"
#include "collectives/custom_allreduce.h"
#include "collectives/testing/multiprocess_benchmark_util.h"
#include "collectives/testing/process_group.h"
#include "google/protobuf/text_format.h"
#include "runtime/cuda/device_info.h"
#include "runtime/cuda/status.h"
#include "runtime/cuda/status_macros.h"

ABSL_FLAG(int, world_size, 0, "Ranks (one process per GPU); 0 = every visible GPU");
ABSL_FLAG(std::string, dtype, "bf16", "bf16, fp16 or fp32");
ABSL_FLAG(int64_t, min_bytes, 4096, "Smallest message in bytes");
ABSL_FLAG(int64_t, max_bytes, 64 << 20, "Largest message in bytes (sizes double)");
ABSL_FLAG(std::string, algos, "one-shot,one-shot-reg,two-shot,auto,nccl",
          "Comma-separated: one-shot, one-shot-reg (graph only), two-shot, auto, nccl");
ABSL_FLAG(std::string, modes, "eager,graph", "Comma-separated: eager, graph");
ABSL_FLAG(int, ops_per_graph, 20, "All-reduces captured in each graph");
ABSL_FLAG(int, samples, 7, "Timed batches per row (the median is reported)");
ABSL_FLAG(std::string, config, "",
          "AllReduceConfig as text proto, e.g. 'max_blocks: 32' (defaults otherwise)");
ABSL_FLAG(int, timeout_s, 540, "Kill the ranks after this many seconds");

namespace kiln {
namespace {

struct Row {
  std::string mode, algo;
  size_t bytes = 0;
  double us = 0;
  int64_t wrong = 0;
};

absl::StatusOr<DataType> ParseDtype(const std::string& s) {
  if (s == "bf16") return DataType::kBf16;
  if (s == "fp16") return DataType::kFp16;
  if (s == "fp32") return DataType::kFp32;
  return absl::InvalidArgumentError(
      absl::StrFormat("--dtype=%s is not one of bf16, fp16, fp32", s));
}

// Integer-valued element (as raw bytes of `dtype`) of rank `rank` at index `i`: in [-4, 4],
// so every partial sum is exact in every dtype and equals NCCL's.
int IntegerValue(int rank, size_t i) { return static_cast<int>((i * 7 + rank * 3) % 9) - 4; }

void StoreElement(DataType dtype, float value, uint8_t* out) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  switch (dtype) {
    case DataType::kBf16: {
      const uint16_t b = static_cast<uint16_t>(bits >> 16);  // exact for small integers
      std::memcpy(out, &b, 2);
      break;
    }
    case DataType::kFp16: {
      // Small integers: sign, exponent and a mantissa that fits in 10 bits.
      uint16_t h = 0;
      if (value != 0.0f) {
        const uint32_t sign = bits >> 31;
        const int exponent = static_cast<int>((bits >> 23) & 0xFF) - 127;
        const uint32_t mantissa = (bits >> 13) & 0x3FF;
        h = static_cast<uint16_t>((sign << 15) | ((exponent + 15) << 10) | mantissa);
      }
      std::memcpy(out, &h, 2);
      break;
    }
    case DataType::kFp32:
      std::memcpy(out, &value, 4);
      break;
  }
}

std::vector<uint8_t> InputBytes(DataType dtype, int rank, size_t count) {
  std::vector<uint8_t> out(count * DataTypeSize(dtype));
  for (size_t i = 0; i < count; ++i) {
    StoreElement(dtype, static_cast<float>(IntegerValue(rank, i)), &out[i * DataTypeSize(dtype)]);
  }
  return out;
}

std::vector<uint8_t> ExpectedBytes(DataType dtype, int world, size_t count) {
  std::vector<uint8_t> out(count * DataTypeSize(dtype));
  for (size_t i = 0; i < count; ++i) {
    int sum = 0;
    for (int r = 0; r < world; ++r) sum += IntegerValue(r, i);
    StoreElement(dtype, static_cast<float>(sum), &out[i * DataTypeSize(dtype)]);
  }
  return out;
}

class Bench {
 public:
  Bench(testing::ProcessGroupMember& member, AutoCommunicator& comm, DataType dtype,
        cudaStream_t stream, void* in, void* out)
      : member_(member), comm_(comm), dtype_(dtype), stream_(stream), in_(in), out_(out) {}

  // Enqueues one all-reduce of `algo` over `count` elements.
  absl::Status Call(const std::string& algo, size_t count, bool capturing) {
    if (algo == "auto") return comm_.AllReduce(in_, out_, count, dtype_, stream_);
    if (algo == "nccl") return comm_.nccl()->AllReduce(in_, out_, count, dtype_, stream_);
    AllReducePlan plan;
    plan.algorithm = algo == "two-shot" ? AllReduceAlgorithm::kTwoShot
                                        : AllReduceAlgorithm::kOneShot;
    plan.input = !capturing                                       ? AllReduceInput::kStaged
                 : (algo == "two-shot" || algo == "one-shot-reg") ? AllReduceInput::kRegistered
                                                                  : AllReduceInput::kStaged;
    return comm_.custom()->AllReduce(in_, out_, count, dtype_, plan, stream_);
  }

  // Returns the median microseconds per all-reduce.
  absl::StatusOr<double> Time(const std::string& mode, const std::string& algo, size_t bytes,
                              int samples, int ops_per_graph) {
    const size_t count = bytes / DataTypeSize(dtype_);
    // Calls per timed batch: about 2 ms of work, at least a few calls.
    const int64_t calls = std::clamp<int64_t>((int64_t{48} << 20) / static_cast<int64_t>(bytes),
                                              ops_per_graph, 400);
    cudaEvent_t start, stop;
    CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
    CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop));
    std::vector<double> per_call;
    absl::Status status = [&]() -> absl::Status {
      for (int i = 0; i < 3; ++i) RETURN_IF_ERROR(Call(algo, count, false));  // warm-up
      CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
      if (mode == "eager") {
        for (int s = 0; s < samples; ++s) {
          // Named by mode, algorithm, size and sample: a rank that runs another list of them
          // than the others fails at the first barrier where they part, or, where its list is a
          // prefix of the others', at its next call after it.
          RETURN_IF_ERROR(member_.bootstrap->Barrier(
              absl::StrFormat("allreduce_benchmark.eager_sample.%s.%d.%d", algo, bytes, s)));
          CUDA_RETURN_IF_ERROR(cudaEventRecord(start, stream_));
          for (int64_t c = 0; c < calls; ++c) RETURN_IF_ERROR(Call(algo, count, false));
          CUDA_RETURN_IF_ERROR(cudaEventRecord(stop, stream_));
          CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop));
          float ms = 0;
          CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start, stop));
          per_call.push_back(1000.0 * ms / calls);
        }
        return absl::OkStatus();
      }
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      absl::Status captured;
      for (int i = 0; i < ops_per_graph && captured.ok(); ++i) {
        captured = Call(algo, count, true);
      }
      cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
      RETURN_IF_ERROR(captured);
      CUDA_RETURN_IF_ERROR(ended);
      absl::Status run = [&]() -> absl::Status {
        CUDA_RETURN_IF_ERROR(cudaGraphInstantiate(&exec, graph, 0));
        RETURN_IF_ERROR(comm_.RegisterGraphBuffers());
        RETURN_IF_ERROR(comm_.CheckReplayable());
        const int64_t replays = std::max<int64_t>(1, calls / ops_per_graph);
        for (int i = 0; i < 2; ++i) CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec, stream_));
        CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
        for (int s = 0; s < samples; ++s) {
          RETURN_IF_ERROR(member_.bootstrap->Barrier(
              absl::StrFormat("allreduce_benchmark.graph_sample.%s.%d.%d", algo, bytes, s)));
          CUDA_RETURN_IF_ERROR(cudaEventRecord(start, stream_));
          for (int64_t r = 0; r < replays; ++r) {
            CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec, stream_));
          }
          CUDA_RETURN_IF_ERROR(cudaEventRecord(stop, stream_));
          CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop));
          float ms = 0;
          CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start, stop));
          per_call.push_back(1000.0 * ms / (replays * ops_per_graph));
        }
        return absl::OkStatus();
      }();
      if (exec != nullptr) cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
      return run;
    }();
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    RETURN_IF_ERROR(status);
    RETURN_IF_ERROR(comm_.CheckAsyncErrors());
    std::sort(per_call.begin(), per_call.end());
    return per_call[per_call.size() / 2];
  }

 private:
  testing::ProcessGroupMember& member_;
  AutoCommunicator& comm_;
  DataType dtype_;
  cudaStream_t stream_;
  void* in_;
  void* out_;
};

absl::Status RunRank(testing::ProcessGroupMember& member, int64_t* total_wrong) {
  const int rank = member.rank;
  const int world = member.world_size;
  ASSIGN_OR_RETURN(DataType dtype, ParseDtype(absl::GetFlag(FLAGS_dtype)));
  AllReduceConfig config;
  if (!google::protobuf::TextFormat::ParseFromString(absl::GetFlag(FLAGS_config), &config)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--config='%s' is not an AllReduceConfig text proto",
                        absl::GetFlag(FLAGS_config)));
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(rank));
  ASSIGN_OR_RETURN(std::unique_ptr<AutoCommunicator> comm,
                   AutoCommunicator::Create(*member.bootstrap, rank, config));
  ASSIGN_OR_RETURN(DeviceInfo info, DeviceInfo::Query(rank));
  const size_t max_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_max_bytes));
  const size_t min_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_min_bytes));
  const size_t custom_max = comm->custom_available() ? comm->custom()->max_bytes() : 0;
  if (rank == 0) {
    std::printf("# kiln all-reduce benchmark: %d x %s, dtype %s, NCCL %d.%d\n", world,
                info.ToString().c_str(), DataTypeName(dtype), NCCL_MAJOR, NCCL_MINOR);
    std::printf("# custom all-reduce: %s (buffer %zu bytes); config: %s\n",
                comm->custom_available() ? "available" : comm->custom_unavailable_reason().c_str(),
                custom_max, config.ShortDebugString().c_str());
  }

  cudaStream_t stream;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  void* in = nullptr;
  void* out = nullptr;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&in, max_bytes));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&out, max_bytes));
  const size_t max_count = max_bytes / DataTypeSize(dtype);
  const std::vector<uint8_t> input = InputBytes(dtype, rank, max_count);
  const std::vector<uint8_t> expected = ExpectedBytes(dtype, world, max_count);
  CUDA_RETURN_IF_ERROR(cudaMemcpy(in, input.data(), max_bytes, cudaMemcpyHostToDevice));

  Bench bench(member, *comm, dtype, stream, in, out);
  std::vector<std::string> modes = absl::StrSplit(absl::GetFlag(FLAGS_modes), ',');
  std::vector<std::string> algos = absl::StrSplit(absl::GetFlag(FLAGS_algos), ',');
  const int ops_per_graph = absl::GetFlag(FLAGS_ops_per_graph);
  const int samples = absl::GetFlag(FLAGS_samples);  // ValidateFlags: at least 1
  std::vector<Row> rows;
  std::vector<uint8_t> got(max_bytes);
  // ValidateFlags refused unknown modes and algorithms before any rank started.
  for (const std::string& mode : modes) {
    if (rank == 0) {
      std::printf("#\n# %s: ", mode.c_str());
      if (mode == "graph") {
        std::printf("per-op time of %d all-reduces per graph, ", ops_per_graph);
      }
      std::printf("median of %d batches; out-of-place\n", samples);
      std::printf("# %10s %12s %6s %6s %13s %9s %8s %8s %7s\n", "size", "count", "type",
                  "redop", "algo", "time", "algbw", "busbw", "#wrong");
      std::printf("# %10s %12s %6s %6s %13s %9s %8s %8s %7s\n", "(B)", "(elements)", "", "", "",
                  "(us)", "(GB/s)", "(GB/s)", "");
      std::fflush(stdout);
    }
    for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
      for (const std::string& algo : algos) {
        const bool custom = algo == "one-shot" || algo == "two-shot" || algo == "one-shot-reg";
        if (custom && (bytes > custom_max || bytes % 16 != 0)) continue;
        if (algo == "one-shot-reg" && mode == "eager") continue;
        CUDA_RETURN_IF_ERROR(cudaMemsetAsync(out, 0xFF, bytes, stream));  // poison
        ASSIGN_OR_RETURN(double us, bench.Time(mode, algo, bytes, samples, ops_per_graph));
        CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
        CUDA_RETURN_IF_ERROR(cudaMemcpy(got.data(), out, bytes, cudaMemcpyDeviceToHost));
        const size_t esize = DataTypeSize(dtype);
        int64_t wrong = 0;
        for (size_t i = 0; i < bytes / esize; ++i) {
          wrong += std::memcmp(&got[i * esize], &expected[i * esize], esize) != 0;
        }
        ASSIGN_OR_RETURN(std::vector<std::string> all,
                         member.bootstrap->AllGather(
                             absl::StrFormat("%d", wrong),
                             absl::StrFormat("allreduce_benchmark.wrong_count.%s.%s.%d", mode,
                                             algo, bytes)));
        int64_t wrong_all = 0;
        for (const std::string& s : all) wrong_all += std::stoll(s);
        *total_wrong += wrong_all;
        const double algbw = bytes / (us * 1e3);
        const double busbw = algbw * 2.0 * (world - 1) / world;
        rows.push_back({mode, algo, bytes, us, wrong_all});
        if (rank == 0) {
          std::printf("  %10zu %12zu %6s %6s %13s %9.2f %8.2f %8.2f %7lld\n", bytes,
                      bytes / esize, DataTypeName(dtype), "sum", algo.c_str(), us, algbw, busbw,
                      static_cast<long long>(wrong_all));
          std::fflush(stdout);
        }
      }
    }
  }
  if (rank == 0) {
    // Auto against NCCL and against the best custom kernel, per mode and size.
    std::printf("#\n# summary: auto vs NCCL (ratio < 1 is faster), best custom kernel\n");
    std::printf("# %6s %10s %9s %9s %7s %9s %13s\n", "mode", "size", "auto_us", "nccl_us",
                "ratio", "best_us", "best_algo");
    std::map<std::pair<std::string, size_t>, std::map<std::string, double>> table;
    for (const Row& r : rows) table[{r.mode, r.bytes}][r.algo] = r.us;
    for (const auto& [key, by_algo] : table) {
      auto a = by_algo.find("auto");
      auto n = by_algo.find("nccl");
      std::string best_algo = "-";
      double best = 0;
      for (const auto& [algo, us] : by_algo) {
        if (algo == "auto" || algo == "nccl") continue;
        if (best == 0 || us < best) {
          best = us;
          best_algo = algo;
        }
      }
      if (a == by_algo.end() || n == by_algo.end()) continue;
      std::printf("  %6s %10zu %9.2f %9.2f %7.3f %9.2f %13s\n", key.first.c_str(), key.second,
                  a->second, n->second, a->second / n->second, best, best_algo.c_str());
    }
    std::printf("# total #wrong: %lld\n", static_cast<long long>(*total_wrong));
    std::fflush(stdout);
  }
  cudaStreamSynchronize(stream);
  comm.reset();
  cudaFree(in);
  cudaFree(out);
  cudaStreamDestroy(stream);
  return absl::OkStatus();
}

// Returns InvalidArgument naming the first flag no run could use, before any rank starts: a
// message size of 0 divided the calls per batch by zero, --ops_per_graph 0 the replays, and
// sizes out of order printed an empty table with exit code 0.
absl::Status ValidateFlags() {
  const int64_t min_bytes = absl::GetFlag(FLAGS_min_bytes);
  const int64_t max_bytes = absl::GetFlag(FLAGS_max_bytes);
  ASSIGN_OR_RETURN(DataType dtype, ParseDtype(absl::GetFlag(FLAGS_dtype)));
  const int64_t element = static_cast<int64_t>(DataTypeSize(dtype));
  if (min_bytes < element || min_bytes % element != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--min_bytes=%d must be a positive multiple of the %d-byte %s element", min_bytes,
        element, DataTypeName(dtype)));
  }
  if (max_bytes < min_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--max_bytes=%d is less than --min_bytes=%d; sizes double from min to max", max_bytes,
        min_bytes));
  }
  // Calls per timed batch are clamped to [ops_per_graph, 400].
  const int ops_per_graph = absl::GetFlag(FLAGS_ops_per_graph);
  if (ops_per_graph < 1 || ops_per_graph > 400) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--ops_per_graph=%d must be in 1..400", ops_per_graph));
  }
  if (absl::GetFlag(FLAGS_samples) < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--samples=%d must be at least 1", absl::GetFlag(FLAGS_samples)));
  }
  if (absl::GetFlag(FLAGS_world_size) < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--world_size=%d must be 0 (every visible GPU) or the number of ranks",
        absl::GetFlag(FLAGS_world_size)));
  }
  if (absl::GetFlag(FLAGS_timeout_s) < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--timeout_s=%d must be at least 1", absl::GetFlag(FLAGS_timeout_s)));
  }
  for (absl::string_view mode : absl::StrSplit(absl::GetFlag(FLAGS_modes), ',')) {
    if (mode != "eager" && mode != "graph") {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--modes has unknown mode '%s'; use eager, graph or both, comma-separated", mode));
    }
  }
  for (absl::string_view algo : absl::StrSplit(absl::GetFlag(FLAGS_algos), ',')) {
    if (algo != "one-shot" && algo != "one-shot-reg" && algo != "two-shot" && algo != "auto" &&
        algo != "nccl") {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--algos has unknown '%s'; use one-shot, one-shot-reg, two-shot, auto, nccl", algo));
    }
  }
  AllReduceConfig config;
  if (!google::protobuf::TextFormat::ParseFromString(absl::GetFlag(FLAGS_config), &config)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--config='%s' is not an AllReduceConfig text proto",
                        absl::GetFlag(FLAGS_config)));
  }
  return ValidateAllReduceConfig(config);
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::Status flags = kiln::ValidateFlags(); !flags.ok()) {
    std::fprintf(stderr, "allreduce_benchmark: %s\n", std::string(flags.message()).c_str());
    return 2;
  }
  kiln::testing::BenchmarkGroupOptions options;
  options.name = "allreduce_benchmark";
  options.world_size = absl::GetFlag(FLAGS_world_size);
  options.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  return kiln::testing::RunBenchmarkOnEveryGpu(
      argc, argv, options, [](kiln::testing::ProcessGroupMember& member) -> absl::StatusOr<int> {
        int64_t wrong = 0;
        RETURN_IF_ERROR(kiln::RunRank(member, &wrong));
        return wrong == 0 ? 0 : kiln::testing::kWrongValuesExitCode;
      });
}
