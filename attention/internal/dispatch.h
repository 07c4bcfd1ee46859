// Internal: DISPATCH_<AXIS> helpers that turn a run-time value into a compile-time constant for
// the explicitly instantiated kernels. Each evaluates to an absl::Status: the body's, or
// InvalidArgument naming the unsupported value and the supported ones.
//
//   return DISPATCH_DTYPE(params.dtype, kDtype, [&] {
//     return DISPATCH_HEAD_DIM(params.head_dim, kHeadDim, [&] {
//       return ToStatus(LaunchMergeKernel<kDtype, kHeadDim>(args, grid, stream), "merge");
//     });
//   });
//
// Host code only (the launchers' .cc files); adding a value here needs its instantiations in
// the .cu files.
#ifndef KILN_ATTENTION_INTERNAL_DISPATCH_H_
#define KILN_ATTENTION_INTERNAL_DISPATCH_H_

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "attention/attention_params.h"

#define KILN_DISPATCH_CASE_(VALUE, NAME, ...) \
  case VALUE: {                               \
    constexpr auto NAME = VALUE;              \
    return __VA_ARGS__();                     \
  }

// Head dimension: 64 or 128.
#define DISPATCH_HEAD_DIM(head_dim, NAME, ...)                                       \
  [&]() -> ::absl::Status {                                                          \
    switch (head_dim) {                                                              \
      KILN_DISPATCH_CASE_(64, NAME, __VA_ARGS__)                                     \
      KILN_DISPATCH_CASE_(128, NAME, __VA_ARGS__)                                    \
      default:                                                                       \
        return ::absl::InvalidArgumentError(::absl::StrCat(                          \
            "Unsupported head_dim ", (head_dim), "; supported head dims: 64, 128")); \
    }                                                                                \
  }()

// Element type: bf16 or fp16.
#define DISPATCH_DTYPE(dtype, NAME, ...)                                                  \
  [&]() -> ::absl::Status {                                                               \
    switch (dtype) {                                                                      \
      KILN_DISPATCH_CASE_(::kiln::AttentionDtype::kBf16, NAME, __VA_ARGS__)               \
      KILN_DISPATCH_CASE_(::kiln::AttentionDtype::kFp16, NAME, __VA_ARGS__)               \
      default:                                                                            \
        return ::absl::InvalidArgumentError(::absl::StrCat(                               \
            "Unsupported attention dtype ", static_cast<int>(dtype),                      \
            "; supported: bf16 (", static_cast<int>(::kiln::AttentionDtype::kBf16),        \
            "), fp16 (", static_cast<int>(::kiln::AttentionDtype::kFp16), ")"));           \
    }                                                                                     \
  }()

// Query heads per KV head (GQA group size): 1 to 8 (KILN_DECODE_GROUPS).
#define DISPATCH_GROUP(group, NAME, ...)                                               \
  [&]() -> ::absl::Status {                                                            \
    switch (group) {                                                                   \
      KILN_DISPATCH_CASE_(1, NAME, __VA_ARGS__)                                        \
      KILN_DISPATCH_CASE_(2, NAME, __VA_ARGS__)                                        \
      KILN_DISPATCH_CASE_(3, NAME, __VA_ARGS__)                                        \
      KILN_DISPATCH_CASE_(4, NAME, __VA_ARGS__)                                        \
      KILN_DISPATCH_CASE_(5, NAME, __VA_ARGS__)                                        \
      KILN_DISPATCH_CASE_(6, NAME, __VA_ARGS__)                                        \
      KILN_DISPATCH_CASE_(7, NAME, __VA_ARGS__)                                        \
      KILN_DISPATCH_CASE_(8, NAME, __VA_ARGS__)                                        \
      default:                                                                         \
        return ::absl::InvalidArgumentError(                                           \
            ::absl::StrCat("Unsupported query heads per KV head ", (group),            \
                           "; supported group sizes: 1 to 8"));                        \
    }                                                                                  \
  }()

#endif  // KILN_ATTENTION_INTERNAL_DISPATCH_H_
