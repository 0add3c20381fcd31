/* distmesh.h -- header-only collective communication for C11 (and C++11). MIT license at end of file.

   One vtable-based dm_collective interface (all-reduce, all-gather, reduce-scatter, broadcast,
   barrier, object collectives, split), a Fake backend for single-process tests (world of one,
   a simulated world of N, or a real in-process world of N threads), a Mesh layer of named
   parallel dims, environment detection, and reduction kernels. Transports are opt-in:

       distmesh_tcp.h    TCP ring backend on libuv, Gloo-style rendezvous      (DISTMESH_TCP)
       distmesh_nccl.h   NCCL backend, CUDA device buffers                      (DISTMESH_NCCL)

   USE: in exactly one translation unit (or compile the shipped distmesh.c):

       #define DISTMESH_IMPLEMENTATION
       #include "distmesh.h"

   every other file includes "distmesh.h" plainly. Pass backend macros as -D flags so every
   translation unit agrees.

   OPTIONS (define before including, or pass with -D)
       DISTMESH_IMPLEMENTATION   emit the implementation in this TU               (off)
       DISTMESH_TCP              include distmesh_tcp.h (needs libuv)             (off)
       DISTMESH_NCCL             include distmesh_nccl.h (needs CUDA, NCCL)       (off)
       DM_API / DM_API_IMPL      decoration of declarations / definitions (extern / empty)
       DM_ASSERT(c)              our own invariants                               (assert)

   EXAMPLE: a world of 4 ranks on 4 threads of this process

       static int work(dm_collective* c, void* user) {
           float x[3] = { 1.0f, 2.0f, (float)dm_rank(c) };
           dm_status st = dm_all_reduce(c, NULL, x, 3, DM_FLOAT32, DM_SUM); // NULL send = in place
           if (st != DM_OK) fprintf(stderr, "%s\n", dm_last_error(c));
           return st;                                       // x is now { 4, 8, 6 } on every rank
       }
       dm_fake_desc d = {0};
       d.world_size = 4;
       dm_status st = dm_thread_world_run(&d, work, NULL);

   RULES
   - Every collective is a collective call: every rank of the collective calls it, in the same
     order, with matching dtype, count, op and root. A local argument error is returned before
     any communication, so the other ranks then time out (or report a mismatch where the
     backend checks fingerprints, as the threaded Fake world does).
   - A dm_collective is used by one thread at a time. Objects are independent: no global state.
   - Every blocking call has a deadline (dm_set_timeout, the desc's timeout_ms, DISTMESH_TIMEOUT).
   - Functions return dm_status (0 = DM_OK, failures negative); the detail is in dm_last_error(c),
     overwritten by the next failure on the same object. Failed creates leave *out == NULL.
   - Buffers: counts are size_t elements; send == NULL or send == recv means in place. In-place
     all_gather: send == recv + rank*count; in-place reduce_scatter: recv == send + rank*count
     (NCCL's conventions).
*/
#ifndef DISTMESH_H
#define DISTMESH_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#define DISTMESH_VERSION_MAJOR 0
#define DISTMESH_VERSION_MINOR 1
#define DISTMESH_VERSION_PATCH 0
#define DISTMESH_VERSION "0.1.0"

#ifndef DM_API
#if defined(DM_DLL) && defined(_WIN32) && defined(DISTMESH_IMPLEMENTATION)
#define DM_API __declspec(dllexport)
#elif defined(DM_DLL) && defined(_WIN32)
#define DM_API __declspec(dllimport)
#else
#define DM_API extern
#endif
#endif
#ifndef DM_API_IMPL
#define DM_API_IMPL
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* >>limits */
enum {
    DM_MAX_DIMS = 8,             /* dims of one dm_mesh */
    DM_MAX_DIM_NAME = 32,        /* bytes of a dim name, NUL included */
    DM_LAST_ERROR_SIZE = 512,    /* bytes of the per-object last-error buffer */
    DM_DEFAULT_TIMEOUT_MS = 300000
};

