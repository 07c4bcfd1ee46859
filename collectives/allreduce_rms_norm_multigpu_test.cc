// Multi-GPU tests of the fused all-reduce + residual add + RMSNorm (Communicator::
// AllReduceAddRmsNorm on AutoCommunicator), one process per GPU (world size = visible GPUs, or
// $KILN_TEST_WORLD_SIZE). Random bf16 inputs that every rank can regenerate from a shared seed;
// three references:
//   - the unfused path: the custom one-shot AllReduce of the same partial sums (which must equal
//     a CPU emulation of its float rank-order sum bit for bit), then a CPU emulation of
//     runtime/model's add + RMSNorm in float with its exact operation and reduction order. The
//     residual must match bit for bit; the normed output to within one bf16 ulp per element
//     (the GPU's rsqrtf is an approximation the CPU cannot reproduce), with almost every
//     element exact. (The model-level test runtime/runner/runner_multigpu_test.cc compares the
//     fused step with runtime/model's own unfused kernels bit for bit.)
//   - a CPU float64 reference from the raw inputs, by relative error;
//   - every other rank: the same bits everywhere.
// Outputs are poisoned (NaN) before every call; graphs are replayed with inputs rewritten after
// capture, with staged and with registered inputs. Shapes up to 512 KiB take the push kernel,
// larger ones the pull kernel (CustomAllReduce::AddRmsNormPushes); both are covered.
#include <cuda_runtime_api.h>

#include <algorithm>
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

constexpr size_t kBufferBytes = 4 << 20;
constexpr float kEps = 1e-5f;

testing::MultiProcessTestOptions Options() {
  testing::MultiProcessTestOptions options;
  options.timeout = absl::Seconds(90);
  return options;
}

// One-shot up to the whole buffer at every world size, so every shape here fuses.
AllReduceConfig TestConfig(bool registered) {
  AllReduceConfig config;
  config.set_buffer_bytes(kBufferBytes);
  config.set_one_shot_max_bytes_world2(kBufferBytes);
  config.set_one_shot_max_bytes_world4(kBufferBytes);
  config.set_one_shot_max_bytes_world6(kBufferBytes);
  config.set_one_shot_max_bytes_world8(kBufferBytes);
  config.set_graph_one_shot_registered(registered);
  config.set_barrier_timeout_ms(20000);
  return config;
}

// ---- bf16 on the host, bit-exact ---------------------------------------------------------------

