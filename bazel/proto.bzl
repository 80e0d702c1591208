"""C++ code generation for .proto files with Debian's protoc and grpc_cpp_plugin.

Bazel 4's native proto_library wants to build protobuf from source, which an offline build
cannot do; this macro runs the system tools instead.
"""

def tessera_proto_library(name, srcs, deps = [], grpc_name = None, visibility = None):
    """Generates a cc_library `name` of the messages in `srcs` (paths relative to this package).

    The package directory is the proto root: "tessera/v1/types.proto" is imported as such,
    and its header is included as "tessera/v1/types.pb.h".

    Args:
      name: the cc_library of the messages; a filegroup `<name>_protos` holds `srcs` for
        dependants. It does not depend on gRPC, so pure libraries (the planner, the session
        core) stay free of gRPC in the build graph.
      srcs: .proto files.
      deps: other tessera_proto_library message targets whose protos `srcs` import.
      grpc_name: if set, also a cc_library of that name with the gRPC service stubs
        (*.grpc.pb.{h,cc}), depending on `name` and on gRPC.
      visibility: of the cc_libraries.
    """
    bases = [src[:-len(".proto")] for src in srcs]
    root = native.package_name() or "."
    inputs = " ".join(["{}/{}".format(root, src) for src in srcs])

    native.filegroup(
        name = name + "_protos",
        srcs = srcs + [dep + "_protos" for dep in deps],
    )

    native.genrule(
        name = name + "_gen",
        srcs = [name + "_protos"],
        outs = [b + ".pb.h" for b in bases] + [b + ".pb.cc" for b in bases],
        cmd = "/usr/bin/protoc -I{root} --cpp_out=$(GENDIR)/{root} {inputs}".format(
            root = root,
            inputs = inputs,
        ),
        message = "protoc " + " ".join(srcs),
    )

    native.cc_library(
        name = name,
        srcs = [b + ".pb.cc" for b in bases],
        hdrs = [b + ".pb.h" for b in bases],
        includes = ["."],
        copts = ["-Wno-unused-parameter"],
        deps = deps + ["@system//:protobuf"],
        visibility = visibility,
    )

    if grpc_name:
        native.genrule(
            name = grpc_name + "_gen",
            srcs = [name + "_protos"],
            outs = [b + ".grpc.pb.h" for b in bases] + [b + ".grpc.pb.cc" for b in bases],
            cmd = ("/usr/bin/protoc -I{root} --grpc_out=$(GENDIR)/{root}" +
                   " --plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin {inputs}").format(
                root = root,
                inputs = inputs,
            ),
            message = "protoc (gRPC) " + " ".join(srcs),
        )
        native.cc_library(
            name = grpc_name,
            srcs = [b + ".grpc.pb.cc" for b in bases],
            hdrs = [b + ".grpc.pb.h" for b in bases],
            includes = ["."],
            copts = ["-Wno-unused-parameter"],
            deps = [":" + name, "@system//:grpc"],
            visibility = visibility,
        )
