// Multi-GPU tests of the custom all-reduce and of AutoCommunicator, one process per GPU (world
// size = visible GPUs, or $KILN_TEST_WORLD_SIZE). Integer-valued inputs make every sum exact,
// so the custom kernels must equal NCCL bit for bit; random real-valued inputs check that every
// rank gets the same bits and that the sum is right to the dtype's precision.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "collectives/allreduce_config.pb.h"
#include "collectives/allreduce_policy.h"
#include "collectives/auto_communicator.h"
#include "collectives/communicator.h"
#include "collectives/custom_allreduce.h"
#include "collectives/testing/multiprocess_test_util.h"
#include "collectives/testing/rank_rig.h"
#include "graph/capture_context.h"
#include "gtest/gtest.h"
#include "runtime/cuda/device_buffer.h"
#include "runtime/cuda/gpu_test_util.h"
#include "runtime/cuda/stream.h"

namespace kiln {
namespace {

using testing::AllocOrFail;
using testing::Download;
using testing::MakeRig;
using testing::Poison;
using testing::RankContext;
using testing::RankRig;
using testing::RanksDisagreeing;
using testing::RunOnEveryGpu;
using testing::SharedSeed;
using testing::Upload;

constexpr size_t kBufferBytes = 4 << 20;  // the tests' custom buffer limit

// Each body takes seconds; a hang is killed well before the binary's own timeout.
testing::MultiProcessTestOptions Options() {
  testing::MultiProcessTestOptions options;
  options.timeout = absl::Seconds(60);
  return options;
}

// Crossovers that exercise both kernels at every world size, and registered one-shot graphs.
AllReduceConfig TestConfig() {
  AllReduceConfig config;
  config.set_buffer_bytes(kBufferBytes);
  config.set_one_shot_max_bytes_world2(64 << 10);
  config.set_one_shot_max_bytes_world4(64 << 10);
  config.set_one_shot_max_bytes_world6(64 << 10);
  config.set_one_shot_max_bytes_world8(64 << 10);
  config.set_two_shot_max_bytes_world2(kBufferBytes);
  config.set_two_shot_max_bytes_world4(kBufferBytes);
  config.set_two_shot_max_bytes_world6(kBufferBytes);
  config.set_two_shot_max_bytes_world8(kBufferBytes);
  config.set_graph_one_shot_registered(true);
  config.set_barrier_timeout_ms(20000);
  return config;
}

// TestConfig with the kernel's other code paths: the options not taken by default (programmatic
// launch, push or pull of inputs and of the two-shot gather; registered two-shot calls still
// gather into outputs), and a small odd grid (7 blocks of 96 or 64 threads) so every size above
// a few KiB takes several passes and ends in a partial unrolled step. Pushed inputs fit the 4 MiB
// test buffer up to 1 MiB (one-shot, world 4) or 2 MiB (two-shot): the larger test sizes pull
// either way.
AllReduceConfig AlternateConfig() {
  const AllReduceConfig defaults;
  AllReduceConfig config = TestConfig();
  config.set_programmatic_dependent_launch(!defaults.programmatic_dependent_launch());
  config.set_one_shot_push_inputs(!defaults.one_shot_push_inputs());
  config.set_two_shot_push_inputs(!defaults.two_shot_push_inputs());
  config.set_two_shot_push_gather(!defaults.two_shot_push_gather());
  config.set_max_blocks(7);
  config.set_threads_per_block(96);
  config.set_min_threads_per_block(64);
  return config;
}

// ---- host-side element encoding ----------------------------------------------------------

std::vector<uint8_t> Encode(const std::vector<double>& values, DataType dtype) {
  std::vector<uint8_t> out(values.size() * DataTypeSize(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    const float f = static_cast<float>(values[i]);
    switch (dtype) {
      case DataType::kBf16: {
        const __nv_bfloat16 b = __float2bfloat16(f);
        std::memcpy(&out[2 * i], &b, 2);
        break;
      }
      case DataType::kFp16: {
        const __half h = __float2half(f);
        std::memcpy(&out[2 * i], &h, 2);
        break;
      }
      case DataType::kFp32:
        std::memcpy(&out[4 * i], &f, 4);
        break;
    }
  }
  return out;
}

std::vector<double> Decode(const std::vector<uint8_t>& bytes, DataType dtype) {
  const size_t n = bytes.size() / DataTypeSize(dtype);
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) {
    switch (dtype) {
      case DataType::kBf16: {
        __nv_bfloat16 b;
        std::memcpy(&b, &bytes[2 * i], 2);
        out[i] = __bfloat162float(b);
        break;
      }
      case DataType::kFp16: {
        __half h;
        std::memcpy(&h, &bytes[2 * i], 2);
        out[i] = __half2float(h);
        break;
      }
      case DataType::kFp32: {
        float f;
        std::memcpy(&f, &bytes[4 * i], 4);
        out[i] = f;
        break;
      }
    }
  }
  return out;
}

// Nonzero integers in [-7, 7], a function of (seed, rank, index): every rank can compute every
// other rank's input, so the exact sum needs no communication. |sum| <= 56 is exact in bf16.
std::vector<double> IntegerInputs(size_t count, int rank, uint64_t seed) {
  std::mt19937_64 rng(seed * 1000003 + rank);
  std::vector<double> v(count);
  for (double& x : v) {
    const int k = static_cast<int>(rng() % 14);  // 0..13
    x = k < 7 ? k - 7 : k - 6;                  // -7..-1, 1..7
  }
  return v;
}

std::vector<double> IntegerSum(size_t count, int world, uint64_t seed) {
  std::vector<double> sum(count, 0.0);
  for (int r = 0; r < world; ++r) {
    std::vector<double> v = IntegerInputs(count, r, seed);
    for (size_t i = 0; i < count; ++i) sum[i] += v[i];
  }
  return sum;
}

// Number of elements of `got` that differ from `want` (exact comparison: integer sums).
size_t Mismatches(const std::vector<uint8_t>& got, const std::vector<double>& want,
                  DataType dtype) {
  std::vector<double> g = Decode(got, dtype);
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) bad += !(g[i] == want[i]);
  return bad;
}

constexpr DataType kDtypes[] = {DataType::kBf16, DataType::kFp16, DataType::kFp32};

// ---- tests ------------------------------------------------------------------------------------

// Runs every dtype and size through both kernels eagerly under `config` and compares with NCCL.
void EagerKernelsEqualNccl(const AllReduceConfig& config) {
  RunOnEveryGpu([&config](RankContext& ctx) {
    RankRig rig;
    ASSERT_NO_FATAL_FAILURE(MakeRig(ctx, config, &rig));
    const uint64_t seed = SharedSeed(ctx);
    const cudaStream_t s = rig.stream.get();
    DeviceBuffer in = AllocOrFail(kBufferBytes, "in");
    DeviceBuffer out = AllocOrFail(kBufferBytes, "out");
    DeviceBuffer ref = AllocOrFail(kBufferBytes, "nccl out");
    // 16 bytes to the limit, odd multiples of 16 included.
    const size_t sizes[] = {16,          48,          208,          4096,
                            16 * 1001,   65536 + 48,  262144,       16 * 65537,
                            kBufferBytes - 16 * 7,    kBufferBytes};
    for (DataType dtype : kDtypes) {
      for (size_t bytes : sizes) {
        const size_t count = bytes / DataTypeSize(dtype);
        const uint64_t case_seed = seed + bytes * 7 + static_cast<int>(dtype);
        Upload(in.data(), Encode(IntegerInputs(count, ctx.rank, case_seed), dtype), s);
        const std::vector<double> want = IntegerSum(count, ctx.world_size, case_seed);
        Poison(ref.data(), bytes, s);
        ASSERT_TRUE(rig.comm->nccl()->AllReduce(in.data(), ref.data(), count, dtype, s).ok());
        const std::vector<uint8_t> nccl = Download<uint8_t>(ref.data(), bytes, s);
        ASSERT_EQ(Mismatches(nccl, want, dtype), 0u) << "NCCL itself, " << bytes << " bytes";
        for (AllReduceAlgorithm algo :
             {AllReduceAlgorithm::kOneShot, AllReduceAlgorithm::kTwoShot}) {
          SCOPED_TRACE(absl::StrFormat("%s %s %d bytes seed %d", AllReduceAlgorithmName(algo),
                                       DataTypeName(dtype), bytes, case_seed));
          Poison(out.data(), bytes, s);
          ASSERT_TRUE(rig.comm->custom()
                          ->AllReduce(in.data(), out.data(), count, dtype,
                                      {algo, AllReduceInput::kStaged}, s)
                          .ok());
          const std::vector<uint8_t> got = Download<uint8_t>(out.data(), bytes, s);
          EXPECT_EQ(Mismatches(got, want, dtype), 0u);
          EXPECT_TRUE(got == nccl) << "not bitwise equal to NCCL";
          EXPECT_EQ(RanksDisagreeing(ctx, got), 0);
        }
      }
    }
    // In place, both kernels.
    for (AllReduceAlgorithm algo : {AllReduceAlgorithm::kOneShot, AllReduceAlgorithm::kTwoShot}) {
      const size_t bytes = 16 * 4099;
      const size_t count = bytes / 2;
      Upload(in.data(), Encode(IntegerInputs(count, ctx.rank, seed + 1), DataType::kBf16), s);
      ASSERT_TRUE(rig.comm->custom()
                      ->AllReduce(in.data(), in.data(), count, DataType::kBf16,
                                  {algo, AllReduceInput::kStaged}, s)
                      .ok());
      EXPECT_EQ(Mismatches(Download<uint8_t>(in.data(), bytes, s),
                           IntegerSum(count, ctx.world_size, seed + 1), DataType::kBf16),
                0u)
          << "in place, " << AllReduceAlgorithmName(algo);
    }
    EXPECT_TRUE(rig.comm->CheckAsyncErrors().ok());
  }, Options());
}

TEST(CustomAllReduceMultiGpuTest, EagerKernelsEqualNcclForEveryDtypeAndSize) {
  KILN_REQUIRE_GPUS(2);
  EagerKernelsEqualNccl(TestConfig());
}

TEST(CustomAllReduceMultiGpuTest, EagerKernelsEqualNcclWithTheOtherLaunchOptions) {
  KILN_REQUIRE_GPUS(2);
  EagerKernelsEqualNccl(AlternateConfig());
}

TEST(CustomAllReduceMultiGpuTest, RealValuedSumsAreBitwiseIdenticalOnEveryRank) {
  KILN_REQUIRE_GPUS(2);
  RunOnEveryGpu([](RankContext& ctx) {
    RankRig rig;
    ASSERT_NO_FATAL_FAILURE(MakeRig(ctx, TestConfig(), &rig));
    const uint64_t seed = SharedSeed(ctx);
    const cudaStream_t s = rig.stream.get();
    const size_t bytes = 16 * 40961;  // odd number of packs
    DeviceBuffer in = AllocOrFail(bytes, "in");
    DeviceBuffer out = AllocOrFail(bytes, "out");
    for (DataType dtype : kDtypes) {
      const size_t count = bytes / DataTypeSize(dtype);
      // Every rank's input (rounded to the dtype), and the float64 sum of those.
      std::vector<double> want(count, 0.0);
      std::vector<double> mine;
      for (int r = 0; r < ctx.world_size; ++r) {
        std::mt19937_64 rng(seed + 31 * r + static_cast<int>(dtype));
        std::uniform_real_distribution<double> dist(-1.0, 1.0);
        std::vector<double> v(count);
        for (double& x : v) x = dist(rng);
        v = Decode(Encode(v, dtype), dtype);
        for (size_t i = 0; i < count; ++i) want[i] += v[i];
        if (r == ctx.rank) mine = v;
      }
      Upload(in.data(), Encode(mine, dtype), s);
      for (AllReduceAlgorithm algo : {AllReduceAlgorithm::kOneShot, AllReduceAlgorithm::kTwoShot}) {
        Poison(out.data(), bytes, s);
        ASSERT_TRUE(rig.comm->custom()
                        ->AllReduce(in.data(), out.data(), count, dtype,
                                    {algo, AllReduceInput::kStaged}, s)
                        .ok());
        const std::vector<uint8_t> got = Download<uint8_t>(out.data(), bytes, s);
        EXPECT_EQ(RanksDisagreeing(ctx, got), 0)
            << AllReduceAlgorithmName(algo) << " " << DataTypeName(dtype);
        const std::vector<double> g = Decode(got, dtype);
        double err = 0, norm = 0;
        for (size_t i = 0; i < count; ++i) {
          err += (g[i] - want[i]) * (g[i] - want[i]);
          norm += want[i] * want[i];
        }
        const double rel = std::sqrt(err / norm);
        EXPECT_LT(rel, dtype == DataType::kFp32 ? 1e-6 : 1e-2)
            << AllReduceAlgorithmName(algo) << " " << DataTypeName(dtype);
        EXPECT_FALSE(std::isnan(rel));
      }
    }
  }, Options());
}

// Captures a graph of custom (registered and staged) and NCCL all-reduces under `config`,
// registers it and replays it with new inputs, interleaved with eager calls.
void GraphReplaysWithInputsChangedAfterCapture(const AllReduceConfig& config) {
  RunOnEveryGpu([&config](RankContext& ctx) {
    RankRig rig;
    ASSERT_NO_FATAL_FAILURE(MakeRig(ctx, config, &rig));
    const cudaStream_t s = rig.stream.get();
    struct Op {
      const char* name;
      size_t bytes;
      bool in_place;
      size_t in_offset;  // bytes; 2 makes the input unaligned
      AllReduceAlgorithm expect;
      AllReduceInput expect_input;
    };
    const Op ops[] = {
        {"one-shot registered", 8192, false, 0, AllReduceAlgorithm::kOneShot,
         AllReduceInput::kRegistered},
        {"one-shot in place (staged)", 4096, true, 0, AllReduceAlgorithm::kOneShot,
         AllReduceInput::kStaged},
        {"two-shot registered", 256 << 10, false, 0, AllReduceAlgorithm::kTwoShot,
         AllReduceInput::kRegistered},
        {"two-shot in place", 16 * 32771, true, 0, AllReduceAlgorithm::kTwoShot,
         AllReduceInput::kRegistered},
        {"unaligned -> nccl", 4096 + 6, false, 2, AllReduceAlgorithm::kNccl,
         AllReduceInput::kStaged},
        {"oversize -> nccl", kBufferBytes + 16, false, 0, AllReduceAlgorithm::kNccl,
         AllReduceInput::kStaged},
    };
    constexpr int kOps = sizeof(ops) / sizeof(ops[0]);
    const DataType dtype = DataType::kBf16;
    std::vector<DeviceBuffer> ins, outs;
    for (const Op& op : ops) {
      ins.push_back(AllocOrFail(op.bytes + op.in_offset, "graph in"));
      outs.push_back(op.in_place ? DeviceBuffer()
                                 : AllocOrFail(op.bytes + op.in_offset, "graph out"));
    }
    auto in_ptr = [&](int i) { return static_cast<char*>(ins[i].data()) + ops[i].in_offset; };
    auto out_ptr = [&](int i) {
      return ops[i].in_place ? in_ptr(i) : static_cast<char*>(outs[i].data()) + ops[i].in_offset;
    };
    auto run_all = [&]() {
      for (int i = 0; i < kOps; ++i) {
        ASSERT_TRUE(
            rig.comm->AllReduce(in_ptr(i), out_ptr(i), ops[i].bytes / 2, dtype, s).ok())
            << ops[i].name;
      }
    };
    auto load_inputs = [&](uint64_t seed) {
      for (int i = 0; i < kOps; ++i) {
        const size_t count = ops[i].bytes / 2;
        Upload(in_ptr(i), Encode(IntegerInputs(count, ctx.rank, seed + i), dtype), s);
        if (!ops[i].in_place) Poison(out_ptr(i), ops[i].bytes, s);
      }
    };
    auto check_outputs = [&](uint64_t seed, const char* when) {
      for (int i = 0; i < kOps; ++i) {
        const size_t count = ops[i].bytes / 2;
        const std::vector<uint8_t> got = Download<uint8_t>(out_ptr(i), ops[i].bytes, s);
        EXPECT_EQ(Mismatches(got, IntegerSum(count, ctx.world_size, seed + i), dtype), 0u)
            << ops[i].name << " " << when;
        EXPECT_EQ(RanksDisagreeing(ctx, got), 0) << ops[i].name << " " << when;
      }
    };

    // The policy's choice for each op, asked eagerly and while capturing.
    for (int i = 0; i < kOps; ++i) {
      auto plan = rig.comm->Plan(in_ptr(i), out_ptr(i), ops[i].bytes / 2, dtype, s);
      ASSERT_TRUE(plan.ok());
      EXPECT_EQ(plan->algorithm, ops[i].expect) << ops[i].name;
      EXPECT_EQ(plan->input, AllReduceInput::kStaged) << ops[i].name << " (eager)";
    }

    // Warm up eagerly (NCCL connects outside the capture), with checked results.
    uint64_t seed = SharedSeed(ctx);
    load_inputs(seed);
    ASSERT_NO_FATAL_FAILURE(run_all());
    check_outputs(seed, "eager warm-up");

    // Capture in global mode: nothing in the collectives may break it.
    const AllReduceStats before = rig.comm->stats();
    cudaGraph_t graph = nullptr;
    {
      CaptureContext::Scope scope(CapturePhase::kCapture, {GraphMode::kDecode, 8});
      ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
      for (int i = 0; i < kOps; ++i) {
        auto plan = rig.comm->Plan(in_ptr(i), out_ptr(i), ops[i].bytes / 2, dtype, s);
        ASSERT_TRUE(plan.ok());
        EXPECT_EQ(plan->algorithm, ops[i].expect) << ops[i].name << " (capturing)";
        if (plan->algorithm != AllReduceAlgorithm::kNccl) {
          EXPECT_EQ(plan->input, ops[i].expect_input) << ops[i].name << " (capturing)";
        }
      }
      run_all();
      // The size check is not skipped while capturing: a forced oversize call is refused
      // without enqueuing anything (the capture stays valid).
      absl::Status oversize = rig.comm->custom()->AllReduce(
          in_ptr(5), out_ptr(5), ops[5].bytes / 2, dtype,
          {AllReduceAlgorithm::kTwoShot, AllReduceInput::kRegistered}, s);
      EXPECT_EQ(oversize.code(), absl::StatusCode::kInvalidArgument) << oversize;
      ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
    }
    const AllReduceStats& after = rig.comm->stats();
    EXPECT_EQ(after.one_shot_registered - before.one_shot_registered, 1);
    EXPECT_EQ(after.one_shot_staged - before.one_shot_staged, 1);
    EXPECT_EQ(after.two_shot_registered - before.two_shot_registered, 2);
    EXPECT_EQ(after.nccl - before.nccl, 2);
    EXPECT_EQ(after.ipc_fallbacks, 0);
    EXPECT_EQ(rig.comm->custom()->pending_graph_inputs(), 3);

    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    EXPECT_EQ(rig.comm->CheckReplayable().code(), absl::StatusCode::kFailedPrecondition);
    ASSERT_TRUE(rig.comm->RegisterGraphBuffers().ok());
    EXPECT_TRUE(rig.comm->CheckReplayable().ok());
    EXPECT_EQ(rig.comm->custom()->registered_graph_inputs(), 3);

    // Replays with inputs rewritten in place after capture, interleaved with eager calls.
    for (int round = 0; round < 3; ++round) {
      seed = SharedSeed(ctx);
      load_inputs(seed);
      ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
      check_outputs(seed, absl::StrFormat("replay %d", round).c_str());
      if (round == 1) {
        seed = SharedSeed(ctx);
        load_inputs(seed);
        ASSERT_NO_FATAL_FAILURE(run_all());
        check_outputs(seed, "eager between replays");
      }
    }
    EXPECT_TRUE(rig.comm->CheckAsyncErrors().ok());
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }, Options());
}

TEST(CustomAllReduceMultiGpuTest, GraphReplaysWithInputsChangedAfterCapture) {
  KILN_REQUIRE_GPUS(2);
  GraphReplaysWithInputsChangedAfterCapture(TestConfig());
}

TEST(CustomAllReduceMultiGpuTest, GraphReplaysWithTheOtherLaunchOptions) {
  KILN_REQUIRE_GPUS(2);
  GraphReplaysWithInputsChangedAfterCapture(AlternateConfig());
}

// The default gathers registered two-shot calls into the peers' outputs (with pulled inputs in
// TestConfig, pushed ones in AlternateConfig); this runs the same graphs gathering into staging.
TEST(CustomAllReduceMultiGpuTest, GraphReplaysGatheringIntoStaging) {
  KILN_REQUIRE_GPUS(2);
  AllReduceConfig config = TestConfig();
  config.set_two_shot_gather_to_outputs(false);
  GraphReplaysWithInputsChangedAfterCapture(config);
}

TEST(CustomAllReduceMultiGpuTest, ReplayBeforeRegistrationIsFailedPrecondition) {
  KILN_REQUIRE_GPUS(2);
  RunOnEveryGpu([](RankContext& ctx) {
    RankRig rig;
    ASSERT_NO_FATAL_FAILURE(MakeRig(ctx, TestConfig(), &rig));
    const cudaStream_t s = rig.stream.get();
    const size_t bytes = 512 << 10;  // two-shot, registered under capture
    const size_t count = bytes / 2;
    DeviceBuffer in = AllocOrFail(bytes, "in");
    DeviceBuffer out = AllocOrFail(bytes, "out");
    uint64_t seed = SharedSeed(ctx);
    Upload(in.data(), Encode(IntegerInputs(count, ctx.rank, seed), DataType::kBf16), s);
    ASSERT_TRUE(rig.comm->AllReduce(in.data(), out.data(), count, DataType::kBf16, s).ok());
    ASSERT_EQ(Mismatches(Download<uint8_t>(out.data(), bytes, s),
                         IntegerSum(count, ctx.world_size, seed), DataType::kBf16),
              0u);

    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    ASSERT_TRUE(rig.comm->AllReduce(in.data(), out.data(), count, DataType::kBf16, s).ok());
    ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
    EXPECT_EQ(rig.comm->stats().two_shot_registered, 1);
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);

    // Host-side refusal first.
    absl::Status replayable = rig.comm->CheckReplayable();
    EXPECT_EQ(replayable.code(), absl::StatusCode::kFailedPrecondition) << replayable;
    EXPECT_NE(replayable.message().find("RegisterGraphBuffers"), absl::string_view::npos);

    // A replay anyway: no illegal address, output untouched, FailedPrecondition reported.
    Poison(out.data(), bytes, s);
    ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    absl::Status async = rig.comm->CheckAsyncErrors();
    EXPECT_EQ(async.code(), absl::StatusCode::kFailedPrecondition) << async;
    const std::vector<uint8_t> untouched = Download<uint8_t>(out.data(), bytes, s);
    size_t written = 0;
    for (uint8_t b : untouched) written += b != 0xFF;
    EXPECT_EQ(written, 0u) << "an unregistered replay wrote its output";
    EXPECT_TRUE(rig.comm->CheckAsyncErrors().ok()) << "reported once";

    // The ranks' call counters stayed in step: eager calls still work...
    seed = SharedSeed(ctx);
    Upload(in.data(), Encode(IntegerInputs(count, ctx.rank, seed), DataType::kBf16), s);
    ASSERT_TRUE(rig.comm->AllReduce(in.data(), out.data(), count, DataType::kBf16, s).ok());
    EXPECT_EQ(Mismatches(Download<uint8_t>(out.data(), bytes, s),
                         IntegerSum(count, ctx.world_size, seed), DataType::kBf16),
              0u);
    // ...and after registration the same graph replays correctly.
    ASSERT_TRUE(rig.comm->RegisterGraphBuffers().ok());
    EXPECT_TRUE(rig.comm->CheckReplayable().ok());
    Poison(out.data(), bytes, s);
    ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
    EXPECT_EQ(Mismatches(Download<uint8_t>(out.data(), bytes, s),
                         IntegerSum(count, ctx.world_size, seed), DataType::kBf16),
              0u);
    EXPECT_TRUE(rig.comm->CheckAsyncErrors().ok());
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }, Options());
}