float Bf16ToFloat(uint16_t b) {
  const uint32_t bits = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, as __float2bfloat16_rn (inputs here are finite).
uint16_t FloatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float RoundBf16(float f) { return Bf16ToFloat(FloatToBf16(f)); }

std::vector<uint16_t> RandomBf16(size_t n, uint64_t seed, double lo, double hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<uint16_t> v(n);
  for (uint16_t& x : v) {
    do {
      x = FloatToBf16(static_cast<float>(dist(rng)));
    } while (Bf16ToFloat(x) == 0.0f);  // never test on zeros
  }
  return v;
}

// ---- one case's inputs and references --------------------------------------------------------

struct Shape {
  int64_t tokens;
  int64_t hidden;
};

struct Inputs {
  std::vector<std::vector<uint16_t>> partial;  // per rank
  std::vector<uint16_t> residual, weight;
};

// Every rank's inputs, a function of the shared seed.
Inputs MakeInputs(const Shape& s, int world, uint64_t seed) {
  Inputs in;
  const size_t n = static_cast<size_t>(s.tokens * s.hidden);
  for (int r = 0; r < world; ++r) in.partial.push_back(RandomBf16(n, seed * 131 + r, -1.0, 1.0));
  in.residual = RandomBf16(n, seed * 131 + 97, -2.0, 2.0);
  in.weight = RandomBf16(static_cast<size_t>(s.hidden), seed * 131 + 98, 0.5, 1.5);
  return in;
}

// The one-shot all-reduce of in.partial: float sum in rank order, rounded once.
std::vector<uint16_t> EmulateSum(const Inputs& in) {
  std::vector<uint16_t> sum(in.partial[0].size());
  for (size_t i = 0; i < sum.size(); ++i) {
    float acc = Bf16ToFloat(in.partial[0][i]);
    for (size_t r = 1; r < in.partial.size(); ++r) acc = acc + Bf16ToFloat(in.partial[r][i]);
    sum[i] = FloatToBf16(acc);
  }
  return sum;
}

struct Normed {
  std::vector<uint16_t> residual, out;
};

// runtime/model's LaunchFusedAddRmsNorm on the host: float arithmetic, the residual rounded
// before the norm, and the sum of squares in the kernel's order (thread t sums packs t, t + T,
// ... with fused multiply-adds; a butterfly within each warp; the warps' sums, padded with zeros
// to 32, in a second butterfly). Only rsqrtf is exact here.
Normed EmulateAddRmsNorm(const Shape& s, const std::vector<uint16_t>& x, const Inputs& in) {
  const int hidden = static_cast<int>(s.hidden);
  const int packs = hidden / 8;
  const int threads = std::min(1024, std::max(32, (packs + 31) / 32 * 32));
  auto butterfly = [](std::vector<float> v) {  // 32 lanes; every lane ends with the same sum
    for (int offset = 16; offset > 0; offset >>= 1) {
      std::vector<float> next(32);
      for (int l = 0; l < 32; ++l) next[l] = v[l] + v[l ^ offset];
      v = next;
    }
    return v[0];
  };
  Normed n;
  n.residual.resize(x.size());
  n.out.resize(x.size());
  std::vector<float> v(static_cast<size_t>(hidden));
  for (int64_t t = 0; t < s.tokens; ++t) {
    const size_t base = static_cast<size_t>(t * hidden);
    for (int i = 0; i < hidden; ++i) {
      const float sum = Bf16ToFloat(x[base + i]) + Bf16ToFloat(in.residual[base + i]);
      n.residual[base + i] = FloatToBf16(sum);
      v[i] = RoundBf16(sum);
    }
    std::vector<float> per_thread(static_cast<size_t>(threads), 0.0f);
    for (int th = 0; th < threads; ++th) {
      float acc = 0.0f;
      for (int c = 0; c < 4; ++c) {
        const int col = c * threads + th;
        if (col >= packs) continue;
        for (int i = 0; i < 8; ++i) acc = std::fmaf(v[col * 8 + i], v[col * 8 + i], acc);
      }
      per_thread[th] = acc;
    }
    std::vector<float> warp_sums(32, 0.0f);
    for (int w = 0; w < threads / 32; ++w) {
      warp_sums[w] = butterfly(std::vector<float>(per_thread.begin() + 32 * w,
                                                  per_thread.begin() + 32 * (w + 1)));
    }
    const float total = butterfly(warp_sums);
    const float mean_plus_eps = total / static_cast<float>(hidden) + kEps;
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(mean_plus_eps)));
    for (int i = 0; i < hidden; ++i) {
      n.out[base + i] = FloatToBf16(v[i] * scale * Bf16ToFloat(in.weight[i]));
    }
  }
  return n;
}

// The float64 reference from the raw inputs.
struct Exact {
  std::vector<double> residual, out;
};

Exact ExactReference(const Shape& s, const Inputs& in) {
  Exact e;
  const size_t hidden = static_cast<size_t>(s.hidden);
  e.residual.resize(in.residual.size());
  e.out.resize(in.residual.size());
  for (int64_t t = 0; t < s.tokens; ++t) {
    const size_t base = static_cast<size_t>(t) * hidden;
    double sq = 0;
    for (size_t i = 0; i < hidden; ++i) {
      double v = Bf16ToFloat(in.residual[base + i]);
      for (const auto& p : in.partial) v += Bf16ToFloat(p[base + i]);
      e.residual[base + i] = v;
      sq += v * v;
    }
    const double scale = 1.0 / std::sqrt(sq / hidden + kEps);
    for (size_t i = 0; i < hidden; ++i) {
      e.out[base + i] = e.residual[base + i] * scale * Bf16ToFloat(in.weight[i]);
    }
  }
  return e;
}

