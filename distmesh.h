/* distmesh.h -- header-only collective communication for C11 (and C++11). MIT license at end of file.

   One vtable-based dm_collective interface (all-reduce, all-gather, reduce-scatter, broadcast,
   barrier, object collectives, split), a Fake backend for single-process tests (world of one,
   a simulated world of N, or a real in-process world of N threads), a Mesh layer of named
   parallel dims, environment detection, and reduction kernels. Transports are opt-in:

       distmesh_store.h  rendezvous store: c10d TCPStore client and server, file store (any of
                         DISTMESH_TCP, DISTMESH_NCCL, DISTMESH_STORE; the server needs the first)
       distmesh_tcp.h    TCP ring backend on libuv, Gloo-style rendezvous      (DISTMESH_TCP)
       distmesh_nccl.h   NCCL backend, CUDA device buffers                      (DISTMESH_NCCL)

   and distmesh_trace.h, the flight recorder and the timeline, is part of the implementation
   (included by it, unless DISTMESH_NO_TRACE). So are the transports: distmesh_shm.h (shared
   memory: its memory rings with the core, its segment with distmesh_tcp.h) and
   distmesh_socket.h (sockets, with distmesh_tcp.h).

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
     implementation: helpers
       >>implementation          where the implementation starts (its once-guard)
       >>config                  system headers, _DM_PRIVATE, _DM_ZERO, the small-message bound
       >>compile cost            _DM_COLD_BEGIN / _END: code that runs at creates and failures
       >>libc                    GNU and BSD calls declared when the includer's mode hid them
       >>memory                  the object's allocator
       >>log                     recording (dm_last_error) and logging failures
       >>config registry         every DISTMESH_* variable: type, default, range, meaning; parsers
       >>cuda                    "is this device memory" for the backends
       >>time                    clocks, deadlines, bounded copies of names
       >>sha256                  SHA-256 and HMAC
       >>names                   status, dtype and op names
       >>float semantics         IEEE semantics for what follows, whatever the includer's flags
       >>half                    float16 / bfloat16 conversions
       >>kernels                 dm_reduce_local, dm_divide_local
       >>compression kernels     the error-feedback state, int8 scales and codes, bfloat16 codes
       >>log stderr              dm_log_stderr
       >>env                     strict parsing of variables, dm_env_detect
       >>core state              what the core keeps per collective beside the public struct
       >>trace hooks             what the core calls of distmesh_trace.h (the flight recorder
                                 and the timeline); its stand-ins under DISTMESH_NO_TRACE
     implementation: the object and its calls
       >>collective base         the base struct's init, host identities (TCP, NCCL), blob lists
       >>validation              the wrappers' checks, fallbacks of missing slots
       >>public collectives      arguments into a dm_op (_dm_prep_*)
       >>objects                 the object collectives over the vtable
       >>run                     one checked operation: sequence number, slot or fallback
       >>requests                _async calls, the progress thread, dm_wait / dm_test
       >>trace include           distmesh_trace.h, here: after the request queue its dumps list
       >>public calls            dm_barrier ... dm_recv, dm_split, dm_shrink, dm_grow
       >>destroy and accessors   dm_destroy, dm_rank ... dm_set_timeout
       >>fake                    the Fake backend (world of one, simulated world of N)
     implementation: the link engine (links, engine, schedules, choice, entry points)
       >>links                   the link ops table, the bell, the abort word
       >>rings include           distmesh_shm.h's memory rings: the link between two ranks
                                 that share memory
       >>fingerprint             the 32 bytes that open every collective, the mismatch message
      >>sealed records          AES-256-GCM records and HKDF keys: the encrypted links' and the store's
       >>algorithms              the all_reduce algorithms, DISTMESH_ALGO's names
       >>engine                  a group's state (_dm_eng), layout, init, release, transfers
       >>engine failure          the failure rule: break, abort word, notices, adopt
       >>engine inbox            point-to-point messages between collectives
       >>engine pump             moving one transfer's send and recv steps
       >>engine loop             driving transfers: spin, yield, block, deadline, connect
       >>eager                   small exchanges over memory links (an exception to the layers)
       >>exchange                one step with one or two peers: sendrecv, sendrecv_reduce
       >>teams                   teams, segments, step arrays: what schedules are written with
       >>recursive doubling      schedule: recursive doubling all-reduce
       >>ring                    schedules: ring all-reduce, ring all-gather, ring reduce-scatter
       >>single copy             a large one-host all-reduce's all-gather read from the peers' buffers
       >>compressed rails        a rail's block across hosts as int8 or bfloat16 codes
       >>two-level               schedule: two-level all-reduce (fold, host ring, rails, pipeline)
       >>three-level             schedule: three-level all-reduce (hosts at sites, DISTMESH_SITE)
       >>chain                   schedule: pipelined chain (broadcast)
       >>dissemination           schedule: dissemination rounds (barrier)
       >>three-level others      schedules: all-gather, reduce-scatter, barrier, chain order across sites
       >>choice                  the cost model and the fixed choice of algorithm
       >>entry points            what the vtable slots call: check, choose, run, record
       >>peers                   P: the peers a rank's fixed-peer schedules use
     implementation: worlds and layers on top
       >>thread                  the threaded world: members, the shared barrier, slots, split
       >>thread shrink           dm_shrink on the threaded world
       >>thread create           its links, vtable, dm_thread_world_create / _run
       >>groups                  dm_local, sub-collectives of a known size, main_process_first
       >>mesh                    dm_mesh
       >>strategy                dm_strategy
       >>init                    dm_init without the TCP backend
       >>backends                the backend headers, included last

   PRIVATE NAMES  _dm_ / _DM_ for every private function, type and macro, then the part:
       _dm_link _dm_iov          the link ops table (>>links)
       _dm_bell_ _dm_abort       waking sleepers, the shared failure word (>>links)
       _dm_ring _dm_memlink _dm_mem_   the memory link (distmesh_shm.h >>memory rings)
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
      "Gbit/s. The same on every rank")                                                                             \
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

_DM_COLD_BEGIN
/* >>sha256  FIPS 180-4 section 6.2, written from the standard: 64-byte blocks, big-endian words. */
static const uint32_t _dm_sha256_k[64] = {
    0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu, 0x59f111f1u, 0x923f82a4u, 0xab1c5ed5u,
    0xd807aa98u, 0x12835b01u, 0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu, 0x9bdc06a7u, 0xc19bf174u,
    0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu, 0x2de92c6fu, 0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau,
    0x983e5152u, 0xa831c66du, 0xb00327c8u, 0xbf597fc7u, 0xc6e00bf3u, 0xd5a79147u, 0x06ca6351u, 0x14292967u,
    0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu, 0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u,
    0xa2bfe8a1u, 0xa81a664bu, 0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, 0xd6990624u, 0xf40e3585u, 0x106aa070u,
    0x19a4c116u, 0x1e376c08u, 0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu, 0x682e6ff3u,
    0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u, 0x90befffau, 0xa4506cebu, 0xbef9a3f7u, 0xc67178f2u
};
#define _DM_ROTR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))
_DM_PRIVATE void _dm_sha256_block(uint32_t h[8], const unsigned char* p) {
    uint32_t w[64], a, b, c, d, e, f, g, hh, t1, t2;
    int i;
    for (i = 0; i < 16; i++)
        w[i] = ((uint32_t)p[4 * i] << 24) | ((uint32_t)p[4 * i + 1] << 16) | ((uint32_t)p[4 * i + 2] << 8) |
               (uint32_t)p[4 * i + 3];
    for (i = 16; i < 64; i++) {
        uint32_t s0 = _DM_ROTR(w[i - 15], 7) ^ _DM_ROTR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = _DM_ROTR(w[i - 2], 17) ^ _DM_ROTR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    a = h[0]; b = h[1]; c = h[2]; d = h[3]; e = h[4]; f = h[5]; g = h[6]; hh = h[7];
    for (i = 0; i < 64; i++) {
        t1 = hh + (_DM_ROTR(e, 6) ^ _DM_ROTR(e, 11) ^ _DM_ROTR(e, 25)) + ((e & f) ^ (~e & g)) + _dm_sha256_k[i] + w[i];
        t2 = (_DM_ROTR(a, 2) ^ _DM_ROTR(a, 13) ^ _DM_ROTR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        hh = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += hh;
}
#undef _DM_ROTR
DM_API_IMPL void dm_sha256_init(dm_sha256_ctx* ctx) {
    static const uint32_t h0[8] = { 0x6a09e667u, 0xbb67ae85u, 0x3c6ef372u, 0xa54ff53au,
                                    0x510e527fu, 0x9b05688cu, 0x1f83d9abu, 0x5be0cd19u };
    memcpy(ctx->h, h0, sizeof(h0));
    ctx->bytes = 0;
    ctx->used = 0;
}
DM_API_IMPL void dm_sha256_update(dm_sha256_ctx* ctx, const void* data, size_t size) {
    const unsigned char* p = (const unsigned char*)data;
    if (!size) return;                          /* data may be NULL then */
    ctx->bytes += size;
    if (ctx->used) {
        size_t take = 64 - ctx->used < size ? 64 - ctx->used : size;
        memcpy(ctx->buf + ctx->used, p, take);
        ctx->used += take;
        p += take;
        size -= take;
        if (ctx->used < 64) return;
        _dm_sha256_block(ctx->h, ctx->buf);
        ctx->used = 0;
    }
    for (; size >= 64; p += 64, size -= 64) _dm_sha256_block(ctx->h, p);
    if (size) memcpy(ctx->buf, p, size);
    ctx->used = size;
}
DM_API_IMPL void dm_sha256_final(dm_sha256_ctx* ctx, unsigned char out[32]) {
    uint64_t bits = ctx->bytes * 8;
    int i;
    ctx->buf[ctx->used++] = 0x80;              /* the 1 bit, then zeros, then the 64-bit length */
    if (ctx->used > 56) {
        memset(ctx->buf + ctx->used, 0, 64 - ctx->used);
        _dm_sha256_block(ctx->h, ctx->buf);
        ctx->used = 0;
    }
    memset(ctx->buf + ctx->used, 0, 56 - ctx->used);
    for (i = 0; i < 8; i++) ctx->buf[56 + i] = (unsigned char)(bits >> (56 - 8 * i));
    _dm_sha256_block(ctx->h, ctx->buf);
    for (i = 0; i < 8; i++) {
        out[4 * i] = (unsigned char)(ctx->h[i] >> 24);
        out[4 * i + 1] = (unsigned char)(ctx->h[i] >> 16);
        out[4 * i + 2] = (unsigned char)(ctx->h[i] >> 8);
        out[4 * i + 3] = (unsigned char)ctx->h[i];
    }
    memset(ctx, 0, sizeof(*ctx));
}
DM_API_IMPL void dm_sha256(const void* data, size_t size, unsigned char out[32]) {
    dm_sha256_ctx c;
    dm_sha256_init(&c);
    dm_sha256_update(&c, data, size);
    dm_sha256_final(&c, out);
}
/* RFC 2104: H((K ^ opad) || H((K ^ ipad) || msg)), K zero-padded to the 64-byte block. */
DM_API_IMPL void dm_hmac_sha256(const void* key, size_t key_size, const void* msg, size_t msg_size,
                                unsigned char out[32]) {
    unsigned char k[64], pad[64], inner[32];
    dm_sha256_ctx c;
    int i;
    memset(k, 0, sizeof(k));
    if (key_size > 64) dm_sha256(key, key_size, k);
    else if (key_size) memcpy(k, key, key_size);
    for (i = 0; i < 64; i++) pad[i] = (unsigned char)(k[i] ^ 0x36);
    dm_sha256_init(&c);
    dm_sha256_update(&c, pad, 64);
    dm_sha256_update(&c, msg, msg_size);
    dm_sha256_final(&c, inner);
    for (i = 0; i < 64; i++) pad[i] = (unsigned char)(k[i] ^ 0x5c);
    dm_sha256_init(&c);
    dm_sha256_update(&c, pad, 64);
    dm_sha256_update(&c, inner, 32);
    dm_sha256_final(&c, out);
    memset(k, 0, sizeof(k));
    memset(pad, 0, sizeof(pad));
}

_DM_COLD_END
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

/* >>float semantics  The conversions, the kernels and the division of MEAN keep the semantics
   documented at dm_reduce_op whatever the includer's flags: a program built with -Ofast or
   -ffast-math compiles the implementation with them, and they let the compiler assume no NaN
   (MAX/MIN lose it), turn x / n into x * (1/n) (MEAN rounds differently) and drop signed zeros.
   So this region asks for IEEE semantics (clang: float_control precise; gcc: no-fast-math), up to
   the pop after dm_divide_local. Tested by tests/fastmath.mk (gcc and clang, -Ofast).
   Subnormals follow the thread's floating-point environment: a program linked with -Ofast or
   -ffast-math starts with flush-to-zero on (x86's FTZ/DAZ), and then they flush here too, as they
   do in OpenMPI's and Gloo's reductions. */
_DM_WARM_END
#if defined(__clang__)
#pragma float_control(precise, on, push)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC optimize("no-fast-math")
#endif
/* gcc's -O2 cost model will not vectorise loops of unknown length; the loops over the data (the
   conversions, the kernels, MEAN's division and the compression kernels) are the hot path, so
   this region alone gets -O3 (scoped by push/pop, nothing leaks to the includer), one region so
   that its functions inline into each other (gcc does not inline across optimize attributes). */
#if defined(__GNUC__) && !defined(__clang__) && !defined(__OPTIMIZE_SIZE__) && defined(__OPTIMIZE__)
#define _DM_KERNELS_O3_BEGIN _Pragma("GCC push_options") _Pragma("GCC optimize(\"O3\")")
#define _DM_KERNELS_O3_END _Pragma("GCC pop_options")
#else
#define _DM_KERNELS_O3_BEGIN
#define _DM_KERNELS_O3_END
#endif
_DM_KERNELS_O3_BEGIN

/* >>half  float16 / bfloat16 <-> float32. Rounding is to nearest, ties to even, done with
   integer arithmetic on the bit patterns (no dependence on the FPU's rounding mode). */
_DM_PRIVATE uint32_t _dm_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
_DM_PRIVATE float _dm_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

DM_API_IMPL uint16_t dm_float_to_half(float f) {
    uint32_t x = _dm_f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);           /* NaN -> quiet NaN */
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);          /* >= 65520 -> inf */
    if (ax >= 0x38800000u) {                                           /* normal half */
        uint32_t mant_odd = (ax >> 13) & 1u;
        ax += 0xc8000000u + 0xfffu + mant_odd;    /* rebias exponent 127 -> 15, round to even */
        return (uint16_t)(sign | (ax >> 13));
    }
    if (ax < 0x33000000u) return sign;                                 /* < 2^-25 -> +-0 */
    {   /* subnormal half: shift the full mantissa, round to nearest even by hand */
        uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e;                 /* 14..24: half subnormal unit is 2^-24 */
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), halfway = 1u << (shift - 1u);
        if (rem > halfway || (rem == halfway && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
}
DM_API_IMPL float dm_half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return _dm_bits_f32(sign | 0x7f800000u | (m << 13));
    if (e != 0) return _dm_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
    {   /* zero or subnormal: m * 2^-24 is exact in float */
        float v = (float)m * 5.9604644775390625e-8f;
        return sign ? -v : v;               /* -0 stays -0: >>float semantics keeps signed zeros */
    }
}
DM_API_IMPL uint16_t dm_float_to_bfloat16(float f) {
    uint32_t x = _dm_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}
DM_API_IMPL float dm_bfloat16_to_float(uint16_t b) { return _dm_bits_f32((uint32_t)b << 16); }

/* >>kernels  dst = dst op src. One loop per dtype x op so the compiler vectorises each.
   Signed integers wrap: the arithmetic is done in the unsigned type of the same width (signed
   overflow would be undefined behaviour). MAX/MIN propagate NaN: (a >= b || a != a) ? a : b.
   dst and src must not overlap (callers reduce into an accumulator from a separate buffer). */
#define _DM_KERNEL_INT(name, T, U)                                                            \
    static void name(dm_reduce_op op, T* _DM_RESTRICT dst, const T* _DM_RESTRICT src, size_t n) {                       \
        size_t i;                                                                             \
        switch (op) {                                                                         \
            case DM_SUM: case DM_MEAN:                                                        \
                for (i = 0; i < n; i++) { dst[i] = (T)(U)((U)dst[i] + (U)src[i]); } break;        \
            case DM_PROD:                                                                     \
                for (i = 0; i < n; i++) { dst[i] = (T)(U)((U)dst[i] * (U)src[i]); } break;        \
            case DM_MAX:                                                                      \
                for (i = 0; i < n; i++) { dst[i] = dst[i] >= src[i] ? dst[i] : src[i]; } break;   \
            case DM_MIN:                                                                      \
                for (i = 0; i < n; i++) { dst[i] = dst[i] <= src[i] ? dst[i] : src[i]; } break;   \
            default: break;                                                                   \
        }                                                                                     \
    }
#define _DM_KERNEL_FLOAT(name, T)                                                             \
    static void name(dm_reduce_op op, T* _DM_RESTRICT dst, const T* _DM_RESTRICT src, size_t n) {                       \
        size_t i;                                                                             \
        switch (op) {                                                                         \
            case DM_SUM: case DM_MEAN: for (i = 0; i < n; i++) { dst[i] += src[i]; } break;       \
            case DM_PROD: for (i = 0; i < n; i++) { dst[i] *= src[i]; } break;                    \
            case DM_MAX:                                                                      \
                for (i = 0; i < n; i++) {                                                     \
                    T a = dst[i], b = src[i];                                                 \
                    dst[i] = (a >= b || a != a) ? a : b;                                      \
                }                                                                             \
                break;                                                                        \
            case DM_MIN:                                                                      \
                for (i = 0; i < n; i++) {                                                     \
                    T a = dst[i], b = src[i];                                                 \
                    dst[i] = (a <= b || a != a) ? a : b;                                      \
                }                                                                             \
                break;                                                                        \
            default: break;                                                                   \
        }                                                                                     \
    }
_DM_KERNEL_INT(_dm_reduce_i8, int8_t, uint8_t)
_DM_KERNEL_INT(_dm_reduce_u8, uint8_t, uint8_t)
_DM_KERNEL_INT(_dm_reduce_i32, int32_t, uint32_t)
_DM_KERNEL_INT(_dm_reduce_u32, uint32_t, uint32_t)
_DM_KERNEL_INT(_dm_reduce_i64, int64_t, uint64_t)
_DM_KERNEL_INT(_dm_reduce_u64, uint64_t, uint64_t)
_DM_KERNEL_FLOAT(_dm_reduce_f32, float)
_DM_KERNEL_FLOAT(_dm_reduce_f64, double)
#undef _DM_KERNEL_INT
#undef _DM_KERNEL_FLOAT

/* 16-bit floats: widen a block to float32, reduce there, round back once per step. */
static void _dm_reduce_16(dm_reduce_op op, uint16_t* dst, const uint16_t* src, size_t n, bool bf16) {
    float a[256], b[256];
    size_t done, i, m;
    for (done = 0; done < n; done += m) {
        m = n - done < 256 ? n - done : 256;
        if (bf16) {
            for (i = 0; i < m; i++) { a[i] = dm_bfloat16_to_float(dst[done + i]);
                                      b[i] = dm_bfloat16_to_float(src[done + i]); }
        } else {
            for (i = 0; i < m; i++) { a[i] = dm_half_to_float(dst[done + i]);
                                      b[i] = dm_half_to_float(src[done + i]); }
        }
        _dm_reduce_f32(op, a, b, m);
        if (bf16) for (i = 0; i < m; i++) dst[done + i] = dm_float_to_bfloat16(a[i]);
        else      for (i = 0; i < m; i++) dst[done + i] = dm_float_to_half(a[i]);
    }
}

DM_API_IMPL dm_status dm_reduce_local(dm_dtype dtype, dm_reduce_op op, void* dst, const void* src,
                                      size_t count) {
    if ((unsigned)dtype >= DM_DTYPE_COUNT || (unsigned)op >= DM_REDUCE_OP_COUNT)
        return DM_ERR_INVALID_ARG;
    if (count == 0) return DM_OK;
    if (!dst || !src) return DM_ERR_INVALID_ARG;
    switch (dtype) {
        case DM_INT8:     _dm_reduce_i8(op, (int8_t*)dst, (const int8_t*)src, count); break;
        case DM_UINT8:    _dm_reduce_u8(op, (uint8_t*)dst, (const uint8_t*)src, count); break;
        case DM_INT32:    _dm_reduce_i32(op, (int32_t*)dst, (const int32_t*)src, count); break;
        case DM_UINT32:   _dm_reduce_u32(op, (uint32_t*)dst, (const uint32_t*)src, count); break;
        case DM_INT64:    _dm_reduce_i64(op, (int64_t*)dst, (const int64_t*)src, count); break;
        case DM_UINT64:   _dm_reduce_u64(op, (uint64_t*)dst, (const uint64_t*)src, count); break;
        case DM_FLOAT16:  _dm_reduce_16(op, (uint16_t*)dst, (const uint16_t*)src, count, false); break;
        case DM_BFLOAT16: _dm_reduce_16(op, (uint16_t*)dst, (const uint16_t*)src, count, true); break;
        case DM_FLOAT32:  _dm_reduce_f32(op, (float*)dst, (const float*)src, count); break;
        case DM_FLOAT64:  _dm_reduce_f64(op, (double*)dst, (const double*)src, count); break;
        default: return DM_ERR_INVALID_ARG;
    }
    return DM_OK;
}

#define _DM_DIVIDE(T, buf, n, d) do { T* p_ = (T*)(buf); size_t i_;                          \
        for (i_ = 0; i_ < (n); i_++) p_[i_] = (T)(p_[i_] / (T)(d)); } while (0)
DM_API_IMPL dm_status dm_divide_local(dm_dtype dtype, void* buf, size_t count, int divisor) {
    size_t i;
    if ((unsigned)dtype >= DM_DTYPE_COUNT || divisor <= 0) return DM_ERR_INVALID_ARG;
    if (count == 0 || divisor == 1) return DM_OK;
    if (!buf) return DM_ERR_INVALID_ARG;
    switch (dtype) {
        case DM_INT8:    _DM_DIVIDE(int8_t, buf, count, divisor); break;
        case DM_UINT8:   _DM_DIVIDE(uint8_t, buf, count, divisor); break;
        case DM_INT32:   _DM_DIVIDE(int32_t, buf, count, divisor); break;
        case DM_UINT32:  _DM_DIVIDE(uint32_t, buf, count, divisor); break;
        case DM_INT64:   _DM_DIVIDE(int64_t, buf, count, divisor); break;
        case DM_UINT64:  _DM_DIVIDE(uint64_t, buf, count, divisor); break;
        case DM_FLOAT32: _DM_DIVIDE(float, buf, count, divisor); break;
        case DM_FLOAT64: _DM_DIVIDE(double, buf, count, divisor); break;
        case DM_FLOAT16: {
            uint16_t* p = (uint16_t*)buf;
            for (i = 0; i < count; i++) p[i] = dm_float_to_half(dm_half_to_float(p[i]) / (float)divisor);
            break;
        }
        case DM_BFLOAT16: {
            uint16_t* p = (uint16_t*)buf;
            for (i = 0; i < count; i++)
                p[i] = dm_float_to_bfloat16(dm_bfloat16_to_float(p[i]) / (float)divisor);
            break;
        }
        default: return DM_ERR_INVALID_ARG;
    }
    return DM_OK;
}
/* >>compression kernels  What the compressed all-reduce (dm_all_reduce_compressed, the
   schedule at >>compressed rails) computes on each rank: the error-feedback state, the dtype to
   float32 and back, the agreed int8 scales, encoding with the residual, summing and decoding.
   Inside >>float semantics: the rounding trick and the sums' order must survive -Ofast; -O3 as
   the reduction kernels (the loops over the data vectorise). */
struct dm_compress_state {
    size_t count;
    float* residual;            /* count floats: what compression dropped on this rank, in sum units */
};
DM_API_IMPL dm_status dm_compress_state_create(size_t count, dm_compress_state** out) {
    dm_compress_state* s;
    if (!out) return DM_ERR_INVALID_ARG;
    *out = NULL;
    if (count > SIZE_MAX / sizeof(float)) return DM_ERR_INVALID_ARG;
    s = (dm_compress_state*)calloc(1, sizeof(*s));
    if (!s) return DM_ERR_OUT_OF_MEMORY;
    s->count = count;
    s->residual = (float*)calloc(count ? count : 1, sizeof(float));
    if (!s->residual) { free(s); return DM_ERR_OUT_OF_MEMORY; }
    *out = s;
    return DM_OK;
}
DM_API_IMPL void dm_compress_state_destroy(dm_compress_state* s) {
    if (!s) return;
    free(s->residual);
    free(s);
}
DM_API_IMPL size_t dm_compress_state_count(const dm_compress_state* s) { return s ? s->count : 0; }
DM_API_IMPL float* dm_compress_state_residual(dm_compress_state* s) { return s ? s->residual : NULL; }
DM_API_IMPL const char* dm_compress_name(dm_compress mode) {
    static const char* names[DM_COMPRESS_COUNT] = { "default", "none", "bf16", "int8" };
    return (unsigned)mode < DM_COMPRESS_COUNT ? names[mode] : "unknown";
}
_DM_PRIVATE bool _dm_compressible_type(dm_dtype t) { return t == DM_FLOAT32 || t == DM_BFLOAT16 || t == DM_FLOAT16; }

/* n elements of dtype t (float32, bfloat16, float16) to float32, and back (round to nearest even). */
_DM_PRIVATE void _dm_cmp_to_float(dm_dtype t, const void* src, float* dst, size_t n) {
    const uint16_t* h = (const uint16_t*)src;
    size_t k;
    if (t == DM_FLOAT32) { memcpy(dst, src, n * sizeof(float)); return; }
    for (k = 0; k < n; k++) dst[k] = t == DM_BFLOAT16 ? dm_bfloat16_to_float(h[k]) : dm_half_to_float(h[k]);
}
_DM_PRIVATE void _dm_cmp_from_float(dm_dtype t, const float* src, void* dst, size_t n) {
    uint16_t* h = (uint16_t*)dst;
    size_t k;
    if (t == DM_FLOAT32) { memcpy(dst, src, n * sizeof(float)); return; }
    for (k = 0; k < n; k++) h[k] = t == DM_BFLOAT16 ? dm_float_to_bfloat16(src[k]) : dm_float_to_half(src[k]);
}
/* Adds the residual of elements [from, to) into buf (dtype t) and clears it there: the part of
   the error feedback that does not meet this rank's compressed block. */
_DM_PRIVATE void _dm_cmp_flush(dm_compress_state* s, void* buf, dm_dtype t, size_t from, size_t to) {
    size_t es = dm_dtype_size(t), k, n;
    float tmp[256];
    for (k = from; k < to; k += n) {
        size_t j;
        bool any = false;
        n = to - k < 256 ? to - k : 256;
        for (j = 0; j < n && !any; j++) any = s->residual[k + j] != 0.0f;
        if (!any) continue;
        _dm_cmp_to_float(t, (unsigned char*)buf + k * es, tmp, n);
        for (j = 0; j < n; j++) { tmp[j] += s->residual[k + j]; s->residual[k + j] = 0.0f; }
        _dm_cmp_from_float(t, tmp, (unsigned char*)buf + k * es, n);
    }
}
/* int8: the largest magnitude of each block of DM_COMPRESS_BLOCK elements (+inf where one is not
   finite); the hosts then agree the maximum of each (MAX is exact in any order). On the bits: a
   float's magnitude orders as its bits without the sign, and inf and NaN are the largest, so
   an unsigned max (which vectorises) finds both. */
_DM_PRIVATE void _dm_cmp_maxima(const float* v, size_t n, float* m) {
    size_t b, k, nb = (n + DM_COMPRESS_BLOCK - 1) / DM_COMPRESS_BLOCK;
    for (b = 0; b < nb; b++) {
        size_t end = (b + 1) * DM_COMPRESS_BLOCK < n ? (b + 1) * DM_COMPRESS_BLOCK : n;
        uint32_t mx = 0, u;
        for (k = b * DM_COMPRESS_BLOCK; k < end; k++) {
            memcpy(&u, &v[k], sizeof(u));
            u &= 0x7fffffffu;
            mx = u > mx ? u : mx;
        }
        if (mx >= 0x7f800000u) m[b] = INFINITY;
        else memcpy(&m[b], &mx, sizeof(mx));
    }
}
/* Round to nearest even for |x| < 2^22, in the default rounding mode: adding and taking away
   1.5 x 2^23 leaves no fraction bits (vectorises, no libm). */
_DM_PRIVATE float _dm_cmp_rint(float x) { return (x + 12582912.0f) - 12582912.0f; }
/* int8 codes of v against the agreed maxima m: q = round(v * 127 / m) (|q| <= 127 since |v| <=
   m), 0 in a block whose maximum is 0 or not finite. res (or NULL) gets what was dropped, v - q
   x m / 127, the residual the next call adds back (0 where the block is not finite). */
_DM_PRIVATE void _dm_cmp_int8_encode(const float* _DM_RESTRICT v, size_t n, const float* m, int8_t* _DM_RESTRICT q,
                                     float* _DM_RESTRICT res) {
    size_t b, k, nb = (n + DM_COMPRESS_BLOCK - 1) / DM_COMPRESS_BLOCK;
    for (b = 0; b < nb; b++) {
        size_t lo = b * DM_COMPRESS_BLOCK, end = lo + DM_COMPRESS_BLOCK < n ? lo + DM_COMPRESS_BLOCK : n;
        float mb = m[b], inv = mb > 0.0f && mb <= FLT_MAX ? 127.0f / mb : 0.0f, sc = mb / 127.0f;
        for (k = lo; k < end; k++) {
            int c = (int)_dm_cmp_rint(v[k] * inv);
            c = c > 127 ? 127 : c < -127 ? -127 : c;
            q[k] = (int8_t)c;
        }
        if (!res) continue;
        if (mb <= FLT_MAX)
            for (k = lo; k < end; k++) res[k] = v[k] - (float)q[k] * sc;
        else
            for (k = lo; k < end; k++) res[k] = 0.0f;
    }
}
/* The sums of codes back to values: s x m / 127, NaN in a block whose maximum is not finite.
   sum(k) is element k's sum of codes. */
#define _DM_CMP_INT8_DECODE(n, m, out, sum)                                                          \
    do {                                                                                             \
        size_t b_, k_, nb_ = ((n) + DM_COMPRESS_BLOCK - 1) / DM_COMPRESS_BLOCK;                      \
        for (b_ = 0; b_ < nb_; b_++) {                                                               \
            size_t lo_ = b_ * DM_COMPRESS_BLOCK, end_ = lo_ + DM_COMPRESS_BLOCK < (n) ? lo_ + DM_COMPRESS_BLOCK : (n); \
            float mb_ = (m)[b_], sc_ = mb_ <= FLT_MAX ? mb_ / 127.0f : NAN;                          \
            for (k_ = lo_; k_ < end_; k_++) (out)[k_] = (float)(sum(k_)) * sc_;                      \
        }                                                                                            \
    } while (0)
/* bfloat16 codes of v; res (or NULL) gets v - bfloat16(v) (0 where v is not finite). */
_DM_PRIVATE void _dm_cmp_bf16_encode(const float* v, size_t n, uint16_t* q, float* res) {
    size_t k;
    for (k = 0; k < n; k++) {
        q[k] = dm_float_to_bfloat16(v[k]);
        if (res) res[k] = fabsf(v[k]) <= FLT_MAX ? v[k] - dm_bfloat16_to_float(q[k]) : 0.0f;
    }
}

/* v += res (the error feedback), and MEAN's divide. */
_DM_PRIVATE void _dm_cmp_add(float* v, const float* res, size_t n) {
    size_t k;
    for (k = 0; k < n; k++) v[k] += res[k];
}
_DM_PRIVATE void _dm_cmp_divide(float* v, size_t n, int divide) {
    size_t k;
    for (k = 0; k < n; k++) v[k] /= (float)divide;
}
/* H hosts' gathered codes (host h's at all + h x len codes) summed into v in host order: int8
   exactly as integers (H <= 3 here, one loop each so it vectorises) and decoded against the
   agreed maxima m. */
_DM_PRIVATE void _dm_cmp_sum_gathered(dm_compress mode, const unsigned char* _DM_RESTRICT all, int H, size_t len,
                                      const float* m, float* _DM_RESTRICT v) {
    size_t k;
    int h;
    if (mode == DM_COMPRESS_INT8) {
        const int8_t *q0 = (const int8_t*)all, *q1 = q0 + len, *q2 = q1 + len;
#define _DM_CMP_SUM2(k) ((int32_t)q0[k] + q1[k])
#define _DM_CMP_SUM3(k) ((int32_t)q0[k] + q1[k] + q2[k])
        if (H == 2) _DM_CMP_INT8_DECODE(len, m, v, _DM_CMP_SUM2);
        else _DM_CMP_INT8_DECODE(len, m, v, _DM_CMP_SUM3);
#undef _DM_CMP_SUM2
#undef _DM_CMP_SUM3
    } else {
        const uint16_t* q = (const uint16_t*)all;
        for (k = 0; k < len; k++) v[k] = dm_bfloat16_to_float(q[k]);
        for (h = 1; h < H; h++)
            for (k = 0; k < len; k++) v[k] += dm_bfloat16_to_float(q[(size_t)h * len + k]);
    }
}
/* An owner's chunk (n elements): H hosts' codes of it (host h's at in + h x cmax codes) summed in
   host order into sums (2 bytes each): int8 exactly as int16; bf16 in float32, rounded to
   bfloat16 once, the rounding's error added to res (or NULL) where finite. */
_DM_PRIVATE void _dm_cmp_owner_sum(dm_compress mode, const unsigned char* in, int H, size_t cmax, size_t n,
                                   unsigned char* sums, float* res) {
    size_t k;
    int h;
    if (mode == DM_COMPRESS_INT8) {
        const int8_t* q = (const int8_t*)in;
        int16_t* out = (int16_t*)(void*)sums;
        for (k = 0; k < n; k++) {
            int32_t sum = 0;
            for (h = 0; h < H; h++) sum += q[(size_t)h * cmax + k];
            out[k] = (int16_t)sum;
        }
    } else {
        const uint16_t* q = (const uint16_t*)(const void*)in;
        uint16_t* out = (uint16_t*)(void*)sums;
        for (k = 0; k < n; k++) {
            float sum = 0.0f;
            for (h = 0; h < H; h++) sum += dm_bfloat16_to_float(q[(size_t)h * cmax + k]);
            out[k] = dm_float_to_bfloat16(sum);
            if (res && fabsf(sum) <= FLT_MAX) res[k] += sum - dm_bfloat16_to_float(out[k]);
        }
    }
}
/* The owners' sums (2 bytes an element, len) decoded into v. */
_DM_PRIVATE void _dm_cmp_decode_sums(dm_compress mode, const unsigned char* sums, size_t len, const float* m, float* v) {
    size_t k;
    if (mode == DM_COMPRESS_INT8) {
        const int16_t* q = (const int16_t*)(const void*)sums;
#define _DM_CMP_SUMS(k) q[k]
        _DM_CMP_INT8_DECODE(len, m, v, _DM_CMP_SUMS);
#undef _DM_CMP_SUMS
    } else {
        for (k = 0; k < len; k++) v[k] = dm_bfloat16_to_float(((const uint16_t*)(const void*)sums)[k]);
    }
}
_DM_KERNELS_O3_END
#undef _DM_DIVIDE
#if defined(__clang__)
#pragma float_control(pop)
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif
_DM_WARM_BEGIN

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
/* >>trace hooks  The flight recorder and the timeline live in distmesh_trace.h, which the
   implementation includes at >>trace include (after >>requests: its dumps list the queue). The
   core reaches them only through the calls below; where one runs per operation or per wait it
   sits behind _DM_TRACED(c), c->core->trace read relaxed (NULL: off). With DISTMESH_NO_TRACE the
   file is left out: the trace stays NULL, _DM_TRACED(c) is a constant null pointer (those sites
   compile to nothing), the other hooks are empty stand-ins, and dm_flight_recorder_dump
   answers DM_ERR_UNSUPPORTED. */
#if !defined(DISTMESH_NO_TRACE)
#define _DM_TRACED(c) __atomic_load_n(&(c)->core->trace, __ATOMIC_RELAXED)
_DM_PRIVATE struct _dm_trace* _dm_trace_wanted(const dm_logger* lg);    /* a collective's init */
/* _dm_op_run, when on: begin says whether the recorder's fast path took o (then end follows
   the run); if not, the full path runs it (the timeline, object collectives, split). */
_DM_PRIVATE bool _dm_trace_op_begin(dm_collective* c, const dm_op* o);
_DM_PRIVATE dm_status _dm_trace_op_end(dm_collective* c, const dm_op* o, dm_status st);
_DM_PRIVATE dm_status _dm_trace_op_run_full(dm_collective* c, const dm_op* o);
_DM_PRIVATE int64_t _dm_trace_now(void);
_DM_PRIVATE void _dm_trace_queued(int64_t t_queued);                    /* a request about to run */
_DM_PRIVATE uint64_t _dm_trace_stream_start(dm_collective* c, const dm_op* o, int64_t t_start);
_DM_PRIVATE void _dm_trace_stream_end(dm_collective* c, const dm_op* o, uint64_t index, int64_t t_start,
                                      dm_status st);
_DM_PRIVATE void _dm_trace_adopt(dm_collective* c, dm_collective* child, const char* what, int color);
_DM_PRIVATE void _dm_trace_closing(dm_collective* c);                   /* dm_destroy */
_DM_PRIVATE void _dm_trace_release(dm_collective* c);
_DM_PRIVATE void _dm_trace_peer_seen(dm_collective* c, int peer, int kind, uint64_t seq);  /* fingerprints */
_DM_PRIVATE void _dm_trace_waited(dm_collective* c, int peer, int64_t since_us);           /* the engine */
_DM_PRIVATE void _dm_trace_wait(dm_collective* c, int peer, int64_t wait_us);
_DM_PRIVATE void _dm_trace_idle(dm_collective* c, bool slept);
#else
#define _DM_TRACED(c) ((struct _dm_trace*)0)
_DM_PRIVATE dm_status _dm_op_dispatch(dm_collective* c, const dm_op* o);
_DM_PRIVATE struct _dm_trace* _dm_trace_wanted(const dm_logger* lg) { (void)lg; return NULL; }
_DM_PRIVATE bool _dm_trace_op_begin(dm_collective* c, const dm_op* o) { (void)c; (void)o; return false; }
_DM_PRIVATE dm_status _dm_trace_op_end(dm_collective* c, const dm_op* o, dm_status st) { (void)c; (void)o; return st; }
_DM_PRIVATE dm_status _dm_trace_op_run_full(dm_collective* c, const dm_op* o) { return _dm_op_dispatch(c, o); }
_DM_PRIVATE int64_t _dm_trace_now(void) { return 0; }
_DM_PRIVATE void _dm_trace_queued(int64_t t_queued) { (void)t_queued; }
_DM_PRIVATE uint64_t _dm_trace_stream_start(dm_collective* c, const dm_op* o, int64_t t_start) {
    (void)c; (void)o; (void)t_start;
    return 0;
}
_DM_PRIVATE void _dm_trace_stream_end(dm_collective* c, const dm_op* o, uint64_t index, int64_t t_start,
                                      dm_status st) {
    (void)c; (void)o; (void)index; (void)t_start; (void)st;
}
_DM_PRIVATE void _dm_trace_adopt(dm_collective* c, dm_collective* child, const char* what, int color) {
    (void)c; (void)child; (void)what; (void)color;
}
_DM_PRIVATE void _dm_trace_closing(dm_collective* c) { (void)c; }
_DM_PRIVATE void _dm_trace_release(dm_collective* c) { (void)c; }
_DM_PRIVATE void _dm_trace_peer_seen(dm_collective* c, int peer, int kind, uint64_t seq) {
    (void)c; (void)peer; (void)kind; (void)seq;
}
_DM_PRIVATE void _dm_trace_waited(dm_collective* c, int peer, int64_t since_us) { (void)c; (void)peer; (void)since_us; }
_DM_PRIVATE void _dm_trace_wait(dm_collective* c, int peer, int64_t wait_us) { (void)c; (void)peer; (void)wait_us; }
_DM_PRIVATE void _dm_trace_idle(dm_collective* c, bool slept) { (void)c; (void)slept; }
#endif

_DM_COLD_BEGIN
/* >>collective base */
_DM_PRIVATE void _dm_collective_init(dm_collective* c, _dm_core* core, const dm_collective_vtable* vt,
                                     int rank, int size, int timeout_ms, const dm_logger* logger,
                                     const dm_allocator* allocator) {
    c->vt = vt;
    c->core = core;
    c->rank = rank;
    c->size = size;
    c->local_rank = rank;
    c->local_size = size;
    c->device.type = DM_DEVICE_CPU;
    c->device.index = 0;
    c->timeout_ms = _dm_timeout_logged(timeout_ms, logger);
    c->seq = 0;
    if (logger) c->logger = *logger;
    if (allocator) c->allocator = *allocator;
    c->local = NULL;
    if (gethostname(c->node_name, sizeof(c->node_name) - 1) != 0) _dm_copy_name(c->node_name, 64, "localhost");
    c->node_name[sizeof(c->node_name) - 1] = 0;
    c->last_error[0] = 0;
    memset(core, 0, sizeof(*core));
    core->trace = _dm_trace_wanted(logger);
    core->max_object_bytes = _dm_cfg_bytes_logged(_DM_CFG_MAX_OBJECT_BYTES, logger);
    c->shrink_needs_exclude = false;
}

/* Which ranks share a host, for the backends that gather every member's host identity (TCP,
   NCCL): the host name and the kernel's boot id, or DISTMESH_TEST_HOST_ID (tests and benchmarks
   simulate hosts with it) -- never the launcher's LOCAL_WORLD_SIZE, which sub-groups break.
   name gets what dm_local groups by (node_name); id the identity (id_cap >= 96). */
_DM_PRIVATE void _dm_host_identity(char* name, size_t name_cap, char* id, size_t id_cap) {
    const char* test = _dm_cfg_raw(_DM_CFG_TEST_HOST_ID);
    char boot[64] = "";
    FILE* f;
    memset(name, 0, name_cap);
    memset(id, 0, id_cap);
    if (test) {
        _dm_copy_name(name, name_cap, test);
        snprintf(id, id_cap, "test:%s", test);
        return;
    }
    if (gethostname(name, name_cap - 1) != 0) _dm_copy_name(name, name_cap, "localhost");
    name[name_cap - 1] = 0;
    if ((f = fopen("/proc/sys/kernel/random/boot_id", "r")) != NULL) {
        if (!fgets(boot, sizeof(boot), f)) boot[0] = 0;
        fclose(f);
        boot[strcspn(boot, "\n")] = 0;
    }
    snprintf(id, id_cap, "%.54s/%.39s", name, boot);     /* a boot id is 36 bytes */
}
/* Orders host identities, equal ones by their address: records lie in rank order, so the first
   of equal identities is the lowest rank. */
_DM_PRIVATE int _dm_id_order(const void* a, const void* b) {
    const char* x = *(const char* const*)a;
    const char* y = *(const char* const*)b;
    int c = strcmp(x, y);
    return c ? c : (x < y ? -1 : x > y);
}
/* W records of `stride` bytes, each holding a NUL-terminated host identity at its start: host_of[j]
   (if not NULL) is the lowest rank on rank j's host, and *local_rank / *local_size are rank me's
   place on its host (ranks in order). Sorted, not compared pair by pair: O(W log W) at setup
   (a world of one rank per host made every pair meet). False when out of memory. */
_DM_PRIVATE bool _dm_hosts_from_ids(const dm_allocator* a, const unsigned char* ids, size_t stride, int W, int me,
                                    int* host_of, int* local_rank, int* local_size) {
    const char** by = (const char**)_dm_malloc(a, sizeof(*by) * (size_t)(W > 0 ? W : 1));
    int i, e, j;
    *local_rank = *local_size = 0;
    if (!by) return false;
    for (j = 0; j < W; j++) by[j] = (const char*)ids + (size_t)j * stride;
    qsort(by, (size_t)W, sizeof(*by), _dm_id_order);
    for (i = 0; i < W; i = e) {       /* each run of equal identities is a host */
        int first = (int)((size_t)((const unsigned char*)by[i] - ids) / stride), at = -1;
        for (e = i; e < W && strcmp(by[e], by[i]) == 0; e++) {
            j = (int)((size_t)((const unsigned char*)by[e] - ids) / stride);
            if (host_of) host_of[j] = first;
            if (j == me) at = e - i;
        }
        if (at >= 0) {
            *local_rank = at;
            *local_size = e - i;
        }
    }
    _dm_free(a, by);
    return true;
}

/* One block: the item array, then the bytes of every item back to back (so the bytes of a
   broadcast_objects result can travel as one buffer). */
_DM_PRIVATE dm_status _dm_blob_list_alloc(const dm_allocator* a, const size_t* sizes, size_t count,
                                          dm_blob_list* out) {
    size_t i, total = count * sizeof(dm_blob);
    unsigned char* block;
    out->items = NULL;
    out->count = 0;
    if (count > SIZE_MAX / sizeof(dm_blob)) return DM_ERR_OUT_OF_MEMORY;
    for (i = 0; i < count; i++) {
        if (sizes[i] > SIZE_MAX - total) return DM_ERR_OUT_OF_MEMORY;
        total += sizes[i];
    }
    block = (unsigned char*)_dm_malloc(a, total);
    if (!block) return DM_ERR_OUT_OF_MEMORY;
    out->items = (dm_blob*)(void*)block;
    out->count = count;
    total = count * sizeof(dm_blob);
    for (i = 0; i < count; i++) {
        out->items[i].data = block + total;
        out->items[i].size = sizes[i];
        total += sizes[i];
    }
    return DM_OK;
}

_DM_COLD_END
/* >>validation  The wrappers check everything a backend would otherwise trust. */
#define _DM_VT_HAS(vt, fn) \
    ((vt)->struct_size >= offsetof(dm_collective_vtable, fn) + sizeof((vt)->fn) && (vt)->fn)

_DM_PRIVATE dm_status _dm_check_type(dm_collective* c, const char* op_name, dm_dtype dtype) {
    if ((unsigned)dtype >= DM_DTYPE_COUNT)
        return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: invalid dtype %d", op_name, (int)dtype);
    return DM_OK;
}
_DM_PRIVATE dm_status _dm_check_op(dm_collective* c, const char* op_name, dm_reduce_op op) {
    if ((unsigned)op >= DM_REDUCE_OP_COUNT)
        return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: invalid reduce op %d", op_name, (int)op);
    return DM_OK;
}
/* Bytes of count elements times blocks, or a failure if that overflows size_t. */
_DM_PRIVATE dm_status _dm_check_bytes(dm_collective* c, const char* op_name, size_t count,
                                      dm_dtype dtype, size_t blocks, size_t* out) {
    size_t esize = dm_dtype_size(dtype);
    if (blocks == 0) blocks = 1;
    if (count > SIZE_MAX / esize / blocks)
        return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: count %zu x %zu x %zu bytes overflows size_t",
                        op_name, count, blocks, esize);
    *out = count * esize * blocks;
    return DM_OK;
}
_DM_PRIVATE dm_status _dm_check_buffer(dm_collective* c, const char* op_name, const char* what,
                                       const void* p, size_t bytes) {
    if (!p && bytes > 0)
        return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: %s buffer is NULL", op_name, what);
    return DM_OK;
}
/* Two ranges either do not overlap or the small one sits exactly at the expected offset. */
_DM_PRIVATE bool _dm_layout_ok(const void* big, size_t big_bytes, const void* small,
                               size_t small_bytes, size_t expected_offset) {
    uintptr_t b = (uintptr_t)big, s = (uintptr_t)small;
    if (small_bytes == 0 || big_bytes == 0) return true;
    if (s + small_bytes <= b || b + big_bytes <= s) return true;
    return s == b + expected_offset;
}
_DM_PRIVATE dm_status _dm_begin(dm_collective* c, const char* op_name) {
    (void)op_name;
    _dm_errbuf(c)[0] = 0;
    /* atomic because dm_sequence may read it on another thread; a load and a store, not a
       locked add (a full barrier on x86), because one thread at a time runs an operation
       (_dm_submit's busy flag, the async queue) and only that thread counts */
    __atomic_store_n(&c->seq, __atomic_load_n(&c->seq, __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED);
    return DM_OK;
}
#define _DM_TRY(expr) do { dm_status st_ = (expr); if (st_ != DM_OK) return st_; } while (0)

/* all_gather through all_gather_to_list: one pointer per rank into recv. */
_DM_PRIVATE dm_status _dm_all_gather_via_list(dm_collective* c, const void* send, void* recv,
                                              size_t count, dm_dtype dtype) {
    size_t block = count * dm_dtype_size(dtype);
    void** ptrs = (void**)_dm_malloc(&c->allocator, sizeof(void*) * (size_t)c->size);
    dm_status st;
    int r;
    if (!ptrs) return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "all_gather: no memory for %d pointers", c->size);
    for (r = 0; r < c->size; r++) ptrs[r] = (unsigned char*)recv + (size_t)r * block;
    st = c->vt->all_gather_to_list(c, send, (void* const*)ptrs, count, dtype);
    _dm_free(&c->allocator, ptrs);
    return st;
}
/* all_gather_to_list through all_gather: into a temporary of world x count, then copied out. */
_DM_PRIVATE dm_status _dm_all_gather_list_via_block(dm_collective* c, const void* send,
                                                    void* const* recvs, size_t count, dm_dtype dtype) {
    size_t block = count * dm_dtype_size(dtype);
    unsigned char* tmp = (unsigned char*)_dm_malloc(&c->allocator, block * (size_t)c->size);
    dm_status st;
    int r;
    if (!tmp) return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "all_gather_to_list: no memory for %zu bytes",
                              block * (size_t)c->size);
    st = c->vt->all_gather(c, send, tmp, count, dtype);
    if (st == DM_OK)
        for (r = 0; r < c->size; r++)
            if (recvs[r] != tmp + (size_t)r * block) memmove(recvs[r], tmp + (size_t)r * block, block);
    _dm_free(&c->allocator, tmp);
    return st;
}

/* >>public collectives  Each call is checked (_dm_prep_*: arguments into a dm_op, failures
   before anything is queued or sent), then submitted (>>requests): run on the caller's thread,
   or queued for the progress thread by the _async twins. */
_DM_PRIVATE dm_status _dm_check_root(dm_collective* c, const char* name, int root) {
    if (root < 0 || root >= c->size)
        return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: root %d is not a rank of this %d-rank collective%s",
                        name, root, c->size, c->size == 1 ? " (only rank 0 exists)" : "");
    return DM_OK;
}
_DM_PRIVATE dm_status _dm_check_slot(dm_collective* c, const char* name, bool has) {
    if (!has) return _DM_FAIL(c, DM_ERR_UNSUPPORTED, "%s: backend %s has no %s", name, c->vt->name, name);
    return DM_OK;
}
_DM_PRIVATE void _dm_op_init(dm_op* o, dm_op_kind kind, dm_dtype dtype) {
    memset(o, 0, sizeof(*o));
    o->kind = kind;
    o->dtype = dtype;
}

_DM_PRIVATE dm_status _dm_prep_all_reduce(dm_collective* c, const void* send, void* recv, size_t count,
                                          dm_dtype dtype, dm_reduce_op op, dm_op* o) {
    static const char* name = "all_reduce";
    size_t bytes = 0;
    _DM_TRY(_dm_check_type(c, name, dtype));
    _DM_TRY(_dm_check_op(c, name, op));
    _DM_TRY(_dm_check_bytes(c, name, count, dtype, 1, &bytes));
    _DM_TRY(_dm_check_buffer(c, name, "recv", recv, bytes));
    if (!send) send = recv;
    if (!_dm_layout_ok(recv, bytes, send, bytes, 0))
        return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: send and recv overlap partially", name);
    _DM_TRY(_dm_check_slot(c, name, _DM_VT_HAS(c->vt, all_reduce)));
    _dm_op_init(o, DM_OP_ALL_REDUCE, dtype);
    o->send = send; o->recv = recv; o->count = count; o->op = op;
    return DM_OK;
}

/* dm_all_reduce_compressed's checks: dm_all_reduce's, then the mode against the dtype and the
   op, and the state's count (>>functions compression). */
_DM_PRIVATE dm_status _dm_prep_all_reduce_compressed(dm_collective* c, const void* send, void* recv, size_t count,
                                                     dm_dtype dtype, dm_reduce_op op, dm_compress mode,
                                                     dm_compress_state* state, dm_op* o) {
    static const char* name = "all_reduce";
    _DM_TRY(_dm_prep_all_reduce(c, send, recv, count, dtype, op, o));
    if ((unsigned)mode >= DM_COMPRESS_COUNT)
        return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: compression mode %d is not a dm_compress", name, (int)mode);
    if (mode == DM_COMPRESS_BF16 || mode == DM_COMPRESS_INT8) {
        if (!_dm_compressible_type(dtype))
            return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: compression %s takes float32, bfloat16 or float16, not %s",
                            name, dm_compress_name(mode), dm_dtype_name(dtype));
        if (op != DM_SUM && op != DM_MEAN)
            return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: compression %s takes sum or mean, not %s", name,
                            dm_compress_name(mode), dm_reduce_op_name(op));
    }
    if (state && state->count != count)
        return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: the compression state holds %zu elements, the call %zu", name,
                        state->count, count);
    if (state && !_dm_compressible_type(dtype))
        return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: a compression state takes float32, bfloat16 or float16, not %s",
                        name, dm_dtype_name(dtype));
    o->compress = mode;
    o->compress_state = state;
    return DM_OK;
}

_DM_PRIVATE dm_status _dm_prep_all_gather(dm_collective* c, const void* send, void* recv, size_t count,
                                          dm_dtype dtype, dm_op* o) {
    static const char* name = "all_gather";
    size_t bytes = 0, total = 0;
    _DM_TRY(_dm_check_type(c, name, dtype));
    _DM_TRY(_dm_check_bytes(c, name, count, dtype, 1, &bytes));
    _DM_TRY(_dm_check_bytes(c, name, count, dtype, (size_t)c->size, &total));
    _DM_TRY(_dm_check_buffer(c, name, "recv", recv, total));
    if (!send) send = (unsigned char*)recv + (size_t)c->rank * bytes;
    if (!_dm_layout_ok(recv, total, send, bytes, (size_t)c->rank * bytes))
        return _DM_FAIL(c, DM_ERR_INVALID_ARG,
                        "%s: send overlaps recv but is not at recv + rank * count (in-place layout)", name);
    _DM_TRY(_dm_check_slot(c, name, _DM_VT_HAS(c->vt, all_gather) || _DM_VT_HAS(c->vt, all_gather_to_list)));
    _dm_op_init(o, DM_OP_ALL_GATHER, dtype);
    o->send = send; o->recv = recv; o->count = count;
    return DM_OK;
}

_DM_PRIVATE dm_status _dm_prep_all_gather_to_list(dm_collective* c, const void* send, void* const* recvs,
                                                  size_t count, dm_dtype dtype, dm_op* o) {
    static const char* name = "all_gather_to_list";
    size_t bytes = 0;
    int r, q;
    _DM_TRY(_dm_check_type(c, name, dtype));
    _DM_TRY(_dm_check_bytes(c, name, count, dtype, (size_t)c->size, &bytes));
    bytes /= (size_t)c->size;
    if (!recvs) return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: recvs is NULL", name);
    for (r = 0; r < c->size; r++) {
        if (!recvs[r] && bytes)
            return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: recvs[%d] is NULL", name, r);
        for (q = 0; q < r && bytes; q++)
            if (!_dm_layout_ok(recvs[q], bytes, recvs[r], bytes, SIZE_MAX))
                return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: recvs[%d] and recvs[%d] overlap", name, q, r);
    }
    if (!send) send = recvs[c->rank];
    for (r = 0; r < c->size; r++)
        if (!_dm_layout_ok(recvs[r], bytes, send, bytes, r == c->rank ? 0 : SIZE_MAX))
            return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: send overlaps recvs[%d]", name, r);
    _DM_TRY(_dm_check_slot(c, "all_gather", _DM_VT_HAS(c->vt, all_gather) || _DM_VT_HAS(c->vt, all_gather_to_list)));
    _dm_op_init(o, DM_OP_ALL_GATHER_TO_LIST, dtype);
    o->send = send; o->recvs = recvs; o->count = count;
    return DM_OK;
}

_DM_PRIVATE dm_status _dm_prep_reduce_scatter(dm_collective* c, const void* send, void* recv, size_t recv_count,
                                              dm_dtype dtype, dm_reduce_op op, dm_op* o) {
    static const char* name = "reduce_scatter";
    size_t bytes = 0, total = 0;
    _DM_TRY(_dm_check_type(c, name, dtype));
    _DM_TRY(_dm_check_op(c, name, op));
    _DM_TRY(_dm_check_bytes(c, name, recv_count, dtype, 1, &bytes));
    _DM_TRY(_dm_check_bytes(c, name, recv_count, dtype, (size_t)c->size, &total));
    _DM_TRY(_dm_check_buffer(c, name, "recv", recv, bytes));
    _DM_TRY(_dm_check_buffer(c, name, "send", send, total));
    if (!send) send = recv; /* only reachable with zero bytes */
    if (!_dm_layout_ok(send, total, recv, bytes, (size_t)c->rank * bytes))
        return _DM_FAIL(c, DM_ERR_INVALID_ARG,
                        "%s: recv overlaps send but is not at send + rank * recv_count (in-place layout)", name);
    _DM_TRY(_dm_check_slot(c, name, _DM_VT_HAS(c->vt, reduce_scatter)));
    _dm_op_init(o, DM_OP_REDUCE_SCATTER, dtype);
    o->send = send; o->recv = recv; o->count = recv_count; o->op = op;
    return DM_OK;
}

_DM_PRIVATE dm_status _dm_prep_broadcast(dm_collective* c, void* buf, size_t count, dm_dtype dtype, int root,
                                         dm_op* o) {
    static const char* name = "broadcast";
    size_t bytes = 0;
    _DM_TRY(_dm_check_type(c, name, dtype));
    _DM_TRY(_dm_check_bytes(c, name, count, dtype, 1, &bytes));
    _DM_TRY(_dm_check_buffer(c, name, "buf", buf, bytes));
    _DM_TRY(_dm_check_root(c, name, root));
    _DM_TRY(_dm_check_slot(c, name, _DM_VT_HAS(c->vt, broadcast)));
    _dm_op_init(o, DM_OP_BROADCAST, dtype);
    o->recv = buf; o->send = buf; o->count = count; o->root = root;
    return DM_OK;
}

/* reduce: send (count) everywhere, recv (count) at the root only. */
_DM_PRIVATE dm_status _dm_prep_reduce(dm_collective* c, const void* send, void* recv, size_t count, dm_dtype dtype,
                                      dm_reduce_op op, int root, dm_op* o) {
    static const char* name = "reduce";
    size_t bytes = 0;
    bool at_root;
    _DM_TRY(_dm_check_type(c, name, dtype));
    _DM_TRY(_dm_check_op(c, name, op));
    _DM_TRY(_dm_check_root(c, name, root));
    _DM_TRY(_dm_check_bytes(c, name, count, dtype, 1, &bytes));
    at_root = c->rank == root;
    if (at_root) _DM_TRY(_dm_check_buffer(c, name, "recv (at the root)", recv, bytes));
    if (!send) {
        if (!at_root) return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: send is NULL on rank %d (in place only at the root)", name, c->rank);
        send = recv;
    }
    _DM_TRY(_dm_check_buffer(c, name, "send", send, bytes));
    if (at_root && !_dm_layout_ok(recv, bytes, send, bytes, 0))
        return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: send and recv overlap partially", name);
    _DM_TRY(_dm_check_slot(c, name, _DM_VT_HAS(c->vt, reduce) || _DM_VT_HAS(c->vt, all_reduce)));
    _dm_op_init(o, DM_OP_REDUCE, dtype);
    o->send = send; o->recv = at_root ? recv : NULL; o->count = count; o->op = op; o->root = root;
    return DM_OK;
}

/* gather (send: count everywhere, recv: size * count at the root) and scatter (the mirror):
   the root's whole buffer and everyone's part; in place, the part is the root's own block. */
_DM_PRIVATE dm_status _dm_prep_rooted(dm_collective* c, bool gather, const void* send, void* recv, size_t count,
                                      dm_dtype dtype, int root, dm_op* o) {
    const char* name = gather ? "gather" : "scatter";
    const char *whole_name = gather ? "recv" : "send", *part_name = gather ? "send" : "recv";
    unsigned char* whole = (unsigned char*)(uintptr_t)(gather ? recv : send);
    const void* part = gather ? send : recv;
    size_t bytes = 0, total = 0;
    bool at_root = c->rank == root;
    _DM_TRY(_dm_check_type(c, name, dtype));
    _DM_TRY(_dm_check_root(c, name, root));
    _DM_TRY(_dm_check_bytes(c, name, count, dtype, 1, &bytes));
    _DM_TRY(_dm_check_bytes(c, name, count, dtype, (size_t)c->size, &total));
    if (at_root) {
        if (!whole && total)
            return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: %s buffer is NULL at the root", name, whole_name);
        if (!part) part = whole + (size_t)root * bytes;
        if (!_dm_layout_ok(whole, total, part, bytes, (size_t)root * bytes))
            return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: %s overlaps %s but is not at %s + root * count (in-place "
                            "layout)", name, part_name, whole_name, whole_name);
    }
    _DM_TRY(_dm_check_buffer(c, name, part_name, part, bytes));
    _DM_TRY(_dm_check_slot(c, name, gather ? _DM_VT_HAS(c->vt, gather) || _DM_VT_HAS(c->vt, all_gather) ||
                                                 _DM_VT_HAS(c->vt, all_gather_to_list)
                                           : _DM_VT_HAS(c->vt, scatter) || _DM_VT_HAS(c->vt, broadcast)));
    _dm_op_init(o, gather ? DM_OP_GATHER : DM_OP_SCATTER, dtype);
    o->send = gather ? part : (at_root ? whole : NULL);
    o->recv = gather ? (at_root ? whole : NULL) : (void*)(uintptr_t)part;
    o->count = count; o->root = root;
    return DM_OK;
}

/* The bytes one side of all_to_all_v spans (the largest offset + count), checking that the
   blocks do not overlap each other and that nothing overflows. */
_DM_PRIVATE dm_status _dm_a2a_span(dm_collective* c, const char* side, const size_t* counts, const size_t* offs,
                                   size_t esize, size_t* span) {
    static const char* name = "all_to_all_v";
    int i, j, W = c->size;
    *span = 0;
    if (!counts || !offs) return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: %s counts or offsets are NULL", name, side);
    for (i = 0; i < W; i++) {
        if (counts[i] > SIZE_MAX / esize || offs[i] > SIZE_MAX / esize - counts[i])
            return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: %s block %d (offset %zu, count %zu) overflows size_t",
                            name, side, i, offs[i], counts[i]);
        if ((offs[i] + counts[i]) * esize > *span) *span = (offs[i] + counts[i]) * esize;
        for (j = 0; j < i; j++)
            if (counts[i] && counts[j] && offs[i] < offs[j] + counts[j] && offs[j] < offs[i] + counts[i])
                return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: %s blocks %d and %d overlap", name, side, j, i);
    }
    return DM_OK;
}
_DM_PRIVATE dm_status _dm_prep_all_to_all_v(dm_collective* c, const void* send, const size_t* send_counts,
                                            const size_t* send_offsets, void* recv, const size_t* recv_counts,
                                            const size_t* recv_offsets, dm_dtype dtype, dm_op* o) {
    static const char* name = "all_to_all_v";
    size_t sspan = 0, rspan = 0;
    _DM_TRY(_dm_check_type(c, name, dtype));
    _DM_TRY(_dm_a2a_span(c, "recv", recv_counts, recv_offsets, dm_dtype_size(dtype), &rspan));
    _DM_TRY(_dm_check_buffer(c, name, "recv", recv, rspan));
    if (send) {
        _DM_TRY(_dm_a2a_span(c, "send", send_counts, send_offsets, dm_dtype_size(dtype), &sspan));
        _DM_TRY(_dm_check_buffer(c, name, "send", send, sspan));
        if (send != recv && !_dm_layout_ok(recv, rspan, send, sspan, SIZE_MAX))
            return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: send and recv overlap (pass send NULL for in place)", name);
    } else {
        send_counts = send_counts ? send_counts : recv_counts;      /* in place: recv's blocks go out */
        send_offsets = send_offsets ? send_offsets : recv_offsets;
        _DM_TRY(_dm_a2a_span(c, "send", send_counts, send_offsets, dm_dtype_size(dtype), &sspan));
        if (sspan > rspan) return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: in place, the send blocks reach beyond recv", name);
    }
    _DM_TRY(_dm_check_slot(c, name, _DM_VT_HAS(c->vt, all_to_all_v) || _DM_VT_HAS(c->vt, send)));
    _dm_op_init(o, DM_OP_ALL_TO_ALL_V, dtype);
    o->send = send; o->recv = recv;
    o->send_counts = send_counts; o->send_offsets = send_offsets;
    o->recv_counts = recv_counts; o->recv_offsets = recv_offsets;
    return DM_OK;
}
/* all_to_all: the uniform case (counts and offsets made at run time). */
_DM_PRIVATE dm_status _dm_prep_all_to_all(dm_collective* c, const void* send, void* recv, size_t count,
                                          dm_dtype dtype, dm_op* o) {
    static const char* name = "all_to_all";
    size_t total = 0;
    _DM_TRY(_dm_check_type(c, name, dtype));
    _DM_TRY(_dm_check_bytes(c, name, count, dtype, (size_t)c->size, &total));
    _DM_TRY(_dm_check_buffer(c, name, "recv", recv, total));
    if (send == recv) send = NULL;
    if (send) _DM_TRY(_dm_check_buffer(c, name, "send", send, total));
    if (send && !_dm_layout_ok(recv, total, send, total, SIZE_MAX))
        return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: send and recv overlap partially", name);
    _DM_TRY(_dm_check_slot(c, name, _DM_VT_HAS(c->vt, all_to_all_v) || _DM_VT_HAS(c->vt, send)));
    _dm_op_init(o, DM_OP_ALL_TO_ALL, dtype);
    o->send = send; o->recv = recv; o->count = count;
    return DM_OK;
}

/* A recv from any source (its buffer checked by the caller): the tag, a peer to hear from, the
   backend's slot. */
_DM_PRIVATE dm_status _dm_prep_recv_any(dm_collective* c, const void* buf, size_t count, dm_dtype dtype, int tag,
                                        dm_op* o) {
    if (tag < 0) return _DM_FAIL(c, DM_ERR_INVALID_ARG, "recv: tag %d is negative", tag);
    if (c->size == 1)
        return _DM_FAIL(c, DM_ERR_INVALID_ARG, "recv: from any source in a 1-rank collective (no other rank can send)");
    if (!_DM_VT_HAS(c->vt, recv_any))
        return _DM_FAIL(c, DM_ERR_UNSUPPORTED, "recv: the %s backend cannot receive from any source (%s)",
                        c->vt->name, strcmp(c->vt->name, "nccl") == 0 ? "NCCL matches a receive to one named peer"
                                                                     : "name the peer");
    _dm_op_init(o, DM_OP_RECV, dtype);
    o->recv = (void*)(uintptr_t)buf;
    o->count = count; o->root = DM_ANY_SOURCE; o->tag = tag;
    return DM_OK;
}
_DM_PRIVATE dm_status _dm_prep_p2p(dm_collective* c, bool sending, const void* buf, size_t count, dm_dtype dtype,
                                   int peer, int tag, dm_op* o) {
    const char* name = sending ? "send" : "recv";
    size_t bytes = 0;
    _DM_TRY(_dm_check_type(c, name, dtype));
    _DM_TRY(_dm_check_bytes(c, name, count, dtype, 1, &bytes));
    _DM_TRY(_dm_check_buffer(c, name, "buf", buf, bytes));
    if (peer == DM_ANY_SOURCE && !sending) return _dm_prep_recv_any(c, buf, count, dtype, tag, o);
    if (peer < 0 || peer >= c->size)
        return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: peer %d is not a rank of this %d-rank collective", name, peer, c->size);
    if (peer == c->rank)
        return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: peer %d is this rank (a rank cannot %s itself)", name, peer,
                        sending ? "send to" : "receive from");
    if (tag < 0) return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: tag %d is negative", name, tag);
    _DM_TRY(_dm_check_slot(c, name, sending ? _DM_VT_HAS(c->vt, send) : _DM_VT_HAS(c->vt, recv)));
    _dm_op_init(o, sending ? DM_OP_SEND : DM_OP_RECV, dtype);
    if (sending) o->send = buf; else o->recv = (void*)(uintptr_t)buf;
    o->count = count; o->root = peer; o->tag = tag;
    return DM_OK;
}

_DM_PRIVATE dm_status _dm_prep_gather_objects(dm_collective* c, const void* data, size_t size, dm_blob_list* out,
                                              dm_op* o) {
    static const char* name = "all_gather_objects";
    if (!out) return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: out is NULL", name);
    out->items = NULL;
    out->count = 0;
    if (size == 0) return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: object size is 0 (objects must hold bytes)", name);
    if (!data) return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: data is NULL", name);
    _dm_op_init(o, DM_OP_ALL_GATHER_OBJECTS, DM_UINT8);
    o->send = data; o->count = size; o->out_list = out;
    return DM_OK;
}
_DM_PRIVATE dm_status _dm_prep_broadcast_objects(dm_collective* c, const dm_blob* objects, size_t count, int root,
                                                 dm_blob_list* out, dm_op* o) {
    static const char* name = "broadcast_objects";
    size_t i;
    if (!out) return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: out is NULL", name);
    out->items = NULL;
    out->count = 0;
    _DM_TRY(_dm_check_root(c, name, root));
    if (c->rank == root) {
        if (!objects && count > 0) return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: objects is NULL", name);
        for (i = 0; i < count; i++) {
            if (objects[i].size == 0)
                return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: object %zu has size 0", name, i);
            if (!objects[i].data)
                return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: object %zu has NULL data", name, i);
        }
    }
    _dm_op_init(o, DM_OP_BROADCAST_OBJECTS, DM_UINT8);
    o->objects = objects; o->count = count; o->root = root; o->out_list = out;
    return DM_OK;
}
/* >>objects  Sizes first (uint64 per rank), then the bytes padded to the largest object. */
/* The most bytes one object collective takes from its peers' word: DISTMESH_MAX_OBJECT_BYTES,
   read when c was made (>>config registry). */
_DM_PRIVATE uint64_t _dm_object_limit(const dm_collective* c) { return c->core->max_object_bytes; }
_DM_COLD_BEGIN
_DM_PRIVATE dm_status _dm_run_gather_objects(dm_collective* c, const void* data, size_t size, dm_blob_list* out) {
    static const char* name = "all_gather_objects";
    uint64_t* sizes64 = NULL;
    size_t* sizes = NULL;
    unsigned char *mine = NULL, *all = NULL;
    size_t max = 0, n, i;
    dm_status st;
    n = (size_t)c->size;
    sizes64 = (uint64_t*)_dm_malloc(&c->allocator, n * sizeof(uint64_t));
    sizes = (size_t*)_dm_malloc(&c->allocator, n * sizeof(size_t));
    if (!sizes64 || !sizes) { st = _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "%s: no memory", name); goto done; }
    sizes64[c->rank] = (uint64_t)size;
    st = dm_all_gather(c, NULL, sizes64, 1, DM_UINT64);
    if (st != DM_OK) goto done;
    if (sizes64[c->rank] != (uint64_t)size) {
        st = _DM_FAIL(c, DM_ERR_PROTOCOL, "%s: the gathered sizes give this rank %llu bytes, not its %zu",
                      name, (unsigned long long)sizes64[c->rank], size);
        goto done;
    }
    for (i = 0; i < n; i++) {   /* checked before any allocation: the padded total is max * n */
        uint64_t limit = _dm_object_limit(c);
        if (sizes64[i] == 0 || sizes64[i] > limit / n || sizes64[i] > (uint64_t)(SIZE_MAX / 2 / n)) {
            st = _DM_FAIL(c, DM_ERR_PROTOCOL, "%s: rank %zu announced an object of %llu bytes (0, or %d "
                          "objects of that size exceed DISTMESH_MAX_OBJECT_BYTES = %llu)", name, i,
                          (unsigned long long)sizes64[i], c->size, (unsigned long long)limit);
            goto done;
        }
        sizes[i] = (size_t)sizes64[i];
        if (sizes[i] > max) max = sizes[i];
    }
    mine = (unsigned char*)_dm_calloc(&c->allocator, max);
    all = (unsigned char*)_dm_malloc(&c->allocator, max * n);
    if (!mine || !all) { st = _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "%s: no memory for %zu bytes", name, max * n); goto done; }
    memcpy(mine, data, size);
    st = dm_all_gather(c, mine, all, max, DM_UINT8);
    if (st != DM_OK) goto done;
    if (_dm_blob_list_alloc(&c->allocator, sizes, n, out) != DM_OK) {
        st = _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "%s: no memory for the result", name);
        goto done;
    }
    for (i = 0; i < n; i++) memcpy((void*)out->items[i].data, all + i * max, sizes[i]);
done:
    _dm_free(&c->allocator, sizes64);
    _dm_free(&c->allocator, sizes);
    _dm_free(&c->allocator, mine);
    _dm_free(&c->allocator, all);
    return st;
}

/* Root announces the count, then the sizes; every rank allocates the result and the bytes
   travel in one broadcast straight into it. */
_DM_PRIVATE dm_status _dm_run_broadcast_objects(dm_collective* c, const dm_blob* objects, size_t count, int root,
                                                dm_blob_list* out) {
    static const char* name = "broadcast_objects";
    uint64_t n64 = 0;
    uint64_t* sizes64 = NULL;
    size_t* sizes = NULL;
    size_t i, n, total = 0;
    dm_status st;
    if (c->rank == root) n64 = (uint64_t)count;
    _DM_TRY(dm_broadcast(c, &n64, 1, DM_UINT64, root));
    /* every object costs its bytes plus 16 + sizeof(dm_blob) of bookkeeping: bound the count
       by the limit before the size arrays are allocated */
    if (n64 > _dm_object_limit(c) / (16 + sizeof(dm_blob) + 1) || n64 > (uint64_t)(SIZE_MAX / 16) ||
        (c->rank == root && n64 != (uint64_t)count))
        return _DM_FAIL(c, DM_ERR_PROTOCOL, "%s: root announced %llu objects (above what "
                        "DISTMESH_MAX_OBJECT_BYTES = %llu allows)", name, (unsigned long long)n64,
                        (unsigned long long)_dm_object_limit(c));
    n = (size_t)n64;
    sizes64 = (uint64_t*)_dm_calloc(&c->allocator, (n ? n : 1) * sizeof(uint64_t));
    sizes = (size_t*)_dm_calloc(&c->allocator, (n ? n : 1) * sizeof(size_t));
    if (!sizes64 || !sizes) { st = _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "%s: no memory", name); goto done; }
    if (c->rank == root) for (i = 0; i < n; i++) sizes64[i] = (uint64_t)objects[i].size;
    st = dm_broadcast(c, sizes64, n, DM_UINT64, root);
    if (st != DM_OK) goto done;
    for (i = 0; i < n; i++) {
        uint64_t limit = _dm_object_limit(c);
        if (sizes64[i] == 0 || sizes64[i] > (uint64_t)(SIZE_MAX / 2) - total || sizes64[i] > limit - total ||
            (c->rank == root && sizes64[i] != (uint64_t)objects[i].size)) {
            st = _DM_FAIL(c, DM_ERR_PROTOCOL, "%s: root announced object %zu of %llu bytes (0, or "
                          "the objects exceed DISTMESH_MAX_OBJECT_BYTES = %llu)",
                          name, i, (unsigned long long)sizes64[i], (unsigned long long)limit);
            goto done;
        }
        sizes[i] = (size_t)sizes64[i];
        total += sizes[i];
    }
    if (_dm_blob_list_alloc(&c->allocator, sizes, n, out) != DM_OK) {
        st = _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "%s: no memory for %zu bytes", name, total);
        goto done;
    }
    if (c->rank == root)
        for (i = 0; i < n; i++) memcpy((void*)out->items[i].data, objects[i].data, sizes[i]);
    if (n > 0) st = dm_broadcast(c, (void*)out->items[0].data, total, DM_UINT8, root);
    if (st != DM_OK) dm_blob_list_free(c, out);
done:
    _dm_free(&c->allocator, sizes64);
    _dm_free(&c->allocator, sizes);
    return st;
}


_DM_COLD_END
/* >>run  One checked operation, on whichever thread runs it: the sequence number (collectives
   only: point-to-point calls do not count), then the backend's slot or the core's fallback. */

_DM_PRIVATE const char* _dm_op_name(dm_op_kind k) {
    static const char* names[] = { "barrier", "all_reduce", "all_gather", "all_gather_to_list", "reduce_scatter",
                                   "broadcast", "all_gather_objects", "broadcast_objects", "reduce", "gather",
                                   "scatter", "all_to_all", "all_to_all_v", "send", "recv", "split" };
    return (unsigned)k < sizeof(names) / sizeof(names[0]) ? names[k] : "operation";
}
/* As an operation starts: a collective counts in dm_sequence and clears the error buffer; a
   point-to-point call only clears it; an object collective counts through the collectives it
   makes. */
_DM_PRIVATE void _dm_op_begin(dm_collective* c, const dm_op* o) {
    if (o->kind == DM_OP_ALL_GATHER_OBJECTS || o->kind == DM_OP_BROADCAST_OBJECTS) return;
    if (o->kind == DM_OP_SEND || o->kind == DM_OP_RECV) _dm_errbuf(c)[0] = 0;
    else _dm_begin(c, _dm_op_name(o->kind));
}

_DM_PRIVATE dm_status _dm_run_barrier(dm_collective* c) {
    uint8_t token = 0;
    if (_DM_VT_HAS(c->vt, barrier)) return c->vt->barrier(c);
    /* a one-byte all-reduce cannot complete before every rank has entered it */
    return c->vt->all_reduce(c, &token, &token, 1, DM_UINT8, DM_MAX);
}

/* Fallbacks through the collectives every backend has, with temporaries where a rank's
   buffer is not significant (MPI's rule: recv at the root only). */
_DM_PRIVATE dm_status _dm_reduce_via_all_reduce(dm_collective* c, const dm_op* o) {
    size_t bytes = o->count * dm_dtype_size(o->dtype);
    void* out = o->recv ? o->recv : _dm_malloc(&c->allocator, bytes);
    dm_status st;
    if (!out) return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "reduce: no memory for %zu bytes", bytes);
    st = c->vt->all_reduce(c, o->send, out, o->count, o->dtype, o->op);
    if (out != o->recv) _dm_free(&c->allocator, out);
    return st;
}
_DM_PRIVATE dm_status _dm_gather_via_all_gather(dm_collective* c, const dm_op* o) {
    size_t bytes = o->count * dm_dtype_size(o->dtype), total = bytes * (size_t)c->size;
    unsigned char* out = o->recv ? (unsigned char*)o->recv : (unsigned char*)_dm_malloc(&c->allocator, total);
    dm_status st;
    if (!out) return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "gather: no memory for %zu bytes", total);
    st = _DM_VT_HAS(c->vt, all_gather) ? c->vt->all_gather(c, o->send, out, o->count, o->dtype)
                                        : _dm_all_gather_via_list(c, o->send, out, o->count, o->dtype);
    if (out != o->recv) _dm_free(&c->allocator, out);
    return st;
}
_DM_PRIVATE dm_status _dm_scatter_via_broadcast(dm_collective* c, const dm_op* o) {
    size_t bytes = o->count * dm_dtype_size(o->dtype), total = bytes * (size_t)c->size;
    unsigned char* all = o->send ? (unsigned char*)(uintptr_t)o->send : (unsigned char*)_dm_malloc(&c->allocator, total);
    dm_status st;
    if (!all) return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "scatter: no memory for %zu bytes", total);
    st = c->vt->broadcast(c, all, o->count * (size_t)c->size, o->dtype, o->root);  /* the root's bytes are only read */
    if (st == DM_OK && all + (size_t)c->rank * bytes != o->recv) memmove(o->recv, all + (size_t)c->rank * bytes, bytes);
    if (all != o->send) _dm_free(&c->allocator, all);
    return st;
}
/* all_to_all_v through send and recv: step k sends to rank + k and receives from rank - k
   (sends do not wait for their receiver, so no step can deadlock). Tag -1: never a user's. */
_DM_PRIVATE dm_status _dm_a2a_via_p2p(dm_collective* c, const unsigned char* send, const size_t* sc, const size_t* so,
                                      unsigned char* recv, const size_t* rc, const size_t* ro, dm_dtype dtype) {
    size_t esize = dm_dtype_size(dtype);
    int k, W = c->size, r = c->rank;
    for (k = 1; k < W; k++) {
        int to = (r + k) % W, from = (r - k + W) % W;
        _DM_TRY(c->vt->send(c, send + so[to] * esize, sc[to], dtype, to, -1));
        _DM_TRY(c->vt->recv(c, recv + ro[from] * esize, rc[from], dtype, from, -1));
    }
    return DM_OK;
}
/* In place: the outgoing blocks (the span of sc/so in recv) copied out before recv is
   written. *copy is the caller's to free. */
_DM_PRIVATE dm_status _dm_a2a_copy_out(dm_collective* c, const void* recv, const size_t* sc, const size_t* so,
                                       size_t esize, unsigned char** copy) {
    size_t span = 0;
    int j;
    for (j = 0; j < c->size; j++)
        if ((so[j] + sc[j]) * esize > span) span = (so[j] + sc[j]) * esize;
    *copy = (unsigned char*)_dm_malloc(&c->allocator, span);
    if (!*copy) return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "all_to_all: no memory for %zu bytes", span);
    if (span) memcpy(*copy, recv, span);
    return DM_OK;
}
/* A backend's slot gets send NULL for in place and copies this rank's own block itself (it
   may be device memory); the fallback through send and recv copies the outgoing blocks out of
   recv first. */
_DM_PRIVATE dm_status _dm_run_all_to_all_v(dm_collective* c, const void* send, const size_t* sc, const size_t* so,
                                           void* recv, const size_t* rc, const size_t* ro, dm_dtype dtype) {
    size_t esize = dm_dtype_size(dtype);
    unsigned char* copy = NULL;
    dm_status st;
    if (sc[c->rank] != rc[c->rank])
        return _DM_FAIL(c, DM_ERR_MISMATCH, "all_to_all_v: rank %d sends itself %zu elements but expects %zu",
                        c->rank, sc[c->rank], rc[c->rank]);
    if (_DM_VT_HAS(c->vt, all_to_all_v)) return c->vt->all_to_all_v(c, send, sc, so, recv, rc, ro, dtype);
    if (!send) {
        _DM_TRY(_dm_a2a_copy_out(c, recv, sc, so, esize, &copy));
        send = copy;
    }
    st = _dm_a2a_via_p2p(c, (const unsigned char*)send, sc, so, (unsigned char*)recv, rc, ro, dtype);
    if (st == DM_OK && sc[c->rank])
        memcpy((unsigned char*)recv + ro[c->rank] * esize, (const unsigned char*)send + so[c->rank] * esize,
               sc[c->rank] * esize);
    _dm_free(&c->allocator, copy);
    return st;
}
_DM_PRIVATE dm_status _dm_run_all_to_all(dm_collective* c, const dm_op* o) {
    size_t W = (size_t)c->size, j;
    size_t* a = (size_t*)_dm_malloc(&c->allocator, 2 * W * sizeof(size_t));
    dm_status st;
    if (!a) return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "all_to_all: out of memory");
    for (j = 0; j < W; j++) { a[j] = o->count; a[W + j] = j * o->count; }
    st = _dm_run_all_to_all_v(c, o->send, a, a + W, o->recv, a, a + W, o->dtype);
    _dm_free(&c->allocator, a);
    return st;
}

/* A compressed all_reduce (or one with a state): the mode and state ride in the core for the
   slot (>>core state). Backends without the engine (Fake) run it exact, the state's residual
   added first; NCCL takes none. */
_DM_PRIVATE dm_status _dm_run_all_reduce_compressed(dm_collective* c, const dm_op* o) {
    dm_status st;
    if (strcmp(c->vt->name, "nccl") == 0)
        return _DM_FAIL(c, DM_ERR_UNSUPPORTED, "all_reduce: the nccl backend has no compression (mode %s)",
                        dm_compress_name(o->compress));
    if (!c->core->eng) {
        if (o->send != o->recv) memcpy(o->recv, o->send, o->count * dm_dtype_size(o->dtype));
        if (o->compress_state) _dm_cmp_flush(o->compress_state, o->recv, o->dtype, 0, o->count);
        return c->vt->all_reduce(c, o->recv, o->recv, o->count, o->dtype, o->op);
    }
    c->core->compress = o->compress;
    c->core->cstate = o->compress_state;
    st = c->vt->all_reduce(c, o->send, o->recv, o->count, o->dtype, o->op);
    c->core->compress = DM_COMPRESS_DEFAULT;
    c->core->cstate = NULL;
    return st;
}

/* The operation itself; _dm_op_run below adds the flight recorder and timeline when on. */
_DM_PRIVATE dm_status _dm_op_dispatch(dm_collective* c, const dm_op* o) {
    const dm_collective_vtable* vt = c->vt;
    _dm_op_begin(c, o);
    switch (o->kind) {
        case DM_OP_BARRIER: return _dm_run_barrier(c);
        case DM_OP_ALL_REDUCE:
            if (o->compress || o->compress_state) return _dm_run_all_reduce_compressed(c, o);
            return vt->all_reduce(c, o->send, o->recv, o->count, o->dtype, o->op);
        case DM_OP_ALL_GATHER:
            if (_DM_VT_HAS(vt, all_gather)) return vt->all_gather(c, o->send, o->recv, o->count, o->dtype);
            return _dm_all_gather_via_list(c, o->send, o->recv, o->count, o->dtype);
        case DM_OP_ALL_GATHER_TO_LIST:
            if (_DM_VT_HAS(vt, all_gather_to_list)) return vt->all_gather_to_list(c, o->send, o->recvs, o->count, o->dtype);
            return _dm_all_gather_list_via_block(c, o->send, o->recvs, o->count, o->dtype);
        case DM_OP_REDUCE_SCATTER: return vt->reduce_scatter(c, o->send, o->recv, o->count, o->dtype, o->op);
        case DM_OP_BROADCAST: return vt->broadcast(c, o->recv, o->count, o->dtype, o->root);
        case DM_OP_ALL_GATHER_OBJECTS: return _dm_run_gather_objects(c, o->send, o->count, o->out_list);
        case DM_OP_BROADCAST_OBJECTS: return _dm_run_broadcast_objects(c, o->objects, o->count, o->root, o->out_list);
        case DM_OP_REDUCE:
            if (_DM_VT_HAS(vt, reduce)) return vt->reduce(c, o->send, o->recv, o->count, o->dtype, o->op, o->root);
            return _dm_reduce_via_all_reduce(c, o);
        case DM_OP_GATHER:
            if (_DM_VT_HAS(vt, gather)) return vt->gather(c, o->send, o->recv, o->count, o->dtype, o->root);
            return _dm_gather_via_all_gather(c, o);
        case DM_OP_SCATTER:
            if (_DM_VT_HAS(vt, scatter)) return vt->scatter(c, o->send, o->recv, o->count, o->dtype, o->root);
            return _dm_scatter_via_broadcast(c, o);
        case DM_OP_ALL_TO_ALL: return _dm_run_all_to_all(c, o);
        case DM_OP_ALL_TO_ALL_V:
            return _dm_run_all_to_all_v(c, o->send, o->send_counts, o->send_offsets, o->recv, o->recv_counts,
                                        o->recv_offsets, o->dtype);
        case DM_OP_SEND: return vt->send(c, o->send, o->count, o->dtype, o->root, o->tag);
        case DM_OP_RECV:
            if (o->root == DM_ANY_SOURCE) return vt->recv_any(c, o->recv, o->count, o->dtype, o->tag, o->source);
            return vt->recv(c, o->recv, o->count, o->dtype, o->root, o->tag);
        case DM_OP_SPLIT: return vt->split(c, o->color, o->key, o->split_out);
    }
    return _DM_FAIL(c, DM_ERR_INTERNAL, "unknown operation kind %d", (int)o->kind);
}
/* Inlined into its two callers (a blocking call, the progress thread): one frame less on every
   operation's way down. */
_DM_PRIVATE _DM_ALWAYS_INLINE dm_status _dm_op_run(dm_collective* c, const dm_op* o) {
    if (__builtin_expect(_DM_TRACED(c) != NULL, 0)) {
        if (!_dm_trace_op_begin(c, o)) return _dm_trace_op_run_full(c, o);
        return _dm_trace_op_end(c, o, _dm_op_dispatch(c, o));
    }
    return _dm_op_dispatch(c, o);
}

/* >>requests  Non-blocking calls. A request is one queued dm_op. The collective's progress
   thread (started by the first _async call) runs queued requests one at a time and marks them
   done in issue order; backends with a device stream (start and finish slots) queue them there
   instead. The queue (head .. tail) holds every request not yet done, in issue order, each
   queued, running or ran (ran: its result is in, an earlier one is not done yet); done ones
   leave it from the head (_dm_async_settle). The next to run (_dm_async_pick) is the head,
   except in a run of point-to-point requests (send and recv) at the head: there sends go
   first, then receives in issue order. A send is eager (it returns once its bytes are handed
   to the link, and reads what peers send meanwhile), so a rank that posted a recv before its
   send still sends, and two ranks that both did so do not wait on each other. A run of
   receives only that reaches the tail is held back (the send it waits on may not be queued
   yet) until something more is queued, someone waits for or tests one of them (release), or
   dm_destroy. Ownership: the queue, `inflight`, `owner` and each request's state, done and
   status are guarded by mu; a running request's message is written by the progress thread
   into the request (_dm_errbuf), never into c->last_error, which only the owning thread
   writes. */
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

/* Failures after which the collective cannot go on: the requests queued behind get them too. */
_DM_PRIVATE bool _dm_status_breaks(dm_status st) {
    return st == DM_ERR_TIMEOUT || st == DM_ERR_PEER_LOST || st == DM_ERR_MISMATCH || st == DM_ERR_NETWORK ||
           st == DM_ERR_PROTOCOL || st == DM_ERR_ABORTED || st == DM_ERR_NCCL || st == DM_ERR_CUDA ||
           st == DM_ERR_INTERNAL;
}
_DM_PRIVATE bool _dm_op_is_p2p(const dm_op* o) { return o->kind == DM_OP_SEND || o->kind == DM_OP_RECV; }

/* Requests at the head whose result is in are done, in issue order, and leave the queue.
   Caller holds mu. */
_DM_PRIVATE void _dm_async_settle(_dm_async* a) {
    while (a->head && a->head->state == _DM_RQ_RAN) {
        dm_request* r = a->head;
        a->head = r->next;
        r->next = NULL;
        r->done = true;
        a->inflight--;
    }
    if (!a->head) a->tail = NULL;
}

/* A request failed with a status that breaks the collective: every request not started yet
   ends with the same status, unrun, and the queue settles. Caller holds mu. */
_DM_PRIVATE void _dm_async_fail_queue(_dm_async* a, const dm_request* failed) {
    dm_request* r;
    for (r = a->head; r; r = r->next) {
        if (r->state != _DM_RQ_QUEUED) continue;
        r->status = failed->status;
        snprintf(r->msg, sizeof(r->msg), "%s was not run: the %s queued before it failed: %.400s",
                 _dm_op_name(r->op.kind), _dm_op_name(failed->op.kind), failed->msg);
        r->state = _DM_RQ_RAN;
    }
    _dm_async_settle(a);
}

/* The request to run next, or NULL to wait (see >>requests): the head; in a run of
   point-to-point requests at the head, its first send not started, else its first receive
   not started, unless the run holds receives only and reaches the tail and nobody released
   it (then NULL). Caller holds mu. */
_DM_PRIVATE dm_request* _dm_async_pick(_dm_async* a) {
    dm_request *r, *recv = NULL;
    if (!a->head || !_dm_op_is_p2p(&a->head->op)) return a->head;
    for (r = a->head; r && _dm_op_is_p2p(&r->op); r = r->next) {
        if (r->state != _DM_RQ_QUEUED) continue;
        if (r->op.kind == DM_OP_SEND) return r;
        if (!recv) recv = r;
    }
    if (!recv || r || a->stop || recv->qnum <= a->release) return recv;
    return NULL;
}

_DM_PRIVATE dm_status _dm_check_aborted(dm_collective* c, const dm_op* o);
static void* _dm_async_main(void* arg) {
    dm_collective* c = (dm_collective*)arg;
    _dm_async* a = c->core->async;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        dm_request* r;
        _dm_running saved;
        dm_status st;
        while ((r = _dm_async_pick(a)) == NULL && !a->stop) pthread_cond_wait(&a->work, &a->mu);
        if (!r) break;
        r->state = _DM_RQ_RUNNING;
        pthread_mutex_unlock(&a->mu);
        saved = _dm_tls_running;
        _dm_tls_running.c = c;
        _dm_tls_running.err = r->msg;
        _dm_trace_queued(r->tr_queued);
        st = _dm_check_aborted(c, &r->op);     /* held back past a dm_abort: not run */
        if (st == DM_OK) st = _dm_op_run(c, &r->op);
        _dm_tls_running = saved;
        pthread_mutex_lock(&a->mu);
        r->status = st;
        r->state = _DM_RQ_RAN;
        if (_dm_status_breaks(st)) _dm_async_fail_queue(a, r);
        else _dm_async_settle(a);
        pthread_cond_broadcast(&a->done);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

/* The collective's async state, made on first use (two threads racing: one wins). */
_DM_PRIVATE _dm_async* _dm_async_get(dm_collective* c) {
    _dm_async* a = __atomic_load_n(&c->core->async, __ATOMIC_ACQUIRE);
    _dm_async* none = NULL;
    pthread_condattr_t attr;
    if (a) return a;
    a = (_dm_async*)_dm_calloc(&c->allocator, sizeof(_dm_async));
    if (!a) return NULL;
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->work, NULL);
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&a->done, &attr);
    pthread_condattr_destroy(&attr);
    if (__atomic_compare_exchange_n(&c->core->async, &none, a, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) return a;
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->work);
    pthread_cond_destroy(&a->done);
    _dm_free(&c->allocator, a);
    return none;
}

/* Another thread owns this collective right now: say so without touching last_error (the
   owner's), through the logger. */
_DM_PRIVATE dm_status _dm_busy_named(dm_collective* c, const char* what) {
    _DM_LOG(&c->logger, DM_LOG_ERROR, "%s on rank %d: the collective is in use by another thread (%s); "
            "a collective belongs to one thread at a time", what, c->rank,
            __atomic_load_n(&c->core->async, __ATOMIC_ACQUIRE) ? "it has requests in flight" : "a call is running");
    return DM_ERR_BUSY;
}
_DM_PRIVATE dm_status _dm_busy(dm_collective* c, const dm_op* o) { return _dm_busy_named(c, _dm_op_name(o->kind)); }
/* Requests in flight that another thread issued (progress-thread or stream ones). Caller holds mu. */
_DM_PRIVATE bool _dm_async_foreign(const _dm_async* a) {
    return (a->inflight > 0 || a->streams > 0) && !pthread_equal(a->owner, pthread_self());
}

/* A request holding a copy of o; all_to_all_v's arrays are copied too (the caller may reuse
   them at once). */
_DM_PRIVATE dm_request* _dm_request_new(dm_collective* c, const dm_op* o) {
    dm_request* r = (dm_request*)_dm_calloc(&c->allocator, sizeof(dm_request));
    size_t W = (size_t)c->size;
    if (!r) return NULL;
    r->c = c;
    r->op = *o;
    if (o->kind == DM_OP_ALL_TO_ALL_V) {
        r->arrays = (size_t*)_dm_malloc(&c->allocator, 4 * W * sizeof(size_t));
        if (!r->arrays) { _dm_free(&c->allocator, r); return NULL; }
        memcpy(r->arrays, o->send_counts, W * sizeof(size_t));
        memcpy(r->arrays + W, o->send_offsets, W * sizeof(size_t));
        memcpy(r->arrays + 2 * W, o->recv_counts, W * sizeof(size_t));
        memcpy(r->arrays + 3 * W, o->recv_offsets, W * sizeof(size_t));
        r->op.send_counts = r->arrays; r->op.send_offsets = r->arrays + W;
        r->op.recv_counts = r->arrays + 2 * W; r->op.recv_offsets = r->arrays + 3 * W;
    }
    return r;
}
_DM_PRIVATE void _dm_request_free(dm_request* r) {
    dm_collective* c = r->c;
    _dm_free(&c->allocator, r->arrays);
    _dm_free(&c->allocator, r);
}
/* Unlinks r from the live list. Caller holds mu. */
_DM_PRIVATE void _dm_async_unlink(_dm_async* a, dm_request* r) {
    dm_request** p = &a->live;
    while (*p && *p != r) p = &(*p)->live;
    if (*p) *p = r->live;
}

/* r joins the requests dm_destroy frees if nobody waits for them. Caller holds mu. */
_DM_PRIVATE void _dm_async_track(_dm_async* a, dm_request* r) {
    r->live = a->live;
    a->live = r;
}
/* Queues r for the progress thread (started here the first time). Caller holds mu. */
_DM_PRIVATE dm_status _dm_async_enqueue(dm_collective* c, _dm_async* a, dm_request* r) {
    if (!a->started) {
        if (pthread_create(&a->thread, NULL, _dm_async_main, c) != 0)
            return _DM_FAIL(c, DM_ERR_INTERNAL, "%s: could not start the progress thread (%s)",
                            _dm_op_name(r->op.kind), strerror(errno));
        a->started = true;
    }
    _dm_async_track(a, r);
    if (_DM_TRACED(c)) r->tr_queued = _dm_trace_now();
    r->state = _DM_RQ_QUEUED;
    r->qnum = ++a->queued;
    if (a->tail) a->tail->next = r; else a->head = r;
    a->tail = r;
    a->inflight++;
    a->owner = pthread_self();
    pthread_cond_signal(&a->work);
    return DM_OK;
}

_DM_PRIVATE bool _dm_take_now(dm_collective* c) {
    int idle = 0;
    return __atomic_compare_exchange_n(&c->core->busy, &idle, 1, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}
/* Takes c for this thread (c->core->busy) by the deadline, or DM_ERR_BUSY naming the call. interrupt
   (dm_shrink with DM_SHRINK_ABORT): while another thread holds c, its operation is interrupted
   again at every try, so one that began after _dm_abort_in_flight looked ends too. */
_DM_PRIVATE dm_status _dm_take(dm_collective* c, const char* name, int64_t deadline, bool interrupt) {
    while (!_dm_take_now(c)) {
        if (_dm_now_ms() >= deadline)
            return _DM_FAIL(c, DM_ERR_BUSY, "%s: the collective is in use by another thread", name);
        if (interrupt && _DM_VT_HAS(c->vt, interrupt)) c->vt->interrupt(c);
        usleep(1000);
    }
    return DM_OK;
}

/* Waits for r (block) or looks (done), then frees it and hands its message to the issuing
   thread's last_error. A stream request's finish runs with c taken (c->core->busy), like a blocking
   call: it polls the backend's communicator, which nothing else may use meanwhile, and a
   dm_shrink(DM_SHRINK_ABORT) on another thread interrupts it (>>public calls). dm_wait waits
   for c (a shrink holding it) by the deadline; dm_test looks again later. */
_DM_PRIVATE dm_status _dm_request_finish(dm_request* r, bool block, bool* done) {
    dm_collective* c = r->c;
    _dm_async* a = c->core->async;
    bool mine;
    dm_status st;
    if (r->token) {             /* a backend stream request: finish writes last_error on failure */
        if (!block && !_dm_take_now(c)) { *done = false; return DM_OK; }
        if (block) _DM_TRY(_dm_take(c, "wait", _dm_deadline(c->timeout_ms), false));
        st = c->vt->finish(c, r->token, block, done);
        if (!*done) { __atomic_store_n(&c->core->busy, 0, __ATOMIC_RELEASE); return DM_OK; }
        if (r->tr_queued) _dm_trace_stream_end(c, &r->op, r->tr_index, r->tr_queued, st);
        if (st == DM_OK) c->last_error[0] = 0;
        pthread_mutex_lock(&a->mu);
        _dm_async_unlink(a, r);
        a->streams--;
        pthread_mutex_unlock(&a->mu);
        __atomic_store_n(&c->core->busy, 0, __ATOMIC_RELEASE);
        _dm_request_free(r);
        return st;
    }
    pthread_mutex_lock(&a->mu);
    if (!r->done && r->qnum > a->release) {   /* receives held back up to r may start now */
        a->release = r->qnum;
        pthread_cond_signal(&a->work);
    }
    while (block && !r->done) pthread_cond_wait(&a->done, &a->mu);
    *done = r->done;
    if (!r->done) { pthread_mutex_unlock(&a->mu); return DM_OK; }
    st = r->status;
    mine = a->inflight == 0 || pthread_equal(a->owner, pthread_self());
    _dm_async_unlink(a, r);
    pthread_mutex_unlock(&a->mu);
    if (mine && st != DM_OK) _dm_copy_name(c->last_error, sizeof(c->last_error), r->msg);
    else if (mine) c->last_error[0] = 0;
    _dm_request_free(r);
    return st;
}

_DM_PRIVATE dm_status _dm_submit(dm_collective* c, const dm_op* o);
/* After dm_abort every call fails at once with its message (a call already running is stopped
   by the backend, see _dm_eng_adopt_abort). */
_DM_PRIVATE dm_status _dm_check_aborted(dm_collective* c, const dm_op* o) {
    if (__builtin_expect(__atomic_load_n(&c->core->aborted, __ATOMIC_ACQUIRE) != 2, 1)) return DM_OK;
    return _DM_FAIL(c, DM_ERR_ABORTED, "%s #%llu: %s", _dm_op_name(o->kind),
                    (unsigned long long)__atomic_load_n(&c->seq, __ATOMIC_RELAXED), c->core->abort_msg);
}
/* An _async call: a backend stream request where the backend has one for this kind, else a
   request for the progress thread. A stream backend never shares its communicator with the
   progress thread: the kinds it cannot start (object collectives) run here, and the request
   is done when the call returns. */
_DM_PRIVATE dm_status _dm_submit_async(dm_collective* c, const dm_op* o, dm_request** out) {
    _dm_async* a = _dm_async_get(c);
    dm_request* r;
    dm_status st;
    if (!a) return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "%s: out of memory", _dm_op_name(o->kind));
    _DM_TRY(_dm_check_aborted(c, o));
    pthread_mutex_lock(&a->mu);
    if (__atomic_load_n(&c->core->busy, __ATOMIC_ACQUIRE) || _dm_async_foreign(a)) {
        pthread_mutex_unlock(&a->mu);
        return _dm_busy(c, o);
    }
    r = _dm_request_new(c, o);
    if (!r) { pthread_mutex_unlock(&a->mu); return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "%s: out of memory", _dm_op_name(o->kind)); }
    if (_DM_VT_HAS(c->vt, start) && _DM_VT_HAS(c->vt, finish) && a->inflight == 0) {
        uint64_t seq = __atomic_load_n(&c->seq, __ATOMIC_RELAXED);
        /* start runs with c taken, not under mu: it may wait (host staging, under the deadline),
           and a dm_shrink(DM_SHRINK_ABORT) on another thread must be able to interrupt it */
        if (!_dm_take_now(c)) { pthread_mutex_unlock(&a->mu); _dm_request_free(r); return _dm_busy(c, o); }
        pthread_mutex_unlock(&a->mu);
        _dm_op_begin(c, o);
        st = c->vt->start(c, &r->op, &r->token);
        pthread_mutex_lock(&a->mu);
        if (st == DM_OK) {
            _dm_async_track(a, r);
            a->streams++;
            a->owner = pthread_self();
            pthread_mutex_unlock(&a->mu);
            __atomic_store_n(&c->core->busy, 0, __ATOMIC_RELEASE);
            if (_DM_TRACED(c))
                r->tr_index = _dm_trace_stream_start(c, &r->op, r->tr_queued = _dm_trace_now());
            *out = r;
            return DM_OK;
        }
        r->token = NULL;
        __atomic_store_n(&c->seq, seq, __ATOMIC_RELAXED);   /* not started: the run below counts it */
        pthread_mutex_unlock(&a->mu);
        __atomic_store_n(&c->core->busy, 0, __ATOMIC_RELEASE);
        if (st != DM_ERR_UNSUPPORTED) { _dm_request_free(r); return st; }
        st = _dm_submit(c, o);  /* counts the sequence number itself */
        pthread_mutex_lock(&a->mu);
        r->status = st;
        r->done = true;
        _dm_copy_name(r->msg, sizeof(r->msg), c->last_error);
        _dm_async_track(a, r);
        pthread_mutex_unlock(&a->mu);
        *out = r;
        return DM_OK;
    }
    st = _dm_async_enqueue(c, a, r);
    pthread_mutex_unlock(&a->mu);
    if (st != DM_OK) { _dm_request_free(r); return st; }
    *out = r;
    return DM_OK;
}

/* A blocking call: on this thread, unless requests are in flight (then queued behind them and
   waited for), or another thread is using the collective (DM_ERR_BUSY). Calls made by an
   operation that is running (object collectives, fallbacks) run at once. */
_DM_PRIVATE dm_status _dm_submit(dm_collective* c, const dm_op* o) {
    _dm_async* a = __atomic_load_n(&c->core->async, __ATOMIC_ACQUIRE);
    _dm_running saved;
    int idle = 0;
    dm_status st;
    if (_dm_tls_running.c == c) return _dm_op_run(c, o);
    _DM_TRY(_dm_check_aborted(c, o));
    if (!__atomic_compare_exchange_n(&c->core->busy, &idle, 1, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return _dm_busy(c, o);
    if (a) {
        pthread_mutex_lock(&a->mu);
        if (a->streams > 0 && !pthread_equal(a->owner, pthread_self())) {
            pthread_mutex_unlock(&a->mu);
            __atomic_store_n(&c->core->busy, 0, __ATOMIC_RELEASE);
            return _dm_busy(c, o);
        }
        if (a->inflight > 0) {
            dm_request* r = NULL;
            bool done = false;
            if (pthread_equal(a->owner, pthread_self()) && (r = _dm_request_new(c, o)) != NULL &&
                _dm_async_enqueue(c, a, r) != DM_OK) { _dm_request_free(r); r = NULL; }
            pthread_mutex_unlock(&a->mu);
            __atomic_store_n(&c->core->busy, 0, __ATOMIC_RELEASE);
            if (!r) return _dm_busy(c, o);
            return _dm_request_finish(r, true, &done);
        }
        pthread_mutex_unlock(&a->mu);
    }
    saved = _dm_tls_running;
    _dm_tls_running.c = c;
    _dm_tls_running.err = NULL;
    st = _dm_op_run(c, o);
    _dm_tls_running = saved;
    __atomic_store_n(&c->core->busy, 0, __ATOMIC_RELEASE);
    return st;
}

/* dm_destroy's part: the queued requests run to the end (each under its deadline), the
   progress thread stops, and requests never waited for are freed. */
_DM_PRIVATE void _dm_async_destroy(dm_collective* c) {
    _dm_async* a = c->core->async;
    if (!a) return;
    pthread_mutex_lock(&a->mu);
    a->stop = true;
    pthread_cond_signal(&a->work);
    pthread_mutex_unlock(&a->mu);
    if (a->started) pthread_join(a->thread, NULL);
    while (a->live) {
        dm_request* r = a->live;
        bool done = true;
        a->live = r->live;
        if (r->token) c->vt->finish(c, r->token, true, &done);
        _dm_request_free(r);
    }
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->work);
    pthread_cond_destroy(&a->done);
    _dm_free(&c->allocator, a);
    c->core->async = NULL;
}

DM_API_IMPL dm_status dm_wait(dm_request* req) {
    bool done = false;
    if (!req) return DM_ERR_INVALID_ARG;
    return _dm_request_finish(req, true, &done);
}
DM_API_IMPL dm_status dm_test(dm_request* req, bool* done) {
    bool d = false;
    dm_status st;
    if (!req || !done) return DM_ERR_INVALID_ARG;
    st = _dm_request_finish(req, false, &d);
    *done = d;
    return st;
}
DM_API_IMPL dm_status dm_wait_all(dm_request** reqs, size_t n) {
    dm_status first = DM_OK;
    size_t i;
    if (!reqs && n) return DM_ERR_INVALID_ARG;
    for (i = 0; i < n; i++) {
        dm_status st;
        if (!reqs[i]) continue;
        st = dm_wait(reqs[i]);
        reqs[i] = NULL;
        if (first == DM_OK) first = st;
    }
    return first;
}

/* >>trace include  The flight recorder and the timeline (distmesh_trace.h: >>trace, >>trace
   dump), here because its dumps list the requests still queued (>>requests). */
#if !defined(DISTMESH_NO_TRACE)
#include "distmesh_trace.h"
#else
_DM_COLD_BEGIN
DM_API_IMPL dm_status dm_flight_recorder_dump(dm_collective* c, const char* path) {
    (void)path;
    if (!c) return DM_ERR_INVALID_ARG;
    return _DM_FAIL(c, DM_ERR_UNSUPPORTED, "flight_recorder_dump: this build has no flight recorder "
                    "(DISTMESH_NO_TRACE)");
}
_DM_COLD_END
#endif
/* >>public calls  Blocking: check, then run (or queue behind requests in flight). _async:
   check, then queue. dm_submit: the check its op's kind asks for (_dm_prep_op), then the same. */
#define _DM_BLOCKING(c, prep)                                                                 \
    do {                                                                                      \
        dm_op o_;                                                                             \
        if (!(c)) return DM_ERR_INVALID_ARG;                                                  \
        _DM_TRY(prep);                                                                        \
        return _dm_submit((c), &o_);                                                          \
    } while (0)
#define _DM_ASYNC(c, out, prep)                                                               \
    do {                                                                                      \
        dm_op o_;                                                                             \
        if (out) *(out) = NULL;                                                               \
        if (!(c)) return DM_ERR_INVALID_ARG;                                                  \
        if (!(out)) return _DM_FAIL((c), DM_ERR_INVALID_ARG, "request out is NULL");          \
        _DM_TRY(prep);                                                                        \
        return _dm_submit_async((c), &o_, (out));                                             \
    } while (0)
_DM_PRIVATE dm_status _dm_prep_barrier(dm_collective* c, dm_op* o) {
    _DM_TRY(_dm_check_slot(c, "barrier", _DM_VT_HAS(c->vt, barrier) || _DM_VT_HAS(c->vt, all_reduce)));
    _dm_op_init(o, DM_OP_BARRIER, DM_UINT8);
    return DM_OK;
}

DM_API_IMPL dm_status dm_barrier(dm_collective* c) { _DM_BLOCKING(c, _dm_prep_barrier(c, &o_)); }
DM_API_IMPL dm_status dm_barrier_async(dm_collective* c, dm_request** out) {
    _DM_ASYNC(c, out, _dm_prep_barrier(c, &o_));
}
DM_API_IMPL dm_status dm_all_reduce(dm_collective* c, const void* send, void* recv, size_t count,
                                    dm_dtype dtype, dm_reduce_op op) {
    _DM_BLOCKING(c, _dm_prep_all_reduce(c, send, recv, count, dtype, op, &o_));
}
DM_API_IMPL dm_status dm_all_reduce_async(dm_collective* c, const void* send, void* recv, size_t count,
                                          dm_dtype dtype, dm_reduce_op op, dm_request** out) {
    _DM_ASYNC(c, out, _dm_prep_all_reduce(c, send, recv, count, dtype, op, &o_));
}
DM_API_IMPL dm_status dm_all_reduce_compressed(dm_collective* c, const void* send, void* recv, size_t count,
                                               dm_dtype dtype, dm_reduce_op op, dm_compress mode,
                                               dm_compress_state* state) {
    _DM_BLOCKING(c, _dm_prep_all_reduce_compressed(c, send, recv, count, dtype, op, mode, state, &o_));
}
DM_API_IMPL dm_status dm_all_reduce_compressed_async(dm_collective* c, const void* send, void* recv, size_t count,
                                                     dm_dtype dtype, dm_reduce_op op, dm_compress mode,
                                                     dm_compress_state* state, dm_request** out) {
    _DM_ASYNC(c, out, _dm_prep_all_reduce_compressed(c, send, recv, count, dtype, op, mode, state, &o_));
}
DM_API_IMPL dm_status dm_all_gather(dm_collective* c, const void* send, void* recv, size_t count,
                                    dm_dtype dtype) {
    _DM_BLOCKING(c, _dm_prep_all_gather(c, send, recv, count, dtype, &o_));
}
DM_API_IMPL dm_status dm_all_gather_async(dm_collective* c, const void* send, void* recv, size_t count,
                                          dm_dtype dtype, dm_request** out) {
    _DM_ASYNC(c, out, _dm_prep_all_gather(c, send, recv, count, dtype, &o_));
}
DM_API_IMPL dm_status dm_all_gather_to_list(dm_collective* c, const void* send, void* const* recvs,
                                            size_t count, dm_dtype dtype) {
    _DM_BLOCKING(c, _dm_prep_all_gather_to_list(c, send, recvs, count, dtype, &o_));
}
DM_API_IMPL dm_status dm_all_gather_to_list_async(dm_collective* c, const void* send, void* const* recvs,
                                                  size_t count, dm_dtype dtype, dm_request** out) {
    _DM_ASYNC(c, out, _dm_prep_all_gather_to_list(c, send, recvs, count, dtype, &o_));
}
DM_API_IMPL dm_status dm_reduce_scatter(dm_collective* c, const void* send, void* recv,
                                        size_t recv_count, dm_dtype dtype, dm_reduce_op op) {
    _DM_BLOCKING(c, _dm_prep_reduce_scatter(c, send, recv, recv_count, dtype, op, &o_));
}
DM_API_IMPL dm_status dm_reduce_scatter_async(dm_collective* c, const void* send, void* recv, size_t recv_count,
                                              dm_dtype dtype, dm_reduce_op op, dm_request** out) {
    _DM_ASYNC(c, out, _dm_prep_reduce_scatter(c, send, recv, recv_count, dtype, op, &o_));
}
DM_API_IMPL dm_status dm_broadcast(dm_collective* c, void* buf, size_t count, dm_dtype dtype, int root) {
    _DM_BLOCKING(c, _dm_prep_broadcast(c, buf, count, dtype, root, &o_));
}
DM_API_IMPL dm_status dm_broadcast_async(dm_collective* c, void* buf, size_t count, dm_dtype dtype, int root,
                                         dm_request** out) {
    _DM_ASYNC(c, out, _dm_prep_broadcast(c, buf, count, dtype, root, &o_));
}
DM_API_IMPL dm_status dm_all_gather_objects(dm_collective* c, const void* data, size_t size, dm_blob_list* out) {
    _DM_BLOCKING(c, _dm_prep_gather_objects(c, data, size, out, &o_));
}
DM_API_IMPL dm_status dm_all_gather_objects_async(dm_collective* c, const void* data, size_t size,
                                                  dm_blob_list* out_list, dm_request** out) {
    _DM_ASYNC(c, out, _dm_prep_gather_objects(c, data, size, out_list, &o_));
}
DM_API_IMPL dm_status dm_broadcast_objects(dm_collective* c, const dm_blob* objects, size_t count, int root,
                                           dm_blob_list* out) {
    _DM_BLOCKING(c, _dm_prep_broadcast_objects(c, objects, count, root, out, &o_));
}
DM_API_IMPL dm_status dm_broadcast_objects_async(dm_collective* c, const dm_blob* objects, size_t count, int root,
                                                 dm_blob_list* out_list, dm_request** out) {
    _DM_ASYNC(c, out, _dm_prep_broadcast_objects(c, objects, count, root, out_list, &o_));
}
DM_API_IMPL dm_status dm_reduce(dm_collective* c, const void* send, void* recv, size_t count, dm_dtype dtype,
                                dm_reduce_op op, int root) {
    _DM_BLOCKING(c, _dm_prep_reduce(c, send, recv, count, dtype, op, root, &o_));
}
DM_API_IMPL dm_status dm_reduce_async(dm_collective* c, const void* send, void* recv, size_t count, dm_dtype dtype,
                                      dm_reduce_op op, int root, dm_request** out) {
    _DM_ASYNC(c, out, _dm_prep_reduce(c, send, recv, count, dtype, op, root, &o_));
}
DM_API_IMPL dm_status dm_gather(dm_collective* c, const void* send, void* recv, size_t count, dm_dtype dtype,
                                int root) {
    _DM_BLOCKING(c, _dm_prep_rooted(c, true, send, recv, count, dtype, root, &o_));
}
DM_API_IMPL dm_status dm_gather_async(dm_collective* c, const void* send, void* recv, size_t count, dm_dtype dtype,
                                      int root, dm_request** out) {
    _DM_ASYNC(c, out, _dm_prep_rooted(c, true, send, recv, count, dtype, root, &o_));
}
DM_API_IMPL dm_status dm_scatter(dm_collective* c, const void* send, void* recv, size_t count, dm_dtype dtype,
                                 int root) {
    _DM_BLOCKING(c, _dm_prep_rooted(c, false, send, recv, count, dtype, root, &o_));
}
DM_API_IMPL dm_status dm_scatter_async(dm_collective* c, const void* send, void* recv, size_t count,
                                       dm_dtype dtype, int root, dm_request** out) {
    _DM_ASYNC(c, out, _dm_prep_rooted(c, false, send, recv, count, dtype, root, &o_));
}
DM_API_IMPL dm_status dm_all_to_all(dm_collective* c, const void* send, void* recv, size_t count, dm_dtype dtype) {
    _DM_BLOCKING(c, _dm_prep_all_to_all(c, send, recv, count, dtype, &o_));
}
DM_API_IMPL dm_status dm_all_to_all_async(dm_collective* c, const void* send, void* recv, size_t count,
                                          dm_dtype dtype, dm_request** out) {
    _DM_ASYNC(c, out, _dm_prep_all_to_all(c, send, recv, count, dtype, &o_));
}
DM_API_IMPL dm_status dm_all_to_all_v(dm_collective* c, const void* send, const size_t* send_counts,
                                      const size_t* send_offsets, void* recv, const size_t* recv_counts,
                                      const size_t* recv_offsets, dm_dtype dtype) {
    _DM_BLOCKING(c, _dm_prep_all_to_all_v(c, send, send_counts, send_offsets, recv, recv_counts, recv_offsets,
                                          dtype, &o_));
}
DM_API_IMPL dm_status dm_all_to_all_v_async(dm_collective* c, const void* send, const size_t* send_counts,
                                            const size_t* send_offsets, void* recv, const size_t* recv_counts,
                                            const size_t* recv_offsets, dm_dtype dtype, dm_request** out) {
    _DM_ASYNC(c, out, _dm_prep_all_to_all_v(c, send, send_counts, send_offsets, recv, recv_counts, recv_offsets,
                                            dtype, &o_));
}
DM_API_IMPL dm_status dm_send(dm_collective* c, const void* buf, size_t count, dm_dtype dtype, int peer, int tag) {
    _DM_BLOCKING(c, _dm_prep_p2p(c, true, buf, count, dtype, peer, tag, &o_));
}
DM_API_IMPL dm_status dm_send_async(dm_collective* c, const void* buf, size_t count, dm_dtype dtype, int peer,
                                    int tag, dm_request** out) {
    _DM_ASYNC(c, out, _dm_prep_p2p(c, true, buf, count, dtype, peer, tag, &o_));
}
DM_API_IMPL dm_status dm_recv(dm_collective* c, void* buf, size_t count, dm_dtype dtype, int peer, int tag) {
    _DM_BLOCKING(c, _dm_prep_p2p(c, false, buf, count, dtype, peer, tag, &o_));
}
DM_API_IMPL dm_status dm_recv_async(dm_collective* c, void* buf, size_t count, dm_dtype dtype, int peer, int tag,
                                    dm_request** out) {
    _DM_ASYNC(c, out, _dm_prep_p2p(c, false, buf, count, dtype, peer, tag, &o_));
}
/* dm_recv_any: a recv from DM_ANY_SOURCE with the sender's slot. */
_DM_PRIVATE dm_status _dm_prep_recv_any_out(dm_collective* c, void* buf, size_t count, dm_dtype dtype, int tag,
                                            int* source, dm_op* o) {
    if (source) *source = -1;
    _DM_TRY(_dm_prep_p2p(c, false, buf, count, dtype, DM_ANY_SOURCE, tag, o));
    o->source = source;
    return DM_OK;
}
DM_API_IMPL dm_status dm_recv_any(dm_collective* c, void* buf, size_t count, dm_dtype dtype, int tag, int* source) {
    _DM_BLOCKING(c, _dm_prep_recv_any_out(c, buf, count, dtype, tag, source, &o_));
}
DM_API_IMPL dm_status dm_recv_any_async(dm_collective* c, void* buf, size_t count, dm_dtype dtype, int tag,
                                        int* source, dm_request** out) {
    _DM_ASYNC(c, out, _dm_prep_recv_any_out(c, buf, count, dtype, tag, source, &o_));
}

_DM_PRIVATE dm_status _dm_prep_split(dm_collective* c, int color, int key, dm_collective** out, dm_op* o) {
    if (!out) return _DM_FAIL(c, DM_ERR_INVALID_ARG, "split: out is NULL");
    *out = NULL;
    if (color < DM_SPLIT_NONE)
        return _DM_FAIL(c, DM_ERR_INVALID_ARG, "split: color %d is negative (use DM_SPLIT_NONE to opt out)", color);
    _DM_TRY(_dm_check_slot(c, "split", _DM_VT_HAS(c->vt, split)));
    _dm_op_init(o, DM_OP_SPLIT, DM_UINT8);
    o->color = color; o->key = key; o->split_out = out;
    return DM_OK;
}
DM_API_IMPL dm_status dm_split(dm_collective* c, int color, int key, dm_collective** out) {
    _DM_BLOCKING(c, _dm_prep_split(c, color, key, out, &o_));
}

/* dm_submit's check: the prep of in's kind on in's fields, into o. */
_DM_PRIVATE dm_status _dm_prep_op(dm_collective* c, const dm_op* in, bool queued, dm_op* o) {
    switch (in->kind) {
        case DM_OP_BARRIER: return _dm_prep_barrier(c, o);
        case DM_OP_ALL_REDUCE:
            if (in->compress || in->compress_state)
                return _dm_prep_all_reduce_compressed(c, in->send, in->recv, in->count, in->dtype, in->op,
                                                      in->compress, in->compress_state, o);
            return _dm_prep_all_reduce(c, in->send, in->recv, in->count, in->dtype, in->op, o);
        case DM_OP_ALL_GATHER: return _dm_prep_all_gather(c, in->send, in->recv, in->count, in->dtype, o);
        case DM_OP_ALL_GATHER_TO_LIST:
            return _dm_prep_all_gather_to_list(c, in->send, in->recvs, in->count, in->dtype, o);
        case DM_OP_REDUCE_SCATTER:
            return _dm_prep_reduce_scatter(c, in->send, in->recv, in->count, in->dtype, in->op, o);
        case DM_OP_BROADCAST: return _dm_prep_broadcast(c, in->recv, in->count, in->dtype, in->root, o);
        case DM_OP_ALL_GATHER_OBJECTS: return _dm_prep_gather_objects(c, in->send, in->count, in->out_list, o);
        case DM_OP_BROADCAST_OBJECTS:
            return _dm_prep_broadcast_objects(c, in->objects, in->count, in->root, in->out_list, o);
        case DM_OP_REDUCE:
            return _dm_prep_reduce(c, in->send, in->recv, in->count, in->dtype, in->op, in->root, o);
        case DM_OP_GATHER: return _dm_prep_rooted(c, true, in->send, in->recv, in->count, in->dtype, in->root, o);
        case DM_OP_SCATTER: return _dm_prep_rooted(c, false, in->send, in->recv, in->count, in->dtype, in->root, o);
        case DM_OP_ALL_TO_ALL: return _dm_prep_all_to_all(c, in->send, in->recv, in->count, in->dtype, o);
        case DM_OP_ALL_TO_ALL_V:
            return _dm_prep_all_to_all_v(c, in->send, in->send_counts, in->send_offsets, in->recv, in->recv_counts,
                                         in->recv_offsets, in->dtype, o);
        case DM_OP_SEND: return _dm_prep_p2p(c, true, in->send, in->count, in->dtype, in->root, in->tag, o);
        case DM_OP_RECV:
            _DM_TRY(_dm_prep_p2p(c, false, in->recv, in->count, in->dtype, in->root, in->tag, o));
            if (o->root == DM_ANY_SOURCE) o->source = in->source;
            if (o->source) *o->source = -1;
            return DM_OK;
        case DM_OP_SPLIT:
            if (queued) return _DM_FAIL(c, DM_ERR_INVALID_ARG, "submit: split has no _async form");
            return _dm_prep_split(c, in->color, in->key, in->split_out, o);
    }
    return _DM_FAIL(c, DM_ERR_INVALID_ARG, "submit: op kind %d is not an operation", (int)in->kind);
}
DM_API_IMPL dm_status dm_submit(dm_collective* c, const dm_op* op, dm_request** out) {
    dm_op o;
    if (out) *out = NULL;
    if (!c) return DM_ERR_INVALID_ARG;
    if (!op) return _DM_FAIL(c, DM_ERR_INVALID_ARG, "submit: op is NULL");
    _DM_TRY(_dm_prep_op(c, op, out != NULL, &o));
    return out ? _dm_submit_async(c, &o, out) : _dm_submit(c, &o);
}

/* DM_SHRINK_ABORT's first step: requests not started yet complete with DM_ERR_ABORTED, the
   running one is interrupted (where the backend can) and finishes with its error. A call on
   another thread that holds c (a blocking call, dm_synchronize, dm_wait on a stream request)
   is interrupted too, and dm_shrink's _dm_take waits for it to let go. Returns once the queue
   is empty (each operation ends by its own deadline at the latest). Stream requests not being
   waited for stay: the backend's shrink settles them. */
_DM_PRIVATE void _dm_abort_in_flight(dm_collective* c) {
    _dm_async* a = __atomic_load_n(&c->core->async, __ATOMIC_ACQUIRE);
    bool can = _DM_VT_HAS(c->vt, interrupt);
    if (a) {
        dm_request* r;
        pthread_mutex_lock(&a->mu);
        for (r = a->head; r; r = r->next) {
            if (r->state != _DM_RQ_QUEUED) continue;
            r->status = DM_ERR_ABORTED;
            snprintf(r->msg, sizeof(r->msg), "%s was not run: aborted by dm_shrink(DM_SHRINK_ABORT)",
                     _dm_op_name(r->op.kind));
            r->state = _DM_RQ_RAN;
        }
        _dm_async_settle(a);    /* up to the running one, which settles the rest when it ends */
        if (a->inflight > 0 && can) c->vt->interrupt(c);
        while (a->inflight > 0) pthread_cond_wait(&a->done, &a->mu);
        pthread_cond_broadcast(&a->done);
        pthread_mutex_unlock(&a->mu);
    }
    if (__atomic_load_n(&c->core->busy, __ATOMIC_ACQUIRE) && can) c->vt->interrupt(c);
}
/* abort, shrink, grow: failures and step boundaries */
_DM_COLD_BEGIN
DM_API_IMPL dm_status dm_abort(dm_collective* c, const char* reason) {
    int none = 0;
    if (!c) return DM_ERR_INVALID_ARG;
    if (!__atomic_compare_exchange_n(&c->core->aborted, &none, 1, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return DM_OK;                           /* aborted already */
    snprintf(c->core->abort_msg, sizeof(c->core->abort_msg), "%s: rank %d aborted: %s", c->vt->name, c->rank,
             reason && reason[0] ? reason : "dm_abort");
    __atomic_store_n(&c->core->aborted, 2, __ATOMIC_RELEASE);
    _DM_LOG(&c->logger, DM_LOG_WARN, "%s", c->core->abort_msg);
    if (_DM_VT_HAS(c->vt, interrupt)) c->vt->interrupt(c);
    return DM_OK;
}

DM_API_IMPL dm_status dm_shrink(dm_collective* c, const int* exclude, int n_exclude, int flags, dm_collective** out) {
    _dm_async* a;
    bool* gone;
    int i;
    dm_status st;
    if (!c) return DM_ERR_INVALID_ARG;
    if (!out) return _DM_FAIL(c, DM_ERR_INVALID_ARG, "shrink: out is NULL");
    *out = NULL;
    if (flags != DM_SHRINK_DEFAULT && flags != DM_SHRINK_ABORT)
        return _DM_FAIL(c, DM_ERR_INVALID_ARG, "shrink: flags %d is neither DM_SHRINK_DEFAULT nor DM_SHRINK_ABORT", flags);
    if (n_exclude < 0 || (n_exclude > 0 && !exclude))
        return _DM_FAIL(c, DM_ERR_INVALID_ARG, "shrink: %d excluded ranks at %p", n_exclude, (const void*)exclude);
    if (n_exclude == 0 && c->shrink_needs_exclude)
        return _DM_FAIL(c, DM_ERR_INVALID_ARG, "shrink: the %s backend cannot find dead ranks itself: name the "
                        "excluded ranks (n_exclude is 0; the collective is untouched)", c->vt->name);
    for (i = 0; i < n_exclude; i++) {
        if (exclude[i] < 0 || exclude[i] >= c->size)
            return _DM_FAIL(c, DM_ERR_INVALID_ARG, "shrink: excluded rank %d is not a rank of this %d-rank collective",
                            exclude[i], c->size);
        if (exclude[i] == c->rank)
            return _DM_FAIL(c, DM_ERR_INVALID_ARG, "shrink: rank %d excludes itself (an excluded rank does not call "
                            "dm_shrink; it destroys the collective)", c->rank);
    }
    _DM_TRY(_dm_check_slot(c, "shrink", _DM_VT_HAS(c->vt, shrink)));
    a = __atomic_load_n(&c->core->async, __ATOMIC_ACQUIRE);
    if (flags == DM_SHRINK_ABORT) {
        _dm_abort_in_flight(c);
    } else if (a) {
        int inflight;
        pthread_mutex_lock(&a->mu);
        inflight = a->inflight + a->streams;
        pthread_mutex_unlock(&a->mu);
        if (inflight > 0)
            return _DM_FAIL(c, DM_ERR_BUSY, "shrink: %d requests in flight (wait for them, or use "
                            "DM_SHRINK_ABORT)", inflight);
    }
    _DM_TRY(_dm_take(c, "shrink", _dm_deadline(c->timeout_ms), flags == DM_SHRINK_ABORT));
    gone = (bool*)_dm_calloc(&c->allocator, sizeof(bool) * (size_t)c->size);
    if (!gone) {
        __atomic_store_n(&c->core->busy, 0, __ATOMIC_RELEASE);
        return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "shrink: out of memory");
    }
    for (i = 0; i < n_exclude; i++) gone[exclude[i]] = true;
    _dm_errbuf(c)[0] = 0;
    st = c->vt->shrink(c, gone, flags, out);
    if (st == DM_OK && *out && c->core->trace) _dm_trace_adopt(c, *out, "shrink", -1);
    _dm_free(&c->allocator, gone);
    __atomic_store_n(&c->core->busy, 0, __ATOMIC_RELEASE);
    if (st != DM_OK && *out) { dm_destroy(*out); *out = NULL; }
    return st;
}
DM_API_IMPL dm_status dm_grow(dm_collective* c, int n_new, dm_collective** out) {
    _dm_async* a;
    dm_status st;
    if (!c) return DM_ERR_INVALID_ARG;
    if (!out) return _DM_FAIL(c, DM_ERR_INVALID_ARG, "grow: out is NULL");
    *out = NULL;
    if (n_new < 1 || n_new > (1 << 20) - c->size)
        return _DM_FAIL(c, DM_ERR_INVALID_ARG, "grow: %d newcomers for a %d-rank collective (1 .. %d)", n_new,
                        c->size, (1 << 20) - c->size);
    _DM_TRY(_dm_check_slot(c, "grow", _DM_VT_HAS(c->vt, grow)));
    a = __atomic_load_n(&c->core->async, __ATOMIC_ACQUIRE);
    if (a) {
        int inflight;
        pthread_mutex_lock(&a->mu);
        inflight = a->inflight;
        pthread_mutex_unlock(&a->mu);
        if (inflight > 0) return _DM_FAIL(c, DM_ERR_BUSY, "grow: %d requests in flight (wait for them first)", inflight);
    }
    _DM_TRY(_dm_take(c, "grow", _dm_deadline(c->timeout_ms), false));
    _dm_begin(c, "grow");       /* a collective call: counts in dm_sequence, clears the error */
    st = c->vt->grow(c, n_new, out);
    if (st == DM_OK && *out && c->core->trace) _dm_trace_adopt(c, *out, "grow", -1);
    __atomic_store_n(&c->core->busy, 0, __ATOMIC_RELEASE);
    if (st != DM_OK && *out) { dm_destroy(*out); *out = NULL; }
    return st;
}
_DM_COLD_END

DM_API_IMPL void dm_blob_list_free(dm_collective* c, dm_blob_list* list) {
    if (!list) return;
    _dm_free(c ? &c->allocator : NULL, list->items);
    list->items = NULL;
    list->count = 0;
}

/* Like a blocking call, it takes c (the backend polls its communicator; a dm_shrink with
   DM_SHRINK_ABORT on another thread interrupts it): DM_ERR_BUSY while another thread uses c or
   has requests in flight on it. */
DM_API_IMPL dm_status dm_synchronize(dm_collective* c) {
    _dm_async* a;
    bool foreign = false;
    dm_status st;
    if (!c) return DM_ERR_INVALID_ARG;
    if (!_DM_VT_HAS(c->vt, synchronize)) return DM_OK;
    if (_dm_tls_running.c == c) return c->vt->synchronize(c);     /* inside a running operation */
    if (!_dm_take_now(c)) return _dm_busy_named(c, "synchronize");
    a = __atomic_load_n(&c->core->async, __ATOMIC_ACQUIRE);
    if (a) {
        pthread_mutex_lock(&a->mu);
        foreign = _dm_async_foreign(a);
        pthread_mutex_unlock(&a->mu);
    }
    st = foreign ? _dm_busy_named(c, "synchronize") : c->vt->synchronize(c);
    __atomic_store_n(&c->core->busy, 0, __ATOMIC_RELEASE);
    return st;
}

/* >>destroy and accessors */
DM_API_IMPL void dm_destroy(dm_collective* c) {
    if (!c) return;
    _dm_trace_closing(c);           /* both read c->core->trace atomically: the progress thread may be */
    _dm_async_destroy(c);           /* making it (the recorder starts with the first operation) */
    if (c->local) dm_destroy(c->local);
    c->local = NULL;
    _dm_trace_release(c);
    if (c->vt && c->vt->destroy) c->vt->destroy(c);
}
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
/* The deadline is read by queued requests as they run: it changes only with none in flight. */
DM_API_IMPL dm_status dm_set_timeout(dm_collective* c, int timeout_ms) {
    _dm_async* a;
    bool busy = false;
    if (!c) return DM_ERR_INVALID_ARG;
    a = __atomic_load_n(&c->core->async, __ATOMIC_ACQUIRE);
    if (a) {
        pthread_mutex_lock(&a->mu);
        busy = a->inflight > 0;
        pthread_mutex_unlock(&a->mu);
    }
    if (busy) return _DM_FAIL(c, DM_ERR_BUSY, "set_timeout: requests are in flight; wait for them first");
    {
        char err[DM_LAST_ERROR_SIZE];
        if (_dm_cfg_timeout(timeout_ms, &c->timeout_ms, err, sizeof(err)) != DM_OK)
            return _DM_FAIL(c, DM_ERR_ENV, "set_timeout: %s", err);
    }
    return DM_OK;
}

_DM_COLD_BEGIN
/* >>fake  World 1, or one simulated member of an N-rank world where every rank holds the same
   data (see >>fake desc for each collective's result). */
typedef struct _dm_fake {
    dm_collective base;
    _dm_core core;
} _dm_fake;

static dm_status _dm_fake_create_with(const dm_fake_desc* d, dm_collective** out);

/* dst = x op x op ... (size copies), computed in blocks with x saved first, so in-place works
   and floats round at every step like a serial reduction of size equal values. */
static void _dm_fake_fold(const dm_collective* c, void* dst, const void* src, size_t count,
                          dm_dtype dtype, dm_reduce_op op) {
    unsigned char x[4096];
    size_t esize = dm_dtype_size(dtype), per = sizeof(x) / esize, done, m;
    int k;
    for (done = 0; done < count; done += m) {
        unsigned char* d = (unsigned char*)dst + done * esize;
        m = count - done < per ? count - done : per;
        memcpy(x, (const unsigned char*)src + done * esize, m * esize);
        if (d != x) memmove(d, x, m * esize);
        for (k = 1; k < c->size; k++) dm_reduce_local(dtype, op, d, x, m);
        if (op == DM_MEAN) dm_divide_local(dtype, d, m, c->size);
    }
}
/* The value recursive doubling (>>recursive doubling, _dm_sch_rd) computes when every rank holds
   x, per block of m elements: ranks folded into pairs hold A = x op x, the others B = x; each
   round combines aligned groups of newranks two halves at a time. A group wholly below rem
   holds A_k, wholly above B_k, and at most one group per level straddles rem: S. */
static void _dm_fake_rd_block(int W, unsigned char* d, size_t m, dm_dtype dtype, dm_reduce_op op) {
    unsigned char a[4096], b[4096], s[4096], t[4096];
    size_t bytes = m * dm_dtype_size(dtype);
    int p = 1, rem, size;
    while (p * 2 <= W) p *= 2;
    rem = W - p;
    memcpy(b, d, bytes);
    memcpy(a, d, bytes);
    dm_reduce_local(dtype, op, a, b, m);
    for (size = 1; size < p; size *= 2) {
        int lo = rem / (2 * size) * (2 * size), h;
        const unsigned char* half[2];
        for (h = 0; h < 2; h++) {
            int start = lo + h * size;
            half[h] = start + size <= rem ? a : start >= rem ? b : s;
        }
        if (lo < rem && rem < lo + 2 * size) {   /* this level's straddling group */
            memcpy(t, half[0], bytes);
            dm_reduce_local(dtype, op, t, half[1], m);
            memcpy(s, t, bytes);
        }
        memcpy(t, a, bytes);                     /* the kernels' operands never alias */
        dm_reduce_local(dtype, op, a, t, m);
        memcpy(t, b, bytes);
        dm_reduce_local(dtype, op, b, t, m);
    }
    memcpy(d, rem == 0 ? b : s, bytes);
}
static dm_status _dm_fake_all_reduce(dm_collective* c, const void* send, void* recv, size_t count,
                                     dm_dtype dtype, dm_reduce_op op) {
    size_t esize = dm_dtype_size(dtype), per = 4096 / esize, done, m;
    if (c->size == 1 || (count * esize > _DM_PICK_SMALL_BYTES && count >= (size_t)c->size)) {
        _dm_fake_fold(c, recv, send, count, dtype, op);    /* the ring's order: serial */
        return DM_OK;
    }
    if (send != recv) memmove(recv, send, count * esize);
    for (done = 0; done < count; done += m) {
        m = count - done < per ? count - done : per;
        _dm_fake_rd_block(c->size, (unsigned char*)recv + done * esize, m, dtype, op);
        if (op == DM_MEAN) dm_divide_local(dtype, (unsigned char*)recv + done * esize, m, c->size);
    }
    return DM_OK;
}
static dm_status _dm_fake_all_gather(dm_collective* c, const void* send, void* recv, size_t count,
                                     dm_dtype dtype) {
    size_t block = count * dm_dtype_size(dtype);
    unsigned char* mine = (unsigned char*)recv + (size_t)c->rank * block;
    int r;
    if (mine != send) memmove(mine, send, block);
    for (r = 0; r < c->size; r++)
        if (r != c->rank) memcpy((unsigned char*)recv + (size_t)r * block, mine, block);
    return DM_OK;
}
static dm_status _dm_fake_reduce_scatter(dm_collective* c, const void* send, void* recv,
                                         size_t recv_count, dm_dtype dtype, dm_reduce_op op) {
    size_t block = recv_count * dm_dtype_size(dtype);
    _dm_fake_fold(c, recv, (const unsigned char*)send + (size_t)c->rank * block, recv_count, dtype, op);
    return DM_OK;
}
static dm_status _dm_fake_broadcast(dm_collective* c, void* buf, size_t count, dm_dtype dtype, int root) {
    (void)c; (void)buf; (void)count; (void)dtype; (void)root;
    return DM_OK; /* every rank already holds the root's data */
}
static dm_status _dm_fake_barrier(dm_collective* c) { (void)c; return DM_OK; }
/* The root's block for this rank; a simulated non-root holds no other rank's data, so its recv
   is left as it is. */
static dm_status _dm_fake_scatter(dm_collective* c, const void* send, void* recv, size_t count, dm_dtype dtype,
                                  int root) {
    size_t bytes = count * dm_dtype_size(dtype);
    const unsigned char* mine = (const unsigned char*)send + (size_t)root * bytes;
    if (c->rank == root && mine != recv && bytes) memmove(recv, mine, bytes);
    return DM_OK;
}
/* Every rank i is a copy of this one, so what it sends here is this rank's block for itself:
   recv block i = send block rank (in place: recv's own block, saved first). */
static dm_status _dm_fake_all_to_all_v(dm_collective* c, const void* send, const size_t* sc, const size_t* so,
                                       void* recv, const size_t* rc, const size_t* ro, dm_dtype dtype) {
    size_t esize = dm_dtype_size(dtype), bytes = sc[c->rank] * esize;
    const unsigned char* src = (const unsigned char*)(send ? send : recv) + so[c->rank] * esize;
    unsigned char* saved = NULL;
    int i;
    for (i = 0; i < c->size; i++)
        if (rc[i] != sc[c->rank])
            return _DM_FAIL(c, DM_ERR_MISMATCH, "fake: all_to_all_v: rank %d (a copy of rank %d) sends %zu "
                            "elements here, recv_counts[%d] is %zu", i, c->rank, sc[c->rank], i, rc[i]);
    if (!send && bytes) {
        saved = (unsigned char*)_dm_malloc(&c->allocator, bytes);
        if (!saved) return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "fake: all_to_all: no memory for %zu bytes", bytes);
        memcpy(saved, src, bytes);
        src = saved;
    }
    for (i = 0; i < c->size && bytes; i++) memmove((unsigned char*)recv + ro[i] * esize, src, bytes);
    _dm_free(&c->allocator, saved);
    return DM_OK;
}
/* A simulated rank cannot see the others' colors: the group is taken to be the whole world
   (every rank passed this color), with this rank's position kept. */
static dm_status _dm_fake_split(dm_collective* c, int color, int key, dm_collective** out) {
    _DM_ZERO(dm_fake_desc, d);
    (void)key;
    if (color == DM_SPLIT_NONE) return DM_OK;
    d.world_size = c->size;
    d.rank = c->rank;
    d.local_world_size = c->local_size;
    d.timeout_ms = c->timeout_ms;
    d.logger = c->logger;
    d.allocator = c->allocator;
    return _dm_fake_create_with(&d, out);
}
static void _dm_fake_destroy(dm_collective* c) {
    dm_allocator a = c->allocator;
    _dm_free(&a, c);
}
static const dm_collective_vtable _dm_fake_vtable = {
    sizeof(dm_collective_vtable),    /* struct_size */
    DM_COLLECTIVE_VTABLE_VERSION,    /* version */
    "fake",                          /* name */
    _dm_fake_destroy,                /* destroy */
    _dm_fake_barrier,                /* barrier */
    _dm_fake_all_reduce,             /* all_reduce */
    _dm_fake_all_gather,             /* all_gather */
    NULL,                            /* all_gather_to_list: core fallback */
    _dm_fake_reduce_scatter,         /* reduce_scatter */
    _dm_fake_broadcast,              /* broadcast */
    _dm_fake_split,                  /* split */
    NULL,                            /* native_handle */
    NULL,                            /* synchronize */
    NULL,                            /* transport: the backend's name */
    NULL,                            /* reduce: core fallback through all_reduce */
    NULL,                            /* gather: core fallback through all_gather */
    _dm_fake_scatter,                /* scatter */
    _dm_fake_all_to_all_v,           /* all_to_all_v */
    NULL,                            /* send */
    NULL,                            /* recv */
    NULL,                            /* start */
    NULL,                            /* finish */
    NULL,                            /* shrink */
    NULL,                            /* grow */
    NULL,                            /* interrupt */
    NULL,                            /* recv_any */
};

/* Checks the desc shared by dm_fake_create and dm_thread_world_create. err gets the reason. */
/* The host of rank r in desc d: host_of[r], else r's node from local_world_size. */
static int _dm_fake_host(const dm_fake_desc* d, int r) {
    return d->host_of ? d->host_of[r] : r / _dm_def(d->local_world_size, _dm_def(d->world_size, 1));
}
/* site_of: numbers >= 0, one site per host. */
static dm_status _dm_fake_sites_check(const dm_fake_desc* d, char* err, size_t cap) {
    int r, q, n = _dm_def(d->world_size, 1);
    for (r = 0; d->site_of && r < n; r++) {
        if (d->site_of[r] < 0)
            return _DM_REPORT(&d->logger, err, cap, DM_ERR_INVALID_ARG,
                              "fake: site_of[%d] is %d; sites are numbers >= 0", r, d->site_of[r]);
        for (q = 0; q < r; q++)
            if (_dm_fake_host(d, q) == _dm_fake_host(d, r) && d->site_of[q] != d->site_of[r])
                return _DM_REPORT(&d->logger, err, cap, DM_ERR_INVALID_ARG,
                                  "fake: ranks %d and %d share a host but site_of gives them sites %d and %d; "
                                  "a host is at one site", q, r, d->site_of[q], d->site_of[r]);
    }
    return DM_OK;
}
static dm_status _dm_fake_desc_check(const dm_fake_desc* d, bool check_rank, char* err, size_t cap) {
    if (!_dm_allocator_valid(&d->allocator))
        return _DM_REPORT(&d->logger, err, cap, DM_ERR_INVALID_ARG,
                          "fake: allocator needs both alloc_fn and free_fn, or neither");
    if (d->world_size < 0 || d->local_world_size < 0)
        return _DM_REPORT(&d->logger, err, cap, DM_ERR_INVALID_ARG,
                          "fake: world_size %d / local_world_size %d must not be negative",
                          d->world_size, d->local_world_size);
    if (check_rank && (d->rank < 0 || d->rank >= _dm_def(d->world_size, 1)))
        return _DM_REPORT(&d->logger, err, cap, DM_ERR_INVALID_ARG,
                          "fake: rank %d is not below world_size %d", d->rank, _dm_def(d->world_size, 1));
    if (d->host_of) {
        int r;
        for (r = 0; r < _dm_def(d->world_size, 1); r++)
            if (d->host_of[r] < 0)
                return _DM_REPORT(&d->logger, err, cap, DM_ERR_INVALID_ARG,
                                  "fake: host_of[%d] is %d; hosts are numbers >= 0", r, d->host_of[r]);
    }
    return _dm_fake_sites_check(d, err, cap);
}
/* Rank c->rank on host host_of[rank]: its local rank and size, and the node name dm_local
   groups by. */
static void _dm_fake_set_host(dm_collective* c, const int* host_of) {
    int r;
    c->local_rank = c->local_size = 0;
    for (r = 0; r < c->size; r++) {
        if (host_of[r] != host_of[c->rank]) continue;
        if (r < c->rank) c->local_rank++;
        c->local_size++;
    }
    snprintf(c->node_name, sizeof(c->node_name), "%s-node-%d", c->vt->name, host_of[c->rank]);
}
/* Node k holds ranks [k*L, (k+1)*L): the local rank and the node's size for rank r. */
static void _dm_fake_set_local(dm_collective* c, int local_world_size) {
    int L = local_world_size > 0 && local_world_size < c->size ? local_world_size : c->size;
    int node = c->rank / L, first = node * L;
    c->local_rank = c->rank - first;
    c->local_size = (c->size - first) < L ? (c->size - first) : L;
    snprintf(c->node_name, sizeof(c->node_name), "%s-node-%d", c->vt->name, node);
}
static dm_status _dm_fake_create_with(const dm_fake_desc* d, dm_collective** out) {
    _dm_fake* f = (_dm_fake*)_dm_calloc(&d->allocator, sizeof(_dm_fake));
    if (!f) return DM_ERR_OUT_OF_MEMORY;
    _dm_collective_init(&f->base, &f->core, &_dm_fake_vtable, d->rank, _dm_def(d->world_size, 1), d->timeout_ms,
                        &d->logger, &d->allocator);
    if (d->host_of) _dm_fake_set_host(&f->base, d->host_of);
    else _dm_fake_set_local(&f->base, d->local_world_size);
    *out = &f->base;
    return DM_OK;
}
static dm_status _dm_fake_create_checked(const dm_fake_desc* desc, dm_collective** out) {
    char err[DM_LAST_ERROR_SIZE];
    _DM_ZERO(dm_fake_desc, d);
    if (!out) return _DM_REPORT(NULL, err, sizeof(err), DM_ERR_INVALID_ARG, "fake: out is NULL");
    *out = NULL;
    if (desc) d = *desc;
    _DM_TRY(_dm_fake_desc_check(&d, true, err, sizeof(err)));
    _dm_create_rank(d.rank);
    _DM_TRY(_dm_cfg_check_create(&d.logger, d.timeout_ms, err, sizeof(err)));
    d.logger = _dm_logger_or_default(&d.logger, d.rank);
    return _dm_fake_create_with(&d, out);
}
DM_API_IMPL dm_status dm_fake_create(const dm_fake_desc* desc, dm_collective** out) {
    _dm_create_begin();
    return _dm_create_end(_dm_fake_create_checked(desc, out), desc && desc->logger.func);
}

_DM_COLD_END
/* >>links  A link is one rank's channel to one peer: an ordered byte stream each way. Every
   schedule below (recursive doubling, rings, chain broadcast, dissemination barrier) is written
   once over links and driven by one engine, so whatever carries the bytes (sockets, rings in
   shared memory between processes, rings in the heap between threads) the steps and the order
   in which values are reduced are the same, and so are the results, bit for bit.
   Here: the ops table every transport fills (_dm_link_vt), the bell that wakes a rank asleep
   on memory links, and the abort word the ranks of one host share. */
typedef struct _dm_link _dm_link;
/* One piece of a gathered send (_dm_link_vt.sendv). */
typedef struct _dm_iov { const void* buf; size_t len; } _dm_iov;
#define _DM_LINK_IOV_MAX 8          /* pieces per gathered send */
typedef struct _dm_link_vt {
    const char* name;           /* the transport: "tcp", "shm", "thread" */
    /* Nonblocking: move up to n bytes and return how many (0: would block), or -1 with *err set
       (0: the peer is gone, end of stream; else an errno value). */
    ptrdiff_t (*send)(_dm_link* l, const void* buf, size_t n, int* err);
    ptrdiff_t (*recv)(_dm_link* l, void* buf, size_t n, int* err);
    /* Optional: the readable bytes in place (contiguous), and their release after use; lets a
       reduction read straight from the link instead of through scratch. */
    const unsigned char* (*peek)(_dm_link* l, size_t* n);
    void (*consume)(_dm_link* l, size_t n);
    /* Optional, asked only while blocked: 0 if the peer is still there, else -1 with *err. */
    int (*alive)(_dm_link* l, int* err);
    void (*shutdown)(_dm_link* l);  /* optional: the collective broke; make the peer fail fast */
    void (*destroy)(_dm_link* l, const dm_allocator* a);
    /* 0, or 8: every step is padded to a multiple of 8 bytes on this link, so data read in
       place (peek) is aligned for every dtype. */
    size_t align;
    /* Optional: send as much of the pieces, in order, as can move now (same result as send).
       The engine then sends every step that is ready in one call: a fingerprint and its payload
       are one system call on a socket, one publish and one bell on a ring. */
    ptrdiff_t (*sendv)(_dm_link* l, const _dm_iov* iov, int n, int* err);
    /* Optional: the socket to poll for the next send (out) or receive, where a link has several
       (striped sockets); else fd. */
    int (*pollfd)(_dm_link* l, bool out);
} _dm_link_vt;
struct _dm_link {
    const _dm_link_vt* vt;
    int fd;                     /* pollable when blocked (sockets); -1: memory, waits on the bell */
    char where[64];             /* the peer, for messages: "10.0.0.2:4711", "pid 4242" */
};

/* A bell wakes a rank asleep on memory links. A rank about to sleep sets `sleeping`, reads
   seq, tries once more, and sleeps only while seq is unchanged (a futex between processes, a
   condition variable between threads). Every write into one of its rings and every read that
   frees space in one is followed by a look at `sleeping`: only a sleeper's bell is bumped and
   woken. Either the waker sees `sleeping`, or the sleeper's last try sees the bytes, so no
   wake-up is lost, and while nobody sleeps the line holding seq does not bounce between cores.
   That needs a store-load barrier on both sides, between each one's store and its load. It is
   a full fence on both, unless the ops have a heavy `barrier`: then wakers (the hot path, every
   message) only stop the compiler, and the sleeper (after 200 us to 1 ms idle) calls barrier(),
   which runs a full fence on every core running a waker (Linux membarrier, every process of
   the host's group registered), so the asymmetric pair orders like two fences. One cache line. */
typedef struct _dm_bell {
    uint32_t seq, sleeping;
    int32_t cpu;                /* the core its rank last waited on, plus 1 (0: not known) */
    unsigned char pad[52];
} _dm_bell;
typedef struct _dm_bell_ops {
    void (*wait)(void* ctx, _dm_bell* b, uint32_t seen, int ms);
    void (*wake)(void* ctx, _dm_bell* b);
    void* ctx;
    void (*barrier)(void);      /* NULL: full fences on both sides */
} _dm_bell_ops;

_DM_PRIVATE void _dm_bell_ring(_dm_bell* b, const _dm_bell_ops* ops) {
    if (ops->barrier) __atomic_signal_fence(__ATOMIC_SEQ_CST);
    else __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (!__atomic_load_n(&b->sleeping, __ATOMIC_SEQ_CST)) return;
    __atomic_fetch_add(&b->seq, 1u, __ATOMIC_SEQ_CST);
    ops->wake(ops->ctx, b);
}
/* The sleeper's half: after announcing (sleeping, seq), before its last look. */
_DM_PRIVATE void _dm_bell_announced(const _dm_bell_ops* ops) {
    if (ops->barrier) ops->barrier();
    else __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

/* The first failure of a group whose ranks share memory, for all of them: its status, the rank
   that saw it and that rank's message, so every rank reports the cause, not "peer lost".
   status: 0 none yet, 1 while the message is being written, else the dm_status. */
typedef struct _dm_abort { int32_t status, rank; char msg[248]; } _dm_abort;

/* >>rings include  The memory rings (distmesh_shm.h: >>memory rings), here: after the link's
   ops table and the bell (>>links) they fill and ring, before the engine and the threaded world
   that use them. The rest of the shared-memory transport comes with the TCP backend. */
#include "distmesh_shm.h"

/* >>fingerprint  Sent first by every collective on every link and compared by the receiver:
   32 bytes, magic u32 "DMTF", kind u8, dtype u8, op u8, compression u8 (all_reduce's
   dm_compress when compressing, else 0), root i32, 0 u32, count u64, seq u64, little-endian.
   One format and one message for every backend. */
#define _DM_FP_MAGIC 0x46544d44u
enum { _DM_K_ALL_REDUCE = 1, _DM_K_ALL_GATHER, _DM_K_REDUCE_SCATTER, _DM_K_BROADCAST, _DM_K_BARRIER,
       _DM_K_SETUP, _DM_K_SPLIT, _DM_K_ALL_TO_ALL, _DM_K_REDUCE, _DM_K_GATHER, _DM_K_SCATTER,
       _DM_K_SEND, _DM_K_RECV };
/* A point-to-point message is a fingerprint of kind _DM_K_SEND (root = the tag, seq = the
   sender's message number to this peer) followed by count elements; _DM_K_RECV only names
   what a receiver expected, in messages. */
typedef struct _dm_fp {
    int kind, dtype, op, root;  /* dtype, op, root: -1 when the kind has none */
    int compress;               /* all_reduce: DM_COMPRESS_BF16 / _INT8 when it compresses, else 0 */
    uint64_t count, seq;
} _dm_fp;

_DM_PRIVATE void _dm_put32(unsigned char* p, uint32_t v) {
    p[0] = (unsigned char)v; p[1] = (unsigned char)(v >> 8); p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}
_DM_PRIVATE uint32_t _dm_get32(const unsigned char* p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
_DM_PRIVATE void _dm_put64(unsigned char* p, uint64_t v) {
    _dm_put32(p, (uint32_t)v);
    _dm_put32(p + 4, (uint32_t)(v >> 32));
}
_DM_PRIVATE uint64_t _dm_get64(const unsigned char* p) {
    return (uint64_t)_dm_get32(p) | ((uint64_t)_dm_get32(p + 4) << 32);
}
_DM_PRIVATE const char* _dm_kind_name(int kind) {
    static const char* names[] = { "unknown collective", "all_reduce", "all_gather", "reduce_scatter",
                                   "broadcast", "barrier", "setup", "split", "all_to_all", "reduce", "gather",
                                   "scatter", "send", "recv" };
    return (kind > 0 && kind <= _DM_K_RECV) ? names[kind] : names[0];
}
_DM_PRIVATE void _dm_fp_make(_dm_fp* f, const dm_collective* c, int kind, int dtype, int op, int root,
                             size_t count) {
    f->kind = kind; f->dtype = dtype; f->op = op; f->root = root; f->compress = 0;
    f->count = (uint64_t)count; f->seq = c->seq;
}
_DM_PRIVATE void _dm_fp_encode(const _dm_fp* f, unsigned char* p) {
    memset(p, 0, 32);
    _dm_put32(p, _DM_FP_MAGIC);
    p[4] = (unsigned char)f->kind; p[5] = (unsigned char)f->dtype; p[6] = (unsigned char)f->op;
    p[7] = (unsigned char)f->compress;
    _dm_put32(p + 8, (uint32_t)f->root);
    _dm_put64(p + 16, f->count);
    _dm_put64(p + 24, f->seq);
}
_DM_PRIVATE void _dm_fp_decode(const unsigned char* p, _dm_fp* f) {
    f->kind = p[4];
    f->dtype = p[5] == 0xff ? -1 : p[5];
    f->op = p[6] == 0xff ? -1 : p[6];
    f->compress = p[7];
    f->root = (int)_dm_get32(p + 8);
    f->count = _dm_get64(p + 16);
    f->seq = _dm_get64(p + 24);
}
_DM_PRIVATE bool _dm_fp_equal(const _dm_fp* a, const _dm_fp* b) {
    return a->kind == b->kind && a->dtype == b->dtype && a->op == b->op && a->root == b->root &&
           a->compress == b->compress && a->count == b->count && a->seq == b->seq;
}
/* "all_reduce #7 (float32, count 3, sum)", "broadcast #2 (int8, count 4, root 1)". */
_DM_PRIVATE void _dm_fp_text(const _dm_fp* f, char* buf, size_t cap) {
    int n = snprintf(buf, cap, "%s #%llu", _dm_kind_name(f->kind), (unsigned long long)f->seq);
    if (n < 0 || (size_t)n >= cap) return;
    if (f->kind == _DM_K_BARRIER) { snprintf(buf + n, cap - (size_t)n, " (round %d)", f->root); return; }
    if (f->dtype < 0) return;
    n += snprintf(buf + n, cap - (size_t)n, " (%s, count %llu", dm_dtype_name((dm_dtype)f->dtype),
                  (unsigned long long)f->count);
    if ((size_t)n < cap && f->op >= 0 &&
        (f->kind == _DM_K_ALL_REDUCE || f->kind == _DM_K_REDUCE_SCATTER || f->kind == _DM_K_REDUCE))
        n += snprintf(buf + n, cap - (size_t)n, ", %s", dm_reduce_op_name((dm_reduce_op)f->op));
    if ((size_t)n < cap && f->compress > 0 && f->compress < DM_COMPRESS_COUNT)
        n += snprintf(buf + n, cap - (size_t)n, ", compressed %s", dm_compress_name((dm_compress)f->compress));
    if ((size_t)n < cap && (f->kind == _DM_K_BROADCAST || f->kind == _DM_K_REDUCE || f->kind == _DM_K_GATHER ||
                            f->kind == _DM_K_SCATTER))
        n += snprintf(buf + n, cap - (size_t)n, ", root %d", f->root);
    if ((size_t)n < cap && f->kind == _DM_K_ALL_TO_ALL)
        n += snprintf(buf + n, cap - (size_t)n, " from the sender, %d back", f->root);
    if ((size_t)n < cap && (f->kind == _DM_K_SEND || f->kind == _DM_K_RECV))
        n += snprintf(buf + n, cap - (size_t)n, ", tag %d", f->root);
    if ((size_t)n < cap) snprintf(buf + n, cap - (size_t)n, ")");
}
_DM_PRIVATE dm_status _dm_fp_mismatch(dm_collective* c, const char* tag, int me, const _dm_fp* mine,
                                      int peer, const _dm_fp* theirs) {
    char a[160], b[160];
    _dm_fp_text(mine, a, sizeof(a));
    _dm_fp_text(theirs, b, sizeof(b));
    return _DM_FAIL(c, DM_ERR_MISMATCH, "%s: mismatched collectives: rank %d called %s, rank %d called %s",
                    tag, me, a, peer, b);
}

/* >>sealed records  What crosses a network that is not trusted, sealed: the encrypted links
   between hosts (distmesh_socket.h >>socket aead) and the store's connections with a token
   (distmesh_store.h >>store seal) carry their plaintext stream as records
       length  u32 little-endian, 1.._DM_AEAD_RECORD: the record's plaintext bytes
       sealed  length bytes of AES-256-GCM ciphertext (libcrypto's EVP), then its 16-byte tag
   with the length as associated data and the direction's record counter as the 96-bit nonce
   (4 zero bytes, the counter u64 little-endian): sender and receiver count records alike, so no
   nonce repeats under a key and a record replayed, reordered, dropped, flipped or spliced from
   another connection fails its tag. Each direction of each connection has its own key, from
   HKDF-SHA256 of the token over both ends' handshake nonces (the callers name the direction in
   the info). Here: the key derivation (libc only) and one direction's cipher (_dm_rec, with
   DISTMESH_OPENSSL): seal the next record into a buffer, open the next one in place. */
#define _DM_AEAD_RECORD ((size_t)64 << 10)  /* plaintext bytes per record at most */
#define _DM_AEAD_HEAD 4
#define _DM_AEAD_TAG 16
#define _DM_AEAD_MAX (_DM_AEAD_HEAD + _DM_AEAD_RECORD + _DM_AEAD_TAG)   /* one whole record */
_DM_COLD_BEGIN
/* HKDF-SHA256 (RFC 5869), one 32-byte block: extract with salt over ikm, expand with info. */
_DM_PRIVATE void _dm_hkdf_sha256(const void* salt, size_t salt_n, const void* ikm, size_t ikm_n, const char* info,
                                 size_t info_n, unsigned char out[32]) {
    unsigned char prk[32], msg[1024];
    if (info_n > sizeof(msg) - 1) info_n = sizeof(msg) - 1;
    dm_hmac_sha256(salt, salt_n, ikm, ikm_n, prk);
    memcpy(msg, info, info_n);
    msg[info_n] = 1;
    dm_hmac_sha256(prk, sizeof(prk), msg, info_n + 1, out);
    memset(prk, 0, sizeof(prk));
}
_DM_COLD_END
#if defined(DISTMESH_OPENSSL)
/* One direction of a connection: its cipher under its key, and its record counter (the next
   record's nonce). */
typedef struct _dm_rec {
    EVP_CIPHER_CTX* ctx;
    uint64_t seq;
} _dm_rec;
/* Keyed for sealing (seal) or opening: true, or false (out of memory, or libcrypto has no
   AES-256-GCM) with nothing to free. */
_DM_PRIVATE bool _dm_rec_init(_dm_rec* r, bool seal, const unsigned char key[32]) {
    r->seq = 0;
    r->ctx = EVP_CIPHER_CTX_new();
    if (r->ctx && (seal ? EVP_EncryptInit_ex(r->ctx, EVP_aes_256_gcm(), NULL, key, NULL)
                        : EVP_DecryptInit_ex(r->ctx, EVP_aes_256_gcm(), NULL, key, NULL)) == 1)
        return true;
    EVP_CIPHER_CTX_free(r->ctx);
    r->ctx = NULL;
    return false;
}
_DM_PRIVATE void _dm_rec_free(_dm_rec* r) {
    EVP_CIPHER_CTX_free(r->ctx);
    r->ctx = NULL;
}
_DM_PRIVATE void _dm_rec_nonce(uint64_t seq, unsigned char iv[12]) {
    int i;
    memset(iv, 0, 4);
    for (i = 0; i < 8; i++) iv[4 + i] = (unsigned char)(seq >> (8 * i));
}
/* Seals the first n bytes of the pieces (1 <= n <= _DM_AEAD_RECORD) as the next record into
   out (n + _DM_AEAD_HEAD + _DM_AEAD_TAG bytes): true, or false when libcrypto failed. */
_DM_PRIVATE bool _dm_rec_seal(_dm_rec* r, const _dm_iov* iov, int niov, size_t n, unsigned char* out) {
    unsigned char iv[12];
    size_t off = 0;
    int i, outl = 0;
    _dm_put32(out, (uint32_t)n);
    _dm_rec_nonce(r->seq++, iv);
    if (EVP_EncryptInit_ex(r->ctx, NULL, NULL, NULL, iv) != 1 ||
        EVP_EncryptUpdate(r->ctx, NULL, &outl, out, _DM_AEAD_HEAD) != 1)
        return false;
    for (i = 0; i < niov && off < n; i++) {
        size_t k = iov[i].len < n - off ? iov[i].len : n - off;
        if (k == 0) continue;
        if (EVP_EncryptUpdate(r->ctx, out + _DM_AEAD_HEAD + off, &outl, (const unsigned char*)iov[i].buf, (int)k) != 1)
            return false;
        off += k;
    }
    return EVP_EncryptFinal_ex(r->ctx, out + _DM_AEAD_HEAD + n, &outl) == 1 &&
           EVP_CIPHER_CTX_ctrl(r->ctx, EVP_CTRL_GCM_GET_TAG, _DM_AEAD_TAG, out + _DM_AEAD_HEAD + n) == 1;
}
/* The length a record's head announces, or 0 when no record may have it (0, or above
   _DM_AEAD_RECORD): the stream is bad from there. */
_DM_PRIVATE size_t _dm_rec_len(const unsigned char* head) {
    size_t n = _dm_get32(head);
    return n > _DM_AEAD_RECORD ? 0 : n;
}
/* Opens the next record, whole in rec (head, n sealed bytes, tag), in place: its plaintext is
   rec + _DM_AEAD_HEAD. true, or false when it fails its tag (then nothing of it may be used). */
_DM_PRIVATE bool _dm_rec_open(_dm_rec* r, unsigned char* rec, size_t n) {
    unsigned char iv[12];
    int outl = 0;
    _dm_rec_nonce(r->seq++, iv);
    return EVP_DecryptInit_ex(r->ctx, NULL, NULL, NULL, iv) == 1 &&
           EVP_DecryptUpdate(r->ctx, NULL, &outl, rec, _DM_AEAD_HEAD) == 1 &&
           EVP_DecryptUpdate(r->ctx, rec + _DM_AEAD_HEAD, &outl, rec + _DM_AEAD_HEAD, (int)n) == 1 &&
           EVP_CIPHER_CTX_ctrl(r->ctx, EVP_CTRL_GCM_SET_TAG, _DM_AEAD_TAG, rec + _DM_AEAD_HEAD + n) == 1 &&
           EVP_DecryptFinal_ex(r->ctx, rec + _DM_AEAD_HEAD + n, &outl) == 1;
}
#endif /* DISTMESH_OPENSSL */

/* >>algorithms  The algorithms a group may run, and DISTMESH_ALGO's names for them. A family
   (flat, two_level) forces the level and leaves ring or recursive doubling to the cost model;
   an algorithm forces both where it can run (a ring needs at least one element per rank of its
   ring; else its family's other form runs). Collectives without a ring and an rd form
   (broadcast, barrier, all_gather, reduce_scatter) follow the family. Read once when a group's
   engine is made (_dm_eng_init); the choice (>>choice) honours it. */
enum {
    _DM_ALGO_AUTO = 0, _DM_ALGO_FLAT, _DM_ALGO_TWO_LEVEL,
    _DM_ALGO_FLAT_RING, _DM_ALGO_FLAT_RD, _DM_ALGO_TWO_LEVEL_RING, _DM_ALGO_TWO_LEVEL_RD, _DM_ALGO_THREE_LEVEL,
    _DM_ALGO_COUNT
};
static const char* const _dm_algo_names[_DM_ALGO_COUNT] = {
    "auto", "flat", "two_level", "flat_ring", "flat_rd", "two_level_ring", "two_level_rd", "three_level"
};
/* A link class of the cost model (>>choice): alpha (us per message), beta (ns per byte). */
typedef struct _dm_link_cost { double alpha_us, beta_ns; } _dm_link_cost;
/* DISTMESH_HOST_LINK, "LATENCY_US,GBIT": the one-way latency (microseconds) and the rate
   (Gbit/s) of the link between hosts, for the cost model's cross-host class (>>choice) in
   place of its 25 us and 10 Gbit/s. Distant hosts need it: at 25 ms one way the model's
   default pipelines a large two-level all-reduce in many segments, each of which then waits
   a round trip (docs/performance.md "Wide-area round trips"). Unset: alpha 0 (the class's).
   It changes only which algorithm and how many segments run, so every rank must be given the
   same, like DISTMESH_ALGO. DISTMESH_SITE_LINK is the same for the link between sites (the
   cross-site class). */
_DM_PRIVATE dm_status _dm_eng_link_env(_dm_cfg_id id, _dm_link_cost* out, char* err, size_t cap) {
    const char* s = NULL;
    char* end = NULL;
    double us, gbit;
    out->alpha_us = out->beta_ns = 0;
    _DM_TRY(_dm_cfg_str(id, &s, err, cap));
    if (!s || !*s) return DM_OK;
    errno = 0;
    us = strtod(s, &end);
    if (end != s && *end == ',') {
        const char* g = end + 1;
        gbit = strtod(g, &end);
        if (end != g && *end == 0 && errno == 0 && us > 0 && us <= 1e7 && gbit > 0 && gbit <= 1e4) {
            out->alpha_us = us;
            out->beta_ns = 8.0 / gbit;      /* ns per byte at gbit Gbit/s */
            return DM_OK;
        }
    }
    snprintf(err, cap, "env: DISTMESH_%s=\"%.40s\" is not LATENCY_US,GBIT (one-way us in (0, 1e7], "
             "Gbit/s in (0, 1e4]; e.g. 25000,1)", id == _DM_CFG_HOST_LINK ? "HOST_LINK" : "SITE_LINK", s);
    return DM_ERR_ENV;
}
/* The engine's variables: DISTMESH_ALGO (unset: auto; its choices are _dm_algo_names in order,
   >>config registry), DISTMESH_COMPRESS as a dm_compress (none|bf16|int8:
   DM_COMPRESS_NONE, _BF16, _INT8), DISTMESH_HOST_LINK and DISTMESH_SITE_LINK (links may be
   NULL: only checked; else links[0] the host link, links[1] the site link). A bad value is
   DM_ERR_ENV with err saying what is accepted. */
_DM_PRIVATE dm_status _dm_eng_env(int* algo, dm_compress* compress, _dm_link_cost* links, char* err, size_t cap) {
    int mode = 0;
    _dm_link_cost link[2];
    _DM_TRY(_dm_cfg_int(_DM_CFG_ALGO, algo, err, cap));
    _DM_TRY(_dm_cfg_int(_DM_CFG_COMPRESS, &mode, err, cap));
    *compress = (dm_compress)(DM_COMPRESS_NONE + mode);
    _DM_TRY(_dm_eng_link_env(_DM_CFG_HOST_LINK, &link[0], err, cap));
    _DM_TRY(_dm_eng_link_env(_DM_CFG_SITE_LINK, &link[1], err, cap));
    if (links) { links[0] = link[0]; links[1] = link[1]; }
    return DM_OK;
}

/* >>engine  The state one group's schedules run on (_dm_eng: its links, scratch, host layout,
   broken state and the backend's hooks), made and released here, the wait policy, and the
   transfer a schedule hands the engine (_dm_xfer: a stream of send steps and one of recv
   steps). The failure rule, the inbox, the pump and the loop follow in their own sections. */

#define _DM_ENG_IO_MAX      ((size_t)1 << 30)  /* bytes per link call (2 GiB+ messages) */
#define _DM_ENG_SPIN_US     5                  /* see _dm_eng_set_policy */
/* A point-to-point message that arrived before the dm_recv asking for it (see >>engine inbox). */
typedef struct _dm_umsg {
    struct _dm_umsg* next;
    int peer;
    _dm_fp fp;                  /* its header: dtype, count, tag (root), number (seq) */
    size_t bytes;
    unsigned char* data;
} _dm_umsg;
/* What a peer sends between collectives, read at the boundaries: a point-to-point message
   (header, payload, padding) or the next collective's fingerprint, which stays in hdr until
   that collective's first recv step takes it (fp_ready). State survives between calls: a send
   that reads while it waits may stop anywhere in a message. */
typedef struct _dm_inbox {
    unsigned char hdr[32];
    size_t hfill;               /* header bytes read */
    bool fp_ready;              /* hdr is a collective's fingerprint, not yet taken */
    bool payload;               /* reading a payload (into msg->data, or a dm_recv's buffer) */
    _dm_umsg* msg;              /* the unexpected message being filled, or NULL */
    unsigned char* dst;
    size_t len, fill, pad, padfill;
} _dm_inbox;
/* Which ranks share a host, as the schedules see it: hosts numbered by first
   appearance, each host's ranks in rank order. One host (every rank) unless the backend says
   otherwise (_dm_eng_set_hosts). All arrays live in one allocation owned by the _dm_eng. */
typedef struct _dm_layout {
    int H;                      /* hosts */
    int Lmin, Lmax;             /* fewest and most ranks on one host */
    int* host_of;               /* rank -> host */
    int* local;                 /* rank -> its index among its host's ranks */
    int* members;               /* ranks host by host: host h's are members[start[h] .. start[h+1]) */
    int* start;                 /* H + 1 entries */
    int* team;                  /* scratch, 7 x size entries: teams' ranks (rails, chains; a site
                                   rail and a cross rail at once) in the first 2 x size, the
                                   cost model's rounds in the rest (_dm_cost_scratch), so that
                                   a schedule may ask the model with its teams built */
    bool contiguous;            /* every host's ranks are consecutive numbers */
    /* Sites (DISTMESH_SITE): groups of hosts joined by a slower link. Hosts are numbered site
       by site, so site s holds hosts site_start[s] .. site_start[s+1] and the flat ring and
       every rail cross each site boundary once. One site unless the backend says otherwise. */
    int NS;                     /* sites */
    int HSmin, HSmax;           /* fewest and most hosts at one site */
    int* site_of;               /* host -> site (H entries) */
    int* site_start;            /* NS + 1 entries */
} _dm_layout;

typedef struct _dm_eng {
    dm_collective* c;
    const char* tag;            /* message prefix: the backend */
    /* Optional, the backend's step before each collective the core's slots run (not point-to-
       point, not dry runs): the threaded world meets there and compares fingerprints. */
    dm_status (*enter)(struct _dm_eng* lk, int kind, size_t count, int dtype, int op, int root);
    _dm_link** links;           /* per rank, NULL for this rank */
    int* order;                 /* ring position -> rank: same-host ranks adjacent */
    int* slot;                  /* rank -> ring position */
    unsigned char* tmp;         /* scratch: max(chunk, _DM_PICK_SMALL_BYTES) bytes */
    unsigned char* tmp2;        /* a second one, tmp_size bytes, made when first needed: for the
                                   host ring that runs beside a rail (_dm_sch_2l_stage) */
    size_t tmp_size, chunk;     /* chunk: pipelining unit of reductions through scratch */
    dm_status broken;           /* DM_OK, or the failure that broke the group */
    char broken_msg[256];
    _dm_bell* bell;             /* this rank's bell when it has memory links, else NULL */
    _dm_bell* bells;            /* the bells of the ranks sharing memory (a failure wakes them) */
    int nbells;
    const _dm_bell_ops* bell_ops;
    _dm_abort* abort;           /* the failure word shared by same-host ranks, or NULL */
    int spin_us, yield_us;      /* a wait spins, then yields until yield_us, then blocks */
    int beside_looks;           /* looks in a row that found a peer on this core (_dm_eng_move_off) */
    int64_t moved_us;           /* when this rank last moved off a peer's core, 0 never */
    /* Optional: the backend's channel for abort notices that reach every rank, not only the
       neighbours of a failure (TCP: a key in the store). post is called once, with the status
       and message of the first failure this rank saw itself; read returns such a notice (its
       status, DM_OK for none) when a peer hangs up, so the cause is reported, not "EOF". */
    void (*notice_post)(struct _dm_eng* lk, dm_status st, const char* msg);
    dm_status (*notice_read)(struct _dm_eng* lk, int* rank, char* msg, size_t cap);
    bool adopting;              /* breaking because of another rank's notice: do not re-post */
    _dm_inbox* inbox;           /* per rank (>>engine inbox) */
    _dm_umsg *uhead, *utail;    /* unexpected messages in arrival order */
    size_t ubytes;              /* their bytes, bounded by DISTMESH_MAX_OBJECT_BYTES */
    uint64_t* sent;             /* per rank: point-to-point messages sent to it (their number) */
    struct pollfd* pfds;        /* size + 2 x _DM_ENG_XFER_MAX + _DM_ENG_SERVICE_FDS entries for _dm_eng_block */
    _dm_layout lay;             /* which ranks share a host */
    int algo;                   /* DISTMESH_ALGO: _DM_ALGO_AUTO or the family / algorithm forced */
    dm_compress compress_env;   /* DISTMESH_COMPRESS: DM_COMPRESS_NONE, _BF16 or _INT8 */
    unsigned char* cbuf;        /* the compressed rails' scratch (>>compressed rails), grown on demand */
    size_t cbuf_size;
    const _dm_link_cost* cost;  /* NULL: the model's link classes (>>choice); the model's front
                                   end gives others, to predict other networks */
    _dm_link_cost link_env[2];  /* DISTMESH_HOST_LINK, DISTMESH_SITE_LINK: the links between hosts
                                   and between sites as the user states them (alpha 0: unset, the
                                   class's) */
    /* P's bookkeeping (>>peers). dry: transfers record their peers in `used` and move nothing.
       peers (optional): P, the peers of this rank's fixed-peer schedules; a transfer of such a
       schedule (not on_demand) with a peer outside it is DM_ERR_INTERNAL, so a schedule that
       changes without _dm_peers_find is caught by the tests. */
    bool dry, on_demand;
    int rails_force;            /* 0: the model decides the rails (_dm_pick_rails_ring), 1: ring,
                                   2: recursive doubling; set by _dm_peers_find only */
    bool* used;
    bool* peers;
    /* Optional (TCP: connections only where the schedules need them): links may be NULL until
       a transfer needs them. connect makes the links to peers[0..n) by the deadline, or fails
       with its message recorded; poll_fill puts up to cap descriptors that need service while this rank
       blocks (a listener, handshakes in progress) into p; service moves them on without
       blocking, so a rank that connects to this one is answered from any wait; hangup (on
       break) stops answering. */
    dm_status (*connect)(struct _dm_eng* lk, const int* peers, int n, int64_t deadline);
    int (*poll_fill)(struct _dm_eng* lk, struct pollfd* p, int cap);
    void (*service)(struct _dm_eng* lk);
    void (*hangup)(struct _dm_eng* lk);
    /* Optional (TCP, every rank of the group on one host over shared memory): copies n bytes at
       addr in process pid into dst, whole, and returns 0 or an errno. With it a flat ring
       all-reduce moves its all-gather by single copy (>>single copy); single_copy_off: a read
       failed once, and the ring's all-gather runs from then on (every rank knows it at once). */
    int (*read_peer)(struct _dm_eng* lk, int64_t pid, uint64_t addr, void* dst, size_t n);
    bool single_copy_off;
    bool single_copy_no;        /* DISTMESH_SINGLE_COPY=0 on this rank: it offers no buffer */
} _dm_eng;
#define _DM_ENG_SERVICE_FDS 80      /* pfds entries kept for poll_fill */
#define _DM_ENG_XFER_MAX 2          /* transfers run together (_dm_eng_run_n) */

/* Numbers the sites by first appearance into site (rank -> site; site_of NULL: one site) and
   the hosts site by site, each site's by first appearance, into y->host_of; key holds host_of's
   numbers (the callers' arrays may alias y->host_of). A host is a (site, host number) pair,
   so a host number given at two sites is two hosts (the backends refuse that before). */
_DM_PRIVATE void _dm_eng_number_hosts(_dm_layout* y, int W, const int* key, const int* site_of, int* site) {
    int r, q, s;
    y->NS = 0;
    for (r = 0; r < W; r++) {
        for (q = 0; q < r && site_of && site_of[q] != site_of[r]; q++) {}
        site[r] = q < r ? site[q] : y->NS++;
    }
    y->H = 0;
    for (s = 0; s < y->NS; s++) {
        y->site_start[s] = y->H;
        for (r = 0; r < W; r++) {
            if (site[r] != s) continue;
            for (q = 0; q < r && (site[q] != s || key[q] != key[r]); q++) {}
            if (q == r) y->site_of[y->H] = s;
            y->host_of[r] = q < r ? y->host_of[q] : y->H++;
        }
        if (s == 0 || y->H - y->site_start[s] < y->HSmin) y->HSmin = y->H - y->site_start[s];
        if (s == 0 || y->H - y->site_start[s] > y->HSmax) y->HSmax = y->H - y->site_start[s];
    }
    y->site_start[y->NS] = y->H;
}
/* Tells the group which ranks share a host and which hosts a site: host_of[r] is any number
   naming rank r's host (equal numbers, same host; may alias lk->lay.host_of), site_of[r] (NULL:
   one site) any number naming its site, the same for every rank of a host. Numbers the hosts
   site by site (_dm_eng_number_hosts), lists each host's ranks, and puts the flat ring in host
   order (ranks sorted by host, then by rank, as NCCL orders rings), so a ring crosses hosts
   once per host instead of at every hop, and sites once per site. Every rank of the group must
   be given the same layout. */
_DM_PRIVATE void _dm_eng_set_layout(_dm_eng* lk, const int* host_of, const int* site_of) {
    _dm_layout* y = &lk->lay;
    int W = lk->c->size, r, h, p = 0;
    int *key = y->team, *sites = y->team + W, *site = y->team + 2 * W;
    for (r = 0; r < W; r++) key[r] = host_of[r];          /* host_of may be y->host_of */
    for (r = 0; r < W && site_of; r++) sites[r] = site_of[r];
    _dm_eng_number_hosts(y, W, key, site_of ? sites : NULL, site);
    y->Lmin = W;
    y->Lmax = 0;
    y->contiguous = true;
    for (h = 0; h < y->H; h++) {
        y->start[h] = p;
        for (r = 0; r < W; r++)
            if (y->host_of[r] == h) {
                if (p > y->start[h] && y->members[p - 1] != r - 1) y->contiguous = false;
                y->local[r] = p - y->start[h];
                y->members[p] = r;
                lk->order[p] = r;
                lk->slot[r] = p;
                p++;
            }
        if (p - y->start[h] < y->Lmin) y->Lmin = p - y->start[h];
        if (p - y->start[h] > y->Lmax) y->Lmax = p - y->start[h];
    }
    y->start[y->H] = p;
}
/* One site: _dm_eng_set_layout without sites. */
_DM_PRIVATE void _dm_eng_set_hosts(_dm_eng* lk, const int* host_of) { _dm_eng_set_layout(lk, host_of, NULL); }

/* a group's engine made and released: create, split, destroy */
_DM_COLD_BEGIN
/* Scratch, ring order (identity), one host, DISTMESH_ALGO, DISTMESH_COMPRESS and the wait
   policy; links are the backend's to fill. A bad variable is DM_ERR_ENV with its message in
   last_error. */
_DM_PRIVATE dm_status _dm_eng_init(_dm_eng* lk, dm_collective* c, const char* tag, size_t chunk) {
    int r, W = c->size;
    memset(lk, 0, sizeof(*lk));
    lk->c = c;
    lk->tag = tag;
    c->core->eng = lk;
    {
        char err[200];
        if (_dm_eng_env(&lk->algo, &lk->compress_env, lk->link_env, err, sizeof(err)) != DM_OK)
            return _DM_FAIL(c, DM_ERR_ENV, "%s: %s", tag, err);
    }
    chunk = chunk ? chunk : ((size_t)512 << 10);
    lk->chunk = (chunk + 7) / 8 * 8;    /* a whole number of elements of every dtype */
    lk->tmp_size = lk->chunk > _DM_PICK_SMALL_BYTES ? lk->chunk : _DM_PICK_SMALL_BYTES;
    lk->tmp = (unsigned char*)_dm_malloc(&c->allocator, lk->tmp_size);
    lk->links = (_dm_link**)_dm_calloc(&c->allocator, sizeof(_dm_link*) * (size_t)W);
    lk->order = (int*)_dm_malloc(&c->allocator, sizeof(int) * 2 * (size_t)W);
    lk->inbox = (_dm_inbox*)_dm_calloc(&c->allocator, sizeof(_dm_inbox) * (size_t)W);
    lk->sent = (uint64_t*)_dm_calloc(&c->allocator, sizeof(uint64_t) * (size_t)W);
    lk->pfds = (struct pollfd*)_dm_calloc(&c->allocator, sizeof(struct pollfd) * ((size_t)W + 2 * _DM_ENG_XFER_MAX + _DM_ENG_SERVICE_FDS));
    lk->lay.host_of = (int*)_dm_calloc(&c->allocator, sizeof(int) * (13 * (size_t)W + 2));
    if (!lk->tmp || !lk->links || !lk->order || !lk->inbox || !lk->sent || !lk->pfds || !lk->lay.host_of)
        return DM_ERR_OUT_OF_MEMORY;
    lk->slot = lk->order + W;
    for (r = 0; r < W; r++) lk->order[r] = lk->slot[r] = r;
    lk->lay.local = lk->lay.host_of + W;
    lk->lay.members = lk->lay.local + W;
    lk->lay.start = lk->lay.members + W;
    lk->lay.team = lk->lay.start + W + 1;
    lk->lay.site_of = lk->lay.team + 7 * W;
    lk->lay.site_start = lk->lay.site_of + W;
    _dm_eng_set_hosts(lk, lk->lay.host_of);    /* all zeros: one host */
    memset(lk->tmp, 0, lk->tmp_size);   /* fault the scratch in now, not in the first collectives */
    lk->spin_us = _DM_ENG_SPIN_US;
    lk->yield_us = 1000;
    return DM_OK;
}
_DM_PRIVATE void _dm_eng_release(_dm_eng* lk) {
    const dm_allocator* a;
    int r;
    if (!lk->c) return;         /* never initialised (a create that failed early) */
    a = &lk->c->allocator;
    if (lk->links)
        for (r = 0; r < lk->c->size; r++)
            if (lk->links[r]) lk->links[r]->vt->destroy(lk->links[r], a);
    _dm_free(a, lk->links);
    _dm_free(a, lk->order);
    _dm_free(a, lk->tmp);
    _dm_free(a, lk->tmp2);
    lk->tmp2 = NULL;
    _dm_free(a, lk->cbuf);
    lk->cbuf = NULL;
    lk->cbuf_size = 0;
    while (lk->uhead) {
        _dm_umsg* m = lk->uhead;
        lk->uhead = m->next;
        _dm_free(a, m);
    }
    if (lk->inbox)
        for (r = 0; r < lk->c->size; r++) _dm_free(a, lk->inbox[r].msg);
    _dm_free(a, lk->inbox);
    _dm_free(a, lk->sent);
    _dm_free(a, lk->pfds);
    _dm_free(a, lk->lay.host_of);
    _dm_free(a, lk->peers);
    lk->peers = NULL;
    lk->pfds = NULL;
    lk->lay.host_of = NULL;
    lk->links = NULL; lk->order = NULL; lk->tmp = NULL; lk->inbox = NULL; lk->sent = NULL;
}
_DM_COLD_END
/* Waiting policy for `local` ranks of a group on this host: spin only while every rank can
   have a core of its own; with more ranks than cores a spinning rank would steal the time of
   the rank it waits for, so it yields at once. The spin is short even then: on a busy host
   the scheduler now and then runs two ranks of a group on one core, and there every wait
   lasts the whole spin before the peer runs (measured on 2 loaded cores, 8-byte all-reduce
   between 2 ranks: ~103 us per call with a 50 us spin, ~13 us with 5 us); a reply that comes
   quickly at all comes within a few microseconds, over shared memory and loopback sockets. */
/* Whether local ranks sharing this host have a core each (online cores; else they take turns
   on them, and a waiting rank should give its core up soon). */
_DM_PRIVATE bool _dm_eng_core_per_rank(int local) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return local <= (cores < 1 ? 1 : cores);
}
_DM_PRIVATE void _dm_eng_set_policy(_dm_eng* lk, int local) {
    bool own_core = _dm_eng_core_per_rank(local);
    lk->spin_us = own_core ? _DM_ENG_SPIN_US : 0;
    lk->yield_us = own_core ? 1000 : 200;
}

/* The transport a group uses: the name shared by all its links, or "a+b" for a mix. */
_DM_PRIVATE const char* _dm_eng_transport(const _dm_eng* lk, char* buf, size_t cap) {
    const char* first = NULL;
    int r;
    for (r = 0; r < lk->c->size; r++) {
        const char* n;
        if (!lk->links || !lk->links[r]) continue;
        n = lk->links[r]->vt->name;
        if (!first) first = n;
        else if (strcmp(first, n) != 0) {
            snprintf(buf, cap, "%s+%s", strcmp(first, "shm") == 0 ? first : n, strcmp(first, "shm") == 0 ? n : first);
            return buf;
        }
    }
    return first ? first : "self";
}

/* A transfer: a stream of send steps to one peer and a stream of recv steps from another (or
   the same) peer. A send step may be gated by a recv step: it sends only the bytes of that
   step already final, which is how ring steps forward data the moment it is reduced (chunked
   pipelining across steps). A recv step either lands straight in its buffer or, with `own`
   set, is reduced as it arrives: buf = own op received, read in place from links that can
   peek, else through one chunk of scratch. */
typedef struct _dm_sstep {
    const unsigned char* buf;
    size_t len;
    int gate;                   /* recv step whose final bytes bound this step's, or -1 */
    int after_recvs;            /* > 0: starts only once recv steps 0..after_recvs-1 are done */
} _dm_sstep;
typedef struct _dm_rstep {
    unsigned char* buf;
    size_t len;
    const unsigned char* own;   /* reduce mode: buf = own op received (own may equal buf) */
    int after_send;             /* send step that must have sent bytes before buf is written, or -1 */
    int divide;                 /* > 0: dm_divide_local each reduced piece by this (MEAN) */
} _dm_rstep;
typedef struct _dm_xfer {
    const char* op;             /* for messages */
    int speer, rpeer;           /* ranks, -1 for none */
    _dm_sstep* ss;
    int ns;
    _dm_rstep* rs;
    int nr;
    dm_dtype dtype;
    dm_reduce_op rop;
    const _dm_fp* expect;       /* when set, recv step 0 is a fingerprint to compare with it */
    bool inbox;                 /* also read rpeer's inbox (>>engine inbox): into want, else unexpected */
    struct _dm_want* want;      /* a dm_recv: done once its message is in place */
    unsigned char* tmp;         /* scratch for reductions through it (chunk bytes), NULL: lk->tmp;
                                   transfers run together (_dm_eng_run_n) each need their own */
} _dm_xfer;
typedef struct _dm_want {
    int tag;
    dm_dtype dtype;
    size_t count;
    unsigned char* buf;
    bool done;
    bool any;                   /* from any peer (DM_ANY_SOURCE): every connected peer's inbox is read */
    int from;                   /* the peer whose message fills buf (claimed at its header), or -1 */
} _dm_want;

/* Where the two streams stand. */
typedef struct _dm_xstate {
    int si, ri;                 /* current send / recv step */
    size_t so;                  /* bytes of send step si sent */
    size_t rdone;               /* bytes of recv step ri final */
    size_t tfill;               /* bytes of the current scratch piece received */
    size_t spad, rpad;          /* padding bytes sent / skipped after the current steps */
    bool want_out, want_in;     /* the last attempt would have blocked */
} _dm_xstate;
/* Padding after a step of len bytes on link l (see _dm_link_vt.align). */
_DM_PRIVATE size_t _dm_eng_pad(const _dm_link* l, size_t len) {
    size_t a = l->vt->align;
    return a ? (a - len % a) % a : 0;
}

/* >>engine failure  Every failure while communicating breaks the group, and later calls fail at
   once. The rank that sees a failure first tells the others (the backend's notice, the abort
   word of its host, its links shut down); a rank that learns of it from them adopts its status
   and message, so every rank reports the cause. A failed link call and a fingerprint that does
   not match break the group here too. */

/* The failure itself is cold; looking for one (_dm_eng_adopt_abort, _dm_eng_check_broken) is not. */
_DM_COLD_BEGIN
/* Posts the first failure into the shared abort word and wakes every same-host rank. */
_DM_PRIVATE void _dm_eng_post_abort_msg(_dm_eng* lk, dm_status st, const char* msg) {
    int32_t none = 0;
    int r;
    if (!lk->abort) return;
    if (!__atomic_compare_exchange_n(&lk->abort->status, &none, 1, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return;
    lk->abort->rank = lk->c->rank;
    _dm_copy_name(lk->abort->msg, sizeof(lk->abort->msg), msg);
    __atomic_store_n(&lk->abort->status, (int32_t)st, __ATOMIC_RELEASE);
    for (r = 0; r < lk->nbells; r++) _dm_bell_ring(&lk->bells[r], lk->bell_ops);
}
_DM_PRIVATE void _dm_eng_post_abort(_dm_eng* lk, dm_status st) { _dm_eng_post_abort_msg(lk, st, _dm_errbuf(lk->c)); }
/* dm_abort's part on the aborting thread (a backend's interrupt slot calls it): the notice and
   the abort word go out before the backend hangs up, so a peer that finds this rank gone reads
   why. Both are safe beside the owner's thread (the notice channel locks; the word is CAS'd);
   the owner breaks the group itself when it wakes (_dm_eng_adopt_abort). */
_DM_PRIVATE void _dm_eng_abort_notify(_dm_eng* lk) {
    if (__atomic_load_n(&lk->c->core->aborted, __ATOMIC_ACQUIRE) != 2) return;
    if (lk->notice_post) lk->notice_post(lk, DM_ERR_ABORTED, lk->c->core->abort_msg);
    _dm_eng_post_abort_msg(lk, DM_ERR_ABORTED, lk->c->core->abort_msg);
    if (lk->bell) _dm_bell_ring(lk->bell, lk->bell_ops);     /* the owner may sleep on its bell */
}
/* Marks the group broken with st (the message is already in last_error) and tells the others:
   the backend's notice first, then the abort word, then every link is shut down, so a peer
   blocked on this rank fails at once and finds the cause waiting (timeouts included: the
   group is broken either way, and the others learn why now, not at their own deadlines). The
   order matters where links are sparse: a rank that learns of the failure second-hand (the
   abort word, a link closed by a rank that adopted it) must find the notice already there. */
_DM_PRIVATE dm_status _dm_eng_break(_dm_eng* lk, dm_status st) {
    int r;
    if (lk->broken != DM_OK) return st;
    lk->broken = st;
    _dm_copy_name(lk->broken_msg, sizeof(lk->broken_msg), _dm_errbuf(lk->c));
    if (!lk->adopting && lk->notice_post) lk->notice_post(lk, st, _dm_errbuf(lk->c));
    _dm_eng_post_abort(lk, st);
    if (lk->hangup) lk->hangup(lk);
    for (r = 0; r < lk->c->size; r++)
        if (lk->links[r] && lk->links[r]->vt->shutdown) lk->links[r]->vt->shutdown(lk->links[r]);
    return st;
}
/* This rank fails with another rank's status and message. */
_DM_PRIVATE dm_status _dm_eng_adopt(_dm_eng* lk, const char* op, dm_status st, int rank, const char* msg) {
    _DM_FAIL(lk->c, st, "%s: %s #%llu failed because rank %d failed: %s", lk->tag, op,
             (unsigned long long)lk->c->seq, rank, msg);
    lk->adopting = true;
    _dm_eng_break(lk, st);
    lk->adopting = false;
    return st;
}
/* A peer hung up: if some rank posted a notice, its cause is this rank's too. */
_DM_PRIVATE dm_status _dm_eng_adopt_notice(_dm_eng* lk, const char* op) {
    char msg[DM_LAST_ERROR_SIZE];
    int rank = -1;
    dm_status st = lk->notice_read ? lk->notice_read(lk, &rank, msg, sizeof(msg)) : DM_OK;
    if (st == DM_OK || rank == lk->c->rank) return DM_OK;
    return _dm_eng_adopt(lk, op, st, rank, msg);
}
_DM_COLD_END
/* dm_abort was called on this rank (the group breaks with its message), or another same-host
   rank failed first (the shared abort word). */
_DM_PRIVATE dm_status _dm_eng_adopt_abort(_dm_eng* lk, const char* op) {
    int32_t st;
    if (__builtin_expect(__atomic_load_n(&lk->c->core->aborted, __ATOMIC_ACQUIRE) == 2, 0) && lk->broken == DM_OK) {
        _DM_FAIL(lk->c, DM_ERR_ABORTED, "%s: %s #%llu: %s", lk->tag, op, (unsigned long long)lk->c->seq,
                 lk->c->core->abort_msg);
        lk->adopting = true;    /* dm_abort's thread posted the notice (_dm_eng_abort_notify) */
        _dm_eng_break(lk, DM_ERR_ABORTED);
        lk->adopting = false;
        return DM_ERR_ABORTED;
    }
    st = lk->abort ? __atomic_load_n(&lk->abort->status, __ATOMIC_ACQUIRE) : 0;
    if (st >= 0) return DM_OK;
    return _dm_eng_adopt(lk, op, (dm_status)st, lk->abort->rank, lk->abort->msg);
}
/* Later calls fail at once: DM_ERR_PEER_LOST when a peer is gone (the caller's question is "is
   my job still whole?"), else DM_ERR_ABORTED. */
_DM_PRIVATE dm_status _dm_eng_check_broken(_dm_eng* lk, const char* op) {
    dm_status st;
    if (lk->broken == DM_OK) return _dm_eng_adopt_abort(lk, op);   /* this call fails with the cause */
    st = lk->broken == DM_ERR_PEER_LOST ? DM_ERR_PEER_LOST : DM_ERR_ABORTED;
    return _DM_FAIL(lk->c, st, "%s: %s #%llu: the collective is broken by an earlier failure (%s): %s",
                    lk->tag, op, (unsigned long long)lk->c->seq, dm_status_name(lk->broken), lk->broken_msg);
}

_DM_PRIVATE dm_status _dm_eng_io_fail(_dm_eng* lk, const _dm_xfer* x, int peer, bool sending, int err) {
    bool lost = (err == 0 || err == EPIPE || err == ECONNRESET || err == ECONNABORTED || err == ENOTCONN ||
                 err == ESHUTDOWN);
    dm_status st;
    if (_dm_eng_adopt_abort(lk, x->op) != DM_OK) return lk->broken;
    if (lost && _dm_eng_adopt_notice(lk, x->op) != DM_OK) return lk->broken;
    if (lost)
        st = _DM_FAIL(lk->c, DM_ERR_PEER_LOST, "%s: %s #%llu: rank %d (%s) %s while %s", lk->tag, x->op,
                      (unsigned long long)lk->c->seq, peer, lk->links[peer]->where,
                      err == 0 ? "closed the connection (EOF)" : strerror(err),
                      sending ? "sending to it" : "receiving from it");
    else if (err == EBADMSG)    /* an encrypted link's record failed (distmesh_socket.h >>socket aead) */
        st = _DM_FAIL(lk->c, DM_ERR_PROTOCOL, "%s: %s #%llu: %s rank %d (%s) failed: a record failed its "
                      "authentication (tampered, replayed, reordered or dropped on the way)", lk->tag, x->op,
                      (unsigned long long)lk->c->seq, sending ? "send to" : "recv from", peer, lk->links[peer]->where);
    else
        st = _DM_FAIL(lk->c, DM_ERR_NETWORK, "%s: %s #%llu: %s rank %d (%s) failed (%s)", lk->tag, x->op,
                      (unsigned long long)lk->c->seq, sending ? "send to" : "recv from", peer,
                      lk->links[peer]->where, strerror(err));
    return _dm_eng_break(lk, st);
}

_DM_PRIVATE dm_status _dm_eng_check_fp(_dm_eng* lk, const _dm_xfer* x, const unsigned char* wire) {
    _dm_fp got;
    if (_dm_get32(wire) != _DM_FP_MAGIC) {
        _DM_FAIL(lk->c, DM_ERR_PROTOCOL, "%s: %s #%llu: rank %d (%s) sent malformed bytes (bad "
                 "fingerprint magic 0x%08x)", lk->tag, x->op, (unsigned long long)lk->c->seq, x->rpeer,
                 lk->links[x->rpeer]->where, (unsigned)_dm_get32(wire));
        return _dm_eng_break(lk, DM_ERR_PROTOCOL);
    }
    _dm_fp_decode(wire, &got);
    if (_DM_TRACED(lk->c)) _dm_trace_peer_seen(lk->c, x->rpeer, got.kind, got.seq);
    if (_dm_fp_equal(&got, x->expect)) return DM_OK;
    _dm_fp_mismatch(lk->c, lk->tag, lk->c->rank, x->expect, x->rpeer, &got);
    return _dm_eng_break(lk, DM_ERR_MISMATCH);
}

/* >>engine inbox  Point-to-point messages share each link's stream with the collectives,
   between them: a sender is never inside a collective on that link when it sends one.
   Receivers read them at boundaries through the inbox, match them to a dm_recv (x->want) by
   tag, in arrival order, or keep them as unexpected until one asks. */

/* want got message fp from peer: same dtype and count, or DM_ERR_MISMATCH naming both. */
_DM_PRIVATE dm_status _dm_eng_want_check(_dm_eng* lk, const _dm_xfer* x, int peer, const _dm_fp* got) {
    _dm_fp mine;
    const _dm_want* w = x->want;
    if (got->dtype == (int)w->dtype && got->count == (uint64_t)w->count) return DM_OK;
    _dm_fp_make(&mine, lk->c, _DM_K_RECV, (int)w->dtype, -1, w->tag, w->count);
    mine.seq = got->seq;
    _dm_fp_mismatch(lk->c, lk->tag, lk->c->rank, &mine, peer, got);
    return _dm_eng_break(lk, DM_ERR_MISMATCH);
}
/* Whether a message from peer with tag goes to the dm_recv x waits for: its peer (or any),
   its tag, and no other peer's message already filling its buffer. */
_DM_PRIVATE bool _dm_eng_want_takes(const _dm_xfer* x, int peer, int tag) {
    const _dm_want* w = x->want;
    return w && !w->done && w->from < 0 && (w->any || x->rpeer == peer) && tag == w->tag;
}
/* The first unexpected message from peer (peer < 0: from any peer, in the order this rank read
   them) with want's tag, copied into its buffer and freed: DM_OK with want->done and
   want->from set, DM_OK without them when there is none, or the mismatch. */
_DM_PRIVATE dm_status _dm_eng_take_unexpected(_dm_eng* lk, const _dm_xfer* x, int peer) {
    _dm_umsg **p = &lk->uhead, *m = NULL, *prev = NULL;
    for (; *p; prev = *p, p = &(*p)->next)
        if ((peer < 0 || (*p)->peer == peer) && (*p)->fp.root == x->want->tag) { m = *p; break; }
    if (!m) return DM_OK;
    peer = m->peer;
    _DM_TRY(_dm_eng_want_check(lk, x, peer, &m->fp));
    *p = m->next;
    if (lk->utail == m) lk->utail = prev;
    lk->ubytes -= m->bytes;
    if (m->bytes) memcpy(x->want->buf, m->data, m->bytes);
    _dm_free(&lk->c->allocator, m);
    x->want->from = peer;
    x->want->done = true;
    return DM_OK;
}
/* A whole header is in: a collective's fingerprint waits for its collective; a message's
   payload goes to the dm_recv waiting for its tag, else into a new unexpected message. */
_DM_PRIVATE dm_status _dm_eng_inbox_header(_dm_eng* lk, const _dm_xfer* x, int peer) {
    _dm_inbox* in = &lk->inbox[peer];
    _dm_fp fp;
    size_t bytes;
    in->hfill = 0;
    if (_dm_get32(in->hdr) != _DM_FP_MAGIC) {
        _DM_FAIL(lk->c, DM_ERR_PROTOCOL, "%s: %s: rank %d (%s) sent malformed bytes (bad header magic 0x%08x)",
                 lk->tag, x->op, peer, lk->links[peer]->where, (unsigned)_dm_get32(in->hdr));
        return _dm_eng_break(lk, DM_ERR_PROTOCOL);
    }
    _dm_fp_decode(in->hdr, &fp);
    if (fp.kind != _DM_K_SEND) { in->fp_ready = true; return DM_OK; }
    if (fp.dtype < 0 || fp.dtype >= DM_DTYPE_COUNT || fp.count > SIZE_MAX / 8) {
        _DM_FAIL(lk->c, DM_ERR_PROTOCOL, "%s: %s: rank %d (%s) sent a message header with dtype %d, count %llu",
                 lk->tag, x->op, peer, lk->links[peer]->where, fp.dtype, (unsigned long long)fp.count);
        return _dm_eng_break(lk, DM_ERR_PROTOCOL);
    }
    bytes = (size_t)fp.count * dm_dtype_size((dm_dtype)fp.dtype);
    in->payload = true;
    in->len = bytes;
    in->fill = in->padfill = 0;
    in->pad = _dm_eng_pad(lk->links[peer], bytes);
    if (_dm_eng_want_takes(x, peer, fp.root)) {
        _DM_TRY(_dm_eng_want_check(lk, x, peer, &fp));
        x->want->from = peer;   /* claimed: another peer's message with the tag is kept meanwhile */
        in->msg = NULL;
        in->dst = x->want->buf;
        return DM_OK;
    }
    if (bytes > _dm_object_limit(lk->c) - (lk->ubytes < _dm_object_limit(lk->c) ? lk->ubytes : _dm_object_limit(lk->c))) {
        _DM_FAIL(lk->c, DM_ERR_PROTOCOL, "%s: %s: rank %d sent a message of %zu bytes (tag %d) that no recv has "
                 "asked for yet, beyond the %llu bytes kept waiting (DISTMESH_MAX_OBJECT_BYTES)", lk->tag, x->op,
                 peer, bytes, fp.root, (unsigned long long)_dm_object_limit(lk->c));
        return _dm_eng_break(lk, DM_ERR_PROTOCOL);
    }
    in->msg = (_dm_umsg*)_dm_malloc(&lk->c->allocator, sizeof(_dm_umsg) + bytes);
    if (!in->msg) {
        _DM_FAIL(lk->c, DM_ERR_OUT_OF_MEMORY, "%s: %s: no memory to keep a message of %zu bytes from rank %d",
                 lk->tag, x->op, bytes, peer);
        return _dm_eng_break(lk, DM_ERR_OUT_OF_MEMORY);
    }
    in->msg->next = NULL;
    in->msg->peer = peer;
    in->msg->fp = fp;
    in->msg->bytes = bytes;
    in->msg->data = (unsigned char*)(in->msg + 1);
    in->dst = in->msg->data;
    lk->ubytes += bytes;
    return DM_OK;
}
/* A whole payload is in: the dm_recv is done, or the message joins the unexpected ones (and
   is taken at once if the waiting dm_recv wants its tag: nothing older with it can wait). */
_DM_PRIVATE dm_status _dm_eng_inbox_message(_dm_eng* lk, const _dm_xfer* x, int peer) {
    _dm_inbox* in = &lk->inbox[peer];
    _dm_umsg* m = in->msg;
    in->payload = false;
    in->msg = NULL;
    if (!m) { x->want->done = true; return DM_OK; }
    if (lk->utail) lk->utail->next = m; else lk->uhead = m;
    lk->utail = m;
    if (_dm_eng_want_takes(x, peer, m->fp.root)) return _dm_eng_take_unexpected(lk, x, peer);
    return DM_OK;
}
/* Reads peer's inbox as far as it can: until x->want is done, the link is empty, or the next
   collective's fingerprint is in (which a dm_recv cannot wait past: that peer will send
   nothing more before this rank joins the collective, so it fails with DM_ERR_MISMATCH; a
   dm_recv from any source leaves that peer and reads the others). */
_DM_PRIVATE dm_status _dm_eng_pump_inbox(_dm_eng* lk, const _dm_xfer* x, _dm_xstate* s, int peer, bool* progress) {
    _dm_inbox* in = &lk->inbox[peer];
    _dm_link* l = lk->links[peer];
    for (;;) {
        unsigned char sink[8];
        ptrdiff_t k;
        int err = 0;
        if (x->want && x->want->done) return DM_OK;
        if (in->fp_ready) {
            _dm_fp theirs, mine;
            if (!x->want || x->want->any) return DM_OK;
            _dm_fp_decode(in->hdr, &theirs);
            _dm_fp_make(&mine, lk->c, _DM_K_RECV, (int)x->want->dtype, -1, x->want->tag, x->want->count);
            mine.seq = lk->c->seq;
            _dm_fp_mismatch(lk->c, lk->tag, lk->c->rank, &mine, peer, &theirs);
            return _dm_eng_break(lk, DM_ERR_MISMATCH);
        }
        if (!in->payload) k = l->vt->recv(l, in->hdr + in->hfill, 32 - in->hfill, &err);
        else if (in->fill < in->len) {
            size_t n = in->len - in->fill < _DM_ENG_IO_MAX ? in->len - in->fill : _DM_ENG_IO_MAX;
            k = l->vt->recv(l, in->dst + in->fill, n, &err);
        } else if (in->padfill < in->pad) k = l->vt->recv(l, sink, in->pad - in->padfill, &err);
        else { _DM_TRY(_dm_eng_inbox_message(lk, x, peer)); *progress = true; continue; }
        if (k == 0) { s->want_in = true; return DM_OK; }
        if (k < 0) return _dm_eng_io_fail(lk, x, peer, false, err);
        *progress = true;
        if (!in->payload) {
            in->hfill += (size_t)k;
            if (in->hfill == 32) _DM_TRY(_dm_eng_inbox_header(lk, x, peer));
        } else if (in->fill < in->len) in->fill += (size_t)k;
        else in->padfill += (size_t)k;
    }
}

/* A dm_recv from any source reads every connected peer's inbox in turn, until one message
   with its tag is in (links made meanwhile, by a peer that connects to this rank on demand,
   are read from the next round on). */
_DM_PRIVATE dm_status _dm_eng_pump_any(_dm_eng* lk, const _dm_xfer* x, _dm_xstate* s, bool* progress) {
    int p;
    for (p = 0; p < lk->c->size && !x->want->done; p++)
        if (p != lk->c->rank && lk->links[p]) _DM_TRY(_dm_eng_pump_inbox(lk, x, s, p, progress));
    if (!x->want->done) s->want_in = true;      /* waits for bytes, or for a peer to connect */
    return DM_OK;
}
/* A send that cannot move reads what every other peer sent too: in a ring of large sends
   (each rank sending to the next before receiving from the previous) every rank's link fills,
   and only the receivers' reading frees them. */
_DM_PRIVATE dm_status _dm_eng_drain_others(_dm_eng* lk, const _dm_xfer* x, _dm_xstate* s, bool* progress) {
    int p;
    for (p = 0; p < lk->c->size; p++)
        if (p != x->rpeer && lk->links[p]) _DM_TRY(_dm_eng_pump_inbox(lk, x, s, p, progress));
    return DM_OK;
}

/* >>engine pump  Moving one transfer's bytes without blocking: send steps as far as their
   gates allow (every ready step in one call on links with sendv), recv steps straight into
   place or reduced as they arrive (in place from links that can peek, else through scratch),
   and the padding after each step (_dm_eng_pad). */

/* How many bytes of send step i (at or after the current one) may go now: none before its
   after_recvs are in, and no more of a gated step than its recv step has made final. */
_DM_PRIVATE size_t _dm_eng_send_limit(const _dm_xfer* x, const _dm_xstate* s, int i) {
    const _dm_sstep* st = &x->ss[i];
    size_t limit = st->len;
    if (s->ri < st->after_recvs) return 0;
    if (st->gate >= 0) {
        size_t fin = st->gate < s->ri ? x->rs[st->gate].len : st->gate == s->ri ? s->rdone : 0;
        if (fin < limit) limit = fin;
    }
    return limit;
}
/* The pieces that may go now, from the current send step on: each step's ready bytes and its
   padding, up to the first step not wholly ready, _DM_LINK_IOV_MAX pieces, or 64 KiB gathered
   (beyond that a system call per step costs nothing worth saving). */
_DM_PRIVATE int _dm_eng_gather(const _dm_xfer* x, const _dm_xstate* s, const _dm_link* l, _dm_iov* iov) {
    static const unsigned char zeros[8] = { 0 };
    size_t total = 0;
    int n = 0, i;
    for (i = s->si; i < x->ns && n < _DM_LINK_IOV_MAX - 1 && total < ((size_t)64 << 10); i++) {
        const _dm_sstep* st = &x->ss[i];
        size_t from = i == s->si ? s->so : 0, limit = _dm_eng_send_limit(x, s, i);
        size_t pad = _dm_eng_pad(l, st->len) - (i == s->si ? s->spad : 0);
        if (from < limit) {
            size_t len = limit - from < _DM_ENG_IO_MAX ? limit - from : _DM_ENG_IO_MAX;
            iov[n].buf = st->buf + from; iov[n].len = len; n++;
            total += len;
            if (from + len < st->len) break;
        } else if (from < st->len) break;
        if (pad) { iov[n].buf = zeros; iov[n].len = pad; n++; total += pad; }
    }
    return n;
}
/* k bytes of the gathered pieces went: the send state moves past them. */
_DM_PRIVATE void _dm_eng_sent(const _dm_xfer* x, _dm_xstate* s, const _dm_link* l, size_t k) {
    while (k > 0) {
        const _dm_sstep* st = &x->ss[s->si];
        size_t pad = _dm_eng_pad(l, st->len), d;
        if (s->so < st->len) { d = st->len - s->so < k ? st->len - s->so : k; s->so += d; k -= d; }
        else if (s->spad < pad) { d = pad - s->spad < k ? pad - s->spad : k; s->spad += d; k -= d; }
        else { s->si++; s->so = s->spad = 0; }
    }
}
/* Links with sendv: every ready step in one call. */
_DM_PRIVATE dm_status _dm_eng_pump_sendv(_dm_eng* lk, const _dm_xfer* x, _dm_xstate* s, _dm_link* l, bool* progress) {
    for (;;) {
        _dm_iov iov[_DM_LINK_IOV_MAX];
        ptrdiff_t k;
        int n, err = 0;
        while (s->si < x->ns && s->so == x->ss[s->si].len && s->spad == _dm_eng_pad(l, x->ss[s->si].len)) {
            s->si++; s->so = s->spad = 0; *progress = true;
        }
        if (s->si == x->ns || (n = _dm_eng_gather(x, s, l, iov)) == 0) return DM_OK;
        k = l->vt->sendv(l, iov, n, &err);
        if (k > 0) { _dm_eng_sent(x, s, l, (size_t)k); *progress = true; continue; }
        if (k == 0) { s->want_out = true; return DM_OK; }
        return _dm_eng_io_fail(lk, x, x->speer, true, err);
    }
}

/* Sends as far as the gates allow, until the link is full. */
_DM_PRIVATE dm_status _dm_eng_pump_send(_dm_eng* lk, const _dm_xfer* x, _dm_xstate* s, bool* progress) {
    _dm_link* l = x->speer >= 0 ? lk->links[x->speer] : NULL;
    static const unsigned char zeros[8] = { 0 };
    if (l && l->vt->sendv) return _dm_eng_pump_sendv(lk, x, s, l, progress);
    while (s->si < x->ns) {
        const _dm_sstep* st = &x->ss[s->si];
        size_t limit, n;
        ptrdiff_t k;
        int err = 0;
        if (s->so == st->len) {
            size_t pad = _dm_eng_pad(l, st->len);
            if (s->spad < pad) {
                k = l->vt->send(l, zeros, pad - s->spad, &err);
                if (k > 0) { s->spad += (size_t)k; *progress = true; continue; }
                if (k == 0) { s->want_out = true; break; }
                return _dm_eng_io_fail(lk, x, x->speer, true, err);
            }
            s->si++; s->so = s->spad = 0; *progress = true;
            continue;
        }
        if (s->ri < st->after_recvs) break;
        limit = _dm_eng_send_limit(x, s, s->si);
        if (s->so >= limit) break;
        n = limit - s->so < _DM_ENG_IO_MAX ? limit - s->so : _DM_ENG_IO_MAX;
        k = l->vt->send(l, st->buf + s->so, n, &err);
        if (k > 0) { s->so += (size_t)k; *progress = true; continue; }
        if (k == 0) { s->want_out = true; break; }
        return _dm_eng_io_fail(lk, x, x->speer, true, err);
    }
    return DM_OK;
}

/* How many bytes of recv step r may be written at offset `from`: all, unless its after_send
   step has not sent them yet (it reads the same buffer). */
_DM_PRIVATE size_t _dm_eng_writable(const _dm_xstate* s, const _dm_rstep* r, size_t from) {
    size_t sent;
    if (r->after_send < 0 || r->after_send < s->si) return r->len - from;
    sent = r->after_send == s->si ? s->so : 0;
    return sent > from ? sent - from : 0;
}
/* One reduced piece of recv step r landed: out = own op piece (then / divide for MEAN). */
_DM_PRIVATE void _dm_eng_reduce_piece(const _dm_xfer* x, const _dm_rstep* r, size_t at, const unsigned char* piece,
                                      size_t bytes) {
    size_t esize = dm_dtype_size(x->dtype);
    unsigned char* out = r->buf + at;
    if (r->own + at != out) memcpy(out, r->own + at, bytes);
    dm_reduce_local(x->dtype, x->rop, out, piece, bytes / esize);
    if (r->divide > 0) dm_divide_local(x->dtype, out, bytes / esize, r->divide);
}
/* Reduces straight from a link that can peek. Returns false when the link has fewer readable
   contiguous bytes than one element (an element split at the ring's end goes through scratch). */
_DM_PRIVATE bool _dm_eng_reduce_in_place(const _dm_xfer* x, _dm_xstate* s, _dm_link* l, const _dm_rstep* r,
                                         bool* progress) {
    size_t esize = dm_dtype_size(x->dtype), n, room;
    const unsigned char* p = l->vt->peek(l, &n);
    if (((uintptr_t)p & (esize - 1)) != 0) return false;   /* links that peek pad to 8 (align) */
    if (n > r->len - s->rdone) n = r->len - s->rdone;
    room = _dm_eng_writable(s, r, s->rdone);
    if (n > room) n = room;
    n -= n % esize;
    if (n == 0) return false;
    _dm_eng_reduce_piece(x, r, s->rdone, p, n);
    l->vt->consume(l, n);
    s->rdone += n;
    *progress = true;
    return true;
}

/* Receives: straight into place, or reduced as it arrives. */
_DM_PRIVATE dm_status _dm_eng_pump_recv(_dm_eng* lk, const _dm_xfer* x, _dm_xstate* s, bool* progress) {
    _dm_link* l = x->rpeer >= 0 ? lk->links[x->rpeer] : NULL;
    unsigned char* tmp = x->tmp ? x->tmp : lk->tmp;
    size_t esize = dm_dtype_size(x->dtype);
    while (s->ri < x->nr) {
        const _dm_rstep* r = &x->rs[s->ri];
        unsigned char* dst;
        size_t want;
        ptrdiff_t k;
        int err = 0;
        if (s->rdone == r->len) {
            size_t pad = _dm_eng_pad(l, r->len);
            if (s->rpad < pad) {
                unsigned char sink[8];
                k = l->vt->recv(l, sink, pad - s->rpad, &err);
                if (k > 0) { s->rpad += (size_t)k; *progress = true; continue; }
                if (k == 0) { s->want_in = true; break; }
                return _dm_eng_io_fail(lk, x, x->rpeer, false, err);
            }
            if (s->ri == 0 && x->expect) _DM_TRY(_dm_eng_check_fp(lk, x, r->buf));
            s->ri++; s->rdone = s->tfill = s->rpad = 0; *progress = true;
            continue;
        }
        if (s->ri == 0 && x->expect && s->rdone == 0) {   /* the fingerprint comes through the inbox */
            _dm_inbox* in = &lk->inbox[x->rpeer];
            if (!in->fp_ready) _DM_TRY(_dm_eng_pump_inbox(lk, x, s, x->rpeer, progress));
            if (!in->fp_ready) break;
            memcpy(r->buf, in->hdr, 32);
            in->fp_ready = false;
            s->rdone = 32;
            *progress = true;
            continue;
        }
        if (!r->own) {
            dst = r->buf + s->rdone; want = r->len - s->rdone;
        } else {
            size_t clen;
            if (l->vt->peek && s->tfill == 0 && _dm_eng_reduce_in_place(x, s, l, r, progress)) continue;
            /* through scratch: a chunk, or one element where peeking cannot serve it */
            clen = l->vt->peek ? esize : lk->chunk;
            if (clen > r->len - s->rdone) clen = r->len - s->rdone;
            if (s->tfill == clen) {
                if (_dm_eng_writable(s, r, s->rdone) < clen) break;
                _dm_eng_reduce_piece(x, r, s->rdone, tmp, clen);
                s->rdone += clen; s->tfill = 0; *progress = true;
                continue;
            }
            dst = tmp + s->tfill; want = clen - s->tfill;
        }
        if (want > _DM_ENG_IO_MAX) want = _DM_ENG_IO_MAX;
        k = l->vt->recv(l, dst, want, &err);
        if (k > 0) {
            if (r->own) s->tfill += (size_t)k; else s->rdone += (size_t)k;
            *progress = true;
            continue;
        }
        if (k == 0) { s->want_in = true; break; }
        return _dm_eng_io_fail(lk, x, x->rpeer, false, err);
    }
    return DM_OK;
}

/* >>engine loop  Driving transfers to the end (_dm_eng_run_n): each round pumps every transfer;
   with nothing to move, a wait spins, then yields, then blocks (poll on sockets, the bell on
   memory links) under the collective's deadline. Before a transfer starts, its peers are
   checked against P (>>peers) and their links made where missing (the backend's connect). */

_DM_PRIVATE int64_t _dm_now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}
_DM_PRIVATE void _dm_cpu_relax(void) {
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
    __builtin_ia32_pause();
#elif (defined(__GNUC__) || defined(__clang__)) && defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

#if defined(POLLRDHUP)
#define _DM_POLLRDHUP POLLRDHUP
#elif defined(__linux__) && !defined(__sparc__)
#define _DM_POLLRDHUP 0x2000        /* Linux's value (GNU-only in glibc's <poll.h>; >>libc) */
#else
#define _DM_POLLRDHUP 0
#endif
/* A rank these transfers wait on over memory that last waited on this rank's core, or -1. A
   busy host now and then runs two ranks of one group on one core; a spin there only keeps the
   peer off the core, so the wait goes straight on to yielding it. */
_DM_PRIVATE int _dm_eng_peer_beside(_dm_eng* lk, const _dm_xfer* xs, int n) {
#if defined(_DM_HAS_SCHED_GETCPU)
    int cpu = sched_getcpu() + 1, j, k;
    if (!lk->bell || cpu <= 0) return -1;
    if (__atomic_load_n(&lk->bell->cpu, __ATOMIC_RELAXED) != cpu) __atomic_store_n(&lk->bell->cpu, cpu, __ATOMIC_RELAXED);
    for (j = 0; j < n; j++)
        for (k = 0; k < 2; k++) {
            int peer = k ? xs[j].speer : xs[j].rpeer;
            _dm_link* l = peer >= 0 ? lk->links[peer] : NULL;
            if (l && l->fd < 0 && __atomic_load_n(&((_dm_memlink*)l)->peer_bell->cpu, __ATOMIC_RELAXED) == cpu) return peer;
        }
#else
    (void)lk; (void)xs; (void)n;
#endif
    return -1;
}
/* Two ranks that each have a core of their own (spin_us > 0) but run on one: the slow mode of
   some launches. Once the scheduler has put the two on one core, each wait yields the core to
   the other, every message costs two context switches (at 4 KiB between two ranks: 3.3-3.7 us
   a call instead of 1.1-1.2, the whole launch long), and the scheduler does not part them,
   because they always ran a moment ago (cache hot). So after _DM_ENG_BESIDE_LOOKS looks in a
   row that found the peer on this core, the higher of the two ranks moves off it: its affinity
   mask without this core, which migrates it at once, then the mask it had, so the placement
   stays the scheduler's (and the caller's: a rank pinned to one core, or to the peer's, stays).
   At most once per _DM_ENG_MOVE_GAP_US, so a host that truly lacks the cores does not thrash. */
#define _DM_ENG_BESIDE_LOOKS 64
#define _DM_ENG_MOVE_GAP_US  50000
_DM_PRIVATE void _dm_eng_move_off(_dm_eng* lk, int peer, int64_t now) {
#if defined(_DM_HAS_SCHED_GETCPU) && defined(SYS_sched_getaffinity) && defined(SYS_sched_setaffinity)
    unsigned long mask[16], off[16];    /* 1024 cpus; a larger host keeps its placement */
    const int bits = (int)(8 * sizeof(unsigned long));
    long n;
    int cpu, w, others = 0;
    if (peer < 0) { lk->beside_looks = 0; return; }
    if (++lk->beside_looks < _DM_ENG_BESIDE_LOOKS || lk->c->rank < peer) return;
    if (lk->moved_us != 0 && now - lk->moved_us < _DM_ENG_MOVE_GAP_US) return;
    lk->beside_looks = 0;
    lk->moved_us = now;
    cpu = sched_getcpu();
    memset(mask, 0, sizeof(mask));
    n = syscall(SYS_sched_getaffinity, 0, sizeof(mask), mask);  /* this thread's; bytes copied */
    if (n <= 0 || cpu < 0 || cpu >= (int)(8 * (size_t)n)) return;
    memcpy(off, mask, sizeof(off));
    off[cpu / bits] &= ~(1ul << (cpu % bits));
    for (w = 0; w < (int)((size_t)n / sizeof(unsigned long)); w++) others |= off[w] != 0;
    if (!others) return;                                        /* pinned here: stay */
    if (syscall(SYS_sched_setaffinity, 0, (size_t)n, off) == 0)
        (void)syscall(SYS_sched_setaffinity, 0, (size_t)n, mask);
#else
    (void)lk; (void)peer; (void)now;
#endif
}
_DM_PRIVATE int _dm_eng_fd(_dm_link* l, bool out) { return l->vt->pollfd ? l->vt->pollfd(l, out) : l->fd; }
/* Whether transfer x has moved everything (and, for a dm_recv, has its message). */
_DM_PRIVATE bool _dm_eng_xfer_done(const _dm_xfer* x, const _dm_xstate* s) {
    return s->si == x->ns && s->ri == x->nr && (!x->want || x->want->done);
}
/* The pollfds one waiting transfer needs, appended at p[*np]; *memory is set when it waits on
   a memory link. Returns the index of its send peer's hang-up entry, or -1. */
_DM_PRIVATE int _dm_eng_poll_xfer(_dm_eng* lk, const _dm_xfer* x, const _dm_xstate* s, struct pollfd* p, int* np,
                                  bool* memory) {
    _dm_link* sl = x->speer >= 0 && s->si < x->ns ? lk->links[x->speer] : NULL;
    _dm_link* rl = x->rpeer >= 0 && (s->ri < x->nr || x->inbox) ? lk->links[x->rpeer] : NULL;
    int hup = -1, k;
    if ((sl && sl->fd < 0) || (rl && rl->fd < 0)) *memory = true;
    if (sl && rl && sl == rl && sl->fd >= 0 && _dm_eng_fd(sl, true) == _dm_eng_fd(rl, false)) {
        p[*np].fd = _dm_eng_fd(sl, true);
        p[*np].events = (short)((s->want_out ? POLLOUT : 0) | (s->want_in ? POLLIN : 0)); (*np)++;
    } else {
        /* the send peer's hang-up (while we still owe it bytes; once done it may leave): RDHUP,
           which bytes it sends us do not raise */
        if (sl && sl->fd >= 0) {
            hup = *np;
            p[*np].fd = _dm_eng_fd(sl, true); p[*np].events = (short)(_DM_POLLRDHUP | (s->want_out ? POLLOUT : 0)); (*np)++;
        }
        if (rl && rl->fd >= 0 && s->want_in) { p[*np].fd = _dm_eng_fd(rl, false); p[*np].events = POLLIN; (*np)++; }
    }
    /* a blocked send also waits for the other peers' bytes; a recv from any source for all */
    if (x->inbox && (x->want ? x->want->any : sl != NULL))
        for (k = 0; k < lk->c->size; k++) {
            _dm_link* o = lk->links[k];
            if (!o || k == x->rpeer || lk->inbox[k].fp_ready) continue;
            if (o->fd >= 0) { p[*np].fd = _dm_eng_fd(o, false); p[*np].events = POLLIN; (*np)++; }
            else *memory = true;
        }
    return hup;
}
/* The blocking phase of a wait on n transfers: sleep until a link may move, a slice passes, or
   the deadline. Sockets sleep in poll(); memory links on this rank's bell, waking every 50 ms
   to ask whether their peers still live (a backend may ring the bell when one dies: the TCP
   backend's shm watcher does); a mix polls the sockets briefly and goes round again. Once a
   peer was seen gone, the next look comes at once, without sleeping. */
_DM_PRIVATE dm_status _dm_eng_block(_dm_eng* lk, const _dm_xfer* xs, const _dm_xstate* s, int n, uint32_t seen,
                                    int64_t deadline, int* dead) {
    struct pollfd* p = lk->pfds;
    int np = 0, hup[_DM_ENG_XFER_MAX], rc, err = 0, j, k;
    bool memory = false;
    int64_t left = deadline - _dm_now_ms();
    int slice = left > 1000 ? 1000 : (int)left;
    for (j = 0; j < n; j++)
        hup[j] = _dm_eng_xfer_done(&xs[j], &s[j]) ? -1 : _dm_eng_poll_xfer(lk, &xs[j], &s[j], p, &np, &memory);
    if (memory && np == 0 && lk->bell) {
        if (*dead == 0) lk->bell_ops->wait(lk->bell_ops->ctx, lk->bell, seen, slice < 50 ? slice : 50);
    } else {
        if (lk->poll_fill) np += lk->poll_fill(lk, p + np, _DM_ENG_SERVICE_FDS);
        rc = poll(p, (nfds_t)np, memory ? (slice < 1 ? slice : 1) : slice);
        if (rc < 0 && errno != EINTR) {
            _DM_FAIL(lk->c, DM_ERR_NETWORK, "%s: %s #%llu: poll failed (%s)", lk->tag, xs[0].op,
                     (unsigned long long)lk->c->seq, strerror(errno));
            return _dm_eng_break(lk, DM_ERR_NETWORK);
        }
        for (j = 0; rc > 0 && j < n; j++)
            if (hup[j] >= 0 && (p[hup[j]].revents & (_DM_POLLRDHUP | POLLHUP | POLLERR))) {
                socklen_t len = sizeof(err);
                getsockopt(p[hup[j]].fd, SOL_SOCKET, SO_ERROR, &err, &len);
                return _dm_eng_io_fail(lk, &xs[j], xs[j].speer, true, err);
            }
    }
    if (lk->service) lk->service(lk);   /* a rank connecting to this one is answered from here */
    /* memory links: a peer that died cannot ring; ask its side channel. Seen twice in a row
       with no progress between (bytes it wrote before dying are taken first) means lost. */
    for (j = 0; j < n; j++) {
        const _dm_xfer* x = &xs[j];
        bool any = x->want && x->want->any;
        if (_dm_eng_xfer_done(x, &s[j])) continue;
        for (k = 0; k < (any ? lk->c->size : 2); k++) {
            int peer = any ? (k != lk->c->rank ? k : -1)
                     : k == 0 ? (s[j].ri < x->nr || x->inbox ? x->rpeer : -1) : (s[j].si < x->ns ? x->speer : -1);
            _dm_link* l = peer >= 0 ? lk->links[peer] : NULL;
            if (!l || l->fd >= 0 || !l->vt->alive || l->vt->alive(l, &err) == 0) continue;
            if (++*dead < 2) return DM_OK;
            return _dm_eng_io_fail(lk, x, peer, !any && k != 0, err);
        }
    }
    return DM_OK;
}

/* The links to a transfer's peers before it starts: there, or made now by the backend
   (connect, given both missing peers at once so it can make them in the order that cannot
   deadlock). */
_DM_PRIVATE dm_status _dm_eng_ensure(_dm_eng* lk, const _dm_xfer* x, int64_t deadline) {
    char why[DM_LAST_ERROR_SIZE];
    int need[2], n = 0;
    dm_status st;
    if (x->speer >= 0 && !lk->links[x->speer]) need[n++] = x->speer;
    if (x->rpeer >= 0 && x->rpeer != x->speer && !lk->links[x->rpeer]) need[n++] = x->rpeer;
    if (n == 0) return DM_OK;
    if (!lk->connect) {
        _DM_FAIL(lk->c, DM_ERR_INTERNAL, "%s: %s #%llu: no link to rank %d", lk->tag, x->op,
                 (unsigned long long)lk->c->seq, need[0]);
        return _dm_eng_break(lk, DM_ERR_INTERNAL);
    }
    if (deadline == 0) deadline = _dm_deadline(lk->c->timeout_ms);    /* _dm_eng_run sets its own at the first wait */
    st = lk->connect(lk, need, n, deadline);
    if (st == DM_OK && (x->speer < 0 || lk->links[x->speer]) && (x->rpeer < 0 || lk->links[x->rpeer])) return DM_OK;
    if (_dm_eng_adopt_abort(lk, x->op) != DM_OK) return lk->broken;
    if (st == DM_ERR_PEER_LOST && _dm_eng_adopt_notice(lk, x->op) != DM_OK) return lk->broken;
    if (st == DM_OK) st = DM_ERR_INTERNAL;
    _dm_copy_name(why, sizeof(why), _dm_errbuf(lk->c));
    _DM_FAIL(lk->c, st, "%s: %s #%llu: %s", lk->tag, x->op, (unsigned long long)lk->c->seq, why);
    return _dm_eng_break(lk, st);
}
/* A fixed-peer schedule's transfer with a peer outside P (>>peers): P is out of date. */
_DM_PRIVATE dm_status _dm_eng_check_peer(_dm_eng* lk, const _dm_xfer* x, int peer) {
    if (peer < 0 || !lk->peers || lk->on_demand || lk->peers[peer]) return DM_OK;
    _DM_FAIL(lk->c, DM_ERR_INTERNAL, "%s: %s #%llu: rank %d is not among the peers this rank's schedules use "
             "(_dm_peers_find is out of date with the schedules)", lk->tag, x->op, (unsigned long long)lk->c->seq, peer);
    return _dm_eng_break(lk, DM_ERR_INTERNAL);
}

/* Whether an unfinished transfer waits to receive (bytes, or a dm_recv's message), else to send. */
_DM_PRIVATE bool _dm_eng_recv_wait(const _dm_xfer* x, const _dm_xstate* s) {
    return s->ri < x->nr || (x->want && !x->want->done);
}
/* Drives n transfers (at most _DM_ENG_XFER_MAX, on links to different peers) to the end
   together: each round moves what it can on each; with nothing to move it waits, spinning
   first, then yielding, then blocking, all under the collective's deadline (counted from the
   first clock read: one that never waits needs no clock). While spinning, and in the first
   idle rounds, the clock is read every 16th round only, so bytes that land are seen a clock
   read sooner. Running two at once is
   how a schedule overlaps phases on different links (the two-level all-reduce's host ring on
   shared memory and its rail across hosts); each needs its own scratch (_dm_xfer.tmp). */
_DM_PRIVATE dm_status _dm_eng_run_n(_dm_eng* lk, const _dm_xfer* xs, int n) {
    _dm_xstate s[_DM_ENG_XFER_MAX];
    int64_t deadline = 0, idle_since = 0;
    int dead = 0, j, first = 0;     /* first: the first transfer not done */
    unsigned quiet = 0;             /* idle rounds since the last progress */
    uint32_t seen = 0;
    bool blocking = false, spinning = false;
    int wait_peer = -1;             /* the peer an idle spell waits on (>>trace) */
    dm_status st = DM_OK;
    for (j = 0; j < n && lk->used; j++) {
        if (xs[j].speer >= 0) lk->used[xs[j].speer] = true;
        if (xs[j].rpeer >= 0) lk->used[xs[j].rpeer] = true;
    }
    if (lk->dry) return DM_OK;
    for (j = 0; j < n; j++) {
        _DM_TRY(_dm_eng_check_peer(lk, &xs[j], xs[j].speer));
        _DM_TRY(_dm_eng_check_peer(lk, &xs[j], xs[j].rpeer));
        _DM_TRY(_dm_eng_ensure(lk, &xs[j], deadline));
    }
    memset(s, 0, sizeof(s[0]) * (size_t)n);
    for (;;) {
        bool progress = false, done = true;
        if (blocking && lk->bell) {     /* announce the sleep before the last look (see _dm_bell) */
            __atomic_store_n(&lk->bell->sleeping, 1u, __ATOMIC_SEQ_CST);
            seen = __atomic_load_n(&lk->bell->seq, __ATOMIC_SEQ_CST);
            _dm_bell_announced(lk->bell_ops);           /* the last look comes after both */
        }
        for (j = first; j < n && st == DM_OK; j++) {
            const _dm_xfer* x = &xs[j];
            _dm_xstate* sj = &s[j];
            sj->want_in = sj->want_out = false;
            if (_dm_eng_xfer_done(x, sj)) continue;
            st = _dm_eng_pump_send(lk, x, sj, &progress);
            if (st == DM_OK) st = _dm_eng_pump_recv(lk, x, sj, &progress);
            if (st == DM_OK && x->want && x->want->any) st = _dm_eng_pump_any(lk, x, sj, &progress);
            else if (st == DM_OK && x->inbox && (x->want || sj->si < x->ns))
                st = _dm_eng_pump_inbox(lk, x, sj, x->rpeer, &progress);
            if (st == DM_OK && x->inbox && !x->want && !progress && sj->si < x->ns)
                st = _dm_eng_drain_others(lk, x, sj, &progress);
            if (!_dm_eng_xfer_done(x, sj)) done = false;
        }
        /* stay announced through the sleep: a peer that writes after the last look must ring */
        if (blocking && lk->bell && (st != DM_OK || progress))
            __atomic_store_n(&lk->bell->sleeping, 0u, __ATOMIC_SEQ_CST);
        if (st != DM_OK) return st;
        if (progress && idle_since && _DM_TRACED(lk->c))
            _dm_trace_waited(lk->c, wait_peer, idle_since);
        if (done) return DM_OK;
        while (_dm_eng_xfer_done(&xs[first], &s[first])) first++;
        if (progress) { idle_since = 0; quiet = 0; blocking = spinning = false; dead = 0; continue; }
        for (j = first; j < n; j++)
            if (!_dm_eng_xfer_done(&xs[j], &s[j]) && !s[j].want_in && !s[j].want_out) {
                _DM_FAIL(lk->c, DM_ERR_INTERNAL, "%s: %s #%llu: transfer stalled (send step %d, recv step %d)",
                         lk->tag, xs[j].op, (unsigned long long)lk->c->seq, s[j].si, s[j].ri);
                return _dm_eng_break(lk, DM_ERR_INTERNAL);
            }
        /* the first 15 idle rounds spin too, unclocked: a small message is often there by then */
        if ((spinning || (idle_since == 0 && lk->spin_us > 0)) && (++quiet & 15) != 0) continue;
        {
            int64_t now = _dm_now_us(), idle;
            const _dm_xfer* x = &xs[first];
            if (idle_since == 0) {
                idle_since = now;
                wait_peer = _dm_eng_recv_wait(x, &s[first]) ? x->rpeer : x->speer;
                if (deadline == 0) deadline = lk->c->timeout_ms < 0 ? INT64_MAX : now / 1000 + lk->c->timeout_ms;
                if (_DM_TRACED(lk->c)) _dm_trace_idle(lk->c, false);
            }
            idle = now - idle_since;
            if (idle < lk->spin_us) {
                int beside = _dm_eng_peer_beside(lk, xs + first, n - first);
                _dm_eng_move_off(lk, beside, now);
                spinning = beside < 0;
            } else spinning = false;
            if (spinning) { _dm_cpu_relax(); continue; }
            st = _dm_eng_adopt_abort(lk, x->op);
            if (st == DM_OK && now / 1000 >= deadline) {
                bool recv_wait = _dm_eng_recv_wait(x, &s[first]);
                int peer = recv_wait ? x->rpeer : x->speer;
                if (_DM_TRACED(lk->c)) _dm_trace_wait(lk->c, peer, now - idle_since);
                if (peer < 0)   /* a recv from any source */
                    _DM_FAIL(lk->c, DM_ERR_TIMEOUT, "%s: %s #%llu timed out after %d ms waiting to receive a "
                             "message with tag %d from any rank", lk->tag, x->op, (unsigned long long)lk->c->seq,
                             lk->c->timeout_ms, x->want->tag);
                else
                    _DM_FAIL(lk->c, DM_ERR_TIMEOUT, "%s: %s #%llu timed out after %d ms waiting to %s rank %d (%s)",
                             lk->tag, x->op, (unsigned long long)lk->c->seq, lk->c->timeout_ms,
                             recv_wait ? "receive from" : "send to", peer, lk->links[peer]->where);
                st = _dm_eng_break(lk, DM_ERR_TIMEOUT);
            }
            if (st != DM_OK) break;
            if (idle < lk->yield_us) { sched_yield(); continue; }
            if (!blocking && lk->bell) { blocking = true; continue; }  /* one more look, announced */
            if (_DM_TRACED(lk->c)) _dm_trace_idle(lk->c, true);
            st = _dm_eng_block(lk, xs + first, s + first, n - first, seen, deadline, &dead);
            if (st != DM_OK) break;
        }
    }
    if (lk->bell) __atomic_store_n(&lk->bell->sleeping, 0u, __ATOMIC_SEQ_CST);
    return st;
}
_DM_PRIVATE dm_status _dm_eng_run(_dm_eng* lk, const _dm_xfer* x) { return _dm_eng_run_n(lk, x, 1); }

/* A transfer whose peer the caller's arguments choose (point-to-point, all_to_all, the rooted
   collectives' meetings with the root): outside P (>>peers), connected on demand. */
_DM_PRIVATE dm_status _dm_eng_run_on_demand(_dm_eng* lk, const _dm_xfer* x) {
    dm_status st;
    lk->on_demand = true;
    st = _dm_eng_run(lk, x);
    lk->on_demand = false;
    return st;
}

/* >>eager  A small exchange over memory links, mostly without the engine: the fingerprint and
   payload go in one publish when they fit, and the peer's, when they land within a few looks,
   are checked and taken straight from its ring. Anything else (no room, the peer's bytes not
   there yet or split at the ring's end, a point-to-point message first in line, an inbox
   mid-message, a dry run) leaves what is left to _dm_eng_run, with the same checks and waits.
   The wire bytes are the engine's; it only saves the bookkeeping, which is most of an 8-byte
   all-reduce between two cores.

   The one exception to the layers. Everywhere else the engine knows a link by its ops table
   alone; here it (1) tells a memory link by its ops (peek == _dm_mem_peek: the shared-memory
   links and the threaded world's, which _dm_memlink_new alone makes, base first, so the cast
   to _dm_memlink holds), (2) calls the ring's functions directly (the room left, one gathered
   publish, bytes read in place) and (3) reads the per-peer state the loop would have kept (the
   inbox, P's bookkeeping). Allowed because it is the whole cost of the smallest collectives on
   one host, and the layered way (ops for "room for n bytes" and "n whole bytes in place" on
   every link) would serve this transport only: a socket can promise neither.
   What it may assume: the exchange's steps are the fingerprint and one payload each way
   (_dm_eng_exchange builds nothing else); between engine calls every link is at a message
   boundary both ways (a transfer returns only when done, and after a failure the group is
   broken and no exchange runs), except the receiving inbox, which it checks.
   What keeps it correct: the same bytes (the engine's gather, padding included, so a peer on
   the engine's path reads them alike); all or nothing on each side (the whole message is
   published or none; the peer's is taken only whole and contiguous, never a point-to-point
   header); the engine's checks and reduction (_dm_eng_check_fp, _dm_eng_reduce_piece: the same
   order, the same bits); P recorded as the loop records it, and left to the loop where a peer
   is outside P; and test_shm_eager_stream (tests/test_tcp.c), which drives every fallback. */
#define _DM_EAGER_MAX ((size_t)256)     /* payload bytes each way */
#define _DM_EAGER_LOOKS 64

_DM_PRIVATE bool _dm_eng_eager_ok(const _dm_eng* lk, const _dm_xfer* x) {
    const _dm_link *sl, *rl;
    const _dm_inbox* in;
    if (lk->dry || x->speer < 0 || x->rpeer < 0 || x->ss[1].len > _DM_EAGER_MAX || x->rs[1].len > _DM_EAGER_MAX)
        return false;
    if (lk->peers && !lk->on_demand && (!lk->peers[x->speer] || !lk->peers[x->rpeer])) return false;
    sl = lk->links[x->speer]; rl = lk->links[x->rpeer]; in = &lk->inbox[x->rpeer];
    return sl && rl && sl->vt->peek == _dm_mem_peek && rl->vt->peek == _dm_mem_peek && in->hfill == 0 &&
           !in->fp_ready && !in->payload;
}
/* Both send steps (fingerprint, then step 1 with its padding) in one publish, or nothing. */
_DM_PRIVATE bool _dm_eng_eager_send(_dm_eng* lk, const _dm_xfer* x) {
    _dm_link* l = lk->links[x->speer];
    size_t total = 32 + x->ss[1].len + _dm_eng_pad(l, x->ss[1].len);
    _dm_iov iov[_DM_LINK_IOV_MAX];
    _dm_xstate start;
    int n, err = 0;
    if (_dm_mem_room((_dm_memlink*)l, total) < total) return false;
    memset(&start, 0, sizeof(start));
    n = _dm_eng_gather(x, &start, l, iov);
    if (lk->used) lk->used[x->speer] = true;
    return _dm_mem_sendv(l, iov, n, &err) == (ptrdiff_t)total;
}
/* The peer's fingerprint and step 1, when whole and contiguous in its ring within a few looks:
   true with *st set (the fingerprint's verdict), else false with nothing taken. */
_DM_PRIVATE bool _dm_eng_eager_recv(_dm_eng* lk, const _dm_xfer* x, dm_status* st) {
    _dm_link* l = lk->links[x->rpeer];
    const _dm_rstep* r = &x->rs[1];
    size_t len = r->len, total = 32 + len + _dm_eng_pad(l, len), n = 0;
    const unsigned char* p = NULL;
    int look, looks = lk->spin_us > 0 ? _DM_EAGER_LOOKS : 1;     /* without a core each, no spin */
    p = _dm_mem_peek(l, &n);
    if (n < total && _DM_TRACED(lk->c))
        _dm_trace_idle(lk->c, false);       /* a wait: where the flight recorder reads its clock */
    for (look = 1; look < looks && n < total; look++) p = _dm_mem_peek(l, &n);
    if (n < total || _dm_get32(p) != _DM_FP_MAGIC || p[4] == _DM_K_SEND) return false;
    if (r->own && ((uintptr_t)(p + 32) & (dm_dtype_size(x->dtype) - 1)) != 0) return false;
    if (lk->used) lk->used[x->rpeer] = true;
    *st = _dm_eng_check_fp(lk, x, p);
    if (*st != DM_OK) return true;
    if (r->own) _dm_eng_reduce_piece(x, r, 0, p + 32, len);
    else if (len) memcpy(r->buf, p + 32, len);
    _dm_mem_consume(l, total);
    return true;
}

/* >>exchange  One step with one peer each way (or two): a fingerprint, then the payload,
   received straight or reduced as it arrives (_dm_eng_exchange); most schedules are made of
   these (_dm_eng_sendrecv, _dm_eng_sendrecv_reduce). Small ones over memory links go the eager
   way when they can (>>eager). Fingerprint buffers live on the caller's stack; step 0 of both
   streams carries them. */
typedef struct _dm_fpbufs { unsigned char out[32], in[32]; } _dm_fpbufs;

_DM_PRIVATE void _dm_fp_steps(_dm_fpbufs* b, const _dm_fp* fp, _dm_sstep* s, _dm_rstep* r) {
    _dm_fp_encode(fp, b->out);
    if (s) { s->buf = b->out; s->len = 32; s->gate = -1; s->after_recvs = 0; }
    if (r) { memset(r, 0, sizeof(*r)); r->buf = b->in; r->len = 32; r->after_send = -1; }
}

/* Exchange with one peer (or two): send slen bytes of sbuf to speer and receive rlen bytes from
   rpeer into rbuf, each preceded by a fingerprint: fp goes out, and what arrives must equal
   expect (the same as fp, except where the two sides of a pair describe it from their ends:
   all_to_all). speer/rpeer -1 = that direction is idle. With reduce, what arrives is reduced
   into rbuf instead (rbuf = rbuf op received, read in place from links that can peek: one copy
   less than receiving into scratch); rbuf may then also be what is sent, and is written only
   behind the bytes already sent. */
_DM_PRIVATE dm_status _dm_eng_exchange(_dm_eng* lk, const char* op, const _dm_fp* fp, const _dm_fp* expect, int speer,
                                       const void* sbuf, size_t slen, int rpeer, void* rbuf, size_t rlen, bool reduce,
                                       dm_dtype dtype, dm_reduce_op rop) {
    _dm_sstep ss[2];
    _dm_rstep rs[2];
    _dm_fpbufs b;
    _DM_ZERO(_dm_xfer, x);
    _dm_fp_steps(&b, fp, &ss[0], &rs[0]);
    ss[1].buf = (const unsigned char*)sbuf; ss[1].len = slen; ss[1].gate = -1; ss[1].after_recvs = 0;
    memset(&rs[1], 0, sizeof(rs[1]));
    rs[1].buf = (unsigned char*)rbuf; rs[1].len = rlen;
    rs[1].own = reduce ? (const unsigned char*)rbuf : NULL;
    rs[1].after_send = reduce && speer >= 0 && sbuf == rbuf ? 1 : -1;
    x.op = op; x.speer = speer; x.rpeer = rpeer; x.ss = ss; x.rs = rs;
    x.ns = speer >= 0 ? 2 : 0; x.nr = rpeer >= 0 ? 2 : 0;
    x.dtype = reduce ? dtype : DM_UINT8; x.rop = reduce ? rop : DM_SUM; x.expect = expect;
    if (_dm_eng_eager_ok(lk, &x) && _dm_eng_eager_send(lk, &x)) {
        dm_status st;
        if (_dm_eng_eager_recv(lk, &x, &st)) return st;
        x.speer = -1; x.ns = 0;             /* sent: the engine only receives */
        rs[1].after_send = -1;
    }
    return _dm_eng_run(lk, &x);
}
_DM_PRIVATE dm_status _dm_eng_sendrecv(_dm_eng* lk, const char* op, const _dm_fp* fp, int speer, const void* sbuf,
                                       size_t slen, int rpeer, void* rbuf, size_t rlen) {
    return _dm_eng_exchange(lk, op, fp, fp, speer, sbuf, slen, rpeer, rbuf, rlen, false, DM_UINT8, DM_SUM);
}
_DM_PRIVATE dm_status _dm_eng_sendrecv_reduce(_dm_eng* lk, const char* op, const _dm_fp* fp, int speer, const void* sbuf,
                                              int rpeer, void* buf, size_t count, dm_dtype dtype, dm_reduce_op rop) {
    size_t bytes = count * dm_dtype_size(dtype);
    return _dm_eng_exchange(lk, op, fp, fp, speer, sbuf, bytes, rpeer, buf, bytes, true, dtype, rop);
}

_DM_PRIVATE dm_status _dm_eng_sendrecv_on_demand(_dm_eng* lk, const char* op, const _dm_fp* fp, int speer,
                                                 const void* sbuf, size_t slen, int rpeer, void* rbuf, size_t rlen) {
    dm_status st;
    lk->on_demand = true;
    st = _dm_eng_sendrecv(lk, op, fp, speer, sbuf, slen, rpeer, rbuf, rlen);
    lk->on_demand = false;
    return st;
}

/* >>teams  A team is the ranks one phase of a schedule runs among, in the phase's order (a
   ring's positions); me is this rank's index in it. ranks NULL means rank i at index i. The
   flat ring is the whole group in host order; the two-level schedules run on one host's ranks
   (a slice of the layout's members), on a rail (local rank i of every host, host order, built
   in the layout's team scratch) or on a chain that starts at a root.
   Also here, what every schedule is written with: segments of a count (_dm_segment), step
   arrays and the ring transfer that runs them (_dm_steps), and the smallest schedule, the
   fingerprints alone (count 0). */
/* Segment s of count elements split in parts near-equal parts: the first count % parts get one
   more. Ring blocks and the threaded world's shares. */
_DM_PRIVATE void _dm_segment(size_t count, int parts, int s, size_t* off, size_t* len) {
    size_t base = count / (size_t)parts, extra = count % (size_t)parts, si = (size_t)s;
    *off = si * base + (si < extra ? si : extra);
    *len = base + (si < extra ? 1 : 0);
}
_DM_PRIVATE int _dm_mod(int a, int n) { return ((a % n) + n) % n; }
typedef struct _dm_team { const int* ranks; int n, me; } _dm_team;
_DM_PRIVATE int _dm_team_rank(const _dm_team* t, int i) { return t->ranks ? t->ranks[i] : i; }
_DM_PRIVATE int _dm_team_at(const _dm_team* t, int k) { return _dm_team_rank(t, _dm_mod(t->me + k, t->n)); }
_DM_PRIVATE _dm_team _dm_team_of(const int* ranks, int n, int me) {
    _dm_team t;
    t.ranks = ranks; t.n = n; t.me = me;
    return t;
}
_DM_PRIVATE _dm_team _dm_sch_flat(const _dm_eng* lk) { return _dm_team_of(lk->order, lk->c->size, lk->slot[lk->c->rank]); }
_DM_PRIVATE _dm_team _dm_sch_identity(const _dm_eng* lk) { return _dm_team_of(NULL, lk->c->size, lk->c->rank); }
/* This rank's host: its first n ranks (n <= the host's size) in local order. */
_DM_PRIVATE _dm_team _dm_sch_host(const _dm_eng* lk, int n) {
    const _dm_layout* y = &lk->lay;
    return _dm_team_of(y->members + y->start[y->host_of[lk->c->rank]], n, y->local[lk->c->rank]);
}
_DM_PRIVATE int _dm_sch_host_size(const _dm_eng* lk, int h) { return lk->lay.start[h + 1] - lk->lay.start[h]; }
/* Rail i: local rank i of every host (each has one), in host order. Uses the team scratch. */
_DM_PRIVATE _dm_team _dm_sch_rail(_dm_eng* lk, int i) {
    _dm_layout* y = &lk->lay;
    int h;
    for (h = 0; h < y->H; h++) y->team[h] = y->members[y->start[h] + i];
    return _dm_team_of(y->team, y->H, y->host_of[lk->c->rank]);
}

/* Step arrays for a ring transfer of n steps each way, with the fingerprint in step 0. */
typedef struct _dm_steps { _dm_sstep* ss; _dm_rstep* rs; _dm_fpbufs b; } _dm_steps;
_DM_PRIVATE dm_status _dm_steps_alloc(_dm_eng* lk, _dm_steps* st, int n, const _dm_fp* fp, const char* op) {
    st->ss = (_dm_sstep*)_dm_calloc(&lk->c->allocator, sizeof(_dm_sstep) * (size_t)n);
    st->rs = (_dm_rstep*)_dm_calloc(&lk->c->allocator, sizeof(_dm_rstep) * (size_t)n);
    if (!st->ss || !st->rs) {
        _dm_free(&lk->c->allocator, st->ss);
        _dm_free(&lk->c->allocator, st->rs);
        return _DM_FAIL(lk->c, DM_ERR_OUT_OF_MEMORY, "%s: %s: out of memory", lk->tag, op);
    }
    _dm_fp_steps(&st->b, fp, &st->ss[0], &st->rs[0]);
    return DM_OK;
}

/* Runs n ring steps each way over team t: send to the next position, receive from the previous. */
_DM_PRIVATE dm_status _dm_steps_run(_dm_eng* lk, const _dm_team* t, _dm_steps* st, int n, const char* op,
                                    dm_dtype dtype, dm_reduce_op rop, const _dm_fp* fp) {
    dm_status rc;
    _DM_ZERO(_dm_xfer, x);
    x.op = op; x.speer = _dm_team_at(t, 1); x.rpeer = _dm_team_at(t, -1);
    x.ss = st->ss; x.ns = n; x.rs = st->rs; x.nr = n; x.dtype = dtype; x.rop = rop; x.expect = fp;
    rc = _dm_eng_run(lk, &x);
    _dm_free(&lk->c->allocator, st->ss);
    _dm_free(&lk->c->allocator, st->rs);
    return rc;
}

/* Only the fingerprints around the ring (count 0: the arguments still have to agree). */
_DM_PRIVATE dm_status _dm_sch_fp_only(_dm_eng* lk, const char* op, const _dm_fp* fp) {
    _dm_team t = _dm_sch_flat(lk);
    return _dm_eng_sendrecv(lk, op, fp, _dm_team_at(&t, 1), NULL, 0, _dm_team_at(&t, -1), NULL, 0);
}

/* >>recursive doubling  All-reduce over a team in log2(n) exchanges (a fold first where n is not
   a power of two): the flat all_reduce of small messages, and the rails of the two-level one. */

/* Recursive doubling over team t on recv (already holding this rank's data). Teams that are
   not a power of two first fold index 2i into 2i+1 for i < rem, and hand the result back at
   the end. The order of reduction is fixed by the team alone: the same bits on every
   transport. divide > 0: MEAN, the result is divided by it. */
_DM_PRIVATE dm_status _dm_sch_rd(_dm_eng* lk, const _dm_team* t, void* recv, size_t count, dm_dtype dtype,
                                 dm_reduce_op op, int divide, const _dm_fp* fp) {
    static const char* name = "all_reduce";
    int W = t->n, r = t->me, p = 1, rem, newrank, mask;
    size_t bytes = count * dm_dtype_size(dtype);
    while (p * 2 <= W) p *= 2;
    rem = W - p;
    if (r < 2 * rem) {
        if (r % 2 == 0) {
            _DM_TRY(_dm_eng_sendrecv(lk, name, fp, _dm_team_rank(t, r + 1), recv, bytes, -1, NULL, 0));
            newrank = -1;
        } else {
            _DM_TRY(_dm_eng_sendrecv_reduce(lk, name, fp, -1, NULL, _dm_team_rank(t, r - 1), recv, count, dtype, op));
            newrank = r / 2;
        }
    } else {
        newrank = r - rem;
    }
    if (newrank >= 0) {
        for (mask = 1; mask < p; mask <<= 1) {
            int pn = newrank ^ mask, peer = _dm_team_rank(t, pn < rem ? pn * 2 + 1 : pn + rem);
            /* IEEE +, *, max, min are commutative, so both partners compute the same bits */
            _DM_TRY(_dm_eng_exchange(lk, name, fp, fp, peer, recv, bytes, peer, recv, bytes, true, dtype, op));
        }
    }
    if (r < 2 * rem) {
        if (r % 2) _DM_TRY(_dm_eng_sendrecv(lk, name, fp, _dm_team_rank(t, r - 1), recv, bytes, -1, NULL, 0));
        else _DM_TRY(_dm_eng_sendrecv(lk, name, fp, -1, NULL, 0, _dm_team_rank(t, r + 1), recv, bytes));
    }
    if (divide) dm_divide_local(dtype, recv, count, divide);
    return DM_OK;
}

/* >>ring  Rings over a team: the all-reduce (reduce-scatter and all-gather steps as one
   pipelined stream, also the two-level all-reduce's host ring and ring rails), and the
   all-gather and reduce-scatter of K pieces per position that all_gather and reduce_scatter,
   flat and two-level, are built of. */

/* Ring all-reduce over team t, blocks by position: _dm_segment(count, n, p) is position p's.
   Its reduce-scatter steps (_DM_SCH_RING_RS: step g sends the block of position me-g-1 and
   receives and reduces that of me-g-2, so each position ends holding its own block, reduced
   in ring order starting after it) and its all-gather steps (_DM_SCH_RING_AG: step g sends the
   block of me-g, receives that of me-g-1) run as one pipelined stream. The all-gather alone
   starts from each position holding its own block in recv. divide > 0: MEAN's division, done
   on the last reduction of each block. */
#define _DM_SCH_RING_RS 1
#define _DM_SCH_RING_AG 2
/* Appends the steps of a ring over team t on count elements (in, out as for _dm_sch_ring) to st
   from step k on, and returns the next step. An all-gather after a reduce-scatter in the same
   call waits for it (its first block is the one the reduce-scatter finished last); an
   all-gather alone waits for nothing. */
_DM_PRIVATE int _dm_sch_ring_steps(_dm_steps* st, int k, const _dm_team* t, const unsigned char* in, unsigned char* out,
                                   size_t count, size_t esize, int divide, int phases) {
    int W = t->n, g, nrs = (phases & _DM_SCH_RING_RS) ? W - 1 : 0, nag = (phases & _DM_SCH_RING_AG) ? W - 1 : 0;
    size_t off, len;
    for (g = 0; g < nrs; g++, k++) {
        _dm_segment(count, W, _dm_mod(t->me - g - 1, W), &off, &len);
        st->ss[k].buf = (g == 0 ? in : out) + off * esize;
        st->ss[k].len = len * esize;
        st->ss[k].gate = g == 0 ? -1 : k - 1;
        _dm_segment(count, W, _dm_mod(t->me - g - 2, W), &off, &len);
        st->rs[k].buf = out + off * esize;
        st->rs[k].len = len * esize;
        st->rs[k].own = in + off * esize;
        st->rs[k].after_send = -1;
        st->rs[k].divide = g == W - 2 ? divide : 0;
    }
    for (g = 0; g < nag; g++, k++) {
        _dm_segment(count, W, _dm_mod(t->me - g, W), &off, &len);
        st->ss[k].buf = out + off * esize; st->ss[k].len = len * esize;
        st->ss[k].gate = g > 0 || nrs > 0 ? k - 1 : -1;
        _dm_segment(count, W, _dm_mod(t->me - g - 1, W), &off, &len);
        st->rs[k].buf = out + off * esize; st->rs[k].len = len * esize; st->rs[k].after_send = -1;
    }
    return k;
}
_DM_PRIVATE dm_status _dm_sch_ring(_dm_eng* lk, const _dm_team* t, const void* send, void* recv, size_t count,
                                   dm_dtype dtype, dm_reduce_op op, int divide, const _dm_fp* fp, int phases) {
    int W = t->n, n = 1 + ((phases & _DM_SCH_RING_RS) ? W - 1 : 0) + ((phases & _DM_SCH_RING_AG) ? W - 1 : 0);
    _dm_steps st;
    _DM_TRY(_dm_steps_alloc(lk, &st, n, fp, "all_reduce"));
    n = _dm_sch_ring_steps(&st, 1, t, (const unsigned char*)send, (unsigned char*)recv, count, dm_dtype_size(dtype),
                           divide, phases);
    return _dm_steps_run(lk, t, &st, n, "all_reduce", dtype, op, fp);
}

/* Ring all-gather over team t of K pieces per position: pieces[p * K + k] is piece k of
   position p, bytes each, this position's already in place. Step g sends the pieces of
   position me-g and receives those of me-g-1 straight into place, each forwarded the next
   step as it arrives. */
_DM_PRIVATE dm_status _dm_sch_ring_gather(_dm_eng* lk, const _dm_team* t, void* const* pieces, int K, size_t bytes,
                                          int kind, dm_dtype dtype, const _dm_fp* fp) {
    int W = t->n, g, k, i = 1;
    _dm_steps st;
    if (W == 1) return DM_OK;
    _DM_TRY(_dm_steps_alloc(lk, &st, 1 + (W - 1) * K, fp, _dm_kind_name(kind)));
    for (g = 0; g < W - 1; g++)
        for (k = 0; k < K; k++, i++) {
            st.ss[i].buf = (const unsigned char*)pieces[_dm_mod(t->me - g, W) * K + k];
            st.ss[i].len = bytes;
            st.ss[i].gate = g == 0 ? -1 : i - K;
            st.rs[i].buf = (unsigned char*)pieces[_dm_mod(t->me - g - 1, W) * K + k];
            st.rs[i].len = bytes;
            st.rs[i].after_send = -1;
        }
    return _dm_steps_run(lk, t, &st, i, _dm_kind_name(kind), dtype, DM_SUM, fp);
}

/* Ring reduce-scatter over team t of K pieces per position, bytes each: in[p * K + k] is
   piece k of position p's block. Step g sends the partial pieces of position me-g-1 (this
   rank's input first, then scratch) and reduces the received ones of me-g-2 into scratch (K
   pieces), which must first have been sent on; the last step (this position's own pieces)
   lands in out (K pieces; out may be scratch). divide > 0: MEAN's division, on the last. */
_DM_PRIVATE dm_status _dm_sch_ring_rs(_dm_eng* lk, const _dm_team* t, const unsigned char* const* in, unsigned char* out,
                                      unsigned char* scratch, int K, size_t bytes, dm_dtype dtype, dm_reduce_op op,
                                      int divide, const _dm_fp* fp) {
    int W = t->n, g, k, i = 1;
    _dm_steps st;
    _DM_TRY(_dm_steps_alloc(lk, &st, 1 + (W - 1) * K, fp, "reduce_scatter"));
    for (g = 0; g < W - 1; g++)
        for (k = 0; k < K; k++, i++) {
            _dm_rstep* s = &st.rs[i];
            st.ss[i].buf = g == 0 ? in[_dm_mod(t->me - 1, W) * K + k] : scratch + (size_t)k * bytes;
            st.ss[i].len = bytes;
            st.ss[i].gate = g == 0 ? -1 : i - K;
            s->buf = (g == W - 2 ? out : scratch) + (size_t)k * bytes;
            s->len = bytes;
            s->own = in[_dm_mod(t->me - g - 2, W) * K + k];
            s->divide = g == W - 2 ? divide : 0;
            /* rs[i] overwrites scratch, which ss[i] (sent in the same step) still reads */
            s->after_send = g >= 1 && st.ss[i].buf == s->buf ? i : -1;
        }
    return _dm_steps_run(lk, t, &st, i, "reduce_scatter", dtype, op, fp);
}

/* >>single copy  A ring all-reduce among the ranks of one host, large: its reduce-scatter as
   above, then an all-gather in which each rank reads the peers' reduced blocks straight out of
   their buffers (the backend's read_peer: process_vm_readv), one copy instead of the ring's
   two (into the shared ring, out of it). 2 ranks, 16 MiB: 56 MiB through each rank's caches
   instead of 72 (docs/performance.md). After the reduce-scatter every position passes on where
   its block is (its pid and buffer; 0 when DISTMESH_SINGLE_COPY=0 there), which also says the
   block is final; then each reads the others; then every position passes on whether its reads
   succeeded, which also says it no longer reads anyone's buffer, so no rank returns (and lets
   its caller write the buffer) while another still reads it. If any read failed (no ptrace
   permission between the ranks: another user, Yama's ptrace_scope, a non-dumpable process; or
   a peer gone), every rank runs the ring's all-gather after all, and from then on: a lost peer
   is then reported by it as ever. The exchanges are ring all-gathers of 16 and 1 bytes. */
/* Each read at least 1 MiB: 2 ranks of a 2-core machine, medians of 5 launches, the ring
   against single copy: 1 MiB 122 against 140 us, 1.5 MiB 219 against 199, 2 MiB 307 against
   269, 16 MiB 2.78 against 2.28 ms (the ring's all-gather copies stay in cache while the
   messages are small; a read's cost per page does not). The backend offers read_peer only
   where the ranks have a core each (4 ranks on 2 cores: no gain, 8.2 against 7.7 ms at 16 MiB). */
#define _DM_SINGLE_COPY_BLOCK ((size_t)1 << 20)
/* The exchanges' rows (16 + 1 bytes and a pointer per rank) live in the engine's scratch, at
   least _DM_PICK_SMALL_BYTES: free once the reduce-scatter is done, as only reductions use it
   and the exchanges receive straight into place. */
#define _DM_SINGLE_COPY_ROW (16 + 1 + sizeof(void*))
_DM_PRIVATE bool _dm_sch_single_copy_fits(const _dm_eng* lk, size_t bytes) {
    size_t W = (size_t)lk->c->size;
    return lk->read_peer && !lk->single_copy_off && lk->lay.H == 1 && bytes / W >= _DM_SINGLE_COPY_BLOCK &&
           W * _DM_SINGLE_COPY_ROW <= _DM_PICK_SMALL_BYTES;
}
_DM_PRIVATE dm_status _dm_sch_single_gather(_dm_eng* lk, const _dm_team* t, unsigned char* rows, size_t bytes,
                                            void** pieces, const _dm_fp* fp) {
    int p;
    for (p = 0; p < t->n; p++) pieces[p] = rows + (size_t)p * bytes;
    return _dm_sch_ring_gather(lk, t, pieces, 1, bytes, _DM_K_ALL_REDUCE, DM_UINT8, fp);
}
/* This rank's reads of every other position's block into recv: true when all succeeded. */
_DM_PRIVATE bool _dm_sch_single_reads(_dm_eng* lk, const _dm_team* t, const unsigned char* where, unsigned char* recv,
                                      size_t count, size_t esize) {
    int p, err;
    size_t off, len;
    for (p = 0; p < t->n; p++) {
        const unsigned char* w = where + (size_t)p * 16;
        if (p == t->me) continue;
        if (_dm_get64(w + 8) == 0) return false;            /* that rank turned it off */
        _dm_segment(count, t->n, p, &off, &len);
        err = lk->read_peer(lk, (int64_t)_dm_get64(w), _dm_get64(w + 8) + off * esize, recv + off * esize, len * esize);
        if (err) {
            _DM_LOG(&lk->c->logger, DM_LOG_INFO, "%s: all_reduce #%llu: a single-copy read from rank %d failed (%s); "
                    "the all-gathers of large all-reduces go through the shared ring from now on", lk->tag,
                    (unsigned long long)lk->c->seq, _dm_team_rank(t, p), strerror(err));
            return false;
        }
    }
    return true;
}
_DM_PRIVATE dm_status _dm_sch_ring_single(_dm_eng* lk, const _dm_team* t, const void* send, void* recv, size_t count,
                                          dm_dtype dtype, dm_reduce_op op, int divide, const _dm_fp* fp) {
    int W = t->n, p;
    size_t esize = dm_dtype_size(dtype);
    unsigned char *where, *ok;
    void** pieces;
    bool all = true;
    _DM_TRY(_dm_sch_ring(lk, t, send, recv, count, dtype, op, divide, fp, _DM_SCH_RING_RS));
    pieces = (void**)(void*)lk->tmp;                        /* see _DM_SINGLE_COPY_ROW */
    where = lk->tmp + (size_t)W * sizeof(void*);
    ok = where + (size_t)W * 16;
    _dm_put64(where + (size_t)t->me * 16, (uint64_t)getpid());
    _dm_put64(where + (size_t)t->me * 16 + 8, lk->single_copy_no ? 0 : (uint64_t)(uintptr_t)recv);
    _DM_TRY(_dm_sch_single_gather(lk, t, where, 16, pieces, fp));
    ok[t->me] = _dm_sch_single_reads(lk, t, where, (unsigned char*)recv, count, esize) ? 1 : 0;
    _DM_TRY(_dm_sch_single_gather(lk, t, ok, 1, pieces, fp));
    for (p = 0; p < W; p++) all = all && ok[p];
    if (all) {
        lk->c->algorithm = "flat_ring_single_copy";        /* dm_last_algorithm */
        return DM_OK;
    }
    lk->single_copy_off = true;
    return _dm_sch_ring(lk, t, recv, recv, count, dtype, op, 0, fp, _DM_SCH_RING_AG);
}

/* >>compressed rails  The middle of the compressed two-level all-reduce
   (dm_all_reduce_compressed; _dm_sch_allreduce_2l with a _dm_cmp): rail i's block, already
   summed exactly on each host, crosses the hosts as codes (>>compression kernels) instead of
   values. Each rank of the rail holds the same block of its host's sum:
     int8: the hosts first agree one scale per DM_COMPRESS_BLOCK elements (recursive doubling
           of the block maxima, MAX); each encodes against them; the codes are summed as
           integers, so the sum is exact and the same whatever the order;
     bf16: values rounded to bfloat16, summed in float32 in host order.
   How the codes move: up to 3 hosts (int8) or 2 (bf16) every host sends its codes to every
   other (an all-gather, (H-1) x the block's codes), each sums all H in host order; beyond,
   host h owns chunk h of the block: the others send it their codes of it, it sums them (int8:
   exactly, into int16, |sum| <= 127 H; bf16: in float32, then rounded once to bfloat16, its own
   rounding error kept in its residual) and sends the sums back (2 (H-1)/H x the chunk's). Both
   send fewer bytes than exact float32 sums (2 (H-1)/H x 4 bytes an element); every rank decodes
   the same codes the same way, so all hold the same bits. With a residual (the block's part of
   the caller's dm_compress_state), it is added before encoding and holds what encoding dropped
   after. The links between rails' hosts beyond the ring's neighbours are met on demand. */
typedef struct _dm_cmp {
    dm_compress mode;           /* DM_COMPRESS_BF16 or DM_COMPRESS_INT8 */
    float* res;                 /* the error feedback at the block's first element, or NULL */
} _dm_cmp;
/* Whether the rail of H hosts sends every host's codes to every other (else through owners). */
_DM_PRIVATE bool _dm_cmp_gathers(dm_compress mode, int H) { return mode == DM_COMPRESS_INT8 ? H <= 3 : H <= 2; }
_DM_PRIVATE unsigned char* _dm_cmp_scratch(_dm_eng* lk, size_t need) {
    if (need > lk->cbuf_size) {
        _dm_free(&lk->c->allocator, lk->cbuf);
        lk->cbuf_size = 0;
        lk->cbuf = (unsigned char*)_dm_malloc(&lk->c->allocator, need);
        if (lk->cbuf) lk->cbuf_size = need;
    }
    return lk->cbuf;
}
/* Every host's codes (cb bytes each) to every other: host h's at all + h * len * cb. */
_DM_PRIVATE dm_status _dm_cmp_all_gather(_dm_eng* lk, const _dm_team* rail, const _dm_fp* fp, unsigned char* all,
                                         size_t bytes) {
    int H = rail->n, me = rail->me, r;
    for (r = 1; r < H; r++) {
        int to = (me + r) % H, from = (me - r + H) % H;
        _DM_TRY(_dm_eng_sendrecv(lk, "all_reduce", fp, _dm_team_rank(rail, to), all + (size_t)me * bytes, bytes,
                                 _dm_team_rank(rail, from), all + (size_t)from * bytes, bytes));
    }
    return DM_OK;
}
/* Through owners: chunk me of every host's codes (mine: this host's, len codes) into in (H
   slots of cmax codes), summed into sums (2 bytes an element, the whole block), then every
   owner's sums to every host; decoded into v. */
_DM_PRIVATE dm_status _dm_cmp_through_owners(_dm_eng* lk, const _dm_team* rail, const _dm_fp* fp, const _dm_cmp* cm,
                                             const unsigned char* mine, unsigned char* in, size_t cmax,
                                             unsigned char* sums, size_t len, const float* m, float* v) {
    static const char* name = "all_reduce";
    int H = rail->n, me = rail->me, r;
    size_t cb = cm->mode == DM_COMPRESS_INT8 ? 1 : 2, off, n, toff, tn;
    _dm_segment(len, H, me, &off, &n);
    memcpy(in + (size_t)me * cmax * cb, mine + off * cb, n * cb);
    for (r = 1; r < H; r++) {                   /* my chunk from every host */
        int to = (me + r) % H, from = (me - r + H) % H;
        _dm_segment(len, H, to, &toff, &tn);
        _DM_TRY(_dm_eng_sendrecv(lk, name, fp, _dm_team_rank(rail, to), mine + toff * cb, tn * cb,
                                 _dm_team_rank(rail, from), in + (size_t)from * cmax * cb, n * cb));
    }
    _dm_cmp_owner_sum(cm->mode, in, H, cmax, n, sums + off * 2, cm->res ? cm->res + off : NULL);
    for (r = 1; r < H; r++) {                   /* every chunk's sums from its owner */
        int to = (me + r) % H, from = (me - r + H) % H;
        _dm_segment(len, H, from, &toff, &tn);
        _DM_TRY(_dm_eng_sendrecv(lk, name, fp, _dm_team_rank(rail, to), sums + off * 2, n * 2,
                                 _dm_team_rank(rail, from), sums + toff * 2, tn * 2));
    }
    _dm_cmp_decode_sums(cm->mode, sums, len, m, v);
    return DM_OK;
}
/* One rail block's compression at work: the block as float32 (v: the block itself for float32,
   else scratch), the agreed maxima m (int8), and the codes (this host's at mine; gathering: H
   slots of len codes, host order; through owners: len codes, then the owners' slots and sums). */
typedef struct _dm_cmp_work {
    float *v, *m;
    unsigned char *codes, *mine;
    size_t len, nb, cmax, cb;
    bool gather, f32;
} _dm_cmp_work;
/* Through owners: where the sums (2 bytes each) start after this host's codes and the owners'
   slots, from w->codes (rounded up: int16 and uint16 stores need even addresses). */
_DM_PRIVATE size_t _dm_cmp_sums_at(const _dm_cmp_work* w, int H) {
    return (w->len * w->cb + (size_t)H * w->cmax * w->cb + 7) & ~(size_t)7;
}
/* The block to float32 with its residual added, the maxima agreed (int8), this host's codes. */
_DM_PRIVATE dm_status _dm_cmp_begin(_dm_eng* lk, const _dm_team* rail, unsigned char* block, size_t len, dm_dtype dtype,
                                    const _dm_fp* fp, const _dm_cmp* cm, _dm_cmp_work* w) {
    int H = rail->n;
    size_t fl, need;
    unsigned char* scratch;
    w->gather = _dm_cmp_gathers(cm->mode, H);
    w->f32 = dtype == DM_FLOAT32;
    w->len = len;
    w->cb = cm->mode == DM_COMPRESS_INT8 ? 1 : 2;
    w->nb = (len + DM_COMPRESS_BLOCK - 1) / DM_COMPRESS_BLOCK;
    w->cmax = len / (size_t)H + 1;
    fl = ((w->f32 ? 0 : len) + w->nb + 1) * sizeof(float);
    need = fl + (w->gather ? (size_t)H * len * w->cb : _dm_cmp_sums_at(w, H) + len * 2);
    scratch = _dm_cmp_scratch(lk, need);
    if (!scratch) return _DM_FAIL(lk->c, DM_ERR_OUT_OF_MEMORY, "%s: all_reduce: no memory for %zu bytes", lk->tag, need);
    w->m = (float*)(void*)scratch;              /* the maxima (nb + 1), then v (16-bit dtypes), then codes */
    w->v = w->f32 ? (float*)(void*)block : w->m + w->nb + 1;
    w->codes = scratch + fl;
    w->mine = w->gather ? w->codes + (size_t)rail->me * len * w->cb : w->codes;
    if (!w->f32) _dm_cmp_to_float(dtype, block, w->v, len);
    if (cm->res) _dm_cmp_add(w->v, cm->res, len);
    if (cm->mode == DM_COMPRESS_INT8) {
        _dm_cmp_maxima(w->v, len, w->m);
        _DM_TRY(_dm_sch_rd(lk, rail, w->m, w->nb, DM_FLOAT32, DM_MAX, 0, fp));
        _dm_cmp_int8_encode(w->v, len, w->m, (int8_t*)w->mine, cm->res);
    } else {
        _dm_cmp_bf16_encode(w->v, len, (uint16_t*)w->mine, cm->res);
    }
    return DM_OK;
}
/* v (the decoded sum) divided for MEAN and back into the block. */
_DM_PRIVATE void _dm_cmp_end(const _dm_cmp_work* w, unsigned char* block, dm_dtype dtype, int divide) {
    if (divide) _dm_cmp_divide(w->v, w->len, divide);
    if (!w->f32) _dm_cmp_from_float(dtype, w->v, block, w->len);
}
/* Rail's compressed all-reduce of block (len elements of dtype, in place), MEAN's divide last. */
_DM_PRIVATE dm_status _dm_sch_rail_compressed(_dm_eng* lk, const _dm_team* rail, unsigned char* block, size_t len,
                                              dm_dtype dtype, int divide, const _dm_fp* fp, const _dm_cmp* cm) {
    _dm_cmp_work w;
    dm_status st;
    _DM_TRY(_dm_cmp_begin(lk, rail, block, len, dtype, fp, cm, &w));
    lk->on_demand = true;
    if (w.gather) {
        st = _dm_cmp_all_gather(lk, rail, fp, w.codes, len * w.cb);
        if (st == DM_OK) _dm_cmp_sum_gathered(cm->mode, w.codes, rail->n, len, w.m, w.v);
    } else {
        st = _dm_cmp_through_owners(lk, rail, fp, cm, w.mine, w.codes + len * w.cb, w.cmax,
                                    w.codes + _dm_cmp_sums_at(&w, rail->n), len, w.m, w.v);
    }
    lk->on_demand = false;
    if (st == DM_OK) _dm_cmp_end(&w, block, dtype, divide);
    return st;
}

/* >>two-level  The two-level all-reduce: a fold onto R ranks of each host, the host's ring,
   R rails across the hosts, and the way back (_dm_sch_allreduce_2l); with R > 1 the middle runs
   pipelined by segment (_dm_sch_2l_stage). */

/* The pipelined middle of the two-level all-reduce (_dm_sch_allreduce_2l with ring rails): the
   buffer is cut into S segments (_dm_segment), and in stage s the host's ring reduce-scatters
   segment s and all-gathers segment s - 2 (one transfer, both on the host's links) while rail
   i all-reduces block i of segment s - 1 across the hosts (a ring, or between two hosts one
   exchange), the two transfers at once
   (_dm_eng_run_n): a host's shared-memory work hides behind its network link's, and the link
   stays busy. S is the model's choice (>>choice, _dm_pick_2l_segments: more segments hide more
   of the host's work, each costs the rail's steps' latency once more), a function of the
   layout, the count and the dtype, so every rank and every transport cuts alike; each segment
   is cut into R blocks as the whole buffer is when S = 1. At most _dm_sch_2l_max_segments: a
   rail's block of a segment of about _DM_SCH_2L_BLOCK bytes or more, at most
   _DM_SCH_2L_SEGMENTS_MAX segments, and an element per host in every segment's block. */
#define _DM_SCH_2L_BLOCK ((size_t)512 << 10)
#define _DM_SCH_2L_SEGMENTS_MAX 64
_DM_PRIVATE int _dm_pick_2l_segments(const _dm_eng* lk, size_t count, size_t esize, int R, bool rail_ring);
_DM_PRIVATE int _dm_pick_cmp_segments(const _dm_eng* lk, size_t count, size_t esize, int R, dm_compress mode);
/* Whether the two-level all-reduce with R rails runs pipelined: R > 1, each rail one transfer
   (a ring, or one exchange between two hosts; one host has no rail), and every rail's block
   of the whole buffer an element per host. The choice (_dm_pick_2l_segments) and the schedule
   (_dm_sch_allreduce_2l) both ask here. */
_DM_PRIVATE bool _dm_sch_2l_pipelined(const _dm_eng* lk, size_t count, int R, bool rail_ring) {
    int H = lk->lay.H;
    return R > 1 && (rail_ring || H <= 2) && count / (size_t)R >= (size_t)H;
}
/* The segments a compressed two-level all-reduce of count elements runs in: the model's
   between two hosts where it runs pipelined (_dm_sch_allreduce_2l), else 1. Rail rank i
   encodes block i of R of each (its error-feedback residual lives there). */
_DM_PRIVATE int _dm_sch_2l_cmp_segments(const _dm_eng* lk, size_t count, size_t esize, int R, dm_compress mode) {
    return _dm_sch_2l_pipelined(lk, count, R, false) && lk->lay.H == 2 ? _dm_pick_cmp_segments(lk, count, esize, R, mode) : 1;
}
_DM_PRIVATE int _dm_sch_2l_max_segments(size_t count, size_t esize, int R, int H) {
    size_t S = count * esize / (_DM_SCH_2L_BLOCK * (size_t)R);
    if (S > _DM_SCH_2L_SEGMENTS_MAX) S = _DM_SCH_2L_SEGMENTS_MAX;
    while (S > 1 && count / S < (size_t)R * (size_t)H) S--;
    return S < 1 ? 1 : (int)S;
}
/* One ring transfer over team t on the steps st holds (k of them), reducing through scratch tmp. */
_DM_PRIVATE void _dm_sch_ring_xfer(_dm_xfer* x, const _dm_team* t, const _dm_steps* st, int k, dm_dtype dtype,
                                   dm_reduce_op op, const _dm_fp* fp, unsigned char* tmp) {
    memset(x, 0, sizeof(*x));
    x->op = "all_reduce"; x->speer = _dm_team_at(t, 1); x->rpeer = _dm_team_at(t, -1);
    x->ss = st->ss; x->ns = k; x->rs = st->rs; x->nr = k;
    x->dtype = dtype; x->rop = op; x->expect = fp; x->tmp = tmp;
}
/* Stage s of S (see above): the host's transfer and the rail's, together. The rail is a ring
   (rail_ring), or recursive doubling between two hosts: one exchange of the block, each side
   reducing what arrives into its own (after sending it), so both get a op b. */
_DM_PRIVATE dm_status _dm_sch_2l_stage(_dm_eng* lk, const _dm_team* host, const _dm_team* rail, bool rail_ring,
                                       unsigned char* buf, size_t count, dm_dtype dtype, dm_reduce_op op, int divide,
                                       const _dm_fp* fp, int S, int s, const _dm_cmp* cm) {
    size_t esize = dm_dtype_size(dtype), off, len, boff, blen = 0;
    int R = host->n, n = 0, k;
    unsigned char* block = NULL;
    _dm_steps hs, rs;
    _dm_xfer x[2];
    _dm_cmp_work w;
    bool coded = false;                         /* the rail moves codes (cm, two hosts) */
    dm_status st = DM_OK;
    memset(&hs, 0, sizeof(hs));
    memset(&rs, 0, sizeof(rs));
    if (s < S || s >= 2) {
        _DM_TRY(_dm_steps_alloc(lk, &hs, 1 + 2 * (R - 1), fp, "all_reduce"));
        k = 1;
        if (s < S) {
            _dm_segment(count, S, s, &off, &len);
            k = _dm_sch_ring_steps(&hs, k, host, buf + off * esize, buf + off * esize, len, esize, 0, _DM_SCH_RING_RS);
        }
        if (s >= 2) {
            _dm_segment(count, S, s - 2, &off, &len);
            k = _dm_sch_ring_steps(&hs, k, host, buf + off * esize, buf + off * esize, len, esize, 0, _DM_SCH_RING_AG);
        }
        _dm_sch_ring_xfer(&x[n++], host, &hs, k, dtype, op, fp, lk->tmp2);
    }
    if (s >= 1 && s <= S) {
        _dm_segment(count, S, s - 1, &off, &len);
        _dm_segment(len, R, host->me, &boff, &blen);
        block = buf + (off + boff) * esize;
        if (rail->n == 1) {
            if (divide) dm_divide_local(dtype, block, blen, divide);
        } else if (cm) {                        /* two hosts: this host's codes for the other's */
            _dm_cmp blk = *cm;
            if (blk.res) blk.res += off + boff;
            st = _dm_cmp_begin(lk, rail, block, blen, dtype, fp, &blk, &w);
            if (st == DM_OK) st = _dm_steps_alloc(lk, &rs, 2, fp, "all_reduce");
            if (st == DM_OK) {
                rs.ss[1].buf = w.mine; rs.ss[1].len = blen * w.cb; rs.ss[1].gate = -1;
                rs.rs[1].buf = w.codes + (size_t)(1 - rail->me) * blen * w.cb; rs.rs[1].len = blen * w.cb;
                rs.rs[1].after_send = -1;
                _dm_sch_ring_xfer(&x[n++], rail, &rs, 2, DM_UINT8, DM_SUM, fp, NULL);
                coded = true;
            }
        } else {
            st = _dm_steps_alloc(lk, &rs, 1 + 2 * (rail->n - 1), fp, "all_reduce");
            if (st == DM_OK && rail_ring) {
                k = _dm_sch_ring_steps(&rs, 1, rail, block, block, blen, esize, divide, _DM_SCH_RING_RS | _DM_SCH_RING_AG);
                _dm_sch_ring_xfer(&x[n++], rail, &rs, k, dtype, op, fp, NULL);
            } else if (st == DM_OK) {       /* two hosts: the exchange */
                rs.ss[1].buf = block; rs.ss[1].len = blen * esize; rs.ss[1].gate = -1;
                rs.rs[1].buf = block; rs.rs[1].len = blen * esize; rs.rs[1].own = block;
                rs.rs[1].after_send = 1; rs.rs[1].divide = divide;
                _dm_sch_ring_xfer(&x[n++], rail, &rs, 2, dtype, op, fp, NULL);
            }
        }
    }
    if (st == DM_OK && n > 0) st = _dm_eng_run_n(lk, x, n);
    if (st == DM_OK && coded) {
        _dm_cmp_sum_gathered(cm->mode, w.codes, 2, blen, w.m, w.v);
        _dm_cmp_end(&w, block, dtype, divide);
    }
    _dm_free(&lk->c->allocator, hs.ss);
    _dm_free(&lk->c->allocator, hs.rs);
    _dm_free(&lk->c->allocator, rs.ss);
    _dm_free(&lk->c->allocator, rs.rs);
    return st;
}

/* The fold of the two- and three-level all-reduces on a host whose first R ranks (host, in
   local order) do the work: local rank e >= R sends its data to local rank e mod R and gets the
   result back (_dm_sch_folded: its whole part); local rank i < R reduces what its folded ranks
   send, in local order (_dm_sch_fold_in), and at the end sends them the result
   (_dm_sch_fold_out). */
_DM_PRIVATE dm_status _dm_sch_folded(_dm_eng* lk, const _dm_team* host, int R, void* recv, size_t bytes,
                                     const _dm_fp* fp) {
    int core = host->ranks[host->me % R];
    _DM_TRY(_dm_eng_sendrecv(lk, "all_reduce", fp, core, recv, bytes, -1, NULL, 0));
    return _dm_eng_sendrecv(lk, "all_reduce", fp, -1, NULL, 0, core, recv, bytes);
}
_DM_PRIVATE dm_status _dm_sch_fold_in(_dm_eng* lk, const _dm_team* host, int R, void* recv, size_t count,
                                      dm_dtype dtype, dm_reduce_op op, const _dm_fp* fp) {
    int e, L = _dm_sch_host_size(lk, lk->lay.host_of[lk->c->rank]);
    for (e = host->me + R; e < L; e += R)
        _DM_TRY(_dm_eng_sendrecv_reduce(lk, "all_reduce", fp, -1, NULL, host->ranks[e], recv, count, dtype, op));
    return DM_OK;
}
_DM_PRIVATE dm_status _dm_sch_fold_out(_dm_eng* lk, const _dm_team* host, int R, void* recv, size_t bytes,
                                       const _dm_fp* fp) {
    int e, L = _dm_sch_host_size(lk, lk->lay.host_of[lk->c->rank]);
    for (e = host->me + R; e < L; e += R)
        _DM_TRY(_dm_eng_sendrecv(lk, "all_reduce", fp, host->ranks[e], recv, bytes, -1, NULL, 0));
    return DM_OK;
}

/* Two-level all-reduce on recv (holding this rank's data) with R rails, R at most the
   smallest host's size:
     1. fold: on every host, local rank e >= R sends its data to local rank e mod R, which
        reduces what it gets in local order;
     2. the host's first R ranks reduce-scatter (ring): local rank i ends with block i of R;
     3. rail i (local rank i of every host) all-reduces block i across hosts: a ring when the
        block has an element per host and rail_ring is set, else recursive doubling;
     4. the first R ranks all-gather (ring); 5. each sends the result to the ranks it folded.
   With R > 1, and ring rails or two hosts, 2-4 run pipelined by segment (_dm_sch_2l_stage):
   block i is then block i of each segment. R = 1 is the small-message form: reduce to a host leader,
   recursive doubling among the leaders, broadcast inside the host. Every step's order is
   fixed by the layout and the count, so the bits are the same on every transport. */
_DM_PRIVATE dm_status _dm_sch_allreduce_2l(_dm_eng* lk, void* recv, size_t count, dm_dtype dtype, dm_reduce_op op,
                                           int divide, const _dm_fp* fp, int R, bool rail_ring, const _dm_cmp* cm) {
    static const char* name = "all_reduce";
    const _dm_layout* y = &lk->lay;
    int me = lk->c->rank, i = y->local[me], S, s;
    size_t esize = dm_dtype_size(dtype), bytes = count * esize, off, len;
    _dm_team host = _dm_sch_host(lk, R), rail;
    unsigned char* block;
    if (i >= R) return _dm_sch_folded(lk, &host, R, recv, bytes, fp);
    _DM_TRY(_dm_sch_fold_in(lk, &host, R, recv, count, dtype, op, fp));
    rail = _dm_sch_rail(lk, i);
    if (_dm_sch_2l_pipelined(lk, count, R, rail_ring) && (!cm || lk->lay.H == 2)) {
        S = cm ? _dm_sch_2l_cmp_segments(lk, count, esize, R, cm->mode) : _dm_pick_2l_segments(lk, count, esize, R, rail_ring);
        if (!lk->tmp2) lk->tmp2 = (unsigned char*)_dm_malloc(&lk->c->allocator, lk->tmp_size);
        if (!lk->tmp2) return _DM_FAIL(lk->c, DM_ERR_OUT_OF_MEMORY, "%s: %s: out of memory", lk->tag, name);
        for (s = 0; s < S + 2; s++)
            _DM_TRY(_dm_sch_2l_stage(lk, &host, &rail, rail_ring, (unsigned char*)recv, count, dtype, op, divide, fp,
                                     S, s, cm));
    } else {
        if (R > 1) _DM_TRY(_dm_sch_ring(lk, &host, recv, recv, count, dtype, op, 0, fp, _DM_SCH_RING_RS));
        _dm_segment(count, R, i, &off, &len);
        block = (unsigned char*)recv + off * esize;
        if (rail.n == 1) {
            if (divide) dm_divide_local(dtype, block, len, divide);
        } else if (cm) {
            _dm_cmp blk = *cm;
            if (blk.res) blk.res += off;
            _DM_TRY(_dm_sch_rail_compressed(lk, &rail, block, len, dtype, divide, fp, &blk));
        } else if (rail_ring && len >= (size_t)rail.n) {
            _DM_TRY(_dm_sch_ring(lk, &rail, block, block, len, dtype, op, divide, fp, _DM_SCH_RING_RS | _DM_SCH_RING_AG));
        } else {
            _DM_TRY(_dm_sch_rd(lk, &rail, block, len, dtype, op, divide, fp));
        }
        if (R > 1) _DM_TRY(_dm_sch_ring(lk, &host, recv, recv, count, dtype, op, 0, fp, _DM_SCH_RING_AG));
    }
    return _dm_sch_fold_out(lk, &host, R, recv, bytes, fp);
}

/* >>three-level  The three-level all-reduce (DISTMESH_SITE, "three_level"): ranks on a host,
   hosts at a site, sites joined by a slower link. Every byte a two-level schedule would put on
   the site link crosses it once: the sites' rails all-reduce 1 / (R x HS) of the buffer each,
   after the host's ring and the site's rails have reduced it, where HS is the hosts per site:
     1. fold onto the host's first R ranks (R = the smallest host's size), as two-level does;
     2. the host's ring reduce-scatters: local rank i holds block i of R;
     3. site rail i (local rank i of every host of the site, host order) reduce-scatters block
        i (a ring): the rank on the site's host j holds piece j of HS;
     4. cross rail (i, j) (local rank i of host j of every site, site order) all-reduces piece
        j: a ring over three sites or more, else recursive doubling (two sites: one exchange);
     5-7. the site rail's all-gather, the host's all-gather, the result back to the folded.
   Runs where every site has the same number of hosts and every piece an element per site
   (_dm_sch_3l_fits); the choice (>>choice) weighs it against the others. Phases run one after
   the other: the site link's phase is the long one by far. The order of reduction is fixed by
   the layout and the count, so the bits are the same on every transport. */

/* Site rail i: local rank i of every host of this rank's site, host order (the team scratch). */
_DM_PRIVATE _dm_team _dm_sch_site_rail(_dm_eng* lk, int i) {
    _dm_layout* y = &lk->lay;
    int h = y->host_of[lk->c->rank], first = y->site_start[y->site_of[h]], n = y->site_start[y->site_of[h] + 1] - first, k;
    for (k = 0; k < n; k++) y->team[k] = y->members[y->start[first + k] + i];
    return _dm_team_of(y->team, n, h - first);
}
/* Cross rail (i, j): local rank i of host j of every site, site order, j this rank's host's
   index at its site (the team scratch's second third, beside a site rail). */
_DM_PRIVATE _dm_team _dm_sch_cross_rail(_dm_eng* lk, int i) {
    _dm_layout* y = &lk->lay;
    int W = lk->c->size, h = y->host_of[lk->c->rank], s = y->site_of[h], j = h - y->site_start[s], k;
    for (k = 0; k < y->NS; k++) y->team[W + k] = y->members[y->start[y->site_start[k] + j] + i];
    return _dm_team_of(y->team + W, y->NS, s);
}
/* Whether the three-level all-reduce can run on count elements: two sites or more, every site
   the same number of hosts, and an element per site in every piece of step 4. */
_DM_PRIVATE bool _dm_sch_3l_fits(const _dm_eng* lk, size_t count) {
    const _dm_layout* y = &lk->lay;
    return y->NS > 1 && y->HSmin == y->HSmax && count >= (size_t)y->Lmin * (size_t)y->HSmin * (size_t)y->NS;
}
/* The bounds of this rank's piece in step 4 (ranks at local index >= R have none: len 0). */
_DM_PRIVATE void _dm_sch_3l_piece(_dm_eng* lk, size_t count, size_t* off, size_t* len) {
    const _dm_layout* y = &lk->lay;
    int i = y->local[lk->c->rank], h = y->host_of[lk->c->rank], s = y->site_of[h];
    size_t boff, blen;
    *off = *len = 0;
    if (i >= y->Lmin) return;
    _dm_segment(count, y->Lmin, i, &boff, &blen);
    _dm_segment(blen, y->site_start[s + 1] - y->site_start[s], h - y->site_start[s], off, len);
    *off += boff;
}
/* Steps 3-5 run pipelined by segment as the two-level middle does (_dm_sch_2l_stage, with the
   site rail as its host ring and the cross rail as its rail): in stage s the site rail
   reduce-scatters segment s of block i and all-gathers segment s - 2 while the cross rail
   all-reduces its piece of segment s - 1, so the site's links work while the site link does.
   S from the model (_dm_pick_3l_segments; 1: one phase after the other).
   cm (dm_all_reduce_compressed, DISTMESH_COMPRESS): the cross rails move codes
   (>>compressed rails), so only the site link is compressed; inside a site the sums stay exact.
   Not pipelined: each rank's residual stays on one piece (_dm_sch_3l_piece). */
_DM_PRIVATE int _dm_pick_3l_segments(const _dm_eng* lk, size_t len, size_t esize);
_DM_PRIVATE dm_status _dm_sch_allreduce_3l(_dm_eng* lk, void* recv, size_t count, dm_dtype dtype, dm_reduce_op op,
                                           int divide, const _dm_fp* fp, const _dm_cmp* cm) {
    const _dm_layout* y = &lk->lay;
    int R = y->Lmin, i = y->local[lk->c->rank], S, s;
    size_t esize = dm_dtype_size(dtype), bytes = count * esize, off, len, poff, plen;
    _dm_team host = _dm_sch_host(lk, R), site, cross;
    unsigned char *block, *piece;
    if (i >= R) return _dm_sch_folded(lk, &host, R, recv, bytes, fp);
    _DM_TRY(_dm_sch_fold_in(lk, &host, R, recv, count, dtype, op, fp));
    if (R > 1) _DM_TRY(_dm_sch_ring(lk, &host, recv, recv, count, dtype, op, 0, fp, _DM_SCH_RING_RS));
    _dm_segment(count, R, i, &off, &len);
    block = (unsigned char*)recv + off * esize;
    site = _dm_sch_site_rail(lk, i);
    cross = _dm_sch_cross_rail(lk, i);
    S = cm ? 1 : _dm_pick_3l_segments(lk, len, esize);
    if (S > 1) {                                /* steps 3-5 pipelined by segment */
        if (!lk->tmp2) lk->tmp2 = (unsigned char*)_dm_malloc(&lk->c->allocator, lk->tmp_size);
        if (!lk->tmp2) return _DM_FAIL(lk->c, DM_ERR_OUT_OF_MEMORY, "%s: all_reduce: out of memory", lk->tag);
        for (s = 0; s < S + 2; s++)
            _DM_TRY(_dm_sch_2l_stage(lk, &site, &cross, cross.n > 2, block, len, dtype, op, divide, fp, S, s, NULL));
        if (R > 1) _DM_TRY(_dm_sch_ring(lk, &host, recv, recv, count, dtype, op, 0, fp, _DM_SCH_RING_AG));
        return _dm_sch_fold_out(lk, &host, R, recv, bytes, fp);
    }
    if (site.n > 1) _DM_TRY(_dm_sch_ring(lk, &site, block, block, len, dtype, op, 0, fp, _DM_SCH_RING_RS));
    _dm_segment(len, site.n, site.me, &poff, &plen);
    piece = block + poff * esize;
    if (cm) {
        _dm_cmp blk = *cm;
        if (blk.res) blk.res += off + poff;
        _DM_TRY(_dm_sch_rail_compressed(lk, &cross, piece, plen, dtype, divide, fp, &blk));
    } else if (cross.n > 2) _DM_TRY(_dm_sch_ring(lk, &cross, piece, piece, plen, dtype, op, divide, fp, _DM_SCH_RING_RS | _DM_SCH_RING_AG));
    else _DM_TRY(_dm_sch_rd(lk, &cross, piece, plen, dtype, op, divide, fp));
    if (site.n > 1) _DM_TRY(_dm_sch_ring(lk, &site, block, block, len, dtype, op, 0, fp, _DM_SCH_RING_AG));
    if (R > 1) _DM_TRY(_dm_sch_ring(lk, &host, recv, recv, count, dtype, op, 0, fp, _DM_SCH_RING_AG));
    return _dm_sch_fold_out(lk, &host, R, recv, bytes, fp);
}

/* >>chain  The pipelined chain broadcast runs on: along the flat ring from the root, or host by
   host (two-level, >>entry points). */

/* Pipelined chain over team t from the rank at position root_pos; each rank forwards bytes to
   the next as they arrive from the previous. Every rank (the root too) compares a fingerprint
   from its predecessor, whatever root it was given: the last rank closes the ring with its
   own, and the root sends data only once that one agreed. Then the last rank, holding all the
   data, sends a done token to the root, which passes it down the chain; a rank returns once it
   has it. So no rank returns DM_OK unless every rank's arguments agreed (the token costs one
   more pass of a byte around the ring). */
_DM_PRIVATE dm_status _dm_sch_chain(_dm_eng* lk, const _dm_team* t, int root_pos, void* buf, size_t bytes,
                                    dm_dtype dtype, const _dm_fp* fp) {
    int W = t->n, pos = _dm_mod(t->me - root_pos, W), ns, nr;
    unsigned char token_out = 1, token_in = 0;
    _dm_sstep ss[3];
    _dm_rstep rs[3];
    _dm_fpbufs b;
    _DM_ZERO(_dm_xfer, x);
    memset(ss, 0, sizeof(ss));
    memset(rs, 0, sizeof(rs));
    _dm_fp_steps(&b, fp, &ss[0], &rs[0]);
    ns = nr = 1;
    if (pos < W - 1) {                      /* data on to the next rank */
        ss[ns].buf = (const unsigned char*)buf; ss[ns].len = bytes;
        ss[ns].gate = pos == 0 ? -1 : 1;
        ss[ns].after_recvs = pos == 0 ? 1 : 0;
        ns++;
    }
    if (pos > 0) {                          /* data from the previous rank */
        rs[nr].buf = (unsigned char*)buf; rs[nr].len = bytes; rs[nr].after_send = -1;
        nr++;
    }
    if (pos < W - 1) {                      /* the token: from the last rank (root) or the previous */
        rs[nr].buf = &token_in; rs[nr].len = 1; rs[nr].after_send = -1;
        nr++;
    }
    if (pos == W - 1 || pos < W - 2) {      /* the token on: the last starts it, W-2 ends it */
        ss[ns].buf = &token_out; ss[ns].len = 1; ss[ns].gate = -1;
        ss[ns].after_recvs = nr;
        ns++;
    }
    x.op = "broadcast";
    x.speer = _dm_team_at(t, 1);
    x.rpeer = _dm_team_at(t, -1);
    x.ss = ss; x.ns = ns; x.rs = rs; x.nr = nr;
    x.dtype = dtype; x.rop = DM_SUM; x.expect = fp;
    return _dm_eng_run(lk, &x);
}

/* >>dissemination  The barrier's rounds over a team: over every rank (flat), or among the host
   leaders (two-level, >>entry points). */

/* Dissemination barrier over team t: round k sends to index me + 2^k and waits for me - 2^k.
   The fingerprint carries the round (first + k) in its root field. */
_DM_PRIVATE dm_status _dm_sch_dissemination(_dm_eng* lk, const _dm_team* t, int first) {
    int k, round = first;
    _dm_fp fp;
    for (k = 1; k < t->n; k <<= 1, round++) {
        _dm_fp_make(&fp, lk->c, _DM_K_BARRIER, -1, -1, round, 0);
        _DM_TRY(_dm_eng_sendrecv(lk, "barrier", &fp, _dm_team_at(t, k), NULL, 0, _dm_team_at(t, -k), NULL, 0));
    }
    return DM_OK;
}

/* >>three-level others  all_gather, reduce_scatter, barrier and the broadcast chain across sites
   ("three_level_ring", "three_level_dissemination", "three_level_chain"): as the three-level
   all-reduce (>>three-level), every byte that must reach another site crosses the site link
   once, a barrier crosses it only in the site leaders' dissemination, and the chain crosses
   each site boundary once. The gathers run on even layouts (every host L ranks, every site HS
   hosts: _dm_pick_gather_three_level), the barrier and the chain on any sited one. */

/* The broadcast chain's k-th host from the root's host rh across sites: the hosts of rh's site
   from rh on, around the site, then the hosts after that site in host order, around: the other
   sites one after the other (hosts are numbered site by site). */
_DM_PRIVATE int _dm_sch_chain_host(const _dm_layout* y, int rh, int k) {
    int s = y->site_of[rh], first = y->site_start[s], HS = y->site_start[s + 1] - first;
    if (k < HS) return first + (rh - first + k) % HS;
    return (y->site_start[s + 1] + k - HS) % y->H;
}
/* The rank at local index i of host j of site k. */
_DM_PRIVATE int _dm_sch_3l_at(const _dm_layout* y, int k, int j, int i) {
    return y->members[y->start[y->site_start[k] + j] + i];
}
/* The host's ring of the two- and three-level all-gathers, their last step: local rank p's
   pieces are rail p's H blocks of recvs, host order. pieces: W entries of scratch. */
_DM_PRIVATE dm_status _dm_sch_all_gather_host(_dm_eng* lk, int kind, void* const* recvs, void** pieces, size_t bytes,
                                              dm_dtype dtype, const _dm_fp* fp) {
    const _dm_layout* y = &lk->lay;
    _dm_team t = _dm_sch_host(lk, y->Lmax);
    int p, q;
    for (p = 0; p < y->Lmax; p++)
        for (q = 0; q < y->H; q++) pieces[p * y->H + q] = recvs[y->members[y->start[q] + p]];
    return _dm_sch_ring_gather(lk, &t, pieces, y->H, bytes, kind, dtype, fp);
}
/* The host's ring of the two- and three-level reduce-scatters, their first step: rail i's H
   blocks of in (W blocks of bytes, rank order) reduced over the host into tmp (H blocks, host
   order) for local rank i; a host of one rank copies its blocks. pieces: W entries. */
_DM_PRIVATE dm_status _dm_sch_reduce_scatter_host(_dm_eng* lk, const unsigned char* in, const unsigned char** pieces,
                                                  unsigned char* tmp, size_t bytes, dm_dtype dtype, dm_reduce_op op,
                                                  const _dm_fp* fp) {
    const _dm_layout* y = &lk->lay;
    _dm_team t = _dm_sch_host(lk, y->Lmax);
    int p, q;
    for (p = 0; p < y->Lmax; p++)
        for (q = 0; q < y->H; q++) pieces[p * y->H + q] = in + (size_t)y->members[y->start[q] + p] * bytes;
    if (y->Lmax > 1) return _dm_sch_ring_rs(lk, &t, pieces, tmp, tmp, y->H, bytes, dtype, op, 0, fp);
    for (q = 0; q < y->H; q++) memcpy(tmp + (size_t)q * bytes, pieces[q], bytes);
    return DM_OK;
}
/* All-gather of W blocks of bytes into recvs (this rank's in place), over cross rail (i, j):
   the NS sites' blocks; then site rail i: the HS hosts' NS blocks each; then the host's ring:
   the L local ranks' H blocks each. The site link carries each block to each other site once
   (the two-level rails' ring carries (H - 1) / (NS - 1) / HS times as much). pieces: W
   entries of scratch. */
_DM_PRIVATE dm_status _dm_sch_all_gather_3l(_dm_eng* lk, int kind, void* const* recvs, void** pieces, size_t bytes,
                                            dm_dtype dtype, const _dm_fp* fp) {
    const _dm_layout* y = &lk->lay;
    int i = y->local[lk->c->rank], HS = y->HSmin, NS = y->NS, j, k;
    _dm_team t = _dm_sch_cross_rail(lk, i);
    for (k = 0; k < NS; k++) pieces[k] = recvs[t.ranks[k]];
    _DM_TRY(_dm_sch_ring_gather(lk, &t, pieces, 1, bytes, kind, dtype, fp));
    t = _dm_sch_site_rail(lk, i);                 /* host j's pieces: its rank i's sites, site order */
    for (j = 0; j < HS; j++)
        for (k = 0; k < NS; k++) pieces[j * NS + k] = recvs[_dm_sch_3l_at(y, k, j, i)];
    _DM_TRY(_dm_sch_ring_gather(lk, &t, pieces, NS, bytes, kind, dtype, fp));
    return _dm_sch_all_gather_host(lk, kind, recvs, pieces, bytes, dtype, fp);
}
/* Reduce-scatter, the all-gather's steps backwards: the host's ring reduces, for local rank i,
   rail i's H blocks (into tmp, host order, so site by site); site rail i reduces those into
   the NS blocks of its host's rank i at each site (tmp + H blocks); cross rail (i, j) reduces
   them into this rank's block of out (MEAN divides there). in: W blocks of bytes, rank order,
   read only in the first step, so out may be one of them. pieces: W entries; tmp: H + NS
   blocks. */
_DM_PRIVATE dm_status _dm_sch_reduce_scatter_3l(_dm_eng* lk, const unsigned char* in, const unsigned char** pieces,
                                                unsigned char* out, unsigned char* tmp, size_t bytes, dm_dtype dtype,
                                                dm_reduce_op op, int divide, const _dm_fp* fp) {
    const _dm_layout* y = &lk->lay;
    int i = y->local[lk->c->rank], HS = y->HSmin, NS = y->NS, j, k;
    unsigned char* mid = tmp + (size_t)y->H * bytes;
    _dm_team t;
    _DM_TRY(_dm_sch_reduce_scatter_host(lk, in, pieces, tmp, bytes, dtype, op, fp));
    t = _dm_sch_site_rail(lk, i);                 /* host j's pieces: site by site */
    for (j = 0; j < HS; j++)
        for (k = 0; k < NS; k++) pieces[j * NS + k] = tmp + (size_t)(y->site_start[k] + j) * bytes;
    if (HS > 1) _DM_TRY(_dm_sch_ring_rs(lk, &t, pieces, mid, mid, NS, bytes, dtype, op, 0, fp));
    else for (k = 0; k < NS; k++) memcpy(mid + (size_t)k * bytes, pieces[k], bytes);
    t = _dm_sch_cross_rail(lk, i);
    for (k = 0; k < NS; k++) pieces[k] = mid + (size_t)k * bytes;
    return _dm_sch_ring_rs(lk, &t, pieces, out, out, 1, bytes, dtype, op, divide, fp);
}
/* Barrier: every rank tells its host's leader (local rank 0), each host's leader its site's
   leader (the first host's), the site leaders disseminate across the site link (ceil(log2
   NS) rounds instead of the host leaders' ceil(log2 H)), and the releases come back down. */
#define _DM_BARRIER_ROUND_ARRIVE 1000
#define _DM_BARRIER_ROUND_RELEASE 1001
#define _DM_BARRIER_ROUND_SITE_ARRIVE 1002
#define _DM_BARRIER_ROUND_SITE_RELEASE 1003
/* A leader's side of a barrier level: an arrival from each of n ranks, later a release to
   each; a member's side: its arrival at its leader, then the leader's release. */
_DM_PRIVATE dm_status _dm_sch_gather_arrivals(_dm_eng* lk, const _dm_fp* arrive, const int* from, int n) {
    int e;
    for (e = 0; e < n; e++) _DM_TRY(_dm_eng_sendrecv(lk, "barrier", arrive, -1, NULL, 0, from[e], NULL, 0));
    return DM_OK;
}
_DM_PRIVATE dm_status _dm_sch_send_releases(_dm_eng* lk, const _dm_fp* release, const int* to, int n) {
    int e;
    for (e = 0; e < n; e++) _DM_TRY(_dm_eng_sendrecv(lk, "barrier", release, to[e], NULL, 0, -1, NULL, 0));
    return DM_OK;
}
_DM_PRIVATE dm_status _dm_sch_arrive_wait(_dm_eng* lk, const _dm_fp* arrive, const _dm_fp* release, int leader) {
    _DM_TRY(_dm_eng_sendrecv(lk, "barrier", arrive, leader, NULL, 0, -1, NULL, 0));
    return _dm_eng_sendrecv(lk, "barrier", release, -1, NULL, 0, leader, NULL, 0);
}
_DM_PRIVATE dm_status _dm_sch_barrier_3l(_dm_eng* lk) {
    _dm_layout* y = &lk->lay;
    dm_collective* c = lk->c;
    int h = y->host_of[c->rank], s = y->site_of[h], first = y->site_start[s], hosts = y->site_start[s + 1] - first, k;
    const int* host = y->members + y->start[h];
    _dm_fp arrive, release, site_arrive, site_release;
    _dm_team t;
    _dm_fp_make(&arrive, c, _DM_K_BARRIER, -1, -1, _DM_BARRIER_ROUND_ARRIVE, 0);
    _dm_fp_make(&release, c, _DM_K_BARRIER, -1, -1, _DM_BARRIER_ROUND_RELEASE, 0);
    _dm_fp_make(&site_arrive, c, _DM_K_BARRIER, -1, -1, _DM_BARRIER_ROUND_SITE_ARRIVE, 0);
    _dm_fp_make(&site_release, c, _DM_K_BARRIER, -1, -1, _DM_BARRIER_ROUND_SITE_RELEASE, 0);
    if (y->local[c->rank] > 0) return _dm_sch_arrive_wait(lk, &arrive, &release, host[0]);
    _DM_TRY(_dm_sch_gather_arrivals(lk, &arrive, host + 1, _dm_sch_host_size(lk, h) - 1));
    for (k = 1; k < hosts; k++) y->team[k - 1] = y->members[y->start[first + k]];     /* the site's other leaders */
    if (h != first) {
        _DM_TRY(_dm_sch_arrive_wait(lk, &site_arrive, &site_release, y->members[y->start[first]]));
    } else {
        _DM_TRY(_dm_sch_gather_arrivals(lk, &site_arrive, y->team, hosts - 1));
        for (k = 0; k < y->NS; k++) y->team[c->size + k] = y->members[y->start[y->site_start[k]]];
        t = _dm_team_of(y->team + c->size, y->NS, s);
        _DM_TRY(_dm_sch_dissemination(lk, &t, 0));
        _DM_TRY(_dm_sch_send_releases(lk, &site_release, y->team, hosts - 1));
    }
    return _dm_sch_send_releases(lk, &release, host + 1, _dm_sch_host_size(lk, h) - 1);
}

/* >>choice  Which algorithm a collective runs: a fixed function of the group's size, its host
   layout, the count and the dtype, so every rank of a group picks the same one, and the same
   inputs on the same layout give the same bits on every transport (the threaded world given
   that layout, shared memory + sockets, sockets alone). Nothing is measured at run time.

   The model (Hockney: a message of b bytes over a link of class c costs alpha_c + b * beta_c;
   the steps of one phase run on all links at once, so a phase costs its slowest link's steps)
   has three link classes, listed once below (_DM_COST_CLASSES): shared memory, same-host
   socket, cross-host socket. Ranks of one host are costed as shared memory whatever carries them, so that the choice
   never depends on the transport (DISTMESH_TRANSPORT=tcp gives the same bits); the same-host
   socket class is there for the predictions in docs/performance.md.

   One model, on paper too: scripts/cost_model.py does not copy it. It asks the model's front
   end (scripts/cost_model.c, this section's functions on a layout it is given, with other
   link classes where it predicts other networks through _dm_eng.cost), and tests/test_maps.c
   holds the script's answers against what the collectives run on the threaded world
   (dm_last_algorithm). A new all_reduce algorithm enters the model in two
   places here: its cost in _dm_cost_all_reduce, and when it may run in _dm_pick_all_reduce;
   the front end, the script's table and P (>>peers) take it from the list (>>algorithms).

   all_reduce (and reduce, which gives the root all_reduce's bits):
     one host, or one rank per host: recursive doubling at or below 64 KiB or with fewer
       elements than ranks, else the ring (measured on one host, not from this model);
     else the cheapest by the model of: the flat ring, flat recursive doubling, two-level with
       R = the smallest host's size rails (each rail a ring or recursive doubling, the cheaper)
       and two-level with one rail (host leaders, recursive doubling among them).
   all_gather, reduce_scatter: two-level (rails, then the host) when every host has the same
     number L > 1 of ranks, there are H > 1 hosts and the model says it is cheaper.
   broadcast: a chain from the root through its host, then host by host (two-level) whenever
     H > 1: it crosses each host boundary once.
   barrier: two-level (host leaders, dissemination among them) when the model says so.
   DISTMESH_ALGO forces the family (flat, two_level) or the all_reduce algorithm. */
/* The link classes: name, alpha (us), beta (ns per byte), what they stand for. */
#define _DM_COST_CLASSES(X)                                                                    \
    X(SHM, 1.0, 0.125, "shared memory: 8 GB/s, one core's memcpy")                             \
    X(SAME_HOST_SOCKET, 10.0, 0.6, "same-host socket: 1.6 GB/s, loopback TCP")                 \
    X(CROSS_HOST, 25.0, 0.8, "cross-host socket: 10 Gbit/s, shared by a host's flows")         \
    X(CROSS_SITE, 5000.0, 8.0, "cross-site link: 5 ms, 1 Gbit/s, shared by a site's flows")
enum {
#define _DM_X(name, alpha, beta, text) _DM_COST_##name,
    _DM_COST_CLASSES(_DM_X)
#undef _DM_X
    _DM_COST_NCLASSES
};
static const _dm_link_cost _dm_cost_classes[_DM_COST_NCLASSES] = {
#define _DM_X(name, alpha, beta, text) { alpha, beta },
    _DM_COST_CLASSES(_DM_X)
#undef _DM_X
};
/* Class k as this group's model sees it: the classes above, unless given others (lk->cost). */
_DM_PRIVATE const _dm_link_cost* _dm_cost_class(const _dm_eng* lk, int k) {
    if (lk->cost) return &lk->cost[k];
    if (k == _DM_COST_CROSS_HOST && lk->link_env[0].alpha_us > 0) return &lk->link_env[0];  /* DISTMESH_HOST_LINK */
    if (k == _DM_COST_CROSS_SITE && lk->link_env[1].alpha_us > 0) return &lk->link_env[1];  /* DISTMESH_SITE_LINK */
    return &_dm_cost_classes[k];
}
/* steps messages of b bytes each, in microseconds. */
_DM_PRIVATE double _dm_cost(const _dm_link_cost* k, double steps, double b) {
    return steps * (k->alpha_us + b * k->beta_ns * 1e-3);
}
_DM_PRIVATE int _dm_ceil_log2(int n) { int k = 0; while ((1 << k) < n) k++; return k; }
/* The model's scratch, 5 x size entries after the teams' (_dm_layout.team): a round's counts
   per host and per site (2 x size), its senders and partners (size each), a rail's leaders. */
_DM_PRIVATE int* _dm_cost_scratch(const _dm_eng* lk) { return lk->lay.team + 2 * lk->c->size; }
/* steps messages over two classes at once, b_site bytes on each site link and b_host on each
   host link per step: the slower of the two, or the host link's alone on one site. */
_DM_PRIVATE double _dm_cost_sites(const _dm_eng* lk, double steps, double b_site, double b_host) {
    double host = _dm_cost(_dm_cost_class(lk, _DM_COST_CROSS_HOST), steps, b_host), site;
    if (lk->lay.NS < 2) return host;
    site = _dm_cost(_dm_cost_class(lk, _DM_COST_CROSS_SITE), steps, b_site);
    return site > host ? site : host;
}
/* One round of pairs (rank a[i] sends b bytes to o[i], i < n): its slowest link. A host's
   flows across share its link, and a site's flows to other sites share the site's link, so a
   round costs alpha + (the most ranks of one host sending across) * b * beta, or the site
   link's for the most ranks of one site sending to another, whichever is slower; a round
   inside the hosts costs shared memory's. per_host: 2 x size entries of scratch. */
_DM_PRIVATE double _dm_cost_round(const _dm_eng* lk, const int* a, const int* o, int n, double b, int* per_host) {
    const _dm_layout* y = &lk->lay;
    int i, most = 0, most_site = 0, *per_site = per_host + y->H;
    for (i = 0; i < y->H; i++) per_host[i] = 0;
    for (i = 0; i < y->NS; i++) per_site[i] = 0;
    for (i = 0; i < n; i++) {
        int ha = y->host_of[a[i]], ho = y->host_of[o[i]];
        if (ha != ho && ++per_host[ha] > most) most = per_host[ha];
        if (y->site_of[ha] != y->site_of[ho] && ++per_site[y->site_of[ha]] > most_site) most_site = per_site[y->site_of[ha]];
    }
    return most ? _dm_cost_sites(lk, 1, b * most_site, b * most) : _dm_cost(_dm_cost_class(lk, _DM_COST_SHM), 1, b);
}
/* Recursive doubling over a team of N ranks (rank(i) at index i) with b bytes, round by round:
   over every rank (identity order), or over the host leaders (a rail). */
_DM_PRIVATE double _dm_cost_rd_rounds(const _dm_eng* lk, int N, const int* ranks, double b) {
    int W = lk->c->size, p = 1, rem, mask, q, n;
    int *per_host = _dm_cost_scratch(lk), *a = per_host + 2 * W, *o = a + W;  /* counts, senders, partners */
    double t = 0;
    while (p * 2 <= N) p *= 2;
    rem = N - p;
#define _DM_RANK_AT(i) (ranks ? ranks[i] : (i))
    for (q = 0, n = 0; q < rem; q++) { a[n] = _DM_RANK_AT(2 * q); o[n++] = _DM_RANK_AT(2 * q + 1); }
    if (rem) t += 2 * _dm_cost_round(lk, a, o, n, b, per_host);
    for (mask = 1; mask < p; mask <<= 1) {
        for (q = 0, n = 0; q < p; q++) {
            int pn = q ^ mask;
            a[n] = _DM_RANK_AT(q < rem ? 2 * q + 1 : q + rem);
            o[n++] = _DM_RANK_AT(pn < rem ? 2 * pn + 1 : pn + rem);
        }
        t += _dm_cost_round(lk, a, o, n, b, per_host);
    }
#undef _DM_RANK_AT
    return t;
}
_DM_PRIVATE double _dm_cost_flat_rd(const _dm_eng* lk, double b) { return _dm_cost_rd_rounds(lk, lk->c->size, NULL, b); }
/* The rails' recursive doubling across sites: the rounds of the host leaders' rail (each
   leader's b bytes stand for its host's R rails of b/R), in the model's own scratch. */
_DM_PRIVATE double _dm_cost_2l_rd_rails(const _dm_eng* lk, double b) {
    const _dm_layout* y = &lk->lay;
    int h, *leaders = _dm_cost_scratch(lk) + 4 * lk->c->size;
    for (h = 0; h < y->H; h++) leaders[h] = y->members[y->start[h]];
    return _dm_cost_rd_rounds(lk, y->H, leaders, b);
}
/* The flat ring crosses each host boundary, and each site boundary, once per step. */
_DM_PRIVATE double _dm_cost_flat_ring(const _dm_eng* lk, double b) {
    int W = lk->c->size;
    if (lk->lay.H < 2) return _dm_cost(_dm_cost_class(lk, _DM_COST_SHM), 2.0 * (W - 1), b / W);
    return _dm_cost_sites(lk, 2.0 * (W - 1), b / W, b / W);
}
/* The host's ring (R ranks) and the rails of the two-level all-reduce on b bytes, run over S
   segments: one after the other when S = 1, else pipelined (_dm_sch_2l_stage), the larger of
   the two (each S times as many steps of 1/S the bytes) plus the host's share of one segment
   (the reduce-scatter of the first, the all-gather of the last). A host's R rails share its
   link, so a rail step of b/R/H bytes costs the host b/H. Across sites a ring rail step puts
   b/H on each site link too (one host per site sends across); recursive doubling's rounds
   are those of its first host's ranks (_dm_cost_2l_rd_rails). */
_DM_PRIVATE double _dm_cost_2l_middle(const _dm_eng* lk, double b, int R, bool rail_ring, int S) {
    int H = lk->lay.H;
    double host = _dm_cost(_dm_cost_class(lk, _DM_COST_SHM), 2.0 * (R - 1) * S, b / R / S), rails;
    if (rail_ring) rails = _dm_cost_sites(lk, 2.0 * (H - 1) * S, b / H / S, b / H / S);
    else rails = lk->lay.NS > 1 ? S * _dm_cost_2l_rd_rails(lk, b / S)
                                : _dm_cost(_dm_cost_class(lk, _DM_COST_CROSS_HOST),
                                           (double)(_dm_ceil_log2(H) + ((H & (H - 1)) ? 2 : 0)) * S, b / S);
    if (S == 1) return host + rails;
    return (host > rails ? host : rails) + host / S;
}
/* The segments of the pipelined two-level all-reduce (R > 1, and ring rails or two hosts):
   of 1, 2, 4, ... and the most allowed (_dm_sch_2l_max_segments), the cheapest by the model
   (ties: the fewer). Else 1. */
_DM_PRIVATE int _dm_pick_2l_segments(const _dm_eng* lk, size_t count, size_t esize, int R, bool rail_ring) {
    int most = _dm_sch_2l_pipelined(lk, count, R, rail_ring) ? _dm_sch_2l_max_segments(count, esize, R, lk->lay.H) : 1;
    int S, best = 1;
    double b = (double)count * (double)esize, least = _dm_cost_2l_middle(lk, b, R, rail_ring, 1);
    for (S = 2; most > 1; S *= 2) {
        int k = S < most ? S : most;
        double t = _dm_cost_2l_middle(lk, b, R, rail_ring, k);
        if (t < least) { least = t; best = k; }
        if (S >= most) break;
    }
    return best;
}
/* Three-level (>>three-level) on b bytes, its steps inside a host: the fold and its return, the
   host's ring (R ranks); inside the sites: those and the site rails' ring (a host's R rails
   share its link: b/HS per step). */
_DM_PRIVATE double _dm_cost_3l_host(const _dm_eng* lk, double b) {
    const _dm_link_cost* shm = _dm_cost_class(lk, _DM_COST_SHM);
    int R = lk->lay.Lmin;
    return _dm_cost(shm, 2.0 * ((lk->lay.Lmax - 1) / R), b) + _dm_cost(shm, 2.0 * (R - 1), b / R);
}
_DM_PRIVATE double _dm_cost_3l_inside(const _dm_eng* lk, double b) {
    int HS = lk->lay.HSmin;
    double t = _dm_cost_3l_host(lk, b);
    return HS > 1 ? t + _dm_cost(_dm_cost_class(lk, _DM_COST_CROSS_HOST), 2.0 * (HS - 1), b / HS) : t;
}
_DM_PRIVATE double _dm_cost_3l_middle(const _dm_eng* lk, double b, int S);
_DM_PRIVATE int _dm_pick_3l_segments(const _dm_eng* lk, size_t len, size_t esize);
/* The fold and the host's ring, then the middle over the model's segments (S = 1: one phase
   after the other; the cross rails: a site's R x HS rails share its link, b/NS per ring step,
   or one exchange between two sites of b per site link and b/HS per host link). */
_DM_PRIVATE double _dm_cost_three_level(const _dm_eng* lk, size_t count, size_t esize) {
    int S = _dm_pick_3l_segments(lk, count / (size_t)lk->lay.Lmin, esize);
    double b = (double)count * (double)esize;
    return _dm_cost_3l_host(lk, b) + _dm_cost_3l_middle(lk, b, S);
}
/* Three-level's steps 3-5 on b bytes (a host's R blocks together) over S segments, as
   _dm_cost_2l_middle: one after the other when S = 1, else the larger of the site rails' and
   the cross rails' parts plus the site rails' share of one segment. */
_DM_PRIVATE double _dm_cost_3l_middle(const _dm_eng* lk, double b, int S) {
    int HS = lk->lay.HSmin, NS = lk->lay.NS;
    double site = _dm_cost(_dm_cost_class(lk, _DM_COST_CROSS_HOST), 2.0 * (HS - 1) * S, b / HS / S), cross;
    if (NS > 2) cross = _dm_cost_sites(lk, 2.0 * (NS - 1) * S, b / NS / S, b / HS / NS / S);
    else cross = _dm_cost_sites(lk, (double)S, b / S, b / HS / S);
    if (S == 1) return site + cross;
    return (site > cross ? site : cross) + site / S;
}
/* The segments of three-level's middle for a block of len elements: 1 where it cannot be cut
   (one host per site, or a piece of a segment without an element per site), else of 1, 2,
   4, ... and the most allowed (_dm_sch_2l_max_segments on the site rails), the cheapest. */
_DM_PRIVATE int _dm_pick_3l_segments(const _dm_eng* lk, size_t len, size_t esize) {
    const _dm_layout* y = &lk->lay;
    int HS = y->HSmin, NS = y->NS, most, S, best = 1;
    double b = (double)len * (double)esize * y->Lmin, least;
    if (HS < 2 || len / (size_t)HS < (size_t)NS) return 1;
    most = _dm_sch_2l_max_segments(len, esize, HS, NS);
    least = _dm_cost_3l_middle(lk, b, 1);
    for (S = 2; most > 1; S *= 2) {
        int k = S < most ? S : most;
        double t = _dm_cost_3l_middle(lk, b, k);
        if (t < least) { least = t; best = k; }
        if (S >= most) break;
    }
    return best;
}
/* The compressed three-level all-reduce: the cross rails gather the site's codes (n elements
   of cb bytes per site link, NS - 1 steps), int8's maxima agreed first. */
_DM_PRIVATE double _dm_cost_3l_compressed(const _dm_eng* lk, size_t count, size_t esize, dm_compress mode) {
    int HS = lk->lay.HSmin, NS = lk->lay.NS;
    double n = (double)count, cb = mode == DM_COMPRESS_INT8 ? 1 : 2, t;
    t = _dm_cost_3l_inside(lk, n * (double)esize) + _dm_cost_sites(lk, NS - 1.0, n * cb, n * cb / HS);
    if (mode == DM_COMPRESS_INT8) {
        double m = n / DM_COMPRESS_BLOCK * 4;
        t += _dm_cost_sites(lk, _dm_ceil_log2(NS), m, m / HS);
    }
    return t;
}
/* Two-level with R rails: the fold and its return, then the host's ring and the rails. */
_DM_PRIVATE double _dm_cost_two_level(const _dm_eng* lk, size_t count, size_t esize, int R, bool rail_ring) {
    const _dm_layout* y = &lk->lay;
    double b = (double)count * (double)esize;
    return _dm_cost(_dm_cost_class(lk, _DM_COST_SHM), 2.0 * ((y->Lmax - 1) / R), b) +
           _dm_cost_2l_middle(lk, b, R, rail_ring, _dm_pick_2l_segments(lk, count, esize, R, rail_ring));
}
/* The segments of the compressed two-level all-reduce where it runs pipelined (two hosts, R > 1
   rails; the schedule and the model below both ask here). int8: segments of a quarter the
   bytes (the rail moves a quarter of them, and encoding waits on the host's stage): on 2 x 2 at
   2 Gbit/s 16 MiB took 34.1 ms with the exact model's 8 segments, 28.1 ms with 64; bf16 (half
   the bytes) was slower with 32, so it takes the exact model's. */
_DM_PRIVATE int _dm_pick_cmp_segments(const _dm_eng* lk, size_t count, size_t esize, int R, dm_compress mode) {
    if (mode == DM_COMPRESS_INT8) return _dm_sch_2l_max_segments(count, esize * 4, R, lk->lay.H);
    return _dm_pick_2l_segments(lk, count, esize, R, false);
}
/* The compressed two-level all-reduce (>>compressed rails, dm_all_reduce_compressed) in mode on
   count elements of esize bytes, as two_level_ring is costed: the fold, the host's ring, and the
   rails moving codes instead of values (all R rails share the host's link, as above): int8's
   maxima agreed first (recursive doubling of 4 bytes per DM_COMPRESS_BLOCK elements), then the
   codes gathered (H - 1 steps of every element's code) or through owners (H - 1 steps of 1/H of
   the codes, H - 1 of 1/H of the 2-byte sums); pipelined by segment on two hosts. Only asked for
   (the choice never compresses by itself); the model's front end (scripts/cost_model.c) prints it
   beside the exact algorithms. */
/* A compressed rail step of b bytes per host: across sites (not pipelined by site) each host of
   a site may send across at once, so the site link is charged for all of them. */
_DM_PRIVATE double _dm_cost_cmp_rails(const _dm_eng* lk, double steps, double b) {
    return _dm_cost_sites(lk, steps, b * lk->lay.HSmax, b);
}
_DM_PRIVATE bool _dm_pick_compressed_sites(const _dm_eng* lk, size_t count);
_DM_PRIVATE double _dm_cost_compressed(const _dm_eng* lk, size_t count, size_t esize, dm_compress mode) {
    const _dm_layout* y = &lk->lay;
    const _dm_link_cost* shm = _dm_cost_class(lk, _DM_COST_SHM);
    int R = y->Lmin, H = y->H, S = 1;
    double b = (double)count * (double)esize, n = (double)count, cb = mode == DM_COMPRESS_INT8 ? 1 : 2, host, rails;
    if (_dm_pick_compressed_sites(lk, count)) return _dm_cost_3l_compressed(lk, count, esize, mode);
    if (_dm_sch_2l_pipelined(lk, count, R, false) && H == 2) S = _dm_pick_cmp_segments(lk, count, esize, R, mode);
    host = _dm_cost(shm, 2.0 * (R - 1) * S, b / R / S);
    rails = mode == DM_COMPRESS_INT8 ? _dm_cost_cmp_rails(lk, (double)_dm_ceil_log2(H) * S, n / DM_COMPRESS_BLOCK * 4 / S) : 0;
    if (_dm_cmp_gathers(mode, H)) rails += _dm_cost_cmp_rails(lk, (double)(H - 1) * S, n * cb / S);
    else rails += _dm_cost_cmp_rails(lk, (double)(H - 1) * S, n / H * cb / S) + _dm_cost_cmp_rails(lk, (double)(H - 1) * S, n / H * 2 / S);
    return _dm_cost(shm, 2.0 * ((y->Lmax - 1) / R), b) + (S == 1 ? host + rails : (host > rails ? host : rails) + host / S);
}
_DM_PRIVATE bool _dm_pick_forced_flat(const _dm_eng* lk) {
    return lk->algo == _DM_ALGO_FLAT || lk->algo == _DM_ALGO_FLAT_RING || lk->algo == _DM_ALGO_FLAT_RD;
}
_DM_PRIVATE bool _dm_pick_forced_two_level(const _dm_eng* lk) {
    return lk->algo == _DM_ALGO_TWO_LEVEL || lk->algo == _DM_ALGO_TWO_LEVEL_RING || lk->algo == _DM_ALGO_TWO_LEVEL_RD;
}
/* True when the hosts matter: more than one, and one with more than a rank; or several sites. */
_DM_PRIVATE bool _dm_pick_multi_host(const _dm_eng* lk) { return (lk->lay.H > 1 && lk->lay.Lmax > 1) || lk->lay.NS > 1; }

/* Two-level with R = the smallest host's size rails: whether the rails all-reduce their blocks
   with a ring (else recursive doubling): the cheaper by the model, a ring only where a block
   has an element per host. */
_DM_PRIVATE bool _dm_pick_rails_ring(const _dm_eng* lk, size_t count, dm_dtype dtype) {
    const _dm_layout* y = &lk->lay;
    size_t esize = dm_dtype_size(dtype);
    if (count / (size_t)y->Lmin < (size_t)y->H) return false;
    if (lk->rails_force) return lk->rails_force == 1;
    return _dm_cost_two_level(lk, count, esize, y->Lmin, true) <= _dm_cost_two_level(lk, count, esize, y->Lmin, false);
}
/* The model's cost of all_reduce algorithm algo (one of _DM_ALGO_FLAT_RING .. _DM_ALGO_COUNT - 1)
   on count elements of dtype, in microseconds, whether or not it could run (see below). */
_DM_PRIVATE double _dm_cost_all_reduce(const _dm_eng* lk, int algo, size_t count, dm_dtype dtype) {
    size_t esize = dm_dtype_size(dtype);
    double b = (double)count * (double)esize;
    switch (algo) {
    case _DM_ALGO_FLAT_RING: return _dm_cost_flat_ring(lk, b);
    case _DM_ALGO_FLAT_RD: return _dm_cost_flat_rd(lk, b);
    case _DM_ALGO_TWO_LEVEL_RING:
        return _dm_cost_two_level(lk, count, esize, lk->lay.Lmin, _dm_pick_rails_ring(lk, count, dtype));
    case _DM_ALGO_TWO_LEVEL_RD: return _dm_cost_two_level(lk, count, esize, 1, false);
    default: return _dm_cost_three_level(lk, count, esize);            /* _DM_ALGO_THREE_LEVEL */
    }
}
/* all_reduce's algorithm for count elements of dtype: one of _DM_ALGO_FLAT_RING .. _THREE_LEVEL.
   two_level_ring: the host's ring with R = the smallest host's size rails (each rail a ring or
   recursive doubling, _dm_pick_rails_ring); two_level_rd: one rail of host leaders;
   three_level: across sites (>>three-level), where it fits. */
_DM_PRIVATE int _dm_pick_all_reduce(const _dm_eng* lk, size_t count, dm_dtype dtype) {
    const _dm_layout* y = &lk->lay;
    int W = lk->c->size, H = y->H, R = y->Lmin, k, best = -1;
    double b = (double)count * (double)dm_dtype_size(dtype), cost[_DM_ALGO_COUNT];
    bool ring_fits = count >= (size_t)W, rails_fit = count >= (size_t)R * (size_t)H;
    bool flat_ok = lk->algo != _DM_ALGO_TWO_LEVEL, two_ok = lk->algo != _DM_ALGO_FLAT;
    switch (lk->algo) {
    case _DM_ALGO_FLAT_RING: return ring_fits ? _DM_ALGO_FLAT_RING : _DM_ALGO_FLAT_RD;
    case _DM_ALGO_FLAT_RD: return _DM_ALGO_FLAT_RD;
    case _DM_ALGO_TWO_LEVEL_RING: return rails_fit ? _DM_ALGO_TWO_LEVEL_RING : _DM_ALGO_TWO_LEVEL_RD;
    case _DM_ALGO_TWO_LEVEL_RD: return _DM_ALGO_TWO_LEVEL_RD;
    case _DM_ALGO_THREE_LEVEL:                  /* where it cannot run, the two-level forms */
        return _dm_sch_3l_fits(lk, count) ? _DM_ALGO_THREE_LEVEL : rails_fit ? _DM_ALGO_TWO_LEVEL_RING : _DM_ALGO_TWO_LEVEL_RD;
    default: break;
    }
    if (!_dm_pick_multi_host(lk) && lk->algo != _DM_ALGO_TWO_LEVEL)    /* measured on one host */
        return (b <= (double)_DM_PICK_SMALL_BYTES || !ring_fits) ? _DM_ALGO_FLAT_RD : _DM_ALGO_FLAT_RING;
    for (k = 0; k < _DM_ALGO_COUNT; k++) cost[k] = 1e300;
    if (flat_ok && ring_fits) cost[_DM_ALGO_FLAT_RING] = _dm_cost_all_reduce(lk, _DM_ALGO_FLAT_RING, count, dtype);
    if (flat_ok) cost[_DM_ALGO_FLAT_RD] = _dm_cost_all_reduce(lk, _DM_ALGO_FLAT_RD, count, dtype);
    if (two_ok && rails_fit && (R > 1 || _dm_pick_rails_ring(lk, count, dtype)))  /* R = 1 with rd: two_level_rd */
        cost[_DM_ALGO_TWO_LEVEL_RING] = _dm_cost_all_reduce(lk, _DM_ALGO_TWO_LEVEL_RING, count, dtype);
    if (two_ok) cost[_DM_ALGO_TWO_LEVEL_RD] = _dm_cost_all_reduce(lk, _DM_ALGO_TWO_LEVEL_RD, count, dtype);
    if (flat_ok && two_ok && _dm_sch_3l_fits(lk, count))
        cost[_DM_ALGO_THREE_LEVEL] = _dm_cost_all_reduce(lk, _DM_ALGO_THREE_LEVEL, count, dtype);
    for (k = _DM_ALGO_FLAT_RING; k < _DM_ALGO_COUNT; k++)     /* ties: the first in this order */
        if (best < 0 || cost[k] < cost[best]) best = k;
    return best;
}
/* all_gather / reduce_scatter with blocks of b bytes: two-level (rails, then the host)? Only
   on even layouts (every host L ranks). */
_DM_PRIVATE bool _dm_pick_gather_two_level(const _dm_eng* lk, double b) {
    const _dm_layout* y = &lk->lay;
    const _dm_link_cost *cross = _dm_cost_class(lk, _DM_COST_CROSS_HOST), *shm = _dm_cost_class(lk, _DM_COST_SHM);
    double flat, two;
    if (_dm_pick_forced_flat(lk) || y->H < 2 || y->Lmin != y->Lmax || y->Lmax < 2) return false;
    if (_dm_pick_forced_two_level(lk)) return true;
    flat = _dm_cost(cross, lk->c->size - 1, b);
    two = _dm_cost(cross, y->H - 1, b * y->Lmax) + _dm_cost(shm, y->Lmax - 1, b * y->H);
    return two < flat;
}
/* Three-level all_gather / reduce_scatter with blocks of b bytes (>>three-level others): the
   cross rails' NS - 1 steps put a site's L x HS blocks on its link (L on each host's), the
   site rails' HS - 1 steps L x NS on each host's link, the host's ring L - 1 steps of H. */
_DM_PRIVATE double _dm_cost_3l_gather(const _dm_eng* lk, double b) {
    const _dm_layout* y = &lk->lay;
    int L = y->Lmax, HS = y->HSmin, NS = y->NS;
    return _dm_cost_sites(lk, NS - 1.0, b * L * HS, b * L) +
           _dm_cost(_dm_cost_class(lk, _DM_COST_CROSS_HOST), HS - 1.0, b * L * NS) +
           _dm_cost(_dm_cost_class(lk, _DM_COST_SHM), L - 1.0, b * y->H);
}
/* Three-level all_gather / reduce_scatter? On even layouts across sites (every host L ranks,
   every site HS hosts), forced by DISTMESH_ALGO=three_level, else where the model finds it
   faster than the flat ring (W - 1 steps, a block on each host and site boundary) and the
   two-level rails' ring (H - 1 steps of L blocks on each boundary, then the host's). */
_DM_PRIVATE bool _dm_pick_gather_three_level(const _dm_eng* lk, double b) {
    const _dm_layout* y = &lk->lay;
    double three, flat, two;
    if (y->NS < 2 || y->HSmin != y->HSmax || y->Lmin != y->Lmax || _dm_pick_forced_flat(lk) || _dm_pick_forced_two_level(lk))
        return false;
    if (lk->algo == _DM_ALGO_THREE_LEVEL) return true;
    three = _dm_cost_3l_gather(lk, b);
    flat = _dm_cost_sites(lk, lk->c->size - 1.0, b, b);
    two = _dm_cost_sites(lk, y->H - 1.0, b * y->Lmax, b * y->Lmax) +
          _dm_cost(_dm_cost_class(lk, _DM_COST_SHM), y->Lmax - 1.0, b * y->H);
    return three < flat && three < two;
}
/* Dissemination over n ranks (ranks NULL: every rank, identity order): in round k each signals
   the one k on (mod n); zero bytes, so a round costs the latency of its slowest class of link. */
_DM_PRIVATE double _dm_cost_dissemination(const _dm_eng* lk, const int* ranks, int n) {
    int W = lk->c->size, k, r;
    int *per_host = _dm_cost_scratch(lk), *a = per_host + 2 * W, *o = a + W;  /* counts, senders, partners */
    double t = 0;
    for (k = 1; k < n; k <<= 1) {
        for (r = 0; r < n; r++) {
            a[r] = ranks ? ranks[r] : r;
            o[r] = ranks ? ranks[(r + k) % n] : (r + k) % n;
        }
        t += _dm_cost_round(lk, a, o, n, 0, per_host);
    }
    return t;
}
_DM_PRIVATE double _dm_cost_flat_dissemination(const _dm_eng* lk) { return _dm_cost_dissemination(lk, NULL, lk->c->size); }
/* broadcast: the two-level chain (host by host) whenever there are several hosts. */
_DM_PRIVATE bool _dm_pick_broadcast_two_level(const _dm_eng* lk) { return !_dm_pick_forced_flat(lk) && lk->lay.H >= 2; }
/* and across sites the site-ordered chain (three_level_chain), unless a family is forced */
_DM_PRIVATE bool _dm_pick_broadcast_three_level(const _dm_eng* lk) {
    return lk->lay.NS > 1 && !_dm_pick_forced_flat(lk) && !_dm_pick_forced_two_level(lk);
}
_DM_PRIVATE bool _dm_pick_barrier_two_level(const _dm_eng* lk) {
    const _dm_layout* y = &lk->lay;
    if (_dm_pick_forced_flat(lk) || y->H < 2) return false;
    if (_dm_pick_forced_two_level(lk)) return true;
    if (!_dm_pick_multi_host(lk)) return false;
    return _dm_cost(_dm_cost_class(lk, _DM_COST_SHM), 2.0 * (y->Lmax - 1), 0) +
           _dm_cost(_dm_cost_class(lk, _DM_COST_CROSS_HOST), _dm_ceil_log2(y->H), 0) < _dm_cost_flat_dissemination(lk);
}
/* Three-level barrier (>>three-level others)? Across sites, forced by DISTMESH_ALGO=
   three_level, else where the model finds it faster than the flat and two-level ones, each
   dissemination costed round by round (the site link's rounds are the ones that count). */
_DM_PRIVATE bool _dm_pick_barrier_three_level(const _dm_eng* lk) {
    const _dm_layout* y = &lk->lay;
    int k, *leaders = _dm_cost_scratch(lk) + 4 * lk->c->size;
    double inside, three, two;
    if (y->NS < 2 || _dm_pick_forced_flat(lk) || _dm_pick_forced_two_level(lk)) return false;
    if (lk->algo == _DM_ALGO_THREE_LEVEL) return true;
    inside = _dm_cost(_dm_cost_class(lk, _DM_COST_SHM), 2.0 * (y->Lmax - 1), 0);
    for (k = 0; k < y->NS; k++) leaders[k] = y->members[y->start[y->site_start[k]]];
    three = inside + _dm_cost(_dm_cost_class(lk, _DM_COST_CROSS_HOST), 2.0 * (y->HSmax - 1), 0) +
            _dm_cost_dissemination(lk, leaders, y->NS);
    for (k = 0; k < y->H; k++) leaders[k] = y->members[y->start[k]];
    two = inside + _dm_cost_dissemination(lk, leaders, y->H);
    return three < two && three < _dm_cost_flat_dissemination(lk);
}

/* >>entry points  The vtable slots of the backends that run the engine (TCP, the threaded
   world): they fill their tables with these (_dm_coll_<slot>), which find the group's engine in
   c->core->eng. Each runs the backend's enter step (the threaded world's meeting), checks that
   the group is not broken, settles a world of one and a count of 0, makes the fingerprint, asks
   the choice (>>choice), runs the schedules and records what ran (dm_last_algorithm).
   all_to_all, reduce's blocks to the root, gather, scatter and point-to-point meet the peers
   the caller's arguments choose, outside P (connected on demand, >>peers); with DISTMESH_CUDA
   they refuse device memory (the collectives above them have CUDA staging in TCP's table). */

_DM_PRIVATE void _dm_coll_ran(_dm_eng* lk, const char* algorithm) { lk->c->algorithm = algorithm; }
_DM_PRIVATE _dm_eng* _dm_eng_of(dm_collective* c) { return c->core->eng; }
_DM_PRIVATE dm_status _dm_eng_enter(_dm_eng* lk, int kind, size_t count, int dtype, int op, int root) {
    if (!lk->enter || lk->dry) return DM_OK;
    return lk->enter(lk, kind, count, dtype, op, root);
}
/* The calls without a CUDA staging path take host memory only. */
_DM_PRIVATE dm_status _dm_coll_host_only(dm_collective* c, const char* op, const void* a, const void* b) {
#if defined(DISTMESH_CUDA)
    if (_dm_cuda_is_device(a) || _dm_cuda_is_device(b))
        return _DM_FAIL(c, DM_ERR_UNSUPPORTED, "%s: %s takes host buffers only (device buffers: the NCCL backend)",
                        c->vt->name, op);
#else
    (void)c; (void)op; (void)a; (void)b;
#endif
    return DM_OK;
}

/* all_reduce algorithm algo on buf (this rank's data in, the result out), for every algorithm
   but the flat ring (which reads send and writes recv, and whose reduce form stops halfway):
   all_reduce and reduce run them alike. A new algorithm is one more case here. */
_DM_PRIVATE dm_status _dm_coll_all_reduce_in_place(_dm_eng* lk, int algo, void* buf, size_t count, dm_dtype dtype,
                                                   dm_reduce_op op, int divide, const _dm_fp* fp) {
    _dm_team t;
    switch (algo) {
    case _DM_ALGO_FLAT_RD:
        t = _dm_sch_identity(lk);
        return _dm_sch_rd(lk, &t, buf, count, dtype, op, divide, fp);
    case _DM_ALGO_TWO_LEVEL_RING:
        return _dm_sch_allreduce_2l(lk, buf, count, dtype, op, divide, fp, lk->lay.Lmin,
                                    _dm_pick_rails_ring(lk, count, dtype), NULL);
    case _DM_ALGO_TWO_LEVEL_RD: return _dm_sch_allreduce_2l(lk, buf, count, dtype, op, divide, fp, 1, false, NULL);
    default: return _dm_sch_allreduce_3l(lk, buf, count, dtype, op, divide, fp, NULL);   /* _DM_ALGO_THREE_LEVEL */
    }
}
/* The compression this all_reduce asks for (>>functions compression): its dm_op's mode, or
   DISTMESH_COMPRESS for a float sum or mean that names none; 0 for none. */
_DM_PRIVATE int _dm_coll_compress_mode(const _dm_eng* lk, dm_dtype dtype, dm_reduce_op op) {
    dm_compress m = lk->c->core->compress;
    if (m == DM_COMPRESS_DEFAULT)
        m = _dm_compressible_type(dtype) && (op == DM_SUM || op == DM_MEAN) ? lk->compress_env : DM_COMPRESS_NONE;
    return m == DM_COMPRESS_NONE ? 0 : (int)m;
}
/* A compressed all_reduce across sites compresses only the site link: three_level with
   compressed cross rails, where three_level fits and no family is forced. */
_DM_PRIVATE bool _dm_pick_compressed_sites(const _dm_eng* lk, size_t count) {
    return _dm_sch_3l_fits(lk, count) && !_dm_pick_forced_two_level(lk);
}
/* Whether a compressed all_reduce (mode cm) of count elements runs compressed: the two-level
   schedule with compressed rails (or three_level's across sites); false where it cannot run
   and the call is exact (see >>functions compression). */
_DM_PRIVATE bool _dm_coll_compressed_runs(const _dm_eng* lk, size_t count, int cm) {
    const _dm_layout* y = &lk->lay;
    return cm && y->H >= 2 && y->H <= 258 && !_dm_pick_forced_flat(lk) && count / (size_t)y->Lmin >= (size_t)y->H;
}
/* With the caller's state cs, the residual of every element this rank does not encode goes into
   buf before the call (the encoded ones' is added where they are encoded): all of it on a
   folded rank; across sites outside its piece (_dm_sch_3l_piece); else outside block i of R
   of each segment the two-level schedule cuts (_dm_sch_2l_cmp_segments), so a residual that a
   new cut (another dtype, layout or count) leaves on a rank that no longer encodes it is not
   held back. */
_DM_PRIVATE void _dm_coll_cmp_flush_outside(_dm_eng* lk, dm_compress_state* cs, void* buf, size_t count,
                                           dm_dtype dtype, dm_compress mode, bool sites) {
    int R = lk->lay.Lmin, i = lk->lay.local[lk->c->rank], S, s;
    size_t from = 0, off = 0, len = 0, boff, blen;
    if (sites) {
        _dm_sch_3l_piece(lk, count, &off, &len);
        _dm_cmp_flush(cs, buf, dtype, 0, off);
        _dm_cmp_flush(cs, buf, dtype, off + len, count);
        return;
    }
    S = i < R ? _dm_sch_2l_cmp_segments(lk, count, dm_dtype_size(dtype), R, mode) : 0;
    for (s = 0; s < S; s++) {
        _dm_segment(count, S, s, &off, &len);
        _dm_segment(len, R, i, &boff, &blen);
        _dm_cmp_flush(cs, buf, dtype, from, off + boff);
        from = off + boff + blen;
    }
    _dm_cmp_flush(cs, buf, dtype, from, count);
}
_DM_PRIVATE dm_status _dm_coll_all_reduce_compressed(_dm_eng* lk, void* buf, size_t count, dm_dtype dtype,
                                                     dm_reduce_op op, int divide, const _dm_fp* fp) {
    dm_compress_state* cs = lk->c->core->cstate;
    bool sites = _dm_pick_compressed_sites(lk, count);
    _dm_cmp cm;
    cm.mode = (dm_compress)fp->compress;
    cm.res = cs ? cs->residual : NULL;
    if (cs) _dm_coll_cmp_flush_outside(lk, cs, buf, count, dtype, cm.mode, sites);
    if (sites) {
        _dm_coll_ran(lk, cm.mode == DM_COMPRESS_INT8 ? "three_level_int8" : "three_level_bf16");
        return _dm_sch_allreduce_3l(lk, buf, count, dtype, op, divide, fp, &cm);
    }
    _dm_coll_ran(lk, cm.mode == DM_COMPRESS_INT8 ? "two_level_int8" : "two_level_bf16");
    return _dm_sch_allreduce_2l(lk, buf, count, dtype, op, divide, fp, lk->lay.Lmin, false, &cm);
}
_DM_PRIVATE dm_status _dm_coll_all_reduce(dm_collective* c, const void* send, void* recv, size_t count,
                                          dm_dtype dtype, dm_reduce_op op) {
    _dm_eng* lk = _dm_eng_of(c);
    size_t bytes = count * dm_dtype_size(dtype);
    int algo, divide = op == DM_MEAN ? c->size : 0, cm;
    bool compressed;
    dm_compress_state* cs = c->core->cstate;
    _dm_team t;
    _dm_fp fp;
    _DM_TRY(_dm_eng_enter(lk, _DM_K_ALL_REDUCE, count, (int)dtype, (int)op, 0));
    _DM_TRY(_dm_eng_check_broken(lk, "all_reduce"));
    if (cs && send != recv) {                   /* error feedback adds to this rank's data: in place */
        if (bytes) memcpy(recv, send, bytes);
        send = recv;
    }
    cm = _dm_coll_compress_mode(lk, dtype, op);
    compressed = cm && _dm_coll_compressed_runs(lk, count, cm);
    if (cs && !compressed) _dm_cmp_flush(cs, recv, dtype, 0, count);   /* compressed: its own flush */
    if (lk->c->size == 1) {
        if (send != recv && bytes) memcpy(recv, send, bytes);
        return DM_OK;
    }
    _dm_fp_make(&fp, lk->c, _DM_K_ALL_REDUCE, (int)dtype, (int)op, 0, count);
    fp.compress = cm;
    if (count == 0) return _dm_sch_fp_only(lk, "all_reduce", &fp);
    if (compressed) {
        if (send != recv) memcpy(recv, send, bytes);
        return _dm_coll_all_reduce_compressed(lk, recv, count, dtype, op, divide, &fp);
    }
    algo = _dm_pick_all_reduce(lk, count, dtype);
    _dm_coll_ran(lk, _dm_algo_names[algo]);
    if (algo == _DM_ALGO_FLAT_RING) {
        t = _dm_sch_flat(lk);
        if (_dm_sch_single_copy_fits(lk, bytes))
            return _dm_sch_ring_single(lk, &t, send, recv, count, dtype, op, divide, &fp);
        return _dm_sch_ring(lk, &t, send, recv, count, dtype, op, divide, &fp, _DM_SCH_RING_RS | _DM_SCH_RING_AG);
    }
    if (send != recv) memcpy(recv, send, bytes);
    return _dm_coll_all_reduce_in_place(lk, algo, recv, count, dtype, op, divide, &fp);
}

/* Reduce to root: the root gets the bits dm_all_reduce would give, by the same algorithm.
   Flat ring: its reduce-scatter steps leave the rank at ring position p holding block p fully
   reduced, which it then sends to the root. The others run the whole all-reduce (into a
   temporary where this rank's recv is not significant). */
_DM_PRIVATE dm_status _dm_coll_reduce(dm_collective* c, const void* send, void* recv, size_t count, dm_dtype dtype,
                                      dm_reduce_op op, int root) {
    _dm_eng* lk = _dm_eng_of(c);
    int W = c->size, r = c->rank, q, algo, divide = op == DM_MEAN ? W : 0;
    size_t esize = dm_dtype_size(dtype), bytes = count * esize, off, len;
    unsigned char* out = (unsigned char*)recv;
    _dm_team t;
    _dm_fp fp;
    dm_status st;
    _DM_TRY(_dm_coll_host_only(c, "reduce", send, recv));
    _DM_TRY(_dm_eng_enter(lk, _DM_K_REDUCE, count, (int)dtype, (int)op, root));
    _DM_TRY(_dm_eng_check_broken(lk, "reduce"));
    if (W == 1) {
        if (send != recv && bytes) memcpy(recv, send, bytes);
        return DM_OK;
    }
    _dm_fp_make(&fp, c, _DM_K_REDUCE, (int)dtype, (int)op, root, count);
    if (count == 0) return _dm_sch_fp_only(lk, "reduce", &fp);
    if (r != root) {
        out = (unsigned char*)_dm_malloc(&c->allocator, bytes);
        if (!out) return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "%s: reduce: no memory for %zu bytes", lk->tag, bytes);
    }
    algo = _dm_pick_all_reduce(lk, count, dtype);
    _dm_coll_ran(lk, _dm_algo_names[algo]);
    if (algo != _DM_ALGO_FLAT_RING) {
        if (send != out) memcpy(out, send, bytes);
        st = _dm_coll_all_reduce_in_place(lk, algo, out, count, dtype, op, divide, &fp);
    } else {
        t = _dm_sch_flat(lk);
        st = _dm_sch_ring(lk, &t, send, out, count, dtype, op, divide, &fp, _DM_SCH_RING_RS);
        if (st == DM_OK && r != root) {        /* this rank's block to the root */
            _dm_segment(count, W, lk->slot[r], &off, &len);
            st = _dm_eng_sendrecv_on_demand(lk, "reduce", &fp, root, out + off * esize, len * esize, root, NULL, 0);
        }
        for (q = 0; q < W && st == DM_OK && r == root; q++) {   /* the root takes every other block */
            if (q == root) continue;
            _dm_segment(count, W, lk->slot[q], &off, &len);
            st = _dm_eng_sendrecv_on_demand(lk, "reduce", &fp, q, NULL, 0, q, out + off * esize, len * esize);
        }
    }
    if (out != recv) _dm_free(&c->allocator, out);
    return st;
}

/* All-gather into per-rank buffers. Flat: one ring in host order. Two-level (even layouts):
   rail i gathers its members' blocks across hosts, then each host's ring gathers the rails'
   H blocks per rank. */
_DM_PRIVATE dm_status _dm_coll_all_gather_list(_dm_eng* lk, int kind, const void* send, void* const* recvs,
                                               size_t count, dm_dtype dtype) {
    const _dm_layout* y = &lk->lay;
    int W = lk->c->size, r = lk->c->rank, p, q;
    size_t bytes = count * dm_dtype_size(dtype);
    void* small[16];
    void** pieces = small;
    _dm_team t;
    dm_status st;
    _dm_fp fp;
    _DM_TRY(_dm_eng_check_broken(lk, _dm_kind_name(kind)));
    if (recvs[r] != send && bytes) memcpy(recvs[r], send, bytes);
    if (W == 1) return DM_OK;
    _dm_fp_make(&fp, lk->c, kind, (int)dtype, -1, 0, count);
    if (count == 0) return _dm_sch_fp_only(lk, _dm_kind_name(kind), &fp);
    if (W > 16 && !(pieces = (void**)_dm_malloc(&lk->c->allocator, sizeof(void*) * (size_t)W)))
        return _DM_FAIL(lk->c, DM_ERR_OUT_OF_MEMORY, "%s: %s: out of memory", lk->tag, _dm_kind_name(kind));
    if (_dm_pick_gather_three_level(lk, (double)bytes)) {
        _dm_coll_ran(lk, "three_level_ring");
        st = _dm_sch_all_gather_3l(lk, kind, recvs, pieces, bytes, dtype, &fp);
    } else if (!_dm_pick_gather_two_level(lk, (double)bytes)) {
        _dm_coll_ran(lk, "flat_ring");
        t = _dm_sch_flat(lk);
        for (p = 0; p < W; p++) pieces[p] = recvs[lk->order[p]];
        st = _dm_sch_ring_gather(lk, &t, pieces, 1, bytes, kind, dtype, &fp);
    } else {
        _dm_coll_ran(lk, "two_level_ring");
        t = _dm_sch_rail(lk, y->local[r]);
        for (q = 0; q < y->H; q++) pieces[q] = recvs[t.ranks[q]];
        st = _dm_sch_ring_gather(lk, &t, pieces, 1, bytes, kind, dtype, &fp);
        if (st == DM_OK) st = _dm_sch_all_gather_host(lk, kind, recvs, pieces, bytes, dtype, &fp);
    }
    if (pieces != small) _dm_free(&lk->c->allocator, pieces);
    return st;
}

/* The all_gather_to_list slot. */
_DM_PRIVATE dm_status _dm_coll_all_gather_to_list(dm_collective* c, const void* send, void* const* recvs, size_t count,
                                                  dm_dtype dtype) {
    _dm_eng* lk = _dm_eng_of(c);
    _DM_TRY(_dm_eng_enter(lk, _DM_K_ALL_GATHER, count, (int)dtype, -1, 0));
    return _dm_coll_all_gather_list(lk, _DM_K_ALL_GATHER, send, recvs, count, dtype);
}
/* The same into one buffer of size blocks. */
_DM_PRIVATE dm_status _dm_coll_all_gather(dm_collective* c, const void* send, void* recv, size_t count, dm_dtype dtype) {
    _dm_eng* lk = _dm_eng_of(c);
    size_t bytes = count * dm_dtype_size(dtype);
    void* small[16] = { NULL };
    void** ptrs = small;
    dm_status st;
    int j, W = lk->c->size;
    _DM_TRY(_dm_eng_enter(lk, _DM_K_ALL_GATHER, count, (int)dtype, -1, 0));
    if (W > 16) {
        ptrs = (void**)_dm_malloc(&lk->c->allocator, sizeof(void*) * (size_t)W);
        if (!ptrs) return _DM_FAIL(lk->c, DM_ERR_OUT_OF_MEMORY, "%s: all_gather: out of memory", lk->tag);
    }
    for (j = 0; j < W; j++) ptrs[j] = (unsigned char*)recv + (size_t)j * bytes;
    st = _dm_coll_all_gather_list(lk, _DM_K_ALL_GATHER, send, (void* const*)ptrs, count, dtype);
    if (ptrs != small) _dm_free(&lk->c->allocator, ptrs);
    return st;
}

/* Reduce-scatter. Flat: one ring in host order. Two-level (even layouts): each host's ring
   reduces, for local rank i, the blocks of rail i (H pieces), then rail i's ring reduces
   those across hosts, each rank ending with its own block. Three-level across sites
   (>>three-level others; tmp H + NS blocks). In place (recv is input block r), the flat
   ring's intermediate sums need a block of their own. */
_DM_PRIVATE dm_status _dm_coll_reduce_scatter(dm_collective* c, const void* send, void* recv, size_t n_elems,
                                              dm_dtype dtype, dm_reduce_op op) {
    _dm_eng* lk = _dm_eng_of(c);
    const _dm_layout* y = &lk->lay;
    int W = c->size, r = c->rank, p, q, H = y->H, divide = op == DM_MEAN ? W : 0, family;
    size_t bytes = n_elems * dm_dtype_size(dtype), tmp_blocks;
    const unsigned char* in = (const unsigned char*)send;
    unsigned char *out = (unsigned char*)recv, *tmp = NULL;
    const unsigned char* small[16];
    const unsigned char** pieces = small;
    _dm_team t;
    _dm_fp fp;
    dm_status rc = DM_OK;
    _DM_TRY(_dm_eng_check_broken(lk, "reduce_scatter"));
    if (W == 1) {
        if (out != in && bytes) memcpy(out, in, bytes);
        return DM_OK;
    }
    _dm_fp_make(&fp, c, _DM_K_REDUCE_SCATTER, (int)dtype, (int)op, 0, n_elems);
    if (n_elems == 0) return _dm_sch_fp_only(lk, "reduce_scatter", &fp);
    family = _dm_pick_gather_three_level(lk, (double)bytes) ? 3 : _dm_pick_gather_two_level(lk, (double)bytes) ? 2 : 1;
    if (family == 3) tmp_blocks = (size_t)(H + y->NS);
    else if (family == 2) tmp_blocks = (size_t)H;
    else tmp_blocks = out == in + (size_t)r * bytes && W > 2 ? 1 : 0;     /* in place */
    if (W > 16) pieces = (const unsigned char**)_dm_malloc(&c->allocator, sizeof(void*) * (size_t)W);
    if (tmp_blocks) tmp = (unsigned char*)_dm_malloc(&c->allocator, bytes * tmp_blocks);
    if (!pieces || (tmp_blocks && !tmp)) {
        rc = _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "%s: reduce_scatter: no memory for %zu bytes", lk->tag, bytes * tmp_blocks);
        goto done;
    }
    _dm_coll_ran(lk, family == 3 ? "three_level_ring" : family == 2 ? "two_level_ring" : "flat_ring");
    if (family == 3) {
        rc = _dm_sch_reduce_scatter_3l(lk, in, pieces, out, tmp, bytes, dtype, op, divide, &fp);
    } else if (family == 1) {
        t = _dm_sch_flat(lk);
        for (p = 0; p < W; p++) pieces[p] = in + (size_t)lk->order[p] * bytes;
        rc = _dm_sch_ring_rs(lk, &t, pieces, out, tmp ? tmp : out, 1, bytes, dtype, op, divide, &fp);
    } else {
        rc = _dm_sch_reduce_scatter_host(lk, in, pieces, tmp, bytes, dtype, op, &fp);
        t = _dm_sch_rail(lk, y->local[r]);
        for (q = 0; q < H; q++) pieces[q] = tmp + (size_t)q * bytes;
        if (rc == DM_OK) rc = _dm_sch_ring_rs(lk, &t, pieces, out, out, 1, bytes, dtype, op, divide, &fp);
    }
done:
    if (pieces != small) _dm_free(&c->allocator, (void*)pieces);
    _dm_free(&c->allocator, tmp);
    return rc;
}

/* Broadcast: a chain. Flat: along the host-ordered ring from the root. Two-level (several
   hosts): the root, the rest of its host, then every other host in turn, so the data crosses
   each host boundary once, whatever the root. Across sites (three_level_chain) the hosts go
   site by site (_dm_sch_chain_host), so the chain also crosses each site boundary once: in
   host order from a root that is not on its site's first host it would cross back into the
   root's site, one more site link's latency. */
_DM_PRIVATE dm_status _dm_coll_broadcast(dm_collective* c, void* buf, size_t count, dm_dtype dtype, int root) {
    _dm_eng* lk = _dm_eng_of(c);
    _dm_layout* y = &lk->lay;
    int W = c->size, n = 0, h, j, rh = y->host_of[root];
    bool sites = _dm_pick_broadcast_three_level(lk);
    _dm_team t;
    _dm_fp fp;
    dm_status st;
    _DM_TRY(_dm_eng_enter(lk, _DM_K_BROADCAST, count, (int)dtype, -1, root));
    _DM_TRY(_dm_eng_check_broken(lk, "broadcast"));
    if (W == 1) return DM_OK;
    _dm_fp_make(&fp, c, _DM_K_BROADCAST, (int)dtype, -1, root, count);
    if (!_dm_pick_broadcast_two_level(lk)) {
        _dm_coll_ran(lk, "flat_chain");
        t = _dm_sch_flat(lk);
        return _dm_sch_chain(lk, &t, lk->slot[root], buf, count * dm_dtype_size(dtype), dtype, &fp);
    }
    _dm_coll_ran(lk, sites ? "three_level_chain" : "two_level_chain");
    y->team[n++] = root;
    for (h = 0; h < y->H; h++) {
        int hh = sites ? _dm_sch_chain_host(y, rh, h) : (rh + h) % y->H;
        for (j = y->start[hh]; j < y->start[hh + 1]; j++)
            if (y->members[j] != root) y->team[n++] = y->members[j];
    }
    for (j = 0; j < W && y->team[j] != c->rank; j++) {}
    t = _dm_team_of(y->team, W, j);
    /* where the chain enters and leaves the root's host depends on the root: only root 0's
       chain is in P (>>peers); another root's extra pairs connect on demand */
    lk->on_demand = root != 0;
    st = _dm_sch_chain(lk, &t, 0, buf, count * dm_dtype_size(dtype), dtype, &fp);
    lk->on_demand = false;
    return st;
}

/* Barrier. Flat: dissemination over every rank. Two-level: every rank tells its host's
   leader, the leaders disseminate, each leader releases its host. Three-level across sites
   (>>three-level others). */
_DM_PRIVATE dm_status _dm_coll_barrier(dm_collective* c) {
    _dm_eng* lk = _dm_eng_of(c);
    const _dm_layout* y = &lk->lay;
    int h = y->host_of[c->rank], L = _dm_sch_host_size(lk, h), q;
    const int* host = y->members + y->start[h];
    _dm_team t;
    _dm_fp arrive, release;
    _DM_TRY(_dm_eng_enter(lk, _DM_K_BARRIER, 0, -1, -1, -1));
    _DM_TRY(_dm_eng_check_broken(lk, "barrier"));
    if (_dm_pick_barrier_three_level(lk)) {
        _dm_coll_ran(lk, "three_level_dissemination");
        return _dm_sch_barrier_3l(lk);
    }
    if (!_dm_pick_barrier_two_level(lk)) {
        _dm_coll_ran(lk, "flat_dissemination");
        t = _dm_sch_identity(lk);
        return _dm_sch_dissemination(lk, &t, 0);
    }
    _dm_coll_ran(lk, "two_level_dissemination");
    _dm_fp_make(&arrive, c, _DM_K_BARRIER, -1, -1, _DM_BARRIER_ROUND_ARRIVE, 0);
    _dm_fp_make(&release, c, _DM_K_BARRIER, -1, -1, _DM_BARRIER_ROUND_RELEASE, 0);
    if (y->local[c->rank] > 0) return _dm_sch_arrive_wait(lk, &arrive, &release, host[0]);
    _DM_TRY(_dm_sch_gather_arrivals(lk, &arrive, host + 1, L - 1));
    for (q = 0; q < y->H; q++) lk->lay.team[q] = y->members[y->start[q]];
    t = _dm_team_of(lk->lay.team, y->H, h);
    _DM_TRY(_dm_sch_dissemination(lk, &t, 0));
    return _dm_sch_send_releases(lk, &release, host + 1, L - 1);
}

/* All-to-all, pairwise: step k sends the block for rank + k and receives the block of rank - k.
   Each block's fingerprint describes its pair both ways: count = the elements sent, root = the
   elements the sender expects back (folded to 32 bits), so the receiver compares both with its
   own counts and either direction's disagreement fails both ranks of the pair. In place (send
   NULL), the outgoing blocks are copied out of recv first. */
_DM_PRIVATE int _dm_fold32(size_t v) { return (int)(uint32_t)((uint64_t)v ^ ((uint64_t)v >> 32)); }
_DM_PRIVATE dm_status _dm_coll_all_to_all_v(dm_collective* c, const void* send, const size_t* sc, const size_t* so,
                                            void* recv, const size_t* rc, const size_t* ro, dm_dtype dtype) {
    _dm_eng* lk = _dm_eng_of(c);
    int W = c->size, r = c->rank, k;
    size_t esize = dm_dtype_size(dtype);
    const unsigned char* in = (const unsigned char*)send;
    unsigned char *out = (unsigned char*)recv, *copy = NULL;
    dm_status st = DM_OK;
    _DM_TRY(_dm_coll_host_only(c, "all_to_all", send, recv));
    _DM_TRY(_dm_eng_enter(lk, _DM_K_ALL_TO_ALL, 0, (int)dtype, -1, 0));
    _DM_TRY(_dm_eng_check_broken(lk, "all_to_all"));
    if (!in) {
        _DM_TRY(_dm_a2a_copy_out(c, out, sc, so, esize, &copy));
        in = copy;
    }
    if (sc[r]) memcpy(out + ro[r] * esize, in + so[r] * esize, sc[r] * esize);
    for (k = 1; k < W && st == DM_OK; k++) {
        int to = (r + k) % W, from = (r - k + W) % W;
        _dm_fp mine, expect;
        _dm_fp_make(&mine, c, _DM_K_ALL_TO_ALL, (int)dtype, -1, _dm_fold32(rc[to]), sc[to]);
        _dm_fp_make(&expect, c, _DM_K_ALL_TO_ALL, (int)dtype, -1, _dm_fold32(sc[from]), rc[from]);
        lk->on_demand = true;
        st = _dm_eng_exchange(lk, "all_to_all", &mine, &expect, to, in + so[to] * esize, sc[to] * esize, from,
                              out + ro[from] * esize, rc[from] * esize, false, DM_UINT8, DM_SUM);
        lk->on_demand = false;
    }
    _dm_free(&c->allocator, copy);
    return st;
}

/* Gather and scatter: the root meets every other rank in turn, rank order; each pair trades
   fingerprints both ways, so both sides check the other's arguments. */
_DM_PRIVATE dm_status _dm_coll_rooted(_dm_eng* lk, int kind, const void* send, void* recv, size_t count, dm_dtype dtype,
                                      int root) {
    dm_collective* c = lk->c;
    int W = c->size, r = c->rank, q;
    size_t bytes = count * dm_dtype_size(dtype);
    const char* name = _dm_kind_name(kind);
    bool gather = kind == _DM_K_GATHER;
    _dm_fp fp;
    _DM_TRY(_dm_eng_check_broken(lk, name));
    if (r == root) {
        unsigned char* mine = gather ? (unsigned char*)recv + (size_t)r * bytes : (unsigned char*)recv;
        const unsigned char* src = gather ? (const unsigned char*)send : (const unsigned char*)send + (size_t)r * bytes;
        if (mine != src && bytes) memcpy(mine, src, bytes);
    }
    if (W == 1) return DM_OK;
    _dm_fp_make(&fp, c, kind, (int)dtype, -1, root, count);
    if (r != root) {
        if (gather) return _dm_eng_sendrecv_on_demand(lk, name, &fp, root, send, bytes, root, NULL, 0);
        return _dm_eng_sendrecv_on_demand(lk, name, &fp, root, NULL, 0, root, recv, bytes);
    }
    for (q = 0; q < W; q++) {
        if (q == root) continue;
        if (gather)
            _DM_TRY(_dm_eng_sendrecv_on_demand(lk, name, &fp, q, NULL, 0, q, (unsigned char*)recv + (size_t)q * bytes,
                                               bytes));
        else
            _DM_TRY(_dm_eng_sendrecv_on_demand(lk, name, &fp, q, (const unsigned char*)send + (size_t)q * bytes, bytes,
                                               q, NULL, 0));
    }
    return DM_OK;
}
/* The gather and scatter slots. */
_DM_PRIVATE dm_status _dm_coll_rooted_slot(dm_collective* c, int kind, const void* send, void* recv, size_t count,
                                           dm_dtype dtype, int root) {
    _dm_eng* lk = _dm_eng_of(c);
    _DM_TRY(_dm_coll_host_only(c, _dm_kind_name(kind), send, recv));
    _DM_TRY(_dm_eng_enter(lk, kind, count, (int)dtype, -1, root));
    return _dm_coll_rooted(lk, kind, send, recv, count, dtype, root);
}
_DM_PRIVATE dm_status _dm_coll_gather(dm_collective* c, const void* send, void* recv, size_t count, dm_dtype dtype,
                                      int root) {
    return _dm_coll_rooted_slot(c, _DM_K_GATHER, send, recv, count, dtype, root);
}
_DM_PRIVATE dm_status _dm_coll_scatter(dm_collective* c, const void* send, void* recv, size_t count, dm_dtype dtype,
                                       int root) {
    return _dm_coll_rooted_slot(c, _DM_K_SCATTER, send, recv, count, dtype, root);
}

/* A point-to-point message: its header (a fingerprint of kind send), then the payload. While
   the link to peer is full, what peer sends this way is read (into the inbox), so two ranks
   sending each other large messages at once both finish. */
#define _DM_P2P_SMALL 1024     /* payloads up to this travel in one step with their header */
_DM_PRIVATE dm_status _dm_coll_send(dm_collective* c, const void* buf, size_t count, dm_dtype dtype, int peer, int tag) {
    _dm_eng* lk = _dm_eng_of(c);
    _dm_sstep ss[2];
    unsigned char hdr[32 + _DM_P2P_SMALL];
    size_t bytes = count * dm_dtype_size(dtype);
    _dm_fp fp;
    _DM_ZERO(_dm_xfer, x);
    _DM_TRY(_dm_coll_host_only(c, "send", buf, NULL));
    _DM_TRY(_dm_eng_check_broken(lk, "send"));
    _dm_fp_make(&fp, lk->c, _DM_K_SEND, (int)dtype, -1, tag, count);
    fp.seq = lk->sent[peer]++;
    _dm_fp_encode(&fp, hdr);
    memset(ss, 0, sizeof(ss));
    ss[0].buf = hdr; ss[0].len = 32; ss[0].gate = -1;
    ss[1].buf = (const unsigned char*)buf; ss[1].len = bytes; ss[1].gate = -1;
    /* a small payload joins its header: one publish instead of two, the same bytes on the wire
       (the header is a multiple of 8, so the padding after the payload does not change) */
    if (bytes <= _DM_P2P_SMALL) {
        if (bytes) memcpy(hdr + 32, buf, bytes);
        ss[0].len = 32 + bytes;
        ss[1].len = 0;
    }
    x.op = "send"; x.speer = peer; x.rpeer = peer; x.ss = ss; x.ns = 2; x.nr = 0;
    x.dtype = DM_UINT8; x.rop = DM_SUM; x.inbox = true;
    return _dm_eng_run_on_demand(lk, &x);
}
/* The first message from peer with this tag: already kept (unexpected), or read as it comes. */
_DM_PRIVATE dm_status _dm_coll_recv(dm_collective* c, void* buf, size_t count, dm_dtype dtype, int peer, int tag) {
    _dm_eng* lk = _dm_eng_of(c);
    _dm_want w;
    _DM_ZERO(_dm_xfer, x);
    _DM_TRY(_dm_coll_host_only(c, "recv", buf, NULL));
    _DM_TRY(_dm_eng_check_broken(lk, "recv"));
    w.tag = tag; w.dtype = dtype; w.count = count; w.buf = (unsigned char*)buf; w.done = false;
    w.any = false; w.from = -1;
    x.op = "recv"; x.speer = -1; x.rpeer = peer; x.ns = 0; x.nr = 0;
    x.dtype = DM_UINT8; x.rop = DM_SUM; x.inbox = true; x.want = &w;
    _DM_TRY(_dm_eng_take_unexpected(lk, &x, peer));
    if (w.done) return DM_OK;
    return _dm_eng_run_on_demand(lk, &x);
}
/* From any source: the first kept (unexpected) message with this tag, in the order this rank
   read them; else every connected peer's inbox is read in turn (rank order each round) until
   the header of one with the tag is in, and that message fills buf. *source: its sender. */
_DM_PRIVATE dm_status _dm_coll_recv_any(dm_collective* c, void* buf, size_t count, dm_dtype dtype, int tag,
                                        int* source) {
    _dm_eng* lk = _dm_eng_of(c);
    _dm_want w;
    _DM_ZERO(_dm_xfer, x);
    if (source) *source = -1;
    _DM_TRY(_dm_coll_host_only(c, "recv", buf, NULL));
    _DM_TRY(_dm_eng_check_broken(lk, "recv"));
    w.tag = tag; w.dtype = dtype; w.count = count; w.buf = (unsigned char*)buf; w.done = false;
    w.any = true; w.from = -1;
    x.op = "recv"; x.speer = -1; x.rpeer = -1; x.ns = 0; x.nr = 0;
    x.dtype = DM_UINT8; x.rop = DM_SUM; x.inbox = true; x.want = &w;
    _DM_TRY(_dm_eng_take_unexpected(lk, &x, -1));
    if (!w.done) _DM_TRY(_dm_eng_run_on_demand(lk, &x));
    if (source) *source = w.from;
    return DM_OK;
}

_DM_COLD_BEGIN
/* >>peers  P, the peers this rank's fixed-peer schedules use on the group's layout: every
   rank of its host (shared memory), then what every all_reduce algorithm (flat ring and rd,
   two-level with Lmin rails, their rails once as rings and once as recursive doubling
   (rails_force: the count decides between them at run time), and with the leaders' rail;
   flat rd's and the rings' partners do not depend on the count), all_gather, reduce_scatter and
   barrier in every family (three-level across sites) and broadcast from root 0 touch, each run dry (_dm_eng_run records
   the peers of each transfer and moves nothing), so P follows the schedules as they are
   written. Every rank runs the same schedules, so P is symmetric: q is in P(r) exactly when r
   is in P(q). Not in it: what the caller's arguments choose (point-to-point, all_to_all,
   gather, scatter, reduce's blocks to the root, and where a two-level broadcast chain from
   another root enters and leaves its host: one host's last rank would otherwise pair with
   every rank of the next host): a backend connects those on demand (_dm_eng.connect). A new
   all_reduce algorithm is run here as it is (every _DM_ALGO_* from _DM_ALGO_FLAT_RING on); a
   schedule of another collective, or a choice inside one that its algorithm does not fix (as
   the rails' above), must be run here by hand; the threaded world checks every transfer
   outside on_demand against P (_dm_eng_check_peer), so the layout tests fail if it is not.
   in: size entries, set for the peers (never self). */
_DM_PRIVATE dm_status _dm_peers_find(_dm_eng* lk, bool* in) {
    static const int fam[3] = { _DM_ALGO_FLAT, _DM_ALGO_TWO_LEVEL, _DM_ALGO_THREE_LEVEL };
    dm_collective* c = lk->c;
    const _dm_layout* y = &lk->lay;
    int W = c->size, saved_algo = lk->algo, k;
    const char* saved_name = c->algorithm;
    unsigned char* buf = (unsigned char*)_dm_calloc(&c->allocator, 4 * (size_t)W);
    dm_status st = DM_OK;
    memset(in, 0, sizeof(bool) * (size_t)W);
    for (k = y->start[y->host_of[c->rank]]; k < y->start[y->host_of[c->rank] + 1]; k++) in[y->members[k]] = true;
    if (W == 1 || lk->broken != DM_OK) { _dm_free(&c->allocator, buf); in[c->rank] = false; return DM_OK; }
    if (!buf) return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "%s: out of memory", lk->tag);
    lk->dry = true;
    lk->used = in;
    /* every all_reduce algorithm (W elements: every ring and rail fits), then two_level_ring
       again with its rails forced each way (ring, then rd: the count decides at run time) */
    for (k = _DM_ALGO_FLAT_RING; k < _DM_ALGO_COUNT + 2 && st == DM_OK; k++) {
        lk->algo = k < _DM_ALGO_COUNT ? k : _DM_ALGO_TWO_LEVEL_RING;
        lk->rails_force = k < _DM_ALGO_COUNT ? 0 : k - _DM_ALGO_COUNT + 1;
        st = _dm_coll_all_reduce(c, buf, buf, (size_t)W, DM_UINT8, DM_SUM);
    }
    lk->rails_force = 0;
    for (k = 0; k < (y->NS > 1 ? 3 : 2) && st == DM_OK; k++) {    /* three-level across sites */
        lk->algo = fam[k];
        st = _dm_coll_all_gather(c, buf, buf + W, 1, DM_UINT8);
        if (st == DM_OK) st = _dm_coll_reduce_scatter(c, buf, buf + 2 * W, 1, DM_UINT8, DM_SUM);
        if (st == DM_OK) st = _dm_coll_barrier(c);
        if (st == DM_OK) st = _dm_coll_broadcast(c, buf, 1, DM_UINT8, 0);
    }
    lk->dry = false;
    lk->used = NULL;
    lk->algo = saved_algo;
    c->algorithm = saved_name;
    in[c->rank] = false;
    _dm_free(&c->allocator, buf);
    return st;
}
/* Computes P into lk->peers: from then on a fixed-peer transfer outside it fails (the
   threaded world's check). */
_DM_PRIVATE dm_status _dm_peers_keep(_dm_eng* lk) {
    if (!lk->peers) lk->peers = (bool*)_dm_calloc(&lk->c->allocator, sizeof(bool) * (size_t)lk->c->size);
    if (!lk->peers) return _DM_FAIL(lk->c, DM_ERR_OUT_OF_MEMORY, "%s: out of memory", lk->tag);
    return _dm_peers_find(lk, lk->peers);
}

_DM_COLD_END
/* >>thread  N ranks on N threads of one process. Every collective first meets on a shared
   barrier where each rank posts its fingerprint and all compare them (so a mismatch or a
   missing rank is reported by every rank), then runs the same schedule as the other transports
   over in-process rings (see >>links): the same steps, the same order of reduction, the same
   bits as shared memory and TCP for the same world size. */
typedef struct _dm_tw_slot {
    _dm_fp fp[2];               /* by sequence parity: a rank may post the next while others compare */
    int color, key;
    void* ptr;                  /* split: the new group's shared state, posted by its leader */
    const char* node;           /* split: the member's node_name, for the new group's local rank */
    int site;                   /* split, shrink: the member's site (_dm_thread.site) */
    uint64_t arrived_gen;       /* last barrier generation this rank reached */
} _dm_tw_slot;

typedef struct _dm_tw_shared {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int size;
    int refs;                   /* members not yet destroyed */
    int arrived;
    uint64_t generation;
    dm_status broken;           /* DM_OK, or why the world can no longer be used */
    int broken_rank;            /* the rank whose failure broke it (its notice), or -1 */
    char broken_msg[256];
    dm_allocator allocator;
    _dm_tw_slot* slots;
    /* the in-process transport: a ring per ordered pair of ranks, a bell per rank, sleeping on
       mu/cv; one failure word for the world */
    unsigned char* rings;
    size_t ring_cap, ring_stride;
    _dm_bell* bells;
    _dm_bell_ops bell_ops;
    _dm_abort abort;
    /* dm_shrink (>>thread shrink): who arrived, the union of the excluded, the outcome */
    bool *shrink_in, *shrink_gone;
    struct _dm_tw_shared* shrink_next;
    dm_status shrink_failed;
    char shrink_msg[256];
} _dm_tw_shared;

typedef struct _dm_thread {
    dm_collective base;
    _dm_core core;
    _dm_tw_shared* sh;
    _dm_eng lk;
    int site;                   /* dm_fake_desc.site_of's number for this member (0: one site) */
} _dm_thread;

#define _dm_tw_kind_name _dm_kind_name

static void _dm_tw_bell_wait(void* ctx, _dm_bell* b, uint32_t seen, int ms) {
    _dm_tw_shared* sh = (_dm_tw_shared*)ctx;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += (long)ms * 1000000L;
    while (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
    pthread_mutex_lock(&sh->mu);
    if (__atomic_load_n(&b->seq, __ATOMIC_SEQ_CST) == seen) pthread_cond_timedwait(&sh->cv, &sh->mu, &ts);
    pthread_mutex_unlock(&sh->mu);
}
static void _dm_tw_bell_wake(void* ctx, _dm_bell* b) {
    _dm_tw_shared* sh = (_dm_tw_shared*)ctx;
    (void)b;
    pthread_mutex_lock(&sh->mu);
    pthread_cond_broadcast(&sh->cv);
    pthread_mutex_unlock(&sh->mu);
}
static const _dm_link_vt _dm_tw_link_vt = {
    "thread", _dm_mem_send, _dm_mem_recv, _dm_mem_peek, _dm_mem_consume, NULL, NULL, _dm_mem_destroy, 8,
    _dm_mem_sendv, NULL
};

/* Rings of 256 KiB for up to 8 ranks, smaller for larger worlds (16 MiB in all at most; the
   pages of pairs that never talk are never touched). */
static size_t _dm_tw_ring_cap(int size) {
    size_t cap = (size_t)256 << 10;
    while (cap > ((size_t)4 << 10) && cap * (size_t)size * (size_t)size > ((size_t)16 << 20)) cap /= 2;
    return cap;
}

static _dm_tw_shared* _dm_tw_shared_new(const dm_allocator* a, int size) {
    _dm_tw_shared* sh = (_dm_tw_shared*)_dm_calloc(a, sizeof(_dm_tw_shared));
    pthread_condattr_t attr;
    if (!sh) return NULL;
    sh->ring_cap = _dm_tw_ring_cap(size);
    sh->ring_stride = sizeof(_dm_ring) + sh->ring_cap;
    sh->slots = (_dm_tw_slot*)_dm_calloc(a, sizeof(_dm_tw_slot) * (size_t)size);
    sh->bells = (_dm_bell*)_dm_calloc(a, sizeof(_dm_bell) * (size_t)size);
    sh->rings = (unsigned char*)_dm_calloc(a, sh->ring_stride * (size_t)size * (size_t)size);
    if (!sh->slots || !sh->bells || !sh->rings) {
        _dm_free(a, sh->slots);
        _dm_free(a, sh->bells);
        _dm_free(a, sh->rings);
        _dm_free(a, sh);
        return NULL;
    }
    sh->bell_ops.wait = _dm_tw_bell_wait;
    sh->bell_ops.wake = _dm_tw_bell_wake;
    sh->bell_ops.ctx = sh;
    sh->allocator = *a;
    sh->size = size;
    sh->refs = size;
    sh->broken_rank = -1;
    pthread_mutex_init(&sh->mu, NULL);
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&sh->cv, &attr);
    pthread_condattr_destroy(&attr);
    return sh;
}
static void _dm_tw_shared_release(_dm_tw_shared* sh) {
    bool last;
    pthread_mutex_lock(&sh->mu);
    last = --sh->refs == 0;
    pthread_mutex_unlock(&sh->mu);
    if (!last) return;
    pthread_mutex_destroy(&sh->mu);
    pthread_cond_destroy(&sh->cv);
    _dm_free(&sh->allocator, sh->slots);
    _dm_free(&sh->allocator, sh->bells);
    _dm_free(&sh->allocator, sh->rings);
    _dm_free(&sh->allocator, sh->shrink_in);
    _dm_free(&sh->allocator, sh->shrink_gone);
    _dm_free(&sh->allocator, sh);
}

/* Marks the world unusable and wakes everyone; the caller holds sh->mu. */
static void _dm_tw_break_locked(_dm_tw_shared* sh, dm_status why, const char* msg) {
    if (sh->broken == DM_OK) {
        sh->broken = why;
        _dm_copy_name(sh->broken_msg, sizeof(sh->broken_msg), msg);
    }
    pthread_cond_broadcast(&sh->cv);
}
/* The ranks that have not reached generation gen, as "1, 3" (for timeout messages). */
static void _dm_tw_missing(const _dm_tw_shared* sh, uint64_t gen, char* buf, size_t cap) {
    size_t used = 0;
    int r;
    buf[0] = 0;
    for (r = 0; r < sh->size && used + 12 < cap; r++)
        if (sh->slots[r].arrived_gen < gen)
            used += (size_t)snprintf(buf + used, cap - used, "%s%d", used ? ", " : "", r);
}

/* The shared barrier with the collective's deadline. On timeout the world is broken so the
   ranks still waiting (or arriving later) fail too instead of hanging. */
static dm_status _dm_tw_barrier(_dm_thread* t, int kind) {
    _dm_tw_shared* sh = t->sh;
    dm_collective* c = &t->base;
    int64_t deadline = _dm_deadline(c->timeout_ms);
    uint64_t gen;
    dm_status st = DM_OK;
    char missing[128], msg[256];
    pthread_mutex_lock(&sh->mu);
    if (sh->broken != DM_OK) goto broken;
    gen = sh->generation;
    sh->slots[c->rank].arrived_gen = gen + 1;
    if (++sh->arrived == sh->size) {
        sh->arrived = 0;
        sh->generation++;
        pthread_cond_broadcast(&sh->cv);
        pthread_mutex_unlock(&sh->mu);
        return DM_OK;
    }
    while (sh->generation == gen && sh->broken == DM_OK) {
        if (deadline == INT64_MAX) {
            pthread_cond_wait(&sh->cv, &sh->mu);
        } else {
            struct timespec ts;
            int64_t now = _dm_now_ms();
            if (now >= deadline) {
                _dm_tw_missing(sh, gen + 1, missing, sizeof(missing));
                snprintf(msg, sizeof(msg), "thread: %s #%llu timed out after %d ms waiting for rank(s) %s",
                         _dm_tw_kind_name(kind), (unsigned long long)c->seq, c->timeout_ms, missing);
                _dm_tw_break_locked(sh, DM_ERR_TIMEOUT, msg);
                pthread_mutex_unlock(&sh->mu);
                return _DM_FAIL(c, DM_ERR_TIMEOUT, "%s", msg);
            }
            clock_gettime(CLOCK_MONOTONIC, &ts);
            ts.tv_sec += (time_t)((deadline - now) / 1000);
            ts.tv_nsec += (long)((deadline - now) % 1000) * 1000000L;
            if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
            pthread_cond_timedwait(&sh->cv, &sh->mu, &ts);
        }
    }
    if (sh->generation != gen) { pthread_mutex_unlock(&sh->mu); return DM_OK; }
broken:
    st = sh->broken == DM_ERR_TIMEOUT ? DM_ERR_TIMEOUT : DM_ERR_ABORTED;
    snprintf(msg, sizeof(msg), "%s", sh->broken_msg);
    if (sh->broken_rank >= 0 && sh->broken_rank != c->rank) {   /* another rank's failure: its cause */
        int rank = sh->broken_rank;
        st = sh->broken;
        pthread_mutex_unlock(&sh->mu);
        return _dm_eng_adopt(&t->lk, _dm_tw_kind_name(kind), st, rank, msg);
    }
    pthread_mutex_unlock(&sh->mu);
    return _DM_FAIL(c, st, "thread: %s #%llu failed: the world is broken (%s)",
                    _dm_tw_kind_name(kind), (unsigned long long)c->seq, msg);
}

/* Before every collective: post the fingerprint, meet, compare with rank 0's. A mismatch is
   seen identically by every rank, which all meet once more and report it. */
static dm_status _dm_tw_enter(_dm_thread* t, int kind, size_t count, int dtype, int op, int root) {
    int par = (int)(t->base.seq & 1), r;
    const _dm_fp* ref;
    _dm_fp_make(&t->sh->slots[t->base.rank].fp[par], &t->base, kind, dtype, op, root, count);
    _DM_TRY(_dm_tw_barrier(t, kind));
    ref = &t->sh->slots[0].fp[par];
    for (r = 1; r < t->base.size; r++) {
        const _dm_fp* o = &t->sh->slots[r].fp[par];
        if (_dm_fp_equal(o, ref)) continue;
        _DM_TRY(_dm_tw_barrier(t, kind));
        return _dm_eng_break(&t->lk, _dm_fp_mismatch(&t->base, "thread", 0, ref, r, o));
    }
    return DM_OK;
}

/* The engine's enter step (the core's slots run it before each collective). */
static dm_status _dm_tw_enter_hook(_dm_eng* lk, int kind, size_t count, int dtype, int op, int root) {
    return _dm_tw_enter((_dm_thread*)lk->c, kind, count, dtype, op, root);
}

static dm_status _dm_tw_barrier_slot(dm_collective* c) {
    _dm_thread* t = (_dm_thread*)c;
    _DM_TRY(_dm_eng_check_broken(&t->lk, "barrier"));
    _DM_TRY(_dm_tw_enter(t, _DM_K_BARRIER, 0, -1, -1, -1));
    return _dm_tw_barrier(t, _DM_K_BARRIER);
}

/* The threaded world's split, and its shrink and create below: cold. */
_DM_COLD_BEGIN
static dm_collective* _dm_tw_member_new(_dm_tw_shared* sh, int rank, const dm_fake_desc* d,
                                        const dm_collective* like);

/* The new member's local rank and size: members of its group on the same node, in new-rank order. */
static void _dm_tw_split_set_local(const _dm_tw_slot* slots, int n, int color, int key, int me,
                                   dm_collective* out) {
    int r, lrank = 0, lsize = 0;
    for (r = 0; r < n; r++) {
        if (slots[r].color != color || strcmp(slots[r].node, slots[me].node) != 0) continue;
        lsize++;
        if (slots[r].key < key || (slots[r].key == key && r < me)) lrank++;
    }
    out->local_rank = lrank;
    out->local_size = lsize;
}

/* The member's host layout: members whose nodes have the same name share a host. names[i]
   is the node of the member of rank i, sites[i] its site (_dm_thread.site). */
static void _dm_tw_set_layout(_dm_thread* t, const char* const* names, const int* sites) {
    int* hosts = t->lk.lay.host_of;     /* _dm_eng_set_layout may be given its own array */
    int r, q;
    for (r = 0; r < t->base.size; r++) {
        for (q = 0; q < r && strcmp(names[q], names[r]) != 0; q++) {}
        hosts[r] = q;
    }
    _dm_eng_set_layout(&t->lk, hosts, sites);
    if (_dm_peers_keep(&t->lk) != DM_OK) {   /* no check then, nothing else lost */
        _dm_free(&t->base.allocator, t->lk.peers);
        t->lk.peers = NULL;
    }
}
/* A split member's layout: the nodes of its group's members, in new-rank order. */
static dm_status _dm_tw_split_layout(_dm_thread* nt, const _dm_tw_slot* slots, int n, int color) {
    const char** names = (const char**)_dm_calloc(&nt->base.allocator, sizeof(char*) * (size_t)nt->base.size);
    int* sites = (int*)_dm_calloc(&nt->base.allocator, sizeof(int) * (size_t)nt->base.size);
    int r, q;
    if (!names || !sites) {
        _dm_free(&nt->base.allocator, names);
        _dm_free(&nt->base.allocator, sites);
        return DM_ERR_OUT_OF_MEMORY;
    }
    for (r = 0; r < n; r++) {
        int pos = 0;
        if (slots[r].color != color) continue;
        for (q = 0; q < n; q++)
            if (slots[q].color == color && (slots[q].key < slots[r].key || (slots[q].key == slots[r].key && q < r)))
                pos++;
        names[pos] = slots[r].node;
        sites[pos] = slots[r].site;
    }
    _dm_tw_set_layout(nt, names, sites);
    _dm_free(&nt->base.allocator, names);
    _dm_free(&nt->base.allocator, sites);
    return DM_OK;
}

/* split: post (color, key); each group's leader (first by (key, rank)) makes the shared state
   and posts it; members pick it up. Three meetings keep the slots stable while read. */
static dm_status _dm_tw_split(dm_collective* c, int color, int key, dm_collective** out) {
    _dm_thread* t = (_dm_thread*)c;
    _dm_tw_slot* slots = t->sh->slots;
    int r, n = 0, my_pos = 0, leader = -1;
    dm_status st;
    slots[c->rank].color = color;
    slots[c->rank].key = key;
    slots[c->rank].ptr = NULL;
    slots[c->rank].node = c->node_name;
    slots[c->rank].site = t->site;
    _DM_TRY(_dm_tw_enter(t, _DM_K_SPLIT, 0, -1, -1, -1));
    if (color != DM_SPLIT_NONE) {
        for (r = 0; r < c->size; r++) {
            if (slots[r].color != color) continue;
            n++;
            if (slots[r].key < key || (slots[r].key == key && r < c->rank)) my_pos++;
            if (leader < 0 || slots[r].key < slots[leader].key) leader = r;
        }
        if (leader == c->rank) slots[c->rank].ptr = _dm_tw_shared_new(&c->allocator, n);
    }
    _DM_TRY(_dm_tw_barrier(t, _DM_K_SPLIT));
    if (color != DM_SPLIT_NONE) {
        _dm_tw_shared* nsh = (_dm_tw_shared*)slots[leader].ptr;
        if (nsh) *out = _dm_tw_member_new(nsh, my_pos, NULL, c);
        if (*out) _dm_tw_split_set_local(slots, c->size, color, key, c->rank, *out);
        if (*out && _dm_tw_split_layout((_dm_thread*)*out, slots, c->size, color) != DM_OK) {
            dm_destroy(*out);
            *out = NULL;
        }
    }
    st = _dm_tw_barrier(t, _DM_K_SPLIT);
    if (st != DM_OK) { dm_destroy(*out); *out = NULL; return st; }
    if (color != DM_SPLIT_NONE && !*out) {
        /* Leader allocation or member allocation failed: nothing usable for this group. */
        return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "thread: split #%llu: out of memory",
                        (unsigned long long)c->seq);
    }
    return DM_OK;
}

/* >>thread shrink  The ranks that stay meet under the world's lock: each adds its excluded
   ranks to the union and waits until every rank outside the union has arrived; the one that
   completes the meeting makes the new world's shared state. Threads cannot die here, so the
   union is the whole answer; a rank that never comes is a timeout on every waiting rank. */
static bool _dm_tw_shrink_complete(const _dm_tw_shared* sh) {
    int r;
    for (r = 0; r < sh->size; r++)
        if (!sh->shrink_gone[r] && !sh->shrink_in[r]) return false;
    return true;
}
/* Waits (holding sh->mu) until the meeting is complete or failed; DM_OK or the failure. */
static dm_status _dm_tw_shrink_meet(_dm_thread* t, int64_t deadline) {
    _dm_tw_shared* sh = t->sh;
    int r, n = 0;
    while (!sh->shrink_next && sh->shrink_failed == DM_OK) {
        struct timespec ts;
        int64_t now = _dm_now_ms();
        if (_dm_tw_shrink_complete(sh)) {
            for (r = 0; r < sh->size; r++) n += !sh->shrink_gone[r];
            sh->shrink_next = _dm_tw_shared_new(&sh->allocator, n);
            if (!sh->shrink_next) {
                sh->shrink_failed = DM_ERR_OUT_OF_MEMORY;
                snprintf(sh->shrink_msg, sizeof(sh->shrink_msg), "thread: shrink: out of memory");
            }
            pthread_cond_broadcast(&sh->cv);
            break;
        }
        if (now >= deadline) {
            size_t used = 0;
            sh->shrink_failed = DM_ERR_TIMEOUT;
            used += (size_t)snprintf(sh->shrink_msg, sizeof(sh->shrink_msg), "thread: shrink timed out after %d ms "
                                     "waiting for rank(s)", t->base.timeout_ms);
            for (r = 0; r < sh->size && used + 12 < sizeof(sh->shrink_msg); r++)
                if (!sh->shrink_gone[r] && !sh->shrink_in[r])
                    used += (size_t)snprintf(sh->shrink_msg + used, sizeof(sh->shrink_msg) - used, " %d", r);
            pthread_cond_broadcast(&sh->cv);
            break;
        }
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += 20 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&sh->cv, &sh->mu, &ts);
    }
    return sh->shrink_failed;
}
static dm_status _dm_tw_shrink(dm_collective* c, const bool* excluded, int flags, dm_collective** out) {
    _dm_thread* t = (_dm_thread*)c;
    _dm_tw_shared* sh = t->sh;
    _dm_tw_shared* nsh;
    const char** names;
    int* sites;
    int r, rank = 0, n = 0;
    dm_status st;
    char msg[256];
    if (flags == DM_SHRINK_ABORT && t->lk.broken == DM_OK) {
        _DM_FAIL(c, DM_ERR_ABORTED, "thread: rank %d aborted the world (dm_shrink with DM_SHRINK_ABORT)", c->rank);
        _dm_eng_break(&t->lk, DM_ERR_ABORTED);
    }
    pthread_mutex_lock(&sh->mu);
    if (!sh->shrink_in) sh->shrink_in = (bool*)_dm_calloc(&sh->allocator, sizeof(bool) * (size_t)sh->size);
    if (!sh->shrink_gone) sh->shrink_gone = (bool*)_dm_calloc(&sh->allocator, sizeof(bool) * (size_t)sh->size);
    if (!sh->shrink_in || !sh->shrink_gone) {
        pthread_mutex_unlock(&sh->mu);
        return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "thread: shrink: out of memory");
    }
    if (sh->shrink_in[c->rank]) {
        pthread_mutex_unlock(&sh->mu);
        return _DM_FAIL(c, DM_ERR_ABORTED, "thread: shrink: this world was already shrunk; destroy it");
    }
    sh->shrink_in[c->rank] = true;
    sh->slots[c->rank].node = c->node_name;
    sh->slots[c->rank].site = t->site;
    for (r = 0; r < sh->size; r++) sh->shrink_gone[r] = sh->shrink_gone[r] || excluded[r];
    pthread_cond_broadcast(&sh->cv);
    st = _dm_tw_shrink_meet(t, _dm_deadline(c->timeout_ms));
    snprintf(msg, sizeof(msg), "%s", sh->shrink_msg);
    nsh = sh->shrink_next;
    if (st == DM_OK && sh->shrink_gone[c->rank]) st = DM_ERR_ABORTED;
    names = (const char**)_dm_calloc(&c->allocator, sizeof(char*) * (size_t)sh->size);
    sites = (int*)_dm_calloc(&c->allocator, sizeof(int) * (size_t)sh->size);
    for (r = 0; r < sh->size && names && sites; r++) {
        if (sh->shrink_gone[r]) continue;
        if (r < c->rank) rank++;
        sites[n] = sh->slots[r].site;
        names[n++] = sh->slots[r].node;
    }
    pthread_mutex_unlock(&sh->mu);
    if (t->lk.broken == DM_OK) {
        t->lk.broken = DM_ERR_ABORTED;
        _dm_copy_name(t->lk.broken_msg, sizeof(t->lk.broken_msg),
                      "this collective was shrunk into a new one by dm_shrink; destroy it");
    }
    if (st != DM_OK || !names || !sites) {
        _dm_free(&c->allocator, names);
        _dm_free(&c->allocator, sites);
        if (st == DM_OK) _dm_tw_shared_release(nsh);   /* this member's reference, never taken */
        if (st == DM_ERR_ABORTED)   /* not a member of the new world: it holds no reference for this rank */
            return _DM_FAIL(c, st, "thread: shrink: rank %d was left out by the other ranks", c->rank);
        return _DM_FAIL(c, st ? st : DM_ERR_OUT_OF_MEMORY, "%s", st ? msg : "thread: shrink: out of memory");
    }
    *out = _dm_tw_member_new(nsh, rank, NULL, c);
    if (*out) {
        _dm_thread* nt = (_dm_thread*)*out;
        (*out)->local_rank = 0;
        (*out)->local_size = 0;
        for (r = 0; r < n; r++) {
            if (strcmp(names[r], c->node_name) != 0) continue;
            if (r < rank) (*out)->local_rank++;
            (*out)->local_size++;
        }
        _dm_tw_set_layout(nt, names, sites);
    }
    _dm_free(&c->allocator, names);
    _dm_free(&c->allocator, sites);
    if (!*out) return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "thread: shrink: out of memory");
    return DM_OK;
}

/* >>thread create  A member's links, its vtable, and the world made and run on threads. */

/* A failure on this member's links (a mismatch found by a dm_recv, say) breaks the whole
   world, so ranks waiting in the shared barrier fail with its cause instead of waiting for a
   rank that will not come. */
static void _dm_tw_notice_post(_dm_eng* lk, dm_status st, const char* msg) {
    _dm_tw_shared* sh = ((_dm_thread*)lk->c)->sh;
    pthread_mutex_lock(&sh->mu);
    if (sh->broken == DM_OK) sh->broken_rank = lk->c->rank;
    _dm_tw_break_locked(sh, st, msg);
    pthread_mutex_unlock(&sh->mu);
}

/* This member's end of every ring; its waits spin only while the world's threads fit the cores. */
static dm_status _dm_tw_links(_dm_thread* t) {
    _dm_tw_shared* sh = t->sh;
    int r, W = sh->size, me = t->base.rank;
    _DM_TRY(_dm_eng_init(&t->lk, &t->base, "thread", 0));
    t->lk.enter = _dm_tw_enter_hook;
    for (r = 0; r < W; r++) {
        if (r == me) continue;
        t->lk.links[r] = _dm_memlink_new(&sh->allocator, &_dm_tw_link_vt, sh->rings, sh->ring_stride,
                                         sh->ring_cap, W, me, r, sh->bells, &sh->bell_ops, -1);
        if (!t->lk.links[r]) return DM_ERR_OUT_OF_MEMORY;
        snprintf(t->lk.links[r]->where, sizeof(t->lk.links[r]->where), "thread %d", r);
    }
    t->lk.bell = &sh->bells[me];
    t->lk.bells = sh->bells;
    t->lk.nbells = W;
    t->lk.bell_ops = &sh->bell_ops;
    t->lk.abort = &sh->abort;
    t->lk.notice_post = _dm_tw_notice_post;
    _dm_eng_set_policy(&t->lk, W);
    return DM_OK;
}

/* dm_abort from another thread: the notice breaks the shared world (ranks in its barrier
   fail with the message) and the abort word wakes the rings' waiters, this rank's owner
   included. Nothing without dm_abort (dm_shrink's abort breaks the world on its own). */
static void _dm_tw_interrupt(dm_collective* c) { _dm_eng_abort_notify(&((_dm_thread*)c)->lk); }

static void _dm_tw_destroy(dm_collective* c) {
    _dm_thread* t = (_dm_thread*)c;
    dm_allocator a = c->allocator;
    _dm_eng_release(&t->lk);
    if (t->sh) _dm_tw_shared_release(t->sh);
    _dm_free(&a, t);
}

static const dm_collective_vtable _dm_thread_vtable = {
    sizeof(dm_collective_vtable),    /* struct_size */
    DM_COLLECTIVE_VTABLE_VERSION,    /* version */
    "thread",                        /* name */
    _dm_tw_destroy,                  /* destroy */
    _dm_tw_barrier_slot,             /* barrier: the world's shared barrier */
    _dm_coll_all_reduce,             /* all_reduce: the core's (>>entry points), after the meeting */
    NULL,                            /* all_gather: core builds it on all_gather_to_list */
    _dm_coll_all_gather_to_list,     /* all_gather_to_list */
    _dm_coll_reduce_scatter,         /* reduce_scatter */
    _dm_coll_broadcast,              /* broadcast */
    _dm_tw_split,                    /* split */
    NULL,                            /* native_handle */
    NULL,                            /* synchronize */
    NULL,                            /* transport: "thread" */
    _dm_coll_reduce,                 /* reduce */
    _dm_coll_gather,                 /* gather */
    _dm_coll_scatter,                /* scatter */
    _dm_coll_all_to_all_v,           /* all_to_all_v: the meeting compares kind and dtype, the pairs counts */
    _dm_coll_send,                   /* send: the two ranks only, no meeting */
    _dm_coll_recv,                   /* recv */
    NULL,                            /* start */
    NULL,                            /* finish */
    _dm_tw_shrink,                   /* shrink */
    NULL,                            /* grow */
    _dm_tw_interrupt,                /* interrupt: dm_abort */
    _dm_coll_recv_any,               /* recv_any: every peer's inbox */
};

/* A member of a shared world. like: copy logger, allocator, timeout and node name from it
   (split), or NULL with d to derive the node layout (world creation). A failed allocation
   drops this member's reference so the shared state is still freed. */
static dm_collective* _dm_tw_member_new(_dm_tw_shared* sh, int rank, const dm_fake_desc* d,
                                        const dm_collective* like) {
    _dm_thread* t = (_dm_thread*)_dm_calloc(&sh->allocator, sizeof(_dm_thread));
    if (!t) { _dm_tw_shared_release(sh); return NULL; }
    t->sh = sh;
    _dm_collective_init(&t->base, &t->core, &_dm_thread_vtable, rank, sh->size,
                        like ? like->timeout_ms : 0, like ? &like->logger : NULL, &sh->allocator);
    if (!like && d->host_of) _dm_fake_set_host(&t->base, d->host_of);
    else if (!like) _dm_fake_set_local(&t->base, d->local_world_size);
    else _dm_copy_name(t->base.node_name, sizeof(t->base.node_name), like->node_name);
    t->site = like ? ((const _dm_thread*)like)->site : d->site_of ? d->site_of[rank] : 0;
    if (_dm_tw_links(t) != DM_OK) { _dm_tw_destroy(&t->base); return NULL; }
    return &t->base;
}

static dm_status _dm_thread_world_create_checked(const dm_fake_desc* desc, dm_collective** out) {
    char err[DM_LAST_ERROR_SIZE];
    _dm_tw_shared* sh;
    int r, n;
    _DM_ZERO(dm_fake_desc, d);
    if (!out) return _DM_REPORT(NULL, err, sizeof(err), DM_ERR_INVALID_ARG, "thread: out is NULL");
    if (desc) d = *desc;
    n = _dm_def(d.world_size, 1);
    _DM_TRY(_dm_fake_desc_check(&d, false, err, sizeof(err)));
    for (r = 0; r < n; r++) out[r] = NULL;
    _DM_TRY(_dm_cfg_check_create(&d.logger, d.timeout_ms, err, sizeof(err)));
    {
        int algo;
        dm_compress mode;
        char why[200];
        if (_dm_eng_env(&algo, &mode, NULL, why, sizeof(why)) != DM_OK)
            return _DM_REPORT(&d.logger, err, sizeof(err), DM_ERR_ENV, "thread: %s", why);
    }
    sh = _dm_tw_shared_new(&d.allocator, n);
    if (!sh) return _DM_REPORT(&d.logger, err, sizeof(err), DM_ERR_OUT_OF_MEMORY, "thread: out of memory");
    for (r = 0; r < n; r++) {
        out[r] = _dm_tw_member_new(sh, r, &d, NULL);
        if (!out[r]) break;
        out[r]->timeout_ms = _dm_timeout_logged(d.timeout_ms, &d.logger);
        out[r]->logger = _dm_logger_or_default(&d.logger, r);
    }
    if (r == n) {
        const char** names = (const char**)_dm_calloc(&d.allocator, sizeof(char*) * (size_t)n);
        if (names) {
            for (r = 0; r < n; r++) names[r] = out[r]->node_name;
            for (r = 0; r < n; r++) _dm_tw_set_layout((_dm_thread*)out[r], names, d.site_of);
            _dm_free(&d.allocator, names);
            return DM_OK;
        }
        for (r = 0; r < n; r++) { dm_destroy(out[r]); out[r] = NULL; }
        return _DM_REPORT(&d.logger, err, sizeof(err), DM_ERR_OUT_OF_MEMORY, "thread: out of memory");
    }
    /* Member r failed (and released its reference); drop the references never handed out. */
    { int k; for (k = r + 1; k < n; k++) _dm_tw_shared_release(sh); }
    for (r = 0; r < n; r++) { dm_destroy(out[r]); out[r] = NULL; }
    return _DM_REPORT(&d.logger, err, sizeof(err), DM_ERR_OUT_OF_MEMORY, "thread: out of memory");
}
DM_API_IMPL dm_status dm_thread_world_create(const dm_fake_desc* desc, dm_collective** out) {
    _dm_create_begin();
    return _dm_create_end(_dm_thread_world_create_checked(desc, out), desc && desc->logger.func);
}

typedef struct _dm_tw_run_arg {
    dm_collective* c;
    dm_rank_fn fn;
    void* user;
    int result;
} _dm_tw_run_arg;
static void* _dm_tw_run_thread(void* p) {
    _dm_tw_run_arg* a = (_dm_tw_run_arg*)p;
    a->result = a->fn(a->c, a->user);
    return NULL;
}
DM_API_IMPL dm_status dm_thread_world_run(const dm_fake_desc* desc, dm_rank_fn fn, void* user_data) {
    _DM_ZERO(dm_fake_desc, d);
    dm_collective** cs;
    _dm_tw_run_arg* args;
    pthread_t* threads;
    int n, r, started = 0;
    dm_status st = DM_OK;
    if (!fn) return DM_ERR_INVALID_ARG;
    if (desc) d = *desc;
    if (d.world_size < 0) return DM_ERR_INVALID_ARG;
    n = _dm_def(d.world_size, 1);
    cs = (dm_collective**)_dm_calloc(&d.allocator, sizeof(*cs) * (size_t)n);
    args = (_dm_tw_run_arg*)_dm_calloc(&d.allocator, sizeof(*args) * (size_t)n);
    threads = (pthread_t*)_dm_calloc(&d.allocator, sizeof(*threads) * (size_t)n);
    if (!cs || !args || !threads) { st = DM_ERR_OUT_OF_MEMORY; goto done; }
    st = dm_thread_world_create(&d, cs);
    if (st != DM_OK) goto done;
    for (r = 0; r < n; r++) {
        args[r].c = cs[r];
        args[r].fn = fn;
        args[r].user = user_data;
        if (pthread_create(&threads[r], NULL, _dm_tw_run_thread, &args[r]) != 0) break;
        started++;
    }
    if (started < n) {
        /* Break the world so the ranks that did start fail at once instead of waiting. */
        _dm_tw_shared* sh = ((_dm_thread*)cs[0])->sh;
        pthread_mutex_lock(&sh->mu);
        _dm_tw_break_locked(sh, DM_ERR_INTERNAL, "could not start every rank thread");
        pthread_mutex_unlock(&sh->mu);
        st = DM_ERR_INTERNAL;
    }
    for (r = 0; r < started; r++) pthread_join(threads[r], NULL);
    for (r = 0; r < n; r++) dm_destroy(cs[r]);
    for (r = 0; r < started && st == DM_OK; r++)
        if (args[r].result != DM_OK) st = (dm_status)args[r].result;
done:
    _dm_free(&d.allocator, cs);
    _dm_free(&d.allocator, args);
    _dm_free(&d.allocator, threads);
    return st;
}

/* >>groups  A sub-collective whose size and rank the caller already knows (mesh dims, the
   node-local group). A simulated Fake cannot learn the other ranks' colors, so it is handed the
   expected shape directly; every other backend splits for real and the shape is checked. */
static dm_status _dm_split_expect(dm_collective* c, int color, int key, int expect_size,
                                  int expect_rank, dm_collective** out) {
    dm_status st;
    *out = NULL;
    if (c->vt == &_dm_fake_vtable) {
        _DM_ZERO(dm_fake_desc, d);
        d.world_size = expect_size;
        d.rank = expect_rank;
        d.timeout_ms = c->timeout_ms;
        d.logger = c->logger;
        d.allocator = c->allocator;
        st = _dm_fake_create_with(&d, out);
        if (st != DM_OK) return _DM_FAIL(c, st, "fake: out of memory making a sub-collective");
        _dm_copy_name((*out)->node_name, sizeof((*out)->node_name), c->node_name);
        return DM_OK;
    }
    _DM_TRY(dm_split(c, color, key, out));
    if (!*out || (*out)->size != expect_size || (*out)->rank != expect_rank) {
        int got_size = *out ? (*out)->size : 0, got_rank = *out ? (*out)->rank : -1;
        dm_destroy(*out);
        *out = NULL;
        return _DM_FAIL(c, DM_ERR_INTERNAL, "%s: split gave rank %d of %d, expected rank %d of %d",
                        c->vt->name, got_rank, got_size, expect_rank, expect_size);
    }
    return DM_OK;
}

DM_API_IMPL dm_collective* dm_local(dm_collective* c) {
    enum { NAME = sizeof(((dm_collective*)0)->node_name) };
    char* names;
    int r, color = -1, lsize = 0, lrank = 0;
    if (!c) return NULL;
    if (c->local) return c->local;
    if (c->vt == &_dm_fake_vtable) {
        _dm_split_expect(c, 0, c->rank, c->local_size, c->local_rank, &c->local);
        return c->local;
    }
    names = (char*)_dm_malloc(&c->allocator, (size_t)NAME * (size_t)c->size);
    if (!names) { _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "local: out of memory"); return NULL; }
    if (dm_all_gather(c, c->node_name, names, NAME, DM_UINT8) == DM_OK) {
        for (r = 0; r < c->size; r++) {
            const char* other = names + (size_t)r * NAME;
            if (strncmp(other, c->node_name, NAME) != 0) continue;
            if (color < 0) color = r;
            lsize++;
            if (r < c->rank) lrank++;
        }
        if (_dm_split_expect(c, color, c->rank, lsize, lrank, &c->local) == DM_OK) {
            c->local_rank = lrank;
            c->local_size = lsize;
        }
    }
    _dm_free(&c->allocator, names);
    return c->local;
}

DM_API_IMPL dm_status dm_main_process_first_begin(dm_collective* c, bool local_only) {
    dm_collective* g;
    if (!c) return DM_ERR_INVALID_ARG;
    g = local_only ? dm_local(c) : c;
    if (!g) return _DM_FAIL(c, DM_ERR_INTERNAL, "main_process_first: no local group (%s)", c->last_error);
    if (g->rank == 0) return DM_OK;
    if (dm_barrier(g) != DM_OK) return _DM_FAIL(c, DM_ERR_ABORTED, "main_process_first: %s", g->last_error);
    return DM_OK;
}
DM_API_IMPL dm_status dm_main_process_first_end(dm_collective* c, bool local_only) {
    dm_collective* g;
    if (!c) return DM_ERR_INVALID_ARG;
    g = local_only ? dm_local(c) : c;
    if (!g) return _DM_FAIL(c, DM_ERR_INTERNAL, "main_process_first: no local group (%s)", c->last_error);
    if (g->rank != 0) return DM_OK;
    if (dm_barrier(g) != DM_OK) return _DM_FAIL(c, DM_ERR_ABORTED, "main_process_first: %s", g->last_error);
    return DM_OK;
}

/* >>mesh */
struct dm_mesh {
    dm_collective* world;
    int ndims;
    char names[DM_MAX_DIMS][DM_MAX_DIM_NAME];
    int sizes[DM_MAX_DIMS];
    int coords[DM_MAX_DIMS];
    dm_collective* groups[DM_MAX_DIMS];
    dm_logger logger;
    dm_allocator allocator;
    char last_error[DM_LAST_ERROR_SIZE];
};

/* "dp=2 x tp=4" for messages. */
static void _dm_mesh_shape_text(const dm_mesh_desc* d, const int* sizes, char* buf, size_t cap) {
    size_t used = 0;
    int i;
    buf[0] = 0;
    for (i = 0; i < d->ndims && used < cap; i++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%s=%d", i ? " x " : "", d->dim_names[i], sizes[i]);
}

/* The desc's logger, else the world's (the desc comment promises that default). */
static const dm_logger* _dm_mesh_desc_logger(const dm_mesh_desc* d) {
    return (d->logger.func || !d->world) ? &d->logger : &d->world->logger;
}

static dm_status _dm_mesh_check(const dm_mesh_desc* d, int* sizes, char* err, size_t cap) {
    const dm_logger* lg = _dm_mesh_desc_logger(d);
    int i, j, zero_at = -1;
    long long product = 1;      /* of the sizes given; stops growing once past the world */
    char shape[256];
    if (!d->world) return _DM_REPORT(lg, err, cap, DM_ERR_INVALID_ARG, "mesh: world is NULL");
    if (!_dm_allocator_valid(&d->allocator))
        return _DM_REPORT(lg, err, cap, DM_ERR_INVALID_ARG, "mesh: allocator needs both functions or neither");
    if (d->ndims < 1 || d->ndims > DM_MAX_DIMS)
        return _DM_REPORT(lg, err, cap, DM_ERR_INVALID_ARG, "mesh: ndims %d is not in 1..%d", d->ndims, DM_MAX_DIMS);
    for (i = 0; i < d->ndims; i++) {
        const char* n = d->dim_names[i];
        if (!n || !*n || strlen(n) >= DM_MAX_DIM_NAME)
            return _DM_REPORT(lg, err, cap, DM_ERR_INVALID_ARG,
                              "mesh: dim %d needs a name of 1..%d bytes", i, DM_MAX_DIM_NAME - 1);
        for (j = 0; j < i; j++)
            if (strcmp(d->dim_names[j], n) == 0)
                return _DM_REPORT(lg, err, cap, DM_ERR_INVALID_ARG, "mesh: dim name \"%s\" appears twice", n);
        if (d->dim_sizes[i] < 0)
            return _DM_REPORT(lg, err, cap, DM_ERR_INVALID_ARG, "mesh: dim %s has size %d", n, d->dim_sizes[i]);
        if (d->dim_sizes[i] == 0 && zero_at >= 0)
            return _DM_REPORT(lg, err, cap, DM_ERR_INVALID_ARG,
                              "mesh: dims %s and %s are both 0 (at most one size can be inferred)",
                              d->dim_names[zero_at], n);
        if (d->dim_sizes[i] == 0) zero_at = i;
        else if (product <= d->world->size) product *= d->dim_sizes[i];
        sizes[i] = d->dim_sizes[i];
    }
    /* The inferred dim takes what the others leave, when they divide the world. */
    if (zero_at >= 0 && product <= d->world->size && d->world->size % product == 0) {
        sizes[zero_at] = (int)(d->world->size / product);
        product = d->world->size;
    }
    if (zero_at >= 0 && sizes[zero_at] == 0) product = 0;
    if (product != d->world->size) {
        _dm_mesh_shape_text(d, d->dim_sizes, shape, sizeof(shape));
        return _DM_REPORT(lg, err, cap, DM_ERR_INVALID_ARG,
                          "mesh: dims (%s) do not multiply to the world size %d", shape, d->world->size);
    }
    return DM_OK;
}

/* Dim i's group: ranks equal in every other coordinate. Color = the rank with coordinate i
   zeroed (unique per group), key = coordinate i. Row-major: the last dim has stride 1. */
static dm_status _dm_mesh_build_groups(dm_mesh* m) {
    int i, stride = 1, rank = m->world->rank;
    int strides[DM_MAX_DIMS];
    for (i = m->ndims - 1; i >= 0; i--) {
        strides[i] = stride;
        m->coords[i] = (rank / stride) % m->sizes[i];
        stride *= m->sizes[i];
    }
    for (i = 0; i < m->ndims; i++) {
        dm_status st = _dm_split_expect(m->world, rank - m->coords[i] * strides[i], m->coords[i],
                                        m->sizes[i], m->coords[i], &m->groups[i]);
        if (st != DM_OK)
            return _DM_REPORT(&m->logger, m->last_error, sizeof(m->last_error), st,
                              "mesh: making the %s group failed: %s", m->names[i], m->world->last_error);
    }
    return DM_OK;
}

DM_API_IMPL dm_status dm_mesh_create(const dm_mesh_desc* desc, dm_mesh** out) {
    char err[DM_LAST_ERROR_SIZE];
    int sizes[DM_MAX_DIMS] = { 0 };
    dm_mesh* m;
    int i;
    dm_status st;
    if (out) *out = NULL;
    if (!desc) return DM_ERR_INVALID_ARG;           /* no object and no logger to tell */
    if (!out && desc->world)
        return _DM_REPORT(_dm_mesh_desc_logger(desc), desc->world->last_error, sizeof(desc->world->last_error),
                          DM_ERR_INVALID_ARG, "mesh: out is NULL");
    if (!out) return DM_ERR_INVALID_ARG;
    st = _dm_mesh_check(desc, sizes, err, sizeof(err));
    if (st != DM_OK) {
        if (desc->world) _dm_copy_name(desc->world->last_error, sizeof(desc->world->last_error), err);
        return st;
    }
    m = (dm_mesh*)_dm_calloc(desc->allocator.alloc_fn ? &desc->allocator : &desc->world->allocator, sizeof(dm_mesh));
    if (!m)
        return _DM_REPORT(_dm_mesh_desc_logger(desc), desc->world->last_error, sizeof(desc->world->last_error),
                          DM_ERR_OUT_OF_MEMORY, "mesh: out of memory");
    m->world = desc->world;
    m->ndims = desc->ndims;
    m->logger = desc->logger.func ? desc->logger : desc->world->logger;
    m->allocator = desc->allocator.alloc_fn ? desc->allocator : desc->world->allocator;
    for (i = 0; i < m->ndims; i++) {
        _dm_copy_name(m->names[i], DM_MAX_DIM_NAME, desc->dim_names[i]);
        m->sizes[i] = sizes[i];
    }
    st = _dm_mesh_build_groups(m);
    if (st != DM_OK) {
        _dm_copy_name(desc->world->last_error, sizeof(desc->world->last_error), m->last_error);
        dm_mesh_destroy(m);
        return st;
    }
    *out = m;
    return DM_OK;
}

DM_API_IMPL dm_status dm_mesh_create_dp_tp(dm_collective* world, int tp_size, dm_mesh** out) {
    _DM_ZERO(dm_mesh_desc, d);
    if (!world) return DM_ERR_INVALID_ARG;
    if (tp_size < 1) return _DM_FAIL(world, DM_ERR_INVALID_ARG, "mesh: tp_size %d must be >= 1", tp_size);
    d.world = world;
    d.ndims = 2;
    d.dim_names[0] = "dp";
    d.dim_names[1] = "tp";
    d.dim_sizes[0] = 0;
    d.dim_sizes[1] = tp_size;
    return dm_mesh_create(&d, out);
}

DM_API_IMPL void dm_mesh_destroy(dm_mesh* m) {
    dm_allocator a;
    int i;
    if (!m) return;
    for (i = 0; i < m->ndims; i++) dm_destroy(m->groups[i]);
    a = m->allocator;
    _dm_free(&a, m);
}
DM_API_IMPL int dm_mesh_ndims(const dm_mesh* m) { return m ? m->ndims : 0; }
/* Failures of the queries below are recorded on the mesh. The buffer is written only on
   failure (the mesh was allocated writable; the const is the caller's promise for successes). */
static int _dm_mesh_fail_dim(const dm_mesh* m, const char* name) {
    char dims[DM_MAX_DIMS * DM_MAX_DIM_NAME + 16];
    size_t used = 0;
    int i;
    if (!name || !*name) {
        _DM_REPORT(&m->logger, (char*)m->last_error, sizeof(m->last_error), DM_ERR_INVALID_ARG,
                   "mesh: dim must be specified. (%s name; NULL means the whole world in rank, "
                   "size and group)", name ? "an empty" : "a NULL");
        return -1;
    }
    dims[0] = 0;
    for (i = 0; i < m->ndims; i++)
        used += (size_t)snprintf(dims + used, sizeof(dims) - used, "%s%s", i ? ", " : "", m->names[i]);
    _DM_REPORT(&m->logger, (char*)m->last_error, sizeof(m->last_error), DM_ERR_INVALID_ARG,
               "mesh: no dim named \"%.*s\" (dims: %s)", DM_MAX_DIM_NAME, name, dims);
    return -1;
}
/* Index of name or -1, silently: for the accessors where a missing dim has a meaning. */
static int _dm_mesh_find(const dm_mesh* m, const char* name) {
    int i;
    if (!m || !name) return -1;
    for (i = 0; i < m->ndims; i++)
        if (strcmp(m->names[i], name) == 0) return i;
    return -1;
}
DM_API_IMPL const char* dm_mesh_dim_name(const dm_mesh* m, int i) {
    if (!m) return NULL;
    if (i >= 0 && i < m->ndims) return m->names[i];
    _DM_REPORT(&m->logger, (char*)m->last_error, sizeof(m->last_error), DM_ERR_INVALID_ARG,
               "mesh: dim index %d is not in 0..%d", i, m->ndims - 1);
    return NULL;
}
DM_API_IMPL int dm_mesh_dim_index(const dm_mesh* m, const char* name) {
    int i;
    if (!m) return -1;
    i = _dm_mesh_find(m, name);
    return i >= 0 ? i : _dm_mesh_fail_dim(m, name);
}
/* Index of name, or -1 with a message on the mesh; name NULL -> DM_MAX_DIMS (the world). */
static int _dm_mesh_lookup(const dm_mesh* m, const char* name) {
    int i;
    if (!name) return DM_MAX_DIMS;
    i = _dm_mesh_find(m, name);
    return i >= 0 ? i : _dm_mesh_fail_dim(m, name);
}
DM_API_IMPL int dm_mesh_rank(const dm_mesh* m, const char* name) {
    int i;
    if (!m) return -1;
    i = _dm_mesh_lookup(m, name);
    return i < 0 ? -1 : i == DM_MAX_DIMS ? m->world->rank : m->coords[i];
}
DM_API_IMPL int dm_mesh_size(const dm_mesh* m, const char* name) {
    int i;
    if (!m) return -1;
    i = _dm_mesh_lookup(m, name);
    return i < 0 ? -1 : i == DM_MAX_DIMS ? m->world->size : m->sizes[i];
}
DM_API_IMPL dm_collective* dm_mesh_group(dm_mesh* m, const char* name) {
    int i;
    if (!m) return NULL;
    i = _dm_mesh_lookup(m, name);
    return i < 0 ? NULL : i == DM_MAX_DIMS ? m->world : m->groups[i];
}
DM_API_IMPL dm_collective* dm_mesh_world(const dm_mesh* m) { return m ? m->world : NULL; }
DM_API_IMPL const char* dm_mesh_last_error(const dm_mesh* m) { return m ? m->last_error : "no mesh (NULL)"; }
/* A missing dp or tp dim is size 1, rank 0 (not a failure); a NULL mesh stays -1. */
DM_API_IMPL int dm_mesh_dp_rank(const dm_mesh* m) { return m && _dm_mesh_find(m, "dp") < 0 ? 0 : dm_mesh_rank(m, "dp"); }
DM_API_IMPL int dm_mesh_dp_world_size(const dm_mesh* m) { return m && _dm_mesh_find(m, "dp") < 0 ? 1 : dm_mesh_size(m, "dp"); }
DM_API_IMPL int dm_mesh_tp_rank(const dm_mesh* m) { return m && _dm_mesh_find(m, "tp") < 0 ? 0 : dm_mesh_rank(m, "tp"); }
DM_API_IMPL int dm_mesh_tp_world_size(const dm_mesh* m) { return m && _dm_mesh_find(m, "tp") < 0 ? 1 : dm_mesh_size(m, "tp"); }
DM_API_IMPL dm_collective* dm_mesh_tp_world(dm_mesh* m) { return dm_mesh_group(m, "tp"); }

/* >>strategy  LLaMA-Factory's DistributedStrategy with its exact messages. */
struct dm_strategy {
    dm_collective* world;
    int sizes[DM_DIM_COUNT];
    dm_mesh* model;             /* (mp_replicate, mp_shard) */
    dm_mesh* data;              /* (dp, cp) */
    dm_logger logger;           /* the desc's, else the world's */
    dm_allocator allocator;     /* the desc's, else the world's; frees the strategy itself */
    char last_error[DM_LAST_ERROR_SIZE];
};

DM_API_IMPL const char* dm_dim_name(dm_dim dim) {
    static const char* names[DM_DIM_COUNT] = { "mp_replicate", "mp_shard", "dp", "cp" };
    return ((unsigned)dim < DM_DIM_COUNT) ? names[dim] : "invalid";
}

static bool _dm_strategy_signs(int a, int b, const char* a_name, const char* b_name, char* error, size_t cap) {
    if (a >= 0 && b >= 0) return true;
    snprintf(error, cap, "%s and %s must be >= 0 (0 = default), got %d and %d.", a_name, b_name, a, b);
    return false;
}
/* One pair of the seed: a (default 1 or given) and b (default world / a) multiply to world;
   the sizes are not negative (checked before). */
static bool _dm_strategy_pair(int world, int a_in, int b_in, bool b_default_from_a, const char* a_name,
                              const char* b_name, int* a, int* b, char* error, size_t cap) {
    if (b_default_from_a) { *a = _dm_def(a_in, 1); *b = b_in; }
    else                  { *b = _dm_def(b_in, 1); *a = a_in; }
    if (b_default_from_a && *b == 0) {
        if (world % *a != 0) {
            snprintf(error, cap, "world_size %d is not divisible by %s %d.", world, a_name, *a);
            return false;
        }
        *b = world / *a;
    } else if (!b_default_from_a && *a == 0) {
        if (world % *b != 0) {
            snprintf(error, cap, "world_size %d is not divisible by %s %d.", world, b_name, *b);
            return false;
        }
        *a = world / *b;
    } else if ((long long)*a * *b != world) {
        snprintf(error, cap, "%s * %s must equal to world_size, got %d * %d != %d.", a_name, b_name, *a, *b, world);
        return false;
    }
    return true;
}

DM_API_IMPL dm_status dm_strategy_validate(const dm_strategy_desc* desc, int world_size,
                                           int out_sizes[DM_DIM_COUNT], char* error, size_t error_size) {
    char scratch[DM_LAST_ERROR_SIZE];
    int i;
    if (!error || !error_size) { error = scratch; error_size = sizeof(scratch); }
    error[0] = 0;
    if (!desc || !out_sizes) {
        snprintf(error, error_size, "strategy: %s is NULL", !desc ? "desc" : "out_sizes");
        return DM_ERR_INVALID_ARG;
    }
    if (world_size < 1) {
        snprintf(error, error_size, "strategy: world_size %d must be >= 1", world_size);
        return DM_ERR_INVALID_ARG;
    }
    /* Negative sizes are refused at every world size (the seed does not check them). */
    if (!_dm_strategy_signs(desc->mp_replicate_size, desc->mp_shard_size, "mp_replicate_size",
                            "mp_shard_size", error, error_size) ||
        !_dm_strategy_signs(desc->dp_size, desc->cp_size, "dp_size", "cp_size", error, error_size))
        return DM_ERR_INVALID_ARG;
    if (world_size == 1) {  /* not distributed: every size is 1 (the seed keeps mp_replicate, cp) */
        for (i = 0; i < DM_DIM_COUNT; i++) out_sizes[i] = 1;
        return DM_OK;
    }
    if (!_dm_strategy_pair(world_size, desc->mp_replicate_size, desc->mp_shard_size, true, "mp_replicate_size",
                           "mp_shard_size", &out_sizes[DM_DIM_MP_REPLICATE], &out_sizes[DM_DIM_MP_SHARD],
                           error, error_size) ||
        !_dm_strategy_pair(world_size, desc->dp_size, desc->cp_size, false, "dp_size", "cp_size",
                           &out_sizes[DM_DIM_DP], &out_sizes[DM_DIM_CP], error, error_size))
        return DM_ERR_INVALID_ARG;
    return DM_OK;
}

static dm_status _dm_strategy_mesh(dm_strategy* s, dm_dim a, dm_dim b, dm_mesh** out) {
    _DM_ZERO(dm_mesh_desc, d);
    d.world = s->world;
    d.ndims = 2;
    d.dim_names[0] = dm_dim_name(a);
    d.dim_names[1] = dm_dim_name(b);
    d.dim_sizes[0] = s->sizes[a];
    d.dim_sizes[1] = s->sizes[b];
    d.logger = s->logger;
    d.allocator = s->allocator;
    return dm_mesh_create(&d, out);
}

DM_API_IMPL dm_status dm_strategy_create(const dm_strategy_desc* desc, dm_strategy** out) {
    dm_strategy* s;
    int sizes[DM_DIM_COUNT];
    char err[DM_LAST_ERROR_SIZE];
    const dm_logger* lg;
    dm_collective* w;
    dm_status st;
    if (out) *out = NULL;
    if (!desc) return DM_ERR_INVALID_ARG;           /* no object and no logger to tell */
    w = desc->world;
    if (!w) return _DM_REPORT(&desc->logger, err, sizeof(err), DM_ERR_INVALID_ARG, "strategy: world is NULL");
    /* No strategy exists yet: failures of create are recorded on the world. */
    lg = desc->logger.func ? &desc->logger : &w->logger;
    if (!out) return _DM_REPORT(lg, w->last_error, sizeof(w->last_error), DM_ERR_INVALID_ARG, "strategy: out is NULL");
    if (!_dm_allocator_valid(&desc->allocator))
        return _DM_REPORT(lg, w->last_error, sizeof(w->last_error), DM_ERR_INVALID_ARG,
                          "strategy: allocator needs both alloc_fn and free_fn, or neither");
    st = dm_strategy_validate(desc, w->size, sizes, err, sizeof(err));
    if (st != DM_OK) return _DM_REPORT(lg, w->last_error, sizeof(w->last_error), st, "%s", err);
    s = (dm_strategy*)_dm_calloc(desc->allocator.alloc_fn ? &desc->allocator : &w->allocator, sizeof(dm_strategy));
    if (!s) return _DM_REPORT(lg, w->last_error, sizeof(w->last_error), DM_ERR_OUT_OF_MEMORY, "strategy: out of memory");
    s->world = w;
    s->logger = *lg;
    s->allocator = desc->allocator.alloc_fn ? desc->allocator : w->allocator;
    memcpy(s->sizes, sizes, sizeof(sizes));
    /* A mesh that fails has recorded and logged its message on the world already. */
    st = _dm_strategy_mesh(s, DM_DIM_MP_REPLICATE, DM_DIM_MP_SHARD, &s->model);
    if (st == DM_OK) st = _dm_strategy_mesh(s, DM_DIM_DP, DM_DIM_CP, &s->data);
    if (st != DM_OK) { dm_strategy_destroy(s); return st; }
    *out = s;
    return DM_OK;
}
DM_API_IMPL void dm_strategy_destroy(dm_strategy* s) {
    dm_allocator a;
    if (!s) return;
    dm_mesh_destroy(s->model);
    dm_mesh_destroy(s->data);
    a = s->allocator;
    _dm_free(&a, s);
}
/* The seed's get_device_mesh(dim=None) raises ValueError("dim must be specified."); C's
   dm_dim has no None, so a value outside the enum stands for it in size, rank and group. The
   buffer is written only on failure (see _dm_mesh_fail_dim on the const). */
static bool _dm_strategy_dim_ok(const dm_strategy* s, dm_dim dim) {
    if ((unsigned)dim < DM_DIM_COUNT) return true;
    _DM_REPORT(&s->logger, (char*)s->last_error, sizeof(s->last_error), DM_ERR_INVALID_ARG,
               "dim must be specified.");
    return false;
}
static dm_mesh* _dm_strategy_mesh_of(const dm_strategy* s, dm_dim dim) {
    return (dim == DM_DIM_DP || dim == DM_DIM_CP) ? s->data : s->model;
}
DM_API_IMPL int dm_strategy_size(const dm_strategy* s, dm_dim dim) {
    return (s && _dm_strategy_dim_ok(s, dim)) ? s->sizes[dim] : -1;
}
/* Both meshes hold their two dims, so the mesh lookups below cannot miss. */
DM_API_IMPL int dm_strategy_rank(const dm_strategy* s, dm_dim dim) {
    if (!s || !_dm_strategy_dim_ok(s, dim)) return -1;
    return dm_mesh_rank(_dm_strategy_mesh_of(s, dim), dm_dim_name(dim));
}
DM_API_IMPL dm_collective* dm_strategy_group(dm_strategy* s, dm_dim dim) {
    if (!s || !_dm_strategy_dim_ok(s, dim)) return NULL;
    return dm_mesh_group(_dm_strategy_mesh_of(s, dim), dm_dim_name(dim));
}
DM_API_IMPL dm_mesh* dm_strategy_model_mesh(dm_strategy* s) { return s ? s->model : NULL; }
DM_API_IMPL dm_mesh* dm_strategy_data_mesh(dm_strategy* s) { return s ? s->data : NULL; }
DM_API_IMPL const char* dm_strategy_last_error(const dm_strategy* s) { return s ? s->last_error : "no strategy (NULL)"; }

/* >>init  Without the TCP backend only a world of one can be built from the environment. */
#if !defined(DISTMESH_TCP)
static dm_status _dm_init_checked(const dm_init_desc* desc, dm_collective** out) {
    _DM_ZERO(dm_init_desc, d);
    _DM_ZERO(dm_fake_desc, f);
    dm_env env;
    char err[DM_LAST_ERROR_SIZE];
    dm_status st;
    if (!out) return _DM_REPORT(NULL, err, sizeof(err), DM_ERR_INVALID_ARG, "init: out is NULL");
    *out = NULL;
    if (desc) d = *desc;
    st = dm_env_detect(&env);
    if (st != DM_OK) return _DM_REPORT(&d.logger, err, sizeof(err), st, "%s", env.error);
    _dm_create_rank(env.rank);
    if (env.world_size > 1)
        return _DM_REPORT(&d.logger, err, sizeof(err), DM_ERR_UNSUPPORTED,
                          "init: the environment (%s) asks for %d ranks but this build has no transport "
                          "(define DISTMESH_TCP)", env.source, env.world_size);
    f.timeout_ms = d.timeout_ms;
    f.logger = d.logger;
    f.allocator = d.allocator;
    return dm_fake_create(&f, out);
}
DM_API_IMPL dm_status dm_init(const dm_init_desc* desc, dm_collective** out) {
    _dm_create_begin();
    return _dm_create_end(_dm_init_checked(desc, out), desc && desc->logger.func);
}
#endif

_DM_COLD_END
_DM_WARM_END
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
