// GPU tests of LlamaModel's entry points. With step views CheckLlamaStepArgs refuses, Forward
// (which checks once per step), RunPiece for every piece and RunAttention for every layer each
// return that InvalidArgument with nothing enqueued. Each call runs under stream capture, so
// anything it enqueued would be a node of the captured graph; a valid piece captured the same way
// shows that launches do land there. The views are host stand-ins that no kernel ever reads.
// Forward, which decides a step's GEMMs and paths once, captures the launches (kernel, grid,
// block, shared memory, in order) that RunPiece captures deciding them at every call, at row
// counts across every GEMM's limits and with option sets that take each path. RunAttention with
// views checked once per step (CheckedLlamaStepArgs, the piecewise step's) refuses the layers
// RunAttention refuses and captures what it captures.
#include "runtime/model/llama_model.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "attention/attention_params.h"
#include "gtest/gtest.h"
#include "runtime/cuda/device_buffer.h"
#include "runtime/cuda/status_macros.h"
#include "runtime/model/device_weights.h"
#include "runtime/model/internal/gpu_test_helpers.h"
#include "runtime/model/internal/step_args_stand_ins.h"
#include "runtime/model/llama_shape.h"

namespace kiln {
namespace {

using testing_internal::GpuTest;

class LlamaModelGpuTest : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    absl::StatusOr<LlamaDeviceWeights> weights =
        LlamaDeviceWeights::Random(LlamaShape::Tiny(), 1, stream());
    ASSERT_TRUE(weights.ok()) << weights.status();
    LlamaModelOptions options;
    options.num_kv_blocks = 8;
    absl::StatusOr<std::unique_ptr<LlamaModel>> model =
        LlamaModel::Create(*std::move(weights), options);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
    ASSERT_TRUE(model_->Prepare(1, 1).ok());
    ASSERT_EQ(cudaStreamSynchronize(stream()), cudaSuccess);
  }

