"""Tests that run Python under the Python environment of deploy/install-deps.sh.

python_sh_test is an sh_test whose script finds that environment's interpreter in
$TESSERA_PYTHON (a path relative to the runfiles root, where Bazel starts the test);
bazel/python_venv.bzl says where the environment lives and why it is reached this way.
"""

PYTHON = "@tessera_python//:python"

def python_sh_test(name, data = [], env = {}, **kwargs):
    env = dict(env)
    env["TESSERA_PYTHON"] = "$(rootpath %s)" % PYTHON
    native.sh_test(name = name, data = data + [PYTHON], env = env, **kwargs)
