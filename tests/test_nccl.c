/* NCCL backend tests. Without a GPU every test reports a cmocka skip ("no GPU"); `make test-gpu`
   on a GPU machine runs them: world-1 collectives for every dtype and op, split, mesh, object
   collectives through host staging, host pointers refused, and the timeout paths (an init whose
   second rank never arrives, through the store and through a caller-provided unique id),
   reduce / gather / scatter / all_to_all(_v) / all_gather_to_list and _async requests on one
   GPU (a request behind blocked stream work: dm_test does not block, the deadline aborts),
   the same with send/recv on two ranks where there are two GPUs, and CUDA device buffers on
   the TCP backend with 4 processes sharing the one GPU. */
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
#include "test_world.h"

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

/* Runs this program again as `test_nccl flag <arg, or the child's index> dir` (CUDA state does
   not survive fork, and the parent has already initialised CUDA) in n children
   (tests/test_world.h); all must exit 0 within limit_s, what is left is killed. Returns how
   many failed, each named on stdout. */
typedef struct self_args { const char *flag, *arg, *dir; } self_args;
static int exec_self(int index, void* ctx) {
    const self_args* a = (const self_args*)ctx;
    char idx[16];
    snprintf(idx, sizeof(idx), "%d", index);
    execl("/proc/self/exe", "test_nccl", a->flag, a->arg ? a->arg : idx, a->dir, (char*)NULL);
    return 127;
}
static int run_self(const char* flag, const char* arg, int n, const char* dir, double limit_s) {
    self_args a;
    tw_world p;
    int failed, r;
    a.flag = flag;
    a.arg = arg;
    a.dir = dir;
    memset(&p, 0, sizeof(p));
    p.alarm_s = (int)limit_s + 5;
    p.quick_exit = true;
    failed = tw_fork(&p, n, exec_self, &a) != 0;
    failed += tw_reap(&p, limit_s);
    for (r = 0; r < p.n; r++)
        if (tw_exit_code(&p, r) != 0) printf("child %d: exit code %d\n", r, tw_exit_code(&p, r));
    return failed;
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
    t0 = tw_now_s();
    st = dm_nccl_create(&d, &c);
    printf("init alone (%s): %s after %.2f s\n", via_store ? "store" : "unique id", dm_status_name(st), tw_now_s() - t0);
    if (st != DM_ERR_TIMEOUT || c) return 11;
    if (tw_now_s() - t0 > 3.0 + 5.0) return 12;
    return 0;
}
/* The child is a fresh exec of this program (run_self). */
static void run_child_alone(int via_store) {
    char dir[] = "/tmp/dm_nccl_XXXXXX";
    assert_non_null(mkdtemp(dir));
    assert_int_equal(run_self("--init-alone", via_store ? "store" : "id", 1, dir, 30), 0);
    { char cmd[64]; snprintf(cmd, sizeof(cmd), "rm -rf %s", dir); assert_int_equal(system(cmd), 0); }
}
static void test_nccl_init_timeout_unique_id(void** state) { (void)state; NEED_GPU(); run_child_alone(0); }
static void test_nccl_init_timeout_store(void** state) { (void)state; NEED_GPU(); run_child_alone(1); }

