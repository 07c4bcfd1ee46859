// Round-trips random data through device and pinned buffers, times copies with events, and
// checks that kiln's helpers refuse operations that are illegal during capture.
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/cuda/capture_check.h"
#include "runtime/cuda/device_buffer.h"
#include "runtime/cuda/device_info.h"
#include "runtime/cuda/event.h"
#include "runtime/cuda/gpu_test_util.h"
#include "runtime/cuda/pinned_buffer.h"
#include "runtime/cuda/status.h"
#include "runtime/cuda/stream.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

TEST(CudaBaseGpuTest, DeviceInfoIsSane) {
  KILN_REQUIRE_GPUS(1);
  absl::StatusOr<DeviceInfo> info = DeviceInfo::Query(0);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_GT(info->sm_count, 0);
  EXPECT_GT(info->l2_bytes, 0u);
  EXPECT_GT(info->total_memory_bytes, info->free_memory_bytes / 2);
  EXPECT_GT(info->free_memory_bytes, 0u);
  EXPECT_GE(info->cc_major, 7);
  std::cout << info->ToString() << "\n";
  EXPECT_EQ(DeviceInfo::Query(DeviceCount()).status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<bool> self = CanAccessPeer(0, 0);
  ASSERT_TRUE(self.ok());
  EXPECT_TRUE(*self);
}

TEST(CudaBaseGpuTest, RoundTripThroughPinnedAndDeviceBuffers) {
  KILN_REQUIRE_GPUS(1);
  constexpr size_t kBytes = 64 << 20;
  absl::StatusOr<Stream> stream = Stream::Create();
  ASSERT_TRUE(stream.ok()) << stream.status();
  absl::StatusOr<PinnedHostBuffer> in = PinnedHostBuffer::Allocate(kBytes, "in");
  absl::StatusOr<PinnedHostBuffer> out = PinnedHostBuffer::Allocate(kBytes, "out");
  absl::StatusOr<DeviceBuffer> a = DeviceBuffer::Allocate(kBytes, "a");
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(kBytes, "b");
  ASSERT_TRUE(in.ok() && out.ok() && a.ok() && b.ok());

  std::mt19937_64 rng(std::random_device{}());
  uint64_t* src = in->as<uint64_t>();
  for (size_t i = 0; i < kBytes / 8; ++i) src[i] = rng();
  std::memset(out->data(), 0xA5, kBytes);  // poison: an unwritten byte fails the comparison

  absl::StatusOr<Event> start = Event::Create(Event::kTiming);
  absl::StatusOr<Event> mid = Event::Create(Event::kTiming);
  absl::StatusOr<Event> stop = Event::Create(Event::kTiming);
  ASSERT_TRUE(start.ok() && mid.ok() && stop.ok());
  ASSERT_TRUE(start->Record(stream->get()).ok());
  ASSERT_TRUE(CopyHostToDevice(a->data(), in->data(), kBytes, stream->get()).ok());
  ASSERT_TRUE(mid->Record(stream->get()).ok());
  ASSERT_TRUE(CopyDeviceToDevice(b->data(), a->data(), kBytes, stream->get()).ok());
  ASSERT_TRUE(CopyDeviceToHost(out->data(), b->data(), kBytes, stream->get()).ok());
  ASSERT_TRUE(stop->Record(stream->get()).ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  EXPECT_EQ(std::memcmp(in->data(), out->data(), kBytes), 0);

  absl::StatusOr<float> h2d_ms = Event::ElapsedMs(*start, *mid);
  absl::StatusOr<float> total_ms = Event::ElapsedMs(*start, *stop);
  ASSERT_TRUE(h2d_ms.ok() && total_ms.ok());
  EXPECT_GT(*h2d_ms, 0.0f);
  EXPECT_GT(*total_ms, *h2d_ms);
  std::cout << "host->device " << kBytes / (*h2d_ms * 1e6) << " GB/s, round trip "
            << *total_ms << " ms\n";
}

TEST(CudaBaseGpuTest, PageableCopyWorksOutsideCapture) {
  KILN_REQUIRE_GPUS(1);
  absl::StatusOr<Stream> stream = Stream::Create();
  absl::StatusOr<DeviceBuffer> a = DeviceBuffer::Allocate(4096, "a");
  ASSERT_TRUE(stream.ok() && a.ok());
  std::vector<uint32_t> host(1024), back(1024, 0xDEADBEEF);
  std::mt19937 rng(7);
  for (uint32_t& v : host) v = rng();
  EXPECT_TRUE(IsPageableHostMemory(host.data()));
  ASSERT_TRUE(CopyHostToDevice(a->data(), host.data(), 4096, stream->get()).ok());
  ASSERT_TRUE(CopyDeviceToHost(back.data(), a->data(), 4096, stream->get()).ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  EXPECT_EQ(host, back);
}

// A fill behind a long one on the default stream: without its wait, the copy on the
// non-blocking stream would run first and read the value before.
TEST(CudaBaseGpuTest, FillDeviceAndWaitIsSeenByNonBlockingStreams) {
  KILN_REQUIRE_GPUS(1);
  constexpr size_t kBig = size_t{2} << 30;  // about a millisecond of writes
  constexpr size_t kSmall = 1 << 20;
  absl::StatusOr<Stream> stream = Stream::Create();
  absl::StatusOr<DeviceBuffer> big = DeviceBuffer::Allocate(kBig, "big");
  absl::StatusOr<DeviceBuffer> small = DeviceBuffer::Allocate(kSmall, "small");
  absl::StatusOr<PinnedHostBuffer> out = PinnedHostBuffer::Allocate(kSmall, "out");
  ASSERT_TRUE(stream.ok() && big.ok() && small.ok() && out.ok());
  ASSERT_TRUE(FillDeviceAndWait(small->data(), 0x11, kSmall, "small").ok());
  for (int round = 0; round < 3; ++round) {
    ASSERT_EQ(cudaMemsetAsync(big->data(), round, kBig, nullptr), cudaSuccess);
    const int value = 0x5a + round;
    ASSERT_TRUE(FillDeviceAndWait(small->data(), value, kSmall, "small").ok());
    std::memset(out->data(), 0xA5, kSmall);
    ASSERT_TRUE(CopyDeviceToHost(out->data(), small->data(), kSmall, stream->get()).ok());
    ASSERT_TRUE(stream->Synchronize().ok());
    const unsigned char* bytes = out->as<unsigned char>();
    size_t wrong = 0;
    for (size_t i = 0; i < kSmall; ++i) wrong += bytes[i] != value;
    EXPECT_EQ(wrong, 0u) << "round " << round << ": byte 0 is " << int{bytes[0]};
  }
  EXPECT_TRUE(FillDeviceAndWait(small->data(), 0, 0, "nothing").ok());
}

TEST(CudaBaseGpuTest, IllegalOperationsDuringCaptureAreNamed) {
  KILN_REQUIRE_GPUS(1);
  absl::StatusOr<Stream> stream = Stream::Create();
  absl::StatusOr<DeviceBuffer> a = DeviceBuffer::Allocate(4096, "a");
  ASSERT_TRUE(stream.ok() && a.ok());
  std::vector<uint32_t> host(1024, 1);

  // A raw capture: the stream itself reports capturing.
  ASSERT_EQ(cudaStreamBeginCapture(stream->get(), cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_TRUE(IsCapturing(stream->get()));
  absl::Status sync = stream->Synchronize();
  EXPECT_EQ(sync.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(sync.message()), HasSubstr("Stream::Synchronize"));
  absl::Status copy = CopyHostToDevice(a->data(), host.data(), 4096, stream->get());
  EXPECT_EQ(copy.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(copy.message()), HasSubstr("pageable host memory"));
  // An allocation names no stream; it sees the capture that CaptureGuard notes for the thread.
  NoteCaptureBegin(stream->get());
  absl::StatusOr<DeviceBuffer> grow = DeviceBuffer::Allocate(4096, "late");
  NoteCaptureEnd();
  EXPECT_EQ(grow.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(grow.status().message()), HasSubstr("cudaMalloc of 'late'"));
  NoteCaptureBegin(stream->get());
  absl::Status fill = FillDeviceAndWait(a->data(), 0, 4096, "counters");
  NoteCaptureEnd();
  EXPECT_EQ(fill.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(fill.message()), HasSubstr("Filling 'counters'"));
  cudaGraph_t graph = nullptr;
  // The refusals left the capture valid: it ends cleanly.
  ASSERT_EQ(cudaStreamEndCapture(stream->get(), &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(TakeFirstIllegalDuringCapture(), "Stream::Synchronize (cudaStreamSynchronize)");
  EXPECT_EQ(TakeFirstIllegalDuringCapture(), "");
  EXPECT_FALSE(IsCapturing(stream->get()));
  EXPECT_TRUE(stream->Synchronize().ok());
}

TEST(CudaBaseGpuTest, HugeAllocationIsResourceExhausted) {
  KILN_REQUIRE_GPUS(1);
  absl::StatusOr<DeviceBuffer> huge = DeviceBuffer::Allocate(size_t{1} << 50, "huge");
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(huge.status().message()), HasSubstr("'huge'"));
  absl::StatusOr<DeviceBuffer> zero = DeviceBuffer::Allocate(0, "zero");
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kiln
