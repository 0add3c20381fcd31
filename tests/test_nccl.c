/* NCCL backend tests. Without a GPU every test reports a cmocka skip ("no GPU"); `make test-gpu`
   on a GPU machine runs them: world-1 collectives for every dtype and op, split, mesh, object
   collectives through host staging, host pointers refused, and the timeout paths (an init whose
   second rank never arrives, through the store and through a caller-provided unique id), and
   CUDA device buffers on the TCP backend with 4 processes sharing the one GPU. */
#define _GNU_SOURCE  /* mkdtemp, usleep, kill under -std=c11 */
#include "distmesh.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include "test_filter.h"

/* Asserts DM_OK and shows the collective's last error when it is not. */
#define CHECK_OK(c, expr) do { dm_status s_ = (expr);                                           \
        if (s_ != DM_OK) fail_msg("%s -> %s: %s", #expr, dm_status_name(s_), dm_last_error(c)); \
    } while (0)

static int gpu_present(void) { return dm_device_count() > 0; }
#define NEED_GPU() do { if (!gpu_present()) { printf("skipped: no GPU\n"); skip(); } } while (0)

static dm_collective* world1(void) {
    dm_nccl_desc d;
    dm_collective* c = NULL;
    unsigned char id[DM_NCCL_UNIQUE_ID_BYTES];
    memset(&d, 0, sizeof(d));
    assert_int_equal(ncclGetUniqueId((ncclUniqueId*)(void*)id), ncclSuccess);
    d.rank = 0;
    d.world_size = 1;
    d.unique_id = id;
    d.timeout_ms = 30000;
    assert_int_equal(dm_nccl_create(&d, &c), DM_OK);
    return c;
}

