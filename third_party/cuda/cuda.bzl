"""cuda_library: compile .cu sources with nvcc into a target usable wherever a cc_library is.

    load("//third_party/cuda:cuda.bzl", "cuda_library")

    cuda_library(
        name = "decode_kernel",
        srcs = ["decode_kernel.cu"],          # compiled by nvcc
        hdrs = ["decode_kernel.h"],           # plain C++ header for callers
        deps = [":plan", "//runtime/cuda:status"],   # their headers reach the .cu files
        gencode = ["sm_90a", "sm_80"],        # default: sm_90a only
    )

The .cu files see the headers and include paths of every dependency (abseil, other kiln targets,
generated protos) exactly as a cc_library's sources would. The objects land in a cc_library
named `name` that also carries hdrs, deps and cudart, so cc_test and cc_binary depend on it.
"""

load("//third_party:copts.bzl", "KILN_CUDA_COPTS", "KILN_CUDA_GENCODE")

_NVCC = "/usr/local/cuda/bin/nvcc"

def _nvcc_objects_impl(ctx):
    merged = cc_common.merge_cc_infos(cc_infos = [d[CcInfo] for d in ctx.attr.deps])
    cctx = merged.compilation_context
    flags = list(KILN_CUDA_COPTS)
    for arch in ctx.attr.gencode:
        if arch not in KILN_CUDA_GENCODE:
            fail("cuda_library %s: unknown gencode %r; use one of %s" % (ctx.label, arch, sorted(KILN_CUDA_GENCODE.keys())))
        flags.append(KILN_CUDA_GENCODE[arch])
    if ctx.var.get("COMPILATION_MODE") == "dbg":
        flags.append("-g")
    else:
        flags.append("-DNDEBUG")
    for d in cctx.defines.to_list() + cctx.local_defines.to_list():
        flags.append("-D" + d)
    for d in ctx.attr.defines:
        flags.append("-D" + d)
    # The workspace root and its generated-file root, as a cc_library's own sources see them.
    for inc in [".", ctx.bin_dir.path] + cctx.quote_includes.to_list() + cctx.includes.to_list():
        flags.append("-I" + inc)
    for inc in cctx.system_includes.to_list():
        flags.extend(["-isystem", inc])
    flags.extend(ctx.attr.copts)

    outs = []
    for src in ctx.files.srcs:
        out = ctx.actions.declare_file("_objs/%s/%s.pic.o" % (ctx.attr.name, src.basename.rsplit(".", 1)[0]))
        args = ctx.actions.args()
        args.add_all(flags)
        args.add("-c", src)
        args.add("-o", out)
        ctx.actions.run(
            executable = _NVCC,
            arguments = [args],
            inputs = depset(ctx.files.srcs + ctx.files.hdrs, transitive = [cctx.headers]),
            outputs = [out],
            mnemonic = "NvccCompile",
            progress_message = "nvcc %s" % src.short_path,
            use_default_shell_env = True,
        )
        outs.append(out)
    return [DefaultInfo(files = depset(outs))]

_nvcc_objects = rule(
    implementation = _nvcc_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = [".h", ".cuh", ".inc"]),
        "deps": attr.label_list(providers = [CcInfo]),
        "gencode": attr.string_list(default = ["sm_90a"]),
        "copts": attr.string_list(),
        "defines": attr.string_list(),
    },
)

def cuda_library(name, srcs, hdrs = [], textual_hdrs = [], deps = [], gencode = ["sm_90a"], copts = [], defines = [], visibility = None, tags = [], **kwargs):
    """Compiles `srcs` (.cu) with nvcc and wraps the objects in cc_library `name`.

    Args:
      name: the cc_library's name.
      srcs: .cu files.
      hdrs: public headers, visible to dependents (and to the .cu files).
      textual_hdrs: headers (.cuh) included by the .cu files only, such as kernel templates.
      deps: cc_library-like targets whose headers the .cu files include and which the
        objects link against.
      gencode: machine-code targets from KILN_CUDA_GENCODE (default sm_90a).
      copts: extra nvcc flags, for one target only (prefer KILN_CUDA_COPTS).
      defines: preprocessor definitions for the .cu files only.
      visibility: as for cc_library.
      tags: as for cc_library.
      **kwargs: passed to the cc_library.
    """
    _nvcc_objects(
        name = name + "_nvcc",
        srcs = srcs,
        hdrs = hdrs + textual_hdrs,
        deps = deps + ["@local_cuda//:cuda_headers"],
        gencode = gencode,
        copts = copts,
        defines = defines,
        visibility = ["//visibility:private"],
        tags = tags,
    )
    native.cc_library(
        name = name,
        srcs = [":" + name + "_nvcc"],
        hdrs = hdrs,
        textual_hdrs = textual_hdrs,
        deps = deps + ["@local_cuda//:cudart"],
        visibility = visibility,
        tags = tags,
        **kwargs
    )
