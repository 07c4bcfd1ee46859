// Internal, tests only: the values the host-side sweeps draw from (zero, negatives, one, powers
// of two and their neighbours, int32's ends) and seeded draws over them, so that every sweep of
// attention's planners and checks reaches the same edges.
#ifndef KILN_ATTENTION_INTERNAL_SWEEP_VALUES_H_
#define KILN_ATTENTION_INTERNAL_SWEEP_VALUES_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

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

}  // namespace attention_internal
}  // namespace kiln

#endif  // KILN_ATTENTION_INTERNAL_SWEEP_VALUES_H_
