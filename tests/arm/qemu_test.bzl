"""Tests built for aarch64 and run under qemu user-mode emulation.

    qemu_aarch64_test(
        name = "formats_sve512",
        tests = ["//tests/formats:row_decode_simd_test"],
        cpu = "a64fx,sve-default-vector-length=64",
        hwy_target = "SVE",
        vector_bytes = 64,
    )

builds each cc_test in `tests` with the aarch64 cross toolchain
(//third_party/toolchains/aarch64, through a configuration transition: the
same targets, sources and flags as the native build) and runs them one after
another under `qemu-aarch64 -cpu <cpu>`. Before the tests, a probe built the
same way checks that Highway's dynamic dispatch picks `hwy_target` with
`vector_bytes`-byte vectors on that CPU, so a qemu that silently lacks a feature cannot turn an SVE test into a NEON
one. The gtest XML of every binary is merged into the target's test.xml.

`expect_test_failure = True` inverts the verdict (the runner's own tests: a
deliberately broken kernel must fail under the SVE targets).
"""

def _no_sanitizers(flags):
    # The sanitizers' runtimes are not installed for arm64, and qemu-user
    # cannot host their shadow memory: --config=asan stays native.
    return [f for f in flags if not f.startswith("-fsanitize")]

def _aarch64_transition_impl(settings, attr):
    _ignore = attr
    return {
        "//command_line_option:cpu": "aarch64",
        "//command_line_option:crosstool_top": "//third_party/toolchains/aarch64:toolchain",
        "//command_line_option:copt": _no_sanitizers(settings["//command_line_option:copt"]),
        "//command_line_option:linkopt": _no_sanitizers(settings["//command_line_option:linkopt"]),
    }

aarch64_transition = transition(
    implementation = _aarch64_transition_impl,
    inputs = [
        "//command_line_option:copt",
        "//command_line_option:linkopt",
    ],
    outputs = [
        "//command_line_option:cpu",
        "//command_line_option:crosstool_top",
        "//command_line_option:copt",
        "//command_line_option:linkopt",
    ],
)

def _shell_quote(s):
    return "'" + s.replace("'", "'\\''") + "'"

def _qemu_aarch64_test_impl(ctx):
    runner = ctx.file._runner
    probe = ctx.attr._probe[0][DefaultInfo].files_to_run.executable
    binaries = [t[DefaultInfo].files_to_run.executable for t in ctx.attr.tests]
    args = [
        "--cpu",
        ctx.attr.cpu,
        "--hwy-target",
        ctx.attr.hwy_target,
        "--vector-bytes",
        str(ctx.attr.vector_bytes),
        "--probe",
        probe.short_path,
    ]
    if ctx.attr.expect_test_failure:
        args.append("--expect-failure")
    args.append("--")
    args += [b.short_path for b in binaries]
    script = ctx.actions.declare_file(ctx.label.name + ".sh")
    ctx.actions.write(
        output = script,
        content = "#!/usr/bin/env bash\nexec {} {}\n".format(
            _shell_quote(runner.short_path),
            " ".join([_shell_quote(a) for a in args]),
        ),
        is_executable = True,
    )
    runfiles = ctx.runfiles(files = [runner, probe] + binaries)
    runfiles = runfiles.merge(ctx.attr._probe[0][DefaultInfo].default_runfiles)
    for t in ctx.attr.tests:
        runfiles = runfiles.merge(t[DefaultInfo].default_runfiles)
    return [DefaultInfo(executable = script, runfiles = runfiles)]

qemu_aarch64_test = rule(
    implementation = _qemu_aarch64_test_impl,
    test = True,
    attrs = {
        "tests": attr.label_list(
            cfg = aarch64_transition,
            mandatory = True,
            allow_empty = False,
            doc = "cc_test targets, built for aarch64.",
        ),
        "cpu": attr.string(mandatory = True, doc = "qemu's -cpu value."),
        "hwy_target": attr.string(
            mandatory = True,
            doc = "The Highway target dispatch must pick (hwy::TargetName).",
        ),
        "vector_bytes": attr.int(
            mandatory = True,
            doc = "That target's vector length in bytes on this CPU.",
        ),
        "expect_test_failure": attr.bool(default = False),
        "_runner": attr.label(
            default = "//tests/arm:qemu_run.sh",
            allow_single_file = True,
        ),
        "_probe": attr.label(
            default = "//tests/arm:hwy_probe",
            cfg = aarch64_transition,
            executable = True,
        ),
        "_allowlist_function_transition": attr.label(
            default = "@bazel_tools//tools/allowlists/function_transition_allowlist",
        ),
    },
)

# The CPUs every Arm suite runs on:
#   name suffix -> (qemu -cpu, Highway target, vector bytes).
# a64fx has SVE without SVE2 (lengths 128/256/512); max has SVE2. At 256 bits
# Highway picks its fixed-length SVE_256 target, at 128 bits with SVE2 its
# SVE2_128 (the GB10's Cortex-X925/A725 cores); the suites that iterate over
# every supported target also cover the generic SVE/SVE2 targets there.
ARM_CPUS = {
    "neon": ("cortex-a72", "NEON", 16),
    "sve128": ("a64fx,sve-default-vector-length=16", "SVE", 16),
    "sve256": ("a64fx,sve-default-vector-length=32", "SVE_256", 32),
    "sve512": ("a64fx,sve-default-vector-length=64", "SVE", 64),
    "sve2_128": ("max,sve-default-vector-length=16", "SVE2_128", 16),
    "sve2_512": ("max,sve-default-vector-length=64", "SVE2", 64),
}

def qemu_aarch64_suite(name, tests, cpus = ARM_CPUS, **kwargs):
    """One qemu_aarch64_test per CPU, named <name>_<cpu>, and a test_suite."""
    names = []
    for suffix, (cpu, target, vector_bytes) in cpus.items():
        test_name = "{}_{}".format(name, suffix)
        qemu_aarch64_test(
            name = test_name,
            tests = tests,
            cpu = cpu,
            hwy_target = target,
            vector_bytes = vector_bytes,
            **kwargs
        )
        names.append(test_name)
    native.test_suite(name = name, tests = names)