/* >>status  One list, one source of truth: names, values and texts (dm_status_name, dm_strerror). */
#define DM_STATUS_LIST(X)                                                                   \
    X(OK,                 0, "success")                                                     \
    X(ERR_INVALID_ARG,   -1, "invalid argument")                                            \
    X(ERR_OUT_OF_MEMORY, -2, "out of memory")                                               \
    X(ERR_UNSUPPORTED,   -3, "operation not provided by this backend or build")             \
    X(ERR_INTERNAL,      -4, "internal error")                                              \
    X(ERR_TIMEOUT,       -5, "timed out waiting for peers")                                 \
    X(ERR_PEER_LOST,     -6, "a peer closed its connection or died")                        \
    X(ERR_MISMATCH,      -7, "ranks called mismatched collectives")                         \
    X(ERR_NETWORK,       -8, "network error")                                               \
    X(ERR_PROTOCOL,      -9, "malformed or unexpected bytes from a peer")                   \
    X(ERR_NOT_FOUND,    -10, "key or item not found")                                       \
    X(ERR_REFUSED,      -11, "connection refused by authentication")                        \
    X(ERR_ENV,          -12, "malformed environment variable")                              \
    X(ERR_CUDA,         -13, "CUDA error")                                                  \
    X(ERR_NCCL,         -14, "NCCL error")                                                  \
    X(ERR_ABORTED,      -15, "the collective was aborted by an earlier failure")            \
    X(ERR_IO,           -16, "file system error")

typedef enum dm_status {
#define _DM_X(name, val, text) DM_##name = val,
    DM_STATUS_LIST(_DM_X)
#undef _DM_X
    _DM_STATUS_FORCE_INT = 0x7fffffff
} dm_status;

/* >>types */
typedef enum dm_dtype {
    DM_INT8 = 0, DM_UINT8, DM_INT32, DM_UINT32, DM_INT64, DM_UINT64,
    DM_FLOAT16, DM_BFLOAT16, DM_FLOAT32, DM_FLOAT64,
    DM_DTYPE_COUNT
} dm_dtype;

/* MEAN is SUM followed by division by the group size. On integer dtypes that division truncates
   toward zero (C's '/', like NCCL's ncclAvg): MEAN of {1, 2} in int32 is 1, of {-1, -2} is -1.
   float16 / bfloat16 accumulate each step in float32 and round to nearest even when stored.
   NaN: SUM/PROD/MEAN follow IEEE; MAX and MIN return NaN when either operand is NaN (like
   torch.maximum), so a NaN on any rank reaches every rank. */
typedef enum dm_reduce_op {
    DM_SUM = 0, DM_PROD, DM_MAX, DM_MIN, DM_MEAN,
    DM_REDUCE_OP_COUNT
} dm_reduce_op;

typedef enum dm_device_type { DM_DEVICE_CPU = 0, DM_DEVICE_CUDA = 1 } dm_device_type;
typedef struct dm_device {
    dm_device_type type;        /* CPU unless built with CUDA and a GPU is used */
    int index;                  /* CUDA ordinal; 0 for CPU */
} dm_device;

typedef enum dm_log_level { DM_LOG_ERROR = 0, DM_LOG_WARN, DM_LOG_INFO, DM_LOG_DEBUG } dm_log_level;

/* The logger is called from whichever thread hits the event, so it must be thread-safe. */
typedef void (*dm_log_fn)(dm_log_level level, dm_status status, const char* message,
                          const char* file, int line, void* user_data);
typedef struct dm_logger {
    dm_log_fn func;             /* 0 -> silent; errors still reach dm_last_error */
    void* user_data;            /* passed back to func */
} dm_logger;

typedef struct dm_allocator {
    void* (*alloc_fn)(size_t size, void* user_data);   /* 0 -> malloc; set both or neither */
    void (*free_fn)(void* ptr, void* user_data);       /* 0 -> free */
    void* user_data;
} dm_allocator;

/* A variable-size byte object (the seeds' pickled objects). */
typedef struct dm_blob {
    const void* data;           /* size bytes */
    size_t size;
} dm_blob;

/* Objects received from a collective. items and every items[i].data live in one allocation
   made with the collective's allocator; release it with dm_blob_list_free. */
typedef struct dm_blob_list {
    dm_blob* items;
    size_t count;
} dm_blob_list;

typedef struct dm_collective dm_collective;
typedef struct dm_mesh dm_mesh;
typedef struct dm_strategy dm_strategy;

