/* distmesh.h -- header-only collective communication for C11 (and C++11). MIT license at end of file.

   One vtable-based dm_collective interface (all-reduce, all-gather, reduce-scatter, broadcast,
   barrier, object collectives, split), a Fake backend for single-process tests (world of one,
   a simulated world of N, or a real in-process world of N threads), a Mesh layer of named
   parallel dims, environment detection, and reduction kernels. Transports are opt-in:

       distmesh_store.h  rendezvous store: c10d TCPStore client and server, file store (any of
                         DISTMESH_TCP, DISTMESH_NCCL, DISTMESH_STORE; the server needs the first)
       distmesh_tcp.h    TCP ring backend on libuv, Gloo-style rendezvous      (DISTMESH_TCP)
       distmesh_nccl.h   NCCL backend, CUDA device buffers                      (DISTMESH_NCCL)

   The implementation is this file's second part and one header a layer, which it includes in
   this order (>>layers); each names only what the files before it define:

       distmesh.h            the API, status, config, environment, logs, the core's state
       distmesh_kernels.h    SHA-256, float semantics, half, reduction and compression kernels
       distmesh_trace.h      the flight recorder and the timeline (DISTMESH_NO_TRACE: stand-ins)
       distmesh_core.h       the calls: checks, requests, dispatch, Fake, groups, mesh, strategy
       distmesh_engine.h     links, memory rings, fingerprints, sealed records, the engine
       distmesh_schedules.h  every algorithm, the choice, the fixed peers
       distmesh_thread.h     the threaded world

   and the transports come with the TCP backend: distmesh_socket.h (sockets) and
   distmesh_shm.h (the shared segment of a host's processes).

   USE: in exactly one translation unit (or compile the shipped distmesh.c):

       #define DISTMESH_IMPLEMENTATION
       #include "distmesh.h"

   every other file includes "distmesh.h" plainly. The implementation may come after any other
   include under the compilers' default modes (gnu11, gnu17, and C++): it needs POSIX 2008 and
   declares the few GNU and BSD functions it uses itself when the C library hid them (>>libc).
   Only a strict mode (-std=c11, -std=c17, -ansi) hides POSIX itself once a system header is
   in; there it stops with one #error naming the rule: include it first (it then defines
   _GNU_SOURCE, as before), or add -D_GNU_SOURCE or -D_POSIX_C_SOURCE=200809L. Pass backend
   macros as -D flags so every translation unit agrees.

   OPTIONS (define before including, or pass with -D)
       DISTMESH_IMPLEMENTATION   emit the implementation in this TU               (off)
       DISTMESH_TCP              include distmesh_tcp.h (needs libuv)             (off)
       DISTMESH_NCCL             include distmesh_nccl.h (needs CUDA, NCCL)       (off)
       DISTMESH_STORE            include distmesh_store.h alone: store client and
                                 file store on libc (implied by the two above)   (off)
       DISTMESH_CUDA             TCP backend takes CUDA device buffers (cudart)   (on with NCCL)
       DM_API / DM_API_IMPL      decoration of declarations / definitions (extern / empty)
       DM_ASSERT(c)              our own invariants                               (assert)
       DISTMESH_OPTIMIZE_ALL     compile the setup code at your -O level too (slower
                                 to build; default: it builds as for debugging,
                                 see >>compile cost)                              (off)
       DISTMESH_NO_TRACE         leave out the flight recorder and the timeline
                                 (distmesh_trace.h): no cost per call, and
                                 dm_flight_recorder_dump says DM_ERR_UNSUPPORTED  (off)

   EXAMPLE: a world of 4 ranks on 4 threads of this process

       static int work(dm_collective* c, void* user) {
           float x[3] = { 1.0f, 2.0f, (float)dm_rank(c) };
           DM_CHECK(c, dm_all_reduce(c, NULL, x, 3, DM_FLOAT32, DM_SUM)); // NULL send = in place
           return DM_OK;                                    // x is now { 4, 8, 6 } on every rank
       }
       dm_fake_desc d = {0};
       d.world_size = 4;
       DM_CHECK(NULL, dm_thread_world_run(&d, work, NULL)); // a failure: one line, then exit

   RULES
   - Every collective is a collective call: every rank of the collective calls it, in the same
     order, with matching dtype, count, op and root. A local argument error is returned before
     any communication, so the other ranks then time out (or report a mismatch where the
     backend checks fingerprints, as the threaded Fake world does).
   - A dm_collective is used by one thread at a time. Objects are independent: no global state.
   - Every blocking call has a deadline (dm_set_timeout, the desc's timeout_ms, DISTMESH_TIMEOUT).
   - Functions return dm_status (0 = DM_OK, failures negative); the detail is in dm_last_error(c),
     overwritten by the next failure on the same object. Failed creates leave *out == NULL and
     their reason in dm_last_error(NULL) (per thread, like errno); with no logger in the desc it
     is also printed once to stderr. Nothing is printed on success; errors of calls on an object
     are returned, not printed (DISTMESH_LOG, dm_logger). DM_CHECK(c, call) prints and exits.
   - Buffers: counts are size_t elements; send == NULL or send == recv means in place. In-place
     all_gather: send == recv + rank*count; in-place reduce_scatter: recv == send + rank*count
     (NCCL's conventions).

   SECTIONS  Each opens with a comment that starts ">>tag" (search for it); in file order:
     declarations
       >>limits                  DM_MAX_DIMS, DM_LAST_ERROR_SIZE, the default timeout
       >>status                  DM_STATUS_LIST: each status's name, value and text
       >>types                   dtypes, reduce ops, devices, logger, allocator, blobs, opaque types
       >>env types               dm_env: where this process sits, from launcher variables
       >>fake desc               dm_fake_desc; what each collective of a Fake world returns
       >>mesh desc               dm_mesh_desc, dm_dim, dm_strategy_desc
       >>functions status        status and dtype names, half/bfloat16, local reduce and divide
       >>functions logging       dm_log_stderr
       >>functions hashing       SHA-256, HMAC-SHA256
       >>functions environment   dm_env_detect, dm_device_count
       >>functions create        Fake, thread world, dm_init, dm_destroy
       >>functions accessors     rank, sizes, backend, transport, last algorithm and error, timeout
       >>functions inside        the flight recorder and the timeline (DISTMESH_TRACE)
       >>functions collectives   barrier, all_reduce, all_gather(_to_list), reduce_scatter,
                                 broadcast, the object collectives
       >>functions compression   dm_compress, error-feedback state, dm_all_reduce_compressed
       >>functions rooted        reduce, gather, scatter
       >>functions all-to-all    dm_all_to_all, dm_all_to_all_v
       >>functions point-to-point  dm_send, dm_recv, dm_recv_any (DM_ANY_SOURCE)
       >>functions async         the _async twins, dm_wait, dm_test, dm_wait_all
       >>functions groups        dm_split
       >>functions abort         dm_abort: stop a collective from another thread
       >>functions shrink and grow  dm_shrink, dm_grow, dm_local, main_process_first
       >>functions mesh          dm_mesh_*
       >>functions strategy      dm_strategy_* (LLaMA-Factory's messages)
       >>backend-authors         dm_op, the vtable and the base struct a backend embeds
     implementation: what every layer names
       >>implementation          where the implementation starts (its once-guard)
       >>config                  system headers, _DM_PRIVATE, _DM_ZERO, the small-message bound
       >>compile cost            _DM_COLD_BEGIN / _END: code that runs at creates and failures
       >>libc                    GNU and BSD calls declared when the includer's mode hid them
       >>memory                  the object's allocator
       >>log                     recording (dm_last_error) and logging failures
       >>config registry         every DISTMESH_* variable: type, default, range, meaning; parsers
       >>cuda                    "is this device memory" for the backends
       >>time                    clocks, deadlines, bounded copies of names
       >>names                   status, dtype and op names; the fingerprint's kinds
       >>log stderr              dm_log_stderr
       >>env                     strict parsing of variables, dm_env_detect
       >>core state              what the core keeps per collective; the request queue's types
       >>accessors               dm_rank ... dm_sequence: what reads the public struct; _DM_VT_HAS
       >>layers                  the rest of the implementation, one header a layer, bottom up
       >>backends                the backend headers, included last

   PRIVATE NAMES  _dm_ / _DM_ for every private function, type and macro, then the part:
       _dm_link _dm_iov          the link ops table (>>links)
       _dm_bell_ _dm_abort       waking sleepers, the shared failure word (>>links)
       _dm_ring _dm_memlink _dm_mem_   the memory link (distmesh_engine.h >>memory rings)
       _dm_fp_                   fingerprints (>>fingerprint)
       _dm_rec _dm_hkdf_ _DM_AEAD_   sealed records and their keys (>>sealed records)
       _dm_algo_                 algorithm names (>>algorithms)
       _dm_eng_ _DM_ENG_         the engine: state, failure, inbox, pump, loop, eager, exchange
       _dm_sch_ _DM_SCH_         the schedules, with their vocabulary _dm_team_, _dm_steps_,
                                 _dm_segment (>>teams .. >>dissemination)
       _dm_cost_ _dm_pick_       the cost model and the choice (>>choice)
       _dm_coll_                 entry points: one per collective the vtable slots call
       _dm_peers_                P (>>peers)
       _dm_tw_                   the threaded world; _dm_fake_ the Fake backend
       _dm_prep_ _dm_check_      the public wrappers' checks; _dm_run_ _dm_op_ one operation run
       _dm_async_ _dm_request_   non-blocking calls
       _dm_trace_                the flight recorder's hooks (>>trace hooks; the rest and
                                 _dm_tr_ _dm_tb_ in distmesh_trace.h)
       _dm_env_ _dm_mesh_ _dm_strategy_ _dm_sha256_   as named
*/
#ifndef DISTMESH_H
#define DISTMESH_H

/* The implementation needs POSIX 2008 (clock_gettime, monotonic condition variables, sockets).
   A feature macro only works before the first system header of the TU: included first, the
   implementation defines _GNU_SOURCE (which also serves the code that follows it); included
   later, it takes the mode the TU has (see >>libc, and the #error below). */
#if defined(DISTMESH_IMPLEMENTATION) && !defined(_WIN32) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE
#endif

/* DISTMESH_CUDA (implied by DISTMESH_NCCL): the backends take CUDA device buffers. */
#if defined(DISTMESH_NCCL) && !defined(DISTMESH_CUDA)
#define DISTMESH_CUDA
#endif

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
/* dm_check_failed never returns (C11 _Noreturn, C++11 [[noreturn]]). */
#if defined(__cplusplus)
#define _DM_NORETURN [[noreturn]]
#else
#define _DM_NORETURN _Noreturn
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
    X(ERR_IO,           -16, "file system error")                                           \
    X(ERR_BUSY,         -17, "the collective is in use by another thread")

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

/* The logger is called from whichever thread hits the event, so it must be thread-safe. It gets
   every message (errors where they happen, warnings, info); dm_log_stderr is a ready-made one.
   With none (func 0), the default logger: warnings to stderr, prefixed with the rank
   (DISTMESH_LOG=error|warn|info|debug sets the level, default warn; info and debug add errors
   where they happen), nothing on a successful start, and errors left to the caller (the status
   and dm_last_error), except that a failed create prints its error once. To silence distmesh
   entirely, pass a logger that does nothing. */
typedef void (*dm_log_fn)(dm_log_level level, dm_status status, const char* message,
                          const char* file, int line, void* user_data);
typedef struct dm_logger {
    dm_log_fn func;             /* 0 -> the default logger (above); errors always reach dm_last_error */
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

/* >>env types  Where this process sits, read from launcher variables. Precedence, first match wins:
   DISTMESH_RANK / DISTMESH_WORLD_SIZE / DISTMESH_LOCAL_RANK / DISTMESH_LOCAL_WORLD_SIZE;
   torchrun RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE; OpenMPI OMPI_COMM_WORLD_RANK /
   _SIZE / _LOCAL_RANK / _LOCAL_SIZE; PMI PMI_RANK / PMI_SIZE (MPI_LOCALRANKID, MPI_LOCALNRANKS);
   Slurm SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID (SLURM_NTASKS_PER_NODE or
   SLURM_TASKS_PER_NODE for the local size). Nothing set: rank 0 of 1. Each source's local
   variables are read only with its own rank variables. */
typedef struct dm_env {
    int rank, world_size;
    int local_rank, local_world_size;
    bool local_from_launcher;   /* local_rank and local_world_size were given by variables; else
                                   they default to one node (rank, world_size) */
    bool is_distributed;        /* world_size > 1 */
    const char* source;         /* "distmesh", "torchrun", "openmpi", "pmi", "slurm", "default" */
    char master_addr[256];      /* MASTER_ADDR or "" */
    int master_port;            /* MASTER_PORT or 0 */
    int timeout_ms;             /* DISTMESH_TIMEOUT (seconds, decimals allowed) in ms, or 0 */
    char error[DM_LAST_ERROR_SIZE]; /* why dm_env_detect failed */
} dm_env;

/* >>fake desc  The Fake backend. Three shapes:
   - world_size 0 or 1: exactly Optimus-DL's FakeCollective: barrier does nothing, all_reduce
     leaves the data (MEAN divides by 1), all_gather copies the input, broadcast needs root 0.
   - world_size N > 1 with dm_fake_create: one simulated member (desc.rank) of N ranks that
     all hold the same data. all_reduce gives what N real ranks holding x would: x op x ... op x
     (N times) -- SUM x*N, PROD x^N, MAX/MIN x, MEAN (x added N times)/N, which is x where
     nothing wraps or rounds; integers wrap as unsigned arithmetic does, floats round at each
     step. all_gather copies the input into every slot; reduce_scatter returns this rank's block
     reduced as above; broadcast from any root leaves the data; all_gather_objects returns N
     copies of this rank's object; broadcast_objects from a root other than desc.rank returns an
     empty list (a simulated rank holds no other rank's objects); split and the mesh give
     simulated groups of the expected size. reduce gives the root what all_reduce gives;
     gather N copies; scatter gives the root its own block and leaves other ranks' recv as it
     is; all_to_all gives every block of recv this rank's own send block (all_to_all_v: counts
     must then all equal send_counts[rank]); send and recv are DM_ERR_UNSUPPORTED (no peers).
   - dm_thread_world_create / _run: N real ranks on N threads that exchange data through
     shared memory, with fingerprint checks (mismatched collectives -> DM_ERR_MISMATCH on every
     rank) and deadlines. Results are reduced in the order documented above dm_all_reduce, the
     same bits as shared memory and TCP. */
typedef struct dm_fake_desc {
    int world_size;             /* 0 -> 1 */
    int rank;                   /* 0 -> 0; dm_fake_create only, < world_size */
    int local_world_size;       /* 0 -> world_size; ranks [k*L, (k+1)*L) share "node" k */
    int timeout_ms;             /* 0 -> DISTMESH_TIMEOUT or DM_DEFAULT_TIMEOUT_MS; < 0 -> forever */
    dm_logger logger;           /* 0 -> the default logger (dm_logger) */
    dm_allocator allocator;     /* 0 -> malloc/free */
    /* NULL -> nodes from local_world_size; else world_size entries >= 0: rank r lives on
       simulated host host_of[r] (any layout: uneven, interleaved). The threaded world's
       schedules then run as on that many hosts (docs/design.md "Across hosts"), with the bits TCP
       gives on the same layout (DISTMESH_TEST_HOST_ID). */
    const int* host_of;
    /* NULL -> one site; else world_size entries >= 0: rank r's host is at simulated site
       site_of[r] (DISTMESH_SITE; the same for every rank of a host). The schedules then run as
       across that many sites, with the bits TCP gives on the same layout. */
    const int* site_of;
} dm_fake_desc;

/* One rank's body for dm_thread_world_run; returns DM_OK or a failure status. */
typedef int (*dm_rank_fn)(dm_collective* c, void* user_data);

/* >>mesh desc  Named dims over a world collective, row-major (the last dim innermost: ranks that
   differ by 1 differ in the last coordinate). One sub-collective per dim: the ranks that share
   every other coordinate. Sizes: at most one 0 ("infer from world size"). A failed create
   leaves its message in dm_last_error(world); every later failure on a mesh (an unknown, empty
   or out-of-range dim) returns -1 / NULL, writes dm_mesh_last_error(m) and is logged. */
typedef struct dm_mesh_desc {
    dm_collective* world;               /* required; borrowed, must outlive the mesh */
    int ndims;                          /* required, 1..DM_MAX_DIMS */
    const char* dim_names[DM_MAX_DIMS]; /* required, distinct, < DM_MAX_DIM_NAME bytes */
    int dim_sizes[DM_MAX_DIMS];         /* 0 -> world_size / product of the others (one at most) */
    dm_logger logger;                   /* 0 -> the world's logger */
    dm_allocator allocator;             /* 0 -> the world's allocator */
} dm_mesh_desc;

/* LLaMA-Factory's DistributedStrategy: a model mesh (mp_replicate x mp_shard) and a data mesh
   (dp x cp) over one world. When the world has one rank every size is forced to 1 (the seed
   forces mp_shard and dp to 1 and keeps mp_replicate and cp; docs/seeds.md). */
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
    dm_logger logger;           /* 0 -> the world's logger */
    dm_allocator allocator;     /* 0 -> the world's allocator; set both or neither */
} dm_strategy_desc;

