// GPU tests of LlamaModel's entry points. With step views CheckLlamaStepArgs refuses, Forward
// (which checks once per step), RunPiece for every piece and RunAttention for every layer each
// return that InvalidArgument with nothing enqueued. Each call runs under stream capture, so
// anything it enqueued would be a node of the captured graph; a valid piece captured the same way
// shows that launches do land there. The views are host stand-ins that no kernel ever reads.
// Forward, which decides a step's GEMMs and paths once, captures the launches (kernel, grid,
// block, shared memory, in order) that RunPiece captures deciding them at every call, at row
// counts across every GEMM's limits and with option sets that take each path. RunAttention with
// views checked once per step (CheckedLlamaStepArgs, the piecewise step's) refuses the layers
// RunAttention refuses and captures what it captures: the same launches, and decode kernels
// given the same buffers (the layer's own KV caches among them), field by field.
#include "runtime/model/llama_model.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "attention/attention_params.h"
#include "attention/rope_frequency.h"
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

// Returns the driver API's `name` at `version` through cudart, or null after a test failure.
void* DriverEntryPoint(const char* name, int version) {
  void* symbol = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  EXPECT_EQ(cudaGetDriverEntryPointByVersion(name, &symbol, version, cudaEnableDefault, &found),
            cudaSuccess)
      << name;
  EXPECT_EQ(found, cudaDriverEntryPointSuccess) << name;
  return found == cudaDriverEntryPointSuccess ? symbol : nullptr;
}

