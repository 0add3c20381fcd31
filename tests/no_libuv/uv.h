/* Put first on the include path of a build that must not use libuv (tests/store.mk,
   tests/nccl_standin.mk, tests/coretests.mk): any include of uv.h stops it here. */
#error "uv.h included in a build without DISTMESH_TCP: only the store's server may use libuv"