  // Runs `call` under capture of the stream and returns its status; `nodes` gets the number of
  // nodes it enqueued.
  absl::Status Captured(const std::function<absl::Status()>& call, size_t* nodes) {
    *nodes = ~size_t{0};
    EXPECT_EQ(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
    const absl::Status status = call();
    cudaGraph_t graph = nullptr;
    EXPECT_EQ(cudaStreamEndCapture(stream(), &graph), cudaSuccess);
    if (graph != nullptr) {
      EXPECT_EQ(cudaGraphGetNodes(graph, nullptr, nodes), cudaSuccess);
      EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
    }
    return status;
  }

  std::unique_ptr<LlamaModel> model_;
  // Host stand-ins for the device views, never read: a captured launch is recorded, not run.
  testing_internal::StepArgsStandIns stand_ins_;

  LlamaStepArgs GoodArgs() { return stand_ins_.Args(/*num_tokens=*/1, /*num_rows=*/1); }
};

TEST_F(LlamaModelGpuTest, EveryEntryPointRefusesBadStepViewsBeforeEnqueuing) {
  const LlamaStepArgs good = GoodArgs();
  ASSERT_TRUE(CheckLlamaStepArgs(good).ok());
  // The method sees launches: piece 0 of a valid step records its kernels.
  size_t nodes = 0;
  const absl::Status piece0 = Captured([&] { return model_->RunPiece(0, good, stream()); }, &nodes);
  ASSERT_TRUE(piece0.ok()) << piece0;
  ASSERT_GT(nodes, 0u);

  std::vector<LlamaStepArgs> bad(7, good);
  bad[0].activations = nullptr;
  bad[1].activations = stand_ins_.region + 16;
  bad[2].token_ids = nullptr;
  bad[3].logits = nullptr;
  bad[4].max_blocks_per_seq = 0;
  bad[5].decode.work_capacity = 0;  // no plan part
  bad[6].num_rows = 2;              // more rows than tokens
  for (size_t i = 0; i < bad.size(); ++i) {
    const absl::Status want = CheckLlamaStepArgs(bad[i]);
    ASSERT_EQ(want.code(), absl::StatusCode::kInvalidArgument) << i;
    std::vector<std::pair<std::string, std::function<absl::Status()>>> calls;
    calls.emplace_back("Forward", [&] { return model_->Forward(bad[i], stream()); });
    for (int piece = 0; piece < model_->num_pieces(); ++piece) {
      calls.emplace_back(absl::StrCat("RunPiece(", piece, ")"),
                         [&, piece] { return model_->RunPiece(piece, bad[i], stream()); });
    }
    for (int layer = 0; layer < model_->shape().layers; ++layer) {
      calls.emplace_back(absl::StrCat("RunAttention(", layer, ")"),
                         [&, layer] { return model_->RunAttention(layer, bad[i], stream()); });
    }
    for (const auto& [name, call] : calls) {
      SCOPED_TRACE(absl::StrCat("case ", i, ", ", name));
      EXPECT_EQ(Captured(call, &nodes), want);
      EXPECT_EQ(nodes, 0u);
    }
  }
  EXPECT_EQ(cudaStreamSynchronize(stream()), cudaSuccess);
}


// Returns the driver's cuGraphKernelNodeGetParams, or null after a test failure. cudart loads
// libcuda, which is never linked, so the entry point comes through cudart. Unlike the runtime's
// cudaGraphKernelNodeGetParams, which fails with cudaErrorInvalidDeviceFunction on a kernel the
// runtime did not launch, it reads every kernel node, cuBLASLt's (launched through the driver
// API) included.
PFN_cuGraphKernelNodeGetParams_v12000 DriverKernelNodeGetParams() {
  void* symbol = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  EXPECT_EQ(cudaGetDriverEntryPointByVersion("cuGraphKernelNodeGetParams", &symbol, 12000,
                                             cudaEnableDefault, &found),
            cudaSuccess);
  EXPECT_EQ(found, cudaDriverEntryPointSuccess);
  return found == cudaDriverEntryPointSuccess
             ? reinterpret_cast<PFN_cuGraphKernelNodeGetParams_v12000>(symbol)
             : nullptr;
}

// Returns the launches of `graph` in dependency order (ties in cudaGraphGetNodes' order): a
// kernel node as its function (a CUfunction, or a CUkernel where the node has no function), grid,
// block and dynamic shared memory, another node as its type. Empty after a test failure when the
// driver's entry point is missing.
std::vector<std::string> LaunchesOf(cudaGraph_t graph) {
  const PFN_cuGraphKernelNodeGetParams_v12000 get_kernel_params = DriverKernelNodeGetParams();
  if (get_kernel_params == nullptr) return {};
  size_t count = 0, edges = 0;
  EXPECT_EQ(cudaGraphGetNodes(graph, nullptr, &count), cudaSuccess);
  std::vector<cudaGraphNode_t> nodes(count);
  EXPECT_EQ(cudaGraphGetNodes(graph, nodes.data(), &count), cudaSuccess);
  EXPECT_EQ(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &edges), cudaSuccess);
  std::vector<cudaGraphNode_t> from(edges), to(edges);
  std::vector<cudaGraphEdgeData> data(edges);
  EXPECT_EQ(cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &edges), cudaSuccess);
  std::map<cudaGraphNode_t, int> waiting;
  for (cudaGraphNode_t node : nodes) waiting[node] = 0;
  for (cudaGraphNode_t node : to) ++waiting[node];
  std::vector<std::string> launches;
  std::vector<bool> done(count, false);
  for (size_t placed = 0; placed < count; ++placed) {
    size_t i = 0;
    while (i < count && (done[i] || waiting[nodes[i]] != 0)) ++i;
    if (i == count) {
      ADD_FAILURE() << "The graph has a cycle";
      break;
    }
    done[i] = true;
    for (size_t e = 0; e < edges; ++e) {
      if (from[e] == nodes[i]) --waiting[to[e]];
    }
    cudaGraphNodeType type = cudaGraphNodeTypeEmpty;
    EXPECT_EQ(cudaGraphNodeGetType(nodes[i], &type), cudaSuccess);
    if (type != cudaGraphNodeTypeKernel) {
      launches.push_back(absl::StrCat("node type ", static_cast<int>(type)));
      continue;
    }
    CUDA_KERNEL_NODE_PARAMS_v2 k = {};
    EXPECT_EQ(get_kernel_params(nodes[i], &k), CUDA_SUCCESS) << "kernel node " << i;
    EXPECT_TRUE(k.func != nullptr || k.kern != nullptr) << "kernel node " << i;
    launches.push_back(absl::StrCat(
        "kernel ", reinterpret_cast<uintptr_t>(k.func), "/", reinterpret_cast<uintptr_t>(k.kern),
        " grid ", k.gridDimX, "x", k.gridDimY, "x", k.gridDimZ, " block ", k.blockDimX, "x",
        k.blockDimY, "x", k.blockDimZ, " shared ", k.sharedMemBytes));
  }
  return launches;
}

