"""Builds distmesh's Python package: the pure-Python modules and the extension distmesh._C,
compiled from the distmesh headers one directory up (header-only: nothing else to build).

    pip install --no-build-isolation ./python        (a virtualenv; Debian's system Python
                                                      also needs --break-system-packages)
    make install                                     (the headers and this package)

Needs Python's headers (Debian: python3-dev), setuptools and libuv (libuv1-dev).
DISTMESH_PY_WERROR=1 turns warnings into errors (make does)."""
import glob
import os

from setuptools import Extension, setup

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, ".."))
if not os.path.exists(os.path.join(ROOT, "distmesh.h")):
    raise SystemExit("distmesh.h not found in %s: build the package from the distmesh repository" % ROOT)


def version():
    with open(os.path.join(ROOT, "distmesh.h")) as f:
        for line in f:
            if line.startswith("#define DISTMESH_VERSION \""):
                return line.split('"')[1]
    return "0.0.0"


flags = ["-std=gnu11", "-Wall", "-Wextra", "-Wno-missing-field-initializers", "-fvisibility=hidden"]
if os.environ.get("DISTMESH_PY_WERROR") == "1":
    flags.append("-Werror")

setup(
    name="distmesh",
    version=version(),
    description="Collective communication (all-reduce, all-gather, ...) for Python processes, "
                "over the distmesh C library; a torch.distributed backend",
    license="MIT",
    packages=["distmesh"],
    python_requires=">=3.8",
    ext_modules=[
        Extension(
            "distmesh._C",
            sources=["src/module.c", "src/impl.c"],
            include_dirs=[ROOT],
            define_macros=[("DISTMESH_TCP", None)],
            libraries=["uv"],
            extra_compile_args=flags,
            depends=sorted(glob.glob(os.path.join(ROOT, "distmesh*.h"))),
        )
    ],
    zip_safe=False,
)