TEST(CustomAllReduceMultiGpuTest, RegistrationChecksWhatEveryRankSaysAboutItsBuffers) {
  // Rank 0 captures a larger call than the others in the same graph input slot. Registration
  // checks what every rank sent about its buffers before mapping any: every rank refuses,
  // naming a rank whose size differs from its own and that size
  // (internal/graph_input_record_test.cc checks offsets and allocation sizes the same way).
  KILN_REQUIRE_GPUS(2);
  RunOnEveryGpu([](RankContext& ctx) {
    RankRig rig;
    ASSERT_NO_FATAL_FAILURE(MakeRig(ctx, TestConfig(), &rig));
    const cudaStream_t s = rig.stream.get();
    constexpr size_t kLarge = 512 << 10, kSmall = 256 << 10;
    const size_t bytes = ctx.rank == 0 ? kLarge : kSmall;
    DeviceBuffer in = AllocOrFail(kLarge, "in");
    DeviceBuffer out = AllocOrFail(kLarge, "out");
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    const absl::Status captured = rig.comm->custom()->AllReduce(
        in.data(), out.data(), bytes / 2, DataType::kBf16,
        {AllReduceAlgorithm::kTwoShot, AllReduceInput::kRegistered}, s);
    ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
    ASSERT_TRUE(captured.ok()) << captured;
    const absl::Status registered = rig.comm->RegisterGraphBuffers();
    EXPECT_EQ(registered.code(), absl::StatusCode::kFailedPrecondition) << registered;
    const std::string want = ctx.rank == 0
                                 ? absl::StrFormat("Rank 1 captured a %d-byte all-reduce", kSmall)
                                 : absl::StrFormat("Rank 0 captured a %d-byte all-reduce", kLarge);
    EXPECT_NE(std::string(registered.message()).find(want), std::string::npos) << registered;
    EXPECT_EQ(rig.comm->CheckReplayable().code(), absl::StatusCode::kFailedPrecondition);
    cudaGraphDestroy(graph);
  }, Options());
}

