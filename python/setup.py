"""Build step of the Python package.

1. Carry a prebuilt libgradops.so into gradops/_lib/. The package is a thin layer over the C ABI
   (one libgradops for every Python 3); the library is CMake's (target gradops_shared). Which one
   is carried: $GRADOPS_LIBRARY if set, else the newest build/*/libgradops.so of the source tree
   this directory belongs to. If none is found the package installs without one and finds the
   library at import time ($GRADOPS_LIBRARY, or the loader's path).
2. Compile gradops._torch_call, the call path for PyTorch tensors (python/README.md, "Per-call
   overhead"), against the PyTorch this build sees, where its C++ headers are present.
   GRADOPS_TORCH_CALL_BUILD=0 skips it, =1 makes a failure to build it an error; by default a
   failure is reported and the package installs without it (calls then take the Python path).
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


def _torch_call_extension():
    """(extension, build_ext command) for gradops._torch_call, or (None, why not)."""
    mode = os.environ.get("GRADOPS_TORCH_CALL_BUILD", "auto")
    if mode == "0":
        return None, "GRADOPS_TORCH_CALL_BUILD=0"
    include = os.path.join(HERE, "..", "include")
    try:
        from torch.utils import cpp_extension
    except ImportError as e:
        why = f"PyTorch is not importable ({e})"
    else:
        headers = [d for d in cpp_extension.include_paths()
                   if os.path.exists(os.path.join(d, "torch", "csrc", "autograd", "python_variable.h"))]
        if not headers:
            why = "PyTorch's C++ headers are missing (Debian: libtorch-dev)"
        elif not os.path.exists(os.path.join(include, "gradops", "gradops.h")):
            why = "gradops' C header is not beside this directory"
        else:
            import torch
            ext = cpp_extension.CppExtension(
                "gradops._torch_call", [os.path.join("gradops", "_torch_call.cpp")], include_dirs=[include],
                define_macros=[("GRADOPS_TORCH_VERSION", '"%s"' % torch.__version__)],
                extra_compile_args=["-O2", "-std=c++17", "-Wno-deprecated-declarations"])
            required = mode == "1"

            class BuildExt(cpp_extension.BuildExtension):
                def build_extension(self, extension):
                    try:
                        super().build_extension(extension)
                    except Exception as e:  # noqa: BLE001 - optional unless required
                        if required:
                            raise
                        self.warn(f"gradops: gradops._torch_call not built ({e}); calls take the Python path")
            return ext, BuildExt
    if mode == "1":
        raise SystemExit(f"GRADOPS_TORCH_CALL_BUILD=1: cannot build gradops._torch_call: {why}")
    return None, why


_ext, _build_ext = _torch_call_extension()
if _ext is None:
    print(f"gradops: building without gradops._torch_call: {_build_ext}")
    setup(cmdclass={"build_py": BuildPy})
else:
    setup(cmdclass={"build_py": BuildPy, "build_ext": _build_ext}, ext_modules=[_ext])
