// Internal, tests only: the values the host-side sweeps draw from (zero, negatives, one, powers
// of two and their neighbours, int32's ends), seeded draws over them, and the check of a
// refusal's code and message, so that every sweep of attention's planners and checks reaches
// the same edges and holds messages to the same rule.
#ifndef KILN_ATTENTION_INTERNAL_SWEEP_VALUES_H_
#define KILN_ATTENTION_INTERNAL_SWEEP_VALUES_H_

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace kiln {
namespace attention_internal {

inline constexpr int32_t kInt32Max = std::numeric_limits<int32_t>::max();
inline constexpr int32_t kInt32Min = std::numeric_limits<int32_t>::min();

// Zero, negatives, one, powers of two and their neighbours, and int32's ends.
inline std::vector<int32_t> EdgeValues() {
  std::vector<int32_t> v = {kInt32Min, kInt32Min + 1, -65536, -2, -1, 0, 1, 2, 3};
  for (int e = 2; e <= 30; ++e) {
    v.push_back((int32_t{1} << e) - 1);
    v.push_back(int32_t{1} << e);
    v.push_back((int32_t{1} << e) + 1);
  }
  v.push_back(kInt32Max - 1);
  v.push_back(kInt32Max);
  return v;
}

// Uniform in [lo, max(lo, hi)].
inline int32_t Uniform(std::mt19937& rng, int32_t lo, int32_t hi) {
  return std::uniform_int_distribution<int32_t>(lo, std::max(lo, hi))(rng);
}

// True with probability p.
inline bool Chance(std::mt19937& rng, double p) {
  return std::uniform_real_distribution<double>(0, 1)(rng) < p;
}

// One of `values`, uniformly.
template <typename T>
T Pick(std::mt19937& rng, const std::vector<T>& values) {
  return values[std::uniform_int_distribution<size_t>(0, values.size() - 1)(rng)];
}

// With probability `edge`, an edge value; else uniform in [lo, max(lo, hi)].
inline int32_t Draw(std::mt19937& rng, int32_t lo, int32_t hi, double edge) {
  static const std::vector<int32_t> edges = EdgeValues();
  if (Chance(rng, edge)) return Pick(rng, edges);
  return Uniform(rng, lo, hi);
}

// Returns "" when `status` has `code` and a message in the house style (capitalised, no final
// period) holding every string of at least one entry of `expected` (none: any message).
inline std::string CheckRefusal(const absl::Status& status, absl::StatusCode code,
                                const std::vector<std::vector<std::string>>& expected) {
  if (status.code() != code) {
    return "want " + absl::StatusCodeToString(code) + ", got " + status.ToString();
  }
  const std::string message(status.message());
  if (message.empty() || !std::isupper(static_cast<unsigned char>(message[0])) ||
      message.back() == '.') {
    return "message not in the house style: '" + message + "'";
  }
  if (expected.empty()) return "";
  for (const std::vector<std::string>& any : expected) {
    bool all = true;
    for (const std::string& part : any) all = all && message.find(part) != std::string::npos;
    if (all) return "";
  }
  std::string want;
  for (const std::vector<std::string>& any : expected) {
    want += "\n  {";
    for (const std::string& part : any) want += " '" + part + "'";
    want += " }";
  }
  return "message '" + message + "' names none of:" + want;
}

}  // namespace attention_internal
}  // namespace kiln

#endif  // KILN_ATTENTION_INTERNAL_SWEEP_VALUES_H_