double RelativeError(const std::vector<uint16_t>& got, const std::vector<double>& want) {
  double err = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = Bf16ToFloat(got[i]);
    err += (g - want[i]) * (g - want[i]);
    norm += want[i] * want[i];
  }
  return std::sqrt(err / norm);
}

// Distance in bf16 ulps between two same-signed finite values (large for NaN or sign changes).
int UlpDistance(uint16_t a, uint16_t b) {
  if ((a & 0x7f80) == 0x7f80 || (b & 0x7f80) == 0x7f80) return 1 << 20;  // NaN / inf
  if ((a ^ b) & 0x8000) return a == b ? 0 : 1 << 20;
  return std::abs(static_cast<int>(a & 0x7fff) - static_cast<int>(b & 0x7fff));
}

// ---- device helpers ---------------------------------------------------------------------------

// Device buffers of one fused call; `out` is `partial` itself when in place.
struct CallBuffers {
  Shape shape;
  bool in_place = false;
  DeviceBuffer partial, residual, weight, out_buffer;
  void* out() const { return in_place ? partial.data() : out_buffer.data(); }
  size_t count() const { return static_cast<size_t>(shape.tokens * shape.hidden); }

  AllReduceAddRmsNormArgs Args() const {
    AllReduceAddRmsNormArgs a;
    a.partial = partial.data();
    a.residual = residual.data();
    a.weight = weight.data();
    a.out = out();
    a.tokens = shape.tokens;
    a.hidden = shape.hidden;
    a.eps = kEps;
    a.dtype = DataType::kBf16;
    return a;
  }
};

CallBuffers MakeCall(const Shape& s, bool in_place) {
  CallBuffers c;
  c.shape = s;
  c.in_place = in_place;
  const size_t bytes = static_cast<size_t>(s.tokens * s.hidden) * 2;
  c.partial = AllocOrFail(bytes, "partial");
  c.residual = AllocOrFail(bytes, "residual");
  c.weight = AllocOrFail(static_cast<size_t>(s.hidden) * 2, "weight");
  if (!in_place) c.out_buffer = AllocOrFail(bytes, "out");
  return c;
}

// Uploads this rank's inputs of `c` and poisons its output.
void Load(const CallBuffers& c, const Inputs& in, int rank, cudaStream_t s) {
  ASSERT_NO_FATAL_FAILURE(Upload(c.partial.data(), in.partial[rank], s));
  ASSERT_NO_FATAL_FAILURE(Upload(c.residual.data(), in.residual, s));
  ASSERT_NO_FATAL_FAILURE(Upload(c.weight.data(), in.weight, s));
  if (!c.in_place) {
    ASSERT_NO_FATAL_FAILURE(Poison(c.out(), c.count() * 2, s));
  }
}

