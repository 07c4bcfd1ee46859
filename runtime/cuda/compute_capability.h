// What the current GPU's compute capability allows, asked once per process:
//
//   config.numAttrs = kiln::CurrentDeviceIsSm90OrLater() ? 1 : 0;   // programmatic launch
//
// kiln runs on one kind of GPU at a time, so the answer is cached on first use.
#ifndef KILN_RUNTIME_CUDA_COMPUTE_CAPABILITY_H_
#define KILN_RUNTIME_CUDA_COMPUTE_CAPABILITY_H_

namespace kiln {

// Returns whether the current device has compute capability 9.0 or later, and with it
// programmatic dependent launch (griddepcontrol) and the bulk-copy engine (cp.async.bulk); false
// when there is no device. Cheap after the first call; callable during capture; thread-safe.
bool CurrentDeviceIsSm90OrLater();

}  // namespace kiln

#endif  // KILN_RUNTIME_CUDA_COMPUTE_CAPABILITY_H_
