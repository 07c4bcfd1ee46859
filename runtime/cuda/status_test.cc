#include "runtime/cuda/status.h"

#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/cuda/cublas_status.h"
#include "runtime/cuda/nccl_status.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

TEST(CudaStatusTest, SuccessIsOk) {
  EXPECT_TRUE(ToStatus(cudaSuccess, "x").ok());
  EXPECT_TRUE(ToStatus(CUDA_SUCCESS, "x").ok());
  EXPECT_TRUE(ToStatus(ncclSuccess, "x").ok());
  EXPECT_TRUE(ToStatus(CUBLAS_STATUS_SUCCESS, "x").ok());
}

TEST(CudaStatusTest, OutOfMemoryIsResourceExhausted) {
  absl::Status s = ToStatus(cudaErrorMemoryAllocation, "cudaMalloc(kv)");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("cudaMalloc(kv)"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("cudaErrorMemoryAllocation"));

  absl::Status d = ToStatus(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc");
  EXPECT_EQ(d.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(d.message()), HasSubstr("CUDA_ERROR_OUT_OF_MEMORY"));

  absl::Status b = ToStatus(CUBLAS_STATUS_ALLOC_FAILED, "cublasLtCreate");
  EXPECT_EQ(b.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(b.message()), HasSubstr("CUBLAS_STATUS_ALLOC_FAILED"));
}

TEST(CudaStatusTest, OtherErrorsAreInternalWithContextAndName) {
  absl::Status s = ToStatus(cudaErrorIllegalAddress, "decode kernel");
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(s.message()), HasSubstr("decode kernel failed: cudaErrorIllegalAddress"));

  absl::Status d = ToStatus(CUDA_ERROR_ILLEGAL_ADDRESS, "cuLaunchKernel");
  EXPECT_EQ(d.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(d.message()), HasSubstr("CUDA_ERROR_ILLEGAL_ADDRESS"));

  absl::Status n = ToStatus(ncclSystemError, "ncclCommInitRank");
  EXPECT_EQ(n.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(n.message()), HasSubstr("ncclCommInitRank failed: ncclSystemError"));

  absl::Status b = ToStatus(CUBLAS_STATUS_EXECUTION_FAILED, "cublasLtMatmul");
  EXPECT_EQ(b.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(b.message()), HasSubstr("CUBLAS_STATUS_EXECUTION_FAILED"));
}

TEST(CudaStatusTest, UnknownDriverCodeNamesTheNumber) {
  absl::Status d = ToStatus(static_cast<CUresult>(123456), "cuSomething");
  EXPECT_EQ(d.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(d.message()), HasSubstr("CUresult 123456"));
  // The name itself, as documented: never null.
  EXPECT_STREQ(CuResultName(static_cast<CUresult>(123456)), "CUresult 123456");
  EXPECT_STREQ(CuResultName(CUDA_ERROR_OUT_OF_MEMORY), "CUDA_ERROR_OUT_OF_MEMORY");
}

TEST(CudaStatusTest, InvalidUsageIsInvalidArgument) {
  EXPECT_EQ(ToStatus(ncclInvalidArgument, "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ToStatus(CUBLAS_STATUS_NOT_SUPPORTED, "x").code(),
            absl::StatusCode::kInvalidArgument);
}

absl::Status FailsWith(cudaError_t e) {
  CUDA_RETURN_IF_ERROR(e);
  return absl::OkStatus();
}

absl::StatusOr<int> Twice(absl::StatusOr<int> v) {
  ASSIGN_OR_RETURN(int x, std::move(v));
  return 2 * x;
}

TEST(StatusMacrosTest, PropagateErrorsAndValues) {
  EXPECT_TRUE(FailsWith(cudaSuccess).ok());
  absl::Status s = FailsWith(cudaErrorInvalidValue);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(s.message()), HasSubstr("cudaErrorInvalidValue"));
  EXPECT_EQ(Twice(21).value(), 42);
  EXPECT_EQ(Twice(absl::NotFoundError("gone")).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace kiln