// Checks a finished call's residual and output against the references and the other ranks.
// `sum` is the unfused all-reduce's output (already checked against EmulateSum).
void CheckCall(RankContext& ctx, const CallBuffers& c, const Inputs& in,
               const std::vector<uint16_t>& sum, cudaStream_t s, const std::string& what) {
  SCOPED_TRACE(what);
  const std::vector<uint16_t> residual = Download<uint16_t>(c.residual.data(), c.count(), s);
  const std::vector<uint16_t> out = Download<uint16_t>(c.out(), c.count(), s);
  const Normed want = EmulateAddRmsNorm(c.shape, sum, in);
  EXPECT_TRUE(residual == want.residual) << "residual differs from the unfused add";
  size_t inexact = 0;
  int worst = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const int d = UlpDistance(out[i], want.out[i]);
    inexact += d != 0;
    worst = std::max(worst, d);
  }
  EXPECT_LE(worst, 1) << "normed output more than one bf16 ulp from the unfused norm";
  EXPECT_LE(inexact, out.size() / 1000 + 2) << "normed output: " << inexact << " of "
                                            << out.size() << " elements not exact";
  const Exact exact = ExactReference(c.shape, in);
  const double rel_out = RelativeError(out, exact.out);
  const double rel_res = RelativeError(residual, exact.residual);
  EXPECT_LT(rel_out, 1e-2);
  EXPECT_LT(rel_res, 1e-2);
  EXPECT_FALSE(std::isnan(rel_out) || std::isnan(rel_res));
  EXPECT_EQ(RanksDisagreeing(ctx, out), 0) << "normed output not bitwise equal on every rank";
  EXPECT_EQ(RanksDisagreeing(ctx, residual), 0) << "residual not bitwise equal on every rank";
}

// Token counts and widths: one row, a few, one per block, more rows than blocks (256 > 128);
// the 1B model's 2048 and a 4096 width; odd pack counts, partial warps and several chunks per
// thread (264: 33 packs on 64 threads; 12288: 1536 packs, two chunks of 1024 threads). 256 rows
// of 2048 or 4096 take the pull kernel, the rest the push kernel (160 x 1024: more rows than
// blocks there).
std::vector<Shape> Shapes() {
  std::vector<Shape> shapes;
  for (int64_t hidden : {2048, 4096}) {
    for (int64_t tokens : {1, 7, 64, 256}) shapes.push_back({tokens, hidden});
  }
  shapes.push_back({7, 264});
  shapes.push_back({3, 12288});
  shapes.push_back({160, 1024});
  return shapes;
}

// ---- tests ------------------------------------------------------------------------------------

TEST(AllReduceRmsNormMultiGpuTest, EagerFusedEqualsUnfusedAndFloat64Reference) {
  KILN_REQUIRE_GPUS(2);
  RunOnEveryGpu([](RankContext& ctx) {
    RankRig rig;
    ASSERT_NO_FATAL_FAILURE(MakeRig(ctx, TestConfig(false), &rig));
    const cudaStream_t s = rig.stream.get();
    const uint64_t seed = SharedSeed(ctx);
    for (const Shape& shape : Shapes()) {
      for (bool in_place : {false, true}) {
        const std::string what = absl::StrFormat("%d x %d%s, seed %d", shape.tokens,
                                                 shape.hidden, in_place ? " in place" : "", seed);
        SCOPED_TRACE(what);
        ASSERT_TRUE(rig.comm->SupportsAllReduceAddRmsNorm(shape.tokens, shape.hidden,
                                                          DataType::kBf16));
        const uint64_t case_seed = seed + shape.tokens * 7919 + shape.hidden + in_place;
        const Inputs in = MakeInputs(shape, ctx.world_size, case_seed);
        CallBuffers c = MakeCall(shape, in_place);

        // The unfused all-reduce (custom one-shot, staged) of the same partial sums.
        DeviceBuffer sum_buffer = AllocOrFail(c.count() * 2, "sum");
        ASSERT_NO_FATAL_FAILURE(Upload(c.partial.data(), in.partial[ctx.rank], s));
        ASSERT_NO_FATAL_FAILURE(Poison(sum_buffer.data(), c.count() * 2, s));
        ASSERT_TRUE(rig.comm->custom()
                        ->AllReduce(c.partial.data(), sum_buffer.data(), c.count(),
                                    DataType::kBf16,
                                    {AllReduceAlgorithm::kOneShot, AllReduceInput::kStaged}, s)
                        .ok());
        const std::vector<uint16_t> sum = Download<uint16_t>(sum_buffer.data(), c.count(), s);
        ASSERT_TRUE(sum == EmulateSum(in)) << "the plain one-shot sum is not the rank-order sum";

        EXPECT_EQ(rig.comm->custom()->AddRmsNormPushes(shape.tokens, shape.hidden),
                  shape.tokens * shape.hidden * 2 <= (512 << 10));
        const int64_t fused_before = rig.comm->stats().fused_add_rms_norm;
        ASSERT_NO_FATAL_FAILURE(Load(c, in, ctx.rank, s));
        absl::Status status = rig.comm->AllReduceAddRmsNorm(c.Args(), s);
        ASSERT_TRUE(status.ok()) << status;
        EXPECT_EQ(rig.comm->stats().fused_add_rms_norm, fused_before + 1);
        CheckCall(ctx, c, in, sum, s, what);
      }
    }
    EXPECT_TRUE(rig.comm->CheckAsyncErrors().ok());
  }, Options());
}