/* >>functions status  Status codes, dtypes, conversions. */
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
   uses; exposed for tests and custom algorithms. dst and src must not overlap. */
DM_API dm_status dm_reduce_local(dm_dtype dtype, dm_reduce_op op, void* dst, const void* src,
                                 size_t count);
/* buf[i] /= divisor, the final step of MEAN (integer: truncating). */
DM_API dm_status dm_divide_local(dm_dtype dtype, void* buf, size_t count, int divisor);

/* >>functions logging  dm_log_stderr prints one line per message at or above DISTMESH_LOG's level
   (read at each message; default warn): "distmesh error: <message> [DM_ERR_...] (file:line)".
   user_data is unused. */
DM_API void dm_log_stderr(dm_log_level level, dm_status status, const char* message,
                          const char* file, int line, void* user_data);
/* DM_CHECK(c, call): runs call (an expression giving a dm_status); on failure prints one line to
   stderr, "distmesh rank R: <call> failed at <file>:<line> [DM_ERR_...]: <dm_last_error(c)>", and
   exits the process with EXIT_FAILURE (peers then see it leave and fail fast, as with a crash).
   c is the object whose dm_last_error holds the reason: the collective the call works on, the
   world for dm_mesh_create / dm_strategy_create, NULL for creates (dm_init, dm_tcp_create, ...),
   whose reason is this thread's (dm_last_error(NULL)); where the default logger already printed
   it, the line says so instead of repeating it. */
#define DM_CHECK(c, call)                                                                   \
    do {                                                                                    \
        dm_status dm_check_status_ = (call);                                                \
        if (dm_check_status_ != DM_OK) dm_check_failed((c), dm_check_status_, #call, __FILE__, __LINE__); \
    } while (0)
_DM_NORETURN DM_API void dm_check_failed(const dm_collective* c, dm_status status, const char* call,
                                         const char* file, int line);

/* >>functions hashing  SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), libc only: what the
   TCP backend's token handshakes are built on; exposed for tests and for users' own checks. */
typedef struct dm_sha256_ctx {
    uint32_t h[8];
    uint64_t bytes;             /* message bytes so far */
    unsigned char buf[64];      /* partial block */
    size_t used;
} dm_sha256_ctx;
DM_API void dm_sha256_init(dm_sha256_ctx* ctx);
DM_API void dm_sha256_update(dm_sha256_ctx* ctx, const void* data, size_t size);
DM_API void dm_sha256_final(dm_sha256_ctx* ctx, unsigned char out[32]);
DM_API void dm_sha256(const void* data, size_t size, unsigned char out[32]);
/* HMAC-SHA256 of msg under key (any length; keys above 64 bytes are hashed first). */
DM_API void dm_hmac_sha256(const void* key, size_t key_size, const void* msg, size_t msg_size,
                           unsigned char out[32]);

/* >>functions environment */
DM_API dm_status dm_env_detect(dm_env* out);
/* 0 CUDA devices without CUDA support; with DISTMESH_NCCL the CUDA runtime's count. */
DM_API int dm_device_count(void);

/* >>functions create  Create and destroy. */
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
    dm_logger logger;           /* 0 -> the default logger (dm_logger) */
    dm_allocator allocator;     /* 0 -> malloc/free */
} dm_init_desc;
DM_API dm_status dm_init(const dm_init_desc* desc, dm_collective** out);
/* Collective teardown of the collective and everything it owns (its local sub-collective).
   Accepts NULL. Sub-collectives made by dm_split are independent objects: destroy them too. */
DM_API void dm_destroy(dm_collective* c);

/* >>functions accessors  No communication. */
DM_API int dm_rank(const dm_collective* c);
DM_API int dm_world_size(const dm_collective* c);
DM_API int dm_local_rank(const dm_collective* c);
DM_API int dm_local_world_size(const dm_collective* c);
DM_API bool dm_is_master(const dm_collective* c);        /* rank 0 */
DM_API bool dm_is_local_master(const dm_collective* c);  /* local rank 0 */
DM_API dm_device dm_default_device(const dm_collective* c);
DM_API const char* dm_backend_name(const dm_collective* c); /* "fake", "thread", "tcp", "nccl" */
/* What carries this group's bytes: "shm" (shared memory between processes of one host), "tcp"
   (sockets), "shm+tcp" (shared memory within each host, sockets across), "self" (a one-rank
   TCP group), "thread", "fake", "nccl". Chosen per group at create and split
   (DISTMESH_TRANSPORT, dm_tcp_desc.transport). */
DM_API const char* dm_transport_name(const dm_collective* c);
/* The algorithm the last collective on c ran (docs/design.md "Across hosts"): "flat_ring", "flat_rd",
   "two_level_ring", "two_level_rd", "three_level" (all_reduce, reduce; the last across sites), "flat_ring_single_copy" (a large
   all_reduce among the ranks of one host whose all-gather read the peers' buffers directly),
   "flat_ring" / "two_level_ring" / "three_level_ring" (all_gather, reduce_scatter), "flat_chain" /
   "two_level_chain" / "three_level_chain" (broadcast), "flat_dissemination" / "two_level_dissemination" /
   "three_level_dissemination" (barrier); "" before the first and on
   backends that do not say (fake, nccl). Read it with nothing in flight. */
DM_API const char* dm_last_algorithm(const dm_collective* c);
/* The native handle (the seeds' process_group): ncclComm_t for NCCL, NULL where none. */
DM_API void* dm_native_handle(dm_collective* c);
/* The last failure's message on c: "" after success; never NULL. dm_last_error(NULL): why the
   last create on this thread failed (dm_init, dm_fake_create, dm_thread_world_create / _run,
   dm_tcp_create, dm_nccl_create; kept per thread, like errno, until this thread's next create),
   else "no collective (NULL)". */
DM_API const char* dm_last_error(const dm_collective* c);
DM_API uint64_t dm_sequence(const dm_collective* c);    /* collectives started so far */
/* Deadline of each later blocking call; < 0 waits forever, 0 restores the default
   (DISTMESH_TIMEOUT, else DM_DEFAULT_TIMEOUT_MS). DM_ERR_BUSY while requests are in flight;
   DM_ERR_ENV with 0 and a malformed DISTMESH_TIMEOUT. */
DM_API dm_status dm_set_timeout(dm_collective* c, int timeout_ms);

/* >>functions inside  Seeing inside (docs/inside.md). Read from the environment when a collective
   is made; a sub-collective (dm_split, dm_local, mesh dims, dm_shrink, dm_grow) shares its
   parent's file and dump.
     DISTMESH_TRACE=DIR          timeline: each rank writes Chrome trace-event JSON (Perfetto,
                                 chrome://tracing) to DIR/dm_trace.rank<R>.pid<P>.json, one
                                 event per operation, flushed every 100 ms, 128 KiB and on failure
     DISTMESH_FLIGHT_RECORDER=N  the last N operations of each collective kept in memory with
                                 their state (queued, running, done, failed); default 64, 0 off
     DISTMESH_DUMP_DIR=DIR       where the flight recorder is dumped as JSON
                                 (DIR/dm_fr.rank<R>.pid<P>.json) when an operation times out,
                                 aborts, loses a peer or sees a mismatch; unset: no automatic dump
     DISTMESH_DUMP_ON_SIGUSR1=1  also dump on SIGUSR1 (a handler that writes to a pipe and a
                                 thread that dumps; installed only with the recorder on and
                                 DISTMESH_DUMP_DIR set)
   scripts/dm_trace DIR reads every rank's files: who never arrived, who is late. */
/* Writes the flight recorder of this rank (every collective sharing c's rank state) to path,
   or with path NULL to DISTMESH_DUMP_DIR (else DISTMESH_TRACE's DIR), and flushes the
   timeline. Callable from any thread, a watchdog's while c's own thread is stuck in a call
   included (its failure message then goes to the logger only, last_error being that thread's).
   DM_ERR_UNSUPPORTED when both are off (DISTMESH_FLIGHT_RECORDER=0, no DISTMESH_TRACE) or the
   implementation was built with DISTMESH_NO_TRACE; DM_ERR_INVALID_ARG with no place to write. */
DM_API dm_status dm_flight_recorder_dump(dm_collective* c, const char* path);

/* >>functions collectives */
DM_API dm_status dm_barrier(dm_collective* c);
/* Reduction order. For a given world size the threaded world, shared memory and TCP reduce in
   the same order, so floating-point results are the same bytes on all three (the fake world
   emulates it for its identical ranks; NCCL has its own). With v[r] rank r's value and ranks in
   ring order (rank order on one host; host by host, then rank, across hosts):
   - all_reduce of at most 64 KiB, or of fewer elements than ranks: recursive doubling. With p
     the largest power of two <= world size and rem = world size - p, rank 2i+1 first holds
     v[2i+1] op v[2i] for i < rem; the p remaining ranks, in rank order, then combine pairwise
     at distances 1, 2, 4, ... (a op b == b op a bitwise for every op, so partners agree).
   - larger all_reduce and every reduce_scatter: the ring. The buffer is cut into world-size
     blocks (the first count % world get one element more); block b is folded starting at the
     rank after b's owner in ring order, each rank applying its own value to the partial sum
     received, ending at b's owner. MEAN divides once, at the end. */
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
/* Object collectives trust peers' announced sizes only so far: what one call receives (padded
   to the largest object for all_gather_objects) may not exceed DISTMESH_MAX_OBJECT_BYTES
   (bytes, K/M/G suffix allowed; default 1 GiB), checked before anything is allocated, and
   each rank's size must match what it announced; beyond it DM_ERR_PROTOCOL names the rank.
   Every rank contributes one object (size > 0) and receives all world_size of them. */
DM_API dm_status dm_all_gather_objects(dm_collective* c, const void* data, size_t size,
                                       dm_blob_list* out);
/* root passes count objects (each size > 0); every rank, root included, receives a copy. */
DM_API dm_status dm_broadcast_objects(dm_collective* c, const dm_blob* objects, size_t count,
                                      int root, dm_blob_list* out);
DM_API void dm_blob_list_free(dm_collective* c, dm_blob_list* list);
/* Waits for the backend's queued work (NCCL's stream); DM_OK at once where nothing is queued.
   Like a blocking call it belongs to the collective's thread (DM_ERR_BUSY from another one), and
   dm_shrink(DM_SHRINK_ABORT) on another thread interrupts it (DM_ERR_ABORTED). */
DM_API dm_status dm_synchronize(dm_collective* c);

/* >>functions compression  A compressed all-reduce across hosts (docs/design.md#compression).
   Only the stage between hosts is compressed: inside a host the sum stays exact (shared
   memory), and every rank gets the same bits whatever the host count, ring order or
   membership. Float32, bfloat16 and float16 sums and means only.
     DM_COMPRESS_INT8  8-bit codes; one scale per block of DM_COMPRESS_BLOCK elements, agreed
                       by all hosts first (the largest magnitude of the block on any host / 127),
                       so the codes of all hosts sum exactly as integers: the sum's error is at
                       most H x scale / 2 per element (H hosts), a block holding an inf or NaN
                       comes out NaN in every element
     DM_COMPRESS_BF16  bfloat16 values (round to nearest even), summed in float32 in host order;
                       from 3 hosts on the partial sums go back rounded to bfloat16 once
   The compressed form runs where the group spans 2 or more hosts, a two-level schedule may run
   (DISTMESH_ALGO not flat) and each rail block has an element per host; elsewhere the call is
   exact and dm_last_algorithm names the exact algorithm ("two_level_int8" / "two_level_bf16"
   when compressed). Across sites (DISTMESH_SITE) only the link between sites is compressed
   ("three_level_int8" / "three_level_bf16": the sums inside each site stay exact). All ranks must pass the same mode: different ones fail every rank with
   DM_ERR_MISMATCH. A mode on an integer dtype or with MAX, MIN or PROD is DM_ERR_INVALID_ARG
   before anything is sent. The NCCL backend takes none (DM_ERR_UNSUPPORTED); the Fake world
   runs them exact. */
typedef enum dm_compress {
    DM_COMPRESS_DEFAULT = 0,    /* DISTMESH_COMPRESS for float sums and means (unset: none), else none */
    DM_COMPRESS_NONE,
    DM_COMPRESS_BF16,
    DM_COMPRESS_INT8,
    DM_COMPRESS_COUNT
} dm_compress;
#define DM_COMPRESS_BLOCK 256
/* Error feedback: what compression dropped on this rank, kept as float32 per element of one
   buffer (make one state per gradient buffer, count its elements) and added to that buffer's
   next call. It belongs to the rank, not to a collective: after dm_shrink or dm_grow pass the
   same state to the new group's calls (it stays valid whatever the new layout); a newcomer
   makes a fresh one (zeros). Not thread-safe: one call at a time per state. */
typedef struct dm_compress_state dm_compress_state;
DM_API dm_status dm_compress_state_create(size_t count, dm_compress_state** out);
DM_API void dm_compress_state_destroy(dm_compress_state* s);
DM_API size_t dm_compress_state_count(const dm_compress_state* s);
/* The residual (count floats): read it to checkpoint, write it to restore, zero it to reset. */
DM_API float* dm_compress_state_residual(dm_compress_state* s);
DM_API const char* dm_compress_name(dm_compress mode);    /* "default", "none", "bf16", "int8" */
/* dm_all_reduce with a compression mode and optional error-feedback state (NULL: none; with
   DM_COMPRESS_NONE a state's residual is added and cleared, the call exact). */
DM_API dm_status dm_all_reduce_compressed(dm_collective* c, const void* send, void* recv, size_t count,
                                          dm_dtype dtype, dm_reduce_op op, dm_compress mode,
                                          dm_compress_state* state);

/* >>functions rooted  Rooted collectives. Like MPI: recv (reduce, gather) and send (scatter) are read
   only at the root and may be NULL elsewhere. In place: reduce send NULL (or == recv) at the
   root; gather send NULL (or == recv + root*count) at the root; scatter recv NULL (or == send +
   root*count) at the root. reduce folds in the order dm_all_reduce documents, so the root gets
   the same bits dm_all_reduce would give. */
DM_API dm_status dm_reduce(dm_collective* c, const void* send, void* recv, size_t count,
                           dm_dtype dtype, dm_reduce_op op, int root);
/* recv (root only) holds world_size * count elements, rank r's block at recv + r*count. */
DM_API dm_status dm_gather(dm_collective* c, const void* send, void* recv, size_t count,
                           dm_dtype dtype, int root);
