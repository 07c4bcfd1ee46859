// The seeded weight initialisation, written once for host and device so both produce the same
// bits: value(seed, tensor, index) depends on nothing else (no RNG state, no launch shape).
// Internal to //runtime/model (llama_weights and device_weights).
#ifndef KILN_RUNTIME_MODEL_INTERNAL_WEIGHT_INIT_H_
#define KILN_RUNTIME_MODEL_INTERNAL_WEIGHT_INIT_H_

#include <cstdint>

#include "runtime/model/bf16.h"

namespace kiln {
namespace internal {

// splitmix64's finaliser: a bijection on 64-bit words with full avalanche.
KILN_HOST_DEVICE inline uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

// How one tensor is drawn: uniform in [offset - amplitude, offset + amplitude), in steps of
// amplitude / 2^23. `step` = amplitude / 2^23 is computed once on the host and passed to the
// device, so both sides multiply by the same float.
struct UniformInit {
  uint64_t stream = 0;  // Mix64(seed + tensor index): decorrelates tensors
  float step = 0.0f;
  float offset = 0.0f;
};

// Returns the bf16 bits of element `index` of the tensor described by `init`. One rounding
// from an exact integer times a float (and one for the offset), each forced to round-to-nearest
// so that the device never fuses them into an FMA the host would not use.
KILN_HOST_DEVICE inline uint16_t InitValueBits(const UniformInit& init, uint64_t index) {
  const uint64_t h = Mix64(init.stream + Mix64(index));
  const int32_t centred = static_cast<int32_t>(h >> 40) - (1 << 23);  // [-2^23, 2^23)
#if defined(__CUDA_ARCH__)
  const float value = __fadd_rn(init.offset, __fmul_rn(static_cast<float>(centred), init.step));
#else
  const float value = init.offset + static_cast<float>(centred) * init.step;
#endif
  return FloatToBf16Bits(value);
}

// Returns how tensor number `tensor_index` is drawn for `seed`: uniform in
// [centre - amplitude, centre + amplitude).
inline UniformInit MakeUniformInit(uint64_t seed, int tensor_index, double amplitude,
                                   float centre) {
  UniformInit init;
  init.stream = Mix64(seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(tensor_index) + 1);
  init.step = static_cast<float>(amplitude / static_cast<double>(1 << 23));
  init.offset = centre;
  return init;
}

}  // namespace internal
}  // namespace kiln

#endif  // KILN_RUNTIME_MODEL_INTERNAL_WEIGHT_INIT_H_
