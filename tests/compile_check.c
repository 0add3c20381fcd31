/* Compile check, one source built as C11 (gcc, clang: -Wall -Wextra -Wpedantic -Werror) and as
   C++11 (g++ -x c++, clang++: -Wall -Wextra -Werror): the header with
   DISTMESH_IMPLEMENTATION first in the TU (as distmesh.h asks: its POSIX feature macro must precede
   every system header), a stray second plain include that must emit nothing, and
   the address of every public function taken so a declaration without a definition fails to
   link. Backends follow the -D flags of the build rule (tests/coretests.mk): none, DISTMESH_TCP,
   DISTMESH_STORE alone (the store without libuv), or DISTMESH_TCP with DISTMESH_NO_TRACE (no
   flight recorder). */
#define DISTMESH_IMPLEMENTATION
#include "distmesh.h"
#include "distmesh.h" /* a stray second include emits nothing */
#ifdef __cplusplus
#include <cstdio>
#include <vector>
#define FN(f) reinterpret_cast<any_fn>(f),
#else
#include <stdio.h>
#define FN(f) (any_fn)(f),
#endif

typedef void (*any_fn)(void);
static const any_fn public_functions[] = {
    FN(dm_status_name) FN(dm_strerror) FN(dm_dtype_size) FN(dm_dtype_name) FN(dm_reduce_op_name)
    FN(dm_float_to_half) FN(dm_half_to_float) FN(dm_float_to_bfloat16) FN(dm_bfloat16_to_float)
    FN(dm_reduce_local) FN(dm_divide_local) FN(dm_log_stderr) FN(dm_check_failed) FN(dm_env_detect) FN(dm_device_count)
    FN(dm_fake_create) FN(dm_thread_world_create) FN(dm_thread_world_run) FN(dm_init) FN(dm_destroy)
    FN(dm_rank) FN(dm_world_size) FN(dm_local_rank) FN(dm_local_world_size) FN(dm_is_master)
    FN(dm_is_local_master) FN(dm_default_device) FN(dm_backend_name) FN(dm_native_handle)
    FN(dm_last_error) FN(dm_sequence) FN(dm_set_timeout) FN(dm_flight_recorder_dump) FN(dm_barrier) FN(dm_all_reduce)
    FN(dm_all_gather) FN(dm_all_gather_to_list) FN(dm_reduce_scatter) FN(dm_broadcast)
    FN(dm_all_gather_objects) FN(dm_broadcast_objects) FN(dm_blob_list_free) FN(dm_synchronize)
    FN(dm_split) FN(dm_local) FN(dm_main_process_first_begin) FN(dm_main_process_first_end)
    FN(dm_send) FN(dm_recv) FN(dm_recv_any) FN(dm_send_async) FN(dm_recv_async) FN(dm_recv_any_async)
    FN(dm_mesh_create) FN(dm_mesh_create_dp_tp) FN(dm_mesh_destroy) FN(dm_mesh_ndims)
    FN(dm_mesh_dim_name) FN(dm_mesh_dim_index) FN(dm_mesh_rank) FN(dm_mesh_size) FN(dm_mesh_group)
    FN(dm_mesh_world) FN(dm_mesh_last_error) FN(dm_mesh_dp_rank) FN(dm_mesh_dp_world_size)
    FN(dm_mesh_tp_rank) FN(dm_mesh_tp_world_size) FN(dm_mesh_tp_world) FN(dm_strategy_create)
    FN(dm_strategy_destroy) FN(dm_dim_name) FN(dm_strategy_size) FN(dm_strategy_rank)
    FN(dm_strategy_group) FN(dm_strategy_model_mesh) FN(dm_strategy_data_mesh)
    FN(dm_strategy_validate) FN(dm_strategy_last_error) FN(dm_sha256_init) FN(dm_sha256_update)
    FN(dm_sha256_final) FN(dm_sha256) FN(dm_hmac_sha256)
#if defined(DISTMESH_STORE_H)   /* with DISTMESH_TCP, DISTMESH_NCCL or DISTMESH_STORE */
    FN(dm_store_create) FN(dm_store_clone_prefixed) FN(dm_store_destroy) FN(dm_store_set) FN(dm_store_get)
    FN(dm_store_free) FN(dm_store_wait) FN(dm_store_add) FN(dm_store_compare_set) FN(dm_store_delete)
    FN(dm_store_check) FN(dm_store_num_keys) FN(dm_store_last_error) FN(dm_store_port) FN(dm_store_append)
    FN(dm_store_multi_set) FN(dm_store_multi_get)
#endif
};
#undef FN

int main(void) {
#ifdef __cplusplus
    dm_fake_desc desc = {};             /* zero is a working config */
    dm_collective* c = nullptr;
    std::vector<float> x(2, 1.0f);
#else
    dm_fake_desc desc = {0};            /* zero is a working config */
    dm_collective* c = NULL;
    float x[2] = { 1.0f, 2.0f };
#endif
    size_t i;
    dm_status st;
    for (i = 0; i < sizeof(public_functions) / sizeof(public_functions[0]); i++)
        if (!public_functions[i]) return 1;
    st = dm_fake_create(&desc, &c);
#ifdef __cplusplus
    if (st == DM_OK) st = dm_all_reduce(c, nullptr, x.data(), x.size(), DM_FLOAT32, DM_SUM);
    if (st != DM_OK) std::printf("%s: %s\n", dm_status_name(st), dm_last_error(c));
#else
    if (st == DM_OK) st = dm_all_reduce(c, NULL, x, 2, DM_FLOAT32, DM_SUM);
    if (st != DM_OK) printf("%s: %s\n", dm_status_name(st), dm_last_error(c));
#endif
    dm_destroy(c);
    return st == DM_OK ? 0 : 1;
}
