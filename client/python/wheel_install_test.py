"""Runs under a fresh venv into which wheel_install_test.sh pip-installed the tessera wheel:
the package imports from the venv's site-packages (not from Bazel's output tree), its
metadata is the wheel's, and it saves and loads through a real agent ($TESSERA_AGENT) with
nothing else installed (no torch, no numpy)."""

import importlib.metadata
import importlib.util
import os
import sys
import unittest

import testlib

VENV = os.environ.get("TESSERA_VENV_UNDER_TEST", "")
WHEEL = os.environ.get("TESSERA_WHEEL", "")


@unittest.skipUnless(VENV and WHEEL, "needs the venv of wheel_install_test.sh")
class WheelInstallTest(unittest.TestCase):
    def test_Install_FreshVenv_ImportsFromSitePackages(self):
        import tessera
        site = os.path.realpath(os.path.join(VENV, "lib", "python3.11", "site-packages"))
        self.assertEqual(os.path.dirname(os.path.dirname(os.path.realpath(tessera.__file__))),
                         site)
        self.assertTrue(os.path.realpath(tessera._tessera.__file__).startswith(site))
        # The distribution's version is the one in the wheel's file name.
        version = importlib.metadata.version("tessera")
        self.assertTrue(os.path.basename(WHEEL).startswith("tessera-%s-" % version), WHEEL)
        self.assertIsNone(importlib.util.find_spec("torch"))
        self.assertIsNone(importlib.util.find_spec("numpy"))

    def test_Installed_SaveWaitLoad_ThroughAnAgent(self):
        import tessera
        client = tessera.Client(connect_timeout=30)
        value = {"epoch": 3, "lr": 0.125, "tokens": b"\x00\x01", "ids": (1, 2)}
        result = client.save(7, {}, objects={"loader": value})
        self.assertIsInstance(result, tessera.SaveResult)
        directory = client.wait(7, timeout=60)
        self.assertTrue(os.path.isfile(os.path.join(directory, "manifest.pb")), directory)
        step, objs = client.load("latest", objects=True)
        self.assertEqual((step, objs), (7, {"loader": value}))

    def test_Installed_NoAgentThere_UnavailableError(self):
        import tessera
        with self.assertRaises(tessera.UnavailableError):
            tessera.Client(agent=os.environ["TESSERA_AGENT"] + ".absent", connect_timeout=1)


if __name__ == "__main__":
    sys.exit(testlib.main())
