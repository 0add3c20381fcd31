"""DISTMESH_REPLACE_GLOO=1: a program that hard-codes torch.distributed's "gloo" backend runs
on "distmesh", with no change to its code (docs/python.md, "Running a Gloo program on
distmesh").

The package installs distmesh-startup.pth beside itself; Python's site module runs its one line
at every interpreter start. That line reads the variable and, only when it is set to anything
but "" or "0", imports this module and calls install(); unset, it costs one dictionary lookup
and imports nothing.

install() waits for torch.distributed.distributed_c10d to be imported (a finder at the front
of sys.meta_path; at once if it already is) and wraps its _new_process_group_helper, the one
function every group goes through: init_process_group, new_group, and the groups of
init_device_mesh / DeviceMesh (their backend_override included). The wrapper imports
distmesh.torch (which registers the backend) at the first group and hands torch "distmesh"
wherever the program asked for "gloo" ("gloo", or "cpu:gloo" in a device map such as
"cpu:gloo,cuda:nccl"). Nothing else changes: the groups are distmesh's, so
dist.get_backend() answers "distmesh", and only CPU tensors are taken (as Gloo on CPU); other
backends (NCCL, "undefined" when init_process_group gets no backend) are left alone."""
ENV = "DISTMESH_REPLACE_GLOO"
_C10D = "torch.distributed.distributed_c10d"

# The .pth file's line (setup.py writes it); kept here so the tests check the shipped text.
PTH_NAME = "distmesh-startup.pth"
PTH_LINE = ("import os; os.environ.get(%r, '0') not in ('', '0') and __import__('distmesh._startup', "
            "fromlist=['install']).install()\n" % ENV)


def replace_gloo(backend):
    """The backend torch gets: "distmesh" for "gloo", "cpu:distmesh" in a device map."""
    if not isinstance(backend, str):
        return backend
    if backend.lower() == "gloo":
        return "distmesh"
    if ":" in backend:
        parts = [p.split(":", 1) for p in backend.split(",")]
        if all(len(p) == 2 for p in parts):
            return ",".join("%s:%s" % (d, "distmesh" if b.strip().lower() == "gloo" else b) for d, b in parts)
    return backend


def _patch(c10d):
    helper = c10d._new_process_group_helper
    if getattr(helper, "_distmesh_replaces_gloo", False):
        return

    def _new_process_group_helper(group_size, group_rank, global_ranks_in_group, backend, *args, **kwargs):
        swapped = replace_gloo(backend)
        if swapped is not backend:
            import distmesh.torch  # noqa: F401  (registers "distmesh"; torch.distributed is imported by now)
        return helper(group_size, group_rank, global_ranks_in_group, swapped, *args, **kwargs)
    _new_process_group_helper._distmesh_replaces_gloo = True
    _new_process_group_helper.__wrapped__ = helper
    c10d._new_process_group_helper = _new_process_group_helper


def install():
    """Makes every "gloo" group torch creates from now on a "distmesh" one (see the module)."""
    from distmesh._imports import after_import  # absolute: setup.py runs this file outside the package
    after_import(_C10D, _patch)