TEST(CustomAllReduceMultiGpuTest, UnalignedAndOversizeEagerCallsTakeNccl) {
  KILN_REQUIRE_GPUS(2);
  RunOnEveryGpu([](RankContext& ctx) {
    RankRig rig;
    ASSERT_NO_FATAL_FAILURE(MakeRig(ctx, TestConfig(), &rig));
    const cudaStream_t s = rig.stream.get();
    DeviceBuffer in = AllocOrFail(kBufferBytes + 64, "in");
    DeviceBuffer out = AllocOrFail(kBufferBytes + 64, "out");
    const uint64_t seed = SharedSeed(ctx);
    struct Case {
      const char* name;
      size_t offset;  // bytes added to both pointers
      size_t count;   // bf16 elements
    };
    const Case cases[] = {
        {"size not a multiple of 16 bytes", 0, 1001},
        {"pointer 2 bytes off", 2, 4096},
        {"pointer 8 bytes off", 8, 4096},
        {"oversize", 0, kBufferBytes / 2 + 8},
    };
    for (const Case& c : cases) {
      const int64_t nccl_before = rig.comm->stats().nccl;
      char* i = static_cast<char*>(in.data()) + c.offset;
      char* o = static_cast<char*>(out.data()) + c.offset;
      Upload(i, Encode(IntegerInputs(c.count, ctx.rank, seed), DataType::kBf16), s);
      Poison(o, c.count * 2, s);
      ASSERT_TRUE(rig.comm->AllReduce(i, o, c.count, DataType::kBf16, s).ok()) << c.name;
      EXPECT_EQ(rig.comm->stats().nccl, nccl_before + 1) << c.name;
      EXPECT_EQ(Mismatches(Download<uint8_t>(o, c.count * 2, s),
                           IntegerSum(c.count, ctx.world_size, seed), DataType::kBf16),
                0u)
          << c.name;
      // Forcing the custom kernel on it is refused, not run.
      EXPECT_EQ(rig.comm->custom()
                    ->AllReduce(i, o, c.count, DataType::kBf16,
                                {AllReduceAlgorithm::kOneShot, AllReduceInput::kStaged}, s)
                    .code(),
                absl::StatusCode::kInvalidArgument)
          << c.name;
    }
  }, Options());
}