// Returns the driver's cuGraphKernelNodeGetParams, or null after a test failure. cudart loads
// libcuda, which is never linked, so the entry point comes through cudart. Unlike the runtime's
// cudaGraphKernelNodeGetParams, which fails with cudaErrorInvalidDeviceFunction on a kernel the
// runtime did not launch, it reads every kernel node, cuBLASLt's (launched through the driver
// API) included.
PFN_cuGraphKernelNodeGetParams_v12000 DriverKernelNodeGetParams() {
  return reinterpret_cast<PFN_cuGraphKernelNodeGetParams_v12000>(
      DriverEntryPoint("cuGraphKernelNodeGetParams", 12000));
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

// attention_internal::DecodeKernelArgs (attention/internal/kernel_args.h), field for field: the
// decode attention kernel's one parameter. //attention keeps that header to itself, so the test
// mirrors it; DecodeKernelArgsOf checks the mirror's size against the kernel's parameter, and the
// test checks fields against the values they must hold, so a mirror that drifted fails.
struct DecodeKernelArgsView {
  const void* q;
  int64_t q_stride;
  void* o;
  int64_t o_stride;
  const void* k_cache;
  const void* v_cache;
  const int32_t* block_table;
  int32_t max_blocks_per_seq;
  int32_t log2_block_size;
  const int32_t* seq_q_start;
  const int32_t* seq_kv_len;
  const AttentionWorkItem* work_items;
  const AttentionPlanHeader* header;
  int32_t* merge_counters;
  int32_t tile_rows;
  float* partial_o;
  float* partial_lse;
  int32_t num_q_heads;
  int32_t num_kv_heads;
  float scale_log2;
  const int32_t* rope_positions;
  RopeFrequencies rope_freqs;
  const void* new_k;
  const void* new_v;
  int64_t new_kv_stride;
  const void* q_norm;
  const void* k_norm;
  float qk_norm_eps;
};

// Returns the fields of `a` that say which buffers and shapes the kernel reads and writes: every
// pointer, stride, count and the softmax scale's bits, by name.
std::vector<std::pair<std::string, uintptr_t>> Fields(const DecodeKernelArgsView& a) {
  auto address = [](const void* p) { return reinterpret_cast<uintptr_t>(p); };
  uint32_t scale_bits = 0;
  std::memcpy(&scale_bits, &a.scale_log2, sizeof(scale_bits));
  return {{"q", address(a.q)},
          {"q_stride", static_cast<uintptr_t>(a.q_stride)},
          {"o", address(a.o)},
          {"o_stride", static_cast<uintptr_t>(a.o_stride)},
          {"k_cache", address(a.k_cache)},
          {"v_cache", address(a.v_cache)},
          {"block_table", address(a.block_table)},
          {"max_blocks_per_seq", static_cast<uintptr_t>(a.max_blocks_per_seq)},
          {"log2_block_size", static_cast<uintptr_t>(a.log2_block_size)},
          {"seq_q_start", address(a.seq_q_start)},
          {"seq_kv_len", address(a.seq_kv_len)},
          {"work_items", address(a.work_items)},
          {"header", address(a.header)},
          {"merge_counters", address(a.merge_counters)},
          {"tile_rows", static_cast<uintptr_t>(a.tile_rows)},
          {"partial_o", address(a.partial_o)},
          {"partial_lse", address(a.partial_lse)},
          {"num_q_heads", static_cast<uintptr_t>(a.num_q_heads)},
          {"num_kv_heads", static_cast<uintptr_t>(a.num_kv_heads)},
          {"scale_log2 bits", scale_bits},
          {"rope_positions", address(a.rope_positions)},
          {"new_k", address(a.new_k)},
          {"new_v", address(a.new_v)},
          {"new_kv_stride", static_cast<uintptr_t>(a.new_kv_stride)},
          {"q_norm", address(a.q_norm)},
          {"k_norm", address(a.k_norm)}};
}

// Returns the arguments of the decode attention kernel nodes of `graph`, in cudaGraphGetNodes'
// order, read from each node's kernelParams[0] through the driver (the node's function or
// kernel names the kernel and gives its parameter's size). Empty after a test failure.
std::vector<DecodeKernelArgsView> DecodeKernelArgsOf(cudaGraph_t graph) {
  const auto get_kernel_params = DriverKernelNodeGetParams();
  const auto func_name =
      reinterpret_cast<PFN_cuFuncGetName_v12030>(DriverEntryPoint("cuFuncGetName", 12030));
  const auto kernel_name =
      reinterpret_cast<PFN_cuKernelGetName_v12030>(DriverEntryPoint("cuKernelGetName", 12030));
  const auto func_param = reinterpret_cast<PFN_cuFuncGetParamInfo_v12040>(
      DriverEntryPoint("cuFuncGetParamInfo", 12040));
  const auto kernel_param = reinterpret_cast<PFN_cuKernelGetParamInfo_v12040>(
      DriverEntryPoint("cuKernelGetParamInfo", 12040));
  if (get_kernel_params == nullptr || func_name == nullptr || kernel_name == nullptr ||
      func_param == nullptr || kernel_param == nullptr) {
    return {};
  }
  size_t count = 0;
  EXPECT_EQ(cudaGraphGetNodes(graph, nullptr, &count), cudaSuccess);
  std::vector<cudaGraphNode_t> nodes(count);
  EXPECT_EQ(cudaGraphGetNodes(graph, nodes.data(), &count), cudaSuccess);
  std::vector<DecodeKernelArgsView> found;
  for (size_t i = 0; i < count; ++i) {
    cudaGraphNodeType type = cudaGraphNodeTypeEmpty;
    EXPECT_EQ(cudaGraphNodeGetType(nodes[i], &type), cudaSuccess);
    if (type != cudaGraphNodeTypeKernel) continue;
    CUDA_KERNEL_NODE_PARAMS_v2 k = {};
    EXPECT_EQ(get_kernel_params(nodes[i], &k), CUDA_SUCCESS) << "kernel node " << i;
    const char* name = nullptr;
    size_t offset = 0, size = 0;
    // A node whose name cannot be read is not counted: a test that expects decode kernels then
    // finds too few.
    const CUresult named =
        k.func != nullptr ? func_name(&name, k.func) : kernel_name(&name, k.kern);
    if (named != CUDA_SUCCESS || name == nullptr ||
        std::strstr(name, "DecodeAttentionKernel") == nullptr) {
      continue;
    }
    EXPECT_EQ(k.func != nullptr ? func_param(k.func, 0, &offset, &size)
                                : kernel_param(k.kern, 0, &offset, &size),
              CUDA_SUCCESS)
        << name;
    EXPECT_EQ(size, sizeof(DecodeKernelArgsView)) << name << ": the mirror no longer matches";
    EXPECT_NE(k.kernelParams, nullptr) << name;
    if (size != sizeof(DecodeKernelArgsView) || k.kernelParams == nullptr) continue;
    DecodeKernelArgsView args;
    std::memcpy(&args, k.kernelParams[0], sizeof(args));
    found.push_back(args);
  }
  return found;
}

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

  // What a call enqueued on the stream, captured into a graph.
  struct CapturedCall {
    std::vector<std::string> launches;              // LaunchesOf
    std::vector<DecodeKernelArgsView> decode_args;  // DecodeKernelArgsOf
  };

  // Runs `call`, which must succeed, under capture of the stream and returns what it enqueued
  // (nothing after a failure).
  CapturedCall CaptureLaunches(const std::function<absl::Status()>& call) {
    EXPECT_EQ(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
    const absl::Status status = call();
    EXPECT_TRUE(status.ok()) << status;
    cudaGraph_t graph = nullptr;
    EXPECT_EQ(cudaStreamEndCapture(stream(), &graph), cudaSuccess);
    CapturedCall captured;
    if (graph != nullptr) {
      captured.launches = LaunchesOf(graph);
      captured.decode_args = DecodeKernelArgsOf(graph);
      EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
    }
    return captured;
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
      const std::vector<std::string> forward =
          CaptureLaunches([&] { return (*model)->Forward(args, stream()); }).launches;
      auto run_pieces = [&]() -> absl::Status {
        for (int piece = 0; piece < (*model)->num_pieces(); ++piece) {
          RETURN_IF_ERROR((*model)->RunPiece(piece, args, stream()));
        }
        return absl::OkStatus();
      };
      const std::vector<std::string> pieces = CaptureLaunches(run_pieces).launches;
      ASSERT_GT(forward.size(), 0u);
      ASSERT_EQ(forward.size(), pieces.size());
      for (size_t i = 0; i < forward.size(); ++i) EXPECT_EQ(forward[i], pieces[i]) << "node " << i;
    }
  }
}