/* ---- rooted collectives, all-to-all, point-to-point, requests (vtable v3) ----------------- */
static float fval(int rank, size_t i) { return (float)(rank * 1000 + (int)(i % 997)); }
static float* dev_floats(size_t n, int rank) {     /* device buffer of fval(rank, 0..n-1) */
    float* h = (float*)malloc(n * sizeof(float));
    void* d;
    size_t i;
    assert_non_null(h);
    for (i = 0; i < n; i++) h[i] = fval(rank, i);
    d = to_device(h, n * sizeof(float));
    free(h);
    return (float*)d;
}
static void dev_fill(float* d, size_t n, float v) {
    float* h = (float*)malloc(n * sizeof(float));
    size_t i;
    assert_non_null(h);
    for (i = 0; i < n; i++) h[i] = v;
    assert_int_equal(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    free(h);
}
/* Element i of device buffer d. */
static float dev_at(const float* d, size_t i) {
    float v = 0;
    from_device(&v, d + i, sizeof(float));
    return v;
}

/* World 1: reduce (every op, in and out of place), gather, scatter, all_to_all(_v) and
   all_gather_to_list leave the data where the documented layout puts it; host pointers are
   refused; the communicator stays usable. */
static void test_nccl_rooted_all_to_all_world1(void** state) {
    enum { N = 256 };
    dm_collective* c;
    float *src, *dst, *list_dev, host_list[N];
    void* recvs[1];
    size_t sc[1] = { 5 }, so[1] = { 3 }, rc[1] = { 5 }, ro[1] = { 10 }, bad[1] = { 4 }, zero[1] = { 0 };
    float host[N];
    int op;
    size_t i;
    (void)state;
    NEED_GPU();
    c = world1();
    src = dev_floats(N, 0);
    assert_int_equal(cudaMalloc((void**)&dst, N * sizeof(float)), cudaSuccess);
    for (op = 0; op < DM_REDUCE_OP_COUNT; op++) {
        dev_fill(dst, N, -1.0f);
        CHECK_OK(c, dm_reduce(c, src, dst, N, DM_FLOAT32, (dm_reduce_op)op, 0));
        CHECK_OK(c, dm_synchronize(c));
        for (i = 0; i < N; i += 17) assert_true(dev_at(dst, i) == fval(0, i));
        CHECK_OK(c, dm_reduce(c, NULL, dst, N, DM_FLOAT32, (dm_reduce_op)op, 0));   /* in place */
        CHECK_OK(c, dm_synchronize(c));
        assert_true(dev_at(dst, N - 1) == fval(0, N - 1));
    }
    dev_fill(dst, N, -1.0f);
    CHECK_OK(c, dm_gather(c, src, dst, N, DM_FLOAT32, 0));
    CHECK_OK(c, dm_synchronize(c));
    assert_true(dev_at(dst, 7) == fval(0, 7));
    CHECK_OK(c, dm_gather(c, NULL, dst, N, DM_FLOAT32, 0));    /* in place */
    dev_fill(dst, N, -1.0f);
    CHECK_OK(c, dm_scatter(c, src, dst, N, DM_FLOAT32, 0));
    CHECK_OK(c, dm_synchronize(c));
    assert_true(dev_at(dst, N - 2) == fval(0, N - 2));
    CHECK_OK(c, dm_scatter(c, src, NULL, N, DM_FLOAT32, 0));   /* in place */
    dev_fill(dst, N, -1.0f);
    CHECK_OK(c, dm_all_to_all(c, src, dst, N, DM_FLOAT32));
    CHECK_OK(c, dm_synchronize(c));
    assert_true(dev_at(dst, 100) == fval(0, 100));
    CHECK_OK(c, dm_all_to_all(c, NULL, dst, N, DM_FLOAT32));   /* in place, through scratch */
    CHECK_OK(c, dm_synchronize(c));
    assert_true(dev_at(dst, 100) == fval(0, 100));
    /* all_to_all_v: 5 elements from src + 3 to dst + 10, nothing else written */
    dev_fill(dst, N, -1.0f);
    CHECK_OK(c, dm_all_to_all_v(c, src, sc, so, dst, rc, ro, DM_FLOAT32));
    CHECK_OK(c, dm_synchronize(c));
    assert_true(dev_at(dst, 9) == -1.0f);
    for (i = 0; i < 5; i++) assert_true(dev_at(dst, 10 + i) == fval(0, 3 + i));
    assert_true(dev_at(dst, 15) == -1.0f);
    /* in place: dst[3..8) goes to dst[10..15) */
    assert_int_equal(cudaMemcpy(dst, src, N * sizeof(float), cudaMemcpyDeviceToDevice), cudaSuccess);
    CHECK_OK(c, dm_all_to_all_v(c, NULL, sc, so, dst, rc, ro, DM_FLOAT32));
    CHECK_OK(c, dm_synchronize(c));
    for (i = 0; i < 5; i++) assert_true(dev_at(dst, 10 + i) == fval(0, 3 + i));
    assert_int_equal(dm_all_to_all_v(c, src, sc, so, dst, bad, ro, DM_FLOAT32), DM_ERR_MISMATCH);
    CHECK_OK(c, dm_all_to_all_v(c, src, zero, so, dst, zero, ro, DM_FLOAT32));
    /* all_gather_to_list: a device and a host destination */
    assert_int_equal(cudaMalloc((void**)&list_dev, N * sizeof(float)), cudaSuccess);
    recvs[0] = list_dev;
    CHECK_OK(c, dm_all_gather_to_list(c, src, (void* const*)recvs, N, DM_FLOAT32));
    CHECK_OK(c, dm_synchronize(c));
    assert_true(dev_at(list_dev, 50) == fval(0, 50));
    memset(host_list, 0, sizeof(host_list));
    recvs[0] = host_list;
    CHECK_OK(c, dm_all_gather_to_list(c, src, (void* const*)recvs, N, DM_FLOAT32));
    assert_true(host_list[N - 1] == fval(0, N - 1));        /* host-staged: synchronized */
    /* host memory is refused where NCCL would read it */
    for (i = 0; i < N; i++) host[i] = 1.0f;
    assert_int_equal(dm_reduce(c, host, dst, N, DM_FLOAT32, DM_SUM, 0), DM_ERR_INVALID_ARG);
    assert_non_null(strstr(dm_last_error(c), "host memory"));
    assert_int_equal(dm_gather(c, host, dst, N, DM_FLOAT32, 0), DM_ERR_INVALID_ARG);
    assert_int_equal(dm_scatter(c, host, dst, N, DM_FLOAT32, 0), DM_ERR_INVALID_ARG);
    assert_int_equal(dm_all_to_all(c, host, dst, N, DM_FLOAT32), DM_ERR_INVALID_ARG);
    assert_int_equal(dm_all_to_all(c, NULL, host, N, DM_FLOAT32), DM_ERR_INVALID_ARG);
    /* a rank cannot send to itself (the core says so before NCCL is asked) */
    assert_int_equal(dm_send(c, src, N, DM_FLOAT32, 0, 0), DM_ERR_INVALID_ARG);
    CHECK_OK(c, dm_barrier(c));
    cudaFree(src);
    cudaFree(dst);
    cudaFree(list_dev);
    dm_destroy(c);
}

/* Blocks the stream for *ms milliseconds: a request behind it cannot be done before. */
static void CUDART_CB stream_sleep(void* ms) { usleep((useconds_t)(*(int*)ms) * 1000u); }

/* World 1: every _async kind the backend starts on the stream, then objects (the core's
   progress thread), waited with dm_wait_all and checked; dm_test does not block on a request
   queued behind 300 ms of other stream work. */
static void test_nccl_async_world1(void** state) {
    enum { N = 1024, R = 12 };
    dm_collective* c;
    dm_request* reqs[R];
    dm_blob_list objs;
    float *src, *ar, *red, *gat, *sca, *a2a, *a2av, *bc, *agl, host_in[N], host_out[N];
    void* recvs[1];
    size_t sc[1] = { 8 }, so[1] = { 0 }, rc[1] = { 8 }, ro[1] = { 100 };
    int sleep_ms = 300, k;
    bool done = true;
    double t0;
    size_t i;
    (void)state;
    NEED_GPU();
    c = world1();
    src = dev_floats(N, 0);
    assert_int_equal(cudaMalloc((void**)&ar, N * 4), cudaSuccess);
    assert_int_equal(cudaMalloc((void**)&red, N * 4), cudaSuccess);
    assert_int_equal(cudaMalloc((void**)&gat, N * 4), cudaSuccess);
    assert_int_equal(cudaMalloc((void**)&sca, N * 4), cudaSuccess);
    assert_int_equal(cudaMalloc((void**)&a2a, N * 4), cudaSuccess);
    assert_int_equal(cudaMalloc((void**)&a2av, N * 4), cudaSuccess);
    assert_int_equal(cudaMalloc((void**)&agl, N * 4), cudaSuccess);
    bc = dev_floats(N, 0);
    for (i = 0; i < N; i++) host_in[i] = (float)i;
    memset(host_out, 0, sizeof(host_out));
    recvs[0] = agl;
    memset(reqs, 0, sizeof(reqs));
    k = 0;
    CHECK_OK(c, dm_all_reduce_async(c, src, ar, N, DM_FLOAT32, DM_SUM, &reqs[k++]));
    CHECK_OK(c, dm_reduce_async(c, src, red, N, DM_FLOAT32, DM_MAX, 0, &reqs[k++]));
    CHECK_OK(c, dm_gather_async(c, src, gat, N, DM_FLOAT32, 0, &reqs[k++]));
    CHECK_OK(c, dm_scatter_async(c, src, sca, N, DM_FLOAT32, 0, &reqs[k++]));
    CHECK_OK(c, dm_all_to_all_async(c, src, a2a, N, DM_FLOAT32, &reqs[k++]));
    CHECK_OK(c, dm_all_to_all_v_async(c, src, sc, so, a2av, rc, ro, DM_FLOAT32, &reqs[k++]));
    CHECK_OK(c, dm_broadcast_async(c, bc, N, DM_FLOAT32, 0, &reqs[k++]));
    CHECK_OK(c, dm_all_gather_to_list_async(c, src, (void* const*)recvs, N, DM_FLOAT32, &reqs[k++]));
    CHECK_OK(c, dm_all_gather_async(c, host_in, host_out, N, DM_FLOAT32, &reqs[k++]));  /* host-staged */
    CHECK_OK(c, dm_barrier_async(c, &reqs[k++]));
    CHECK_OK(c, dm_all_gather_objects_async(c, "obj", 4, &objs, &reqs[k++]));          /* the core's */
    assert_int_equal(k, R - 1);
    CHECK_OK(c, dm_wait_all(reqs, (size_t)k));
    for (i = 0; i < (size_t)k; i++) assert_null(reqs[i]);
    for (i = 0; i < N; i += 31) {
        assert_true(dev_at(ar, i) == fval(0, i));
        assert_true(dev_at(red, i) == fval(0, i));
        assert_true(dev_at(gat, i) == fval(0, i));
        assert_true(dev_at(sca, i) == fval(0, i));
        assert_true(dev_at(a2a, i) == fval(0, i));
        assert_true(dev_at(bc, i) == fval(0, i));
        assert_true(dev_at(agl, i) == fval(0, i));
        assert_true(host_out[i] == (float)i);
    }
    for (i = 0; i < 8; i++) assert_true(dev_at(a2av, 100 + i) == fval(0, i));
    assert_int_equal(objs.count, 1);
    assert_string_equal((const char*)objs.items[0].data, "obj");
    dm_blob_list_free(c, &objs);
    /* dm_test answers at once while the stream is busy; the request is done after the sleep */
    assert_int_equal(cudaLaunchHostFunc((cudaStream_t)dm_nccl_stream(c), stream_sleep, &sleep_ms), cudaSuccess);
    t0 = tw_now_s();
    CHECK_OK(c, dm_all_reduce_async(c, NULL, ar, N, DM_FLOAT32, DM_SUM, &reqs[0]));
    CHECK_OK(c, dm_test(reqs[0], &done));
    assert_false(done);
    assert_true(tw_now_s() - t0 < 0.2);
    while (!done) CHECK_OK(c, dm_test(reqs[0], &done));
    assert_true(tw_now_s() - t0 >= 0.25);
    /* blocking calls queue behind requests in flight on the same stream */
    assert_int_equal(cudaLaunchHostFunc((cudaStream_t)dm_nccl_stream(c), stream_sleep, &sleep_ms), cudaSuccess);
    CHECK_OK(c, dm_reduce_async(c, src, red, N, DM_FLOAT32, DM_SUM, 0, &reqs[0]));
    CHECK_OK(c, dm_barrier(c));
    CHECK_OK(c, dm_test(reqs[0], &done));
    assert_true(done);
    /* an argument failure returns at once, with no request */
    reqs[0] = (dm_request*)(void*)&k;
    assert_int_equal(dm_reduce_async(c, host_in, red, N, DM_FLOAT32, DM_SUM, 0, &reqs[0]), DM_ERR_INVALID_ARG);
    assert_null(reqs[0]);
    cudaFree(src); cudaFree(ar); cudaFree(red); cudaFree(gat); cudaFree(sca); cudaFree(a2a); cudaFree(a2av);
    cudaFree(bc); cudaFree(agl);
    dm_destroy(c);
}

/* In a child (it aborts its communicator): a request queued behind 2 s of stream work with a
   500 ms timeout -- dm_test reports DM_ERR_TIMEOUT once the deadline (counted from the _async
   call) passes, the communicator is aborted, the request queued after it fails with it
   ("did not complete"), the one done before the abort is DM_OK, later calls DM_ERR_ABORTED. */
static int async_timeout_child(void) {
    dm_nccl_desc d;
    dm_collective* c = NULL;
    unsigned char id[DM_NCCL_UNIQUE_ID_BYTES];
    dm_request *before = NULL, *late = NULL, *behind = NULL;
    float* buf = NULL;
    int sleep_ms = 2000;
    bool done = false;
    dm_status st = DM_OK;
    double t0, took;
    memset(&d, 0, sizeof(d));
    if (ncclGetUniqueId((ncclUniqueId*)(void*)id) != ncclSuccess) return 10;
    d.rank = 0; d.world_size = 1; d.unique_id = id; d.timeout_ms = 30000;
    if (dm_nccl_create(&d, &c) != DM_OK) return 11;
    if (cudaMalloc((void**)&buf, 4096) != cudaSuccess) return 12;
    if (dm_set_timeout(c, 500) != DM_OK) return 13;
    if (dm_all_reduce_async(c, NULL, buf, 1024, DM_FLOAT32, DM_SUM, &before) != DM_OK) return 14;
    if (dm_synchronize(c) != DM_OK) return 15;    /* `before` is done, not yet waited for */
    if (cudaLaunchHostFunc((cudaStream_t)dm_nccl_stream(c), stream_sleep, &sleep_ms) != cudaSuccess) return 16;
    t0 = tw_now_s();
    if (dm_all_reduce_async(c, NULL, buf, 1024, DM_FLOAT32, DM_SUM, &late) != DM_OK) return 17;
    if (dm_broadcast_async(c, buf, 1024, DM_FLOAT32, 0, &behind) != DM_OK) return 18;
    while (!done && tw_now_s() - t0 < 20) {
        st = dm_test(late, &done);
        if (!done) usleep(1000);
    }
    took = tw_now_s() - t0;
    printf("request behind 2 s of stream work, 500 ms timeout: %s after %.2f s (%s)\n", dm_status_name(st), took,
           dm_last_error(c));
    if (!done || st != DM_ERR_TIMEOUT) return 19;
    if (took < 0.45 || took > 10) return 20;
    if (!strstr(dm_last_error(c), "timed out")) return 21;
    st = dm_wait(behind);
    printf("the request queued behind it: %s (%s)\n", dm_status_name(st), dm_last_error(c));
    if (st != DM_ERR_TIMEOUT || !strstr(dm_last_error(c), "did not complete")) return 22;
    if (dm_wait(before) != DM_OK) return 23;
    if (dm_barrier(c) != DM_ERR_ABORTED) return 24;
    if (dm_all_reduce_async(c, NULL, buf, 1024, DM_FLOAT32, DM_SUM, &late) != DM_ERR_ABORTED || late) return 25;
    dm_destroy(c);
    cudaFree(buf);
    return 0;
}

/* Runs this program again with flag in n children, each given its index; all must exit 0
   within limit_s. */
static void run_children(const char* flag, int n, int limit_s) {
    char dir[] = "/tmp/dm_nccl_XXXXXX";
    int failed;
    assert_true(n <= 8);
    assert_non_null(mkdtemp(dir));
    failed = run_self(flag, NULL, n, dir, limit_s);
    { char cmd[64]; snprintf(cmd, sizeof(cmd), "rm -rf %s", dir); assert_int_equal(system(cmd), 0); }
    assert_int_equal(failed, 0);
}
static void test_nccl_async_timeout_aborts(void** state) {
    (void)state;
    NEED_GPU();
    run_children("--async-timeout", 1, 60);
}

/* ---- two ranks on two GPUs (NCCL refuses two ranks on one GPU) ---------------------------- */
#define TR_CHECK(code, expr) do { dm_status s_ = (expr);                                          \
        if (s_ != DM_OK) { fprintf(stderr, "rank %d: %s -> %s: %s\n", rank, #expr, dm_status_name(s_), \
                                   dm_last_error(c)); return (code); } } while (0)
