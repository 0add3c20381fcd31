#define DISTMESH_IMPLEMENTATION
#include "distmesh.h"
