"""Build r3store's optional C extension, ``r3store.codecs._kernels``.

Everything else about the package lives in ``pyproject.toml``. The extension only speeds
r3store up: when it cannot be built (no C compiler, an unusual platform, a big-endian
machine) the install goes on without it, with a warning, and r3store runs its numpy code
instead (``r3store.codecs.kernels.IMPLEMENTATION == "numpy"``). The module uses Python's
stable ABI (3.11+), and only the baseline instruction set: its AVX2/BMI2 code is chosen
at import, by the CPU it runs on.
"""

from __future__ import annotations

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SKIP_ENV = "R3STORE_SKIP_NATIVE_BUILD"


class OptionalBuildExt(build_ext):
    """``build_ext`` that warns instead of failing when the extension does not build."""

    def run(self) -> None:
        if os.environ.get(SKIP_ENV, "") not in ("", "0"):
            self._skip(f"{SKIP_ENV} is set")
            return
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - no compiler: PlatformError, CCompilerError, OSError...
            self._skip(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001 - CompileError, LinkError, ...
            self._skip(exc)

    @staticmethod
    def _skip(why: object) -> None:
        print(
            f"WARNING: r3store's C kernels were not built ({why}); r3store will use its "
            "numpy code, which is correct but slower.",
            file=sys.stderr,
        )


# one C file per concern under r3store/codecs/csrc/ (r3k.h, the internal header, lists
# them); a new concern is a new file here and one line in module.c's method table
SOURCES = ["module", "buffers", "dtypes", "crc32c", "pack", "unpack", "frames", "checks", "gather", "setcodec"]

KERNELS = Extension(
    "r3store.codecs._kernels",
    sources=[f"r3store/codecs/csrc/{name}.c" for name in SOURCES],
    depends=["r3store/codecs/csrc/r3k.h"],
    define_macros=[("Py_LIMITED_API", "0x030B0000")],
    py_limited_api=True,
    optional=True,
)

setup(
    ext_modules=[KERNELS],
    cmdclass={"build_ext": OptionalBuildExt},
    options={"bdist_wheel": {"py_limited_api": "cp311"}},
)
