"""Package build: cffi compiles shim._ctlblock; build_ext also compiles the
native C libraries (see shim/build.py)."""
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

sys.path.insert(0, str(Path(__file__).resolve().parent))


class BuildExtWithNative(build_ext):
    def run(self):
        super().run()
        from shim.build import build_native
        build_native()


setup(cffi_modules=["shim/build.py:ffibuilder", "predictors/build.py:ffibuilder",
                     "controlplane/policies/build.py:ffibuilder"],
      cmdclass={"build_ext": BuildExtWithNative})