/* >>env  Where this process sits, read from launcher variables. Precedence, first match wins:
   DISTMESH_RANK / DISTMESH_WORLD_SIZE / DISTMESH_LOCAL_RANK / DISTMESH_LOCAL_WORLD_SIZE;
   torchrun RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE; OpenMPI OMPI_COMM_WORLD_RANK /
   _SIZE / _LOCAL_RANK / _LOCAL_SIZE; PMI PMI_RANK / PMI_SIZE (MPI_LOCALRANKID, MPI_LOCALNRANKS);
   Slurm SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID (SLURM_NTASKS_PER_NODE or
   SLURM_TASKS_PER_NODE for the local size). Nothing set: rank 0 of 1. Each source's local
   variables are read only with its own rank variables. */
typedef struct dm_env {
    int rank, world_size;
    int local_rank, local_world_size;
    bool is_distributed;        /* world_size > 1 */
    const char* source;         /* "distmesh", "torchrun", "openmpi", "pmi", "slurm", "default" */
    char master_addr[256];      /* MASTER_ADDR or "" */
    int master_port;            /* MASTER_PORT or 0 */
    int timeout_ms;             /* DISTMESH_TIMEOUT (seconds, decimals allowed) in ms, or 0 */
    char error[DM_LAST_ERROR_SIZE]; /* why dm_env_detect failed */
} dm_env;

/* >>fake  The Fake backend. Three shapes:
   - world_size 0 or 1: exactly Optimus-DL's FakeCollective: barrier does nothing, all_reduce
     leaves the data (MEAN divides by 1), all_gather copies the input, broadcast needs root 0.
   - world_size N > 1 with dm_fake_create: one simulated member (desc.rank) of N ranks that
     all hold the same data. all_reduce: SUM -> x*N, PROD -> x^N, MAX/MIN/MEAN -> x; all_gather
     copies the input into every slot; reduce_scatter returns this rank's block reduced as above;
     broadcast from any root leaves the data; objects: every rank's object equals this one's.
     Integer SUM/PROD wrap as unsigned arithmetic does; floats round at each step.
   - dm_thread_world_create / _run: N real ranks on N threads that exchange data through
     shared memory, with fingerprint checks (mismatched collectives -> DM_ERR_MISMATCH on every
     rank) and deadlines. Results are reduced in rank order 0..N-1 (a serial reference computed
     in that order matches bit for bit). */
typedef struct dm_fake_desc {
    int world_size;             /* 0 -> 1 */
    int rank;                   /* 0 -> 0; dm_fake_create only, < world_size */
    int local_world_size;       /* 0 -> world_size; ranks [k*L, (k+1)*L) share "node" k */
    int timeout_ms;             /* 0 -> DISTMESH_TIMEOUT or DM_DEFAULT_TIMEOUT_MS; < 0 -> forever */
    dm_logger logger;           /* 0 -> silent */
    dm_allocator allocator;     /* 0 -> malloc/free */
} dm_fake_desc;

/* One rank's body for dm_thread_world_run; returns DM_OK or a failure status. */
typedef int (*dm_rank_fn)(dm_collective* c, void* user_data);

/* >>mesh  Named dims over a world collective, row-major (the last dim innermost: ranks that
   differ by 1 differ in the last coordinate). One sub-collective per dim: the ranks that share
   every other coordinate. Sizes: at most one 0 ("infer from world size"). */
typedef struct dm_mesh_desc {
    dm_collective* world;               /* required; borrowed, must outlive the mesh */
    int ndims;                          /* required, 1..DM_MAX_DIMS */
    const char* dim_names[DM_MAX_DIMS]; /* required, distinct, < DM_MAX_DIM_NAME bytes */
    int dim_sizes[DM_MAX_DIMS];         /* 0 -> world_size / product of the others (one at most) */
    dm_logger logger;                   /* 0 -> the world's logger */
    dm_allocator allocator;             /* 0 -> the world's allocator */
} dm_mesh_desc;

/* LLaMA-Factory's DistributedStrategy: a model mesh (mp_replicate x mp_shard) and a data mesh
   (dp x cp) over one world. When the world has one rank every size is forced to 1, like the seed.*/
typedef enum dm_dim {
    DM_DIM_MP_REPLICATE = 0, DM_DIM_MP_SHARD, DM_DIM_DP, DM_DIM_CP,
    DM_DIM_COUNT
} dm_dim;

typedef struct dm_strategy_desc {
    dm_collective* world;       /* required; borrowed, must outlive the strategy */
    int mp_replicate_size;      /* 0 -> 1 */
    int mp_shard_size;          /* 0 -> world_size / mp_replicate_size */
    int dp_size;                /* 0 -> world_size / cp_size */
    int cp_size;                /* 0 -> 1 */
} dm_strategy_desc;

