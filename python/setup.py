"""Build step of the Python package: carry a prebuilt libgradops.so into gradops/_lib/.

The package itself is pure Python (one wheel for every Python 3); the native library is CMake's
(target gradops_shared). Which one is carried: $GRADOPS_LIBRARY if set, else the newest
build/*/libgradops.so of the source tree this directory belongs to. If none is found the package
installs without one and finds the library at import time ($GRADOPS_LIBRARY, or the loader's path).
"""
import glob
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def _library():
    env = os.environ.get("GRADOPS_LIBRARY")
    if env:
        if not os.path.exists(env):
            raise SystemExit(f"GRADOPS_LIBRARY={env}: no such file")
        return env
    found = glob.glob(os.path.join(HERE, "..", "build", "*", "libgradops.so"))
    return max(found, key=os.path.getmtime) if found else None


class BuildPy(build_py):
    def run(self):
        super().run()
        lib = _library()
        dest = os.path.join(self.build_lib, "gradops", "_lib")
        if lib is None:
            self.announce("gradops: no libgradops.so found (set GRADOPS_LIBRARY); installing without one", 3)
            return
        os.makedirs(dest, exist_ok=True)
        shutil.copy2(os.path.realpath(lib), os.path.join(dest, "libgradops.so"))
        self.announce(f"gradops: carrying {lib}", 3)


setup(cmdclass={"build_py": BuildPy})
