// LaunchFetchStepMetadata against the host blob it copies: every byte it must copy arrives, and
// nothing past the step's rows is written (the device side is poisoned first).
#include "runtime/runner/step_fetch.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/cuda/device_buffer.h"
#include "runtime/cuda/gpu_test_util.h"
#include "runtime/cuda/pinned_buffer.h"
#include "runtime/cuda/stream.h"
#include "runtime/runner/step_plan.h"

namespace kiln {
namespace {

constexpr unsigned char kPoison = 0xAB;

class StepFetchGpuTest : public ::testing::Test {
 protected:
  // Allocates a pinned blob of `bytes` filled with random words and a device blob of the same
  // size, poisoned.
  void Make(size_t bytes) {
    absl::StatusOr<Stream> stream = Stream::Create();
    ASSERT_TRUE(stream.ok()) << stream.status();
    stream_ = *std::move(stream);
    absl::StatusOr<PinnedHostBuffer> host = PinnedHostBuffer::Allocate(bytes, "test blob");
    ASSERT_TRUE(host.ok()) << host.status();
    host_ = *std::move(host);
    absl::StatusOr<DeviceBuffer> device = DeviceBuffer::Allocate(bytes, "test blob");
    ASSERT_TRUE(device.ok()) << device.status();
    device_ = *std::move(device);
    std::mt19937 rng(static_cast<uint32_t>(bytes));
    int32_t* words = host_.as<int32_t>();
    for (size_t i = 0; i < bytes / 4; ++i) words[i] = static_cast<int32_t>(rng() | 1u);
    ASSERT_EQ(cudaMemset(device_.data(), kPoison, bytes), cudaSuccess);
  }

  // Runs the fetch and returns the device blob.
  std::vector<unsigned char> Fetch(const MetadataFetch& f) {
    EXPECT_EQ(LaunchFetchStepMetadata(host_.data(), device_.data(), f, stream_.get()),
              cudaSuccess);
    EXPECT_TRUE(stream_.Synchronize().ok());
    std::vector<unsigned char> out(device_.size());
    EXPECT_EQ(cudaMemcpy(out.data(), device_.data(), out.size(), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return out;
  }

  // Expects bytes [begin, end) of `out` to equal the host blob's (copied) or the poison.
  void ExpectRange(const std::vector<unsigned char>& out, size_t begin, size_t end, bool copied) {
    const unsigned char* host = host_.as<unsigned char>();
    for (size_t i = begin; i < end; ++i) {
      const unsigned char want = copied ? host[i] : kPoison;
      if (out[i] != want) {
        ADD_FAILURE() << "byte " << i << " of [" << begin << ", " << end << ") is "
                      << int{out[i]} << ", expected " << int{want}
                      << (copied ? " (copied)" : " (poison: must not be written)");
        return;
      }
    }
  }

  Stream stream_;
  PinnedHostBuffer host_;
  DeviceBuffer device_;
};

TEST_F(StepFetchGpuTest, CopiesTheFixedBytesAndNothingAfter) {
  KILN_REQUIRE_GPUS(1);
  // 4 bytes, a few vectors and a tail of words, one CTA's round, and several CTAs' rounds.
  for (size_t fixed : {size_t{4}, size_t{1000} * 4 + 12, size_t{16384} + 8,
                       size_t{3} * 1024 * 1024 + 4}) {
    SCOPED_TRACE(fixed);
    Make(fixed + 4096);
    MetadataFetch f;
    f.fixed_bytes = fixed;
    const std::vector<unsigned char> out = Fetch(f);
    ExpectRange(out, 0, fixed, /*copied=*/true);
    ExpectRange(out, fixed, out.size(), /*copied=*/false);
  }
}

TEST_F(StepFetchGpuTest, CopiesTheTableRowsOfTheStepsSequences) {
  KILN_REQUIRE_GPUS(1);
  // Rows of 9 blocks (36 bytes: not a whole number of vectors), after a fixed part that holds
  // last_token_rows; the sequences are counted up to its first negative entry.
  for (int max_rows : {1, 300}) {
    for (int num_seqs : {0, 1, 7, max_rows - 1, max_rows}) {
      if (num_seqs < 0 || num_seqs > max_rows) continue;
      SCOPED_TRACE(testing::Message() << max_rows << " rows, " << num_seqs << " sequences");
      MetadataFetch f;
      f.last_token_rows = 256;
      f.max_rows = max_rows;
      f.fixed_bytes = 2048;
      f.table_offset = 4096;
      f.row_bytes = 36;
      Make(f.table_offset + f.row_bytes * max_rows + 512);
      int32_t* last = reinterpret_cast<int32_t*>(host_.as<char>() + f.last_token_rows);
      for (int i = 0; i < max_rows; ++i) last[i] = i < num_seqs ? 3 * i : -1;
      const std::vector<unsigned char> out = Fetch(f);
      const size_t rows_end = f.table_offset + f.row_bytes * num_seqs;
      ExpectRange(out, 0, f.fixed_bytes, /*copied=*/true);
      ExpectRange(out, f.fixed_bytes, f.table_offset, /*copied=*/false);
      ExpectRange(out, f.table_offset, rows_end, /*copied=*/true);
      ExpectRange(out, rows_end, out.size(), /*copied=*/false);
    }
  }
}

TEST_F(StepFetchGpuTest, RefusesBadArguments) {
  KILN_REQUIRE_GPUS(1);
  Make(8192);
  MetadataFetch f;
  f.fixed_bytes = 64;
  void* host = host_.data();
  void* device = device_.data();
  EXPECT_EQ(LaunchFetchStepMetadata(nullptr, device, f, stream_.get()), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchFetchStepMetadata(host, nullptr, f, stream_.get()), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchFetchStepMetadata(host_.as<char>() + 4, device, f, stream_.get()),
            cudaErrorInvalidValue);
  f.fixed_bytes = 66;
  EXPECT_EQ(LaunchFetchStepMetadata(host, device, f, stream_.get()), cudaErrorInvalidValue);
  f.fixed_bytes = 64;
  f.row_bytes = 36;
  f.table_offset = 1024;
  f.max_rows = 0;
  EXPECT_EQ(LaunchFetchStepMetadata(host, device, f, stream_.get()), cudaErrorInvalidValue);
  f.max_rows = 4;
  f.table_offset = 1028;
  EXPECT_EQ(LaunchFetchStepMetadata(host, device, f, stream_.get()), cudaErrorInvalidValue);
  // Nothing was launched: the device blob is still poisoned.
  const std::vector<unsigned char> out = [&] {
    std::vector<unsigned char> v(device_.size());
    EXPECT_EQ(cudaMemcpy(v.data(), device, v.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }();
  ExpectRange(out, 0, out.size(), /*copied=*/false);
}

}  // namespace
}  // namespace kiln