// Captures fused calls of several shapes (with plain all-reduces between them, sharing the call
// counter), registers, and replays with every input rewritten after capture; eager calls
// interleave with the replays.
void GraphReplays(RankContext& ctx, bool registered) {
  RankRig rig;
  ASSERT_NO_FATAL_FAILURE(MakeRig(ctx, TestConfig(registered), &rig));
  const cudaStream_t s = rig.stream.get();
  // Push kernel except 256 x 2048 (pull: registered when the config says so).
  const std::vector<Shape> shapes = {{1, 2048}, {7, 2048}, {64, 2048}, {256, 2048},
                                     {1, 4096}, {64, 4096}, {7, 264}};
  std::vector<CallBuffers> calls;
  for (const Shape& shape : shapes) calls.push_back(MakeCall(shape, false));
  calls.push_back(MakeCall({8, 2048}, true));  // in place: always staged
  const size_t plain_count = 4096;
  DeviceBuffer plain_in = AllocOrFail(plain_count * 2, "plain in");
  DeviceBuffer plain_out = AllocOrFail(plain_count * 2, "plain out");

  std::vector<Inputs> inputs(calls.size());
  Inputs plain_inputs;  // every rank's input of the plain all-reduce (partial only)
  auto load_all = [&](uint64_t seed) {
    for (size_t i = 0; i < calls.size(); ++i) {
      inputs[i] = MakeInputs(calls[i].shape, ctx.world_size, seed + 101 * i);
      ASSERT_NO_FATAL_FAILURE(Load(calls[i], inputs[i], ctx.rank, s));
    }
    plain_inputs.partial.clear();
    for (int r = 0; r < ctx.world_size; ++r) {
      plain_inputs.partial.push_back(RandomBf16(plain_count, seed * 7 + r, -1.0, 1.0));
    }
    ASSERT_NO_FATAL_FAILURE(Upload(plain_in.data(), plain_inputs.partial[ctx.rank], s));
    ASSERT_NO_FATAL_FAILURE(Poison(plain_out.data(), plain_count * 2, s));
  };
  auto run_all = [&]() {
    for (size_t i = 0; i < calls.size(); ++i) {
      absl::Status status = rig.comm->AllReduceAddRmsNorm(calls[i].Args(), s);
      ASSERT_TRUE(status.ok()) << status;
      if (i == 2) {
        ASSERT_TRUE(rig.comm->AllReduce(plain_in.data(), plain_out.data(), plain_count,
                                        DataType::kBf16, s)
                        .ok());
      }
    }
  };
  auto check_all = [&](const std::string& when) {
    for (size_t i = 0; i < calls.size(); ++i) {
      CheckCall(ctx, calls[i], inputs[i], EmulateSum(inputs[i]), s,
                absl::StrFormat("%s, call %d (%d x %d)", when, i, calls[i].shape.tokens,
                                calls[i].shape.hidden));
    }
    // The plain all-reduce between the fused calls: right, and the same on every rank.
    const std::vector<uint16_t> plain = Download<uint16_t>(plain_out.data(), plain_count, s);
    size_t nan = 0;
    for (uint16_t v : plain) nan += (v & 0x7f80) == 0x7f80;
    EXPECT_EQ(nan, 0u) << when << ": plain all-reduce output not written";
    // One-shot (the call counts below say so): the rank-order sum of every rank's input.
    EXPECT_TRUE(plain == EmulateSum(plain_inputs))
        << when << ": plain all-reduce differs from the rank-order sum";
    EXPECT_EQ(RanksDisagreeing(ctx, plain), 0) << when;
  };

  uint64_t seed = SharedSeed(ctx);
  ASSERT_NO_FATAL_FAILURE(load_all(seed));
  ASSERT_NO_FATAL_FAILURE(run_all());
  check_all("eager warm-up");

  const AllReduceStats before = rig.comm->stats();
  cudaGraph_t graph = nullptr;
  {
    CaptureContext::Scope scope(CapturePhase::kCapture, {GraphMode::kDecode, 8});
    ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    run_all();
    // The size check is not skipped while capturing: refused without enqueuing anything.
    AllReduceAddRmsNormArgs oversize = calls[0].Args();
    oversize.tokens = static_cast<int64_t>(kBufferBytes / 2 / 2048) + 1;
    EXPECT_EQ(rig.comm->AllReduceAddRmsNorm(oversize, s).code(),
              absl::StatusCode::kInvalidArgument);
    ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  }
  const AllReduceStats& after = rig.comm->stats();
  const int64_t fused = static_cast<int64_t>(calls.size());
  EXPECT_EQ(after.fused_add_rms_norm - before.fused_add_rms_norm, fused);
  // With the config's registered one-shot, the out-of-place calls of the pull kernel (256 x
  // 2048, and the plain all-reduce) read registered inputs; push and in-place calls never do.
  int64_t pull_out_of_place = 1;  // the plain all-reduce
  for (const CallBuffers& c : calls) {
    pull_out_of_place +=
        !c.in_place && !rig.comm->custom()->AddRmsNormPushes(c.shape.tokens, c.shape.hidden);
  }
  EXPECT_EQ(pull_out_of_place, 2);
  const int64_t want_registered = registered ? pull_out_of_place : 0;
  EXPECT_EQ(after.one_shot_registered - before.one_shot_registered, want_registered);
  EXPECT_EQ(after.one_shot_staged - before.one_shot_staged, fused + 1 - want_registered);
  EXPECT_EQ(rig.comm->custom()->pending_graph_inputs(), want_registered);

  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  if (registered) {
    EXPECT_EQ(rig.comm->CheckReplayable().code(), absl::StatusCode::kFailedPrecondition);
  }
  ASSERT_TRUE(rig.comm->RegisterGraphBuffers().ok());
  EXPECT_TRUE(rig.comm->CheckReplayable().ok());

  for (int round = 0; round < 3; ++round) {
    seed = SharedSeed(ctx);
    ASSERT_NO_FATAL_FAILURE(load_all(seed));
    ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
    check_all(absl::StrFormat("replay %d", round));
    if (round == 1) {
      seed = SharedSeed(ctx);
      ASSERT_NO_FATAL_FAILURE(load_all(seed));
      ASSERT_NO_FATAL_FAILURE(run_all());
      check_all("eager between replays");
    }
  }
  EXPECT_TRUE(rig.comm->CheckAsyncErrors().ok());
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

TEST(AllReduceRmsNormMultiGpuTest, GraphReplaysWithStagedInputsChangedAfterCapture) {
  KILN_REQUIRE_GPUS(2);
  RunOnEveryGpu([](RankContext& ctx) { GraphReplays(ctx, /*registered=*/false); }, Options());
}

TEST(AllReduceRmsNormMultiGpuTest, GraphReplaysWithRegisteredInputsChangedAfterCapture) {
  KILN_REQUIRE_GPUS(2);
  RunOnEveryGpu([](RankContext& ctx) { GraphReplays(ctx, /*registered=*/true); }, Options());
}

// Real data that holds the push kernel's sentinel (bf16 0xffff, a NaN) must not look like "not
// arrived yet": the call finishes at once, rows with a NaN come out NaN on every rank alike, the
// other rows are right.
TEST(AllReduceRmsNormMultiGpuTest, SentinelBitsInTheDataDoNotStallThePushKernel) {
  KILN_REQUIRE_GPUS(2);
  RunOnEveryGpu([](RankContext& ctx) {
    RankRig rig;
    ASSERT_NO_FATAL_FAILURE(MakeRig(ctx, TestConfig(false), &rig));
    const cudaStream_t s = rig.stream.get();
    const Shape shape{4, 2048};
    ASSERT_TRUE(rig.comm->custom()->AddRmsNormPushes(shape.tokens, shape.hidden));
    Inputs in = MakeInputs(shape, ctx.world_size, SharedSeed(ctx));
    // Row 1 of every rank and row 3 of the last rank carry sentinel lanes.
    for (int r = 0; r < ctx.world_size; ++r) {
      in.partial[r][1 * 2048 + 5 + r] = 0xffff;
      if (r == ctx.world_size - 1) in.partial[r][3 * 2048 + 2047] = 0xffff;
    }
    CallBuffers c = MakeCall(shape, false);
    ASSERT_NO_FATAL_FAILURE(Load(c, in, ctx.rank, s));
    const absl::Time start = absl::Now();
    ASSERT_TRUE(rig.comm->AllReduceAddRmsNorm(c.Args(), s).ok());
    const std::vector<uint16_t> out = Download<uint16_t>(c.out(), c.count(), s);
    EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "the reader waited for real data";
    EXPECT_TRUE(rig.comm->CheckAsyncErrors().ok());
    const Normed want = EmulateAddRmsNorm(shape, EmulateSum(in), in);
    for (int64_t row = 0; row < shape.tokens; ++row) {
      size_t nan = 0, off = 0;
      for (int64_t i = 0; i < shape.hidden; ++i) {
        const uint16_t got = out[row * shape.hidden + i];
        nan += (got & 0x7f80) == 0x7f80 && (got & 0x7f) != 0;
        off += UlpDistance(got, want.out[row * shape.hidden + i]) > 1;
      }
      if (row == 1 || row == 3) {
        EXPECT_EQ(nan, static_cast<size_t>(shape.hidden)) << "row " << row;
      } else {
        EXPECT_EQ(off, 0u) << "row " << row;
      }
    }
    EXPECT_EQ(RanksDisagreeing(ctx, out), 0);
    // The buffers are clean afterwards: a normal call right after is right.
    const Inputs fresh = MakeInputs(shape, ctx.world_size, SharedSeed(ctx));
    ASSERT_NO_FATAL_FAILURE(Load(c, fresh, ctx.rank, s));
    ASSERT_TRUE(rig.comm->AllReduceAddRmsNorm(c.Args(), s).ok());
    CheckCall(ctx, c, fresh, EmulateSum(fresh), s, "after sentinel data");
  }, Options());
}

TEST(AllReduceRmsNormMultiGpuTest, UnsupportedShapesAndBuffersAreReported) {
  KILN_REQUIRE_GPUS(2);
  RunOnEveryGpu([](RankContext& ctx) {
    // One-shot up to 64 KiB (16 rows of 2048): beyond it the policy picks two-shot or NCCL,
    // so the fused form is not offered.
    AllReduceConfig config = TestConfig(false);
    config.set_one_shot_max_bytes_world2(64 << 10);
    config.set_one_shot_max_bytes_world4(64 << 10);
    config.set_one_shot_max_bytes_world6(64 << 10);
    config.set_one_shot_max_bytes_world8(64 << 10);
    RankRig rig;
    ASSERT_NO_FATAL_FAILURE(MakeRig(ctx, config, &rig));
    const cudaStream_t s = rig.stream.get();
    AutoCommunicator& comm = *rig.comm;
    EXPECT_TRUE(comm.SupportsAllReduceAddRmsNorm(16, 2048, DataType::kBf16));
    EXPECT_FALSE(comm.SupportsAllReduceAddRmsNorm(17, 2048, DataType::kBf16));
    EXPECT_FALSE(comm.SupportsAllReduceAddRmsNorm(1, 2048, DataType::kFp16));
    EXPECT_FALSE(comm.SupportsAllReduceAddRmsNorm(1, 2048, DataType::kFp32));
    EXPECT_FALSE(comm.SupportsAllReduceAddRmsNorm(1, 2044, DataType::kBf16));
    EXPECT_FALSE(comm.SupportsAllReduceAddRmsNorm(0, 2048, DataType::kBf16));
    // The kernel's own limits, whatever the crossover.
    EXPECT_TRUE(comm.custom()->SupportsAddRmsNorm(1, kFusedAddRmsNormMaxHidden, DataType::kBf16));
    EXPECT_FALSE(
        comm.custom()->SupportsAddRmsNorm(1, kFusedAddRmsNormMaxHidden + 8, DataType::kBf16));
    EXPECT_FALSE(comm.custom()->SupportsAddRmsNorm(kBufferBytes / 4096 + 1, 2048,
                                                   DataType::kBf16));
    // NCCL alone has no fused form.
    EXPECT_FALSE(comm.nccl()->SupportsAllReduceAddRmsNorm(1, 2048, DataType::kBf16));

    CallBuffers c = MakeCall({32, 2048}, false);
    AllReduceAddRmsNormArgs args = c.Args();
    EXPECT_EQ(comm.nccl()->AllReduceAddRmsNorm(args, s).code(), absl::StatusCode::kUnimplemented);
    // Unsupported sizes are refused (every rank alike), nothing enqueued.
    EXPECT_EQ(comm.AllReduceAddRmsNorm(args, s).code(), absl::StatusCode::kInvalidArgument);
    args.tokens = 16;
    args.hidden = 2044;
    EXPECT_EQ(comm.AllReduceAddRmsNorm(args, s).code(), absl::StatusCode::kInvalidArgument);
    // Bad buffers, forced onto the custom kernel: misaligned, overlapping residual, registered
    // outside capture.
    auto forced = [&](const AllReduceAddRmsNormArgs& a, AllReduceInput input) {
      return comm.custom()->AllReduceAddRmsNorm(a, input, s).code();
    };
    AllReduceAddRmsNormArgs ok = c.Args();
    ok.tokens = 16;
    AllReduceAddRmsNormArgs bad = ok;
    bad.partial = static_cast<const char*>(ok.partial) + 2;
    EXPECT_EQ(forced(bad, AllReduceInput::kStaged), absl::StatusCode::kInvalidArgument);
    bad = ok;
    bad.residual = static_cast<char*>(c.out()) + 16;
    EXPECT_EQ(forced(bad, AllReduceInput::kStaged), absl::StatusCode::kInvalidArgument);
    bad = ok;
    bad.out = static_cast<char*>(c.partial.data()) + 16;
    EXPECT_EQ(forced(bad, AllReduceInput::kStaged), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(forced(ok, AllReduceInput::kRegistered), absl::StatusCode::kInvalidArgument);

    // After the refusals, the ranks' call counters are still in step: a real call works.
    const uint64_t seed = SharedSeed(ctx);
    const Inputs in = MakeInputs(c.shape, ctx.world_size, seed);
    ASSERT_NO_FATAL_FAILURE(Load(c, in, ctx.rank, s));
    AllReduceAddRmsNormArgs fine = c.Args();
    ASSERT_TRUE(comm.custom()->AllReduceAddRmsNorm(fine, AllReduceInput::kStaged, s).ok());
    CheckCall(ctx, c, in, EmulateSum(in), s, "after refusals (32 x 2048, forced custom)");
    EXPECT_TRUE(comm.CheckAsyncErrors().ok());
  }, Options());
}

}  // namespace
}  // namespace kiln