/* send (root only) holds world_size * count elements; rank r receives block r. */
DM_API dm_status dm_scatter(dm_collective* c, const void* send, void* recv, size_t count,
                            dm_dtype dtype, int root);

/* >>functions all-to-all  send and recv hold world_size blocks of count elements: block j of
   send goes to rank j, block i of recv comes from rank i. send NULL (or == recv): in place. */
DM_API dm_status dm_all_to_all(dm_collective* c, const void* send, void* recv, size_t count,
                               dm_dtype dtype);
/* The same with per-rank counts and offsets (size_t arrays of world_size, in elements): rank i
   sends send_counts[j] elements from send + send_offsets[j] to rank j, which receives
   recv_counts[i] of them at recv + recv_offsets[i]. Zero counts are allowed; every pair's
   counts must agree (send_counts[j] on i == recv_counts[i] on j), else DM_ERR_MISMATCH on
   both ranks. Blocks of one buffer must not overlap; send NULL means in place (recv's blocks
   are sent, then overwritten). */
DM_API dm_status dm_all_to_all_v(dm_collective* c, const void* send, const size_t* send_counts,
                                 const size_t* send_offsets, void* recv, const size_t* recv_counts,
                                 const size_t* recv_offsets, dm_dtype dtype);

/* >>functions point-to-point  Not collective calls: only the two ranks take part, and they do
   not count in dm_sequence. Messages from one rank to another with the same tag are received
   in the order they were sent; messages with different tags may be received in any order.
   tag >= 0; peer != own rank (like torch.distributed).
   - dm_send returns once the message is handed to the link: it does not wait for the matching
     dm_recv (a receiver that has not posted it yet keeps the message until it does, up to
     DISTMESH_MAX_OBJECT_BYTES buffered per collective), so two ranks may both send first.
     With the _async twins either may also come first: dm_recv_async then dm_send_async on
     both ranks completes (a run of point-to-point requests runs its sends first;
     >>functions async). Blocking calls run in the order made: two ranks that both dm_recv
     first wait for each other until the deadline.
   - dtype and count must match: a dm_recv given another count or dtype than the message's
     fails with DM_ERR_MISMATCH naming both, and breaks the collective, so the sender's
     pending or next call fails with DM_ERR_MISMATCH too (the error reaches both sides).
   - Deadlines and peer loss as for collectives (DM_ERR_TIMEOUT, DM_ERR_PEER_LOST).
   - A dm_recv whose peer has moved on to a collective that sent this rank its first bytes
     could never be matched: it fails at once with DM_ERR_MISMATCH naming both calls. Where the
     peer's collective has not sent to this rank (it waits on others first), the two wait for
     each other until the deadline (DM_ERR_TIMEOUT), as in MPI.
   - NCCL: ncclSend/ncclRecv. Messages between a pair match in issue order (tags are not
     sent); a send waits on the GPU for its receive, so two ranks that both send first hang
     until the deadline (order them: one sends first, the other receives); counts and dtypes are
     not compared (a mismatch corrupts data or hangs instead of DM_ERR_MISMATCH), nor are
     all_to_all_v's counts. */
DM_API dm_status dm_send(dm_collective* c, const void* buf, size_t count, dm_dtype dtype,
                         int peer, int tag);
DM_API dm_status dm_recv(dm_collective* c, void* buf, size_t count, dm_dtype dtype, int peer,
                         int tag);
/* Receive from any source (MPI_ANY_SOURCE, Gloo's recv from a list of ranks): dm_recv_any
   takes the first message with this tag from any rank and writes its sender's rank to
   *source (source may be NULL; -1 on failure). dm_recv(c, ..., DM_ANY_SOURCE, tag) is the same
   without the sender. Which message is first:
   - a message this rank already keeps (it arrived before any recv asked for it: read while
     this rank sent, waited, or received from a peer) comes before any other, the earliest
     read first;
   - else every peer's link is read in turn until the header of a message with the tag is in;
     that message is taken, and others with the tag that arrive meanwhile are kept for later
     receives. Across peers "first" is the order this rank reads them, not the order they
     were sent; from one peer, messages with one tag are taken in the order sent (as for a
     named recv).
   - Receives match in the order they run: a named recv (or an any-source one) that runs
     earlier takes its message first; one that runs later finds what the earlier ones left.
     Queued receives run in issue order (after the sends of their run, >>functions async), so
     between requests "earlier" is issue order.
   - A peer that has moved on to a collective is not waited on (its later messages come after
     it); with no message the call waits for its deadline (DM_ERR_TIMEOUT naming the tag).
     count and dtype must match the message taken, as for dm_recv (DM_ERR_MISMATCH).
   - TCP connects on demand: a rank that has never talked to this one connects during the wait
     and is read from then on. A 1-rank collective has no other rank: DM_ERR_INVALID_ARG.
   - Backends: TCP and the threaded world; NCCL has no receive from any source
     (DM_ERR_UNSUPPORTED, with a message); the Fake backend has no point-to-point
     (DM_ERR_UNSUPPORTED). */
#define DM_ANY_SOURCE (-2)
DM_API dm_status dm_recv_any(dm_collective* c, void* buf, size_t count, dm_dtype dtype, int tag,
                             int* source);

/* >>functions async  Non-blocking calls. Every call above has an _async twin taking a trailing
   dm_request** out: it checks its arguments (a failure returns at once, *out = NULL), queues
   the operation and returns DM_OK with *out set. Rules:
   - Progress needs no polling: a progress thread of the collective (started by the first
     _async call) runs queued operations one at a time in issue order, while the caller
     computes. NCCL queues them on its stream instead (the request wraps a CUDA event).
   - Point-to-point requests may be posted in any order (torch's batch_isend_irecv, pipeline
     stages): in a run of consecutive sends and receives (blocking ones queued behind requests
     included) the progress thread runs the sends first, then the receives in issue order, so
     a rank may post a dm_recv_async before the dm_send_async its peer waits for, and two
     ranks that both do so both complete. A run of receives only, with nothing queued after
     it, is held back until something more is queued, someone waits for or tests one of them
     (dm_wait, dm_test, a blocking call on c), or dm_destroy: so a send posted after the
     receive still joins its run. Once started, a receive runs to its end before anything
     queued later starts (a send posted after dm_wait / dm_test released the receives waits
     behind them). Collectives are never reordered: a run ends at the next collective. NCCL's
     requests go to its stream in issue order instead (see >>functions point-to-point).
   - Requests complete in issue order: when one is done, every earlier one on the same
     collective is done too (a send that ran before an earlier receive is done when that
     receive is). A blocking call made while requests are in flight queues behind them and
     waits.
   - The buffers (and the arrays of pointers, counts and offsets) belong to the library until
     the request is complete: do not read or write them before dm_wait / dm_test says done.
   - dm_wait(req) waits, frees the request and returns the operation's status (its message in
     dm_last_error(c)). dm_test(req, &done) never blocks: done false and DM_OK while it runs;
     once done it returns the status and frees the request like dm_wait. dm_wait_all waits
     for all n (NULL entries skipped), frees them, sets each entry NULL and returns the first
     failure in array order, else DM_OK.
   - Deadlines: a request's (dm_set_timeout) counts from when the progress thread starts it
     (a held-back receive: when it starts, after its release; NCCL: from the _async call). A
     failure that breaks the collective (a lost peer, a passed deadline, a mismatch) completes
     every request not started yet with the same status, without running it.
   - Threads: a collective with requests in flight belongs to the thread that issued them;
     another thread's call on it (blocking or not) returns DM_ERR_BUSY and changes nothing.
     Two threads calling at once without requests also get DM_ERR_BUSY for one of them. Wait
     on the issuing thread. dm_destroy waits for the queued requests and frees them. */
typedef struct dm_request dm_request;
DM_API dm_status dm_wait(dm_request* req);
DM_API dm_status dm_test(dm_request* req, bool* done);
DM_API dm_status dm_wait_all(dm_request** reqs, size_t n);
DM_API dm_status dm_barrier_async(dm_collective* c, dm_request** out);
DM_API dm_status dm_all_reduce_async(dm_collective* c, const void* send, void* recv, size_t count,
                                     dm_dtype dtype, dm_reduce_op op, dm_request** out);
DM_API dm_status dm_all_reduce_compressed_async(dm_collective* c, const void* send, void* recv, size_t count,
                                                dm_dtype dtype, dm_reduce_op op, dm_compress mode,
                                                dm_compress_state* state, dm_request** out);
DM_API dm_status dm_all_gather_async(dm_collective* c, const void* send, void* recv, size_t count,
                                     dm_dtype dtype, dm_request** out);
DM_API dm_status dm_all_gather_to_list_async(dm_collective* c, const void* send, void* const* recvs,
                                             size_t count, dm_dtype dtype, dm_request** out);
DM_API dm_status dm_reduce_scatter_async(dm_collective* c, const void* send, void* recv,
                                         size_t recv_count, dm_dtype dtype, dm_reduce_op op,
                                         dm_request** out);
DM_API dm_status dm_broadcast_async(dm_collective* c, void* buf, size_t count, dm_dtype dtype,
                                    int root, dm_request** out);
DM_API dm_status dm_all_gather_objects_async(dm_collective* c, const void* data, size_t size,
                                             dm_blob_list* out_list, dm_request** out);
DM_API dm_status dm_broadcast_objects_async(dm_collective* c, const dm_blob* objects, size_t count,
                                            int root, dm_blob_list* out_list, dm_request** out);
DM_API dm_status dm_reduce_async(dm_collective* c, const void* send, void* recv, size_t count,
                                 dm_dtype dtype, dm_reduce_op op, int root, dm_request** out);
DM_API dm_status dm_gather_async(dm_collective* c, const void* send, void* recv, size_t count,
                                 dm_dtype dtype, int root, dm_request** out);
DM_API dm_status dm_scatter_async(dm_collective* c, const void* send, void* recv, size_t count,
                                  dm_dtype dtype, int root, dm_request** out);
DM_API dm_status dm_all_to_all_async(dm_collective* c, const void* send, void* recv, size_t count,
                                     dm_dtype dtype, dm_request** out);
DM_API dm_status dm_all_to_all_v_async(dm_collective* c, const void* send, const size_t* send_counts,
                                       const size_t* send_offsets, void* recv,
                                       const size_t* recv_counts, const size_t* recv_offsets,
                                       dm_dtype dtype, dm_request** out);
DM_API dm_status dm_send_async(dm_collective* c, const void* buf, size_t count, dm_dtype dtype,
                               int peer, int tag, dm_request** out);
DM_API dm_status dm_recv_async(dm_collective* c, void* buf, size_t count, dm_dtype dtype, int peer,
                               int tag, dm_request** out);
/* *source, like buf, is written when the request completes (read it after dm_wait / dm_test). */
DM_API dm_status dm_recv_any_async(dm_collective* c, void* buf, size_t count, dm_dtype dtype, int tag,
                                   int* source, dm_request** out);

/* >>functions groups */
#define DM_SPLIT_NONE (-1)
/* Like MPI_Comm_split: ranks passing the same color >= 0 form a new collective, ordered by
   (key, old rank). color DM_SPLIT_NONE: *out = NULL and DM_OK. Collective call. */
DM_API dm_status dm_split(dm_collective* c, int color, int key, dm_collective** out);

/* >>functions abort  Stops c from any thread (a watchdog; the thread a signal handler wakes):
   the call running on c (blocking, or a request on its progress thread) fails soon with
   DM_ERR_ABORTED and "<backend>: rank R aborted: <reason>", requests queued behind it complete
   with the same status unrun, and every later call on c fails with it. On TCP and the
   threaded world the peers learn at once (the abort is posted where every rank finds it, then
   the links hang up), so their calls fail with DM_ERR_ABORTED and a message naming this rank
   instead of waiting for their deadlines. Returns without waiting for the running call; a
   second call changes nothing. reason NULL -> "dm_abort". Not async-signal-safe: a signal
   handler wakes a thread that calls it. NCCL: the peers learn nothing (their calls end by
   their deadline or an NCCL error); the communicator is aborted (ncclCommAbort, so kernels
   waiting on a dead peer stop) by the running call at its next look at the stream or the
   communicator, or, with none running, by dm_abort itself, which then waits (within c's
   timeout) for the collective to be free. Afterwards c can only be destroyed. */
DM_API dm_status dm_abort(dm_collective* c, const char* reason);

/* >>functions shrink and grow  A group goes on without ranks that died or leave, and takes
   newcomers, without a new rendezvous of the survivors (docs/failures.md).
   dm_shrink: every rank that stays calls it (the excluded and the dead do not); *out is a new
   collective of the ranks that stay, renumbered in their old order, with the same transports,
   timeout and logger. c can then only be destroyed (its calls fail with DM_ERR_ABORTED).
   - DM_SHRINK_DEFAULT: a planned removal; nothing may be in flight on c (DM_ERR_BUSY).
   - DM_SHRINK_ABORT: after a failure. Requests in flight are aborted and complete first, each
     with its error; then the survivors agree, over their own connections and without the
     store, on who is gone: the excluded ranks, the dead ones, and any that die meanwhile. A
     failure during the agreement gives every survivor the same group or an error by the
     deadline (c's timeout), never two different groups; a rank that dies after it stays a
     member, and the new group's first call reports it (shrink again). NCCL has no agreement:
     the survivors must pass the same list and flags (unchecked: a disagreement hangs until the
     deadline or builds different groups); with a store, DM_SHRINK_ABORT re-initialises
     through it (distmesh_nccl.h, SHRINK).
   exclude: n_exclude ranks of c (never the caller's own); give every caller the same list (a
   rank that is alive, listed by some callers only, is waited for by the others until their
   deadline). On the threaded world the excluded ranks are the ones gone (threads cannot die).
   NCCL cannot find dead ranks itself: there n_exclude 0 is DM_ERR_INVALID_ARG, c untouched. */
#define DM_SHRINK_DEFAULT 0
#define DM_SHRINK_ABORT 1
DM_API dm_status dm_shrink(dm_collective* c, const int* exclude, int n_exclude, int flags, dm_collective** out);
/* Every member calls it at a step boundary, with nothing in flight; n_new newcomers join (how,
   per backend: docs/failures.md "Grow back") and take ranks size .. size + n_new - 1 of *out,
   the members keeping theirs. c stays usable; destroy it when done. */
DM_API dm_status dm_grow(dm_collective* c, int n_new, dm_collective** out);
/* The node-local sub-collective (ranks on this host), made on first use: a collective call the
   first time, owned by c afterwards (do not destroy it). NULL on failure, see dm_last_error(c). */
DM_API dm_collective* dm_local(dm_collective* c);
/* The seeds' main_process_first: non-masters wait in begin while the master works; the master
   waits in end for them. local_only uses the node-local group. Pair every begin with an end. */
DM_API dm_status dm_main_process_first_begin(dm_collective* c, bool local_only);
DM_API dm_status dm_main_process_first_end(dm_collective* c, bool local_only);

/* >>functions mesh */
DM_API dm_status dm_mesh_create(const dm_mesh_desc* desc, dm_mesh** out);
/* dp x tp mesh of Optimus-DL (TP innermost: dp_rank = rank / tp, tp_rank = rank % tp). */
DM_API dm_status dm_mesh_create_dp_tp(dm_collective* world, int tp_size, dm_mesh** out);
DM_API void dm_mesh_destroy(dm_mesh* m);
DM_API int dm_mesh_ndims(const dm_mesh* m);
DM_API const char* dm_mesh_dim_name(const dm_mesh* m, int dim_index);     /* NULL if out of range */
DM_API int dm_mesh_dim_index(const dm_mesh* m, const char* name);         /* -1 if unknown */
/* name NULL -> the whole world (the seeds' dim=None). Unknown or empty name: rank/size -1 and
   group NULL, with a message in dm_mesh_last_error ("" until a failure; a success leaves it). */