TEST(CustomAllReduceMultiGpuTest, BadArgumentsAreRefusedOnEveryPathAndLaterCallsWork) {
  KILN_REQUIRE_GPUS(2);
  RunOnEveryGpu([](RankContext& ctx) {
    RankRig rig;
    ASSERT_NO_FATAL_FAILURE(MakeRig(ctx, TestConfig(), &rig));
    const cudaStream_t s = rig.stream.get();
    AutoCommunicator& comm = *rig.comm;
    constexpr size_t kCount = 4096;  // 8 KiB of bf16: a size AutoCommunicator sends to one-shot
    DeviceBuffer in = AllocOrFail(kCount * 4, "in");  // room for fp32, the dtype NCCL assumed
    DeviceBuffer out = AllocOrFail(kCount * 4, "out");
    struct Case {
      const char* name;
      const void* in;
      void* out;
      size_t count;
      DataType dtype;
    };
    // A null input is 16-byte aligned and used to reach the custom kernel (an illegal address
    // that ends the CUDA context); dtype 7 made NCCL reduce fp32; 2^63 + 8 bf16 elements wrap to
    // 16 bytes, which the custom kernel took.
    const Case cases[] = {
        {"null in", nullptr, out.data(), kCount, DataType::kBf16},
        {"null out", in.data(), nullptr, kCount, DataType::kBf16},
        {"dtype 7", in.data(), out.data(), kCount, static_cast<DataType>(7)},
        {"wrapping count", in.data(), out.data(), (size_t{1} << 63) + 8, DataType::kBf16},
    };
    const AllReducePlan one_shot{AllReduceAlgorithm::kOneShot, AllReduceInput::kStaged};
    for (const Case& c : cases) {
      EXPECT_EQ(comm.AllReduce(c.in, c.out, c.count, c.dtype, s).code(),
                absl::StatusCode::kInvalidArgument)
          << c.name;
      EXPECT_EQ(comm.Plan(c.in, c.out, c.count, c.dtype, s).status().code(),
                absl::StatusCode::kInvalidArgument)
          << c.name;
      EXPECT_EQ(comm.nccl()->AllReduce(c.in, c.out, c.count, c.dtype, s).code(),
                absl::StatusCode::kInvalidArgument)
          << c.name;
      EXPECT_EQ(comm.custom()->AllReduce(c.in, c.out, c.count, c.dtype, one_shot, s).code(),
                absl::StatusCode::kInvalidArgument)
          << c.name;
    }
    // None of them reached a kernel: the stream, the context and both paths still work.
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_TRUE(comm.CheckAsyncErrors().ok());
    // AutoCommunicator checks the arguments once, when it plans; the communicators under it
    // enqueue without checking again. Every refusal still comes before anything is enqueued: a
    // capture of refused calls only (on every path, registered input included) holds no node.
    cudaGraph_t graph = nullptr;
    const AllReducePlan registered{AllReduceAlgorithm::kOneShot, AllReduceInput::kRegistered};
    ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    for (const Case& c : cases) {
      EXPECT_EQ(comm.AllReduce(c.in, c.out, c.count, c.dtype, s).code(),
                absl::StatusCode::kInvalidArgument)
          << c.name << " (capturing)";
      EXPECT_EQ(comm.nccl()->AllReduce(c.in, c.out, c.count, c.dtype, s).code(),
                absl::StatusCode::kInvalidArgument)
          << c.name << " (capturing)";
      EXPECT_EQ(comm.custom()->AllReduce(c.in, c.out, c.count, c.dtype, registered, s).code(),
                absl::StatusCode::kInvalidArgument)
          << c.name << " (capturing)";
    }
    ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
    size_t nodes = 1;
    EXPECT_EQ(cudaGraphGetNodes(graph, nullptr, &nodes), cudaSuccess);
    EXPECT_EQ(nodes, 0u) << "a refused call enqueued work";
    cudaGraphDestroy(graph);
    // The capture state, read once by AutoCommunicator for the custom all-reduce: CaptureContext
    // says capture but the stream is not capturing. The plan wants a registered input; the
    // custom all-reduce refuses before recording or enqueuing anything.
    {
      CaptureContext::Scope scope(CapturePhase::kCapture, {GraphMode::kDecode, 8});
      const absl::Status status = comm.AllReduce(in.data(), out.data(), kCount, DataType::kBf16, s);
      EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    }
    EXPECT_EQ(comm.custom()->pending_graph_inputs(), 0);
    EXPECT_EQ(cudaStreamQuery(s), cudaSuccess);
    EXPECT_EQ(comm.stats().one_shot_staged + comm.stats().one_shot_registered + comm.stats().nccl,
              0);
    const uint64_t seed = SharedSeed(ctx);
    Upload(in.data(), Encode(IntegerInputs(kCount, ctx.rank, seed), DataType::kBf16), s);
    for (bool nccl : {false, true}) {
      Poison(out.data(), kCount * 2, s);
      ASSERT_TRUE((nccl ? comm.nccl()->AllReduce(in.data(), out.data(), kCount, DataType::kBf16, s)
                        : comm.AllReduce(in.data(), out.data(), kCount, DataType::kBf16, s))
                      .ok());
      EXPECT_EQ(Mismatches(Download<uint8_t>(out.data(), kCount * 2, s),
                           IntegerSum(kCount, ctx.world_size, seed), DataType::kBf16),
                0u)
          << (nccl ? "nccl" : "auto");
    }
    EXPECT_EQ(comm.stats().one_shot_staged, 1);
  }, Options());
}

