"""libFuzzer targets: a fuzzer binary and its short run as a test.

Both are tagged "manual" and "fuzz": they build only with `--config=fuzz` (clang, libFuzzer,
ASan, UBSan), which `bazel test //...` does not use; tests/run.sh runs them in a second Bazel
invocation, and tests/fuzz/long.sh runs them long.
"""

def tessera_fuzz_test(name, srcs, deps, runs = 10000, max_total_time = 20):
    """`<name>_fuzzer`, a libFuzzer binary, and `<name>_fuzz_test`, its short run.

    The short run replays every input of regressions/<name>/ (crashes once found), then fuzzes
    from the seed corpus corpus/<name>/ for `runs` executions with a fixed seed, stopping early
    after `max_total_time` seconds.
    """
    native.cc_binary(
        name = name + "_fuzzer",
        srcs = srcs,
        deps = deps + [":fuzz_init"],
        linkopts = ["-fsanitize=fuzzer"],
        tags = ["manual", "fuzz"],
    )
    native.sh_test(
        name = name + "_fuzz_test",
        size = "small",
        srcs = ["run_fuzzer.sh"],
        args = [
            "$(location :%s_fuzzer)" % name,
            native.package_name() + "/corpus/" + name,
            native.package_name() + "/regressions/" + name,
            str(runs),
            str(max_total_time),
        ],
        data = [":" + name + "_fuzzer"] + native.glob(
            ["corpus/%s/**" % name, "regressions/%s/**" % name],
        ),
        tags = ["manual", "fuzz"],
    )
