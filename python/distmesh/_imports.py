"""Running code right after a module is imported, wherever the import comes from: the hook
DISTMESH_REPLACE_GLOO installs (distmesh._startup, on torch.distributed.distributed_c10d) and
distmesh.collective's registration with Optimus-DL's MeshCollective both wait for a module
this way. It imports nothing of distmesh, so both can use it without importing each other."""
import sys


class _AfterImport:
    """A finder at the front of sys.meta_path: wraps the loader of the module named `name` so
    that fn(module) runs right after the module executes; answers None at once for every other
    name."""

    def __init__(self, name, fn):
        self.name, self.fn = name, fn

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        import importlib.machinery
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run, fn = spec.loader.exec_module, self.fn

        def exec_module(module):
            run(module)
            fn(module)
        spec.loader.exec_module = exec_module
        return spec


def after_import(name, fn):
    """fn(module) once the module named `name` has executed: now, if it has, else right after
    it does (the first import, wherever it comes from)."""
    if name in sys.modules:
        fn(sys.modules[name])
    elif not any(isinstance(f, _AfterImport) and f.name == name and f.fn is fn for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, fn))