DM_API int dm_mesh_rank(const dm_mesh* m, const char* name);
DM_API int dm_mesh_size(const dm_mesh* m, const char* name);
DM_API dm_collective* dm_mesh_group(dm_mesh* m, const char* name);       /* owned by the mesh */
DM_API dm_collective* dm_mesh_world(const dm_mesh* m);
DM_API const char* dm_mesh_last_error(const dm_mesh* m);
/* Optimus-DL accessors on a mesh with dims "dp" and "tp" (missing dim: size 1, rank 0, not a
   failure; NULL mesh: -1 / NULL). */
DM_API int dm_mesh_dp_rank(const dm_mesh* m);
DM_API int dm_mesh_dp_world_size(const dm_mesh* m);
DM_API int dm_mesh_tp_rank(const dm_mesh* m);
DM_API int dm_mesh_tp_world_size(const dm_mesh* m);
DM_API dm_collective* dm_mesh_tp_world(dm_mesh* m);

/* >>functions strategy  LLaMA-Factory's DistributedStrategy. Errors carry the seed's
   messages, e.g. "mp_replicate_size * mp_shard_size must equal to world_size, got 3 * 3 != 8.".
   - dm_strategy_create fails with a status, *out == NULL and the message in
     dm_last_error(desc->world) (there is no strategy to hold it), logged as below; a NULL desc
     or world has nowhere to hold it (status only, plus the desc's logger for a NULL world).
   - size / rank / group given a dm_dim outside DM_DIM_MP_REPLICATE..DM_DIM_CP (C's dim=None)
     return -1 / NULL and write the seed's get_device_mesh message "dim must be specified." to
     dm_strategy_last_error(s), logged with DM_ERR_INVALID_ARG through the desc's logger (else
     the world's). dm_strategy_last_error is "" until a failure; a success leaves it as it was
     (queries that succeed write nothing, so several threads may query one strategy).
   - dm_strategy_validate writes its message to error. */
DM_API dm_status dm_strategy_create(const dm_strategy_desc* desc, dm_strategy** out);
DM_API void dm_strategy_destroy(dm_strategy* s);
DM_API const char* dm_dim_name(dm_dim dim);             /* "mp_replicate", ..., "invalid" */
DM_API int dm_strategy_size(const dm_strategy* s, dm_dim dim);   /* resolved size, -1 if bad dim */
DM_API int dm_strategy_rank(const dm_strategy* s, dm_dim dim);   /* rank along dim, -1 if bad */
DM_API dm_collective* dm_strategy_group(dm_strategy* s, dm_dim dim); /* owned by the strategy */
DM_API dm_mesh* dm_strategy_model_mesh(dm_strategy* s);  /* (mp_replicate, mp_shard) */
DM_API dm_mesh* dm_strategy_data_mesh(dm_strategy* s);   /* (dp, cp) */
/* Resolves and checks the sizes against world_size without communicating: out_sizes gets the
   four sizes, error (error_size bytes) the seed's message on DM_ERR_INVALID_ARG ("" on
   success). Logs nothing (a pure check); error may be NULL. */
DM_API dm_status dm_strategy_validate(const dm_strategy_desc* desc, int world_size,
                                      int out_sizes[DM_DIM_COUNT], char* error, size_t error_size);
DM_API const char* dm_strategy_last_error(const dm_strategy* s);   /* never NULL */

/* >>backend-authors  The vtable every backend fills and the base struct it embeds first.
   Slots are appended only; each version's end is marked. The public wrappers validate every
   argument (NULL buffers, dtype, op, root, overflow of count * dtype size, in-place layout)
   before dispatch, so slots receive clean arguments and send != NULL. */

/* One call, as the core queues it and as a backend's start slot receives it. Fields a kind
   does not use are zero. */
typedef enum dm_op_kind {
    DM_OP_BARRIER = 0, DM_OP_ALL_REDUCE, DM_OP_ALL_GATHER, DM_OP_ALL_GATHER_TO_LIST,
    DM_OP_REDUCE_SCATTER, DM_OP_BROADCAST, DM_OP_ALL_GATHER_OBJECTS, DM_OP_BROADCAST_OBJECTS,
    DM_OP_REDUCE, DM_OP_GATHER, DM_OP_SCATTER, DM_OP_ALL_TO_ALL, DM_OP_ALL_TO_ALL_V, DM_OP_SEND,
    DM_OP_RECV, DM_OP_SPLIT
} dm_op_kind;
typedef struct dm_op {
    dm_op_kind kind;
    const void* send;           /* send buffer; the buffer of send and broadcast */
    void* recv;                 /* recv buffer; the buffer of recv */
    void* const* recvs;         /* all_gather_to_list */
    size_t count;               /* elements (all_to_all_v: unused; objects: bytes or objects) */
    dm_dtype dtype;
    dm_reduce_op op;
    int root;                   /* root; the peer of send and recv */
    int tag;                    /* send, recv */
    const size_t *send_counts, *send_offsets, *recv_counts, *recv_offsets;  /* all_to_all(_v) */
    const dm_blob* objects;     /* broadcast_objects (count objects) */
    dm_blob_list* out_list;     /* object collectives */
    int color, key;             /* split */
    dm_collective** split_out;  /* split */
    dm_compress compress;       /* all_reduce: dm_all_reduce_compressed's mode (0: DISTMESH_COMPRESS) */
    dm_compress_state* compress_state;  /* all_reduce: its error-feedback state, or NULL */
    int* source;                /* recv with root DM_ANY_SOURCE: where the sender's rank goes, or NULL */
} dm_op;
/* One entry for every operation: *op is a call as its dm_* function takes it, in the fields
   above (broadcast: its buffer in recv; send and recv: the peer in root; all_to_all_v: recvs
   unused), the rest zero. The same checks and messages as that function; then out NULL runs
   it as the blocking call, else queues it as its _async form (*out the request). The dm_*
   functions are this path: their checks, then the same run (>>public calls). Bindings
   (python/) build a dm_op and come here. DM_OP_SPLIT is dm_split's only (out NULL). */
DM_API dm_status dm_submit(dm_collective* c, const dm_op* op, dm_request** out);
#define DM_COLLECTIVE_VTABLE_VERSION 5
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
    /* ---- end of version 1 ---- */
    const char* (*transport)(const dm_collective* self); /* optional: the backend's name */
    /* ---- end of version 2 ---- */
    /* Optional: the core builds reduce on all_reduce, gather on all_gather and scatter on
       broadcast (through temporaries), and all_to_all(_v) on send and recv. all_to_all also
       arrives here, with uniform counts; send NULL means in place, and the slot copies this
       rank's own block (the core has checked that its two counts agree). */
    dm_status (*reduce)(dm_collective* self, const void* send, void* recv, size_t count,
                        dm_dtype dtype, dm_reduce_op op, int root);
    dm_status (*gather)(dm_collective* self, const void* send, void* recv, size_t count,
                        dm_dtype dtype, int root);
    dm_status (*scatter)(dm_collective* self, const void* send, void* recv, size_t count,
                         dm_dtype dtype, int root);
    dm_status (*all_to_all_v)(dm_collective* self, const void* send, const size_t* send_counts,
                              const size_t* send_offsets, void* recv, const size_t* recv_counts,
                              const size_t* recv_offsets, dm_dtype dtype);
    dm_status (*send)(dm_collective* self, const void* buf, size_t count, dm_dtype dtype, int peer,
                      int tag);
    dm_status (*recv)(dm_collective* self, void* buf, size_t count, dm_dtype dtype, int peer,
                      int tag);
    /* Optional, for backends that queue work on a device (NCCL): start issues op without
       waiting for it and returns a token; finish waits for it (block) or asks (done), and
       releases the token once done. Without them the core's progress thread runs the
       blocking slots. */
    dm_status (*start)(dm_collective* self, const dm_op* op, void** token);
    dm_status (*finish)(dm_collective* self, void* token, bool block, bool* done);
    /* ---- end of version 3 ---- */
    /* Optional: dm_shrink and dm_grow. shrink gets gone[size] (the union of the excluded on
       this rank) and runs on the caller's thread with nothing in flight. */
    dm_status (*shrink)(dm_collective* self, const bool* gone, int flags, dm_collective** out);
    dm_status (*grow)(dm_collective* self, int n_new, dm_collective** out);
    /* Optional, called from another thread than the one running an operation: make it fail
       soon (DM_SHRINK_ABORT; dm_abort, which sets aborted / abort_msg first). */
    void (*interrupt)(dm_collective* self);
    /* ---- end of version 4 ---- */
    /* Optional: a recv from any peer (dm_recv_any, DM_ANY_SOURCE); *source (may be NULL) gets
       the sender. Without it those calls are DM_ERR_UNSUPPORTED. */
    dm_status (*recv_any)(dm_collective* self, void* buf, size_t count, dm_dtype dtype, int tag,
                          int* source);
    /* ---- end of version 5: append below, never reorder ---- */
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
    const char* algorithm;      /* the last collective's algorithm (a static string), or NULL */
    struct _dm_core* core;      /* the core's own state (>>core state), opaque here */
    bool shrink_needs_exclude;  /* set by a backend whose shrink cannot find dead ranks itself
                                   (NCCL): dm_shrink refuses n_exclude 0 before touching c */
};

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DISTMESH_H */

/* The rule of include order (the top comment): a strict mode (-std=c11, -std=c17, -ansi) makes
   glibc hide POSIX once a system header is in, and nothing this file does can bring it back.
   One error that says so, and no implementation after it (not hundreds of undeclared names). */
#if defined(DISTMESH_IMPLEMENTATION) && !defined(DISTMESH_IMPL_INCLUDED) && defined(__GLIBC__) && \
    (!defined(_POSIX_C_SOURCE) || _POSIX_C_SOURCE < 200809L)
#error "distmesh.h: the implementation needs POSIX 2008, which this strict mode (-std=c11, -std=c17, -ansi) hides once a system header is in: include distmesh.h with DISTMESH_IMPLEMENTATION before any other header of this file, or compile the file with -D_GNU_SOURCE or -D_POSIX_C_SOURCE=200809L (or in the compilers' default mode, gnu11/gnu17)"
#undef DISTMESH_IMPLEMENTATION
#endif

/* ============================================================================================ */
/* >>implementation                                                                              */
/* ============================================================================================ */
#if defined(DISTMESH_IMPLEMENTATION) && !defined(DISTMESH_IMPL_INCLUDED)
#define DISTMESH_IMPL_INCLUDED

/* >>config */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <limits.h>
#include <float.h>
#include <math.h>
#include <time.h>
#include <pthread.h>
#include <unistd.h>
#include <stddef.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <fcntl.h>                      /* >>trace's files */
#include <signal.h>                     /* >>trace's SIGUSR1 */
#if defined(__linux__)
#include <sys/syscall.h>                /* SYS_sched_getaffinity: see _dm_eng_move_off */
#endif
#if defined(DISTMESH_CUDA)
#include <cuda_runtime.h>               /* >>cuda */
#endif
#if defined(DISTMESH_OPENSSL)
#include <openssl/evp.h>               /* >>sealed records: AES-256-GCM */
#endif

#ifndef DM_ASSERT
#include <assert.h>
#define DM_ASSERT(c) assert(c)
#endif

#if defined(__GNUC__) || defined(__clang__)
#define _DM_PRIVATE static __attribute__((unused))
#define _DM_PRINTF(fmt_index, args_index) __attribute__((format(printf, fmt_index, args_index)))
#define _DM_COLD __attribute__((noinline, cold))    /* kept out of a hot caller's registers */
#define _DM_ALWAYS_INLINE __attribute__((always_inline)) inline     /* where -O2 declines and it counts */
#else
#define _DM_PRIVATE static
#define _DM_PRINTF(fmt_index, args_index)
#define _DM_COLD
#define _DM_ALWAYS_INLINE
#endif

/* The kernels' accumulator and source never alias; saying so lets -O2 vectorise them. */
#if defined(__GNUC__) || defined(__clang__) || defined(_MSC_VER)
#define _DM_RESTRICT __restrict
#else
#define _DM_RESTRICT
#endif
#define _DM_ZERO(type, name) type name; memset(&name, 0, sizeof(name))
#define _dm_def(v, dflt) ((v) ? (v) : (dflt))
#define _DM_TRY(expr) do { dm_status st_ = (expr); if (st_ != DM_OK) return st_; } while (0)
#define _DM_PICK_SMALL_BYTES ((size_t)64 << 10)  /* all_reduce at or below: recursive doubling */

/* >>compile cost  The implementation sits in the includer's translation unit and is compiled with
   its flags on every build of that file. Most of it runs once per create (rendezvous, the store,
   env and config parsing, hellos, the trace's files, the mesh) or on a failure (shrink, dumps):
   those sections sit between _DM_COLD_BEGIN and _DM_COLD_END and compile as for debugging (gcc:
   -Og, not -O0, where _FORTIFY_SOURCE's checks cannot fold; clang: optnone, as it has no
   per-function level). With DISTMESH_TCP that takes two fifths (gcc) to half (clang) off the
   TU's time at -O2 / -O3, the core alone a fifth to a quarter (docs/dropin.md). What runs per
   call or per byte (wrappers, engine, links, schedules, kernels, the flight recorder) keeps the
   includer's level; the kernels ask for -O3 themselves. A function in a cold region is not
   inlined into hot code, so hot code calls into one only on creates, first calls, splits and
   failures (scripts/check_cold.py, run by tests/dropin.mk, holds that and the markers).
   Nothing changes at -O0 or -Os; DISTMESH_OPTIMIZE_ALL compiles everything at the includer's
   level. Measured by `make compile-cost` (scripts/compile_cost.sh). */
#if !defined(DISTMESH_OPTIMIZE_ALL) && defined(__OPTIMIZE__) && !defined(__OPTIMIZE_SIZE__) && defined(__clang__)
#define _DM_COLD_BEGIN _Pragma("clang optimize off")
#define _DM_COLD_END _Pragma("clang optimize on")
#elif !defined(DISTMESH_OPTIMIZE_ALL) && defined(__OPTIMIZE__) && !defined(__OPTIMIZE_SIZE__) && defined(__GNUC__)
#define _DM_COLD_BEGIN _Pragma("GCC push_options") _Pragma("GCC optimize(\"Og\")")
#define _DM_COLD_END _Pragma("GCC pop_options")
#else
#define _DM_COLD_BEGIN
#define _DM_COLD_END
#endif
/* The rest of the implementation outside the kernels (>>float semantics) compiles, with gcc,
   without what -O3 adds to -O2 for loops (loop distribution and interchange, unswitching,
   peeling, versioning, the vectoriser's dynamic cost model, cp-cloning, partial PRE): those pay
   off on loops over data, and only the kernels have them; the control code they lengthen runs a
   few times per call. That is 3% of gcc -O3's time with DISTMESH_TCP, and nothing changes at
   -O2 and below, where those are off already. -O3's larger inlining limits stay (gcc's optimize
   refuses --param, and "O2" would raise -Og and -O1, which no macro tells apart). */
#if !defined(DISTMESH_OPTIMIZE_ALL) && defined(__OPTIMIZE__) && !defined(__OPTIMIZE_SIZE__) && \
    defined(__GNUC__) && !defined(__clang__)
#define _DM_WARM_BEGIN _Pragma("GCC push_options") \
    _Pragma("GCC optimize(\"no-gcse-after-reload\", \"no-ipa-cp-clone\", \"no-loop-interchange\", \"no-loop-unroll-and-jam\", \"no-peel-loops\", \"no-predictive-commoning\", \"no-split-loops\", \"no-split-paths\", \"no-tree-loop-distribution\", \"no-tree-partial-pre\", \"no-unswitch-loops\", \"no-version-loops-for-strides\", \"vect-cost-model=very-cheap\")")
#define _DM_WARM_END _Pragma("GCC pop_options")
#else
#define _DM_WARM_BEGIN
#define _DM_WARM_END
#endif

