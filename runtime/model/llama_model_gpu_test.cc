// GPU test of LlamaModel's entry points with step views CheckLlamaStepArgs refuses: Forward (which
// checks once per step), RunPiece for every piece and RunAttention for every layer each return
// that InvalidArgument with nothing enqueued. Each call runs under stream capture, so anything
// it enqueued would be a node of the captured graph; a valid piece captured the same way shows
// that launches do land there. The views are host stand-ins that no kernel ever reads.
#include "runtime/model/llama_model.h"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/model/device_weights.h"
#include "runtime/model/internal/gpu_test_helpers.h"
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
  alignas(256) char region_[512] = {};
  int32_t ints_[4] = {};
  float logits_[4] = {};

  LlamaStepArgs GoodArgs() {
    LlamaStepArgs args;
    args.num_tokens = 1;
    args.num_rows = 1;
    args.token_ids = ints_;
    args.positions = ints_;
    args.last_token_rows = ints_;
    args.block_table = ints_;
    args.max_blocks_per_seq = 1;
    args.decode.work_capacity = 1;
    args.activations = region_;
    args.logits = logits_;
    args.next_tokens = ints_;
    return args;
  }
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
  bad[1].activations = region_ + 16;
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

}  // namespace
}  // namespace kiln