TEST(CustomAllReduceMultiGpuTest, AnNcclCommunicatorAbortedWithAnOkReasonStillFails) {
  KILN_REQUIRE_GPUS(2);
  RunOnEveryGpu([](RankContext& ctx) {
    RankRig rig;
    ASSERT_NO_FATAL_FAILURE(MakeRig(ctx, TestConfig(), &rig));
    DeviceBuffer in = AllocOrFail(4096, "in");
    DeviceBuffer out = AllocOrFail(4096, "out");
    // Every rank aborts alike. An OK reason used to make every later call return OK without
    // enqueuing anything.
    rig.comm->nccl()->Abort(absl::OkStatus());
    EXPECT_EQ(rig.comm->nccl()
                  ->AllReduce(in.data(), out.data(), 2048, DataType::kBf16, rig.stream.get())
                  .code(),
              absl::StatusCode::kFailedPrecondition);
    // The abort comes first, before the arguments' checks: a bad call reports it too.
    EXPECT_EQ(rig.comm->nccl()
                  ->AllReduce(nullptr, out.data(), 2048, static_cast<DataType>(7),
                              rig.stream.get())
                  .code(),
              absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(rig.comm->nccl()->CheckAsyncErrors().code(), absl::StatusCode::kFailedPrecondition);
  }, Options());
}

// The dead-peer tests' common start: a rig with `config`, `count` integer inputs, three
// all-reduces of them enqueued.
struct DeadPeerCase {
  RankRig rig;
  size_t count = 0;
  DeviceBuffer in, out;
  uint64_t seed = 0;

  // Enqueues one all-reduce of in into out on the rig's stream.
  absl::Status AllReduce() {
    return rig.comm->AllReduce(in.data(), out.data(), count, DataType::kBf16, rig.stream.get());
  }
};

void StartDeadPeerCase(RankContext& ctx, const AllReduceConfig& config, size_t count,
                       DeadPeerCase* c) {
  ASSERT_NO_FATAL_FAILURE(MakeRig(ctx, config, &c->rig));
  c->count = count;
  c->in = AllocOrFail(count * 2, "in");
  c->out = AllocOrFail(count * 2, "out");
  c->seed = SharedSeed(ctx);
  Upload(c->in.data(), Encode(IntegerInputs(count, ctx.rank, c->seed), DataType::kBf16),
         c->rig.stream.get());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(c->AllReduce().ok());
}

// Every rank meets the others once more, then the last one exits; the others give it time to.
void LastRankDies(RankContext& ctx) {
  ASSERT_TRUE(ctx.bootstrap.Barrier("custom_allreduce_multigpu_test.before_exit").ok());
  if (ctx.rank == ctx.world_size - 1) ctx.ExitProcessNow();  // dies between collectives
  absl::SleepFor(absl::Milliseconds(300));
}

TEST(CustomAllReduceMultiGpuTest, DeadPeerEndsInDeadlineExceeded) {
  KILN_REQUIRE_GPUS(2);
  testing::MultiProcessTestOptions options = Options();
  options.final_barrier = false;  // one rank exits on purpose
  RunOnEveryGpu(
      [](RankContext& ctx) {
        AllReduceConfig config = TestConfig();
        config.set_barrier_timeout_ms(2000);
        const size_t count = 4096;
        DeadPeerCase c;
        ASSERT_NO_FATAL_FAILURE(StartDeadPeerCase(ctx, config, count, &c));
        const cudaStream_t s = c.rig.stream.get();
        ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
        ASSERT_NO_FATAL_FAILURE(LastRankDies(ctx));
        const absl::Time start = absl::Now();
        // Several calls queued behind the stuck one: they must not each wait out the timeout.
        for (int i = 0; i < 3; ++i) ASSERT_TRUE(c.AllReduce().ok());
        ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess) << "the kernel must end, not fault";
        const absl::Duration waited = absl::Now() - start;
        absl::Status status = c.rig.comm->CheckAsyncErrors();
        EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
        EXPECT_GE(waited, absl::Milliseconds(1800));
        EXPECT_LT(waited, absl::Seconds(6)) << "bounded by one barrier timeout, not three";
        // Sticky: later calls fail at once.
        EXPECT_EQ(c.AllReduce().code(), absl::StatusCode::kDeadlineExceeded);
        // The lost peer comes first, before the arguments' checks: calls the custom all-reduce
        // would refuse (a plan it cannot run, a null input, rows it does not fuse) report it too.
        CustomAllReduce& custom = *c.rig.comm->custom();
        EXPECT_EQ(custom.AllReduce(c.in.data(), c.out.data(), count, DataType::kBf16,
                                   AllReducePlan{}, s)
                      .code(),
                  absl::StatusCode::kDeadlineExceeded);
        EXPECT_EQ(custom.AllReduce(nullptr, c.out.data(), count, DataType::kBf16,
                                   {AllReduceAlgorithm::kOneShot, AllReduceInput::kStaged}, s)
                      .code(),
                  absl::StatusCode::kDeadlineExceeded);
        AllReduceAddRmsNormArgs fused;
        fused.partial = c.in.data();
        fused.out = c.out.data();
        fused.tokens = 1;
        fused.hidden = 3;  // not a multiple of 8
        EXPECT_EQ(custom.AllReduceAddRmsNorm(fused, AllReduceInput::kStaged, s).code(),
                  absl::StatusCode::kDeadlineExceeded);
        // AutoCommunicator asks the same first, whatever the call: one it would refuse (a null
        // input, rows it does not fuse) and one it plans for NCCL (an unaligned input; an NCCL
        // kernel would wait for the dead peer with no timeout) report the lost peer, and
        // nothing is enqueued.
        AutoCommunicator& comm = *c.rig.comm;
        const AllReduceStats before = comm.stats();
        const absl::Status bad = comm.AllReduce(nullptr, c.out.data(), count, DataType::kBf16, s);
        EXPECT_EQ(bad.code(), absl::StatusCode::kDeadlineExceeded) << bad;
        const void* unaligned_in = static_cast<const char*>(c.in.data()) + 2;
        void* unaligned_out = static_cast<char*>(c.out.data()) + 2;
        absl::StatusOr<AllReducePlan> plan =
            comm.Plan(unaligned_in, unaligned_out, count - 1, DataType::kBf16, s);
        ASSERT_TRUE(plan.ok()) << plan.status();
        ASSERT_EQ(plan->algorithm, AllReduceAlgorithm::kNccl);
        const absl::Status nccl_planned =
            comm.AllReduce(unaligned_in, unaligned_out, count - 1, DataType::kBf16, s);
        EXPECT_EQ(nccl_planned.code(), absl::StatusCode::kDeadlineExceeded) << nccl_planned;
        EXPECT_NE(nccl_planned.message().find("waited more than"), absl::string_view::npos)
            << nccl_planned;
        const absl::Status fused_status = comm.AllReduceAddRmsNorm(fused, s);
        EXPECT_EQ(fused_status.code(), absl::StatusCode::kDeadlineExceeded) << fused_status;
        EXPECT_EQ(comm.stats().nccl, before.nccl) << "an NCCL call was enqueued";
        EXPECT_EQ(comm.stats().one_shot_staged, before.one_shot_staged);
        EXPECT_EQ(cudaStreamQuery(s), cudaSuccess) << "work was enqueued after the timeout";
        // A communicator with a dead peer cannot be torn down collectively (NCCL's finalize
        // would wait for it); the process is about to exit, so leave it to the driver.
        c.rig.comm.release();
      },
      options);
}