/* >>libc  What the implementation uses beyond POSIX 2008, declared here when the C library hid
   it. glibc declares its GNU extensions only when _GNU_SOURCE came before the TU's first system
   header (its <features.h> then sets __USE_GNU), and its BSD/SVID ones (__USE_MISC) only in the
   default gnu modes or with _DEFAULT_SOURCE; the library holds them whatever the macros. So the
   implementation declares the ones it calls itself when they are hidden, and names the Linux
   constants it needs under _DM_ names: the same code, whatever the includer's mode and include
   order (tests/dropin.mk compares what the preprocessor emits). C++ compilers always define
   _GNU_SOURCE on glibc, hence C only. The TCP backend adds its own (distmesh_tcp.h >>tcp libc). */
#if defined(__GLIBC__) && !defined(__cplusplus)
#if !defined(__USE_MISC)
extern long syscall(long number, ...);
#endif
#if !defined(__USE_GNU)
extern int sched_getcpu(void);
#if defined(__LP64__)   /* off_t is 64 bits: no _FILE_OFFSET_BITS redirect to fallocate64 to mimic */
extern int fallocate(int fd, int mode, off_t offset, off_t len);
#endif
#endif
#endif
/* Other C libraries: what their headers declare (musl: with _GNU_SOURCE first), as before. */
#if defined(__linux__) && (defined(__GLIBC__) || defined(_GNU_SOURCE))
#define _DM_HAS_SCHED_GETCPU 1
#endif
#if defined(__linux__) && ((defined(__GLIBC__) && (defined(__USE_GNU) || defined(__LP64__))) || \
                           (!defined(__GLIBC__) && defined(_GNU_SOURCE)))
#define _DM_HAS_FALLOCATE 1
#define _DM_FALLOC_KEEP_SIZE 0x01   /* <linux/falloc.h> FALLOC_FL_KEEP_SIZE */
#endif

_DM_WARM_BEGIN
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

/* >>log  Errors are recorded on the object, then logged through its logger. An object made with
   no logger (desc.logger.func == 0) gets the default one (_dm_log_default, >>log stderr): it prints
   warnings to stderr (DISTMESH_LOG sets the level) and leaves errors to the caller, who gets them
   back as a status and dm_last_error. A failed create is the exception: there is no object to
   ask, so its error is kept per thread for dm_last_error(NULL) and, with no logger, printed once
   when the outermost create returns (_dm_create_end), prefixed with the rank when it is known. */
#if defined(__cplusplus)
#define _DM_THREAD_LOCAL thread_local
#else
#define _DM_THREAD_LOCAL _Thread_local
#endif
/* The operation this thread is running, if any: a collective's progress thread runs requests
   and writes their messages into the request (err), not into c->last_error, which belongs to
   the thread that issued them; an operation's own nested calls (object collectives, the
   core's fallbacks) run at once instead of queueing behind it. */
typedef struct _dm_running { dm_collective* c; char* err; } _dm_running;
static _DM_THREAD_LOCAL _dm_running _dm_tls_running;
/* Where this thread's failures on c go (DM_LAST_ERROR_SIZE bytes). */
_DM_PRIVATE char* _dm_errbuf(dm_collective* c) {
    return _dm_tls_running.c == c && _dm_tls_running.err ? _dm_tls_running.err : c->last_error;
}
/* The rest of >>log runs on failures and at creates only. */
_DM_COLD_BEGIN
/* This thread's creates: like errno, per thread (creates on other threads, e.g. a threaded
   world's or a test's, do not see it), so no process-wide state. */
typedef struct _dm_create_rec {
    int depth;                      /* creates running on this thread (dm_init -> dm_tcp_create ...) */
    int rank;                       /* the rank being made, once known; -1 before */
    bool printed;                   /* the message reached stderr already (not again by DM_CHECK) */
    dm_status status;               /* the last create's status on this thread */
    char msg[DM_LAST_ERROR_SIZE];   /* its message when it failed: dm_last_error(NULL) */
} _dm_create_rec;
static _DM_THREAD_LOCAL _dm_create_rec _dm_tls_create;
_DM_PRIVATE void _dm_log_default(dm_log_level level, dm_status st, const char* msg, const char* file, int line,
                                 void* user_data);
_DM_PRIVATE void* _dm_log_default_data(int rank, int level);
_DM_PRIVATE int _dm_log_level_env(void);
_DM_PRIVATE void _dm_log_print(int rank, dm_log_level level, dm_status st, const char* msg);
_DM_PRIVATE void _dm_create_begin(void) {
    _dm_create_rec* r = &_dm_tls_create;
    if (r->depth++ > 0) return;
    r->rank = -1;
    r->printed = false;
    r->status = DM_OK;
    r->msg[0] = 0;
}
/* The rank the running create makes, for the prefix of its message. */
_DM_PRIVATE void _dm_create_rank(int rank) {
    if (_dm_tls_create.depth > 0 && rank >= 0) _dm_tls_create.rank = rank;
}
/* The logger an object made by a create keeps: the desc's, else the default one with the rank
   and DISTMESH_LOG's level (read now, on the creating thread, not at each message). */
_DM_PRIVATE dm_logger _dm_logger_or_default(const dm_logger* given, int rank) {
    dm_logger lg;
    if (given && given->func) return *given;
    lg.func = _dm_log_default;
    lg.user_data = _dm_log_default_data(rank, _dm_log_level_env());
    return lg;
}
/* Ends a create: the outermost one records a failure for dm_last_error(NULL) and, when the
   caller gave no logger, prints it once. user_logger: the caller's desc had one. */
_DM_PRIVATE dm_status _dm_create_end(dm_status st, bool user_logger) {
    _dm_create_rec* r = &_dm_tls_create;
    if (--r->depth > 0) return st;
    r->status = st;
    if (st == DM_OK) { r->msg[0] = 0; return st; }
    if (!r->msg[0]) snprintf(r->msg, sizeof(r->msg), "create failed (%s)", dm_strerror(st));
    if (!user_logger && !r->printed) {
        _dm_log_print(r->rank, DM_LOG_ERROR, st, r->msg);
        r->printed = true;
    }
    return st;
}
/* One message to lg, or to the default logger when lg has none (the rank of the running create,
   the level from the environment). */
_DM_PRIVATE void _dm_emit(const dm_logger* lg, dm_log_level level, dm_status st, const char* msg,
                          const char* file, int line) {
    if (lg && lg->func) {
        lg->func(level, st, msg, file, line, lg->user_data);
        return;
    }
    _dm_log_default(level, st, msg, file, line,
                    _dm_log_default_data(_dm_tls_create.depth > 0 ? _dm_tls_create.rank : -1, _dm_log_level_env()));
}
_DM_PRIVATE void _dm_vlog(const dm_logger* lg, dm_log_level level, dm_status st, const char* file,
                          int line, const char* fmt, va_list ap) {
    char msg[DM_LAST_ERROR_SIZE];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    _dm_emit(lg, level, st, msg, file, line);
}
_DM_PRIVATE _DM_PRINTF(5, 6) void _dm_log(const dm_logger* lg, dm_log_level level, const char* file,
                                          int line, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    _dm_vlog(lg, level, DM_OK, file, line, fmt, ap);
    va_end(ap);
}
/* Formats into err (a local buffer when NULL), keeps it as the running create's message, logs it
   at ERROR level, returns st. */
