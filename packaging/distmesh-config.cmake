# distmesh CMake package (header-only). find_package(distmesh [COMPONENTS tcp nccl]) gives
# INTERFACE targets; link one and every translation unit gets the include path and defines:
#   distmesh::distmesh   the core: headers, pthreads, libm (Fake backend, Mesh, env detection)
#   distmesh::store      + DISTMESH_STORE: the rendezvous store's client and file store, libc only
#                        (tcp and nccl have the store too; hosting its server needs tcp)
#   distmesh::tcp        + DISTMESH_TCP and libuv (pkg-config libuv, else libuv's own CMake
#                        package, else find_library(uv))
#   distmesh::nccl       + DISTMESH_NCCL, the CUDA runtime and NCCL (CUDAToolkit; NCCL from
#                        NCCL_HOME, CUDA's directories or the system ones)
# Define DISTMESH_IMPLEMENTATION in exactly one source file. Targets whose dependencies are
# missing are not created; asking for them as COMPONENTS makes find_package fail and say why.
cmake_policy(PUSH)
cmake_policy(VERSION 3.14)
get_filename_component(_dm_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
include(CMakeFindDependencyMacro)
find_dependency(Threads)

if(NOT TARGET distmesh::distmesh)
  add_library(distmesh::distmesh INTERFACE IMPORTED)
  set_target_properties(distmesh::distmesh PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${_dm_prefix}/include"
    INTERFACE_LINK_LIBRARIES "Threads::Threads;m")
endif()

# >>store: nothing beyond the core
if(NOT TARGET distmesh::store)
  add_library(distmesh::store INTERFACE IMPORTED)
  set_target_properties(distmesh::store PROPERTIES
    INTERFACE_COMPILE_DEFINITIONS "DISTMESH_STORE"
    INTERFACE_LINK_LIBRARIES "distmesh::distmesh")
endif()
set(distmesh_store_FOUND TRUE)

# >>tcp: libuv
if(NOT TARGET distmesh::tcp)
  set(_dm_uv "")
  find_package(PkgConfig QUIET)
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(_DM_LIBUV QUIET IMPORTED_TARGET GLOBAL libuv)
    if(_DM_LIBUV_FOUND)
      set(_dm_uv PkgConfig::_DM_LIBUV)
    endif()
  endif()
  if(NOT _dm_uv)
    find_package(libuv CONFIG QUIET)
    if(TARGET uv)
      set(_dm_uv uv)
    elseif(TARGET uv::uv)
      set(_dm_uv uv::uv)
    endif()
  endif()
  if(NOT _dm_uv)
    find_path(DISTMESH_UV_INCLUDE_DIR uv.h)
    find_library(DISTMESH_UV_LIBRARY uv)
    if(DISTMESH_UV_INCLUDE_DIR AND DISTMESH_UV_LIBRARY)
      add_library(distmesh::_uv INTERFACE IMPORTED)
      set_target_properties(distmesh::_uv PROPERTIES
        INTERFACE_INCLUDE_DIRECTORIES "${DISTMESH_UV_INCLUDE_DIR}"
        INTERFACE_LINK_LIBRARIES "${DISTMESH_UV_LIBRARY}")
      set(_dm_uv distmesh::_uv)
    endif()
  endif()
  if(_dm_uv)
    add_library(distmesh::tcp INTERFACE IMPORTED)
    set_target_properties(distmesh::tcp PROPERTIES
      INTERFACE_COMPILE_DEFINITIONS "DISTMESH_TCP"
      INTERFACE_LINK_LIBRARIES "distmesh::distmesh;${_dm_uv}")
    set(distmesh_tcp_FOUND TRUE)
  else()
    set(distmesh_tcp_FOUND FALSE)
    set(_dm_tcp_why "libuv not found (Debian: apt-get install libuv1-dev)")
  endif()
else()
  set(distmesh_tcp_FOUND TRUE)
endif()

# >>nccl: CUDA runtime + NCCL
if(NOT TARGET distmesh::nccl)
  set(distmesh_nccl_FOUND FALSE)
  set(_dm_nccl_why "CUDA toolkit not found (set CUDAToolkit_ROOT)")
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    set(_dm_nccl_why "NCCL not found (set NCCL_HOME)")
    find_path(DISTMESH_NCCL_INCLUDE_DIR nccl.h
      HINTS "$ENV{NCCL_HOME}/include" ${CUDAToolkit_INCLUDE_DIRS})
    find_library(DISTMESH_NCCL_LIBRARY nccl
      HINTS "$ENV{NCCL_HOME}/lib64" "$ENV{NCCL_HOME}/lib" ${CUDAToolkit_LIBRARY_DIR})
    if(DISTMESH_NCCL_INCLUDE_DIR AND DISTMESH_NCCL_LIBRARY)
      add_library(distmesh::nccl INTERFACE IMPORTED)
      set_target_properties(distmesh::nccl PROPERTIES
        INTERFACE_COMPILE_DEFINITIONS "DISTMESH_NCCL"
        INTERFACE_INCLUDE_DIRECTORIES "${DISTMESH_NCCL_INCLUDE_DIR}"
        INTERFACE_LINK_LIBRARIES "distmesh::distmesh;CUDA::cudart;${DISTMESH_NCCL_LIBRARY}")
      set(distmesh_nccl_FOUND TRUE)
    endif()
  endif()
else()
  set(distmesh_nccl_FOUND TRUE)
endif()

foreach(_dm_comp IN LISTS distmesh_FIND_COMPONENTS)
  if(NOT _dm_comp MATCHES "^(store|tcp|nccl)$")
    set(distmesh_FOUND FALSE)
    set(distmesh_NOT_FOUND_MESSAGE "unknown component \"${_dm_comp}\" (distmesh has store, tcp and nccl)")
  elseif(NOT distmesh_${_dm_comp}_FOUND AND distmesh_FIND_REQUIRED_${_dm_comp})
    set(distmesh_FOUND FALSE)
    set(distmesh_NOT_FOUND_MESSAGE "component ${_dm_comp}: ${_dm_${_dm_comp}_why}")
  endif()
endforeach()
unset(_dm_prefix)
cmake_policy(POP)