// A peer lost while the ranks agree on a captured registered input is not the agreement that a
// rank could not export its input: no NCCL kernel (which would wait for that peer) is captured
// in its place, and the error is sticky on every later call, registration included.
TEST(CustomAllReduceMultiGpuTest, DeadPeerDuringCaptureAgreementIsStickyNotAFallback) {
  KILN_REQUIRE_GPUS(2);
  testing::MultiProcessTestOptions options = Options();
  options.final_barrier = false;  // one rank exits on purpose
  RunOnEveryGpu(
      [](RankContext& ctx) {
        const size_t count = 4096;  // one-shot, registered under capture
        DeadPeerCase c;
        ASSERT_NO_FATAL_FAILURE(StartDeadPeerCase(ctx, TestConfig(), count, &c));
        const cudaStream_t s = c.rig.stream.get();
        ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
        ASSERT_NO_FATAL_FAILURE(LastRankDies(ctx));
        AutoCommunicator& comm = *c.rig.comm;
        const AllReduceStats before = comm.stats();
        absl::Status captured;
        cudaGraph_t graph = nullptr;
        {
          CaptureContext::Scope scope(CapturePhase::kCapture, {GraphMode::kDecode, 8});
          ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
          absl::StatusOr<AllReducePlan> plan =
              comm.Plan(c.in.data(), c.out.data(), count, DataType::kBf16, s);
          ASSERT_TRUE(plan.ok()) << plan.status();
          EXPECT_EQ(plan->input, AllReduceInput::kRegistered);
          captured = c.AllReduce();
          ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
        }
        EXPECT_FALSE(captured.ok());
        EXPECT_NE(captured.code(), absl::StatusCode::kUnavailable) << captured;
        if (ctx.rank == 0) {
          EXPECT_EQ(captured.code(), absl::StatusCode::kAborted) << captured;
          EXPECT_NE(captured.message().find(absl::StrFormat("lost rank %d", ctx.world_size - 1)),
                    absl::string_view::npos)
              << captured;
        }
        EXPECT_EQ(comm.stats().ipc_fallbacks, before.ipc_fallbacks);
        EXPECT_EQ(comm.stats().nccl, before.nccl) << "an NCCL call was captured";
        size_t nodes = 0;
        ASSERT_EQ(cudaGraphGetNodes(graph, nullptr, &nodes), cudaSuccess);
        EXPECT_EQ(nodes, 0u) << "a kernel waiting for the lost peer was captured";
        cudaGraphDestroy(graph);
        // Sticky: later calls, registration among them, report it at once.
        EXPECT_EQ(c.AllReduce().code(), captured.code());
        EXPECT_EQ(comm.CheckAsyncErrors().code(), captured.code());
        EXPECT_EQ(comm.RegisterGraphBuffers().code(), captured.code());
        EXPECT_TRUE(comm.custom()->peer_lost());
        EXPECT_EQ(comm.stats().nccl, before.nccl);
        // The teardown is collective (it would wait for the dead peer); the process is about to
        // exit, so leave it to the driver.
        c.rig.comm.release();
      },
      options);
}

