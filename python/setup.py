"""Builds distmesh's Python package: the pure-Python modules and the extension distmesh._C,
compiled from the distmesh headers one directory up (header-only: nothing else to build).

    pip install ./python                             (a virtualenv; pip fetches setuptools)
    pip install --no-build-isolation ./python        (setuptools and wheel already installed;
                                                      Debian's system Python also needs
                                                      --break-system-packages)
    make install                                     (the headers and this package)

Needs Python's headers (Debian: python3-dev), setuptools and libuv (libuv1-dev).
DISTMESH_PY_WERROR=1 turns warnings into errors (make does).

    DISTMESH_NCCL=1 pip install --no-build-isolation ./python     (make install PY_NCCL=1)

builds the NCCL backend in too (distmesh.connect_nccl, CUDA tensors; distmesh.nccl_built):
CUDA's and NCCL's headers and libraries under CUDA_HOME (default /usr/local/cuda) and NCCL_HOME
(default CUDA_HOME; its include/ and lib64/ or lib/), linked with -lcudart -lnccl and an rpath
to them. Without it the package needs neither.

OpenSSL's libcrypto (Debian: libssl-dev), when its headers are there, is built in as in the C
builds (DISTMESH_OPENSSL): with a token, links between hosts and the store's connections are
encrypted (DISTMESH_ENCRYPT, SECURITY.md), and the package agrees with C programs built the
same way. DISTMESH_OPENSSL=0 leaves it out, =1 requires it."""
import glob
import os
import runpy

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

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


# The extension's files (src/dmpy.h says what each holds; impl.c compiles distmesh's implementation),
# relative to this folder as setuptools wants them.
SOURCES = sorted(os.path.relpath(p, HERE) for p in glob.glob(os.path.join(HERE, "src", "*.c")))

flags = ["-std=gnu11", "-Wall", "-Wextra", "-Wno-missing-field-initializers", "-fvisibility=hidden"]
if os.environ.get("DISTMESH_PY_WERROR") == "1":
    flags.append("-Werror")

macros = [("DISTMESH_TCP", None)]
include_dirs = [ROOT]
library_dirs = []
libraries = ["uv"]


def nccl_paths():
    """(include dirs, library dirs) of CUDA and NCCL, checked so a missing one fails here, by name."""
    cuda = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    nccl = os.environ.get("NCCL_HOME") or cuda
    incs, libs = [], []
    for what, home, header, lib in (("CUDA", cuda, "cuda_runtime.h", "libcudart.so"),
                                    ("NCCL", nccl, "nccl.h", "libnccl.so")):
        inc = [d for d in (os.path.join(home, "include"), "/usr/include") if os.path.exists(os.path.join(d, header))]
        lib_dir = [d for d in (os.path.join(home, "lib64"), os.path.join(home, "lib"), "/usr/lib/x86_64-linux-gnu",
                               "/usr/lib/aarch64-linux-gnu") if os.path.exists(os.path.join(d, lib))]
        if not inc or not lib_dir:
            raise SystemExit("DISTMESH_NCCL=1: %s's %s or %s not found under %s (set %s)" % (
                what, header, lib, home, "CUDA_HOME" if what == "CUDA" else "NCCL_HOME"))
        incs += [d for d in inc[:1] if d not in incs]
        libs += [d for d in lib_dir[:1] if d not in libs]
    return incs, libs


def openssl_wanted():
    """DISTMESH_OPENSSL=1: required; 0: left out; unset: when <openssl/evp.h> is there."""
    want = os.environ.get("DISTMESH_OPENSSL", "")
    found = any(os.path.exists(os.path.join(d, "openssl", "evp.h")) for d in ("/usr/include", "/usr/local/include"))
    if want == "1" and not found:
        raise SystemExit("DISTMESH_OPENSSL=1: <openssl/evp.h> not found (Debian: apt-get install libssl-dev)")
    return want == "1" or (want != "0" and found)


if openssl_wanted():
    macros.append(("DISTMESH_OPENSSL", None))
    libraries.append("crypto")

if os.environ.get("DISTMESH_NCCL") == "1":
    nccl_inc, nccl_lib = nccl_paths()
    macros.append(("DISTMESH_NCCL", None))
    include_dirs += nccl_inc
    library_dirs += nccl_lib
    libraries += ["nccl", "cudart"]

# distmesh-startup.pth beside the package: its one line (distmesh/_startup.py's PTH_LINE) runs
# at every interpreter start and, only with DISTMESH_REPLACE_GLOO set, makes torch's "gloo"
# groups distmesh's (docs/python.md, "Running a Gloo program on distmesh").
_STARTUP = runpy.run_path(os.path.join(HERE, "distmesh", "_startup.py"))


class BuildPyWithStartup(build_py):
    def run(self):
        super().run()
        path = os.path.join(self.build_lib, _STARTUP["PTH_NAME"])
        with open(path, "w") as f:
            f.write(_STARTUP["PTH_LINE"])

    def get_outputs(self, include_bytecode=True):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, _STARTUP["PTH_NAME"])]


setup(
    name="distmesh",
    cmdclass={"build_py": BuildPyWithStartup},
    version=version(),
    description="Collective communication (all-reduce, all-gather, ...) for Python processes, "
                "over the distmesh C library; a torch.distributed backend",
    license="MIT",
    packages=["distmesh"],
    package_data={"distmesh": ["py.typed", "_C.pyi"]},    # PEP 561: the extension's stubs
    python_requires=">=3.8",
    ext_modules=[
        Extension(
            "distmesh._C",
            sources=SOURCES,
            include_dirs=include_dirs,
            define_macros=macros,
            library_dirs=library_dirs,
            runtime_library_dirs=library_dirs,
            libraries=libraries,
            extra_compile_args=flags,
            depends=sorted(glob.glob(os.path.join(ROOT, "distmesh*.h"))) + ["src/dmpy.h"],
        )
    ],
    zip_safe=False,
)