/* >>functions: status, dtypes, conversions */
DM_API const char* dm_status_name(dm_status status);  /* "DM_ERR_TIMEOUT"; static, never NULL */
DM_API const char* dm_strerror(dm_status status);     /* "timed out waiting for peers" */
DM_API size_t dm_dtype_size(dm_dtype dtype);          /* 0 for an invalid dtype */
DM_API const char* dm_dtype_name(dm_dtype dtype);     /* "float32"; "invalid" */
DM_API const char* dm_reduce_op_name(dm_reduce_op op);/* "sum"; "invalid" */
DM_API uint16_t dm_float_to_half(float f);            /* round to nearest even */
DM_API float dm_half_to_float(uint16_t h);
DM_API uint16_t dm_float_to_bfloat16(float f);        /* round to nearest even; NaN stays NaN */
DM_API float dm_bfloat16_to_float(uint16_t b);
/* dst[i] = dst[i] op src[i] for i < count (MEAN accumulates like SUM). The kernel every backend
   uses; exposed for tests and custom algorithms. */
DM_API dm_status dm_reduce_local(dm_dtype dtype, dm_reduce_op op, void* dst, const void* src,
                                 size_t count);
/* buf[i] /= divisor, the final step of MEAN (integer: truncating). */
DM_API dm_status dm_divide_local(dm_dtype dtype, void* buf, size_t count, int divisor);

/* >>functions: logging */
DM_API void dm_log_stderr(dm_log_level level, dm_status status, const char* message,
                          const char* file, int line, void* user_data);

/* >>functions: environment */
DM_API dm_status dm_env_detect(dm_env* out);
/* 0 CUDA devices without CUDA support; with DISTMESH_NCCL the CUDA runtime's count. */
DM_API int dm_device_count(void);

/* >>functions: create / destroy */
DM_API dm_status dm_fake_create(const dm_fake_desc* desc, dm_collective** out);
/* out must hold desc->world_size pointers; each is destroyed with dm_destroy, by its own thread
   or after every rank thread has finished. */
DM_API dm_status dm_thread_world_create(const dm_fake_desc* desc, dm_collective** out);
/* Creates a threaded world, runs fn on world_size threads (rank r gets its collective), joins,
   destroys. Returns DM_OK when every fn did, else the failure of the lowest failing rank. */
DM_API dm_status dm_thread_world_run(const dm_fake_desc* desc, dm_rank_fn fn, void* user_data);
/* The collective this process's environment asks for: with DISTMESH_TCP compiled in and a
   world size > 1 in the environment, the TCP backend; otherwise a world-1 Fake. */
typedef struct dm_init_desc {
    int timeout_ms;             /* 0 -> DISTMESH_TIMEOUT or DM_DEFAULT_TIMEOUT_MS */
    dm_logger logger;
    dm_allocator allocator;
} dm_init_desc;
DM_API dm_status dm_init(const dm_init_desc* desc, dm_collective** out);
/* Collective teardown of the collective and everything it owns (its local sub-collective).
   Accepts NULL. Sub-collectives made by dm_split are independent objects: destroy them too. */
DM_API void dm_destroy(dm_collective* c);

/* >>functions: accessors (no communication) */
DM_API int dm_rank(const dm_collective* c);
DM_API int dm_world_size(const dm_collective* c);
DM_API int dm_local_rank(const dm_collective* c);
DM_API int dm_local_world_size(const dm_collective* c);
DM_API bool dm_is_master(const dm_collective* c);        /* rank 0 */
DM_API bool dm_is_local_master(const dm_collective* c);  /* local rank 0 */
DM_API dm_device dm_default_device(const dm_collective* c);
DM_API const char* dm_backend_name(const dm_collective* c); /* "fake", "thread", "tcp", "nccl" */
/* The native handle (the seeds' process_group): ncclComm_t for NCCL, NULL where none. */
DM_API void* dm_native_handle(dm_collective* c);
DM_API const char* dm_last_error(const dm_collective* c);  /* "" after success; never NULL */
DM_API uint64_t dm_sequence(const dm_collective* c);    /* collectives issued so far */
/* Deadline of each later blocking call; < 0 waits forever, 0 restores the default. */
DM_API dm_status dm_set_timeout(dm_collective* c, int timeout_ms);

/* >>functions: collectives */
DM_API dm_status dm_barrier(dm_collective* c);
DM_API dm_status dm_all_reduce(dm_collective* c, const void* send, void* recv, size_t count,
                               dm_dtype dtype, dm_reduce_op op);
