"""A program that hard-codes torch.distributed's "gloo" backend, as Optimus-DL's MeshCollective
and LLaMA-Factory's helper do on CPU, and never names distmesh: test_torch2.py runs it (2 ranks,
RANK and WORLD_SIZE set; argv: a scenario word, ignored, and the init method) with and without
DISTMESH_REPLACE_GLOO=1 and reads its RESULT line. The package's distmesh-startup.pth is read
in site directories only and the tests load the package from its build folder through
PYTHONPATH, so this adds that folder as a site directory first, as an installed package's is."""
import importlib.util
import json
import os
import site
import sys

spec = importlib.util.find_spec("distmesh")         # found, not imported
site.addsitedir(os.path.dirname(os.path.dirname(spec.origin)))
out = {"distmesh_imported_at_start": "distmesh" in sys.modules}

import torch                                        # noqa: E402
import torch.distributed as dist                    # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", init_method=sys.argv[2], rank=RANK, world_size=WORLD)
group = dist.new_group(list(range(WORLD)), backend="gloo")
mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("dp",))
override = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("x",), backend_override={"x": "gloo"})
sums = []
for g in (None, group, mesh.get_group(), override.get_group()):
    t = torch.tensor([float(RANK + 1)])
    dist.all_reduce(t, group=g)
    sums.append(t.item())
out["backends"] = [dist.get_backend(), dist.get_backend(group), dist.get_backend(mesh.get_group()),
                   dist.get_backend(override.get_group())]
out["sums"] = sums
out["distmesh_imported"] = "distmesh.torch" in sys.modules
dist.barrier()                                      # Gloo: no rank tears down while a peer still talks
dist.destroy_process_group()
sys.stdout.write("RESULT %s\n" % json.dumps(out))
sys.stdout.flush()
