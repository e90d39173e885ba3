"""A repository rule exposing system libraries (found with pkg-config) as
cc_library targets, so the build uses Debian's packages and downloads nothing.

    system_libs(
        name = "sys",
        libraries = {"grpc": ["grpc++"]},        # target -> pkg-config modules
        plain_libraries = {"gloo": ["-lgloo"]},  # target -> linkopts
    )

gives `@sys//:grpc` and `@sys//:gloo`.
"""

def _pkg_config(rctx, pkg_config, args, modules):
    result = rctx.execute([pkg_config] + args + modules)
    if result.return_code != 0:
        fail(("pkg-config {} {} failed (is the Debian package installed? " +
              "run tools/bootstrap.sh): {}").format(
                 " ".join(args),
                 " ".join(modules),
                 result.stderr,
             ))
    return [f for f in result.stdout.strip().split(" ") if f]

def _quote_list(items):
    return "[" + ", ".join(['"{}"'.format(i) for i in items]) + "]"

def _system_libs_impl(rctx):
    pkg_config = rctx.which("pkg-config")
    if not pkg_config:
        fail("pkg-config not found: run tools/bootstrap.sh")
    build = ['package(default_visibility = ["//visibility:public"])', ""]
    for name, modules in rctx.attr.libraries.items():
        linkopts = _pkg_config(rctx, pkg_config, ["--libs"], modules)
        cflags = _pkg_config(rctx, pkg_config, ["--cflags"], modules)
        defines = []
        includes = []
        for flag in cflags:
            if flag.startswith("-D"):
                defines.append(flag[2:])
            elif flag.startswith("-I"):
                path = flag[2:].rstrip("/")
                if path in ("/usr/include", "/usr/local/include"):
                    continue
                link = "include/{}_{}".format(name, len(includes))
                rctx.symlink(path, link)
                includes.append(link)
        build.append("""cc_library(
    name = "{name}",
    hdrs = glob([{globs}]),
    defines = {defines},
    includes = {includes},
    linkopts = {linkopts},
)
""".format(
            name = name,
            globs = ", ".join(['"{}/**"'.format(i) for i in includes]),
            defines = _quote_list(defines),
            includes = _quote_list(includes),
            linkopts = _quote_list(linkopts),
        ))
    for name, linkopts in rctx.attr.plain_libraries.items():
        build.append("""cc_library(
    name = "{name}",
    linkopts = {linkopts},
)
""".format(name = name, linkopts = _quote_list(linkopts)))
    rctx.file("WORKSPACE", 'workspace(name = "{}")\n'.format(rctx.name))
    rctx.file("BUILD.bazel", "\n".join(build))

system_libs = repository_rule(
    implementation = _system_libs_impl,
    attrs = {
        "libraries": attr.string_list_dict(mandatory = True),
        "plain_libraries": attr.string_list_dict(default = {}),
    },
    environ = ["PKG_CONFIG_PATH"],
    local = True,
)