/* recv holds world_size * count elements, rank r's block at recv + r*count. */
DM_API dm_status dm_all_gather(dm_collective* c, const void* send, void* recv, size_t count,
                               dm_dtype dtype);
/* recvs[r] (world_size pointers) receives rank r's count elements. */
DM_API dm_status dm_all_gather_to_list(dm_collective* c, const void* send, void* const* recvs,
                                       size_t count, dm_dtype dtype);
/* send holds world_size * recv_count elements; rank r receives block r reduced over ranks. */
DM_API dm_status dm_reduce_scatter(dm_collective* c, const void* send, void* recv,
                                   size_t recv_count, dm_dtype dtype, dm_reduce_op op);
DM_API dm_status dm_broadcast(dm_collective* c, void* buf, size_t count, dm_dtype dtype, int root);
/* Every rank contributes one object (size > 0) and receives all world_size of them. */
DM_API dm_status dm_all_gather_objects(dm_collective* c, const void* data, size_t size,
                                       dm_blob_list* out);
/* root passes count objects (each size > 0); every rank, root included, receives a copy. */
DM_API dm_status dm_broadcast_objects(dm_collective* c, const dm_blob* objects, size_t count,
                                      int root, dm_blob_list* out);
DM_API void dm_blob_list_free(dm_collective* c, dm_blob_list* list);
/* Waits for the backend's queued work (NCCL's stream); DM_OK at once where nothing is queued. */
DM_API dm_status dm_synchronize(dm_collective* c);

/* >>functions: groups */
#define DM_SPLIT_NONE (-1)
/* Like MPI_Comm_split: ranks passing the same color >= 0 form a new collective, ordered by
   (key, old rank). color DM_SPLIT_NONE: *out = NULL and DM_OK. Collective call. */
DM_API dm_status dm_split(dm_collective* c, int color, int key, dm_collective** out);
/* The node-local sub-collective (ranks on this host), made on first use: a collective call the
   first time, owned by c afterwards (do not destroy it). NULL on failure, see dm_last_error(c). */
DM_API dm_collective* dm_local(dm_collective* c);
/* The seeds' main_process_first: non-masters wait in begin while the master works; the master
   waits in end for them. local_only uses the node-local group. Pair every begin with an end. */
DM_API dm_status dm_main_process_first_begin(dm_collective* c, bool local_only);
DM_API dm_status dm_main_process_first_end(dm_collective* c, bool local_only);

/* >>functions: mesh */
DM_API dm_status dm_mesh_create(const dm_mesh_desc* desc, dm_mesh** out);
/* dp x tp mesh of Optimus-DL (TP innermost: dp_rank = rank / tp, tp_rank = rank % tp). */
DM_API dm_status dm_mesh_create_dp_tp(dm_collective* world, int tp_size, dm_mesh** out);
DM_API void dm_mesh_destroy(dm_mesh* m);
DM_API int dm_mesh_ndims(const dm_mesh* m);
DM_API const char* dm_mesh_dim_name(const dm_mesh* m, int dim_index);     /* NULL if out of range */
DM_API int dm_mesh_dim_index(const dm_mesh* m, const char* name);         /* -1 if unknown */
/* name NULL -> the whole world. Unknown name: rank/size -1 and group NULL with a message. */
DM_API int dm_mesh_rank(const dm_mesh* m, const char* name);
DM_API int dm_mesh_size(const dm_mesh* m, const char* name);
DM_API dm_collective* dm_mesh_group(dm_mesh* m, const char* name);       /* owned by the mesh */
DM_API dm_collective* dm_mesh_world(const dm_mesh* m);
DM_API const char* dm_mesh_last_error(const dm_mesh* m);
/* Optimus-DL accessors on a mesh with dims "dp" and "tp" (missing dim: size 1, rank 0). */
DM_API int dm_mesh_dp_rank(const dm_mesh* m);
DM_API int dm_mesh_dp_world_size(const dm_mesh* m);
DM_API int dm_mesh_tp_rank(const dm_mesh* m);
DM_API int dm_mesh_tp_world_size(const dm_mesh* m);
DM_API dm_collective* dm_mesh_tp_world(dm_mesh* m);

/* >>functions: strategy (LLaMA-Factory). Errors carry the seed's messages, e.g.
   "mp_replicate_size * mp_shard_size must equal to world_size, got 3 * 3 != 8." */
