// What kiln needs to know about a GPU: name, compute capability, SM count, L2, memory, and
// peer access between devices.
//
//   ASSIGN_OR_RETURN(int n, kiln::DeviceCount());       // 0 on a machine with no GPU
//   ASSIGN_OR_RETURN(kiln::DeviceInfo info, kiln::DeviceInfo::Query(0));
//   planner_options.sm_count = info.sm_count;
//
// Thread-safe. Not for use during capture (cudaMemGetInfo may synchronize).
#ifndef KILN_RUNTIME_CUDA_DEVICE_INFO_H_
#define KILN_RUNTIME_CUDA_DEVICE_INFO_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kiln {

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int cc_major = 0;
  int cc_minor = 0;
  int sm_count = 0;
  size_t l2_bytes = 0;
  size_t shared_memory_per_block_optin = 0;
  size_t total_memory_bytes = 0;
  size_t free_memory_bytes = 0;

  // Reads the properties and current free memory of device `ordinal`.
  static absl::StatusOr<DeviceInfo> Query(int ordinal);

  // Returns a one-line summary: "NVIDIA H200 (sm_90, 132 SMs, 50 MiB L2, 139.8 GiB)".
  std::string ToString() const;
};

// Returns the number of visible GPUs; 0 (not an error) when there is no GPU or no driver.
int DeviceCount();

// Returns OK when `device` is one of `count` visible devices (0 .. count - 1), else
// InvalidArgument naming it and the way out (a count of 0 or less: no device is visible). Any
// two ints are fine; needs no GPU.
absl::Status CheckDeviceOrdinal(int device, int count);

// Returns whether device `from` can access device `to`'s memory directly (P2P), as the driver
// reports it (true for a device and itself). InvalidArgument when either device does not exist.
// The collectives prove it with a real write before relying on it.
absl::StatusOr<bool> CanAccessPeer(int from, int to);

}  // namespace kiln

#endif  // KILN_RUNTIME_CUDA_DEVICE_INFO_H_
