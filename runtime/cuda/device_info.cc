#include "runtime/cuda/device_info.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_format.h"
#include "runtime/cuda/status.h"

namespace kiln {

absl::Status CheckDeviceOrdinal(int device, int count) {
  if (device >= 0 && device < count) return absl::OkStatus();
  if (count <= 0) {  // "pick 0..-1" would say nothing
    return absl::InvalidArgumentError(absl::StrFormat(
        "Device %d does not exist: no CUDA device is visible; check the GPU, its driver and "
        "CUDA_VISIBLE_DEVICES",
        device));
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "Device %d does not exist (%d visible); pick 0..%d or check CUDA_VISIBLE_DEVICES", device,
      count, count - 1));
}

absl::StatusOr<DeviceInfo> DeviceInfo::Query(int ordinal) {
  if (absl::Status s = CheckDeviceOrdinal(ordinal, DeviceCount()); !s.ok()) return s;
  cudaDeviceProp prop{};
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, ordinal));
  DeviceInfo info;
  info.ordinal = ordinal;
  info.name = prop.name;
  info.cc_major = prop.major;
  info.cc_minor = prop.minor;
  info.sm_count = prop.multiProcessorCount;
  info.l2_bytes = static_cast<size_t>(prop.l2CacheSize);
  info.shared_memory_per_block_optin = prop.sharedMemPerBlockOptin;
  info.total_memory_bytes = prop.totalGlobalMem;
  int previous = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&previous));
  CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
  size_t free_bytes = 0, total_bytes = 0;
  cudaError_t error = cudaMemGetInfo(&free_bytes, &total_bytes);
  CUDA_RETURN_IF_ERROR(cudaSetDevice(previous));
  RETURN_IF_ERROR(ToStatus(error, "cudaMemGetInfo"));
  info.free_memory_bytes = free_bytes;
  info.total_memory_bytes = total_bytes;
  return info;
}

std::string DeviceInfo::ToString() const {
  return absl::StrFormat("%s (sm_%d%d, %d SMs, %.0f MiB L2, %.1f GiB)", name, cc_major, cc_minor,
                         sm_count, l2_bytes / 1048576.0, total_memory_bytes / 1073741824.0);
}

int DeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

absl::StatusOr<bool> CanAccessPeer(int from, int to) {
  const int count = DeviceCount();
  for (int device : {from, to}) {
    if (absl::Status s = CheckDeviceOrdinal(device, count); !s.ok()) return s;
  }
  if (from == to) return true;
  int can = 0;
  CUDA_RETURN_IF_ERROR(cudaDeviceCanAccessPeer(&can, from, to));
  return can != 0;
}

}  // namespace kiln
