/* The one translation unit of the tests that emits distmesh's implementation. Backends follow
   the -D flags of the build (DISTMESH_TCP, DISTMESH_NCCL). */
#define DISTMESH_IMPLEMENTATION
#include "distmesh.h"
