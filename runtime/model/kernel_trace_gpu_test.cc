// KernelTrace on a GPU: a captured graph of three kiln kernels replayed four times, and an
// eager launch outside it, are recorded with their graph nodes, and ProfileReplays finds the
// four replays and shares each one's span among the kernels. (The analysis alone is tested on
// the host, runtime/cuda/kernel_trace_test.cc.)
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/cuda/kernel_trace.h"
#include "runtime/model/internal/gpu_test_helpers.h"
#include "runtime/model/rms_norm.h"
#include "runtime/model/silu_mul.h"

namespace kiln {
namespace {

using testing_internal::DeviceVector;
using testing_internal::GpuTest;

class KernelTraceGpuTest : public GpuTest {};

__nv_bfloat16* Bf(uint16_t* p) { return reinterpret_cast<__nv_bfloat16*>(p); }

TEST_F(KernelTraceGpuTest, RecordsEveryKernelNodeOfEveryReplay) {
  constexpr int kTokens = 4, kHidden = 2048, kFfn = 4096;
  DeviceVector<uint16_t> x(RandomBf16(size_t{kTokens} * kHidden), stream());
  DeviceVector<uint16_t> weight(RandomBf16(kHidden, 0.5f, 1.5f), stream());
  DeviceVector<uint16_t> normed(size_t{kTokens} * kHidden);
  DeviceVector<uint16_t> gate_up(RandomBf16(size_t{kTokens} * 2 * kFfn), stream());
  DeviceVector<uint16_t> act(size_t{kTokens} * kFfn);

  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ASSERT_EQ(LaunchRmsNorm(Bf(x.get()), Bf(weight.get()), Bf(normed.get()), kTokens, kHidden, 1e-5f,
                          stream()),
            cudaSuccess);
  ASSERT_EQ(LaunchSiluMul(Bf(gate_up.get()), Bf(act.get()), kTokens, kFfn, stream()), cudaSuccess);
  ASSERT_EQ(LaunchRmsNorm(Bf(normed.get()), Bf(weight.get()), Bf(normed.get()), kTokens, kHidden,
                          1e-5f, stream()),
            cudaSuccess);
  ASSERT_EQ(cudaStreamEndCapture(stream(), &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream()), cudaSuccess);  // uploads the graph, untraced
  ASSERT_EQ(cudaStreamSynchronize(stream()), cudaSuccess);

  absl::StatusOr<std::unique_ptr<KernelTrace>> trace = KernelTrace::Start();
  ASSERT_TRUE(trace.ok()) << trace.status();
  absl::StatusOr<std::unique_ptr<KernelTrace>> second = KernelTrace::Start();
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition) << second.status();
  for (int i = 0; i < 4; ++i) ASSERT_EQ(cudaGraphLaunch(exec, stream()), cudaSuccess);
  ASSERT_EQ(LaunchSiluMul(Bf(gate_up.get()), Bf(act.get()), kTokens, kFfn, stream()),
            cudaSuccess);  // eager, outside the graph
  absl::StatusOr<std::vector<KernelRecord>> records = (*trace)->Finish();
  ASSERT_TRUE(records.ok()) << records.status();
  EXPECT_EQ((*trace)->Finish().status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);

  ASSERT_EQ(records->size(), 13u);
  std::set<uint64_t> nodes;
  int eager = 0;
  for (const KernelRecord& r : *records) {
    EXPECT_LT(r.start_ns, r.end_ns) << r.name;
    if (r.graph_id == 0) {
      ++eager;
      EXPECT_NE(r.name.find("SiluMul"), std::string::npos) << r.name;
    } else {
      nodes.insert(r.graph_node);
    }
  }
  EXPECT_EQ(eager, 1);
  EXPECT_EQ(nodes.size(), 3u);

  absl::StatusOr<ReplayProfile> profile = ProfileReplays(*std::move(records));
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_EQ(profile->replays, 4);
  EXPECT_EQ(profile->kernels, 3);
  EXPECT_GT(profile->span_us, 0.0);
  ASSERT_EQ(profile->shares.size(), 2u);
  double sum = 0;
  int launches = 0;
  for (const KernelShare& s : profile->shares) {
    sum += s.us;
    launches += s.launches;
    EXPECT_TRUE(s.kernel.rfind("RmsNorm", 0) == 0 || s.kernel.rfind("SiluMul", 0) == 0) << s.kernel;
    EXPECT_EQ(s.launches, s.kernel.rfind("RmsNorm", 0) == 0 ? 2 : 1) << s.kernel;
  }
  EXPECT_EQ(launches, 3);
  EXPECT_NEAR(sum, profile->span_us, 1e-6);
  // Node by node in the order of capture: norm, SiLU·mul, norm.
  ASSERT_EQ(profile->nodes.size(), 3u);
  EXPECT_EQ(profile->nodes[0].kernel.rfind("RmsNorm", 0), 0u) << profile->nodes[0].kernel;
  EXPECT_EQ(profile->nodes[1].kernel.rfind("SiluMul", 0), 0u) << profile->nodes[1].kernel;
  EXPECT_EQ(profile->nodes[2].kernel.rfind("RmsNorm", 0), 0u) << profile->nodes[2].kernel;
  double node_sum = 0;
  for (const NodeShare& n : profile->nodes) node_sum += n.us;
  EXPECT_NEAR(node_sum, profile->span_us, 1e-6);
}

}  // namespace
}  // namespace kiln