#define TR_EXPECT(code, cond) do { if (!(cond)) { fprintf(stderr, "rank %d: %s is false\n", rank, #cond); \
        return (code); } } while (0)

static int two_ranks(int rank, const char* dir) {
    enum { N = 4096 };
    dm_nccl_desc d;
    dm_collective* c = NULL;
    char url[300];
    float *a = NULL, *b = NULL, *h = (float*)malloc(2 * N * sizeof(float));
    int32_t hi[4], *di = NULL;
    size_t i, sc[2], so[2], rc[2], ro[2];
    dm_request* reqs[4];
    int peer = 1 - rank;
    memset(&d, 0, sizeof(d));
    snprintf(url, sizeof(url), "file://%s", dir);
    d.rank = rank; d.world_size = 2; d.local_rank = rank; d.store_url = url; d.timeout_ms = 60000;
    d.cuda_device = rank + 1;
    if (!h || dm_nccl_create(&d, &c) != DM_OK) return 30;
    if (cudaMalloc((void**)&a, 2 * N * 4) != cudaSuccess || cudaMalloc((void**)&b, 2 * N * 4) != cudaSuccess ||
        cudaMalloc((void**)&di, sizeof(hi)) != cudaSuccess) return 31;
#define TO_DEV(dst, src, bytes) cudaMemcpy((dst), (src), (bytes), cudaMemcpyHostToDevice)
#define TO_HOST(dst, src, bytes) cudaMemcpy((dst), (src), (bytes), cudaMemcpyDeviceToHost)
    /* reduce to root 1: SUM of fval(0, i) + fval(1, i); int32 MEAN truncates like ncclAvg */
    for (i = 0; i < N; i++) h[i] = fval(rank, i);
    TO_DEV(a, h, N * 4);
    TR_CHECK(32, dm_reduce(c, a, rank == 1 ? b : NULL, N, DM_FLOAT32, DM_SUM, 1));
    for (i = 0; i < 4; i++) hi[i] = rank * 3 + (int32_t)i;          /* sums 3, 5, 7, 9 */
    TO_DEV(di, hi, sizeof(hi));
    TR_CHECK(33, dm_reduce(c, rank == 1 ? NULL : di, rank == 1 ? di : NULL, 4, DM_INT32, DM_MEAN, 1)); /* in place at the root */
    TR_CHECK(34, dm_synchronize(c));
    if (rank == 1) {
        TO_HOST(h, b, N * 4);
        for (i = 0; i < N; i++) TR_EXPECT(35, h[i] == fval(0, i) + fval(1, i));
        TO_HOST(hi, di, sizeof(hi));
        for (i = 0; i < 4; i++) TR_EXPECT(35, hi[i] == (int32_t)(3 + 2 * i) / 2);   /* truncated: 1, 2, 3, 4 */
    }
    /* gather at root 1, scatter from root 0 */
    for (i = 0; i < N; i++) h[i] = fval(rank, i);
    TO_DEV(a, h, N * 4);
    TR_CHECK(36, dm_gather(c, a, rank == 1 ? b : NULL, N, DM_FLOAT32, 1));
    TR_CHECK(36, dm_synchronize(c));
    if (rank == 1) {
        TO_HOST(h, b, 2 * N * 4);
        for (i = 0; i < N; i++) TR_EXPECT(37, h[i] == fval(0, i) && h[N + i] == fval(1, i));
    }
    for (i = 0; i < 2 * N; i++) h[i] = fval(7, i);
    TO_DEV(a, h, 2 * N * 4);
    TR_CHECK(38, dm_scatter(c, rank == 0 ? a : NULL, b, N, DM_FLOAT32, 0));
    TR_CHECK(38, dm_synchronize(c));
    TO_HOST(h, b, N * 4);
    for (i = 0; i < N; i++) TR_EXPECT(39, h[i] == fval(7, (size_t)rank * N + i));
    /* all_to_all: block j of rank r holds fval(r, j*N + i); recv block i comes from rank i */
    for (i = 0; i < 2 * N; i++) h[i] = fval(rank, i);
    TO_DEV(a, h, 2 * N * 4);
    TR_CHECK(40, dm_all_to_all(c, a, b, N, DM_FLOAT32));
    TR_CHECK(40, dm_all_to_all(c, NULL, a, N, DM_FLOAT32));          /* in place gives the same */
    TR_CHECK(40, dm_synchronize(c));
    TO_HOST(h, b, 2 * N * 4);
    for (i = 0; i < N; i++) TR_EXPECT(41, h[i] == fval(0, (size_t)rank * N + i) && h[N + i] == fval(1, (size_t)rank * N + i));
    TO_HOST(h, a, 2 * N * 4);
    for (i = 0; i < N; i++) TR_EXPECT(42, h[i] == fval(0, (size_t)rank * N + i) && h[N + i] == fval(1, (size_t)rank * N + i));
    /* all_to_all_v: rank 0 sends 3 to rank 1, rank 1 sends 5 to rank 0, each keeps 2 */
    for (i = 0; i < 2 * N; i++) h[i] = fval(rank, i);
    TO_DEV(a, h, 2 * N * 4);
    if (rank == 0) { sc[0] = 2; sc[1] = 3; rc[0] = 2; rc[1] = 5; }
    else { sc[0] = 5; sc[1] = 2; rc[0] = 3; rc[1] = 2; }
    so[0] = 0; so[1] = sc[0]; ro[0] = 0; ro[1] = rc[0];
    TR_CHECK(43, dm_all_to_all_v(c, a, sc, so, b, rc, ro, DM_FLOAT32));
    TR_CHECK(43, dm_synchronize(c));
    TO_HOST(h, b, 7 * 4);
    for (i = 0; i < rc[0]; i++) TR_EXPECT(44, h[i] == fval(0, (rank == 0 ? 0 : 2) + i));
    for (i = 0; i < rc[1]; i++) TR_EXPECT(44, h[rc[0] + i] == fval(1, (rank == 0 ? 0 : 5) + i));
    /* send / recv: 0 -> 1, then 1 -> 0 (one side receives while the other sends) */
    for (i = 0; i < N; i++) h[i] = fval(rank, i);
    TO_DEV(a, h, N * 4);
    if (rank == 0) { TR_CHECK(45, dm_send(c, a, N, DM_FLOAT32, peer, 7)); TR_CHECK(45, dm_recv(c, b, N, DM_FLOAT32, peer, 8)); }
    else { TR_CHECK(45, dm_recv(c, b, N, DM_FLOAT32, peer, 7)); TR_CHECK(45, dm_send(c, a, N, DM_FLOAT32, peer, 8)); }
    TR_CHECK(45, dm_synchronize(c));
    TO_HOST(h, b, N * 4);
    for (i = 0; i < N; i++) TR_EXPECT(46, h[i] == fval(peer, i));
    /* requests: two messages 0 -> 1 with tags 1 and 2; rank 1 posts tag 2 first and still gets
       the first message (NCCL matches in issue order, tags are not sent) */
    for (i = 0; i < 2 * N; i++) h[i] = fval(rank, i);
    TO_DEV(a, h, 2 * N * 4);
    if (rank == 0) {
        TR_CHECK(47, dm_send_async(c, a, N, DM_FLOAT32, 1, 1, &reqs[0]));
        TR_CHECK(47, dm_send_async(c, a + N, N, DM_FLOAT32, 1, 2, &reqs[1]));
    } else {
        TR_CHECK(47, dm_recv_async(c, b, N, DM_FLOAT32, 0, 2, &reqs[0]));
        TR_CHECK(47, dm_recv_async(c, b + N, N, DM_FLOAT32, 0, 1, &reqs[1]));
    }
    TR_CHECK(47, dm_all_reduce_async(c, NULL, a, 2 * N, DM_FLOAT32, DM_SUM, &reqs[2]));
    TR_CHECK(47, dm_all_to_all_async(c, NULL, a, N, DM_FLOAT32, &reqs[3]));
    TR_CHECK(48, dm_wait_all(reqs, 4));
    if (rank == 1) {
        TO_HOST(h, b, 2 * N * 4);
        for (i = 0; i < 2 * N; i++) TR_EXPECT(49, h[i] == fval(0, i));
    }
    /* after the sum, block j of every rank holds s(j*N+i); all_to_all gives block i = rank i's
       block `rank`, the same values */
    TO_HOST(h, a, 2 * N * 4);
    for (i = 0; i < 2 * N; i++) TR_EXPECT(50, h[i] == fval(0, (size_t)rank * N + i % N) + fval(1, (size_t)rank * N + i % N));
    TR_CHECK(51, dm_barrier(c));
    cudaFree(a); cudaFree(b); cudaFree(di);
    free(h);
    dm_destroy(c);
    if (rank == 0) printf("two ranks: reduce, gather, scatter, all_to_all(_v), send/recv and requests correct\n");
    return 0;
#undef TO_DEV
#undef TO_HOST
}
static void test_nccl_two_ranks_rooted_p2p_async(void** state) {
    (void)state;
    if (dm_device_count() < 2) { printf("skipped: needs 2 GPUs (found %d)\n", dm_device_count()); skip(); }
    run_children("--two-ranks", 2, 120);
}


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
    char dir[] = "/tmp/dm_tcpcuda_XXXXXX";
    int failed;
    (void)state;
    NEED_GPU();
    assert_non_null(mkdtemp(dir));
    failed = run_self("--tcp-cuda", NULL, 4, dir, 180);
    { char cmd[64]; snprintf(cmd, sizeof(cmd), "rm -rf %s", dir); assert_int_equal(system(cmd), 0); }
    assert_int_equal(failed, 0);
}

int main(int argc, char** argv) {
    if (argc == 4 && strcmp(argv[1], "--tcp-cuda") == 0) {
        int rc = tcp_cuda_rank(atoi(argv[2]), 4, argv[3]);
        fflush(NULL);
        return rc;
    }
    if (argc == 4 && strcmp(argv[1], "--async-timeout") == 0) {
        int rc = async_timeout_child();
        fflush(NULL);
        return rc;
    }
    if (argc == 4 && strcmp(argv[1], "--two-ranks") == 0) {
        int rc = two_ranks(atoi(argv[2]), argv[3]);
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
        cmocka_unit_test(test_nccl_rooted_all_to_all_world1),
        cmocka_unit_test(test_nccl_async_world1),
        cmocka_unit_test(test_nccl_async_timeout_aborts),
        cmocka_unit_test(test_nccl_two_ranks_rooted_p2p_async),
        cmocka_unit_test(test_tcp_cuda_four_processes_one_gpu),
    };
    dm_test_filter(argc, argv);
    return cmocka_run_group_tests(tests, NULL, NULL);
    }
}
