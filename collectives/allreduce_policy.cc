#include "collectives/allreduce_policy.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace kiln {

const char* AllReduceAlgorithmName(AllReduceAlgorithm algorithm) {
  switch (algorithm) {
    case AllReduceAlgorithm::kNccl:
      return "nccl";
    case AllReduceAlgorithm::kOneShot:
      return "one-shot";
    case AllReduceAlgorithm::kTwoShot:
      return "two-shot";
  }
  return "unknown";
}

const char* AllReduceInputName(AllReduceInput input) {
  return input == AllReduceInput::kStaged ? "staged" : "registered";
}

bool IsCustomWorldSize(int world_size) {
  return world_size == 2 || world_size == 4 || world_size == 6 || world_size == 8;
}

bool BuffersOverlap(const void* a, const void* b, size_t bytes) {
  const uintptr_t x = reinterpret_cast<uintptr_t>(a);
  const uintptr_t y = reinterpret_cast<uintptr_t>(b);
  // Two ranges of the same length overlap when their starts are closer than that length. By the
  // distance, not x < y + bytes: near the top of the address space y + bytes would wrap.
  return bytes > 0 && (x > y ? x - y : y - x) < bytes;
}

int64_t OneShotMaxBytes(const AllReduceConfig& config, int world_size) {
  switch (world_size) {
    case 2:
      return config.one_shot_max_bytes_world2();
    case 4:
      return config.one_shot_max_bytes_world4();
    case 6:
      return config.one_shot_max_bytes_world6();
    case 8:
      return config.one_shot_max_bytes_world8();
  }
  return 0;
}

int64_t TwoShotMaxBytes(const AllReduceConfig& config, int world_size) {
  switch (world_size) {
    case 2:
      return config.two_shot_max_bytes_world2();
    case 4:
      return config.two_shot_max_bytes_world4();
    case 6:
      return config.two_shot_max_bytes_world6();
    case 8:
      return config.two_shot_max_bytes_world8();
  }
  return 0;
}

namespace {

// Returns whether `bytes` is at most `limit`, a crossover that an unvalidated config may make
// negative (then nothing is): compared unsigned, so a size of 2^63 or more never reads negative.
bool AtMost(size_t bytes, int64_t limit) {
  return limit >= 0 && static_cast<uint64_t>(bytes) <= static_cast<uint64_t>(limit);
}

}  // namespace

absl::Status ValidateAllReduceConfig(const AllReduceConfig& config) {
  if (config.buffer_bytes() <= 0 || config.buffer_bytes() % 16 != 0 ||
      config.buffer_bytes() > kMaxAllReduceBufferBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "AllReduceConfig.buffer_bytes %d must be a positive multiple of 16 of at most %d (1 TiB)",
        config.buffer_bytes(), kMaxAllReduceBufferBytes));
  }
  const int threads = config.threads_per_block();
  if (threads < 64 || threads > 1024 || threads % 32 != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "AllReduceConfig.threads_per_block %d must be a multiple of 32 in 64..1024", threads));
  }
  const int min_threads = config.min_threads_per_block();
  if (min_threads < 64 || min_threads > 1024 || min_threads % 32 != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "AllReduceConfig.min_threads_per_block %d must be a multiple of 32 in 64..1024",
        min_threads));
  }
  if (config.max_blocks() < 1 || config.max_blocks() > 128) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "AllReduceConfig.max_blocks %d must be in 1..128", config.max_blocks()));
  }
  if (config.barrier_timeout_ms() <= 0 || config.bootstrap_timeout_ms() <= 0 ||
      config.barrier_timeout_ms() > kMaxAllReduceTimeoutMs ||
      config.bootstrap_timeout_ms() > kMaxAllReduceTimeoutMs) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "AllReduceConfig timeouts must be positive and at most %d ms, about 292 years "
        "(barrier_timeout_ms %d, bootstrap_timeout_ms %d)",
        kMaxAllReduceTimeoutMs, config.barrier_timeout_ms(), config.bootstrap_timeout_ms()));
  }
  if (config.max_graph_inputs() <= 0 || config.max_graph_inputs() > kMaxAllReduceGraphInputs) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "AllReduceConfig.max_graph_inputs %d must be in 1..%d (each takes a 136-byte device "
        "table entry); capture fewer all-reduces or register them between captures",
        config.max_graph_inputs(), kMaxAllReduceGraphInputs));
  }
  for (int world : {2, 4, 6, 8}) {
    if (OneShotMaxBytes(config, world) < 0 || TwoShotMaxBytes(config, world) < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "AllReduceConfig crossovers for world size %d must not be negative (one-shot %d, "
          "two-shot %d)",
          world, OneShotMaxBytes(config, world), TwoShotMaxBytes(config, world)));
    }
  }
  return absl::OkStatus();
}

bool CustomAllReduceEligible(const AllReduceConfig& config, const AllReduceRequest& request) {
  const uintptr_t in = reinterpret_cast<uintptr_t>(request.in);
  const uintptr_t out = reinterpret_cast<uintptr_t>(request.out);
  return config.enable_custom() && request.custom_available &&
         IsCustomWorldSize(request.world_size) && request.bytes > 0 && request.bytes % 16 == 0 &&
         request.bytes <= request.custom_max_bytes && in % 16 == 0 && out % 16 == 0;
}