// A peer lost while the custom all-reduce is being set up is not the ranks' agreement that it
// cannot run (Unavailable, on which AutoCommunicator takes NCCL alone): Create reports the lost
// peer as Aborted on every rank left.
TEST(CustomAllReduceMultiGpuTest, DeadPeerDuringCreateIsAbortedNotUnavailable) {
  KILN_REQUIRE_GPUS(2);
  testing::MultiProcessTestOptions options = Options();
  options.final_barrier = false;  // one rank exits on purpose
  RunOnEveryGpu(
      [](RankContext& ctx) {
        ASSERT_EQ(cudaSetDevice(ctx.device()), cudaSuccess);
        ctx.bootstrap.set_timeout(absl::Seconds(10));
        ASSERT_NO_FATAL_FAILURE(LastRankDies(ctx));
        absl::StatusOr<std::unique_ptr<CustomAllReduce>> custom =
            CustomAllReduce::Create(ctx.bootstrap, ctx.device(), TestConfig());
        ASSERT_FALSE(custom.ok());
        EXPECT_NE(custom.status().code(), absl::StatusCode::kUnavailable) << custom.status();
        if (ctx.rank == 0) {
          EXPECT_EQ(custom.status().code(), absl::StatusCode::kAborted) << custom.status();
          EXPECT_NE(custom.status().message().find(
                        absl::StrFormat("lost rank %d", ctx.world_size - 1)),
                    absl::string_view::npos)
              << custom.status();
        }
      },
      options);
}

