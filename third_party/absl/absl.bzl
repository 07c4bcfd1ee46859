"""Helpers that wrap Debian's shared abseil libraries as Bazel targets."""

# Libraries that abseil's inline code reaches from almost every header. GNU ld does not follow
# DT_NEEDED for the program's own undefined symbols, so each target names what its headers use.
_BASE = [
    "absl_base",
    "absl_raw_logging_internal",
    "absl_log_severity",
    "absl_spinlock_wait",
    "absl_throw_delegate",
    "absl_int128",
    "absl_strings",
    "absl_strings_internal",
]

def absl_system_library(name, libs = [], deps = []):
    """Declares a target that links the given libabsl_*.so libraries (plus abseil's base)."""
    native.cc_library(
        name = name,
        linkopts = ["-l" + lib for lib in libs + _BASE],
        deps = deps,
        visibility = ["//visibility:public"],
    )