AllReduceInput ChooseAllReduceInput(const AllReduceConfig& config, AllReduceAlgorithm algorithm,
                                    const AllReduceRequest& request) {
  if (!request.capturing) return AllReduceInput::kStaged;
  if (algorithm == AllReduceAlgorithm::kTwoShot) return AllReduceInput::kRegistered;
  // One-shot writes its output while peers may still read its input: in place, that input must
  // be a private copy.
  if (config.graph_one_shot_registered() &&
      !BuffersOverlap(request.in, request.out, request.bytes)) {
    return AllReduceInput::kRegistered;
  }
  return AllReduceInput::kStaged;
}

AllReducePlan SelectAllReduce(const AllReduceConfig& config, const AllReduceRequest& request) {
  AllReducePlan plan;
  if (!CustomAllReduceEligible(config, request)) return plan;
  if (AtMost(request.bytes, OneShotMaxBytes(config, request.world_size))) {
    plan.algorithm = AllReduceAlgorithm::kOneShot;
  } else if (AtMost(request.bytes, TwoShotMaxBytes(config, request.world_size))) {
    plan.algorithm = AllReduceAlgorithm::kTwoShot;
  } else {
    return plan;
  }
  plan.input = ChooseAllReduceInput(config, plan.algorithm, request);
  return plan;
}

absl::Status CheckCustomAllReducePlan(const AllReducePlan& plan, const AllReduceRequest& request,
                                      size_t count, const char* dtype_name) {
  if (plan.algorithm != AllReduceAlgorithm::kOneShot &&
      plan.algorithm != AllReduceAlgorithm::kTwoShot) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "A custom all-reduce needs a one-shot or two-shot plan, not %s; send it to NCCL",
        AllReduceAlgorithmName(plan.algorithm)));
  }
  if (request.bytes == 0 || request.bytes % 16 != 0 || request.bytes > request.custom_max_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Custom all-reduce of %d x %s = %d bytes must be a positive multiple of 16 bytes and at "
        "most buffer_bytes %d; use NCCL for it",
        count, dtype_name, request.bytes, request.custom_max_bytes));
  }
  if (reinterpret_cast<uintptr_t>(request.in) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(request.out) % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Custom all-reduce needs 16-byte-aligned buffers (in %p, out %p); use NCCL for them",
        request.in, request.out));
  }
  if (plan.input == AllReduceInput::kRegistered && plan.algorithm == AllReduceAlgorithm::kOneShot &&
      BuffersOverlap(request.in, request.out, request.bytes)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "An in-place one-shot all-reduce cannot read a registered input (in %p and out %p "
        "overlap within %d bytes; peers would read data this rank is overwriting); use kStaged",
        request.in, request.out, request.bytes));
  }
  return absl::OkStatus();
}

CustomLaunchShape ChooseCustomLaunchShape(const AllReduceConfig& config,
                                          AllReduceAlgorithm algorithm, size_t bytes,
                                          int world_size) {
  const int64_t packs = static_cast<int64_t>(bytes / 16);
  const int64_t work = algorithm == AllReduceAlgorithm::kTwoShot && world_size > 0
                           ? (packs + world_size - 1) / world_size
                           : packs;
  // Clamped to what ValidateAllReduceConfig allows, so that a config it would refuse still gets
  // a launchable grid instead of a division by zero (threads_per_block 0) or negative threads.
  // CustomAllReduce only passes configs it validated at Create, where the clamps change nothing;
  // they stay because this function is public and its contract (a launchable grid for any config)
  // is what other callers get. They cost a few integer operations per launch.
  const int64_t max_blocks = std::clamp(config.max_blocks(), 1, 128);
  const int64_t max_threads = std::clamp(config.threads_per_block(), 64, 1024) / 32 * 32;
  const int64_t min_threads =
      std::min<int64_t>(std::clamp(config.min_threads_per_block(), 64, 1024) / 32 * 32,
                        max_threads);
  // Threads per block to cover the work with max_blocks blocks, in whole warps, within limits.
  const int64_t per_block = ((work + max_blocks - 1) / max_blocks + 31) / 32 * 32;
  CustomLaunchShape shape;
  shape.threads = static_cast<int>(std::clamp(per_block, min_threads, max_threads));
  shape.blocks = static_cast<int>(
      std::clamp<int64_t>((work + shape.threads - 1) / shape.threads, 1, max_blocks));
  return shape;
}

bool FusedAddRmsNormEligible(const AllReduceConfig& config, int world_size,
                             bool custom_available, size_t custom_max_bytes, int64_t tokens,
                             int64_t hidden) {
  if (tokens < 1 || hidden < 8 || hidden % 8 != 0 || hidden > kFusedAddRmsNormMaxHidden ||
      tokens > (int64_t{1} << 40) / hidden) {
    return false;
  }
  AllReduceRequest request;
  request.bytes = static_cast<size_t>(tokens * hidden * 2);
  request.world_size = world_size;
  request.custom_available = custom_available;
  request.custom_max_bytes = custom_max_bytes;
  return SelectAllReduce(config, request).algorithm == AllReduceAlgorithm::kOneShot;
}

}  // namespace kiln
