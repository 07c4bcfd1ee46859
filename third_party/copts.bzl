"""Compiler flags for kiln's own code, in one place (third-party targets use their own)."""

# Host C++: C++17, warnings as errors. Third-party headers come in through -isystem and stay quiet.
KILN_COPTS = [
    "-std=c++17",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wno-unused-parameter",
    "-Wno-missing-field-initializers",
]

# nvcc: C++17 for host and device, position-independent host objects (they go into shared
# libraries for tests), device code at -O3 with line info for profilers, and every nvcc or host
# compiler warning an error, like the host code.
KILN_CUDA_COPTS = [
    "-std=c++17",
    "-O3",
    "-lineinfo",
    "--expt-relaxed-constexpr",
    "-Werror=all-warnings",
    "-Xcompiler=-fPIC,-Wall",
]

# Machine code targets by name; cuda_library(gencode = [...]) picks from these.
KILN_CUDA_GENCODE = {
    "sm_80": "-gencode=arch=compute_80,code=sm_80",
    "sm_90": "-gencode=arch=compute_90,code=sm_90",
    "sm_90a": "-gencode=arch=compute_90a,code=sm_90a",
}