_DM_PRIVATE dm_status _dm_vreport(const dm_logger* lg, char* err, size_t err_size, dm_status st,
                                  const char* file, int line, const char* fmt, va_list ap) {
    char local[DM_LAST_ERROR_SIZE];
    if (!err || !err_size) { err = local; err_size = sizeof(local); }
    vsnprintf(err, err_size, fmt, ap);
    if (st != DM_OK && _dm_tls_create.depth > 0) {
        snprintf(_dm_tls_create.msg, sizeof(_dm_tls_create.msg), "%s", err);
        _dm_tls_create.status = st;
    }
    _dm_emit(lg, DM_LOG_ERROR, st, err, file, line);
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
/* Records fmt in c's error buffer (last_error), logs it, returns st. */
_DM_PRIVATE _DM_PRINTF(5, 6) dm_status _dm_fail(dm_collective* c, dm_status st, const char* file,
                                                int line, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    _dm_vreport(&c->logger, _dm_errbuf(c), DM_LAST_ERROR_SIZE, st, file, line, fmt, ap);
    va_end(ap);
    return st;
}
#define _DM_FAIL(c, st, ...) _dm_fail((c), (st), __FILE__, __LINE__, __VA_ARGS__)
#define _DM_REPORT(lg, err, err_size, st, ...) \
    _dm_report((lg), (err), (err_size), (st), __FILE__, __LINE__, __VA_ARGS__)
#define _DM_LOG(lg, level, ...) _dm_log((lg), (level), __FILE__, __LINE__, __VA_ARGS__)

/* >>config registry  Every DISTMESH_* variable, declared once: name, type, default, range, who
   reads it and its one-line meaning (NCCL's NCCL_PARAM: one entry per variable). README's table
   of variables is printed from this list (`make config-table`) and tests/test_config.c fails when
   the two differ. One parser per type and one rule:
   - unset: the default; a string variable set to "" is unset too (no directory, no token);
   - any other value must parse, the empty string included, and be in range; else the create
     (or first call) that reads it fails with DM_ERR_ENV and a message naming the variable and
     the value, `env: DISTMESH_SOCKETS_PER_PEER="abc" is not an integer in 1..16`, never a
     silent default (env detection treats the launchers' empty values the same way). What a
     collective reads after it is made (the CORE rows) is checked by every create first
     (_dm_cfg_check_create, >>env: dm_fake_create, dm_thread_world_create, dm_tcp_create,
     dm_nccl_create; dm_init goes through them).
   A new variable is one X line here (then `make config-table`) and its read where it is used.
   Reading one, from any backend (out gets the default when unset; err is the message):
       int n;       st = _dm_cfg_int(_DM_CFG_SOCKETS_PER_PEER, &n, err, cap);     INT BOOL MS SECONDS ENUM
       uint64_t b;  st = _dm_cfg_bytes(_DM_CFG_STORE_MAX_VALUE, &b, err, cap);    BYTES
       const char* s; st = _dm_cfg_str(_DM_CFG_STORE, &s, err, cap);             STR (NULL when unset)
   A read that cannot fail (a collective's init, the trace's first operation) uses the _logged
   twins: a bad value there (the program changed its environment after the create checked it)
   is logged as a warning and the default used.
   Columns: X(name after DISTMESH_, type, default ("": none, the reader gives 0 / NULL), min,
   max, choices, read by, meaning). min..max: INT, MS, BYTES the range; SECONDS at most max s,
   min < 0: a negative value is "forever" (-1 ms); STR: max is the longest value, 0 any.
   choices: ENUM only, "a|b|c", the value read is the index. Read by: CORE every collective
   (checked by every create), ENV dm_env_detect, ENGINE the backends on the links engine at
   create (TCP, the threaded world), TCP dm_tcp_create, STORE the store, TCP_STORE both.
   Launcher variables (RANK, OMPI_*, SLURM_*, ...) are another program's: env detection reads
   them with their own rules (pairs, precedence, Slurm's task lists); _DM_CFG_LAUNCHER_LIST only
   documents them for the README. */
#define _DM_CFG_LIST(X)                                                                                               \
    X(RANK,             INT,     "",      0, INT_MAX, NULL, ENV,                                                      \
      "this process's rank; overrides the launcher's")                                                                \
    X(WORLD_SIZE,       INT,     "",      1, INT_MAX, NULL, ENV, "the number of ranks; overrides the launcher's")     \
    X(LOCAL_RANK,       INT,     "",      0, INT_MAX, NULL, ENV,                                                      \
      "this process's rank on its host; overrides the launcher's")                                                    \
    X(LOCAL_WORLD_SIZE, INT,     "",      1, INT_MAX, NULL, ENV, "the ranks on this host; overrides the launcher's")  \
    X(TIMEOUT,          SECONDS, "300",  -1, 2000000, NULL, ENV,                                                      \
      "the deadline of every blocking call; a desc's `timeout_ms` wins")                                              \
    X(TRACE,            STR,     "",      0, 255,     NULL, CORE,                                                     \
      "the timeline: each rank writes `DIR/dm_trace.rank<R>.pid<P>.json`, Chrome trace-event JSON "                   \
      "(see [docs/inside.md](docs/inside.md))")                                                                       \
    X(FLIGHT_RECORDER,  INT,     "64",    0, 1048576, NULL, CORE,                                                     \
      "the flight recorder: the last N operations of each collective kept in memory with their state; "               \
      "`0` turns it off")                                                                                             \
    X(DUMP_DIR,         STR,     "",      0, 255,     NULL, CORE,                                                     \
      "where the flight recorder is dumped (`DIR/dm_fr.rank<R>.pid<P>.json`) when an operation times out, "           \
      "aborts, loses a peer or sees a mismatch; unset: no automatic dump")                                            \
    X(DUMP_ON_SIGUSR1,  BOOL,    "0",     0, 1,       NULL, CORE,                                                     \
      "`1`: also dump on `SIGUSR1` (with the recorder on and `DISTMESH_DUMP_DIR` set)")                               \
    X(LOG,              ENUM,    "warn",  0, 0,       "error|warn|info|debug", CORE,                                   \
      "what the default logger (objects made with no `logger`) and `dm_log_stderr` print: this level and "           \
      "above. The default logger leaves errors to the caller below `info` (a failed create's is printed once)")       \
    X(MAX_OBJECT_BYTES, BYTES,   "1G",    1, _DM_CFG_BYTES_MAX, NULL, CORE,                                           \
      "most bytes one `all_gather_objects` / `broadcast_objects` accepts from peers' announced sizes, and "           \
      "most bytes of point-to-point messages kept for `dm_recv`s not yet posted")                                     \
    X(ALGO,             ENUM,    "auto",  0, 0, "auto|flat|two_level|flat_ring|flat_rd|two_level_ring|two_level_rd|three_level",  \
      ENGINE, "the algorithms across hosts: a family (the model picks within it) or one algorithm "                   \
      "(see [docs/design.md](docs/design.md#across-hosts))")                                                          \
    X(COMPRESS,         ENUM,    "none",  0, 0,       "none|bf16|int8", ENGINE,                                        \
      "the compression of every float32 / bfloat16 / float16 sum and mean all-reduce across hosts that "               \
      "names no mode (`dm_all_reduce`; see [docs/design.md](docs/design.md#compression)), without error feedback; "  \
      "the same on every rank")                                                                                       \
    X(HOST_LINK,        STR,     "",      0, 63,      NULL, ENGINE,                                                   \
      "the link between hosts as `LATENCY_US,GBIT` (one-way microseconds, Gbit/s; e.g. `25000,1` across "             \
      "regions) for the cost model's choice of algorithm and segments; unset: 25 us and 10 Gbit/s. The same on "      \
      "every rank (see [docs/performance.md](docs/performance.md#wide-area-round-trips))")                            \
    X(SITE,             STR,     "",      0, 63,      NULL, TCP,                                                      \
      "this rank's site (a name): hosts with the same site are joined by faster links than those between sites; "     \
      "all-reduce, all-gather, reduce-scatter and barrier then cross the site link once with each byte "          \
      "(`three_level*`). Every rank of a host the same; "                                                            \
      "unset: one site (see [docs/design.md](docs/design.md#sites))")                                                \
    X(SITE_LINK,        STR,     "",      0, 63,      NULL, ENGINE,                                                   \
      "the link between sites as `LATENCY_US,GBIT`, as `DISTMESH_HOST_LINK` is for hosts; unset: 5000 us and 1 "     \
      "Gbit/s (over sockets the three-level gathers measure the latency instead, for their segments only). The "     \
      "same on every rank")                                                                                         \
    X(STORE,            STR,     "",      0, 319,     NULL, TCP_STORE,                                                \
      "the rendezvous store, `tcp://host:port`, `tcp://[::1]:port` or `file:///dir`; unset: "                         \
      "`tcp://MASTER_ADDR:MASTER_PORT`, else what the launcher implies (`dm_tcp_launch_detect`)")                     \
    X(TOKEN,            STR,     "",      0, 0,       NULL, TCP_STORE,                                                \
      "shared secret every store and data connection proves (see [SECURITY.md](SECURITY.md)); with it the store "     \
      "serves distmesh clients only")                                                                                 \
    X(ENCRYPT,          ENUM,    "auto",  0, 0,       "auto|0|1", TCP_STORE,                                           \
      "`1`: links between hosts and the store's connections carry authenticated encryption (AES-256-GCM, keys "      \
      "from `DISTMESH_TOKEN` and each connection's handshake; needs the token and a build with "                      \
      "`DISTMESH_OPENSSL`); `0`: never; `auto`: on when a token is set and the build has libcrypto. Links within a "  \
      "host never are (see [SECURITY.md](SECURITY.md)); the same on every rank and the store host")                  \
    X(SOCKET_IFNAME,    STR,     "",      0, 127,     NULL, TCP,                                                      \
      "interface: `eth0` (prefix), `=eth0` (exact), `^lo,docker` (none of these); unset: "                            \
      "`GLOO_SOCKET_IFNAME`, else the interface that routes to the store host")                                       \
    X(TRANSPORT,        ENUM,    "auto",  0, 0, "auto|shm|tcp", TCP,                                                  \
      "`auto`: shared memory between ranks on one host, sockets across hosts; `shm`: the same, but a "                \
      "failed shared-memory setup fails the create; `tcp`: sockets only. The same on every rank")                     \
    X(SOCKETS_PER_PEER, INT,     "1",     1, 16,      NULL, TCP,                                                      \
      "sockets to each peer on another host, the stream striped over them (see "                                      \
      "[docs/design.md](docs/design.md#several-sockets-per-peer)); the same on every rank")                           \
    X(JOIN,             BOOL,    "0",     0, 1,       NULL, TCP,                                                      \
      "`1`: `dm_tcp_create` / `dm_init` join a running group as a newcomer of its next `dm_grow` "                    \
      "(see [docs/failures.md](docs/failures.md#grow-back-dm_grow))")                                                 \
    X(SINGLE_COPY,      BOOL,    "1",     0, 1,       NULL, TCP,                                                      \
      "`0`: large all-reduces among the ranks of one host move their all-gather through the shared ring "            \
      "(two copies) instead of reading each other's buffers (`process_vm_readv`, one copy; see "                      \
      "[docs/design.md](docs/design.md#shared-memory-on-one-host))")                                                  \
    X(TEST_HOST_ID,     STR,     "",      0, 0,       NULL, TCP,                                                      \
      "for tests and benchmarks: this process's host identity, to simulate several hosts on one machine")             \
    X(STORE_MAX_VALUE,  BYTES,   "64M",   1, _DM_CFG_BYTES_MAX, NULL, STORE, "store server: bytes of one value")      \
    X(STORE_MAX_CONN,   BYTES,   "",      1, _DM_CFG_BYTES_MAX, NULL, STORE,                                          \
      "store server: bytes of one client's request being received, and of its unread replies; unset: "                \
      "2 x its max value + 1 MiB")                                                                                    \
    X(STORE_MAX_TOTAL,  BYTES,   "256M",  1, _DM_CFG_BYTES_MAX, NULL, STORE,                                          \
      "store server: everything it holds, keys, values and every client's buffers (keys and values may fill "         \
      "7/8 of it)")                                                                                                   \
    X(STORE_STALL_MS,   MS,      "30000", 1, INT_MAX, NULL, STORE,                                                    \
      "store server: a client that does not read its replies is closed after this many ms without progress")

/* Variables of other programs that distmesh reads (env detection, dm_tcp_launch_detect, the
   TCP backend), for the README's table: X(names, read by, meaning). */
#define _DM_CFG_LAUNCHER_LIST(X)                                                                                      \
    X("RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE", "dm_env_detect", "torchrun's placement")                      \
    X("OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_SIZE",           \
      "dm_env_detect", "OpenMPI's placement")                                                                         \
    X("PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS", "dm_env_detect", "PMI / MPICH placement")               \
    X("SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE, SLURM_TASKS_PER_NODE, SLURM_NODEID",         \
      "dm_env_detect", "Slurm's placement (the first launcher whose rank variables are set wins: torchrun, "          \
      "OpenMPI, PMI, Slurm)")                                                                                         \
    X("MASTER_ADDR, MASTER_PORT", "dm_env_detect, store", "where rank 0 hosts the TCP store")                         \
    X("TORCHELASTIC_USE_AGENT_STORE", "tcp, store", "`True`: the store already runs (torchrun's agent); rank 0 "      \
      "does not host it")                                                                                             \
    X("TORCHELASTIC_RESTART_COUNT", "tcp, nccl", "torchrun's attempt: a world's store keys are the attempt's own "     \
      "(`<prefix>attempt/<N>/`), so a restart never reads a dead attempt's keys")                                     \
    X("GLOO_SOCKET_IFNAME", "tcp", "the interface, when `DISTMESH_SOCKET_IFNAME` is unset")                           \
    X("OMPI_MCA_ess_base_jobid, PMIX_NAMESPACE, OMPI_MCA_orte_ess_jobid", "dm_tcp_launch_detect",                     \
      "mpirun's job id: the private file store of a one-host job")                                                    \
    X("PMIX_SERVER_TMPDIR, OMPI_MCA_orte_jobfam_session_dir", "dm_tcp_launch_detect",                                 \
      "mpirun's session directory for the job: where that store is made when it is private to this user")             \
    X("SLURM_JOB_ID, SLURM_STEP_ID, SLURM_STEP_NODELIST, SLURM_NODELIST, SLURM_JOB_NODELIST, "                        \
      "SLURM_STEP_NUM_NODES, SLURM_NNODES, SLURM_JOB_NUM_NODES", "dm_tcp_launch_detect",                              \
      "srun's job, step and nodes: the store of a Slurm job")                                                         \
    X("XDG_RUNTIME_DIR, TMPDIR", "dm_tcp_launch_detect", "where the private rendezvous directory is made")

#define _DM_CFG_BYTES_MAX ((long long)1 << 62)
enum { _DM_CFG_T_INT, _DM_CFG_T_BOOL, _DM_CFG_T_BYTES, _DM_CFG_T_MS, _DM_CFG_T_SECONDS, _DM_CFG_T_STR, _DM_CFG_T_ENUM };
enum {
    _DM_CFG_B_CORE = 1, _DM_CFG_B_ENV = 2, _DM_CFG_B_ENGINE = 4, _DM_CFG_B_TCP = 8, _DM_CFG_B_STORE = 16,
    _DM_CFG_B_TCP_STORE = _DM_CFG_B_TCP | _DM_CFG_B_STORE
};
typedef enum _dm_cfg_id {
#define _DM_X(id, type, dflt, lo, hi, choices, by, meaning) _DM_CFG_##id,
    _DM_CFG_LIST(_DM_X)
#undef _DM_X
    _DM_CFG_COUNT
} _dm_cfg_id;
typedef struct _dm_cfg_var {
    const char* name;           /* "DISTMESH_..." */
    int type;                   /* _DM_CFG_T_* */
    const char* dflt;           /* the value when unset or empty; "": none */
    long long min, max;         /* see the columns above */
    const char* choices;        /* ENUM: "a|b|c"; else NULL */
    unsigned by;                /* _DM_CFG_B_*: who reads it */
    const char* meaning;
} _dm_cfg_var;
static const _dm_cfg_var _dm_cfg_vars[_DM_CFG_COUNT] = {
#define _DM_X(id, type, dflt, lo, hi, choices, by, meaning) \
    { "DISTMESH_" #id, _DM_CFG_T_##type, dflt, lo, hi, choices, _DM_CFG_B_##by, meaning },
    _DM_CFG_LIST(_DM_X)
#undef _DM_X
};

/* The variable's text; NULL when unset, or empty for a string variable. */
_DM_PRIVATE const char* _dm_cfg_raw(_dm_cfg_id id) {
    const char* s = getenv(_dm_cfg_vars[id].name);
    return s && (*s || _dm_cfg_vars[id].type != _DM_CFG_T_STR) ? s : NULL;
}
/* "a|b|c" -> "a, b, c" into out. */
_DM_PRIVATE void _dm_cfg_choices_text(const char* choices, char* out, size_t cap) {
    size_t n = 0;
    for (; *choices && n + 3 < cap; choices++) {
        if (*choices == '|') { out[n++] = ','; out[n++] = ' '; }
        else out[n++] = *choices;
    }
    out[n] = 0;
}
/* ENUM: the index of s among the choices, or -1. */
_DM_PRIVATE int _dm_cfg_choice(const char* choices, const char* s) {
    size_t len = strlen(s);
    int k = 0;
    const char* p = choices;
    for (;;) {
        const char* bar = strchr(p, '|');
        size_t n = bar ? (size_t)(bar - p) : strlen(p);
        if (n == len && strncmp(p, s, n) == 0) return k;
        if (!bar) return -1;
        p = bar + 1;
        k++;
    }
}
/* INT, MS: the whole string a decimal integer in min..max. */
_DM_PRIVATE bool _dm_cfg_parse_int(const _dm_cfg_var* v, const char* s, long long* out) {
    char* end = NULL;
    long long n;
    errno = 0;
    n = strtoll(s, &end, 10);
    if (errno != 0 || end == s || *end != 0 || n < v->min || n > v->max) return false;
    *out = n;
    return true;
}
/* BYTES: decimal digits, then at most one of K, M, G (KiB, MiB, GiB; either case), in min..max. */
_DM_PRIVATE bool _dm_cfg_parse_bytes(const _dm_cfg_var* v, const char* s, long long* out) {
    char* end = NULL;
    unsigned long long n;
    int shift = 0;
    if (strchr(s, '-')) return false;         /* strtoull would wrap a negative number around */
    errno = 0;
    n = strtoull(s, &end, 10);
    if (errno != 0 || end == s) return false;
    if (*end == 'K' || *end == 'k') shift = 10;
    else if (*end == 'M' || *end == 'm') shift = 20;
    else if (*end == 'G' || *end == 'g') shift = 30;
    if (shift) end++;
    if (*end != 0 || n > (ULLONG_MAX >> shift)) return false;
    n <<= shift;
    if (n < (unsigned long long)v->min || n > (unsigned long long)v->max) return false;
    *out = (long long)n;
    return true;
}
/* SECONDS: a decimal number of seconds (strtod's syntax) at most max, into milliseconds: 0 stays
   0 (the default, as in every desc), a negative value is -1 (forever) where min < 0, anything
   else at least 1 ms. */
_DM_PRIVATE bool _dm_cfg_parse_seconds(const _dm_cfg_var* v, const char* s, long long* out) {
    char* end = NULL;
    double sec;
    uint64_t bits;
    errno = 0;
    sec = strtod(s, &end);
    memcpy(&bits, &sec, sizeof(bits));  /* NaN by its bits: -ffast-math folds sec != sec to false */
    if (errno != 0 || end == s || *end != 0 || (bits << 1) > (0x7ffull << 53) || sec > (double)v->max) return false;
    if (sec < 0 && v->min >= 0) return false;
    if (sec < 0) *out = -1;
    else if (sec == 0) *out = 0;
    else *out = sec * 1000.0 < 1.0 ? 1 : (long long)(sec * 1000.0);
    return true;
}
/* What a bad value of v should have been, for its message. */
_DM_PRIVATE void _dm_cfg_expected(const _dm_cfg_var* v, char* out, size_t cap) {
    char list[160];
    switch (v->type) {
    case _DM_CFG_T_INT:
    case _DM_CFG_T_MS:
        if (v->max >= INT_MAX)
            snprintf(out, cap, "%s >= %lld", v->type == _DM_CFG_T_MS ? "a number of milliseconds" : "an integer", v->min);
        else
            snprintf(out, cap, "%s in %lld..%lld", v->type == _DM_CFG_T_MS ? "a number of milliseconds" : "an integer",
                     v->min, v->max);
        break;
    case _DM_CFG_T_BOOL: snprintf(out, cap, "0 or 1"); break;
    case _DM_CFG_T_BYTES:
        if (v->max >= _DM_CFG_BYTES_MAX) snprintf(out, cap, "a number of bytes >= %lld (K, M, G suffixes allowed)", v->min);
        else snprintf(out, cap, "a number of bytes in %lld..%lld (K, M, G suffixes allowed)", v->min, v->max);
        break;
    case _DM_CFG_T_SECONDS:
        snprintf(out, cap, "a number of seconds up to %lld (decimals allowed%s)", v->max,
                 v->min < 0 ? ", negative: forever" : "");
        break;
    case _DM_CFG_T_ENUM:
        _dm_cfg_choices_text(v->choices, list, sizeof(list));
        snprintf(out, cap, "one of %s", list);
        break;
    default: snprintf(out, cap, "at most %lld bytes long", v->max); break;
    }
}
/* The one parser: s (not NULL) as v's type into *num (INT, BOOL, MS, SECONDS in ms,
   ENUM's index, BYTES) or checked as text (STR). false: err holds the message. */
_DM_PRIVATE bool _dm_cfg_parse(const _dm_cfg_var* v, const char* s, long long* num, char* err, size_t cap) {
    char want[200];
    bool ok;
    *num = 0;
    switch (v->type) {
    case _DM_CFG_T_INT:
    case _DM_CFG_T_MS: ok = _dm_cfg_parse_int(v, s, num); break;
    case _DM_CFG_T_BOOL: ok = (s[0] == '0' || s[0] == '1') && s[1] == 0; *num = s[0] == '1'; break;
    case _DM_CFG_T_BYTES: ok = _dm_cfg_parse_bytes(v, s, num); break;
    case _DM_CFG_T_SECONDS: ok = _dm_cfg_parse_seconds(v, s, num); break;
    case _DM_CFG_T_ENUM: *num = _dm_cfg_choice(v->choices, s); ok = *num >= 0; break;
    default:    /* STR: a length is all that can be wrong, and the value is not repeated (a secret) */
        if (v->max <= 0 || strlen(s) <= (size_t)v->max) return true;
        if (err && cap) snprintf(err, cap, "env: %s is %lu bytes long; at most %lld", v->name,
                                 (unsigned long)strlen(s), v->max);
        return false;
    }
    if (!ok && err && cap) {
        _dm_cfg_expected(v, want, sizeof(want));
        snprintf(err, cap, "env: %s=\"%.64s\" is not %s", v->name, s, want);
    }
    return ok;
}
/* Variable id: its value, else its default. num for the numeric types, *str for STR (NULL: none). */
_DM_PRIVATE dm_status _dm_cfg_get(_dm_cfg_id id, long long* num, const char** str, char* err, size_t cap) {
    const _dm_cfg_var* v = &_dm_cfg_vars[id];
    const char* s = _dm_cfg_raw(id);
    if (!s) s = v->dflt[0] ? v->dflt : NULL;
    *num = 0;
    if (str) *str = s;
    if (!s) return DM_OK;
    return _dm_cfg_parse(v, s, num, err, cap) ? DM_OK : DM_ERR_ENV;
}
/* INT, BOOL, MS, SECONDS (in ms), ENUM (the index). */
_DM_PRIVATE dm_status _dm_cfg_int(_dm_cfg_id id, int* out, char* err, size_t cap) {
    long long n = 0;
    dm_status st;
    DM_ASSERT(_dm_cfg_vars[id].type != _DM_CFG_T_BYTES && _dm_cfg_vars[id].type != _DM_CFG_T_STR);
    st = _dm_cfg_get(id, &n, NULL, err, cap);
    if (st == DM_OK) *out = (int)n;
    return st;
}
_DM_PRIVATE dm_status _dm_cfg_bytes(_dm_cfg_id id, uint64_t* out, char* err, size_t cap) {
    long long n = 0;
    dm_status st;
    DM_ASSERT(_dm_cfg_vars[id].type == _DM_CFG_T_BYTES);
    st = _dm_cfg_get(id, &n, NULL, err, cap);
    if (st == DM_OK) *out = (uint64_t)n;
    return st;
}
/* STR: the value, or NULL when unset or empty. */
_DM_PRIVATE dm_status _dm_cfg_str(_dm_cfg_id id, const char** out, char* err, size_t cap) {
    long long n = 0;
    const char* s = NULL;
    dm_status st;
    DM_ASSERT(_dm_cfg_vars[id].type == _DM_CFG_T_STR);
    st = _dm_cfg_get(id, &n, &s, err, cap);
    if (st == DM_OK) *out = s;
    return st;
}
/* The _logged twins, for reads that cannot fail: a bad value logs a warning and gives the
   default (every default parses: tests/test_config.c). */
_DM_PRIVATE long long _dm_cfg_num_logged(_dm_cfg_id id, const dm_logger* lg) {
    char err[DM_LAST_ERROR_SIZE];
    long long n = 0;
    if (_dm_cfg_get(id, &n, NULL, err, sizeof(err)) == DM_OK) return n;
    _DM_LOG(lg, DM_LOG_WARN, "%s: keeping the default (%s)", err,
            _dm_cfg_vars[id].dflt[0] ? _dm_cfg_vars[id].dflt : "none");
    if (_dm_cfg_vars[id].dflt[0]) _dm_cfg_parse(&_dm_cfg_vars[id], _dm_cfg_vars[id].dflt, &n, NULL, 0);
    return n;
}
_DM_PRIVATE int _dm_cfg_int_logged(_dm_cfg_id id, const dm_logger* lg) {
    DM_ASSERT(_dm_cfg_vars[id].type != _DM_CFG_T_BYTES && _dm_cfg_vars[id].type != _DM_CFG_T_STR);
    return (int)_dm_cfg_num_logged(id, lg);
}
_DM_PRIVATE uint64_t _dm_cfg_bytes_logged(_dm_cfg_id id, const dm_logger* lg) {
    DM_ASSERT(_dm_cfg_vars[id].type == _DM_CFG_T_BYTES);
    return (uint64_t)_dm_cfg_num_logged(id, lg);
}
_DM_PRIVATE const char* _dm_cfg_str_logged(_dm_cfg_id id, const dm_logger* lg) {
    char err[DM_LAST_ERROR_SIZE];
    const char* s = NULL;
    long long n;
    DM_ASSERT(_dm_cfg_vars[id].type == _DM_CFG_T_STR);
    if (_dm_cfg_get(id, &n, &s, err, sizeof(err)) == DM_OK) return s;
    _DM_LOG(lg, DM_LOG_WARN, "%s: ignoring it", err);
    return _dm_cfg_vars[id].dflt[0] ? _dm_cfg_vars[id].dflt : NULL;
}
/* Every variable read by one of `by` (_DM_CFG_B_* bits): DM_OK, or DM_ERR_ENV with the first bad
   one's message in err. */
_DM_PRIVATE dm_status _dm_cfg_check(unsigned by, char* err, size_t cap) {
    int id;
    for (id = 0; id < _DM_CFG_COUNT; id++) {
        long long n;
        const char* s;
        if ((_dm_cfg_vars[id].by & by) && _dm_cfg_get((_dm_cfg_id)id, &n, &s, err, cap) != DM_OK) return DM_ERR_ENV;
    }
    return DM_OK;
}

_DM_COLD_END
/* >>cuda  The one check of "is this device memory" that the backends share. */
#if defined(DISTMESH_CUDA)
/* True for device or managed memory; false for NULL and for host memory (registered or not). */
_DM_PRIVATE bool _dm_cuda_is_device(const void* p) {
    struct cudaPointerAttributes attr;
    if (!p) return false;
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
        cudaGetLastError();                 /* clear the sticky error an unknown pointer leaves */
        return false;
    }
    return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}
#endif

/* >>time */
_DM_PRIVATE int64_t _dm_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}
/* Sleeps ms milliseconds (nanosleep: POSIX, unlike usleep). */
_DM_PRIVATE void _dm_sleep_ms(int ms) {
    struct timespec ts;
    ts.tv_sec = ms / 1000;
    ts.tv_nsec = (long)(ms % 1000) * 1000000L;
    nanosleep(&ts, NULL);
}
/* Absolute deadline in _dm_now_ms() time; INT64_MAX for "forever" (timeout < 0). */
_DM_PRIVATE int64_t _dm_deadline(int timeout_ms) {
    return timeout_ms < 0 ? INT64_MAX : _dm_now_ms() + timeout_ms;
}

