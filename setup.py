# SPDX-License-Identifier: GPL-2.0-or-later
"""The build of an installed madtrace (pip install, pip wheel, python -m build, pipx
install): pyproject.toml holds the metadata; this adds the native parts, built
by injector/build_native.py into the package (madtrace/built/), and installs the
C client madtrace-ctl beside the console scripts.  The editable install of
``make setup`` builds nothing here: the Makefile builds a checkout's build/."""

from __future__ import annotations

import os
import sys

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py
from distutils.command.build_scripts import build_scripts  # setuptools provides distutils

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "injector"))
import build_native  # noqa: E402

BUILDS = {"bdist_wheel", "build", "build_py", "install", "bdist"}


class BuildWithNative(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        try:
            build_native.build(os.path.join(self.build_lib, "madtrace", "built"))
        except build_native.BuildError as exc:
            sys.exit(f"madtrace: {exc}")


class CopyClient(build_scripts):
    """madtrace-ctl is a compiled program, copied as it is (build_scripts reads
    scripts as Python source to fix their first line)."""

    def run(self):
        self.mkpath(self.build_dir)
        for script in self.scripts or []:
            target = os.path.join(self.build_dir, os.path.basename(script))
            self.copy_file(script, target)
            os.chmod(target, 0o755)


class NativeDistribution(Distribution):
    """A wheel with compiled parts: tagged for this Python and platform."""

    def has_ext_modules(self):
        return True


def client() -> list[str]:
    """madtrace-ctl, compiled for the scripts of a wheel or an install (none for
    metadata or an editable install)."""
    if not BUILDS & set(sys.argv):
        return []
    out = os.path.join("build", "client")        # setup() wants a relative path
    os.makedirs(out, exist_ok=True)
    try:
        return [os.path.relpath(build_native.client(out), HERE)]
    except build_native.BuildError as exc:
        sys.exit(f"madtrace: {exc}")


setup(distclass=NativeDistribution, cmdclass={"build_py": BuildWithNative,
                                                  "build_scripts": CopyClient}, scripts=client())
