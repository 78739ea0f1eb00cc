"""Package build: cffi compiles shim._proto, shim._devmodel and the others; build_ext also compiles the
native C libraries (see shim/build.py) and, for a wheel or a plain install,
puts them in the package (shim/lib), so that `pip install .` is enough to
run `colocate`; `make build` stays the developer's path (an editable
install that uses them where they are built)."""
import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

sys.path.insert(0, str(Path(__file__).resolve().parent))


class BuildExtWithNative(build_ext):
    def run(self):
        super().run()
        from shim.build import LIB, build_native
        build_native()
        if not self.inplace:
            # libcolocate.so, simgpu's libraries, the worker: package data
            # the cffi step does not know about
            dest = Path(self.build_lib) / "shim" / "lib"
            shutil.rmtree(dest, ignore_errors=True)        # a build dir left by an earlier build
            shutil.copytree(LIB, dest, symlinks=True, ignore=shutil.ignore_patterns(".*.tmp", "*.map"))


setup(cffi_modules=["shim/build.py:ffibuilder", "shim/build.py:devmodel_ffibuilder", "predictors/build.py:ffibuilder",
                     "controlplane/policies/build.py:ffibuilder"],
      cmdclass={"build_ext": BuildExtWithNative})