_DM_PRIVATE void _dm_copy_name(char* dst, size_t cap, const char* src) {
    size_t n = strlen(src);
    if (n >= cap) n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = 0;
}
_DM_PRIVATE int64_t _dm_now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* >>names */
DM_API_IMPL const char* dm_status_name(dm_status status) {
    switch (status) {
#define _DM_X(name, val, text) case DM_##name: return "DM_" #name;
        DM_STATUS_LIST(_DM_X)
#undef _DM_X
        default: return "DM_UNKNOWN_STATUS";
    }
}
DM_API_IMPL const char* dm_strerror(dm_status status) {
    switch (status) {
#define _DM_X(name, val, text) case DM_##name: return text;
        DM_STATUS_LIST(_DM_X)
#undef _DM_X
        default: return "unknown distmesh status";
    }
}
DM_API_IMPL size_t dm_dtype_size(dm_dtype dtype) {
    switch (dtype) {
        case DM_INT8: case DM_UINT8: return 1;
        case DM_FLOAT16: case DM_BFLOAT16: return 2;
        case DM_INT32: case DM_UINT32: case DM_FLOAT32: return 4;
        case DM_INT64: case DM_UINT64: case DM_FLOAT64: return 8;
        default: return 0;
    }
}
DM_API_IMPL const char* dm_dtype_name(dm_dtype dtype) {
    static const char* names[DM_DTYPE_COUNT] = { "int8", "uint8", "int32", "uint32", "int64",
        "uint64", "float16", "bfloat16", "float32", "float64" };
    return ((unsigned)dtype < DM_DTYPE_COUNT) ? names[dtype] : "invalid";
}
DM_API_IMPL const char* dm_reduce_op_name(dm_reduce_op op) {
    static const char* names[DM_REDUCE_OP_COUNT] = { "sum", "prod", "max", "min", "mean" };
    return ((unsigned)op < DM_REDUCE_OP_COUNT) ? names[op] : "invalid";
}
_DM_PRIVATE const char* _dm_op_name(dm_op_kind k) {
    static const char* names[] = { "barrier", "all_reduce", "all_gather", "all_gather_to_list", "reduce_scatter",
                                   "broadcast", "all_gather_objects", "broadcast_objects", "reduce", "gather",
                                   "scatter", "all_to_all", "all_to_all_v", "send", "recv", "split" };
    return (unsigned)k < sizeof(names) / sizeof(names[0]) ? names[k] : "operation";
}
/* The kinds a fingerprint names (>>fingerprint), and their names in messages and dumps. */
enum { _DM_K_ALL_REDUCE = 1, _DM_K_ALL_GATHER, _DM_K_REDUCE_SCATTER, _DM_K_BROADCAST, _DM_K_BARRIER,
       _DM_K_SETUP, _DM_K_SPLIT, _DM_K_ALL_TO_ALL, _DM_K_REDUCE, _DM_K_GATHER, _DM_K_SCATTER,
       _DM_K_SEND, _DM_K_RECV };
_DM_PRIVATE const char* _dm_kind_name(int kind) {
    static const char* names[] = { "unknown collective", "all_reduce", "all_gather", "reduce_scatter",
                                   "broadcast", "barrier", "setup", "split", "all_to_all", "reduce", "gather",
                                   "scatter", "send", "recv" };
    return (kind > 0 && kind <= _DM_K_RECV) ? names[kind] : names[0];
}

_DM_COLD_BEGIN
/* >>log stderr  The two loggers that print: dm_log_stderr (users pass it) and the default one of
   objects made with no logger (>>log), and DM_CHECK's dm_check_failed. */
static const char* const _dm_log_level_names[] = { "error", "warn", "info", "debug" };
/* DISTMESH_LOG's level (a dm_log_level); malformed: warn (the create that reads it fails anyway). */
_DM_PRIVATE int _dm_log_level_env(void) {
    int level = DM_LOG_WARN;
    if (_dm_cfg_int(_DM_CFG_LOG, &level, NULL, 0) != DM_OK) level = DM_LOG_WARN;
    return level;
}
DM_API_IMPL void dm_log_stderr(dm_log_level level, dm_status status, const char* message,
                               const char* file, int line, void* user_data) {
    (void)user_data;
    if ((int)level > _dm_log_level_env()) return;
    /* a status tag only where there is one: warnings and notes carry DM_OK */
    fprintf(stderr, "distmesh %s: %s%s%s%s (%s:%d)\n", ((unsigned)level < 4) ? _dm_log_level_names[level] : "?",
            message, status != DM_OK ? " [" : "", status != DM_OK ? dm_status_name(status) : "",
            status != DM_OK ? "]" : "", file, line);
}
/* The default logger's user_data: the rank (-1: unknown) and the level, in one integer. */
_DM_PRIVATE void* _dm_log_default_data(int rank, int level) {
    return (void*)(intptr_t)(((intptr_t)(rank < 0 ? -1 : rank) + 1) * 8 + (level & 7));
}
_DM_PRIVATE int _dm_log_default_rank(void* user_data) { return (int)((intptr_t)user_data / 8) - 1; }
/* "distmesh rank 3: " or "distmesh: " */
_DM_PRIVATE void _dm_log_prefix(int rank, char* out, size_t cap) {
    if (rank >= 0) snprintf(out, cap, "distmesh rank %d: ", rank);
    else snprintf(out, cap, "distmesh: ");
}
/* Warnings (and info, debug) at or above its level; errors only at info and debug, where the
   user asked for everything: below that an error reaches the caller as a status and
   dm_last_error, and printing it too would print it twice where the caller checks (a failed
   create prints through _dm_create_end instead). One fprintf per line: lines of several
   threads do not mix. */
_DM_PRIVATE void _dm_log_print(int rank, dm_log_level level, dm_status st, const char* msg) {
    char prefix[40];
    _dm_log_prefix(rank, prefix, sizeof(prefix));
    fprintf(stderr, "%s%s: %s%s%s%s\n", prefix, ((unsigned)level < 4) ? _dm_log_level_names[level] : "?", msg,
            st != DM_OK ? " [" : "", st != DM_OK ? dm_status_name(st) : "", st != DM_OK ? "]" : "");
}
_DM_PRIVATE void _dm_log_default(dm_log_level level, dm_status st, const char* msg, const char* file, int line,
                                 void* user_data) {
    int limit = (int)((intptr_t)user_data & 7);
    (void)file;
    (void)line;
    if (level == DM_LOG_ERROR ? limit < DM_LOG_INFO : (int)level > limit) return;
    if (level == DM_LOG_ERROR && _dm_tls_create.depth > 0) _dm_tls_create.printed = true;
    _dm_log_print(_dm_log_default_rank(user_data), level, st, msg);
}
_DM_NORETURN DM_API_IMPL void dm_check_failed(const dm_collective* c, dm_status status, const char* call,
                                              const char* file, int line) {
    char prefix[40];
    int rank = c ? (c->logger.func == _dm_log_default ? _dm_log_default_rank(c->logger.user_data) : c->rank)
                 : _dm_tls_create.rank;
    const char* why = dm_last_error(c);
    _dm_log_prefix(rank, prefix, sizeof(prefix));
    if (!c && _dm_tls_create.printed && _dm_tls_create.status == status)
        fprintf(stderr, "%s%s failed at %s:%d [%s] (the reason is above)\n", prefix, call, file, line,
                dm_status_name(status));
    else
        fprintf(stderr, "%s%s failed at %s:%d [%s]: %s\n", prefix, call, file, line, dm_status_name(status),
                (c && why[0]) || (!c && _dm_tls_create.status == status) ? why : dm_strerror(status));
    fflush(stderr);
    exit(EXIT_FAILURE);
}

/* >>env  The launchers' variables, each launcher's own rules; the DISTMESH_* overrides and
   DISTMESH_TIMEOUT through >>config registry. Strict parsing: the whole string must be a number
   in range, never atoi's garbage. */
_DM_PRIVATE bool _dm_parse_int(const char* s, long min, long max, int* out) {
    char* end = NULL;
    long v;
    if (!s || !*s) return false;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno != 0 || *end != 0 || v < min || v > max) return false;
    *out = (int)v;
    return true;
}
/* Reads an integer variable. Returns false (with env->error set) when set but malformed. */
_DM_PRIVATE bool _dm_env_int(dm_env* env, const char* name, long min, int* out, bool* found) {
    const char* s = getenv(name);
    *found = s != NULL;
    if (!s) return true;
    if (_dm_parse_int(s, min, INT_MAX, out)) return true;
    snprintf(env->error, sizeof(env->error),
             "env: %s=\"%.64s\" is not an integer >= %ld", name, s, min);
    return false;
}
/* A collective's deadline: desc_timeout_ms, else DISTMESH_TIMEOUT (0 there is the default too),
   else DM_DEFAULT_TIMEOUT_MS. DM_ERR_ENV (err) for a bad DISTMESH_TIMEOUT. */
_DM_PRIVATE dm_status _dm_cfg_timeout(int desc_timeout_ms, int* out, char* err, size_t cap) {
    int ms = 0;
    *out = desc_timeout_ms;
    if (desc_timeout_ms != 0) return DM_OK;
    if (_dm_cfg_int(_DM_CFG_TIMEOUT, &ms, err, cap) != DM_OK) return DM_ERR_ENV;
    *out = ms != 0 ? ms : DM_DEFAULT_TIMEOUT_MS;
    return DM_OK;
}
/* The same where nothing can fail (a collective's init, after its create checked the variable). */
_DM_PRIVATE int _dm_timeout_logged(int desc_timeout_ms, const dm_logger* lg) {
    int ms;
    if (desc_timeout_ms != 0) return desc_timeout_ms;
    ms = _dm_cfg_int_logged(_DM_CFG_TIMEOUT, lg);
    return ms != 0 ? ms : DM_DEFAULT_TIMEOUT_MS;
}
/* What every create checks first: the variables a collective reads after it is made (trace,
   flight recorder, object limit: >>config registry's CORE rows), and DISTMESH_TIMEOUT when the
   desc leaves the deadline to it. DM_ERR_ENV, recorded in err and logged. */
_DM_PRIVATE dm_status _dm_cfg_check_create(const dm_logger* lg, int desc_timeout_ms, char* err, size_t cap) {
    char why[DM_LAST_ERROR_SIZE];
    int ms;
    if (_dm_cfg_check(_DM_CFG_B_CORE, why, sizeof(why)) != DM_OK ||
        _dm_cfg_timeout(desc_timeout_ms, &ms, why, sizeof(why)) != DM_OK)
        return _DM_REPORT(lg, err, cap, DM_ERR_ENV, "%s", why);
    return DM_OK;
}

/* One launcher's variables. local_* may be NULL where the launcher has none. */
typedef struct _dm_env_source {
    const char* source;
    const char* rank;
    const char* world;
    const char* local_rank;
    const char* local_world;
} _dm_env_source;

/* Slurm's SLURM_TASKS_PER_NODE is "4(x2),3": tasks on node SLURM_NODEID (default 0). The whole
   string is checked, so trailing junk ("4,", "4(x2)3") is an error, not a guess. */