DM_API dm_status dm_strategy_create(const dm_strategy_desc* desc, dm_strategy** out);
DM_API void dm_strategy_destroy(dm_strategy* s);
DM_API const char* dm_dim_name(dm_dim dim);             /* "mp_replicate", ..., "invalid" */
DM_API int dm_strategy_size(const dm_strategy* s, dm_dim dim);   /* resolved size, -1 if bad dim */
DM_API int dm_strategy_rank(const dm_strategy* s, dm_dim dim);   /* rank along dim, -1 if bad */
DM_API dm_collective* dm_strategy_group(dm_strategy* s, dm_dim dim); /* owned by the strategy */
DM_API dm_mesh* dm_strategy_model_mesh(dm_strategy* s);  /* (mp_replicate, mp_shard) */
DM_API dm_mesh* dm_strategy_data_mesh(dm_strategy* s);   /* (dp, cp) */
/* Resolves and checks the sizes against world_size without communicating: out_sizes gets the
   four sizes, error (error_size bytes) the seed's message on DM_ERR_INVALID_ARG. */
DM_API dm_status dm_strategy_validate(const dm_strategy_desc* desc, int world_size,
                                      int out_sizes[DM_DIM_COUNT], char* error, size_t error_size);
DM_API const char* dm_strategy_last_error(const dm_strategy* s);

/* >>backend-authors  The vtable every backend fills and the base struct it embeds first.
   Slots are appended only; each version's end is marked. The public wrappers validate every
   argument (NULL buffers, dtype, op, root, overflow of count * dtype size, in-place layout)
   before dispatch, so slots receive clean arguments and send != NULL. */
#define DM_COLLECTIVE_VTABLE_VERSION 1
typedef struct dm_collective_vtable {
    uint32_t struct_size;       /* sizeof(dm_collective_vtable) as the backend was compiled */
    uint32_t version;           /* DM_COLLECTIVE_VTABLE_VERSION the backend targets */
    const char* name;           /* "fake", "thread", "tcp", "nccl" */
    void (*destroy)(dm_collective* self);
    dm_status (*barrier)(dm_collective* self);          /* optional: zero-byte all_reduce */
    dm_status (*all_reduce)(dm_collective* self, const void* send, void* recv, size_t count,
                            dm_dtype dtype, dm_reduce_op op);
    dm_status (*all_gather)(dm_collective* self, const void* send, void* recv, size_t count,
                            dm_dtype dtype);            /* optional if all_gather_to_list */
    dm_status (*all_gather_to_list)(dm_collective* self, const void* send, void* const* recvs,
                                    size_t count, dm_dtype dtype); /* optional if all_gather */
    dm_status (*reduce_scatter)(dm_collective* self, const void* send, void* recv,
                                size_t recv_count, dm_dtype dtype, dm_reduce_op op);
    dm_status (*broadcast)(dm_collective* self, void* buf, size_t count, dm_dtype dtype, int root);
    dm_status (*split)(dm_collective* self, int color, int key, dm_collective** out);
    void* (*native_handle)(dm_collective* self);        /* optional: NULL */
    dm_status (*synchronize)(dm_collective* self);      /* optional: DM_OK */
    /* ---- end of version 1: append below, never reorder ---- */
} dm_collective_vtable;

/* Every backend's struct begins with `struct dm_collective base;`. The core owns `local`. */
struct dm_collective {
    const dm_collective_vtable* vt;
    int rank, size;
    int local_rank, local_size;
    dm_device device;
    int timeout_ms;             /* resolved: > 0, or < 0 for forever */
    uint64_t seq;               /* collectives issued, bumped by the wrappers before dispatch */
    dm_logger logger;
    dm_allocator allocator;
    dm_collective* local;       /* cached dm_local() result, destroyed with this object */
    char node_name[64];         /* what dm_local groups by: the host name unless a backend sets it */
    char last_error[DM_LAST_ERROR_SIZE];
};

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DISTMESH_H */

/* ============================================================================================ */
/* >>implementation                                                                              */
/* ============================================================================================ */
#if defined(DISTMESH_IMPLEMENTATION) && !defined(DISTMESH_IMPL_INCLUDED)
#define DISTMESH_IMPL_INCLUDED

/* >>config */
#if !defined(_WIN32) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE  /* gethostname, clock_gettime, pthread_condattr_setclock */
#endif
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <time.h>
#include <pthread.h>
#include <unistd.h>