// NCCL's kernels have no timeout of their own: SynchronizeStream bounds the wait, aborts the
// communicator and reports DeadlineExceeded; the aborted kernels return.
TEST(CustomAllReduceMultiGpuTest, DeadPeerInNcclEndsInDeadlineExceededFromSynchronizeStream) {
  KILN_REQUIRE_GPUS(2);
  testing::MultiProcessTestOptions options = Options();
  options.final_barrier = false;  // one rank exits on purpose
  RunOnEveryGpu(
      [](RankContext& ctx) {
        AllReduceConfig config = TestConfig();
        config.set_bootstrap_timeout_ms(5000);
        const size_t count = kBufferBytes / 2 + 4096;  // above the custom buffer: NCCL
        DeadPeerCase c;
        ASSERT_NO_FATAL_FAILURE(StartDeadPeerCase(ctx, config, count, &c));
        const cudaStream_t s = c.rig.stream.get();
        const int64_t nccl_calls = c.rig.comm->stats().nccl;
        EXPECT_EQ(nccl_calls, 3);
        absl::Status ok = c.rig.comm->SynchronizeStream(s, absl::Seconds(20));
        ASSERT_TRUE(ok.ok()) << ok;
        // The results are right before anyone dies.
        EXPECT_EQ(Mismatches(Download<uint8_t>(c.out.data(), count * 2, s),
                             IntegerSum(count, ctx.world_size, c.seed), DataType::kBf16),
                  0u);
        ASSERT_NO_FATAL_FAILURE(LastRankDies(ctx));
        ASSERT_TRUE(c.AllReduce().ok());
        const absl::Time start = absl::Now();
        absl::Status status = c.rig.comm->SynchronizeStream(s, absl::Seconds(2));
        const absl::Duration waited = absl::Now() - start;
        EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
        EXPECT_GE(waited, absl::Milliseconds(1900));
        EXPECT_LT(waited, absl::Seconds(8)) << "the timeout, then the aborted kernel's return";
        EXPECT_EQ(cudaStreamQuery(s), cudaSuccess) << "the aborted NCCL kernel must return";
        // Sticky: later calls fail at once with the same error.
        EXPECT_EQ(c.AllReduce().code(), absl::StatusCode::kDeadlineExceeded);
        EXPECT_EQ(c.rig.comm->CheckAsyncErrors().code(), absl::StatusCode::kDeadlineExceeded);
        // The custom all-reduce's teardown is collective (it would wait for the dead peer); the
        // process is about to exit, so leave it to the driver.
        c.rig.comm.release();
      },
      options);
}

}  // namespace
}  // namespace kiln
