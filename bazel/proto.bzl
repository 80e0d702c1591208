"""C++ code generation for .proto files with Debian's protoc and grpc_cpp_plugin.

Bazel 4's native proto_library wants to build protobuf from source, which an offline build
cannot do; this macro runs the system tools instead.
"""

def tessera_proto_library(name, srcs, deps = [], grpc = False, visibility = None):
    """Generates a cc_library `name` from `srcs` (paths relative to this package).

    The package directory is the proto root: "tessera/v1/types.proto" is imported as such,
    and its header is included as "tessera/v1/types.pb.h".

    Args:
      name: the cc_library; a filegroup `<name>_protos` holds `srcs` for dependants.
      srcs: .proto files.
      deps: other tessera_proto_library targets whose protos `srcs` import.
      grpc: also generate gRPC service stubs (*.grpc.pb.{h,cc}).
      visibility: of the cc_library.
    """
    hdrs = []
    cc_srcs = []
    for src in srcs:
        base = src[:-len(".proto")]
        hdrs.append(base + ".pb.h")
        cc_srcs.append(base + ".pb.cc")
        if grpc:
            hdrs.append(base + ".grpc.pb.h")
            cc_srcs.append(base + ".grpc.pb.cc")

    native.filegroup(
        name = name + "_protos",
        srcs = srcs + [dep + "_protos" for dep in deps],
    )

    root = native.package_name() or "."
    cmd = "/usr/bin/protoc -I{root} --cpp_out=$(GENDIR)/{root}".format(root = root)
    if grpc:
        cmd += (" --grpc_out=$(GENDIR)/{root}" +
                " --plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin").format(root = root)
    cmd += " " + " ".join(["{}/{}".format(root, src) for src in srcs])

    native.genrule(
        name = name + "_gen",
        srcs = [name + "_protos"],
        outs = hdrs + cc_srcs,
        cmd = cmd,
        message = "protoc " + " ".join(srcs),
    )

    native.cc_library(
        name = name,
        srcs = cc_srcs,
        hdrs = hdrs,
        includes = ["."],
        copts = ["-Wno-unused-parameter"],
        deps = deps + ["@system//:protobuf"] + (["@system//:grpc"] if grpc else []),
        visibility = visibility,
    )