/* Device buffer holding the host values. */
static void* to_device(const void* host, size_t bytes) {
    void* p = NULL;
    assert_int_equal(cudaMalloc(&p, bytes ? bytes : 1), cudaSuccess);
    assert_int_equal(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    return p;
}
static void from_device(void* host, const void* dev, size_t bytes) {
    assert_int_equal(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
}

/* World 1: every collective leaves the data as it is (MEAN divides by 1), for every dtype. */
static void test_nccl_world1_every_dtype_and_op(void** state) {
    dm_collective* c;
    int t, op;
    (void)state;
    NEED_GPU();
    c = world1();
    assert_string_equal(dm_backend_name(c), "nccl");
    assert_int_equal(dm_default_device(c).type, DM_DEVICE_CUDA);
    assert_non_null(dm_native_handle(c));
    for (t = 0; t < DM_DTYPE_COUNT; t++) {
        size_t es = dm_dtype_size((dm_dtype)t), n = 1000, bytes = es * n, i;
        unsigned char* host = (unsigned char*)malloc(bytes);
        unsigned char* back = (unsigned char*)malloc(bytes);
        void *dsend, *drecv;
        for (i = 0; i < bytes; i++) host[i] = (unsigned char)(i % 61 + 1); /* finite in every float type */
        if (t == DM_FLOAT16 || t == DM_BFLOAT16)
            for (i = 0; i < n; i++) ((uint16_t*)host)[i] = t == DM_FLOAT16 ? dm_float_to_half((float)(i % 7)) : dm_float_to_bfloat16((float)(i % 7));
        dsend = to_device(host, bytes);
        drecv = to_device(host, bytes);
        for (op = 0; op < DM_REDUCE_OP_COUNT; op++) {
            assert_int_equal(cudaMemset(drecv, 0, bytes), cudaSuccess);
            assert_int_equal(dm_all_reduce(c, dsend, drecv, n, (dm_dtype)t, (dm_reduce_op)op), DM_OK);
            assert_int_equal(dm_synchronize(c), DM_OK);
            from_device(back, drecv, bytes);
            assert_memory_equal(back, host, bytes);
            assert_int_equal(dm_reduce_scatter(c, dsend, drecv, n, (dm_dtype)t, (dm_reduce_op)op), DM_OK);
            assert_int_equal(dm_synchronize(c), DM_OK);
            from_device(back, drecv, bytes);
            assert_memory_equal(back, host, bytes);
        }
        assert_int_equal(cudaMemset(drecv, 0, bytes), cudaSuccess);
        assert_int_equal(dm_all_gather(c, dsend, drecv, n, (dm_dtype)t), DM_OK);
        assert_int_equal(dm_broadcast(c, drecv, n, (dm_dtype)t, 0), DM_OK);
        assert_int_equal(dm_synchronize(c), DM_OK);
        from_device(back, drecv, bytes);
        assert_memory_equal(back, host, bytes);
        cudaFree(dsend);
        cudaFree(drecv);
        free(host);
        free(back);
    }
    assert_int_equal(dm_barrier(c), DM_OK);
    dm_destroy(c);
}

static void test_nccl_host_pointer_is_invalid_arg(void** state) {
    dm_collective* c;
    float host[4] = { 1, 2, 3, 4 };
    (void)state;
    NEED_GPU();
    c = world1();
    assert_int_equal(dm_all_reduce(c, NULL, host, 4, DM_FLOAT32, DM_SUM), DM_ERR_INVALID_ARG);
    assert_non_null(strstr(dm_last_error(c), "host memory"));
    assert_int_equal(dm_reduce_scatter(c, host, host, 4, DM_FLOAT32, DM_SUM), DM_ERR_INVALID_ARG);
    /* the communicator is still fine afterwards */
    assert_int_equal(dm_barrier(c), DM_OK);
    dm_destroy(c);
}

/* Data movement on host buffers is staged, so objects and the node-local group work. */
static void test_nccl_host_staged_objects_local_split_mesh(void** state) {
    dm_collective *c, *s = NULL, *none = NULL, *local;
    dm_blob_list objs;
    dm_blob in[2];
    dm_mesh* m = NULL;
    int v[3] = { 7, 8, 9 }, got[3] = { 0, 0, 0 };
    (void)state;
    NEED_GPU();
    c = world1();
    CHECK_OK(c, dm_all_gather(c, v, got, 3, DM_INT32));
    assert_memory_equal(v, got, sizeof(v));
    CHECK_OK(c, dm_all_gather_objects(c, "hello", 6, &objs));
    assert_int_equal(objs.count, 1);
    assert_string_equal((const char*)objs.items[0].data, "hello");
    dm_blob_list_free(c, &objs);
    in[0].data = "a"; in[0].size = 2; in[1].data = "bcd"; in[1].size = 4;
    CHECK_OK(c, dm_broadcast_objects(c, in, 2, 0, &objs));
    assert_int_equal(objs.count, 2);
    assert_string_equal((const char*)objs.items[1].data, "bcd");
    dm_blob_list_free(c, &objs);
    local = dm_local(c);
    assert_non_null(local);
    assert_int_equal(dm_world_size(local), 1);
    CHECK_OK(c, dm_split(c, 5, 0, &s));
    assert_non_null(s);
    assert_int_equal(dm_world_size(s), 1);
    CHECK_OK(s, dm_barrier(s));
    CHECK_OK(c, dm_split(c, DM_SPLIT_NONE, 0, &none));
    assert_null(none);
    CHECK_OK(c, dm_mesh_create_dp_tp(c, 1, &m));
    assert_int_equal(dm_mesh_tp_world_size(m), 1);
    CHECK_OK(c, dm_barrier(dm_mesh_tp_world(m)));
    dm_mesh_destroy(m);
    dm_destroy(s);
    dm_destroy(c);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A 2-rank communicator whose second rank never arrives: init returns DM_ERR_TIMEOUT near the
   deadline (ncclCommAbort inside), in a child process that must exit on its own. */
static int init_alone(int via_store, const char* dir) {
    dm_nccl_desc d;
    dm_collective* c = NULL;
    unsigned char id[DM_NCCL_UNIQUE_ID_BYTES];
    char url[300];
    dm_status st;
    double t0;
    memset(&d, 0, sizeof(d));
    d.rank = 0;
    d.world_size = 2;
    d.timeout_ms = 3000;
    if (via_store) {
        snprintf(url, sizeof(url), "file://%s", dir);
        d.store_url = url;
    } else {
        if (ncclGetUniqueId((ncclUniqueId*)(void*)id) != ncclSuccess) return 10;
        d.unique_id = id;
    }
    t0 = now_s();
    st = dm_nccl_create(&d, &c);
    printf("init alone (%s): %s after %.2f s\n", via_store ? "store" : "unique id", dm_status_name(st), now_s() - t0);
    if (st != DM_ERR_TIMEOUT || c) return 11;
    if (now_s() - t0 > 3.0 + 5.0) return 12;
    return 0;
}
/* The child is a fresh exec of this program: CUDA state does not survive fork(), and the parent
   has already initialised CUDA. */
static void run_child_alone(int via_store) {
    char dir[] = "/tmp/dm_nccl_XXXXXX";
    pid_t p;
    int status = 0, waited = 0;
    assert_non_null(mkdtemp(dir));
    fflush(stdout);
    p = fork();
    if (p == 0) {
        execl("/proc/self/exe", "test_nccl", "--init-alone", via_store ? "store" : "id", dir, (char*)NULL);
        _exit(127);
    }
    while (waitpid(p, &status, WNOHANG) == 0 && waited < 300) { usleep(100000); waited++; }
    if (waited >= 300) { kill(p, SIGKILL); waitpid(p, &status, 0); fail_msg("%s", "child still running after 30 s"); }
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    { char cmd[64]; snprintf(cmd, sizeof(cmd), "rm -rf %s", dir); assert_int_equal(system(cmd), 0); }
}
static void test_nccl_init_timeout_unique_id(void** state) { (void)state; NEED_GPU(); run_child_alone(0); }
static void test_nccl_init_timeout_store(void** state) { (void)state; NEED_GPU(); run_child_alone(1); }


/* ---- CUDA device buffers on the TCP backend: 4 processes sharing one GPU ------------------ */
static float tc_value(int rank, size_t i) { return (float)((rank * 7 + (int)(i % 13)) % 16); }

/* One rank: all_reduce of device buffers 8 B .. 256 MiB (in place and out of place), and
   all_gather / reduce_scatter / broadcast on device memory, checked on the host. */
static int tcp_cuda_rank(int rank, int world, const char* dir) {
    static const size_t sizes[] = { 8, 4096, (1u << 20) + 4, (size_t)64 << 20, (size_t)256 << 20 };
    dm_tcp_desc d;
    dm_collective* c = NULL;
    char url[300];
    size_t k, i, maxn = ((size_t)256 << 20) / 4;
    float *h = (float*)malloc(maxn * 4), *dev = NULL, *dev2 = NULL;
    int r, bad = 0;
    memset(&d, 0, sizeof(d));
    snprintf(url, sizeof(url), "file://%s", dir);
    d.rank = rank; d.world_size = world; d.store_url = url; d.ifname = "lo"; d.timeout_ms = 60000;
    if (!h || dm_tcp_create(&d, &c) != DM_OK) return 20;
    if (cudaMalloc((void**)&dev, maxn * 4) != cudaSuccess || cudaMalloc((void**)&dev2, maxn * 4) != cudaSuccess) return 21;
    for (k = 0; k < sizeof(sizes) / sizeof(sizes[0]) && !bad; k++) {
        size_t n = sizes[k] / 4;
        int inplace;
        for (inplace = 0; inplace < 2 && !bad; inplace++) {
            for (i = 0; i < n; i++) h[i] = tc_value(rank, i);
            cudaMemcpy(dev, h, n * 4, cudaMemcpyHostToDevice);
            if (dm_all_reduce(c, inplace ? NULL : dev, inplace ? dev : dev2, n, DM_FLOAT32, DM_SUM) != DM_OK) {
                fprintf(stderr, "rank %d: %s\n", rank, dm_last_error(c));
                return 22;
            }
            cudaMemcpy(h, inplace ? dev : dev2, n * 4, cudaMemcpyDeviceToHost);
            for (i = 0; i < n && !bad; i++) {
                float want = 0;
                for (r = 0; r < world; r++) want += tc_value(r, i);
                if (h[i] != want) { fprintf(stderr, "rank %d: all_reduce %zu B element %zu: %g != %g\n", rank, sizes[k], i, h[i], want); bad = 23; }
            }
        }
        if (rank == 0 && !bad) printf("tcp+cuda all_reduce of %zu B device buffers on %d ranks: correct\n", sizes[k], world);
    }
    {   /* the other collectives on device memory, 1 MiB + 4 per rank */
        size_t n = ((1u << 20) + 4) / 4;
        for (i = 0; i < n; i++) h[i] = tc_value(rank, i);
        cudaMemcpy(dev, h, n * 4, cudaMemcpyHostToDevice);
        if (!bad && dm_all_gather(c, dev, dev2, n, DM_FLOAT32) != DM_OK) bad = 24;
        cudaMemcpy(h, dev2, n * 4 * (size_t)world, cudaMemcpyDeviceToHost);
        for (r = 0; r < world && !bad; r++)
            for (i = 0; i < n && !bad; i++) if (h[(size_t)r * n + i] != tc_value(r, i)) bad = 25;
        for (r = 0; r < world; r++) for (i = 0; i < n; i++) h[(size_t)r * n + i] = tc_value(rank, (size_t)r * n + i);
        cudaMemcpy(dev, h, n * 4 * (size_t)world, cudaMemcpyHostToDevice);
        if (!bad && dm_reduce_scatter(c, dev, dev2, n, DM_FLOAT32, DM_SUM) != DM_OK) bad = 26;
        cudaMemcpy(h, dev2, n * 4, cudaMemcpyDeviceToHost);
        for (i = 0; i < n && !bad; i++) {
            float want = 0;
            for (r = 0; r < world; r++) want += tc_value(r, (size_t)rank * n + i);
            if (h[i] != want) bad = 27;
        }
        for (i = 0; i < n; i++) h[i] = rank == 1 ? tc_value(1, i) : -1.0f;
        cudaMemcpy(dev, h, n * 4, cudaMemcpyHostToDevice);
        if (!bad && dm_broadcast(c, dev, n, DM_FLOAT32, 1) != DM_OK) bad = 28;
        cudaMemcpy(h, dev, n * 4, cudaMemcpyDeviceToHost);
        for (i = 0; i < n && !bad; i++) if (h[i] != tc_value(1, i)) bad = 29;
        if (rank == 0 && !bad) printf("tcp+cuda all_gather, reduce_scatter, broadcast of device buffers: correct\n");
    }
    if (bad) fprintf(stderr, "rank %d: failure %d (%s)\n", rank, bad, dm_last_error(c));
    cudaFree(dev);
    cudaFree(dev2);
    free(h);
    dm_destroy(c);
    return bad;
}

static void test_tcp_cuda_four_processes_one_gpu(void** state) {
    char dir[] = "/tmp/dm_tcpcuda_XXXXXX", rank_s[16];
    pid_t pids[4];
    int r, status, failed = 0, waited = 0, alive = 4;
    (void)state;
    NEED_GPU();
    assert_non_null(mkdtemp(dir));
    fflush(stdout);
    for (r = 0; r < 4; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            snprintf(rank_s, sizeof(rank_s), "%d", r);
            execl("/proc/self/exe", "test_nccl", "--tcp-cuda", rank_s, dir, (char*)NULL);
            _exit(127);
        }
    }
    while (alive > 0 && waited < 1800) {
        pid_t p = waitpid(-1, &status, WNOHANG);
        if (p > 0) { alive--; if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = 1; continue; }
        usleep(100000);
        waited++;
    }
    if (alive > 0) { for (r = 0; r < 4; r++) kill(pids[r], SIGKILL); while (waitpid(-1, NULL, 0) > 0) {} failed = 1; }
    { char cmd[64]; snprintf(cmd, sizeof(cmd), "rm -rf %s", dir); assert_int_equal(system(cmd), 0); }
    assert_int_equal(failed, 0);
}

int main(int argc, char** argv) {
    if (argc == 4 && strcmp(argv[1], "--tcp-cuda") == 0) {
        int rc = tcp_cuda_rank(atoi(argv[2]), 4, argv[3]);
        fflush(NULL);
        return rc;
    }
    if (argc == 4 && strcmp(argv[1], "--init-alone") == 0) {
        int rc = init_alone(strcmp(argv[2], "store") == 0, argv[3]);
        fflush(NULL);
        return rc;
    }
    {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nccl_world1_every_dtype_and_op),
        cmocka_unit_test(test_nccl_host_pointer_is_invalid_arg),
        cmocka_unit_test(test_nccl_host_staged_objects_local_split_mesh),
        cmocka_unit_test(test_nccl_init_timeout_unique_id),
        cmocka_unit_test(test_nccl_init_timeout_store),
        cmocka_unit_test(test_tcp_cuda_four_processes_one_gpu),
    };
    dm_test_filter(argc, argv);
    return cmocka_run_group_tests(tests, NULL, NULL);
    }
}