// The piecewise step checks its views once (CheckedLlamaStepArgs) and runs every layer's
// attention with them: that RunAttention checks only the layer, refusing one outside the model as
// the checked-per-call RunAttention does, with nothing enqueued, and launches at every layer what
// the checked-per-call one launches, its decode kernel given the same arguments field by field:
// that layer's KV caches, not another layer's, and the step's views.
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

  std::vector<const void*> k_caches, v_caches;  // per layer
  for (int layer = 0; layer < layers; ++layer) {
    SCOPED_TRACE(absl::StrCat("layer ", layer));
    const CapturedCall once =
        CaptureLaunches([&] { return model_->RunAttention(layer, *checked, stream()); });
    const CapturedCall each =
        CaptureLaunches([&] { return model_->RunAttention(layer, args, stream()); });
    ASSERT_GT(once.launches.size(), 0u);
    EXPECT_EQ(once.launches, each.launches);
    // The same kernels could read another layer's caches: compare what they were given.
    ASSERT_EQ(once.decode_args.size(), 1u);
    ASSERT_EQ(each.decode_args.size(), 1u);
    const DecodeKernelArgsView& got = once.decode_args[0];
    const std::vector<std::pair<std::string, uintptr_t>> got_fields = Fields(got);
    const std::vector<std::pair<std::string, uintptr_t>> want_fields =
        Fields(each.decode_args[0]);
    ASSERT_EQ(got_fields.size(), want_fields.size());
    for (size_t i = 0; i < got_fields.size(); ++i) {
      EXPECT_EQ(got_fields[i], want_fields[i]) << got_fields[i].first;
    }
    EXPECT_EQ(got.k_cache, model_->k_cache(layer));
    EXPECT_EQ(got.v_cache, model_->v_cache(layer));
    EXPECT_EQ(got.block_table, args.block_table);
    EXPECT_EQ(got.work_items, args.decode.work_items);
    EXPECT_EQ(got.seq_q_start, args.decode.seq_q_start);
    EXPECT_EQ(got.seq_kv_len, args.decode.seq_kv_len);
    EXPECT_EQ(got.num_q_heads, model_->shape().heads);
    EXPECT_EQ(got.num_kv_heads, model_->shape().kv_heads);
    k_caches.push_back(got.k_cache);
    v_caches.push_back(got.v_cache);
  }
  ASSERT_GE(layers, 2);
  ASSERT_EQ(k_caches.size(), static_cast<size_t>(layers));
  EXPECT_NE(k_caches[0], k_caches[1]);
  EXPECT_NE(v_caches[0], v_caches[1]);
  EXPECT_EQ(cudaStreamSynchronize(stream()), cudaSuccess);
}

}  // namespace
}  // namespace kiln
