"""Build script beside pyproject.toml: the package carries a native library
(libtierd_host_event.so), so its wheel is platform-specific, and it is built only from the tree the
build assembles (<build>/python), where the generated modules are."""

import os
import sys

from setuptools import setup
from setuptools.dist import Distribution

_here = os.path.dirname(os.path.abspath(__file__))
_generated = ["tierd/_version.py", "tierd/v1/tierd_pb2.py", "tierd/libtierd_host_event.so"]


class BinaryDistribution(Distribution):
    """A distribution with native code: wheels are tagged for this Python and platform."""

    def has_ext_modules(self):
        return True


_missing = [path for path in _generated if not os.path.exists(os.path.join(_here, path))]
if _missing:
    sys.exit(f"tierd: {', '.join(_missing)} missing: this is the source tree. Build tierd "
             "(cmake --build build), then install build/python or the wheel of "
             "`cmake --build build --target tierd_wheel` (build/dist)")

setup(distclass=BinaryDistribution)