// Forward decides the step's GEMM configurations, folded norms and RoPE placement once;
// RunPiece decides them at each call. Captured into one graph each, the pieces of a step launch
// what Forward launches, kernel for kernel, at row counts on both sides of every GEMM's limit
// (prefetch 2 and 8, TMA 32, 48 and 64, the decode GEMM 16, the skinny kernel 2, RoPE in
// attention 8), for the default options and for option sets that fold the norms, read SiLU·mul
// in the down GEMM, run the decode GEMM or the decode layer kernel.
TEST_F(LlamaModelGpuTest, ForwardLaunchesWhatItsPiecesLaunchAtEveryRowCount) {
  const LlamaShape shape = LlamaShape::Tiny();
  constexpr int kMaxTokens = 96;
  const int sizes[] = {1, 2, 3, 8, 9, 16, 17, 32, 33, 48, 49, 64, 65, kMaxTokens};
  absl::StatusOr<DeviceBuffer> activations = DeviceBuffer::Allocate(
      LlamaModel::ActivationBytes(shape, kMaxTokens, kMaxTokens), "activations");
  absl::StatusOr<DeviceBuffer> ints =
      DeviceBuffer::Allocate(2 * kMaxTokens * sizeof(int32_t), "step ints");
  absl::StatusOr<DeviceBuffer> logits =
      DeviceBuffer::Allocate(size_t{kMaxTokens} * shape.vocab * sizeof(float), "logits");
  ASSERT_TRUE(activations.ok() && ints.ok() && logits.ok());

  std::vector<std::pair<std::string, LlamaModelOptions>> option_sets;
  LlamaModelOptions defaults;
  defaults.num_kv_blocks = 8;
  // Attention is left out: it checks a real plan's layout before it enqueues, and these views
  // are not one. The RoPE + KV append still runs where attention would not do it.
  defaults.run_attention = false;
  option_sets.emplace_back("defaults", defaults);
  LlamaModelOptions folded = defaults;
  folded.fold_norm_into_gemm = true;
  folded.prefetch_gemm_rows = {8, 8, 8, 8, 8};
  option_sets.emplace_back("folded norms", folded);
  LlamaModelOptions decode = defaults;
  decode.tma_gemm_rows = {0, 0, 0, 0};
  decode.decode_gemm_rows = {16, 16, 16, 16, 16};
  decode.prefetch_gemm_silu = true;
  decode.prefetch_gate_up_silu = false;
  option_sets.emplace_back("decode GEMM, SiLU·mul in down", decode);
  LlamaModelOptions layer_kernel = defaults;
  layer_kernel.layer_kernel_rows = 2;
  option_sets.emplace_back("layer kernel", layer_kernel);

  for (const auto& [name, options] : option_sets) {
    absl::StatusOr<LlamaDeviceWeights> weights = LlamaDeviceWeights::Random(shape, 1, stream());
    ASSERT_TRUE(weights.ok()) << weights.status();
    absl::StatusOr<std::unique_ptr<LlamaModel>> model =
        LlamaModel::Create(*std::move(weights), options);
    ASSERT_TRUE(model.ok()) << name << ": " << model.status();
    ASSERT_EQ(cudaStreamSynchronize(stream()), cudaSuccess);
    for (int n : sizes) {
      SCOPED_TRACE(absl::StrCat(name, ", ", n, " rows"));
      LlamaStepArgs args;
      args.num_tokens = n;
      args.num_rows = (n + 1) / 2;
      int32_t* i32 = ints->as<int32_t>();
      args.token_ids = i32;
      args.positions = i32;
      args.last_token_rows = i32;
      args.block_table = i32 + kMaxTokens;
      args.max_blocks_per_seq = 1;
      args.decode.work_capacity = 1;  // decode-only: attention would rotate up to 8 rows
      args.decode.seq_q_start = i32;
      args.decode.seq_kv_len = i32;
      args.decode.max_seqs = 1;
      args.activations = activations->data();
      args.logits = logits->as<float>();
      args.next_tokens = i32;
      ASSERT_TRUE((*model)->Prepare(args.num_tokens, args.num_rows).ok());
      auto capture = [&](const std::function<absl::Status()>& call) {
        EXPECT_EQ(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
        const absl::Status status = call();
        EXPECT_TRUE(status.ok()) << status;
        cudaGraph_t graph = nullptr;
        EXPECT_EQ(cudaStreamEndCapture(stream(), &graph), cudaSuccess);
        std::vector<std::string> launches;
        if (graph != nullptr) {
          launches = LaunchesOf(graph);
          EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
        }
        return launches;
      };
      const std::vector<std::string> forward =
          capture([&] { return (*model)->Forward(args, stream()); });
      const std::vector<std::string> pieces = capture([&] {
        for (int piece = 0; piece < (*model)->num_pieces(); ++piece) {
          RETURN_IF_ERROR((*model)->RunPiece(piece, args, stream()));
        }
        return absl::OkStatus();
      });
      ASSERT_GT(forward.size(), 0u);
      ASSERT_EQ(forward.size(), pieces.size());
      for (size_t i = 0; i < forward.size(); ++i) EXPECT_EQ(forward[i], pieces[i]) << "node " << i;
    }
  }
}

// The piecewise step checks its views once (CheckedLlamaStepArgs) and runs every layer's
// attention with them: that RunAttention checks only the layer, refusing one outside the model as
// the checked-per-call RunAttention does, with nothing enqueued, and launches at every layer what
// the checked-per-call one launches.
TEST_F(LlamaModelGpuTest, AttentionWithViewsCheckedOnceLaunchesWhatRunAttentionLaunches) {
  // A decode part of host stand-ins as well: attention checks its plan part before it enqueues,
  // and the captured launches are recorded, never run.
  AttentionWorkItem work_items[1] = {};
  LlamaStepArgs args = GoodArgs();
  args.decode.work_items = work_items;
  args.decode.seq_q_start = stand_ins_.ints;
  args.decode.seq_kv_len = stand_ins_.ints;
  args.decode.max_seqs = 1;
  args.decode.tile_rows = model_->shape().heads / model_->shape().kv_heads;
  const absl::StatusOr<CheckedLlamaStepArgs> checked = CheckedLlamaStepArgs::Check(args);
  ASSERT_TRUE(checked.ok()) << checked.status();

  const int layers = model_->shape().layers;
  size_t nodes = 0;
  for (int layer : {-1, layers, layers + 1}) {
    SCOPED_TRACE(absl::StrCat("layer ", layer));
    const absl::Status want =
        Captured([&] { return model_->RunAttention(layer, args, stream()); }, &nodes);
    EXPECT_EQ(want.code(), absl::StatusCode::kInvalidArgument) << want;
    EXPECT_EQ(nodes, 0u);
    EXPECT_EQ(Captured([&] { return model_->RunAttention(layer, *checked, stream()); }, &nodes),
              want);
    EXPECT_EQ(nodes, 0u);
  }

  auto capture = [&](const std::function<absl::Status()>& call) {
    EXPECT_EQ(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
    const absl::Status status = call();
    EXPECT_TRUE(status.ok()) << status;
    cudaGraph_t graph = nullptr;
    EXPECT_EQ(cudaStreamEndCapture(stream(), &graph), cudaSuccess);
    std::vector<std::string> launches;
    if (graph != nullptr) {
      launches = LaunchesOf(graph);
      EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
    }
    return launches;
  };
  for (int layer = 0; layer < layers; ++layer) {
    SCOPED_TRACE(absl::StrCat("layer ", layer));
    const std::vector<std::string> once =
        capture([&] { return model_->RunAttention(layer, *checked, stream()); });
    const std::vector<std::string> each =
        capture([&] { return model_->RunAttention(layer, args, stream()); });
    ASSERT_GT(once.size(), 0u);
    EXPECT_EQ(once, each);
  }
  EXPECT_EQ(cudaStreamSynchronize(stream()), cudaSuccess);
}

}  // namespace
}  // namespace kiln