#ifndef DM_ASSERT
#include <assert.h>
#define DM_ASSERT(c) assert(c)
#endif

#if defined(__GNUC__) || defined(__clang__)
#define _DM_PRIVATE static __attribute__((unused))
#define _DM_PRINTF(fmt_index, args_index) __attribute__((format(printf, fmt_index, args_index)))
#else
#define _DM_PRIVATE static
#define _DM_PRINTF(fmt_index, args_index)
#endif

#define _DM_ZERO(type, name) type name; memset(&name, 0, sizeof(name))
#define _dm_def(v, dflt) ((v) ? (v) : (dflt))

/* >>memory  Every byte distmesh allocates goes through the object's allocator. */
_DM_PRIVATE bool _dm_allocator_valid(const dm_allocator* a) {
    return (a->alloc_fn == NULL) == (a->free_fn == NULL);
}
_DM_PRIVATE void* _dm_malloc(const dm_allocator* a, size_t size) {
    if (size == 0) size = 1;
    if (a && a->alloc_fn) return a->alloc_fn(size, a->user_data);
    return malloc(size);
}
_DM_PRIVATE void* _dm_calloc(const dm_allocator* a, size_t size) {
    void* p = _dm_malloc(a, size);
    if (p) memset(p, 0, size);
    return p;
}
_DM_PRIVATE void _dm_free(const dm_allocator* a, void* ptr) {
    if (!ptr) return;
    if (a && a->free_fn) a->free_fn(ptr, a->user_data);
    else free(ptr);
}

/* >>log  Errors are recorded on the object, then logged; the library itself never prints. */
_DM_PRIVATE void _dm_vlog(const dm_logger* lg, dm_log_level level, dm_status st, const char* file,
                          int line, const char* fmt, va_list ap) {
    char msg[DM_LAST_ERROR_SIZE];
    if (!lg || !lg->func) return;
    vsnprintf(msg, sizeof(msg), fmt, ap);
    lg->func(level, st, msg, file, line, lg->user_data);
}
_DM_PRIVATE _DM_PRINTF(5, 6) void _dm_log(const dm_logger* lg, dm_log_level level, const char* file,
                                          int line, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    _dm_vlog(lg, level, DM_OK, file, line, fmt, ap);
    va_end(ap);
}
_DM_PRIVATE dm_status _dm_vreport(const dm_logger* lg, char* err, size_t err_size, dm_status st,
                                  const char* file, int line, const char* fmt, va_list ap) {
    if (err && err_size) vsnprintf(err, err_size, fmt, ap);
    if (lg && lg->func) lg->func(DM_LOG_ERROR, st, err ? err : "", file, line, lg->user_data);
    return st;
}
/* Records fmt in err, logs it at ERROR level, returns st: for objects that are not collectives. */
_DM_PRIVATE _DM_PRINTF(7, 8) dm_status _dm_report(const dm_logger* lg, char* err, size_t err_size,
                                                  dm_status st, const char* file, int line,
                                                  const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    _dm_vreport(lg, err, err_size, st, file, line, fmt, ap);
    va_end(ap);
    return st;
}
/* Records fmt in c->last_error, logs it, returns st. */
_DM_PRIVATE _DM_PRINTF(5, 6) dm_status _dm_fail(dm_collective* c, dm_status st, const char* file,
                                                int line, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    _dm_vreport(&c->logger, c->last_error, sizeof(c->last_error), st, file, line, fmt, ap);
    va_end(ap);
    return st;
}
#define _DM_FAIL(c, st, ...) _dm_fail((c), (st), __FILE__, __LINE__, __VA_ARGS__)
#define _DM_REPORT(lg, err, err_size, st, ...) \
    _dm_report((lg), (err), (err_size), (st), __FILE__, __LINE__, __VA_ARGS__)
#define _DM_LOG(lg, level, ...) _dm_log((lg), (level), __FILE__, __LINE__, __VA_ARGS__)

/* >>time */
_DM_PRIVATE int64_t _dm_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}
/* Absolute deadline in _dm_now_ms() time; INT64_MAX for "forever" (timeout < 0). */
_DM_PRIVATE int64_t _dm_deadline(int timeout_ms) {
    return timeout_ms < 0 ? INT64_MAX : _dm_now_ms() + timeout_ms;
}

#endif /* DISTMESH_IMPLEMENTATION */
