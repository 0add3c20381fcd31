/* The one translation unit of the extension that emits distmesh's implementation (the module
   itself includes Python.h first, which the implementation cannot follow). DISTMESH_TCP (and
   DISTMESH_NCCL in an NCCL build) come from setup.py, as for every other file. */
#define DISTMESH_IMPLEMENTATION
#include "distmesh.h"
