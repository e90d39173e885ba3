"""Finds the CUDA toolkit (and NCCL) on this machine.

Writes @local_cuda with targets :cuda_headers, :cudart, :cublas, :nccl and
the file :nvcc_path (a one-line file with nvcc's absolute path, or empty).
Where no toolkit is found every target is an empty stand-in, so the CPU-only
build still works; CUDA code is built only under --config=cuda.
"""

def _cuda_configure_impl(rctx):
    candidates = []
    for var in ("CUDA_PATH", "CUDA_HOME"):
        if rctx.os.environ.get(var):
            candidates.append(rctx.os.environ[var])
    candidates.append("/usr/local/cuda")
    root = None
    for c in candidates:
        if rctx.path(c + "/bin/nvcc").exists and rctx.path(c + "/include/cuda_runtime.h").exists:
            root = c
            break

    build = ['package(default_visibility = ["//visibility:public"])', ""]
    if root == None:
        rctx.file("nvcc_path", "")
        build.append('exports_files(["nvcc_path"])')
        for name in ("cuda_headers", "cudart", "cublas", "nccl"):
            build.append('cc_library(name = "{}")'.format(name))
        build.append('filegroup(name = "nvcc")')
    else:
        rctx.symlink(root + "/include", "include")
        rctx.symlink(root + "/bin", "bin")
        rctx.symlink(root + "/nvvm", "nvvm")
        lib = root + "/lib64"
        rctx.file("nvcc_path", root + "/bin/nvcc\n")
        build.append('exports_files(["nvcc_path"])')
        build.append("""
cc_library(
    name = "cuda_headers",
    # nv/target and nv/detail/* (included by cuda_fp16.h, hence nccl.h)
    # have no extension.
    hdrs = glob(["include/**/*.h", "include/**/*.hpp", "include/**/*.cuh", "include/nv/**"]),
    includes = ["include"],
)

cc_library(
    name = "cudart",
    linkopts = ["-L{lib}", "-Wl,-rpath,{lib}", "-lcudart"],
    deps = [":cuda_headers"],
)

cc_library(
    name = "cublas",
    linkopts = ["-L{lib}", "-Wl,-rpath,{lib}", "-lcublasLt", "-lcublas"],
    deps = [":cudart"],
)

cc_library(
    name = "nccl",
    linkopts = ["-L{lib}", "-Wl,-rpath,{lib}", "-lnccl"],
    deps = [":cudart"],
)

filegroup(
    name = "nvcc",
    srcs = glob(["bin/**", "nvvm/**"]),
)
""".format(lib = lib))
    rctx.file("WORKSPACE", 'workspace(name = "{}")\n'.format(rctx.name))
    rctx.file("BUILD.bazel", "\n".join(build) + "\n")

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_PATH", "CUDA_HOME"],
    local = True,
)