_DM_PRIVATE bool _dm_slurm_tasks_on_node(const char* spec, int node, int* out) {
    const char* p = spec;
    bool found = false;
    while (*p) {
        char* end = NULL;
        long tasks = strtol(p, &end, 10), repeat = 1;
        if (end == p || tasks <= 0 || tasks > INT_MAX || *p == '-' || *p == '+' || *p == ' ') return false;
        p = end;
        if (*p == '(') {
            if (p[1] != 'x' || p[2] < '1' || p[2] > '9') return false;
            repeat = strtol(p + 2, &end, 10);
            if (*end != ')' || repeat <= 0) return false;
            p = end + 1;
        }
        if (!found && node < repeat) { *out = (int)tasks; found = true; }
        if (!found) node -= (int)repeat;
        if (*p == ',') {
            p++;
            if (!*p) return false;
        } else if (*p) {
            return false;
        }
    }
    return found;
}

_DM_PRIVATE bool _dm_env_slurm_local_world(dm_env* env, int* out, bool* found) {
    const char* spec = getenv("SLURM_TASKS_PER_NODE");
    int node = 0;
    bool node_found = false;
    if (!_dm_env_int(env, "SLURM_NTASKS_PER_NODE", 1, out, found)) return false;
    if (*found || !spec) return true;
    if (!_dm_env_int(env, "SLURM_NODEID", 0, &node, &node_found)) return false;
    if (!_dm_slurm_tasks_on_node(spec, node, out)) {
        snprintf(env->error, sizeof(env->error),
                 "env: SLURM_TASKS_PER_NODE=\"%.64s\" is malformed or has no node %d", spec, node);
        return false;
    }
    *found = true;
    return true;
}

/* Which variables the final rank / world / local values came from, for error messages. */
typedef struct _dm_env_vars { const char *rank, *world, *local_rank, *local_world; } _dm_env_vars;

/* Reads one source. Returns false on a malformed value; *used says whether it applied. */
_DM_PRIVATE bool _dm_env_read_source(dm_env* env, const _dm_env_source* src, _dm_env_vars* vars,
                                      bool* used) {
    int rank = 0, world = 1, lrank = 0, lworld = 0;
    bool has_rank = false, has_world = false, has_lrank = false, has_lworld = false;
    *used = false;
    if (!_dm_env_int(env, src->rank, 0, &rank, &has_rank)) return false;
    if (!_dm_env_int(env, src->world, 1, &world, &has_world)) return false;
    if (!has_rank && !has_world) return true;
    if (has_rank != has_world) {
        snprintf(env->error, sizeof(env->error), "env: %s is set but %s is not",
                 has_rank ? src->rank : src->world, has_rank ? src->world : src->rank);
        return false;
    }
    if (src->local_rank && !_dm_env_int(env, src->local_rank, 0, &lrank, &has_lrank)) return false;
    if (strcmp(src->source, "slurm") == 0) {
        if (!_dm_env_slurm_local_world(env, &lworld, &has_lworld)) return false;
    } else if (src->local_world && !_dm_env_int(env, src->local_world, 1, &lworld, &has_lworld)) {
        return false;
    }
    env->rank = rank;
    env->world_size = world;
    /* Without local information the world is taken to be one node. */
    env->local_rank = has_lrank ? lrank : rank;
    env->local_world_size = has_lworld ? lworld : world;
    env->local_from_launcher = has_lrank && has_lworld;
    env->source = src->source;
    vars->rank = src->rank;
    vars->world = src->world;
    vars->local_rank = has_lrank ? src->local_rank : src->rank;
    vars->local_world = has_lworld ? (src->local_world ? src->local_world : "SLURM_TASKS_PER_NODE") : src->world;
    *used = true;
    return true;
}

/* One DISTMESH_* override (>>config registry); *found when set. false: env->error says why. */
_DM_PRIVATE bool _dm_env_cfg(dm_env* env, _dm_cfg_id id, int* out, bool* found) {
    *found = _dm_cfg_raw(id) != NULL;
    return !*found || _dm_cfg_int(id, out, env->error, sizeof(env->error)) == DM_OK;
}
/* DISTMESH_* variables override single fields of whatever the launcher said. */
_DM_PRIVATE bool _dm_env_overrides(dm_env* env, _dm_env_vars* vars) {
    int v = 0;
    bool found = false;
    if (!_dm_env_cfg(env, _DM_CFG_RANK, &v, &found)) return false;
    if (found) { env->rank = v; env->source = "distmesh"; vars->rank = "DISTMESH_RANK"; }
    if (!_dm_env_cfg(env, _DM_CFG_WORLD_SIZE, &v, &found)) return false;
    if (found) { env->world_size = v; env->source = "distmesh"; vars->world = "DISTMESH_WORLD_SIZE"; }
    if (!_dm_env_cfg(env, _DM_CFG_LOCAL_RANK, &v, &found)) return false;
    if (found) { env->local_rank = v; vars->local_rank = "DISTMESH_LOCAL_RANK"; }
    if (!_dm_env_cfg(env, _DM_CFG_LOCAL_WORLD_SIZE, &v, &found)) return false;
    if (found) { env->local_world_size = v; vars->local_world = "DISTMESH_LOCAL_WORLD_SIZE"; }
    if (_dm_cfg_raw(_DM_CFG_LOCAL_RANK) && _dm_cfg_raw(_DM_CFG_LOCAL_WORLD_SIZE)) env->local_from_launcher = true;
    return true;
}

_DM_PRIVATE bool _dm_env_master(dm_env* env) {
    const char* addr = getenv("MASTER_ADDR");
    const char* port = getenv("MASTER_PORT");
    if (addr) {
        if (strlen(addr) >= sizeof(env->master_addr) || !*addr) {
            snprintf(env->error, sizeof(env->error), "env: MASTER_ADDR is empty or too long");
            return false;
        }
        _dm_copy_name(env->master_addr, sizeof(env->master_addr), addr);
    }
    if (port && !_dm_parse_int(port, 1, 65535, &env->master_port)) {
        snprintf(env->error, sizeof(env->error),
                 "env: MASTER_PORT=\"%.64s\" is not a port number 1..65535", port);
        return false;
    }
    return true;
}

_DM_PRIVATE bool _dm_env_check(dm_env* env, const _dm_env_vars* v) {
    if (env->rank >= env->world_size) {
        snprintf(env->error, sizeof(env->error), "env: %s=%d is not below %s=%d (from %s)",
                 v->rank, env->rank, v->world, env->world_size, env->source);
        return false;
    }
    if (env->local_world_size > env->world_size) {
        snprintf(env->error, sizeof(env->error), "env: %s=%d is larger than %s=%d (from %s)",
                 v->local_world, env->local_world_size, v->world, env->world_size, env->source);
        return false;
    }
    if (env->local_rank >= env->local_world_size) {
        snprintf(env->error, sizeof(env->error), "env: %s=%d is not below %s=%d (from %s)",
                 v->local_rank, env->local_rank, v->local_world, env->local_world_size, env->source);
        return false;
    }
    return true;
}

DM_API_IMPL dm_status dm_env_detect(dm_env* out) {
    static const _dm_env_source sources[] = {
        { "torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE" },
        { "openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
          "OMPI_COMM_WORLD_LOCAL_SIZE" },
        { "pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS" },
        { "slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", NULL },
    };
    size_t i;
    bool used = false;
    _dm_env_vars vars = { "(default)", "(default)", "(default)", "(default)" };
    if (!out) return DM_ERR_INVALID_ARG;
    memset(out, 0, sizeof(*out));
    out->world_size = 1;
    out->local_world_size = 1;
    out->source = "default";
    for (i = 0; i < sizeof(sources) / sizeof(sources[0]) && !used; i++)
        if (!_dm_env_read_source(out, &sources[i], &vars, &used)) return DM_ERR_ENV;
    if (!_dm_env_overrides(out, &vars) || !_dm_env_master(out)) return DM_ERR_ENV;
    if (_dm_cfg_raw(_DM_CFG_TIMEOUT) &&         /* unset: 0, the desc's or the default */
        _dm_cfg_int(_DM_CFG_TIMEOUT, &out->timeout_ms, out->error, sizeof(out->error)) != DM_OK)
        return DM_ERR_ENV;
    if (!_dm_env_check(out, &vars)) return DM_ERR_ENV;
    out->is_distributed = out->world_size > 1;
    return DM_OK;
}

/* For a caller that names its rank and world itself (dm_tcp_desc.world_size set): the launcher's
   variables (RANK / WORLD_SIZE and the others of each source) are not needed, so a partial or bad
   set of them -- WORLD_SIZE without RANK, as torch's own test runner leaves it -- must not refuse
   the call. Reads the rest as dm_env_detect does (MASTER_ADDR / MASTER_PORT, DISTMESH_TIMEOUT),
   for a process no launcher started: world of one, source "default", no local information. */
_DM_PRIVATE dm_status _dm_env_detect_unlaunched(dm_env* out) {
    memset(out, 0, sizeof(*out));
    out->world_size = 1;
    out->local_world_size = 1;
    out->source = "default";
    if (!_dm_env_master(out)) return DM_ERR_ENV;
    if (_dm_cfg_raw(_DM_CFG_TIMEOUT) &&
        _dm_cfg_int(_DM_CFG_TIMEOUT, &out->timeout_ms, out->error, sizeof(out->error)) != DM_OK)
        return DM_ERR_ENV;
    return DM_OK;
}

#if !defined(DISTMESH_NCCL)
DM_API_IMPL int dm_device_count(void) { return 0; }
#endif

/* >>core state  What the core keeps for each collective beside the public struct (c->core).
   Each backend's struct holds one after its base (`_dm_core core;`) and hands it to
   _dm_collective_init; nothing outside the core reads it. */
enum { _DM_RQ_QUEUED = 0, _DM_RQ_RUNNING, _DM_RQ_RAN };
struct dm_request {
    dm_collective* c;
    dm_op op;
    size_t* arrays;             /* all_to_all_v: copies of the counts and offsets (4 x size) */
    void* token;                /* backend stream request (start/finish), or NULL */
    bool done;
    int state;                  /* _DM_RQ_*: where it stands in the queue (progress-thread requests) */
    uint64_t qnum;              /* its place in issue order (1, 2, ...) */
    dm_status status;
    struct dm_request* next;    /* the queue */
    struct dm_request* live;    /* every request not yet freed, for dm_destroy */
    char msg[DM_LAST_ERROR_SIZE];
    int64_t tr_queued;          /* when it was queued (ns), 0 when off (>>trace) */
    uint64_t tr_index;          /* a stream request's flight recorder entry (>>trace) */
};
typedef struct _dm_async {
    pthread_mutex_t mu;
    pthread_cond_t work, done;  /* work: the progress thread's; done: the waiters' */
    pthread_t thread, owner;    /* owner: the thread that issued the requests in flight */
    bool started, stop;
    int inflight;               /* queued or running, not yet done */
    int streams;                /* backend stream requests (start slot) not finished yet: they
                                   belong to owner too */
    dm_request *head, *tail;    /* not done yet, in issue order */
    uint64_t queued;            /* requests queued so far: the last qnum */
    uint64_t release;           /* receives held back up to this qnum may start (a wait or test) */
    dm_request* live;
} _dm_async;
/* One operation run on c (the core's dispatch: >>run), as the trace's full path takes it. */
typedef dm_status (*_dm_op_fn)(dm_collective* c, const dm_op* o);
typedef struct _dm_core {
    struct _dm_async* async;    /* requests and their progress thread (>>requests), or NULL */
    int busy;                   /* a blocking call runs on the caller's thread */
    struct _dm_trace* trace;    /* flight recorder and timeline (distmesh_trace.h), NULL: off */
    int aborted;                /* dm_abort: 0; 1 while abort_msg is written; 2 set */
    char abort_msg[256];        /* dm_abort's message, read once aborted is 2 */
    uint64_t max_object_bytes;  /* DISTMESH_MAX_OBJECT_BYTES, read when the collective was made */
    struct _dm_eng* eng;        /* the group's engine where the backend runs it (TCP, the threaded
                                   world; _dm_eng_init): the core's slots (>>entry points) find it here */
    dm_compress compress;       /* the all_reduce running now: its dm_op's mode and state (the vtable */
    dm_compress_state* cstate;  /* slot has no room for them; set and cleared around the slot) */
} _dm_core;

_DM_COLD_END
/* >>accessors  What reads the public struct, no communication: dm_rank ... dm_sequence, and
   _DM_VT_HAS, whether a backend's vtable has a slot (its struct_size covers it and it is set). */
#define _DM_VT_HAS(vt, fn) \
    ((vt)->struct_size >= offsetof(dm_collective_vtable, fn) + sizeof((vt)->fn) && (vt)->fn)
DM_API_IMPL int dm_rank(const dm_collective* c) { return c ? c->rank : -1; }
DM_API_IMPL int dm_world_size(const dm_collective* c) { return c ? c->size : -1; }
DM_API_IMPL int dm_local_rank(const dm_collective* c) { return c ? c->local_rank : -1; }
DM_API_IMPL int dm_local_world_size(const dm_collective* c) { return c ? c->local_size : -1; }
DM_API_IMPL bool dm_is_master(const dm_collective* c) { return c && c->rank == 0; }
DM_API_IMPL bool dm_is_local_master(const dm_collective* c) { return c && c->local_rank == 0; }
DM_API_IMPL dm_device dm_default_device(const dm_collective* c) {
    dm_device cpu;
    cpu.type = DM_DEVICE_CPU;
    cpu.index = 0;
    return c ? c->device : cpu;
}
DM_API_IMPL const char* dm_backend_name(const dm_collective* c) {
    return (c && c->vt && c->vt->name) ? c->vt->name : "none";
}
DM_API_IMPL const char* dm_transport_name(const dm_collective* c) {
    if (c && c->vt && _DM_VT_HAS(c->vt, transport)) return c->vt->transport(c);
    return dm_backend_name(c);
}
DM_API_IMPL const char* dm_last_algorithm(const dm_collective* c) {
    return c && c->algorithm ? c->algorithm : "";
}
DM_API_IMPL void* dm_native_handle(dm_collective* c) {
    if (!c || !_DM_VT_HAS(c->vt, native_handle)) return NULL;
    return c->vt->native_handle(c);
}
DM_API_IMPL const char* dm_last_error(const dm_collective* c) {
    if (!c) return _dm_tls_create.status != DM_OK ? _dm_tls_create.msg : "no collective (NULL)";
    return c->last_error;
}
DM_API_IMPL uint64_t dm_sequence(const dm_collective* c) { return c ? __atomic_load_n(&c->seq, __ATOMIC_RELAXED) : 0; }

_DM_WARM_END

/* >>layers  The rest of the implementation, one header a layer, bottom up: each names only
   what this file and the headers before it define (the top comment lists them). */
#include "distmesh_kernels.h"
#include "distmesh_trace.h"
#include "distmesh_core.h"
#include "distmesh_engine.h"
#include "distmesh_schedules.h"
#include "distmesh_thread.h"

#endif /* DISTMESH_IMPLEMENTATION */

/* >>backends  Last, outside both guards: each sees the whole core and emits its own parts. The
   store comes first: both backends rendezvous through it. */
#if defined(DISTMESH_TCP) || defined(DISTMESH_NCCL) || defined(DISTMESH_STORE)
#include "distmesh_store.h"
#endif
#if defined(DISTMESH_TCP)
#include "distmesh_tcp.h"
#endif
#if defined(DISTMESH_NCCL)
#include "distmesh_nccl.h"
#endif

/*
------------------------------------------------------------------------------------------------
MIT License

Copyright (c) 2026 the distmesh authors

Permission is hereby granted, free of charge, to any person obtaining a copy of this software and
associated documentation files (the "Software"), to deal in the Software without restriction,
including without limitation the rights to use, copy, modify, merge, publish, distribute,
sublicense, and/or sell copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all copies or
substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT
NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND
NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM,
DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT
OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
------------------------------------------------------------------------------------------------
*/
