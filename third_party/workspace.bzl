"""Declares the repositories kiln builds with: all local, nothing is downloaded.

kiln's own WORKSPACE calls kiln_repositories(); another workspace that depends on kiln calls it
with the path of its kiln checkout:

    local_repository(name = "kiln", path = "/opt/kiln")
    load("@kiln//third_party:workspace.bzl", "kiln_repositories")
    kiln_repositories(kiln_path = "/opt/kiln")

then depends on single targets such as "@kiln//graph:graph_set".
"""

def kiln_repositories(kiln_path = "."):
    """Declares the offline shims, the system-library wrappers and the CUDA toolkit.

    Args:
      kiln_path: the kiln checkout, absolute or relative to the calling workspace's root.
    """
    third_party = kiln_path + "/third_party/"

    # Stand-ins for repositories Bazel would otherwise download.
    for name in ["rules_cc", "rules_java", "remote_coverage_tools"]:
        native.local_repository(name = name, path = third_party + name)

    # System libraries: headers in /usr/include, shared libraries in the system library folder.
    for name, folder in [
        ("com_google_absl", "absl"),
        ("com_google_protobuf", "protobuf"),
        ("com_github_google_glog", "glog"),
        ("com_google_googletest", "googletest"),
        ("com_github_google_benchmark", "benchmark"),
    ]:
        native.local_repository(name = name, path = third_party + folder)

    # The CUDA toolkit, with NCCL, under /usr/local/cuda.
    native.new_local_repository(
        name = "local_cuda",
        build_file = str(Label("//third_party/cuda:BUILD.local_cuda")),
        path = "/usr/local/cuda",
    )
    native.new_local_repository(
        name = "nccl",
        build_file = str(Label("//third_party/cuda:BUILD.nccl")),
        path = "/usr/local/cuda",
    )
