"""C++ and gRPC code generation with the system protoc and grpc_cpp_plugin."""

load("@rules_cc//cc:defs.bzl", "cc_library")

def mneme_proto_library(name, srcs, deps = [], grpc = True, visibility = None):
    """A cc_library `name` generated from `srcs` (.proto files).

    Args:
      name: the cc_library; `name + "_protos"` is a filegroup of the sources
        for other mneme_proto_library targets that import these files.
      srcs: .proto files in this package.
      deps: other mneme_proto_library targets whose protos are imported.
      grpc: also generate gRPC service code (*.grpc.pb.{h,cc}).
      visibility: of the library and the filegroup.
    """
    outs = []
    for src in srcs:
        base = src[:-len(".proto")]
        outs += [base + ".pb.h", base + ".pb.cc"]
        if grpc:
            outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]
    native.filegroup(
        name = name + "_protos",
        srcs = srcs + [d + "_protos" for d in deps],
        visibility = visibility,
    )
    grpc_flags = ""
    if grpc:
        grpc_flags = ("--grpc_out=$(GENDIR) " +
                      "--plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin ")
    native.genrule(
        name = name + "_codegen",
        srcs = srcs + [d + "_protos" for d in deps],
        outs = outs,
        cmd = ("/usr/bin/protoc -I. -I/usr/include --cpp_out=$(GENDIR) " +
               grpc_flags +
               " ".join(["$(location {})".format(s) for s in srcs])),
        message = "protoc " + name,
    )
    cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        copts = ["-Wno-unused-parameter"],
        deps = deps + ["@sys//:protobuf"] + (["@sys//:grpc"] if grpc else []),
        visibility = visibility,
    )
