"""CUDA sources compiled with nvcc, only under --config=cuda."""

load("@rules_cc//cc:defs.bzl", "cc_library")

CUDA_GENCODES = [
    # H100 / H200.
    "-gencode arch=compute_90,code=sm_90",
    # GB10 (DGX Spark).
    "-gencode arch=compute_121,code=sm_121",
]

def cuda_library(name, srcs, hdrs = [], deps = [], visibility = None, testonly = False):
    """A cc_library of `srcs` (.cu files) compiled by nvcc to objects.

    Without --config=cuda the library is empty (and the nvcc actions are never
    run), so CPU-only machines build everything else. Code that calls into it
    must itself be selected on //third_party/build_defs:with_cuda.
    """
    objs = []
    for src in srcs:
        obj = "_{}_objs/{}".format(name, src.replace(".cu", ".o"))
        native.genrule(
            name = "_{}_{}_nvcc".format(name, src.replace("/", "_").replace(".", "_")),
            srcs = [src] + hdrs,
            outs = [obj],
            tools = ["@local_cuda//:nvcc_path"],
            cmd = ("NVCC=$$(cat $(location @local_cuda//:nvcc_path)); " +
                   "test -n \"$$NVCC\" || { echo 'nvcc not found: install CUDA or build without --config=cuda' >&2; exit 1; }; " +
                   "$$NVCC -std=c++20 -O3 -Xcompiler=-fPIC -Xcompiler=-Wall " +
                   " ".join(CUDA_GENCODES) +
                   " -I. -I$(GENDIR) -c $(location {}) -o $@".format(src)),
            tags = ["manual"],
            testonly = testonly,
            message = "nvcc " + src,
        )
        objs.append(obj)
    cc_library(
        name = name,
        srcs = select({
            "//third_party/build_defs:with_cuda": objs,
            "//conditions:default": [],
        }),
        hdrs = hdrs,
        deps = deps + select({
            "//third_party/build_defs:with_cuda": ["@local_cuda//:cudart"],
            "//conditions:default": [],
        }),
        visibility = visibility,
        testonly = testonly,
    )
