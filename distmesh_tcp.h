/* distmesh_tcp.h -- the TCP ring backend of distmesh, on libuv. MIT license at end of file.

   Do not include this file directly: define DISTMESH_TCP (as a -D flag, in every TU) and include
   distmesh.h, which includes this header last. Link libuv (pkg-config libuv).
   Opt-in: define DISTMESH_OPENSSL too (every TU) and link -lcrypto (OpenSSL 1.1 or later) for
   encrypted links between hosts (DISTMESH_ENCRYPT, below); without it they are plain.

   WHAT IT IS
   Gloo-style collectives between processes and hosts over TCP. Ranks meet through a key-value
   store (c10d TCPStore protocol or a shared directory, see distmesh_store.h; the ranks a
   launcher places on one host through one connection, their host's leader's: >>tcp relay; none
   once the group is built), each rank
   listens on an ephemeral port of the chosen interface, publishes "host:port", and each rank
   connects only to the peers its schedules use (the higher rank of a pair connects; both sides
   prove the token by HMAC-SHA256 challenge-response, see >>tcp hello), the others on demand
   (see >>tcp sparse, >>tcp lazy). Algorithms:
       all_reduce      <= 64 KiB: recursive doubling (non-power-of-two worlds fold the extra
                       ranks in and out); larger: ring reduce-scatter + all-gather, chunked and
                       pipelined (Gloo's allreduce_ring_chunked) -- received chunks are reduced
                       while the next ones are in flight; extra memory is one chunk
       all_gather      ring (also straight into all_gather_to_list's buffers)
       reduce_scatter  ring (in place: one extra block of recv_count elements)
       broadcast       pipelined chain from any root, forwarding bytes as they arrive
       barrier         dissemination
       split           all_gather of (color, key, listener addresses), then the members
                       connect to each other directly: no store (>>tcp split)
       shrink          the survivors connect at their recovery listeners, agree on who is
                       gone, keep the shared-memory segment: no store (>>tcp shrink)
   MEAN is SUM followed by dm_divide_local on the reduced block before it is gathered.

   QUICK START (every rank; RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT as torchrun sets them)

       dm_collective* c = NULL;
       dm_tcp_desc d = {0};                     // everything from the environment
       if (dm_tcp_create(&d, &c) != DM_OK) { ... }   // or dm_init(NULL, &c)
       dm_all_reduce(c, NULL, grads, n, DM_FLOAT32, DM_MEAN);
       dm_destroy(c);

   ENVIRONMENT (each declared once, with its type and default, in distmesh.h >>config registry;
   README "Environment variables" is printed from there)
       DISTMESH_STORE            tcp://host:port or file:///dir (else tcp://MASTER_ADDR:MASTER_PORT)
       TORCHELASTIC_USE_AGENT_STORE=True   the store already runs; rank 0 does not host it
       DISTMESH_SOCKET_IFNAME, GLOO_SOCKET_IFNAME   interface: "eth0", "eth" (prefix), "=eth0"
                                 (exact), "^lo,docker" (anything but these prefixes)
       DISTMESH_TOKEN            shared secret: peers without it are refused (DM_ERR_REFUSED);
                                 with it the store serves authenticated distmesh clients only
       DISTMESH_ENCRYPT          auto|0|1: links between hosts encrypted (AES-256-GCM, keys
                                 from the token and each hello); auto: on with a token and
                                 DISTMESH_OPENSSL (>>tcp seal, distmesh_socket.h >>socket aead)
       DISTMESH_STORE_MAX_VALUE, _MAX_CONN, _MAX_TOTAL, _STALL_MS   store server bounds
                                 (see dm_store_desc; docs/design.md "The store")
       DISTMESH_TIMEOUT          seconds; the deadline of every blocking call
       DISTMESH_SOCKETS_PER_PEER sockets to each peer on another host, 1..16 (default 1), the
                                 stream striped over them in 64 KiB stripes (>>tcp more sockets)

   FAILURES
   Every wait has a deadline (base.timeout_ms, dm_set_timeout). A peer's EOF or reset gives
   DM_ERR_PEER_LOST and shuts this rank's connections down so the failure reaches every rank
   quickly; a timeout names the op, its sequence number and the peer waited on. Each collective
   starts with a 32-byte fingerprint (op, dtype, count, root, reduce op, sequence) compared with
   the neighbour's: DM_ERR_MISMATCH with both descriptions. After any communication failure the
   collective is broken and every later call fails at once -- DM_ERR_PEER_LOST after a peer was
   lost, DM_ERR_ABORTED after anything else; destroy it, or go on without the lost ranks with
   dm_shrink (>>tcp shrink). Create and split fail the same way: their waits end by their
   deadline (desc.timeout_ms; a split runs on the parent's dm_set_timeout), a member that dies
   meanwhile gives DM_ERR_PEER_LOST (>>tcp watch), and a failed split breaks the parent. A data listener serves every pending hello at once, each
   connection with its own 5 s, at most 64 at a time (>>tcp accept).
   SIGPIPE is never raised (MSG_NOSIGNAL).

   SECURITY (SECURITY.md): with DISTMESH_TOKEN set, every store and data connection
   proves the token by HMAC-SHA256 over fresh nonces from both sides, so strangers who can reach
   the ports can neither use the store nor join, replay or relay a connection. With the token
   and DISTMESH_OPENSSL, links between hosts are also encrypted and authenticated from their
   hello on (DISTMESH_ENCRYPT, >>tcp seal): a tampered, replayed, reordered or dropped record
   fails the call with DM_ERR_PROTOCOL naming the peer (a cut stream: DM_ERR_PEER_LOST), and
   none of it reaches a buffer. The store's connections are sealed the same way
   (distmesh_store.h >>store seal) under the same setting. Links within a host and unencrypted
   builds are plain after the handshake.

   COMPILE COST  The sections between _DM_COLD_BEGIN and _DM_COLD_END (creates, rendezvous,
   failures) compile as for debugging whatever the includer's -O level: distmesh.h
   >>compile cost; scripts/check_cold.py keeps hot code from calling into them.

   SECTIONS  Each opens with a comment that starts ">>tag" (search for it); in file order:
     the TCP backend's declarations
       >>tcp desc                dm_tcp_desc, dm_tcp_create
       >>tcp launch desc         dm_tcp_launch: the rendezvous a launcher implies
     the TCP backend
       >>tcp implementation      system headers
       >>tcp libc                what glibc hides without _GNU_SOURCE (struct ucred)
       >>tcp shm include         distmesh_shm.h's segment part: the shared segment of a host
                                 (rings, bells, futexes, _dm_shm_seg), the loss watcher
       >>tcp state               constants, the hello's handshake state, the group (_dm_tcp)
       >>tcp little helpers      wire integers, a hash
       >>tcp socket include      distmesh_socket.h: the socket link (distmesh_engine.h >>links), its
                                 striping; socket options, waits on one socket
       >>tcp notices             the first failure, posted to the store and read back
       >>tcp shm setup           the group's segment: made, described, mapped, voted on
       >>tcp addresses           "host:port" and sockaddr, the interface choice
       >>tcp watch               ending create or split when a member dies
       >>tcp hello               the connector's side of the token handshake
       >>tcp accept              the listener's side: handshakes from any wait, accepting
       >>tcp lazy                peers outside P connected when first needed
       >>tcp more sockets        several sockets per peer on another host
       >>tcp seal                links wrapped in encryption from their hello; within a host
                                 unwrapped again once the group is built
       >>tcp store access        how a group reaches the store while it is built
       >>tcp keys                what a group leaves in the store: nothing
       >>tcp lifetime            freeing a group
       >>tcp slots               the vtable's entries for host buffers
       >>tcp cuda                the same for CUDA device buffers (staged)
       >>tcp vtable              the table
       >>tcp setup               the resolved setup a create, split or join builds from
       >>tcp hosts               which ranks share a host (host identity), shared memory
       >>tcp relay               rendezvous through one store connection per host: its leader
       >>tcp sparse              connecting to P, not to the world
       >>tcp arrival             waiting until every rank of the group has arrived
       >>tcp build               listeners, addresses, hosts, links, the engine: a group
       >>tcp hostlist            Slurm's hostlist syntax
       >>tcp launch              a private rendezvous from the launcher's job identity
       >>tcp create              dm_tcp_create
       >>tcp split               dm_split without the store
       >>tcp grow                dm_grow: the members' side
       >>tcp join                dm_grow: the newcomer's side
       >>tcp shrink              dm_shrink without the store, interrupt
       >>tcp init                dm_init with the TCP backend

   PRIVATE NAMES  _dm_ / _DM_ for every private function, type and macro, then the part:
       _dm_store_ _dm_st_ ...    the store's (distmesh_store.h, PRIVATE NAMES)
       _dm_tcp_ _DM_TCP_         the TCP backend (_dm_tcp_eng_: its hooks in the core's engine)
       _dm_sock_                 the socket link (distmesh_socket.h); _dm_shm_ _dm_futex_
                                 _dm_membarrier_ the shared segment, its bells and fences
                                 (distmesh_shm.h)
       _dm_hl_                   Slurm hostlists
       _dm_eng_ _dm_coll_ _dm_peers_ ...   the core's (distmesh.h, PRIVATE NAMES)
*/
#ifndef DISTMESH_H
#error "include distmesh.h with DISTMESH_TCP defined instead"
#endif

#ifndef DISTMESH_TCP_H
#define DISTMESH_TCP_H

#ifdef __cplusplus
extern "C" {
#endif

/* >>tcp desc  Zero means default for every field. */
typedef struct dm_tcp_desc {
    int rank;                   /* with world_size 0: from dm_env_detect; else required, < world_size */
    int world_size;             /* 0 -> rank and world size from dm_env_detect; set, the two win over
                                   the launcher's variables (a partial set such as WORLD_SIZE
                                   without RANK is then not an error) */
    struct dm_store* store;     /* borrowed, used during create and split; 0 -> store_url */
    const char* store_url;      /* 0 -> DISTMESH_STORE, else tcp://MASTER_ADDR:MASTER_PORT (rank 0
                                   hosts a tcp:// store unless TORCHELASTIC_USE_AGENT_STORE=True) */
    const char* prefix;         /* 0 -> "distmesh/": key prefix of this group in the store */
    const char* ifname;         /* 0 -> DISTMESH_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, else the
                                   interface that routes to the store host / MASTER_ADDR */
    const char* token;          /* 0 -> DISTMESH_TOKEN, else none */
    size_t chunk_bytes;         /* 0 -> 512 KiB: pipelining unit of the ring algorithms */
    const char* transport;      /* 0 -> DISTMESH_TRANSPORT, else "auto": "auto" shared memory between
                                   ranks on one host and sockets across hosts, "shm" the same but a
                                   failure to set up shared memory fails the create, "tcp" sockets
                                   only. Every rank must be given the same. */
    int timeout_ms;             /* 0 -> DISTMESH_TIMEOUT or DM_DEFAULT_TIMEOUT_MS; < 0 -> forever */
    dm_logger logger;           /* 0 -> the default logger (distmesh.h dm_logger) */
    dm_allocator allocator;     /* 0 -> malloc/free (libuv allocates on its own) */
    int sockets_per_peer;       /* 0 -> DISTMESH_SOCKETS_PER_PEER, else 1: sockets to each peer on
                                   another host, 1..16 (same-host peers: shared memory, or one
                                   socket). Messages are striped over them in 64 KiB stripes, for
                                   networks that cap each flow (docs/design.md "Several sockets per peer").
                                   Every rank must be given the same. */
    int join;                   /* 0 -> DISTMESH_JOIN (1: join), else create: nonzero joins the
                                   running group under prefix through the store as a newcomer of
                                   the members' next dm_grow, in arrival order (rank and
                                   world_size are ignored and assigned; transport, sockets and
                                   chunk size are the group's). docs/failures.md "Grow back". */
    int encrypt;                /* 0 -> DISTMESH_ENCRYPT, else auto: links between hosts carry
                                   authenticated encryption (AES-256-GCM, keys from the token and
                                   each connection's hello) when a token is set and the backend
                                   was built with DISTMESH_OPENSSL; 1 on (needs both: else
                                   DM_ERR_INVALID_ARG without a token, DM_ERR_UNSUPPORTED without
                                   DISTMESH_OPENSSL), -1 off. Links within one host (shared
                                   memory, sockets) never are. The store the backend makes
                                   follows it (dm_store_desc.encrypt). Every rank must be given
                                   the same. SECURITY.md "Encrypted links". */
    const char* site;           /* 0 -> DISTMESH_SITE, else one site: this rank's site, a name of at
                                   most 63 bytes; hosts that give the same name share a site, and
                                   a large all_reduce crosses the (slower) links between sites
                                   with each byte once ("three_level", docs/design.md "Sites").
                                   Every rank of a host must give the same. */
} dm_tcp_desc;

/* Collective call over all world_size ranks. Fails with *out == NULL. */
DM_API dm_status dm_tcp_create(const dm_tcp_desc* desc, dm_collective** out);

/* >>tcp launch desc  The rendezvous a launcher implies when no store is named (no desc.store /
   store_url, no DISTMESH_STORE, no MASTER_ADDR + MASTER_PORT):
     mpirun (OpenMPI), every rank on one host (OMPI_COMM_WORLD_LOCAL_SIZE == _SIZE):
         file store keyed by the job id (OMPI_MCA_ess_base_jobid, else PMIX_NAMESPACE) in
         mpirun's session directory for the job (PMIX_SERVER_TMPDIR, else
         OMPI_MCA_orte_jobfam_session_dir: made fresh per launch, removed by mpirun at the end;
         used when it is a directory of this user that no one else may enter), else in the
         private directory
     srun (Slurm), one node (SLURM_STEP_NUM_NODES / SLURM_NNODES 1): file store keyed by
         SLURM_JOB_ID.SLURM_STEP_ID
     srun, several nodes: tcp store on the first node of SLURM_STEP_NODELIST (else
         SLURM_JOB_NODELIST), port MASTER_PORT if set, else 15000 + (16 * SLURM_JOB_ID +
         SLURM_STEP_ID % 16) % 20000; the task with SLURM_NODEID 0 and SLURM_LOCALID 0 hosts it
     anything else (mpirun over several hosts, torchrun-style variables without MASTER_*):
         DM_ERR_ENV, and error names exactly what to set for the launcher detected.
   The private directory is $XDG_RUNTIME_DIR/distmesh, else $TMPDIR (or /tmp)/distmesh-<uid>,
   mode 0700 and owned by this user (anything else is refused); one subdirectory per job, left
   in place (a few bytes per rank). A store that outlives its job must not serve a later job of
   another world size under the same prefix: the generation counter (>>tcp build) would start
   that job off a multiple of its size and split its ranks between two generations, which then
   wait for each other until the deadline. mpirun's session directory is fresh per launch, a
   Slurm job and step id never repeat; a DISTMESH_STORE file store reused across jobs needs a
   fresh directory or prefix per job. */
typedef struct dm_tcp_launch {
    char url[512];              /* the store url: file:///... or tcp://host:port */
    bool is_server;             /* tcp: this process hosts the store */
    const char* launcher;       /* "openmpi", "slurm", "torchrun", "pmi", "distmesh", "default" */
    char error[DM_LAST_ERROR_SIZE]; /* on failure: what to set */
} dm_tcp_launch;
DM_API dm_status dm_tcp_launch_detect(dm_tcp_launch* out);

/* Slurm hostlist ("node[01-04,07],gpu-a[1-2]-x"): returns how many hosts it names (-1 when
   malformed or above 1e6 hosts) and, when 0 <= index < that count and out is not NULL, writes
   host `index` to out (truncated to cap). */
DM_API long dm_slurm_hostlist(const char* list, long index, char* out, size_t cap);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DISTMESH_TCP_H */

#if defined(DISTMESH_IMPLEMENTATION) && !defined(DISTMESH_TCP_IMPL_INCLUDED)
#define DISTMESH_TCP_IMPL_INCLUDED
/* >>tcp implementation  The collective backend; it sees the whole distmesh.h core. */
#include <uv.h>
#include <sys/types.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/uio.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/eventfd.h>
#include <linux/futex.h>
#include <limits.h>
#include <stdio.h>
#include <unistd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <poll.h>
#include <fcntl.h>
/* <openssl/evp.h> with DISTMESH_OPENSSL: distmesh.h includes it (>>sealed records) */

_DM_WARM_BEGIN   /* distmesh.h >>compile cost */
/* >>tcp libc  The backend's share of distmesh.h >>libc: what glibc declares only under
   _GNU_SOURCE, under a _dm_ name (accept4: distmesh_store.h's includes; the shared segment's
   calls: distmesh_shm.h >>shm libc). */
/* SO_PEERCRED's answer: Linux's struct ucred, which glibc declares only under _GNU_SOURCE */
typedef struct _dm_ucred { pid_t pid; uid_t uid; gid_t gid; } _dm_ucred;

/* >>tcp shm include  The shared-memory transport's segment and loss watcher (distmesh_shm.h:
   >>shm segment, >>shm loss), here: before the group (>>tcp state), which holds its segment
   (_dm_shm_seg). They work on the core's types alone; this backend's use of them is in
   >>tcp shm setup. The memory rings it lays in the segment are the engine's. */
#include "distmesh_shm.h"

/* >>tcp state  The backend's constants, the hello's handshake state and the group (_dm_tcp). */
#define _DM_TCP_HELLO_MAGIC 0x48544d44u   /* "DMTH" little-endian: connection hello */
#define _DM_TCP_ACK_MAGIC   0x41544d44u   /* "DMTA": hello answer */
#define _DM_TCP_CHAL_MAGIC  0x43544d44u   /* "DMTC": the acceptor's challenge */
#define _DM_TCP_VERSION     2u            /* 2: challenge-response hello */
#define _DM_TCP_VERSION_SEALED 3u         /* the same from a group that encrypts (>>tcp seal) */

/* What the desc asked for (t->transport): the same-host ranks' links (>>tcp shm setup). */
enum { _DM_TCP_AUTO = 0, _DM_TCP_SHM, _DM_TCP_SOCKETS };
enum { _DM_TCP_ACK_OK = 0, _DM_TCP_ACK_TOKEN = 1, _DM_TCP_ACK_GROUP = 2, _DM_TCP_ACK_RANK = 3, _DM_TCP_ACK_SEAL = 4 };

/* One handshake on the listener, the acceptor's side (see >>tcp hello). */
#define _DM_TCP_HELLO_SIZE 56
#define _DM_TCP_CHAL_SIZE 72
enum { _DM_TCP_HS_HELLO = 0, _DM_TCP_HS_CHAL, _DM_TCP_HS_PROOF, _DM_TCP_HS_ACK, _DM_TCP_HS_DONE };
#define _DM_TCP_HS_MORE (-2)        /* would block: poll for _dm_tcp_hs_events, then step again */
typedef struct _dm_tcp_hs {
    int fd, state, peer;            /* peer: the rank the hello claims, -1 before */
    uint32_t status;                /* the answer decided so far (_DM_TCP_ACK_*) */
    size_t off;                     /* bytes of the current message moved */
    int64_t deadline;               /* this connection's own */
    bool claimed;                   /* the listener holds t->claims[peer] for it (proof verified) */
    unsigned char hello[_DM_TCP_HELLO_SIZE], chal[_DM_TCP_CHAL_SIZE], proof[32], ack[8];
} _dm_tcp_hs;
/* Handshakes in progress at once on one listener, and each one's time to finish. */
#define _DM_TCP_HS_MAX 64
#define _DM_TCP_HS_MS 5000

typedef struct _dm_tcp {
    dm_collective base;
    _dm_core core;
    struct dm_store* store;     /* used by create and split; owned when own_store */
    bool own_store;
    char prefix[512];           /* this group's key prefix, generation included */
    char user_prefix[480];      /* the prefix as given (split builds on it) */
    char ifname[128];           /* the interface spec as resolved ("" = by route) */
    char token[_DM_ST_TOKEN_MAX + 1]; /* "" = none */
    char site[64];              /* desc.site / DISTMESH_SITE, "" = one site (>>tcp hosts) */
    int* fds;                   /* socket k to rank r at [k * size + r], -1 for none (self); k = 0:
                                   every peer (the side channel of shm links) */
    int* claims;                /* the row of fds the handshakes fill now (>>tcp hello) */
    int hs_index;               /* the socket index k those handshakes are for (in their MACs) */
    unsigned char* hs_nonces;   /* per rank 65 bytes: the nonces of its socket 0's hello (connector's,
                                   acceptor's) and 1 when they are there; keys its encryption */
    bool encrypt;               /* links to other hosts are sealed (>>tcp seal) */
    bool hosts_final;           /* built: links within the host are no longer sealed (>>tcp seal) */
    int nsock;                  /* sockets per peer on another host */
    int* host_of;               /* per rank: the lowest rank on its host (>>tcp hosts) */
    char (*addrs)[64];          /* "host:port" per rank, for messages */
    struct sockaddr_storage self_sa; /* where this rank listened (split listens there again) */
    _dm_eng lk;                 /* links, scratch, broken state: the core's engine (distmesh.h) */
    int transport;              /* _DM_TCP_AUTO, _SHM or _SOCKETS: what the desc asked for */
    _dm_shm_seg seg;            /* the same-host segment (distmesh_shm.h >>shm segment; base NULL:
                                   none) and its watcher (>>shm loss) */
    int shm_vote;               /* the group's: 2 when every host with 2+ ranks has a segment */
    int shm_slot;               /* which of the segment's abort words is this group's */
    char transport_name[16];
    /* only while create / split builds this group (see >>tcp watch) */
    struct dm_store* rdv;       /* a clone of store whose requests end by rdv_deadline */
    int64_t rdv_deadline;
    const struct _dm_tcp* parent; /* split: the group being split */
    const int* members;         /* split: the parent rank of each rank of this group (grow: -1
                                   for a newcomer) */
    /* the listener, open for the group's life: peers outside P connect on demand (>>tcp lazy) */
    int lfd;
    /* the recovery listener, never served by collectives and never closed by a break, only by
       destroy: a refused connection means the rank is gone (>>tcp shrink) */
    int rfd;
    char (*raddrs)[64];         /* every rank's recovery listener */
    bool serving;               /* waits answer connectors (lfd and hs are live) */
    bool built;                 /* create / split is over: waits no longer watch (>>tcp watch) */
    bool addrs_known;           /* split: the addresses came over the parent, not the store */
    bool counted;               /* arrivals counted in the store (a tcp store, >>tcp arrival) */
    bool refusal_final;         /* shrink: the peers' recovery listeners never come back once
                                   closed, so one refusal means the rank is gone */
    uint64_t group;             /* the hello's group id */
    int64_t lfd_rest;           /* after accept ran out of descriptors: leave the listener until then */
    const bool* expect;         /* the higher ranks _dm_tcp_accept_peers waits for; NULL: all */
    bool* want;                 /* create: the ring, then P and the host (what expect points at) */
    int nhs;
    _dm_tcp_hs hs[_DM_TCP_HS_MAX]; /* handshakes in progress on lfd */
    struct _dm_tcp_relay* relay; /* while built: the host's rendezvous through its leader (>>tcp relay) */
#if defined(DISTMESH_CUDA)
    void* cuda_pinned;          /* pinned staging segments for device buffers (see >>tcp cuda) */
    size_t cuda_pinned_bytes;
    void* cuda_stream;          /* cudaStream_t of the staging copies */
    void* cuda_events[3];       /* cudaEvent_t: segment k's device-to-host copy is done */
#endif
} _dm_tcp;
#if defined(DISTMESH_CUDA)
static void _dm_tcp_cuda_release(_dm_tcp* t);
#endif

/* >>tcp little helpers  Little-endian integers on the wire: the core's (>>fingerprint). */
#define _dm_tcp_put32 _dm_put32
#define _dm_tcp_get32 _dm_get32
#define _dm_tcp_put64 _dm_put64
#define _dm_tcp_get64 _dm_get64
/* FNV-1a with a splitmix64 finish, seeded: the token digest and the group id. */
_DM_PRIVATE uint64_t _dm_tcp_hash(uint64_t seed, const char* a, const char* b) {
    uint64_t h = 0xcbf29ce484222325ull ^ (seed * 0x9e3779b97f4a7c15ull);
    const char* s;
    int k;
    for (k = 0; k < 2; k++) {
        for (s = k ? b : a; s && *s; s++) { h ^= (unsigned char)*s; h *= 0x100000001b3ull; }
        h ^= 0xff; h *= 0x100000001b3ull;
    }
    h ^= h >> 30; h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27; h *= 0x94d049bb133111ebull;
    return h ^ (h >> 31);
}

/* >>tcp socket include  The socket transport (distmesh_socket.h: >>socket link,
   >>socket options): each peer's socket is a link (distmesh.h, >>links). */
#include "distmesh_socket.h"

_DM_COLD_BEGIN
/* >>tcp notices  The first failure a rank sees itself goes into the store as "<prefix>abort"
   (compare-set: the first poster wins), value: status i32, rank i32, message; a rank whose
   peer hangs up reads it and reports that cause instead of "EOF". One bounded round trip each
   (the store may be the thing that died: a connection it refuses is not tried again). A failed
   group leaves this one key behind. */
#define _DM_TCP_NOTICE_MS 1000
/* The store set up for one notice round trip, and back (the previous timeout returned, then
   passed back in). */
static int _dm_tcp_notice_store(dm_store* s, int timeout_ms, bool one_try) {
    int saved = s->timeout_ms;
    s->timeout_ms = timeout_ms;
    s->one_try = one_try;
    return saved;
}
static void _dm_tcp_notice_key(const _dm_tcp* t, char* key, size_t cap) { snprintf(key, cap, "%sabort", t->prefix); }
static void _dm_tcp_notice_post(_dm_eng* lk, dm_status st, const char* msg) {
    _dm_tcp* t = (_dm_tcp*)lk->c;
    unsigned char v[8 + DM_LAST_ERROR_SIZE];
    char key[600];
    size_t n = strnlen(msg, DM_LAST_ERROR_SIZE - 1), held_n = 0;
    void* held = NULL;
    int saved;
    if (!t->store) return;
    _dm_tcp_notice_key(t, key, sizeof(key));
    _dm_tcp_put32(v, (uint32_t)(int32_t)st);
    _dm_tcp_put32(v + 4, (uint32_t)t->base.rank);
    memcpy(v + 8, msg, n);
    saved = _dm_tcp_notice_store(t->store, _DM_TCP_NOTICE_MS, true);
    if (dm_store_compare_set(t->store, key, "", 0, v, 8 + n, &held, &held_n) == DM_OK) dm_store_free(t->store, held);
    _dm_tcp_notice_store(t->store, saved, false);
}
static dm_status _dm_tcp_notice_read(_dm_eng* lk, int* rank, char* msg, size_t cap) {
    _dm_tcp* t = (_dm_tcp*)lk->c;
    char key[600];
    const char* k = key;
    bool there = false;
    void* v = NULL;
    size_t n = 0;
    int saved;
    dm_status st = DM_OK;
    if (!t->store) return DM_OK;
    _dm_tcp_notice_key(t, key, sizeof(key));
    saved = _dm_tcp_notice_store(t->store, _DM_TCP_NOTICE_MS, true);
    if (dm_store_check(t->store, &k, 1, &there) == DM_OK && there && dm_store_get(t->store, key, &v, &n) == DM_OK) {
        if (n >= 8) {
            int32_t code = (int32_t)_dm_tcp_get32((const unsigned char*)v);
            size_t m = n - 8 < cap - 1 ? n - 8 : cap - 1;
            if (code < 0 && code > -100) {    /* a dm_status, not garbage */
                st = (dm_status)code;
                *rank = (int)_dm_tcp_get32((const unsigned char*)v + 4);
                memcpy(msg, (const unsigned char*)v + 8, m);
                msg[m] = 0;
            }
        }
        dm_store_free(t->store, v);
    }
    _dm_tcp_notice_store(t->store, saved, false);
    return st;
}

/* >>tcp shm setup  The group's use of the shared segment (distmesh_shm.h >>shm segment): the host's
   lowest rank makes it, tells the others over their sockets, and the whole group votes over the
   engine whether every rank could and wanted it. */
/* Sets up shared memory among this rank's same-host group members (local[0..L), this rank at
   index me), then every rank of the group votes (MIN of 2 shm ready, 1 asked for sockets, 0
   failed), so all agree: shm links only where every rank could and wanted; with auto a
   failure leaves every rank on sockets (and says so), with shm it fails the create. */
static dm_status _dm_tcp_shm_setup(_dm_tcp* t, const int* local, int L, int me) {
    _dm_fp fp;
    _dm_shm_msg m;
    dm_status st = DM_OK;
    int32_t vote = t->transport == _DM_TCP_SOCKETS ? 1 : 2, votes[3];
    int fd = -1, i;
    char why[DM_LAST_ERROR_SIZE] = "";
    _dm_fp_make(&fp, &t->base, _DM_K_SETUP, -1, -1, 0, sizeof(m));
    memset(&m, 0, sizeof(m));
    if (L >= 2 && me == 0) {
        unsigned char nonce[16];        /* each member checks it in the header it maps */
        if (vote == 2) _dm_st_random(nonce, sizeof(nonce));
        if (vote == 2 && _dm_shm_create(&t->seg, &t->base, L, nonce, &fd) != DM_OK) {
            vote = 0;
            _dm_copy_name(why, sizeof(why), t->base.last_error);
        } else if (vote == 2) {
            _dm_shm_describe(&t->seg, fd, &m);
        }
        for (i = 1; i < L && st == DM_OK; i++)     /* size 0: no segment, the vote says why */
            st = _dm_eng_sendrecv(&t->lk, "setup", &fp, local[i], &m, sizeof(m), -1, NULL, 0);
    } else if (L >= 2) {
        st = _dm_eng_sendrecv(&t->lk, "setup", &fp, -1, NULL, 0, local[0], &m, sizeof(m));
        if (st == DM_OK && vote == 2 && _dm_get64(m.size) != 0 && _dm_shm_attach(&t->seg, &t->base, &m, L) != DM_OK) {
            vote = 0;
            _dm_copy_name(why, sizeof(why), t->base.last_error);
        }
    }
    /* the leader keeps its fd open until every member has mapped: the vote comes after; with
       it, whether every rank registered for the bells' asymmetric barrier. Only with a core per
       rank: with more ranks than cores they sleep often, and each sleep's barrier interrupts
       the other cores (256 ranks on 8 simulated hosts, 2 cores: 8 B all-reduce 7.4 ms with
       fences, 17 ms with the barrier). A lone rank rings nobody. */
    votes[0] = vote;
    votes[1] = L < 2 || (_dm_eng_core_per_rank(L) && _dm_membarrier_register()) ? 1 : 0;
    votes[2] = _dm_eng_core_per_rank(L) ? 1 : 0;   /* single copy pays only with a core each */
    if (st == DM_OK) st = _dm_coll_all_reduce(&t->base, votes, votes, 3, DM_INT32, DM_MIN);
    if (fd >= 0) close(fd);
    if (st != DM_OK) return st;
    vote = votes[0];
    t->shm_vote = vote;
    if (vote == 2 && L >= 2) {
        for (i = 0; i < L; i++)         /* the side channels: the setup's last bytes were the vote */
            if (i != me && _dm_sock_pending(t->lk.links[local[i]]))
                return _DM_FAIL(&t->base, DM_ERR_INTERNAL, "tcp: shm: rank %d sent more than the setup", local[i]);
        st = _dm_shm_links(&t->seg, &t->lk, local, L, me, t->fds, t->addrs,
                           votes[1] ? &_dm_futex_bell_light : &_dm_futex_bell, votes[2] != 0);
        if (st == DM_OK) _dm_shm_watch_start(&t->seg, &t->lk);
        return st;
    }
    _dm_shm_unmap(&t->seg);
    if (t->transport == _DM_TCP_SHM && vote < 2)
        return _DM_FAIL(&t->base, DM_ERR_UNSUPPORTED, "tcp: DISTMESH_TRANSPORT=shm, but %s", vote == 1 ?
                        "another rank asked for tcp (every rank must be given the same transport)" : why[0] ? why :
                        "shared memory could not be set up on another rank (see its log)");
    if (vote == 0)
        _DM_LOG(&t->base.logger, DM_LOG_WARN, "tcp: shared memory unavailable (%s); same-host ranks use sockets",
                why[0] ? why : "on another rank");
    return DM_OK;
}

/* >>tcp addresses  "host:port" / "[v6]:port" <-> sockaddr, interface choice (uv does the
   parsing, printing and interface listing). */
static bool _dm_tcp_parse_addr(const char* s, struct sockaddr_storage* out) {
    char host[128];
    const char* colon = strrchr(s, ':');
    size_t n;
    int port;
    if (!colon) return false;
    port = atoi(colon + 1);
    if (port <= 0 || port > 65535) return false;
    if (s[0] == '[') {
        n = (size_t)(colon - s);
        if (n < 3 || s[n - 1] != ']' || n - 2 >= sizeof(host)) return false;
        memcpy(host, s + 1, n - 2); host[n - 2] = 0;
        return uv_ip6_addr(host, port, (struct sockaddr_in6*)out) == 0;
    }
    n = (size_t)(colon - s);
    if (n >= sizeof(host)) return false;
    memcpy(host, s, n); host[n] = 0;
    return uv_ip4_addr(host, port, (struct sockaddr_in*)out) == 0;
}
static void _dm_tcp_format_addr(const struct sockaddr* sa, char* out, size_t cap) {
    char host[INET6_ADDRSTRLEN];
    if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6* s6 = (const struct sockaddr_in6*)(const void*)sa;
        uv_ip6_name(s6, host, sizeof(host));
        snprintf(out, cap, "[%s]:%d", host, ntohs(s6->sin6_port));
    } else {
        const struct sockaddr_in* s4 = (const struct sockaddr_in*)(const void*)sa;
        uv_ip4_name(s4, host, sizeof(host));
        snprintf(out, cap, "%s:%d", host, ntohs(s4->sin_port));
    }
}

/* NCCL-style interface spec: "a,b" prefixes, "=a,b" exact names, leading '^' excludes. */
static bool _dm_tcp_if_match(const char* spec, const char* name) {
    bool exclude = false, exact = false, hit = false;
    const char* p;
    if (*spec == '^') { exclude = true; spec++; }
    if (*spec == '=') { exact = true; spec++; }
    for (p = spec; *p && !hit;) {
        const char* e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n > 0) hit = exact ? (strlen(name) == n && strncmp(name, p, n) == 0) : strncmp(name, p, n) == 0;
        p += n + (e ? 1 : 0);
    }
    return exclude ? !hit : hit;
}

/* The local address to listen on: an interface matching spec (IPv4 before IPv6, link-local v6
   skipped), or else the source address the kernel would use to reach route_host. */
static dm_status _dm_tcp_pick_addr(_dm_tcp* t, const char* spec, const char* route_host,
                                   struct sockaddr_storage* out) {
    uv_interface_address_t* ifs = NULL;
    int n = 0, i, pass, rc;
    memset(out, 0, sizeof(*out));
    if (spec && *spec) {
        rc = uv_interface_addresses(&ifs, &n);
        if (rc != 0)
            return _DM_FAIL(&t->base, DM_ERR_NETWORK, "tcp: cannot list interfaces (%s)", uv_strerror(rc));
        for (pass = 0; pass < 2; pass++)
            for (i = 0; i < n; i++) {
                int fam = ifs[i].address.address4.sin_family;
                if (!_dm_tcp_if_match(spec, ifs[i].name)) continue;
                if (pass == 0 && fam == AF_INET) {
                    memcpy(out, &ifs[i].address.address4, sizeof(struct sockaddr_in));
                    uv_free_interface_addresses(ifs, n);
                    return DM_OK;
                }
                if (pass == 1 && fam == AF_INET6 && !IN6_IS_ADDR_LINKLOCAL(&ifs[i].address.address6.sin6_addr)) {
                    memcpy(out, &ifs[i].address.address6, sizeof(struct sockaddr_in6));
                    uv_free_interface_addresses(ifs, n);
                    return DM_OK;
                }
            }
        uv_free_interface_addresses(ifs, n);
        return _DM_FAIL(&t->base, DM_ERR_NETWORK, "tcp: no interface with an address matches \"%s\"", spec);
    }
    if (route_host && *route_host) {
        uv_loop_t loop;
        uv_getaddrinfo_t req;
        struct addrinfo hints;
        memset(&hints, 0, sizeof(hints));
        hints.ai_socktype = SOCK_DGRAM;
        if (uv_loop_init(&loop) == 0) {
            rc = uv_getaddrinfo(&loop, &req, NULL, route_host, "9", &hints);
            if (rc == 0 && req.addrinfo) {
                int fd = socket(req.addrinfo->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
                socklen_t len = sizeof(*out);
                bool ok = fd >= 0 && connect(fd, req.addrinfo->ai_addr, req.addrinfo->ai_addrlen) == 0 &&
                          getsockname(fd, (struct sockaddr*)out, &len) == 0;
                if (fd >= 0) close(fd);
                uv_freeaddrinfo(req.addrinfo);
                uv_loop_close(&loop);
                if (ok) return DM_OK;
            } else {
                uv_loop_close(&loop);
            }
        }
        _DM_LOG(&t->base.logger, DM_LOG_WARN, "tcp: no route to %s; using the first interface", route_host);
    }
    /* nothing to go by: the first non-loopback IPv4 address, else loopback */
    rc = uv_interface_addresses(&ifs, &n);
    for (i = 0; rc == 0 && i < n; i++)
        if (!ifs[i].is_internal && ifs[i].address.address4.sin_family == AF_INET) {
            memcpy(out, &ifs[i].address.address4, sizeof(struct sockaddr_in));
            uv_free_interface_addresses(ifs, n);
            return DM_OK;
        }
    if (rc == 0) uv_free_interface_addresses(ifs, n);
    uv_ip4_addr("127.0.0.1", 0, (struct sockaddr_in*)out);
    return DM_OK;
}

/* >>tcp watch  While create or split waits (for addresses, connections, hellos, acks), the end
   of a connection it already has means a peer is gone: this group's own connections made so
   far and, in split, the parent's connection to every member of the new group (the parent's
   connections to ranks of other colors are not watched: those may finish and destroy the
   parent). Only the end of stream is asked for (POLLRDHUP), never data: a peer that is done
   may already send the first collective's bytes. A member cannot close a watched connection
   by finishing: its own setup ends with a collective of the new group, which needs this rank.
   So an end is a death or a failed setup, and the rendezvous fails at once with
   DM_ERR_PEER_LOST naming the rank, instead of waiting for its deadline. */
#define _DM_TCP_WATCH_END (POLLHUP | POLLERR | _DM_POLLRDHUP)
/* Fills p (room for 2 x size) with the watched connections; returns how many. */
static int _dm_tcp_watch_fill(const _dm_tcp* t, struct pollfd* p) {
    int n = 0, j;
    if (!t->fds || t->built) return 0;      /* a built group's peers may leave when done */
    for (j = 0; j < t->base.size; j++) {
        int fd = t->fds[j];
        if (j == t->base.rank || fd < 0) continue;
        p[n].fd = fd; p[n].events = _DM_POLLRDHUP; p[n].revents = 0; n++;
    }
    if (t->parent && t->members)
        for (j = 0; j < t->base.size; j++) {
            int fd = j == t->base.rank || t->members[j] < 0 ? -1 : t->parent->fds[t->members[j]];
            if (fd < 0) continue;
            p[n].fd = fd; p[n].events = _DM_POLLRDHUP; p[n].revents = 0; n++;
        }
    return n;
}
/* DM_ERR_PEER_LOST naming the rank if one of p[0..n) (filled above, then polled) ended. */
static dm_status _dm_tcp_watch_check(_dm_tcp* t, const struct pollfd* p, int n) {
    int k, j;
    for (k = 0; k < n; k++) {
        if (!(p[k].revents & _DM_TCP_WATCH_END)) continue;
        for (j = 0; j < t->base.size; j++)
            if (j != t->base.rank && t->fds[j] == p[k].fd)
                return _DM_FAIL(&t->base, DM_ERR_PEER_LOST, "tcp: setup: rank %d (%s) closed its connection "
                                "before the group was built (it died, or its setup failed: see its log)", j,
                                t->addrs[j]);
        for (j = 0; t->parent && t->members && j < t->base.size; j++)
            if (j != t->base.rank && t->members[j] >= 0 && t->parent->fds[t->members[j]] == p[k].fd)
                return _DM_FAIL(&t->base, DM_ERR_PEER_LOST, "tcp: split: rank %d of the parent group (%s), "
                                "rank %d of the new one, is gone: its parent connection closed during the "
                                "split (it died, or its split failed: see its log)", t->members[j],
                                t->parent->addrs[t->members[j]], j);
    }
    return DM_OK;
}
/* Checks the watched connections now, without waiting. */
static dm_status _dm_tcp_watch_now(_dm_tcp* t) {
    struct pollfd small[16];
    struct pollfd* p = small;
    int n;
    dm_status st;
    if (2 * t->base.size > 16) {
        p = (struct pollfd*)_dm_malloc(&t->base.allocator, sizeof(struct pollfd) * 2 * (size_t)t->base.size);
        if (!p) return _DM_FAIL(&t->base, DM_ERR_OUT_OF_MEMORY, "tcp: out of memory");
    }
    n = _dm_tcp_watch_fill(t, p);
    st = n > 0 && poll(p, (nfds_t)n, 0) > 0 ? _dm_tcp_watch_check(t, p, n) : DM_OK;
    if (p != small) _dm_free(&t->base.allocator, p);
    return st;
}
static int _dm_tcp_serve(_dm_tcp* t, int64_t deadline);
static int _dm_tcp_serve_fill(const _dm_tcp* t, struct pollfd* p, int cap, int64_t* wake);
/* _dm_tcp_wait_fd that also watches (t may be NULL: nothing watched) and, while the group
   serves, answers connectors meanwhile (so two ranks that connect to each other's listeners
   never wait on each other): 1 ready, 0 timeout, -1 error, -2 a watched peer is gone
   (DM_ERR_PEER_LOST is recorded on t). */
static int _dm_tcp_wait_fd_w(_dm_tcp* t, int fd, short events, int64_t deadline) {
    struct pollfd small[17];
    struct pollfd* p = small;
    size_t cap = 2 * (size_t)(t ? t->base.size : 0) + 2 + _DM_TCP_HS_MAX;
    int n = 0, ns = 0, rc = 0;
    if (!t || !t->fds) return _dm_tcp_wait_fd(fd, events, deadline);
    if (cap > 17) {
        p = (struct pollfd*)_dm_malloc(&t->base.allocator, sizeof(struct pollfd) * cap);
        if (!p) return _dm_tcp_wait_fd(fd, events, deadline);
    }
    for (;;) {
        int64_t left = deadline - _dm_now_ms();
        if (left <= 0) { rc = 0; break; }
        p[0].fd = fd; p[0].events = events; p[0].revents = 0;
        ns = t->serving ? _dm_tcp_serve_fill(t, p + 1, 1 + _DM_TCP_HS_MAX, NULL) : 0;
        n = _dm_tcp_watch_fill(t, p + 1 + ns);
        rc = poll(p, (nfds_t)(n + ns) + 1, left > 1000 ? 1000 : (int)left);
        if (rc < 0 && errno != EINTR) { rc = -1; break; }
        if (t->serving) _dm_tcp_serve(t, INT64_MAX);
        if (rc <= 0) continue;
        if (p[0].revents) { rc = 1; break; }       /* what was waited for first (an ack, then EOF) */
        if (_dm_tcp_watch_check(t, p + 1 + ns, n) != DM_OK) { rc = -2; break; }
    }
    if (p != small) _dm_free(&t->base.allocator, p);
    return rc;
}
/* Exact read (out false) or write on a nonblocking fd with a deadline, watching through t
   when given: 1 ok, 0 timeout, -1 EOF or error (errno; 0 for EOF), -2 a watched peer is gone. */
static int _dm_tcp_io_full(_dm_tcp* t, int fd, void* buf, size_t n, bool out, int64_t deadline) {
    size_t done = 0;
    while (done < n) {
        ssize_t k = out ? send(fd, (const char*)buf + done, n - done, MSG_DONTWAIT | MSG_NOSIGNAL)
                        : recv(fd, (char*)buf + done, n - done, MSG_DONTWAIT);
        if (k > 0) { done += (size_t)k; continue; }
        if (k == 0 && !out) { errno = 0; return -1; }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return -1;
        k = _dm_tcp_wait_fd_w(t, fd, out ? POLLOUT : POLLIN, deadline);
        if (k != 1) return (int)k;
    }
    return 1;
}
/* The same without watching: 1 ok, 0 timeout, -1 EOF or error (errno; 0 for EOF). */
_DM_PRIVATE int _dm_tcp_read_full(int fd, void* buf, size_t n, int64_t deadline) {
    return _dm_tcp_io_full(NULL, fd, buf, n, false, deadline);
}
_DM_PRIVATE int _dm_tcp_write_full(int fd, const void* buf, size_t n, int64_t deadline) {
    return _dm_tcp_io_full(NULL, fd, (void*)(uintptr_t)buf, n, true, deadline);
}

/* >>tcp hello  Every data connection: the higher rank (connector) connects to the lower
   (acceptor) and both prove the token over fresh nonces from both sides:
     hello      connector -> acceptor  56 B: magic "DMTH", version 2 or 3, rank, world, group u64,
                                              connector nonce[32]
     challenge  acceptor -> connector  72 B: magic "DMTC", status, acceptor nonce[32],
                                              HMAC(token, "acceptor" fields)
     proof      connector -> acceptor  32 B: HMAC(token, "connector" fields)
     ack        acceptor -> connector   8 B: magic "DMTA", status
   The version says whether the connector's group encrypts (3) or not (2): an acceptor whose own
   setting differs refuses it (_DM_TCP_ACK_SEAL), so ranks given different DISTMESH_ENCRYPT
   fail their create naming the setting rather than on the first sealed record. Each side
   decides encryption by its own setting alone: a changed version can refuse, never downgrade.
   The MAC fields: role label, the group's store prefix (generation included), the acceptor's
   published address, world size, both ranks, both nonces. A recorded hello or proof is useless
   on a new connection (the other side's nonce is new), one role's MAC cannot stand in for the
   other's, and a stranger relaying a connector that was sent to its own address fails, since
   the connector signs the address it connected to. Without a token the key is empty: the same
   exchange still catches stray connections from other groups. */
/* Keeps the nonces of a verified hello with rank j on its first socket: they key the link's
   encryption (>>tcp seal), so a group that does not encrypt keeps none (every build sets
   t->encrypt before its hellos). Without memory they are not kept, and sealing that link
   fails. */
static void _dm_tcp_keep_nonces(_dm_tcp* t, int j, const unsigned char* nonce_c, const unsigned char* nonce_a) {
    unsigned char* at;
    if (!t->encrypt || t->hs_index != 0 || j < 0 || j >= t->base.size) return;
    if (!t->hs_nonces) t->hs_nonces = (unsigned char*)_dm_calloc(&t->base.allocator, 65 * (size_t)t->base.size);
    if (!t->hs_nonces) return;
    at = t->hs_nonces + 65 * (size_t)j;
    memcpy(at, nonce_c, 32);
    memcpy(at + 32, nonce_a, 32);
    at[64] = 1;
}
_DM_PRIVATE void _dm_tcp_hello_mac(const _dm_tcp* t, bool acceptor, const char* acceptor_addr, int connector,
                                   int acceptor_rank, const unsigned char* nonce_c, const unsigned char* nonce_a,
                                   unsigned char out[32]) {
    unsigned char msg[64 + sizeof(t->prefix) + 64 + 12 + 64];
    size_t n = 0, k;
    const char* label = acceptor ? "distmesh hello v2 acceptor" : "distmesh hello v2 connector";
    char indexed[64];
    if (t->hs_index > 0) {      /* an extra socket: its index is signed too */
        snprintf(indexed, sizeof(indexed), "%s socket %d", label, t->hs_index);
        label = indexed;
    }
    k = strlen(label) + 1;
    memcpy(msg, label, k);
    n += k;
    k = strnlen(t->prefix, sizeof(t->prefix) - 1) + 1;
    memcpy(msg + n, t->prefix, k - 1);
    msg[n + k - 1] = 0;
    n += k;
    k = strnlen(acceptor_addr, 63) + 1;
    memcpy(msg + n, acceptor_addr, k - 1);
    msg[n + k - 1] = 0;
    n += k;
    _dm_tcp_put32(msg + n, (uint32_t)t->base.size);
    _dm_tcp_put32(msg + n + 4, (uint32_t)connector);
    _dm_tcp_put32(msg + n + 8, (uint32_t)acceptor_rank);
    n += 12;
    memcpy(msg + n, nonce_c, 32);
    memcpy(msg + n + 32, nonce_a, 32);
    n += 64;
    dm_hmac_sha256(t->token, strlen(t->token), msg, n, out);
}

/* Rank j's acceptor refused this rank's hello with status: why, recorded. */
static dm_status _dm_tcp_refused(_dm_tcp* t, int j, uint32_t status) {
    if (status == _DM_TCP_ACK_TOKEN)
        return _DM_FAIL(&t->base, DM_ERR_REFUSED, "tcp: setup: rank %d (%s) refused this rank's token "
                        "(set the same DISTMESH_TOKEN / desc.token on every rank)", j, t->addrs[j]);
    if (status == _DM_TCP_ACK_SEAL)
        return _DM_FAIL(&t->base, DM_ERR_INVALID_ARG, "tcp: setup: rank %d (%s) refused the connection: this rank "
                        "%s its links to other hosts and rank %d %s; give every rank the same DISTMESH_ENCRYPT / "
                        "desc.encrypt", j, t->addrs[j], t->encrypt ? "encrypts" : "does not encrypt", j,
                        t->encrypt ? "does not" : "does");
    return _DM_FAIL(&t->base, DM_ERR_REFUSED, "tcp: setup: rank %d (%s) refused the connection (%s)", j,
                    t->addrs[j], status == _DM_TCP_ACK_GROUP ? "different group or world size" : "rank taken");
}
/* The connector's side on a connected socket to rank j: hello, check the challenge, proof. The
   ack is read next (_dm_tcp_read_ack; its waits answer this rank's own connectors). Waits watch
   the rendezvous's connections (>>tcp watch). *dropped (may be NULL) tells a connection that
   ended before any byte of the challenge: the listener may have dropped it from a full
   handshake table (_dm_tcp_accept_peers), so the caller may connect again. */
static dm_status _dm_tcp_hello_connect_ex(_dm_tcp* t, int fd, int j, uint64_t group, int64_t deadline,
                                          bool* dropped) {
    unsigned char hello[_DM_TCP_HELLO_SIZE], chal[_DM_TCP_CHAL_SIZE], mac[32];
    int rc;
    uint32_t status;
    if (dropped) *dropped = false;
    _dm_tcp_put32(hello, _DM_TCP_HELLO_MAGIC);
    _dm_tcp_put32(hello + 4, t->encrypt ? _DM_TCP_VERSION_SEALED : _DM_TCP_VERSION);
    _dm_tcp_put32(hello + 8, (uint32_t)t->base.rank);
    _dm_tcp_put32(hello + 12, (uint32_t)t->base.size);
    _dm_tcp_put64(hello + 16, group);
    _dm_st_random(hello + 24, 32);
    rc = _dm_tcp_io_full(t, fd, hello, sizeof(hello), true, deadline);
    if (rc == 1) {
        rc = _dm_tcp_io_full(t, fd, chal, 1, false, deadline);
        if (rc == 1) rc = _dm_tcp_io_full(t, fd, chal + 1, sizeof(chal) - 1, false, deadline);
        else if (rc == -1 && dropped) *dropped = true;
    } else if (rc == -1 && dropped) {
        *dropped = true;
    }
    if (rc == -2) return DM_ERR_PEER_LOST;      /* a watched peer is gone: recorded */
    if (rc == 0)
        return _DM_FAIL(&t->base, DM_ERR_TIMEOUT, "tcp: setup timed out waiting for rank %d (%s) to answer the hello",
                        j, t->addrs[j]);
    if (rc < 0)
        return _DM_FAIL(&t->base, DM_ERR_PEER_LOST, "tcp: setup: rank %d (%s) closed the connection during the "
                        "hello (%s)", j, t->addrs[j], errno ? strerror(errno) : "EOF");
    if (_dm_tcp_get32(chal) != _DM_TCP_CHAL_MAGIC)
        return _DM_FAIL(&t->base, DM_ERR_PROTOCOL, "tcp: setup: rank %d (%s) answered the hello with malformed "
                        "bytes (another distmesh version?)", j, t->addrs[j]);
    status = _dm_tcp_get32(chal + 4);
    if (status != _DM_TCP_ACK_OK) return _dm_tcp_refused(t, j, status);
    _dm_tcp_hello_mac(t, true, t->addrs[j], t->base.rank, j, hello + 24, chal + 8, mac);
    if (!_dm_st_ct_equal(mac, chal + 40, 32))
        return _DM_FAIL(&t->base, DM_ERR_REFUSED, "tcp: setup: the listener at %s could not prove the token of "
                        "rank %d (a different DISTMESH_TOKEN, or not rank %d)", t->addrs[j], j, j);
    _dm_tcp_hello_mac(t, false, t->addrs[j], t->base.rank, j, hello + 24, chal + 8, mac);
    rc = _dm_tcp_io_full(t, fd, mac, sizeof(mac), true, deadline);
    if (rc == -2) return DM_ERR_PEER_LOST;
    if (rc == 0)
        return _DM_FAIL(&t->base, DM_ERR_TIMEOUT, "tcp: setup timed out sending the proof to rank %d (%s)", j,
                        t->addrs[j]);
    if (rc < 0)     /* rank j proved the token: it is gone, not a stranger */
        return _DM_FAIL(&t->base, DM_ERR_PEER_LOST, "tcp: setup: rank %d (%s) closed the connection during the "
                        "hello (%s)", j, t->addrs[j], errno ? strerror(errno) : "EOF");
    _dm_tcp_keep_nonces(t, j, hello + 24, chal + 8);
    return DM_OK;
}
_DM_PRIVATE dm_status _dm_tcp_hello_connect(_dm_tcp* t, int fd, int j, uint64_t group, int64_t deadline) {
    return _dm_tcp_hello_connect_ex(t, fd, j, group, deadline, NULL);
}

/* The acceptor's side, a state machine on a nonblocking socket so that one listener drives
   every pending handshake at once (_dm_tcp_accept_peers): read hello -> write challenge ->
   read proof -> write ack, each step moving what the socket takes now. */

static void _dm_tcp_hs_init(_dm_tcp_hs* h, int fd, int64_t deadline) {
    memset(h, 0, sizeof(*h));
    h->fd = fd;
    h->peer = -1;
    h->deadline = deadline;
    h->status = _DM_TCP_ACK_OK;
}
static short _dm_tcp_hs_events(const _dm_tcp_hs* h) {
    return (short)(h->state == _DM_TCP_HS_CHAL || h->state == _DM_TCP_HS_ACK ? POLLOUT : POLLIN);
}
/* Moves bytes [*off, n) of buf now: 1 all moved, 0 would block, -1 EOF or error. */
static int _dm_tcp_hs_io(int fd, unsigned char* buf, size_t n, size_t* off, bool out) {
    while (*off < n) {
        ssize_t k = out ? send(fd, buf + *off, n - *off, MSG_DONTWAIT | MSG_NOSIGNAL)
                        : recv(fd, buf + *off, n - *off, MSG_DONTWAIT);
        if (k > 0) { *off += (size_t)k; continue; }
        if (k == 0) return out ? 0 : -1;
        if (errno == EINTR) continue;
        return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
    }
    return 1;
}
/* One step: _DM_TCP_HS_MORE, -1 for EOF, an error or bad bytes (the caller closes it), or the
   ack status once the answer is out (_DM_TCP_ACK_OK: h->peer is a verified rank). After a
   valid proof it returns _DM_TCP_HS_MORE once, in state _DM_TCP_HS_ACK with status OK, before
   the ack goes out, so a listener can claim the rank first. Deadlines are the caller's. */
static int _dm_tcp_hs_step(_dm_tcp* t, _dm_tcp_hs* h, uint64_t group) {
    for (;;) {
        int rc, p;
        unsigned char mac[32];
        switch (h->state) {
        case _DM_TCP_HS_HELLO:
            if ((rc = _dm_tcp_hs_io(h->fd, h->hello, sizeof(h->hello), &h->off, false)) <= 0)
                return rc < 0 ? -1 : _DM_TCP_HS_MORE;
            h->state = _DM_TCP_HS_DONE;
            if (_dm_tcp_get32(h->hello) != _DM_TCP_HELLO_MAGIC ||
                (_dm_tcp_get32(h->hello + 4) != _DM_TCP_VERSION && _dm_tcp_get32(h->hello + 4) != _DM_TCP_VERSION_SEALED))
                return -1;
            p = h->peer = (int)_dm_tcp_get32(h->hello + 8);
            if ((_dm_tcp_get32(h->hello + 4) == _DM_TCP_VERSION_SEALED) != t->encrypt) {
                h->status = _DM_TCP_ACK_SEAL;
                _DM_LOG(&t->base.logger, DM_LOG_WARN, "tcp: setup: refused rank %d: it %s its links to other hosts, "
                        "this rank %s (DISTMESH_ENCRYPT, desc.encrypt)", p, t->encrypt ? "does not encrypt" : "encrypts",
                        t->encrypt ? "does" : "does not");
            } else if ((int)_dm_tcp_get32(h->hello + 12) != t->base.size) {
                h->status = _DM_TCP_ACK_GROUP;
                _DM_LOG(&t->base.logger, DM_LOG_WARN, "tcp: setup: refused rank %d: world size disagreement (it has "
                        "%d, this rank %d)", p, (int)_dm_tcp_get32(h->hello + 12), t->base.size);
            } else if (_dm_tcp_get64(h->hello + 16) != group) {
                h->status = _DM_TCP_ACK_GROUP;
                _DM_LOG(&t->base.logger, DM_LOG_WARN, "tcp: setup: refused a connection claiming rank %d (other "
                        "group)", p);
            } else if (p <= t->base.rank || p >= t->base.size || t->claims[p] >= 0)
                h->status = _DM_TCP_ACK_RANK;
            memset(h->chal, 0, sizeof(h->chal));
            _dm_tcp_put32(h->chal, _DM_TCP_CHAL_MAGIC);
            _dm_tcp_put32(h->chal + 4, h->status);
            if (h->status == _DM_TCP_ACK_OK) {
                _dm_st_random(h->chal + 8, 32);
                _dm_tcp_hello_mac(t, true, t->addrs[t->base.rank], p, t->base.rank, h->hello + 24, h->chal + 8,
                                  h->chal + 40);
            }
            h->state = _DM_TCP_HS_CHAL;
            h->off = 0;
            break;
        case _DM_TCP_HS_CHAL:
            if ((rc = _dm_tcp_hs_io(h->fd, h->chal, sizeof(h->chal), &h->off, true)) <= 0)
                return rc < 0 ? -1 : _DM_TCP_HS_MORE;
            if (h->status != _DM_TCP_ACK_OK) { h->state = _DM_TCP_HS_DONE; return (int)h->status; }
            h->state = _DM_TCP_HS_PROOF;
            h->off = 0;
            break;
        case _DM_TCP_HS_PROOF:
            if ((rc = _dm_tcp_hs_io(h->fd, h->proof, sizeof(h->proof), &h->off, false)) <= 0)
                return rc < 0 ? -1 : _DM_TCP_HS_MORE;
            _dm_tcp_hello_mac(t, false, t->addrs[t->base.rank], h->peer, t->base.rank, h->hello + 24, h->chal + 8, mac);
            if (!_dm_st_ct_equal(mac, h->proof, 32)) h->status = _DM_TCP_ACK_TOKEN;
            else if (t->claims[h->peer] >= 0) h->status = _DM_TCP_ACK_RANK;     /* another one proved it first */
            else _dm_tcp_keep_nonces(t, h->peer, h->hello + 24, h->chal + 8);
            _dm_tcp_put32(h->ack, _DM_TCP_ACK_MAGIC);
            _dm_tcp_put32(h->ack + 4, h->status);
            h->state = _DM_TCP_HS_ACK;
            h->off = 0;
            if (h->status == _DM_TCP_ACK_OK) return _DM_TCP_HS_MORE;
            break;
        case _DM_TCP_HS_ACK:
            if ((rc = _dm_tcp_hs_io(h->fd, h->ack, sizeof(h->ack), &h->off, true)) <= 0)
                return rc < 0 ? -1 : _DM_TCP_HS_MORE;
            h->state = _DM_TCP_HS_DONE;
            return (int)h->status;
        default:
            return -1;
        }
    }
}

/* The acceptor's side on one accepted socket, blocking until the deadline (the state machine
   above, driven alone). Returns the ack status (_DM_TCP_ACK_OK: *peer is a verified rank), or
   -1 for a connection that went silent or sent bad bytes; the caller closes every refusal. */
_DM_PRIVATE int _dm_tcp_hello_accept(_dm_tcp* t, int fd, uint64_t group, int64_t deadline, int* peer) {
    _dm_tcp_hs h;
    int rc;
    _dm_tcp_hs_init(&h, fd, deadline);
    while ((rc = _dm_tcp_hs_step(t, &h, group)) == _DM_TCP_HS_MORE)
        if (_dm_tcp_wait_fd(fd, _dm_tcp_hs_events(&h), deadline) != 1) { rc = -1; break; }
    *peer = h.peer;
    return rc;
}

/* Connects to rank j at its published address, retrying until the deadline while nothing
   answers; then the hello. A published address that refuses connections is a listener that
   is gone (it listens from before it publishes until its group is destroyed or broken), so a
   few refusals in a row mean the peer died or gave up: DM_ERR_PEER_LOST, not a wait for the
   deadline. A connection dropped before the challenge is tried again a few times (the listener may have
   dropped it to bound its handshakes; a dead one then refuses). */
static dm_status _dm_tcp_connect_peer(_dm_tcp* t, int j, uint64_t group, int64_t deadline) {
    struct sockaddr_storage sa;
    int fd = -1, rc, err, refused = 0, redials = 0;
    dm_status st;
    if (!_dm_tcp_parse_addr(t->addrs[j], &sa))
        return _DM_FAIL(&t->base, DM_ERR_PROTOCOL, "tcp: rank %d published a malformed address \"%s\"", j, t->addrs[j]);
    for (;;) {
        socklen_t len = sizeof(err);
        bool dropped = false;
        fd = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) return _DM_FAIL(&t->base, DM_ERR_NETWORK, "tcp: socket() failed (%s)", strerror(errno));
        rc = connect(fd, (struct sockaddr*)&sa, sa.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                                          : sizeof(struct sockaddr_in));
        err = rc == 0 ? 0 : errno;
        if (err == EINPROGRESS) {
            rc = _dm_tcp_wait_fd_w(t, fd, POLLOUT, deadline);
            if (rc == -2) { close(fd); return DM_ERR_PEER_LOST; }
            err = rc == 1 ? 0 : ETIMEDOUT;
            if (rc == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
        }
        if (err == 0) {
            _dm_tcp_tune(fd);
            st = _dm_tcp_hello_connect_ex(t, fd, j, group, deadline, &dropped);
            if (st == DM_OK) { t->claims[j] = fd; return DM_OK; }
            close(fd);
            if (!dropped || ++redials > 3) return st;
            refused = 0;
        } else {
            close(fd);
            if (err == ECONNREFUSED && (++refused >= 3 || t->refusal_final))
                return _DM_FAIL(&t->base, DM_ERR_PEER_LOST, "tcp: setup: rank %d at %s refuses connections (%s): "
                                "its listener is gone (the process died, or its setup failed: see its log)", j,
                                t->addrs[j], strerror(err));
            if (err != ECONNREFUSED) refused = 0;
        }
        if (_dm_now_ms() >= deadline)
            return _DM_FAIL(&t->base, DM_ERR_TIMEOUT, "tcp: setup timed out connecting to rank %d at %s (%s)",
                            j, t->addrs[j], strerror(err ? err : ETIMEDOUT));
        if ((st = _dm_tcp_watch_now(t)) != DM_OK) return st;
        _dm_sleep_ms(t->refusal_final ? 1 : 20);
    }
}

/* >>tcp accept  The listener's side of the hello: handshakes stepped from any wait of this rank
   (_dm_tcp_serve), the expected higher ranks accepted; then the connector's side completed
   (the ack, the link). */
/* A handshake the listener gives up: its claim on a rank goes, its socket is closed. */
static void _dm_tcp_hs_drop(_dm_tcp* t, _dm_tcp_hs* h) {
    if (h->claimed && t->claims[h->peer] == h->fd) t->claims[h->peer] = -1;
    h->claimed = false;
    close(h->fd);
    h->fd = -1;
}
/* Steps one of the listener's handshakes; 1 when it completed a verified peer (its socket is
   now t->claims[peer]), else 0. A finished one is left with fd -1, closed unless a peer's. */
static int _dm_tcp_hs_drive(_dm_tcp* t, _dm_tcp_hs* h, uint64_t group) {
    int rc = _dm_tcp_hs_step(t, h, group);
    if (rc == _DM_TCP_HS_MORE && h->state == _DM_TCP_HS_ACK && h->status == _DM_TCP_ACK_OK && !h->claimed) {
        t->claims[h->peer] = h->fd;    /* the rank is this connection's before the ack says so */
        h->claimed = true;
        rc = _dm_tcp_hs_step(t, h, group);
    }
    if (rc == _DM_TCP_HS_MORE) return 0;
    if (rc == _DM_TCP_ACK_OK) {
        _dm_tcp_tune(h->fd);
        h->fd = -1;
        return 1;
    }
    if (rc < 0) {
        if (h->state != _DM_TCP_HS_HELLO || h->off != 0)    /* closed before a byte: a probe (>>tcp lazy) */
            _DM_LOG(&t->base.logger, DM_LOG_WARN, "tcp: setup: dropped a connection that closed or sent a bad hello");
    } else if (rc != _DM_TCP_ACK_GROUP && rc != _DM_TCP_ACK_SEAL) {   /* these were named at the hello */
        _DM_LOG(&t->base.logger, DM_LOG_WARN, "tcp: setup: refused a connection claiming rank %d (%s)", h->peer,
                rc == _DM_TCP_ACK_TOKEN ? "wrong token proof: another token, or a replayed or relayed hello"
                                        : "bad rank");
    }
    _dm_tcp_hs_drop(t, h);
    return 0;
}
/* The one to drop from a full table: the oldest that has not sent a whole hello, else the
   oldest (never one whose rank is claimed); -1 if none. */
static int _dm_tcp_hs_victim(const _dm_tcp_hs* hs, int n) {
    int i;
    for (i = 0; i < n; i++)
        if (hs[i].fd >= 0 && !hs[i].claimed && hs[i].state == _DM_TCP_HS_HELLO) return i;
    for (i = 0; i < n; i++)
        if (hs[i].fd >= 0 && !hs[i].claimed) return i;
    return -1;
}
static void _dm_tcp_hs_compact(_dm_tcp_hs* hs, int* n) {
    int i, k = 0;
    for (i = 0; i < *n; i++)
        if (hs[i].fd >= 0) {
            if (k != i) hs[k] = hs[i];
            k++;
        }
    *n = k;
}

static dm_status _dm_tcp_seal_link(_dm_tcp* t, int j);
/* The socket link to rank j once its connection is verified (a no-op before the group has
   its links, and for a peer that has one). */
static dm_status _dm_tcp_add_link(_dm_tcp* t, int j) {
    _dm_socklink* l;
    if (!t->lk.links || t->lk.links[j] || t->fds[j] < 0) return DM_OK;
    l = (_dm_socklink*)_dm_calloc(&t->base.allocator, sizeof(_dm_socklink));
    if (!l) return _DM_FAIL(&t->base, DM_ERR_OUT_OF_MEMORY, "tcp: out of memory");
    l->base.vt = &_dm_sock_vt;
    l->base.fd = l->fds[0] = t->fds[j];
    l->nsock = 1;               /* its others, if any, come later (_dm_tcp_more_sockets) */
    _dm_copy_name(l->base.where, sizeof(l->base.where), t->addrs[j]);
    /* during setup the ranks' addresses are not exchanged yet: the socket's far end, then */
    if (!l->base.where[0]) _dm_tcp_peer_name(l->base.fd, l->base.where, sizeof(l->base.where));
    if (!l->base.where[0]) _dm_copy_name(l->base.where, sizeof(l->base.where), "address not known yet");
    t->lk.links[j] = &l->base;
    return _dm_tcp_seal_link(t, j);     /* encrypted from its first byte when the group encrypts */
}
/* Steps one handshake; 1 when it completed a verified peer (now its socket and link). */
static int _dm_tcp_hs_finish(_dm_tcp* t, _dm_tcp_hs* h) {
    if (!_dm_tcp_hs_drive(t, h, t->group)) return 0;
    h->claimed = false;         /* done: the socket is the peer's (t->claims) */
    if (t->hs_index == 0) _dm_tcp_add_link(t, h->peer);    /* an extra socket joins its link later */
    return 1;
}
/* The listener's work, never blocking: handshakes past their own deadline go (logged unless it
   is the end of the whole wait, deadline), what the listener holds is accepted, every
   handshake is stepped. Beyond _DM_TCP_HS_MAX handshakes the oldest connection that has not
   sent a whole hello goes first (else the oldest), logged. Strangers (bad magic, group, rank
   or token) get a refusal and are closed. Returns how many peers it completed. */
static int _dm_tcp_serve(_dm_tcp* t, int64_t deadline) {
    int64_t now = _dm_now_ms();
    int i, done = 0, dropped = 0;
    for (i = 0; i < t->nhs; i++)
        if (now >= t->hs[i].deadline) {
            if (t->hs[i].deadline < deadline)
                _DM_LOG(&t->base.logger, DM_LOG_WARN, "tcp: setup: dropped a connection that had not finished "
                        "its hello after %d ms (silent or too slow)", _DM_TCP_HS_MS);
            _dm_tcp_hs_drop(t, &t->hs[i]);
        }
    _dm_tcp_hs_compact(t->hs, &t->nhs);
    for (i = 0; i < t->nhs; i++) done += _dm_tcp_hs_finish(t, &t->hs[i]);
    _dm_tcp_hs_compact(t->hs, &t->nhs);
    while (t->lfd >= 0 && now >= t->lfd_rest) {
        int fd = accept4(t->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                _DM_LOG(&t->base.logger, DM_LOG_WARN, "tcp: setup: accept failed (%s)", strerror(errno));
                t->lfd_rest = now + 20;
            }
            break;
        }
        if (t->nhs == _DM_TCP_HS_MAX) {
            int v = _dm_tcp_hs_victim(t->hs, t->nhs);
            if (v < 0) { close(fd); continue; }
            _dm_tcp_hs_drop(t, &t->hs[v]);
            _dm_tcp_hs_compact(t->hs, &t->nhs);
            dropped++;
        }
        _dm_tcp_hs_init(&t->hs[t->nhs], fd, now + _DM_TCP_HS_MS < deadline ? now + _DM_TCP_HS_MS : deadline);
        done += _dm_tcp_hs_finish(t, &t->hs[t->nhs]);   /* its hello may be here already */
        t->nhs++;
        _dm_tcp_hs_compact(t->hs, &t->nhs);
    }
    if (dropped)
        _DM_LOG(&t->base.logger, DM_LOG_WARN, "tcp: setup: dropped %d unauthenticated connection%s, the oldest, "
                "to keep at most %d handshakes at once", dropped, dropped == 1 ? "" : "s", _DM_TCP_HS_MAX);
    return done;
}
/* The listener and its handshakes as poll entries (at most cap); *wake (may be NULL) comes
   down to the nearest handshake deadline. */
static int _dm_tcp_serve_fill(const _dm_tcp* t, struct pollfd* p, int cap, int64_t* wake) {
    int n = 0, i;
    if (t->lfd < 0) return 0;
    if (_dm_now_ms() >= t->lfd_rest) {
        p[n].fd = t->lfd; p[n].events = POLLIN; p[n].revents = 0; n++;
    } else if (wake && t->lfd_rest < *wake) {
        *wake = t->lfd_rest;
    }
    for (i = 0; i < t->nhs && n < cap; i++) {
        p[n].fd = t->hs[i].fd; p[n].events = _dm_tcp_hs_events(&t->hs[i]); p[n].revents = 0; n++;
        if (wake && t->hs[i].deadline < *wake) *wake = t->hs[i].deadline;
    }
    return n;
}
/* Every handshake in progress is dropped (the listener stops, or a wait gave up). */
static void _dm_tcp_serve_stop(_dm_tcp* t) {
    int i;
    for (i = 0; i < t->nhs; i++)
        if (t->hs[i].fd >= 0) _dm_tcp_hs_drop(t, &t->hs[i]);
    t->nhs = 0;
}
/* At the end of create: the handshakes that have not said a whole hello of this group go
   (strangers, or too slow), so none waits for the next call; a peer's that has stays. */
static void _dm_tcp_serve_trim(_dm_tcp* t) {
    int i;
    for (i = 0; i < t->nhs; i++)
        if (!t->hs[i].claimed && (t->hs[i].state == _DM_TCP_HS_HELLO || t->hs[i].status != _DM_TCP_ACK_OK))
            _dm_tcp_hs_drop(t, &t->hs[i]);
    _dm_tcp_hs_compact(t->hs, &t->nhs);
}
/* Rank j's connection (of the socket index the handshakes are for now) is here and verified:
   its socket is set and no handshake still owes it the ack (the listener claims the rank
   before the ack goes out). */
static bool _dm_tcp_has_peer(const _dm_tcp* t, int j) {
    int i;
    if (t->claims[j] < 0) return false;
    for (i = 0; i < t->nhs; i++)
        if (t->hs[i].claimed && t->hs[i].peer == j) return false;
    return true;
}
static bool _dm_tcp_expected(const _dm_tcp* t, int j) { return j > t->base.rank && (!t->expect || t->expect[j]); }

/* Accepts on lfd until every expected higher rank (t->expect, else all) has said hello, each
   handshake with its own deadline (_DM_TCP_HS_MS from its accept), so silent or slow
   connections cost the others nothing (_dm_tcp_serve). Other higher ranks that connect
   meanwhile (on demand) are accepted too. The rendezvous's connections are watched meanwhile
   (>>tcp watch). */
static dm_status _dm_tcp_accept_peers(_dm_tcp* t, int lfd, uint64_t group, int64_t deadline) {
    int W = t->base.size, j;
    struct pollfd* p;
    dm_status st = DM_OK;
    t->lfd = lfd;
    t->group = group;
    p = (struct pollfd*)_dm_malloc(&t->base.allocator, sizeof(struct pollfd) * (1 + _DM_TCP_HS_MAX + 2 * (size_t)W));
    if (!p) return _DM_FAIL(&t->base, DM_ERR_OUT_OF_MEMORY, "tcp: out of memory");
    for (;;) {
        int64_t now = _dm_now_ms(), wake = deadline;
        int missing = 0, expected = 0, first = -1, n, nw, rc;
        for (j = t->base.rank + 1; j < W; j++) {
            if (!_dm_tcp_expected(t, j)) continue;
            expected++;
            if (!_dm_tcp_has_peer(t, j) && missing++ == 0) first = j;
        }
        if (missing == 0) break;
        if (now >= deadline) {
            st = _DM_FAIL(&t->base, DM_ERR_TIMEOUT, "tcp: setup timed out after %d ms waiting for rank %d to "
                          "connect (%d of %d peers missing)", t->base.timeout_ms, first, missing, expected);
            break;
        }
        n = _dm_tcp_serve_fill(t, p, 1 + _DM_TCP_HS_MAX, &wake);
        nw = _dm_tcp_watch_fill(t, p + n);
        rc = poll(p, (nfds_t)(n + nw), wake - now > 1000 ? 1000 : wake - now < 0 ? 0 : (int)(wake - now));
        if (rc < 0 && errno != EINTR) {
            st = _DM_FAIL(&t->base, DM_ERR_NETWORK, "tcp: setup: poll on the listener failed (%s)", strerror(errno));
            break;
        }
        if (rc > 0 && (st = _dm_tcp_watch_check(t, p + n, nw)) != DM_OK) break;
        _dm_tcp_serve(t, deadline);
    }
    if (!t->serving) _dm_tcp_serve_stop(t);
    _dm_free(&t->base.allocator, p);
    return st;
}

/* The ack of rank j (a connection this rank made), watching the others meanwhile. Rank j has
   proved the token in its challenge, so a connection that ends here is a peer gone. */
static dm_status _dm_tcp_read_ack(_dm_tcp* t, int j, int64_t deadline) {
    unsigned char ack[8];
    int rc = _dm_tcp_io_full(t, t->claims[j], ack, sizeof(ack), false, deadline);
    uint32_t status;
    if (rc == -2) return DM_ERR_PEER_LOST;
    if (rc == 0)
        return _DM_FAIL(&t->base, DM_ERR_TIMEOUT, "tcp: setup timed out waiting for rank %d (%s) to accept",
                        j, t->addrs[j]);
    if (rc < 0)
        return _DM_FAIL(&t->base, DM_ERR_PEER_LOST, "tcp: setup: rank %d (%s) closed the connection during the "
                        "hello (%s): it died, or dropped the connection", j, t->addrs[j],
                        errno ? strerror(errno) : "EOF");
    if (_dm_tcp_get32(ack) != _DM_TCP_ACK_MAGIC)
        return _DM_FAIL(&t->base, DM_ERR_PROTOCOL, "tcp: setup: rank %d (%s) answered with malformed bytes", j, t->addrs[j]);
    status = _dm_tcp_get32(ack + 4);
    return status == _DM_TCP_ACK_OK ? DM_OK : _dm_tcp_refused(t, j, status);
}

/* Connects to lower rank j: connect, hello, proof, ack, link. */
static dm_status _dm_tcp_link_down(_dm_tcp* t, int j, int64_t deadline) {
    dm_status st;
    if (t->fds[j] < 0) {
        _DM_TRY(_dm_tcp_connect_peer(t, j, t->group, deadline));
        if ((st = _dm_tcp_read_ack(t, j, deadline)) != DM_OK) {
            close(t->fds[j]);
            t->fds[j] = -1;
            return st;
        }
    }
    return _dm_tcp_add_link(t, j);
}

/* >>tcp lazy  After create, a peer outside P (what the caller's arguments choose: send/recv,
   all_to_all, gather, scatter, reduce to a root) is connected when a transfer first needs it,
   with the same hello and token check: the higher rank connects, the lower one waits for it
   and answers from any wait, since every blocking wait of this group serves the listener
   (the engine's poll_fill / service, and _dm_tcp_wait_fd_w). A rank that waits for a
   connector asks the store's abort notice every 250 ms, so a failure elsewhere ends the wait
   with its cause; a broken group closes its listener (hangup), so a connector is refused at
   once instead of waiting for its deadline. A connection reaches a rank only while it is in
   a call of this group (or its create): one that computes meanwhile answers when it returns.
   The waiting rank also probes the connector's listener every 250 ms: a refusal means the
   connector died before it could dial (no one else may notice: every other rank may be
   waiting for it too). */
#define _DM_TCP_LAZY_NOTICE_MS 250
/* Whether rank j's listener still exists: a connection it refuses means its process (or its
   group) is gone. A connection that opens is closed at once, before any byte (the listener
   drops it silently). -1 refused, else 0. */
static int _dm_tcp_probe(_dm_tcp* t, int j) {
    struct sockaddr_storage sa;
    int fd, rc = 0, err = 0;
    socklen_t len = sizeof(err);
    if (!_dm_tcp_parse_addr(t->addrs[j], &sa)) return 0;
    fd = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return 0;
    if (connect(fd, (struct sockaddr*)&sa, sa.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                                    : sizeof(struct sockaddr_in)) != 0) {
        err = errno;
        if (err == EINPROGRESS && _dm_tcp_wait_fd(fd, POLLOUT, _dm_now_ms() + 50) == 1 &&
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
            err = 0;
        if (err == ECONNREFUSED) rc = -1;
    }
    close(fd);
    return rc;
}
static dm_status _dm_tcp_await_peer(_dm_tcp* t, int j, int64_t deadline) {
    int64_t next_notice = _dm_now_ms() + _DM_TCP_LAZY_NOTICE_MS;
    struct pollfd* p = t->lk.pfds;
    while (!t->lk.links[j]) {
        int64_t now = _dm_now_ms();
        int n;
        if (_dm_tcp_has_peer(t, j)) return _dm_tcp_add_link(t, j);
        if (now >= deadline)
            return _DM_FAIL(&t->base, DM_ERR_TIMEOUT, "timed out after %d ms waiting for rank %d (%s) to connect",
                            t->base.timeout_ms, j, t->addrs[j]);
        if (!t->serving)
            return _DM_FAIL(&t->base, DM_ERR_ABORTED, "waiting for rank %d to connect, but this group stopped", j);
        n = _dm_tcp_serve_fill(t, p, _DM_ENG_SERVICE_FDS, NULL);
        if (poll(p, (nfds_t)n, deadline - now > 100 ? 100 : (int)(deadline - now)) < 0 && errno != EINTR)
            return _DM_FAIL(&t->base, DM_ERR_NETWORK, "poll on the listener failed (%s)", strerror(errno));
        _dm_tcp_serve(t, INT64_MAX);
        if (t->lk.abort && __atomic_load_n(&t->lk.abort->status, __ATOMIC_ACQUIRE) < 0)
            return _DM_FAIL(&t->base, DM_ERR_ABORTED, "a rank of this host failed while this rank waited for rank %d", j);
        if (now >= next_notice && t->lk.notice_read) {
            char msg[DM_LAST_ERROR_SIZE];
            int rank = -1;
            next_notice = _dm_now_ms() + _DM_TCP_LAZY_NOTICE_MS;
            if (t->lk.notice_read(&t->lk, &rank, msg, sizeof(msg)) != DM_OK && rank != t->base.rank)
                return _DM_FAIL(&t->base, DM_ERR_PEER_LOST, "rank %d failed while this rank waited for rank %d to "
                                "connect", rank, j);
            if (_dm_tcp_probe(t, j) < 0)
                return _DM_FAIL(&t->base, DM_ERR_PEER_LOST, "rank %d (%s) never connected and its listener refuses "
                                "connections: it died, or its group broke", j, t->addrs[j]);
        }
    }
    return DM_OK;
}
/* The engine's connect hook: lower peers first (this rank connects to them; they answer from
   their waits), then the higher ones (they connect here), so no two ranks wait on each other. */
static dm_status _dm_tcp_eng_connect(_dm_eng* lk, const int* peers, int n, int64_t deadline) {
    _dm_tcp* t = (_dm_tcp*)lk->c;
    int i, pass;
    for (pass = 0; pass < 2; pass++)
        for (i = 0; i < n; i++) {
            int j = peers[i];
            if (t->lk.links[j] || (pass == 0) != (j < t->base.rank)) continue;
            if (!t->serving)
                return _DM_FAIL(&t->base, DM_ERR_ABORTED, "connecting to rank %d, but this group stopped", j);
            _DM_TRY(pass == 0 ? _dm_tcp_link_down(t, j, deadline) : _dm_tcp_await_peer(t, j, deadline));
        }
    return DM_OK;
}
static int _dm_tcp_eng_poll_fill(_dm_eng* lk, struct pollfd* p, int cap) {
    _dm_tcp* t = (_dm_tcp*)lk->c;
    return t->serving ? _dm_tcp_serve_fill(t, p, cap, NULL) : 0;
}
static void _dm_tcp_eng_service(_dm_eng* lk) {
    _dm_tcp* t = (_dm_tcp*)lk->c;
    if (t->serving) _dm_tcp_serve(t, INT64_MAX);
}
/* A broken group answers nobody: connectors are refused at once. */
static void _dm_tcp_eng_hangup(_dm_eng* lk) {
    _dm_tcp* t = (_dm_tcp*)lk->c;
    if (!t->serving) return;
    t->serving = false;
    _dm_tcp_serve_stop(t);
    if (t->lfd >= 0) close(t->lfd);
    t->lfd = -1;
}

/* >>tcp more sockets  With n sockets per peer (desc.sockets_per_peer, DISTMESH_SOCKETS_PER_PEER)
   each pair of P (>>tcp sparse) on different hosts opens n - 1 more connections once P is
   connected: round k = 1..n-1, each P's exchange again (lower ranks connect first, the higher
   ones are accepted) through the group's listener with the same hello, so every socket proves
   the token and has the setup's deadline; the MACs sign k and the group id differs per round,
   so no connection can pass for another round's (that every rank was given the same n was
   checked with the host identities, _dm_tcp_hosts). Every wait serves the listener, so each
   round starts with a barrier once every rank has switched its listener to that round (group
   id, row of fds, index), and a last barrier follows the switch back to the group's own
   hello: no connection of one round, and no on-demand one, meets a listener still in another.
   A peer connected on demand (>>tcp lazy) keeps one socket. The links then stripe over their
   sockets from the next byte on, the same offset at both ends (the last barrier's end, base
   in _dm_socklink); whatever this rank read ahead from the first socket past it (under
   16 KiB, a peer may already be sending) is the start of stripe 0, which that socket carries. */
static void _dm_tcp_round_set(_dm_tcp* t, uint64_t group, int k) {
    t->group = k ? group ^ _dm_tcp_hash((uint64_t)k, "socket", NULL) : group;
    t->claims = t->fds + (size_t)k * (size_t)t->base.size;
    t->hs_index = k;
    _dm_tcp_serve_trim(t);      /* no half-done hello of the round before carries over */
}
static dm_status _dm_tcp_more_rounds(_dm_tcp* t, const bool* extra, int64_t deadline) {
    int me = t->base.rank, k, j;
    uint64_t group = t->group;
    dm_status st = DM_OK;
    t->expect = extra;
    for (k = 1; k < t->nsock && st == DM_OK; k++) {
        _dm_tcp_round_set(t, group, k);
        st = _dm_coll_barrier(&t->base);
        for (j = 0; j < me && st == DM_OK; j++)
            if (extra[j]) st = _dm_tcp_connect_peer(t, j, t->group, deadline);
        if (st == DM_OK) st = _dm_tcp_accept_peers(t, t->lfd, t->group, deadline);
        for (j = 0; j < me && st == DM_OK; j++)
            if (extra[j]) st = _dm_tcp_read_ack(t, j, deadline);
    }
    _dm_tcp_round_set(t, group, 0);
    if (st == DM_OK) st = _dm_coll_barrier(&t->base);
    return st;
}
static dm_status _dm_tcp_more_sockets(_dm_tcp* t, int64_t deadline) {
    int W = t->base.size, me = t->base.rank, k, j;
    bool* extra = t->want;      /* P (_dm_tcp_connect_sparse), now only its peers on other hosts */
    if (t->nsock == 1) return DM_OK;    /* every rank's count was checked with the hosts */
    for (j = 0; j < W; j++)
        extra[j] = extra[j] && j != me && t->lk.links[j] && t->host_of[j] != t->host_of[me];
    _DM_TRY(_dm_tcp_more_rounds(t, extra, deadline));
    for (j = 0; j < W; j++) {
        _dm_socklink* l = _dm_sock_of(t->lk.links[j]);     /* under its encryption, if any (>>tcp seal) */
        if (!extra[j]) continue;
        if (!l) return _DM_FAIL(&t->base, DM_ERR_INTERNAL, "tcp: rank %d's link is not a socket", j);
        for (k = 1; k < t->nsock; k++) l->fds[k] = t->fds[(size_t)k * (size_t)W + (size_t)j];
        l->sbase = l->sent;     /* the last barrier's end, as at the peer */
        l->tbase = l->taken;
        l->nsock = t->nsock;
    }
    return DM_OK;
}

/* >>tcp seal  A group that encrypts (desc.encrypt, DISTMESH_ENCRYPT: _dm_tcp_parse_encrypt)
   wraps each socket link in an encrypted link (distmesh_socket.h >>socket aead) as the link is
   made, right after its hello, before its first byte: the setup itself (host identities, the
   shared-memory vote, addresses) travels sealed, so a man in the middle can neither alter it
   nor talk the ranks into thinking they share a host. Which peers share a host is known only
   once the group is built; then (_dm_tcp_seal_settle, at the end of every build: create,
   split, grow, join, shrink) the links within a host that are still sockets go back to plain
   sockets, at the same stream offset at both ends (every setup message exchanged, nothing of
   a record left over), and the links swapped for shared memory are gone anyway. A link made on
   demand later (>>tcp lazy) is wrapped only when its peer is on another host. The keys come
   from the token and the nonces of the link's first socket's hello (_dm_tcp_keep_nonces): one
   per direction, named by both ranks and the group's store prefix (_dm_aead_key). */
static dm_status _dm_tcp_seal_link(_dm_tcp* t, int j) {
    _dm_link* l = t->lk.links[j];
    int me = t->base.rank;
    if (!t->encrypt || !l || l->vt != &_dm_sock_vt) return DM_OK;
    if (t->hosts_final && t->host_of && t->host_of[j] == t->host_of[me]) return DM_OK;
#if defined(DISTMESH_OPENSSL)
    {
        unsigned char ks[32], kr[32];
        unsigned char* nonces = t->hs_nonces ? t->hs_nonces + 65 * (size_t)j : NULL;
        _dm_link* w;
        if (!nonces || !nonces[64])
            return _DM_FAIL(&t->base, DM_ERR_OUT_OF_MEMORY, "tcp: no hello nonces kept for rank %d (%s): its link "
                            "cannot be keyed for encryption (out of memory)", j, l->where);
        _dm_aead_key(t->token, nonces, t->prefix, me, j, ks);
        _dm_aead_key(t->token, nonces, t->prefix, j, me, kr);
        memset(nonces, 0, 65);
        w = _dm_aead_wrap(l, ks, kr, &t->base.allocator);
        memset(ks, 0, sizeof(ks));
        memset(kr, 0, sizeof(kr));
        if (!w)
            return _DM_FAIL(&t->base, DM_ERR_OUT_OF_MEMORY, "tcp: cannot set up the encryption of the link to rank "
                            "%d (%s): out of memory, or libcrypto has no AES-256-GCM", j, l->where);
        if (t->hosts_final && t->host_of) _dm_aead_read_ahead(w);   /* made on demand: another host's */
        t->lk.links[j] = w;
    }
    return DM_OK;
#else
    return _DM_FAIL(&t->base, DM_ERR_UNSUPPORTED, "tcp: encryption needs DISTMESH_OPENSSL");   /* refused at create */
#endif
}
/* The end of a build: links within this rank's host go back to plain sockets (see above). */
static dm_status _dm_tcp_seal_settle(_dm_tcp* t) {
    int j, me = t->base.rank;
    t->hosts_final = true;
    if (!t->encrypt || !t->host_of) return DM_OK;
#if defined(DISTMESH_OPENSSL)
    for (j = 0; j < t->base.size; j++) {
        _dm_link* l = t->lk.links[j];
        _dm_link* in;
        if (j == me || !_dm_aead_of(l)) continue;
        if (t->host_of[j] != t->host_of[me]) { _dm_aead_read_ahead(l); continue; }  /* stays encrypted */
        if (!(in = _dm_aead_unwrap(l, &t->base.allocator)))
            return _DM_FAIL(&t->base, DM_ERR_INTERNAL, "tcp: rank %d (%s) sent more than the setup on a link "
                            "within this host", j, l->where);
        t->lk.links[j] = in;
    }
#else
    (void)j; (void)me;
#endif
    return DM_OK;
}

/* >>tcp store access  How a group reaches the store. While a group is built every request goes
   through t->rdv, a clone of the store whose timeout is what is left of the rendezvous
   deadline: the desc's timeout for create, the parent's current one (dm_set_timeout) for
   split, whatever timeout the store itself was made with. */
static dm_store* _dm_tcp_st(_dm_tcp* t) {
    int64_t left;
    if (!t->rdv) return t->store;
    left = t->rdv_deadline == INT64_MAX ? -1 : t->rdv_deadline - _dm_now_ms();
    t->rdv->timeout_ms = t->rdv_deadline == INT64_MAX ? -1 : left < 1 ? 1 : left > INT_MAX ? INT_MAX : (int)left;
    return t->rdv;
}
static dm_status _dm_tcp_store_fail(_dm_tcp* t, dm_status st, const char* what, const char* key) {
    return _DM_FAIL(&t->base, st, "tcp: store %s \"%s\" failed: %s", what, key,
                    dm_store_last_error(t->rdv ? t->rdv : t->store));
}
static dm_status _dm_tcp_store_get_str(_dm_tcp* t, const char* key, char* out, size_t cap) {
    void* v = NULL;
    size_t n = 0;
    dm_store* s = _dm_tcp_st(t);
    dm_status st = dm_store_get(s, key, &v, &n);
    if (st != DM_OK) return _dm_tcp_store_fail(t, st, "get", key);
    if (n >= cap) n = cap - 1;
    memcpy(out, v, n);
    out[n] = 0;
    dm_store_free(s, v);
    return DM_OK;
}

/* >>tcp keys  A group leaves nothing in the store once it is built: every rank above this one
   has read this rank's address before connecting, so when all of them have said hello the
   address key goes, and rank 0 deletes the world's own (world_size, arrived, ready: see
   >>tcp arrival). What stays is one generation counter per world prefix (none for splits, whose
   prefixes are used once), so the key count is flat over create/split/destroy cycles. */
static void _dm_tcp_forget_key(_dm_tcp* t, const char* name) {
    char key[600];
    dm_store* s = _dm_tcp_st(t);
    snprintf(key, sizeof(key), "%s%s", t->prefix, name);
    if (dm_store_delete(s, key, NULL) != DM_OK)
        _DM_LOG(&t->base.logger, DM_LOG_WARN, "tcp: could not delete the store key \"%s\" (%s)", key,
                dm_store_last_error(s));
}
/* The keys every rank read before connecting: the world size, the arrival count and its
   mark (>>tcp arrival). Rank 0's (or its leader's) to delete. */
static void _dm_tcp_forget_world(_dm_tcp* t) {
    _dm_tcp_forget_key(t, "world_size");
    if (!t->counted) return;
    _dm_tcp_forget_key(t, "arrived");
    _dm_tcp_forget_key(t, "ready");
}
/* Rank 0 also drops the world's keys: every other rank read them before connecting. */
static void _dm_tcp_forget_addr(_dm_tcp* t) {
    char name[32];
    snprintf(name, sizeof(name), "addr/%d", t->base.rank);
    _dm_tcp_forget_key(t, name);
    if (t->base.rank == 0) _dm_tcp_forget_world(t);
}

/* >>tcp lifetime */
static void _dm_tcp_relay_end(_dm_tcp* t, dm_status st);
static void _dm_tcp_free(_dm_tcp* t) {
    dm_allocator a = t->base.allocator;
    int r;
    _dm_tcp_relay_end(t, DM_ERR_ABORTED);
    _dm_shm_watch_stop(&t->seg, &a);    /* it polls the links' sockets */
    _dm_eng_release(&t->lk);    /* links first: they borrow the sockets */
    _dm_tcp_serve_stop(t);
    if (t->lfd >= 0) close(t->lfd);
    if (t->rfd >= 0) close(t->rfd);
    _dm_free(&a, t->want);
    if (t->fds)
        for (r = 0; r < t->base.size * t->nsock; r++)
            if (t->fds[r] >= 0) close(t->fds[r]);
    dm_store_destroy(t->rdv);
    if (t->own_store) dm_store_destroy(t->store);
#if defined(DISTMESH_CUDA)
    _dm_tcp_cuda_release(t);
#endif
    _dm_free(&a, t->fds);
    if (t->hs_nonces) memset(t->hs_nonces, 0, 65 * (size_t)t->base.size);
    _dm_free(&a, t->hs_nonces);
    _dm_free(&a, t->host_of);
    _dm_free(&a, t->addrs);
    _dm_free(&a, t->raddrs);
    _dm_shm_unmap(&t->seg);
    _dm_free(&a, t);
}
static void _dm_tcp_destroy(dm_collective* c) { _dm_tcp_free((_dm_tcp*)c); }

_DM_COLD_END
/* >>tcp slots  The vtable's own entries; the collectives are the core's (distmesh.h,
   >>entry points: _dm_coll_*, over this group's engine, c->core->eng), wrapped by the CUDA forms
   for device buffers (>>tcp cuda); the table follows that (>>tcp vtable). */
static dm_status _dm_tcp_check_broken(_dm_tcp* t, const char* op) { return _dm_eng_check_broken(&t->lk, op); }
static const char* _dm_tcp_transport(const dm_collective* c) {
    _dm_tcp* t = (_dm_tcp*)(uintptr_t)c;
    return _dm_eng_transport(&t->lk, t->transport_name, sizeof(t->transport_name));
}
/* Slots defined in their own sections (>>tcp split, >>tcp grow; shrink and interrupt: >>tcp shrink). */
static dm_status _dm_tcp_split(dm_collective* c, int color, int key, dm_collective** out);
static dm_status _dm_tcp_grow(dm_collective* c, int n_new, dm_collective** out);
static dm_status _dm_tcp_shrink(dm_collective* c, const bool* excluded, int flags, dm_collective** out);
static void _dm_tcp_interrupt(dm_collective* c);

/* >>tcp cuda  CUDA device buffers on the TCP backend (DISTMESH_CUDA, implied by DISTMESH_NCCL):
   several processes sharing one GPU can all-reduce device memory (NCCL refuses two ranks on one
   GPU). Device data travels through pinned host segments, never a host copy of the whole
   message. all_reduce pipelines three segments: while the ring reduces segment k, segment k+1
   is copied device-to-host and segment k-1 host-to-device on the object's copy stream. The
   other collectives stage one segment at a time. Host buffers take the plain path unchanged.
   Ordering: staging runs after the work queued on the legacy default stream; work on other
   streams of the caller must be synchronized before the call. The call returns when the
   result is in device memory. */
#if defined(DISTMESH_CUDA)
enum { _DM_TCP_CUDA_SEGMENT = 4 << 20 };    /* bytes per pinned segment */

static dm_status _dm_tcp_cuda_fail(_dm_tcp* t, cudaError_t e, const char* what) {
    return _DM_FAIL(&t->base, DM_ERR_CUDA, "tcp: %s #%llu: CUDA staging failed (%s)", what,
                    (unsigned long long)t->base.seq, cudaGetErrorString(e));
}
/* The pinned segments (nbuf x seg bytes), copy stream and events, made on first use and kept. */
static dm_status _dm_tcp_cuda_ready(_dm_tcp* t, size_t bytes, const char* what) {
    cudaError_t e = cudaSuccess;
    int i;
    if (!t->cuda_stream) {
        /* A blocking stream: its copies wait for work the caller queued on the legacy default
           stream (cudaMemcpy and friends), so staged reads see the caller's latest data. */
        e = cudaStreamCreate((cudaStream_t*)&t->cuda_stream);
        for (i = 0; i < 3 && e == cudaSuccess; i++)
            e = cudaEventCreateWithFlags((cudaEvent_t*)&t->cuda_events[i], cudaEventDisableTiming);
        if (e != cudaSuccess) return _dm_tcp_cuda_fail(t, e, what);
    }
    if (t->cuda_pinned_bytes < bytes) {
        if (t->cuda_pinned) cudaFreeHost(t->cuda_pinned);
        t->cuda_pinned = NULL;
        t->cuda_pinned_bytes = 0;
        e = cudaMallocHost(&t->cuda_pinned, bytes);
        if (e != cudaSuccess) return _dm_tcp_cuda_fail(t, e, what);
        t->cuda_pinned_bytes = bytes;
    }
    return DM_OK;
}
static void _dm_tcp_cuda_release(_dm_tcp* t) {
    int i;
    if (t->cuda_pinned) cudaFreeHost(t->cuda_pinned);
    for (i = 0; i < 3; i++) if (t->cuda_events[i]) cudaEventDestroy((cudaEvent_t)t->cuda_events[i]);
    if (t->cuda_stream) cudaStreamDestroy((cudaStream_t)t->cuda_stream);
}
static dm_status _dm_tcp_cuda_sync(_dm_tcp* t, const char* what) {
    cudaError_t e = cudaStreamSynchronize((cudaStream_t)t->cuda_stream);
    return e == cudaSuccess ? DM_OK : _dm_tcp_cuda_fail(t, e, what);
}
static size_t _dm_tcp_cuda_seg_elems(dm_dtype dtype, int parts) {
    size_t n = _DM_TCP_CUDA_SEGMENT / dm_dtype_size(dtype) / (size_t)parts;
    return n ? n : 1;
}

static dm_status _dm_tcp_cuda_all_reduce(dm_collective* c, const void* send, void* recv, size_t count,
                                         dm_dtype dtype, dm_reduce_op op) {
    _dm_tcp* t = (_dm_tcp*)c;
    size_t es = dm_dtype_size(dtype), seg = _dm_tcp_cuda_seg_elems(dtype, 1), nseg, k;
    cudaStream_t s;
    unsigned char* pin;
    if (!_dm_cuda_is_device(send) && !_dm_cuda_is_device(recv))
        return _dm_coll_all_reduce(c, send, recv, count, dtype, op);
    _DM_TRY(_dm_tcp_check_broken(t, "all_reduce"));
    _DM_TRY(_dm_tcp_cuda_ready(t, 3 * seg * es, "all_reduce"));
    s = (cudaStream_t)t->cuda_stream;
    pin = (unsigned char*)t->cuda_pinned;
    nseg = (count + seg - 1) / seg;
    if (nseg == 0) return _dm_coll_all_reduce(c, pin, pin, 0, dtype, op);
    /* Buffer k % 3 holds segment k. A device-to-host copy into buffer b is queued after the
       host-to-device copy that last read b, so one stream keeps them ordered. */
    cudaMemcpyAsync(pin, send, (count < seg ? count : seg) * es, cudaMemcpyDefault, s);
    cudaEventRecord((cudaEvent_t)t->cuda_events[0], s);
    for (k = 0; k < nseg; k++) {
        size_t off = k * seg, len = count - off < seg ? count - off : seg;
        unsigned char* cur = pin + (k % 3) * seg * es;
        dm_status st;
        if (k + 1 < nseg) {
            size_t off1 = off + seg, len1 = count - off1 < seg ? count - off1 : seg;
            cudaMemcpyAsync(pin + ((k + 1) % 3) * seg * es, (const unsigned char*)send + off1 * es, len1 * es,
                            cudaMemcpyDefault, s);
            cudaEventRecord((cudaEvent_t)t->cuda_events[(k + 1) % 3], s);
        }
        if (cudaEventSynchronize((cudaEvent_t)t->cuda_events[k % 3]) != cudaSuccess)
            return _dm_tcp_cuda_fail(t, cudaGetLastError(), "all_reduce");
        st = _dm_coll_all_reduce(c, cur, cur, len, dtype, op);
        if (st != DM_OK) { cudaStreamSynchronize(s); return st; }
        cudaMemcpyAsync((unsigned char*)recv + off * es, cur, len * es, cudaMemcpyDefault, s);
    }
    return _dm_tcp_cuda_sync(t, "all_reduce");
}

/* all_gather in segments: our piece of each segment up, every rank's piece down. */
static dm_status _dm_tcp_cuda_all_gather_to_list(dm_collective* c, const void* send, void* const* recvs,
                                                 size_t count, dm_dtype dtype) {
    _dm_tcp* t = (_dm_tcp*)c;
    int r, n = c->size, any = _dm_cuda_is_device(send);
    size_t es = dm_dtype_size(dtype), seg = _dm_tcp_cuda_seg_elems(dtype, n + 1), off;
    unsigned char* pin;
    void** lists;
    dm_status st = DM_OK;
    for (r = 0; r < n && !any; r++) any = _dm_cuda_is_device(recvs[r]);
    if (!any) return _dm_coll_all_gather_to_list(c, send, recvs, count, dtype);
    _DM_TRY(_dm_tcp_check_broken(t, "all_gather"));
    _DM_TRY(_dm_tcp_cuda_ready(t, (size_t)(n + 1) * seg * es, "all_gather"));
    pin = (unsigned char*)t->cuda_pinned;
    lists = (void**)_dm_malloc(&c->allocator, sizeof(void*) * (size_t)n);
    if (!lists) return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "tcp: all_gather: out of memory");
    for (r = 0; r < n; r++) lists[r] = pin + (size_t)(r + 1) * seg * es;
    for (off = 0; off < count && st == DM_OK; off += seg) {
        size_t len = count - off < seg ? count - off : seg;
        cudaMemcpyAsync(pin, (const unsigned char*)send + off * es, len * es, cudaMemcpyDefault,
                        (cudaStream_t)t->cuda_stream);
        st = _dm_tcp_cuda_sync(t, "all_gather");
        if (st == DM_OK) st = _dm_coll_all_gather_to_list(c, pin, (void* const*)lists, len, dtype);
        for (r = 0; r < n && st == DM_OK; r++)
            cudaMemcpyAsync((unsigned char*)recvs[r] + off * es, lists[r], len * es, cudaMemcpyDefault,
                            (cudaStream_t)t->cuda_stream);
        if (st == DM_OK) st = _dm_tcp_cuda_sync(t, "all_gather");
    }
    if (count == 0) st = _dm_coll_all_gather_to_list(c, send, recvs, 0, dtype);
    _dm_free(&c->allocator, lists);
    return st;
}
static dm_status _dm_tcp_cuda_all_gather(dm_collective* c, const void* send, void* recv, size_t count,
                                         dm_dtype dtype) {
    size_t block = count * dm_dtype_size(dtype);
    void** lists;
    dm_status st;
    int r;
    if (!_dm_cuda_is_device(send) && !_dm_cuda_is_device(recv))
        return _dm_coll_all_gather(c, send, recv, count, dtype);
    lists = (void**)_dm_malloc(&c->allocator, sizeof(void*) * (size_t)c->size);
    if (!lists) return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "tcp: all_gather: out of memory");
    for (r = 0; r < c->size; r++) lists[r] = (unsigned char*)recv + (size_t)r * block;
    st = _dm_tcp_cuda_all_gather_to_list(c, send, (void* const*)lists, count, dtype);
    _dm_free(&c->allocator, lists);
    return st;
}

/* reduce_scatter in segments: piece off of every rank's block up, the reduced piece down. */
static dm_status _dm_tcp_cuda_reduce_scatter(dm_collective* c, const void* send, void* recv, size_t count,
                                             dm_dtype dtype, dm_reduce_op op) {
    _dm_tcp* t = (_dm_tcp*)c;
    int r, n = c->size;
    size_t es = dm_dtype_size(dtype), seg = _dm_tcp_cuda_seg_elems(dtype, n + 1), off;
    unsigned char* pin;
    dm_status st = DM_OK;
    if (!_dm_cuda_is_device(send) && !_dm_cuda_is_device(recv))
        return _dm_coll_reduce_scatter(c, send, recv, count, dtype, op);
    _DM_TRY(_dm_tcp_check_broken(t, "reduce_scatter"));
    _DM_TRY(_dm_tcp_cuda_ready(t, (size_t)(n + 1) * seg * es, "reduce_scatter"));
    pin = (unsigned char*)t->cuda_pinned;
    for (off = 0; off < count && st == DM_OK; off += seg) {
        size_t len = count - off < seg ? count - off : seg;
        unsigned char* out = pin + (size_t)n * len * es;
        for (r = 0; r < n; r++)
            cudaMemcpyAsync(pin + (size_t)r * len * es, (const unsigned char*)send + ((size_t)r * count + off) * es,
                            len * es, cudaMemcpyDefault, (cudaStream_t)t->cuda_stream);
        st = _dm_tcp_cuda_sync(t, "reduce_scatter");
        if (st == DM_OK) st = _dm_coll_reduce_scatter(c, pin, out, len, dtype, op);
        if (st == DM_OK) {
            cudaMemcpyAsync((unsigned char*)recv + off * es, out, len * es, cudaMemcpyDefault,
                            (cudaStream_t)t->cuda_stream);
            st = _dm_tcp_cuda_sync(t, "reduce_scatter");
        }
    }
    if (count == 0) st = _dm_coll_reduce_scatter(c, send, recv, 0, dtype, op);
    return st;
}

static dm_status _dm_tcp_cuda_broadcast(dm_collective* c, void* buf, size_t count, dm_dtype dtype, int root) {
    _dm_tcp* t = (_dm_tcp*)c;
    size_t es = dm_dtype_size(dtype), seg = _dm_tcp_cuda_seg_elems(dtype, 1), off;
    unsigned char* pin;
    dm_status st = DM_OK;
    if (!_dm_cuda_is_device(buf)) return _dm_coll_broadcast(c, buf, count, dtype, root);
    _DM_TRY(_dm_tcp_check_broken(t, "broadcast"));
    _DM_TRY(_dm_tcp_cuda_ready(t, seg * es, "broadcast"));
    pin = (unsigned char*)t->cuda_pinned;
    for (off = 0; off < count && st == DM_OK; off += seg) {
        size_t len = count - off < seg ? count - off : seg;
        if (c->rank == root) {
            cudaMemcpyAsync(pin, (unsigned char*)buf + off * es, len * es, cudaMemcpyDefault, (cudaStream_t)t->cuda_stream);
            st = _dm_tcp_cuda_sync(t, "broadcast");
        }
        if (st == DM_OK) st = _dm_coll_broadcast(c, pin, len, dtype, root);
        if (st == DM_OK && c->rank != root) {
            cudaMemcpyAsync((unsigned char*)buf + off * es, pin, len * es, cudaMemcpyDefault, (cudaStream_t)t->cuda_stream);
            st = _dm_tcp_cuda_sync(t, "broadcast");
        }
    }
    if (count == 0) st = _dm_coll_broadcast(c, buf, 0, dtype, root);
    return st;
}
#define _DM_TCP_SLOT(name) _dm_tcp_cuda_##name
#else
#define _DM_TCP_SLOT(name) _dm_coll_##name
#endif

/* >>tcp vtable  The table this backend fills (distmesh.h, >>backend-authors). */
static const dm_collective_vtable _dm_tcp_vtable = {
    sizeof(dm_collective_vtable),    /* struct_size */
    DM_COLLECTIVE_VTABLE_VERSION,    /* version */
    "tcp",                           /* name */
    _dm_tcp_destroy,                 /* destroy */
    _dm_coll_barrier,                /* barrier: dissemination */
    _DM_TCP_SLOT(all_reduce),        /* all_reduce: recursive doubling / ring */
    _DM_TCP_SLOT(all_gather),        /* all_gather: ring */
    _DM_TCP_SLOT(all_gather_to_list),/* all_gather_to_list: ring into the caller's buffers */
    _DM_TCP_SLOT(reduce_scatter),    /* reduce_scatter: ring */
    _DM_TCP_SLOT(broadcast),         /* broadcast: pipelined chain */
    _dm_tcp_split,                   /* split */
    NULL,                            /* native_handle: none */
    NULL,                            /* synchronize: nothing queued */
    _dm_tcp_transport,               /* transport */
    _dm_coll_reduce,                 /* reduce: recursive doubling / ring reduce-scatter + blocks to root */
    _dm_coll_gather,                 /* gather: root meets each rank */
    _dm_coll_scatter,                /* scatter: root meets each rank */
    _dm_coll_all_to_all_v,           /* all_to_all_v: pairwise exchange */
    _dm_coll_send,                   /* send: eager, read by the receiver's inbox */
    _dm_coll_recv,                   /* recv */
    NULL,                            /* start */
    NULL,                            /* finish */
    _dm_tcp_shrink,                  /* shrink */
    _dm_tcp_grow,                    /* grow: newcomers join through the store (>>tcp grow) */
    _dm_tcp_interrupt,               /* interrupt */
    _dm_coll_recv_any,               /* recv_any: every connected peer's inbox, connections served */
};

_DM_COLD_BEGIN
/* >>tcp setup  Everything the rendezvous needs, resolved from the desc and the environment:
   what a create, split or join hands the build. */
typedef struct _dm_tcp_setup {
    int rank, size, timeout_ms;
    struct dm_store* store;
    bool own_store;
    const char* prefix;
    const char* ifname;
    const char* token;
    const char* route_host;     /* host to route toward when no interface is named */
    const struct sockaddr_storage* bind_sa; /* listen here (split), else pick by ifname/route */
    bool once;                  /* the prefix is never used again (split): no generation key */
    size_t chunk_bytes;
    int nsock;                  /* sockets per peer on another host, 1.._DM_TCP_MAX_SOCKETS */
    int transport;              /* _DM_TCP_AUTO, _DM_TCP_SHM, _DM_TCP_SOCKETS */
    bool encrypt;               /* seal the links to other hosts (>>tcp seal) */
    const char* site;           /* this rank's site, NULL: one site (>>tcp hosts) */
    dm_logger logger;
    dm_allocator allocator;
    bool env_local;             /* the launcher gave env_local_rank / env_local_size (they win) */
    int env_local_rank, env_local_size;
    const struct _dm_tcp* parent; /* split: the group being split (its connections are watched) */
    const int* members;         /* split: the parent rank of each new rank */
    char* err;                  /* split: gets the failure's message (err_cap bytes), or NULL */
    size_t err_cap;
    /* split: the members' addresses, exchanged over the parent (no store needed), and this
       rank's listeners already open on them (owned by the build from its start) */
    const char (*addrs)[64], (*raddrs)[64];
    int lfd, rfd;
    int relay;                  /* _DM_TCP_DIRECT, _LEADER or _LOCAL: how this rank meets the store
                                   while the group is built (>>tcp relay) */
    int relay_expect;           /* a leader: its host's other ranks */
} _dm_tcp_setup;

/* The launcher's LOCAL_RANK / LOCAL_WORLD_SIZE win over the host-name grouping; a disagreement
   is worth a warning (a launcher that packs ranks differently than the host names say). */
static void _dm_tcp_local_from_launcher(_dm_tcp* t, const _dm_tcp_setup* s) {
    if (!s->env_local) return;
    if (s->env_local_rank != t->base.local_rank || s->env_local_size != t->base.local_size)
        _DM_LOG(&t->base.logger, DM_LOG_WARN, "tcp: the launcher says local rank %d of %d, host names say %d of %d "
                "(host \"%s\"); using the launcher's", s->env_local_rank, s->env_local_size, t->base.local_rank,
                t->base.local_size, t->base.node_name);
    t->base.local_rank = s->env_local_rank;
    t->base.local_size = s->env_local_size;
}

/* >>tcp hosts  Which ranks share a host: a host identity (the core's _dm_host_identity: host
   name and kernel boot id, or DISTMESH_TEST_HOST_ID, which tests use to simulate hosts)
   gathered from every rank of the group, never the launcher's LOCAL_WORLD_SIZE: a sub-group
   decides per pair. The ring visits host by host, as NCCL orders its rings. */

/* Every rank must have been given the same sockets per peer (at `at` in each gathered record);
   all ranks see the same records, so all fail alike. */
static dm_status _dm_tcp_same_sockets(_dm_tcp* t, const unsigned char* all, size_t rec, size_t at) {
    int j, lo = t->nsock, hi = t->nsock;
    for (j = 0; j < t->base.size; j++) {
        int n = (int)_dm_tcp_get32(all + (size_t)j * rec + at);
        if (n < lo) lo = n;
        if (n > hi) hi = n;
    }
    if (lo == hi) return DM_OK;
    return _DM_FAIL(&t->base, DM_ERR_INVALID_ARG, "tcp: the ranks were given different socket counts per peer (%d to "
                    "%d; this rank %d): give every rank the same DISTMESH_SOCKETS_PER_PEER or desc.sockets_per_peer",
                    lo, hi, t->nsock);
}

/* Every rank of a host must be at the same site (host_of: rank -> the lowest rank on its host,
   then rank -> site at host_of + size; the records hold the identity at id_at and the site name
   at site_at): each rank against its host's lowest rank. All ranks see the same records, so all
   fail alike. */
static dm_status _dm_tcp_one_site_per_host(_dm_tcp* t, const unsigned char* all, size_t rec, size_t id_at,
                                           size_t site_at, const int* host_of) {
    int W = t->base.size, j;
    for (j = 0; j < W; j++) {
        int k = host_of[j];
        if (host_of[W + k] != host_of[W + j])
            return _DM_FAIL(&t->base, DM_ERR_INVALID_ARG, "tcp: ranks %d and %d are on one host (\"%.60s\") but were "
                            "given the sites \"%.40s\" and \"%.40s\" (DISTMESH_SITE, desc.site): a host is at one site",
                            k, j, (const char*)all + (size_t)j * rec + id_at, (const char*)all + (size_t)k * rec + site_at,
                            (const char*)all + (size_t)j * rec + site_at);
    }
    return DM_OK;
}

/* One record per rank over the bootstrap ring (the flat ring's all-gather, which needs only
   the ring neighbours while the layout is still one host): its published address and its host
   identity and sockets per peer. Fills every rank's address (lazy connections dial them), the node name, local rank
   and the layout. */
static dm_status _dm_tcp_hosts(_dm_tcp* t, const _dm_tcp_setup* s) {
    /* + sockets per peer, + the recovery listener (>>tcp shrink), + the site */
    enum { NAME = sizeof(((dm_collective*)0)->node_name), ID = 96, ADDR = 64, SITE = 64,
           REC = ADDR + NAME + ID + 4 + ADDR + SITE };
    int W = t->base.size, j, L = 0, me = 0, unused = 0;
    unsigned char mine[REC];
    unsigned char* all = (unsigned char*)_dm_calloc(&t->base.allocator, (size_t)W * REC);
    int* host_of = (int*)_dm_malloc(&t->base.allocator, sizeof(int) * 2 * (size_t)W);
    dm_status st;
    if (!all || !host_of) {
        st = _DM_FAIL(&t->base, DM_ERR_OUT_OF_MEMORY, "tcp: out of memory");
        goto done;
    }
    memset(mine, 0, sizeof(mine));
    _dm_copy_name((char*)mine, ADDR, t->addrs[t->base.rank]);
    _dm_host_identity((char*)mine + ADDR, NAME, (char*)mine + ADDR + NAME, ID);
    _dm_tcp_put32(mine + ADDR + NAME + ID, (uint32_t)t->nsock);
    _dm_copy_name((char*)mine + ADDR + NAME + ID + 4, ADDR, t->raddrs[t->base.rank]);
    _dm_copy_name((char*)mine + REC - SITE, SITE, t->site);
    st = _dm_coll_all_gather(&t->base, mine, all, REC, DM_UINT8);
    if (st != DM_OK) goto done;
    if ((st = _dm_tcp_same_sockets(t, all, REC, ADDR + NAME + ID)) != DM_OK) goto done;
    for (j = 0; j < W; j++) {
        unsigned char* rec = all + (size_t)j * REC;
        rec[ADDR - 1] = 0;
        rec[ADDR + NAME - 1] = 0;
        rec[ADDR + NAME + ID - 1] = 0;
        rec[REC - SITE - 1] = 0;
        rec[REC - 1] = 0;
        if (j != t->base.rank) _dm_copy_name(t->addrs[j], 64, (const char*)rec);
        if (j != t->base.rank) _dm_copy_name(t->raddrs[j], 64, (const char*)rec + ADDR + NAME + ID + 4);
        if (t->lk.links[j]) _dm_copy_name(t->lk.links[j]->where, sizeof(t->lk.links[j]->where), t->addrs[j]);
    }
    if (!_dm_hosts_from_ids(&t->base.allocator, all + ADDR + NAME, REC, W, t->base.rank, host_of, &me, &L) ||
        !_dm_hosts_from_ids(&t->base.allocator, all + REC - SITE, REC, W, t->base.rank, host_of + W, &unused, &unused)) {
        st = _DM_FAIL(&t->base, DM_ERR_OUT_OF_MEMORY, "tcp: out of memory");
        goto done;
    }
    if ((st = _dm_tcp_one_site_per_host(t, all, REC, ADDR + NAME, REC - SITE, host_of)) != DM_OK) goto done;
    _dm_copy_name(t->base.node_name, sizeof(t->base.node_name), (const char*)mine + ADDR);
    t->base.local_rank = me;
    t->base.local_size = L;
    _dm_tcp_local_from_launcher(t, s);
    _dm_eng_set_layout(&t->lk, host_of, host_of + W);
    _dm_eng_set_policy(&t->lk, L);
    _dm_free(&t->base.allocator, t->host_of);
    t->host_of = host_of;       /* kept: _dm_tcp_more_sockets */
    host_of = NULL;
done:
    _dm_free(&t->base.allocator, all);
    _dm_free(&t->base.allocator, host_of);
    return st;
}

/* Shared memory among this rank's host (the layout's members of its host, in rank order). */
static dm_status _dm_tcp_shm_for_host(_dm_tcp* t) {
    const _dm_layout* y = &t->lk.lay;
    int h = y->host_of[t->base.rank];
    return _dm_tcp_shm_setup(t, y->members + y->start[h], y->start[h + 1] - y->start[h], y->local[t->base.rank]);
}

/* Connects this rank to the peers in t->want: down to the lower ones, then waits until the
   higher ones are in (they connect here), serving the listener all the while. */
static dm_status _dm_tcp_connect_wanted(_dm_tcp* t, int64_t deadline) {
    int j;
    for (j = 0; j < t->base.rank; j++)
        if (t->want[j]) _DM_TRY(_dm_tcp_link_down(t, j, deadline));
    t->expect = t->want;
    return _dm_tcp_accept_peers(t, t->lfd, t->group, deadline);
}

/* >>tcp relay  Rendezvous through one store connection per host. A rank that knows its place on
   its host from the launcher (LOCAL_RANK and LOCAL_WORLD_SIZE given for this rank and world,
   _dm_tcp_setup.env_local; more than one rank on the host) does not meet the store itself while
   create builds the group: its host's leader, LOCAL_RANK 0, does it for the host's ranks. The
   store host then holds a connection per host, not per rank (at 256 ranks on 8 hosts, 8
   instead of 256), and takes a few requests per host instead of several per rank.
   Finding the leader, before the store: a Unix-domain socket in the abstract namespace (nothing
   on disk; it goes with the process), named from a hash of the store's address, the group's key
   prefix, the host identity (>>tcp hosts) and the user id. The leader listens there before it
   touches the store (its own store handle connects at its first request), and the others
   connect, retrying while it starts; once connected, a rank waits for its leader's challenge
   until its deadline, however late the store host starts. Two leaders for one name (two
   launcher groups on one host identity): the second's bind fails with EADDRINUSE and it joins
   the first as one of its ranks. A rank that finds no leader within _dm_tcp_relay_patience
   (10 s, or a third of its timeout) rendezvouses directly, with a warning.
   What passes on one connection per rank, closed once answered:
     rank -> leader   hello      "DMRH", version 1, nonce[32]                           40 B
     leader -> rank   challenge  "DMRC", status, leader's rank, nonce[32], proof[32]    76 B
     rank -> leader   record     proof[32], rank, world size, listener address[64]    104 B
     leader -> rank   answer     status, prefix length, addresses, message length (10 B),
                                 the group's key prefix, the addresses the rank dials first
                                 (rank i32 + "host:port"[64] each: its ring neighbours below it,
                                 >>tcp sparse), the leader's message when it failed
   With DISTMESH_TOKEN each side proves the token over the other's fresh nonce (HMAC-SHA256 as
   the store and the hello do; labels "distmesh relay v1 leader" / "... rank"; the rank's proof
   covers its record): every hop of the rendezvous is authenticated. Without a token the proofs
   are zero and each end checks the other's user id (SO_PEERCRED; abstract sockets have no
   file permissions): a leader of another user answers status 1 and the rank, like one whose
   leader has another user id, rendezvouses directly.
   The leader publishes its host's records in batches as they arrive: an ADD of the generation
   counter by the batch's size (every rank still counts once, so a cycle still adds W and every
   add of it gives the same generation, >>tcp build), one MULTI_SET of their addresses and an
   ADD of the arrival count (>>tcp arrival). It
   checks each rank's world size against its own (its own COMPARE_SET speaks for the host),
   waits for the world as a direct rank does (>>tcp arrival: the same slices, logs and
   messages; short slices while its host's ranks are still arriving, serving them between),
   then fetches in one MULTI_GET the addresses its ranks dial that it does not hold (the host
   block's neighbour below, rank 0 for the last rank) and answers each. After the all-gather it
   deletes the host's address keys (>>tcp keys: every reader has connected by then). A leader
   that fails (the store, its deadline, a missing rank, a store host out of descriptors)
   answers every waiting rank of its host with its status and message, so the host reports one
   cause at once; a leader that dies gives them EOF: DM_ERR_PEER_LOST naming it, at once.
   After create no rank holds a store connection: one that went through its leader never made
   one, and the others close theirs (_dm_store_idle, at the end of >>tcp build). A handle on
   the store connects again when next used (dm_store's lazy open, >>store object), for what is rare
   after create: posting or reading an abort notice (one bounded round trip, >>tcp notices;
   same-host ranks learn a cause from their host's abort word first) and member rank 0's seats
   in dm_grow. A grow's rendezvous goes through leaders again (the group's lowest rank on each
   host, which the layout names; newcomers rendezvous directly); a split needs no store. So the
   death of a leader after create changes nothing for its host's other ranks: nothing of theirs
   goes through it.
   Direct, as before: a rank without the launcher's local rank (a by-hand launch), one rank per
   host, a file store (no connections to save), a join. TORCHELASTIC_USE_AGENT_STORE changes
   nothing here: the agent's store holds a connection per host. */
#define _DM_TCP_RLY_HELLO_MAGIC 0x48524d44u   /* "DMRH" */
#define _DM_TCP_RLY_CHAL_MAGIC 0x43524d44u    /* "DMRC" */
#define _DM_TCP_RLY_VERSION 1u
#define _DM_TCP_RLY_HELLO 40
#define _DM_TCP_RLY_CHAL 76
#define _DM_TCP_RLY_RECORD 104
#define _DM_TCP_RLY_HEAD 10
#define _DM_TCP_RLY_MAX 4096            /* a leader's ranks at most */
enum { _DM_TCP_DIRECT = 0, _DM_TCP_LEADER, _DM_TCP_LOCAL };
enum { _DM_TCP_RLY_HELLO_WAIT = 0, _DM_TCP_RLY_RECORD_WAIT, _DM_TCP_RLY_HELD, _DM_TCP_RLY_DONE };

/* One rank of the leader's host, from its connection to its answer. */
typedef struct _dm_tcp_rly_peer {
    int fd, state;              /* _DM_TCP_RLY_*: what is expected of it next */
    size_t off;                 /* bytes of the current message read */
    int64_t deadline;           /* its handshake's own (_DM_TCP_HS_MS from its accept) */
    int rank, world;
    bool published;
    unsigned char nonce_c[32], nonce_s[32], buf[_DM_TCP_RLY_RECORD];
    char addr[64];
} _dm_tcp_rly_peer;
typedef struct _dm_tcp_relay {
    int role;                   /* _DM_TCP_LEADER or _DM_TCP_LOCAL (DIRECT: no relay object) */
    int lfd;                    /* the leader's listener, or -1 */
    struct sockaddr_un sa;      /* the abstract name */
    socklen_t salen;
    char shown[48];             /* the name as messages show it */
    int leader;                 /* a local rank: its leader's rank (-1 before it said) */
    int expect;                 /* the leader: its host's ranks still expected to connect */
    int n, cap;
    _dm_tcp_rly_peer* peers;
} _dm_tcp_relay;

/* The ranks below r that r dials first (its rank-order ring neighbours, >>tcp sparse). */
static int _dm_tcp_ring_below(int r, int W, int out[2]) {
    int n = 0, a = (r + W - 1) % W, b = (r + 1) % W;
    if (W < 2) return 0;
    if (a < r) out[n++] = a;
    if (b < r && b != a) out[n++] = b;
    return n;
}
/* How long a rank looks for its leader before it rendezvouses directly. */
static int64_t _dm_tcp_relay_patience(const _dm_tcp* t) {
    int ms = t->base.timeout_ms;
    return ms <= 0 || ms > 30000 ? 10000 : ms / 3 > 1000 ? ms / 3 : 1000;
}
/* The relay's name: hash(store address, prefix, host identity, user id). */
static bool _dm_tcp_relay_name(_dm_tcp_relay* r, const _dm_tcp_setup* s) {
    char host[64], id[96], uid[48];
    const char* where = _dm_store_where(s->store);
    uint64_t h1, h2;
    int n;
    if (!where) return false;
    _dm_host_identity(host, sizeof(host), id, sizeof(id));
    snprintf(uid, sizeof(uid), "uid %lu", (unsigned long)geteuid());
    h1 = _dm_tcp_hash(_dm_tcp_hash(7, where, s->prefix), id, uid);
    h2 = _dm_tcp_hash(h1, where, id);
    memset(&r->sa, 0, sizeof(r->sa));
    r->sa.sun_family = AF_UNIX;
    n = snprintf(r->sa.sun_path + 1, sizeof(r->sa.sun_path) - 1, "distmesh-relay/%016llx%016llx",
                 (unsigned long long)h1, (unsigned long long)h2);
    r->salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
    snprintf(r->shown, sizeof(r->shown), "@%s", r->sa.sun_path + 1);
    return true;
}
/* The other end's user id is this process's (a unix socket's credentials). */
static bool _dm_tcp_relay_same_user(int fd) {
    _dm_ucred cr;
    socklen_t l = sizeof(cr);
    return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &l) == 0 && cr.uid == geteuid();
}
/* The leader's proof (over both nonces) or the rank's (over both and its record), zero without
   a token. */
static void _dm_tcp_relay_proof(const _dm_tcp* t, bool leader, const unsigned char* nc, const unsigned char* ns,
                                const unsigned char* record, unsigned char out[32]) {
    static const char lab_l[] = "distmesh relay v1 leader", lab_r[] = "distmesh relay v1 rank";
    unsigned char msg[sizeof(lab_l) + 64 + 72];
    size_t n;
    memset(out, 0, 32);
    if (!t->token[0]) return;
    if (leader) {
        memcpy(msg, lab_l, sizeof(lab_l));
        memcpy(msg + sizeof(lab_l), nc, 32);
        memcpy(msg + sizeof(lab_l) + 32, ns, 32);
        n = sizeof(lab_l) + 64;
    } else {
        memcpy(msg, lab_r, sizeof(lab_r));
        memcpy(msg + sizeof(lab_r), ns, 32);
        memcpy(msg + sizeof(lab_r) + 32, nc, 32);
        memcpy(msg + sizeof(lab_r) + 64, record, 72);
        n = sizeof(lab_r) + 64 + 72;
    }
    dm_hmac_sha256(t->token, strlen(t->token), msg, n, out);
}
static void _dm_tcp_relay_close_peer(_dm_tcp_rly_peer* p) {
    if (p->fd >= 0) close(p->fd);
    p->fd = -1;
    p->state = _DM_TCP_RLY_DONE;
}
/* The answer to one rank: st and msg, or (DM_OK) the prefix and the addresses it dials first
   from t->addrs. Then its connection closes. */
static void _dm_tcp_relay_answer(_dm_tcp* t, _dm_tcp_rly_peer* p, dm_status st, const char* msg) {
    unsigned char b[_DM_TCP_RLY_HEAD + 512 + 2 * 68 + DM_LAST_ERROR_SIZE];
    size_t np = st == DM_OK ? strlen(t->prefix) : 0, nm = st == DM_OK ? 0 : strnlen(msg, DM_LAST_ERROR_SIZE - 1), off;
    int below[2], nb = st == DM_OK ? _dm_tcp_ring_below(p->rank, t->base.size, below) : 0, k;
    _dm_tcp_put32(b, (uint32_t)(int32_t)st);
    b[4] = (unsigned char)np; b[5] = (unsigned char)(np >> 8);
    b[6] = (unsigned char)nb; b[7] = 0;
    b[8] = (unsigned char)nm; b[9] = (unsigned char)(nm >> 8);
    off = _DM_TCP_RLY_HEAD;
    memcpy(b + off, t->prefix, np);
    off += np;
    for (k = 0; k < nb; k++) {
        _dm_tcp_put32(b + off, (uint32_t)below[k]);
        memcpy(b + off + 4, t->addrs[below[k]], 64);
        off += 68;
    }
    memcpy(b + off, msg, nm);
    off += nm;
    if (_dm_tcp_write_full(p->fd, b, off, _dm_now_ms() + 1000) != 1)
        _DM_LOG(&t->base.logger, DM_LOG_WARN, "tcp: setup: could not answer rank %d at this host's relay (%s)", p->rank,
                strerror(errno));
    _dm_tcp_relay_close_peer(p);
}
/* The leader's end: every rank still owed an answer gets st and this rank's message (st DM_OK:
   nothing is owed any more); then the relay goes. Safe to call twice. */
static void _dm_tcp_relay_end(_dm_tcp* t, dm_status st) {
    _dm_tcp_relay* r = t->relay;
    int i;
    if (!r) return;
    for (i = 0; i < r->n; i++) {
        if (r->peers[i].state == _DM_TCP_RLY_HELD && st != DM_OK)
            _dm_tcp_relay_answer(t, &r->peers[i], st, t->base.last_error);
        _dm_tcp_relay_close_peer(&r->peers[i]);
    }
    if (r->lfd >= 0) close(r->lfd);
    _dm_free(&t->base.allocator, r->peers);
    _dm_free(&t->base.allocator, r);
    t->relay = NULL;
}
/* The leader's listener, before anything else of the rendezvous. A name already taken: this
   rank joins that leader (role LOCAL); no name to take (another store kind) or no socket: the
   rank goes direct. */
static dm_status _dm_tcp_relay_open(_dm_tcp* t, const _dm_tcp_setup* s) {
    _dm_tcp_relay* r;
    if (s->relay == _DM_TCP_DIRECT) return DM_OK;
    r = (_dm_tcp_relay*)_dm_calloc(&t->base.allocator, sizeof(*r));
    if (!r) return _DM_FAIL(&t->base, DM_ERR_OUT_OF_MEMORY, "tcp: out of memory");
    r->lfd = -1;
    r->leader = -1;
    r->role = s->relay;
    r->expect = s->relay_expect;
    if (!_dm_tcp_relay_name(r, s)) { _dm_free(&t->base.allocator, r); return DM_OK; }
    t->relay = r;
    if (r->role != _DM_TCP_LEADER) return DM_OK;
    r->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (r->lfd >= 0 && bind(r->lfd, (struct sockaddr*)&r->sa, r->salen) == 0 && listen(r->lfd, 4096) == 0) {
        _DM_LOG(&t->base.logger, DM_LOG_DEBUG, "tcp: rank %d leads its host's rendezvous at %s", s->rank, r->shown);
        return DM_OK;
    }
    if (r->lfd >= 0 && errno == EADDRINUSE) {     /* another leader here: join it */
        _DM_LOG(&t->base.logger, DM_LOG_DEBUG, "tcp: rank %d: %s is taken; joining that leader", s->rank, r->shown);
        r->role = _DM_TCP_LOCAL;
    } else {
        _DM_LOG(&t->base.logger, DM_LOG_WARN, "tcp: rank %d cannot lead its host's rendezvous at %s (%s); it meets "
                "the store directly", s->rank, r->shown, strerror(errno));
        t->relay = NULL;
    }
    if (r->lfd >= 0) close(r->lfd);
    r->lfd = -1;
    if (!t->relay) _dm_free(&t->base.allocator, r);
    return DM_OK;
}

/* -- the leader -- */
/* Accepts what waits on the listener (the peers array grows as needed). */
static void _dm_tcp_relay_accept(_dm_tcp* t) {
    _dm_tcp_relay* r = t->relay;
    for (;;) {
        int fd = accept4(r->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        _dm_tcp_rly_peer* p;
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                _DM_LOG(&t->base.logger, DM_LOG_WARN, "tcp: setup: the host relay's accept failed (%s)",
                        strerror(errno));
            return;
        }
        if (r->n == r->cap) {
            int cap = r->cap ? 2 * r->cap : 16;
            _dm_tcp_rly_peer* np = cap > _DM_TCP_RLY_MAX ? NULL : (_dm_tcp_rly_peer*)_dm_malloc(
                &t->base.allocator, sizeof(*np) * (size_t)cap);
            if (!np) { close(fd); return; }
            if (r->n) memcpy(np, r->peers, sizeof(*np) * (size_t)r->n);
            _dm_free(&t->base.allocator, r->peers);
            r->peers = np;
            r->cap = cap;
        }
        p = &r->peers[r->n++];
        memset(p, 0, sizeof(*p));
        p->fd = fd;
        p->rank = -1;
        p->deadline = _dm_now_ms() + _DM_TCP_HS_MS;
    }
}
/* The record p sent, checked; DM_OK holds it for publishing, else p is answered why. */
static void _dm_tcp_relay_take(_dm_tcp* t, _dm_tcp_rly_peer* p) {
    _dm_tcp_relay* r = t->relay;
    unsigned char want[32];
    char msg[DM_LAST_ERROR_SIZE];
    int i, W = t->base.size;
    p->rank = (int)_dm_tcp_get32(p->buf + 32);
    p->world = (int)_dm_tcp_get32(p->buf + 36);
    memcpy(p->addr, p->buf + 40, 64);
    p->addr[63] = 0;
    _dm_tcp_relay_proof(t, false, p->nonce_c, p->nonce_s, p->buf + 32, want);
    if (!_dm_st_ct_equal(want, p->buf, 32)) {
        snprintf(msg, sizeof(msg), "tcp: this rank's token proof does not match its host's leader's (rank %d): the "
                 "ranks were given different DISTMESH_TOKENs", t->base.rank);
        _dm_tcp_relay_answer(t, p, DM_ERR_REFUSED, msg);
        return;
    }
    if (p->world != W) {
        snprintf(msg, sizeof(msg), "tcp: world size disagreement: this rank (rank %d) has world size %d, another rank "
                 "of the group (its host's leader, rank %d) has %d (every rank must be given the same WORLD_SIZE / "
                 "launcher size)", p->rank, p->world, t->base.rank, W);
        _dm_tcp_relay_answer(t, p, DM_ERR_INVALID_ARG, msg);
        return;
    }
    for (i = 0; i < r->n; i++)
        if (p->rank == t->base.rank || (&r->peers[i] != p && r->peers[i].rank == p->rank &&
                                        r->peers[i].state == _DM_TCP_RLY_HELD)) break;
    if (p->rank < 0 || p->rank >= W || i < r->n) {
        snprintf(msg, sizeof(msg), "tcp: rank %d is not a rank its host's leader (rank %d) can take: out of 0..%d or "
                 "already there (two processes given the same RANK?)", p->rank, t->base.rank, W - 1);
        _dm_tcp_relay_answer(t, p, DM_ERR_INVALID_ARG, msg);
        return;
    }
    p->state = _DM_TCP_RLY_HELD;
    if (r->expect > 0) r->expect--;
}
/* One step of p's handshake on what it sent so far (nonblocking). */
static void _dm_tcp_relay_step(_dm_tcp* t, _dm_tcp_rly_peer* p) {
    size_t need = p->state == _DM_TCP_RLY_HELLO_WAIT ? _DM_TCP_RLY_HELLO : _DM_TCP_RLY_RECORD;
    if (p->state != _DM_TCP_RLY_HELLO_WAIT && p->state != _DM_TCP_RLY_RECORD_WAIT) return;
    while (p->off < need) {
        ssize_t k = recv(p->fd, p->buf + p->off, need - p->off, MSG_DONTWAIT);
        if (k > 0) { p->off += (size_t)k; continue; }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (_dm_now_ms() > p->deadline) _dm_tcp_relay_close_peer(p);   /* silent for too long */
            return;
        }
        _dm_tcp_relay_close_peer(p);    /* gone before it finished */
        return;
    }
    p->off = 0;
    if (p->state == _DM_TCP_RLY_RECORD_WAIT) { _dm_tcp_relay_take(t, p); return; }
    {   /* the hello: answer the challenge (a fresh socket's buffer takes it whole) */
        unsigned char c[_DM_TCP_RLY_CHAL];
        uint32_t status = t->token[0] || _dm_tcp_relay_same_user(p->fd) ? 0u : 1u;
        if (_dm_tcp_get32(p->buf) != _DM_TCP_RLY_HELLO_MAGIC || _dm_tcp_get32(p->buf + 4) != _DM_TCP_RLY_VERSION) {
            _dm_tcp_relay_close_peer(p);
            return;
        }
        memcpy(p->nonce_c, p->buf + 8, 32);
        _dm_st_random(p->nonce_s, 32);
        _dm_tcp_put32(c, _DM_TCP_RLY_CHAL_MAGIC);
        _dm_tcp_put32(c + 4, status);
        _dm_tcp_put32(c + 8, (uint32_t)t->base.rank);
        memcpy(c + 12, p->nonce_s, 32);
        _dm_tcp_relay_proof(t, true, p->nonce_c, p->nonce_s, NULL, c + 44);
        if (send(p->fd, c, sizeof(c), MSG_DONTWAIT | MSG_NOSIGNAL) != (ssize_t)sizeof(c) || status != 0) {
            _dm_tcp_relay_close_peer(p);
            return;
        }
        p->state = _DM_TCP_RLY_RECORD_WAIT;
    }
}
static dm_status _dm_tcp_arrive(_dm_tcp* t, int n);
/* Frees a list of n store keys (each allocated, NULL entries allowed) and the list itself. */
static void _dm_tcp_keys_free(_dm_tcp* t, char** keys, int n) {
    int i;
    if (keys)
        for (i = 0; i < n; i++) _dm_free(&t->base.allocator, keys[i]);
    _dm_free(&t->base.allocator, keys);
}
/* Publishes the records held and not yet published: ADD of the generation counter by their
   number (not for a prefix used once), one MULTI_SET of their addresses. */
static dm_status _dm_tcp_relay_publish(_dm_tcp* t, const _dm_tcp_setup* s) {
    _dm_tcp_relay* r = t->relay;
    char** keys = NULL;
    const void** vals = NULL;
    size_t* sizes = NULL;
    int i, n = 0, k = 0;
    dm_status st = DM_OK;
    dm_store* g = _dm_tcp_st(t);
    for (i = 0; i < r->n; i++) n += r->peers[i].state == _DM_TCP_RLY_HELD && !r->peers[i].published;
    if (n == 0) return DM_OK;
    if (!s->once) {
        char key[600], want[512];
        int64_t gen = 0;
        snprintf(key, sizeof(key), "%sgen", t->user_prefix);
        if ((st = dm_store_add(g, key, n, &gen)) != DM_OK) return _dm_tcp_store_fail(t, st, "add", key);
        snprintf(want, sizeof(want), "%.480sg%lld/", t->user_prefix, (long long)((gen - 1) / t->base.size));
        if (strcmp(want, t->prefix) != 0)
            return _DM_FAIL(&t->base, DM_ERR_PROTOCOL, "tcp: setup: the generation counter \"%s\" moved to %lld while "
                            "this host's ranks joined (another program uses the prefix \"%s\"?)", key, (long long)gen,
                            t->user_prefix);
    }
    keys = (char**)_dm_calloc(&t->base.allocator, (size_t)n * sizeof(char*));
    vals = (const void**)_dm_calloc(&t->base.allocator, (size_t)n * sizeof(void*));
    sizes = (size_t*)_dm_calloc(&t->base.allocator, (size_t)n * sizeof(size_t));
    if (!keys || !vals || !sizes) { st = _DM_FAIL(&t->base, DM_ERR_OUT_OF_MEMORY, "tcp: out of memory"); goto done; }
    for (i = 0; i < r->n; i++) {
        _dm_tcp_rly_peer* p = &r->peers[i];
        if (p->state != _DM_TCP_RLY_HELD || p->published) continue;
        if (!(keys[k] = (char*)_dm_malloc(&t->base.allocator, strlen(t->prefix) + 24))) {
            st = _DM_FAIL(&t->base, DM_ERR_OUT_OF_MEMORY, "tcp: out of memory");
            goto done;
        }
        sprintf(keys[k], "%saddr/%d", t->prefix, p->rank);
        vals[k] = p->addr;
        sizes[k] = strlen(p->addr);
        _dm_copy_name(t->addrs[p->rank], 64, p->addr);
        k++;
    }
    if ((st = dm_store_multi_set(g, (const char* const*)keys, vals, sizes, (size_t)n)) != DM_OK)
        st = _dm_tcp_store_fail(t, st, "multi_set", keys[0]);
    for (i = 0; st == DM_OK && i < r->n; i++)
        if (r->peers[i].state == _DM_TCP_RLY_HELD) r->peers[i].published = true;
    if (st == DM_OK && t->counted) st = _dm_tcp_arrive(t, n);
done:
    _dm_tcp_keys_free(t, keys, n);
    _dm_free(&t->base.allocator, vals);
    _dm_free(&t->base.allocator, sizes);
    return st;
}
/* The leader between its waits for the world: up to ms for its host's ranks (0: only what is
   there now), each handshake stepped, what arrived published. */
static dm_status _dm_tcp_relay_pump(_dm_tcp* t, const _dm_tcp_setup* s, int ms) {
    _dm_tcp_relay* r = t->relay;
    int64_t end = _dm_now_ms() + ms;
    int i;
    if (!r || r->role != _DM_TCP_LEADER) return DM_OK;
    for (;;) {
        struct pollfd small[33];
        int np = 0, left = (int)(end - _dm_now_ms());
        small[np].fd = r->lfd; small[np].events = POLLIN; small[np].revents = 0; np++;
        for (i = 0; i < r->n && np < 33; i++)
            if (r->peers[i].state < _DM_TCP_RLY_HELD) {
                small[np].fd = r->peers[i].fd; small[np].events = POLLIN; small[np].revents = 0; np++;
            }
        if (poll(small, (nfds_t)np, left > 0 ? (left > 50 ? 50 : left) : 0) < 0 && errno != EINTR) break;
        _dm_tcp_relay_accept(t);
        for (i = 0; i < r->n; i++) _dm_tcp_relay_step(t, &r->peers[i]);
        if (_dm_now_ms() >= end || r->expect == 0) break;
    }
    return _dm_tcp_relay_publish(t, s);
}
/* Once every address is in the store: the ones its ranks (and the leader) dial first that it
   does not hold, in one MULTI_GET; then each rank is answered. */
static dm_status _dm_tcp_relay_finish(_dm_tcp* t) {
    _dm_tcp_relay* r = t->relay;
    int W = t->base.size, i, k, nb, below[2], n = 0;
    int* need = NULL;
    char** keys = NULL;
    void** vals = NULL;
    size_t* sizes = NULL;
    dm_status st = DM_OK;
    if (!r || r->role != _DM_TCP_LEADER) return DM_OK;
    need = (int*)_dm_malloc(&t->base.allocator, sizeof(int) * 2 * (size_t)(r->n + 1));
    if (!need) return _DM_FAIL(&t->base, DM_ERR_OUT_OF_MEMORY, "tcp: out of memory");
    for (i = -1; i < r->n; i++) {
        if (i >= 0 && r->peers[i].state != _DM_TCP_RLY_HELD) continue;
        nb = _dm_tcp_ring_below(i < 0 ? t->base.rank : r->peers[i].rank, W, below);
        for (k = 0; k < nb; k++) {
            int j, dup = 0;
            if (t->addrs[below[k]][0]) continue;
            for (j = 0; j < n; j++) dup |= need[j] == below[k];
            if (!dup) need[n++] = below[k];
        }
    }
    if (n) {
        keys = (char**)_dm_calloc(&t->base.allocator, (size_t)n * sizeof(char*));
        vals = (void**)_dm_calloc(&t->base.allocator, (size_t)n * sizeof(void*));
        sizes = (size_t*)_dm_calloc(&t->base.allocator, (size_t)n * sizeof(size_t));
        if (!keys || !vals || !sizes) {
            st = _DM_FAIL(&t->base, DM_ERR_OUT_OF_MEMORY, "tcp: out of memory");
            goto done;
        }
        for (i = 0; i < n; i++) {
            if (!(keys[i] = (char*)_dm_malloc(&t->base.allocator, strlen(t->prefix) + 24))) {
                st = _DM_FAIL(&t->base, DM_ERR_OUT_OF_MEMORY, "tcp: out of memory");
                goto done;
            }
            sprintf(keys[i], "%saddr/%d", t->prefix, need[i]);
        }
        if ((st = dm_store_multi_get(_dm_tcp_st(t), (const char* const*)keys, (size_t)n, vals, sizes)) != DM_OK) {
            st = _dm_tcp_store_fail(t, st, "multi_get", keys[0]);
            goto done;
        }
        for (i = 0; i < n; i++) {
            size_t m = sizes[i] < 63 ? sizes[i] : 63;
            memcpy(t->addrs[need[i]], vals[i], m);
            t->addrs[need[i]][m] = 0;
            dm_store_free(_dm_tcp_st(t), vals[i]);
            vals[i] = NULL;
        }
    }
    for (i = 0; i < r->n; i++)
        if (r->peers[i].state == _DM_TCP_RLY_HELD) _dm_tcp_relay_answer(t, &r->peers[i], DM_OK, "");
        else _dm_tcp_relay_close_peer(&r->peers[i]);
    close(r->lfd);
    r->lfd = -1;
done:
    _dm_tcp_keys_free(t, keys, n);
    _dm_free(&t->base.allocator, vals);
    _dm_free(&t->base.allocator, sizes);
    _dm_free(&t->base.allocator, need);
    return st;
}
/* After the all-gather: the leader deletes the address keys of its host's ranks (and the
   world's keys when rank 0 is among them). */
static void _dm_tcp_relay_forget(_dm_tcp* t) {
    _dm_tcp_relay* r = t->relay;
    char name[32];
    int i;
    for (i = 0; r && i < r->n; i++) {
        if (r->peers[i].rank < 0 || !r->peers[i].published) continue;
        snprintf(name, sizeof(name), "addr/%d", r->peers[i].rank);
        _dm_tcp_forget_key(t, name);
        if (r->peers[i].rank == 0) _dm_tcp_forget_world(t);
    }
}

/* -- a rank of the leader's host -- */
/* Connects to the leader, retrying until patience ends: the fd, or -1 (no leader: go direct). */
static int _dm_tcp_relay_dial(_dm_tcp* t, int64_t until) {
    _dm_tcp_relay* r = t->relay;
    int pause = 2;
    for (;;) {     /* nonblocking: a full backlog is EAGAIN, not a wait past the deadline */
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) return -1;
        if (connect(fd, (struct sockaddr*)&r->sa, r->salen) == 0) return fd;
        close(fd);
        if (errno != ECONNREFUSED && errno != ENOENT && errno != EAGAIN && errno != EINTR) return -1;
        if (_dm_now_ms() + pause > until) return -1;
        _dm_store_sleep_ms(pause);
        pause = pause * 2 > 100 ? 100 : pause * 2;
    }
}
/* Waits for fd readable until deadline, watching (>>tcp watch) between slices: 1, 0 at the
   deadline, -2 a watched peer is gone (recorded). */
static int _dm_tcp_relay_wait_answer(_dm_tcp* t, int fd, int64_t deadline) {
    for (;;) {
        int64_t left = deadline - _dm_now_ms();
        int rc;
        if (left <= 0) return 0;
        rc = _dm_tcp_wait_fd(fd, POLLIN, _dm_now_ms() + (left > 200 ? 200 : left));
        if (rc != 0) return 1;          /* data, EOF or an error: the read tells */
        if (_dm_tcp_watch_now(t) != DM_OK) return -2;
    }
}
/* A rank of the leader's host: its record through the leader; DM_OK with t->prefix and the
   addresses it dials first, a failure (the leader's, or its death), or DM_OK with t->relay
   gone (no leader to be found, or one of another user: rendezvous directly). */
static dm_status _dm_tcp_relay_join(_dm_tcp* t, int64_t deadline) {
    _dm_tcp_relay* r = t->relay;
    unsigned char hello[_DM_TCP_RLY_HELLO], chal[_DM_TCP_RLY_CHAL], rec[_DM_TCP_RLY_RECORD], head[_DM_TCP_RLY_HEAD];
    unsigned char mac[32], *body = NULL;
    int64_t until = _dm_now_ms() + _dm_tcp_relay_patience(t);
    int fd, rc, k, nb;
    size_t np, nm, nbody;
    dm_status st;
    const char* why = NULL;
    if (until > deadline) until = deadline;
    fd = _dm_tcp_relay_dial(t, until);
    if (fd < 0) { why = "no leader answered there"; goto direct; }
    if (!t->token[0] && !_dm_tcp_relay_same_user(fd)) { why = "its leader runs as another user"; goto direct; }
    /* the leader answers when it first serves its host, after its own first store request
       (which may wait for the store host to start): until the deadline */
    _dm_tcp_put32(hello, _DM_TCP_RLY_HELLO_MAGIC);
    _dm_tcp_put32(hello + 4, _DM_TCP_RLY_VERSION);
    _dm_st_random(hello + 8, 32);
    if (_dm_tcp_write_full(fd, hello, sizeof(hello), deadline) != 1) {
        why = "its leader closed the connection";
        goto direct;
    }
    rc = _dm_tcp_relay_wait_answer(t, fd, deadline);
    if (rc == -2) { close(fd); return DM_ERR_PEER_LOST; }      /* recorded by the watch */
    if (rc == 1) rc = _dm_tcp_read_full(fd, chal, sizeof(chal), _dm_now_ms() + 1000);
    if (rc == 0) {
        close(fd);
        return _DM_FAIL(&t->base, DM_ERR_TIMEOUT, "tcp: setup timed out: this host's leader (at %s) took this rank's "
                        "connection but never answered it", r->shown);
    }
    if (rc != 1 || _dm_tcp_get32(chal) != _DM_TCP_RLY_CHAL_MAGIC) {
        why = "its leader closed the connection without a challenge";
        goto direct;
    }
    r->leader = (int)_dm_tcp_get32(chal + 8);
    if (_dm_tcp_get32(chal + 4) != 0) { why = "its leader runs as another user"; goto direct; }
    _dm_tcp_relay_proof(t, true, hello + 8, chal + 12, NULL, mac);
    if (!_dm_st_ct_equal(mac, chal + 44, 32)) {
        close(fd);
        return _DM_FAIL(&t->base, DM_ERR_REFUSED, "tcp: setup: this host's leader (rank %d, at %s) could not prove the "
                        "token: it was given another DISTMESH_TOKEN", r->leader, r->shown);
    }
    memset(rec, 0, sizeof(rec));
    _dm_tcp_put32(rec + 32, (uint32_t)t->base.rank);
    _dm_tcp_put32(rec + 36, (uint32_t)t->base.size);
    _dm_copy_name((char*)rec + 40, 64, t->addrs[t->base.rank]);
    _dm_tcp_relay_proof(t, false, hello + 8, chal + 12, rec + 32, rec);
    if (_dm_tcp_write_full(fd, rec, sizeof(rec), deadline) != 1) {
        why = "its leader closed the connection";
        goto direct;
    }
    /* from here the leader may have published this rank: no going back */
    rc = _dm_tcp_relay_wait_answer(t, fd, deadline == INT64_MAX ? INT64_MAX : deadline + 2000);
    if (rc == -2) { close(fd); return DM_ERR_PEER_LOST; }      /* recorded by the watch */
    if (rc == 1) rc = _dm_tcp_read_full(fd, head, sizeof(head), _dm_now_ms() + 1000);
    if (rc != 1) {
        close(fd);
        if (rc == 0)
            return _DM_FAIL(&t->base, DM_ERR_TIMEOUT, "tcp: setup timed out: this host's leader (rank %d, at %s) did "
                            "not answer within the deadline", r->leader, r->shown);
        return _DM_FAIL(&t->base, DM_ERR_PEER_LOST, "tcp: setup: this host's leader (rank %d) closed the rendezvous "
                        "connection before answering (it died, or its own setup failed: see its log)", r->leader);
    }
    st = (dm_status)(int32_t)_dm_tcp_get32(head);
    np = (size_t)head[4] | ((size_t)head[5] << 8);
    nb = head[6];
    nm = (size_t)head[8] | ((size_t)head[9] << 8);
    nbody = np + (size_t)nb * 68 + nm;
    if (np >= sizeof(t->prefix) || nb > 2 || nm >= DM_LAST_ERROR_SIZE || (st != DM_OK && (st > 0 || st < -100)) ||
        !(body = (unsigned char*)_dm_malloc(&t->base.allocator, nbody + 1)) ||
        _dm_tcp_read_full(fd, body, nbody, _dm_now_ms() + 1000) != 1) {
        close(fd);
        _dm_free(&t->base.allocator, body);
        return _DM_FAIL(&t->base, DM_ERR_PROTOCOL, "tcp: setup: a malformed answer from this host's leader (rank %d)",
                        r->leader);
    }
    close(fd);
    if (st != DM_OK) {
        body[nbody] = 0;
        st = _DM_FAIL(&t->base, st, "tcp: setup, through this host's leader (rank %d): %s", r->leader,
                      (const char*)body + np + (size_t)nb * 68);
        _dm_free(&t->base.allocator, body);
        return st;
    }
    memcpy(t->prefix, body, np);
    t->prefix[np] = 0;
    for (k = 0; k < nb; k++) {
        int j = (int)_dm_tcp_get32(body + np + (size_t)k * 68);
        if (j >= 0 && j < t->base.size && j != t->base.rank) {
            memcpy(t->addrs[j], body + np + (size_t)k * 68 + 4, 64);
            t->addrs[j][63] = 0;
        }
    }
    _dm_free(&t->base.allocator, body);
    return DM_OK;
direct:
    if (fd >= 0) close(fd);
    _DM_LOG(&t->base.logger, DM_LOG_WARN, "tcp: rank %d rendezvouses directly with the store: %s (%s)", t->base.rank,
            why, r->shown);
    _dm_free(&t->base.allocator, r->peers);
    _dm_free(&t->base.allocator, r);
    t->relay = NULL;
    return DM_OK;
}

/* >>tcp sparse  A rank connects to the peers its schedules use, not to the world (Gloo's full
   mesh is why torch grew lazy init): first the rank-order ring (r - 1 and r + 1), over which
   every rank's address and host identity are gathered; then P (_dm_peers_find on the layout:
   every same-host peer (shared memory and its side channel), host-order ring neighbours,
   recursive-doubling and dissemination partners, rails, root 0's broadcast chain); anything
   else on demand (>>tcp lazy). Both ends of a pair compute the same sets, so the acceptor knows
   whom to wait for.
   Descriptors: a rank holds P's connections (times the sockets per peer for those on other
   hosts, >>tcp more sockets), its two listeners and a few of its own -- a few dozen, growing
   with log W and the host's size, not with W (no store connection once built, >>tcp relay).
   Any soft limit holds that, so a rank leaves RLIMIT_NOFILE alone unless what P needs would
   not fit under it (say 16 sockets per peer at thousands of ranks): then it raises the soft
   limit to the hard one, as the store host does, logged at debug level; and when even the
   hard limit cannot hold them, create fails before connecting, naming the limit. Raising it
   always would change more than distmesh: the program's other code then fails differently
   past 1024 descriptors (select() writes past its FD_SETSIZE bitmap where open() would have
   said EMFILE). Peers connected on demand later (all_to_all across thousands of ranks) are the
   program's pattern; running out there is an error naming EMFILE. */
/* Descriptors open in this process, or -1. */
static int _dm_tcp_count_fds(void) {
    DIR* d = opendir("/proc/self/fd");
    struct dirent* e;
    int n = 0;
    if (!d) return -1;
    while ((e = readdir(d)) != NULL) n += e->d_name[0] != '.';
    closedir(d);
    return n - 1;               /* the directory's own */
}
/* The soft limit fits this rank's P (connected or about to be), else goes up to the hard one;
   when even that cannot hold what P still needs, create fails here, saying so, rather than
   with a peer's reset half-way through the connections (the peers then report this rank's
   setup failed, "see its log"). What is counted exactly: a socket per peer of P not connected
   yet, sockets per peer for those on other hosts, the shared-memory watcher's eventfd; the
   soft limit keeps 16 more of slack before it is raised. */
static dm_status _dm_tcp_fit_nofile(_dm_tcp* t) {
    struct rlimit rl;
    int W = t->base.size, me = t->base.rank, j, need = 1, open_now;
    char why[200];
    for (j = 0; j < W; j++) {
        int n;
        if (!t->want[j] || j == me) continue;
        n = t->host_of[j] != t->host_of[me] ? t->nsock : 1;
        need += t->fds[j] >= 0 ? n - 1 : n;     /* the ring neighbours are connected already */
    }
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || (rlim_t)(need + 16) * 2 < rl.rlim_cur) return DM_OK;
    open_now = _dm_tcp_count_fds();
    if (open_now < 0 || (rlim_t)(open_now + need + 16) <= rl.rlim_cur) return DM_OK;
    if (rl.rlim_cur < rl.rlim_max) {
        snprintf(why, sizeof(why), "rank %d holds %d descriptors and its schedules' peers (P) need %d more", me,
                 open_now, need);
        _dm_st_raise_nofile(&t->base.logger, "tcp", why);
        if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return DM_OK;
    }
    if ((rlim_t)(open_now + need) <= rl.rlim_cur) return DM_OK;
    return _DM_FAIL(&t->base, DM_ERR_NETWORK, "tcp: setup: rank %d cannot hold the connections its schedules use "
                    "(EMFILE ahead): it holds %d descriptors and needs %d more for its peers (P, %d sockets per peer "
                    "on other hosts), above its limit of %llu open files (RLIMIT_NOFILE, hard limit %llu): raise it "
                    "(ulimit -n)", me, open_now, need, t->nsock, (unsigned long long)rl.rlim_cur,
                    (unsigned long long)rl.rlim_max);
}

static dm_status _dm_tcp_connect_sparse(_dm_tcp* t, const _dm_tcp_setup* s, int64_t deadline) {
    int W = t->base.size, r = t->base.rank, j, n = 0;
    char key[600];
    t->want = (bool*)_dm_calloc(&t->base.allocator, sizeof(bool) * (size_t)W);
    if (!t->want) return _DM_FAIL(&t->base, DM_ERR_OUT_OF_MEMORY, "tcp: out of memory");
    if (W > 1) {
        t->want[(r + 1) % W] = true;
        t->want[(r + W - 1) % W] = true;
        t->want[r] = false;
        for (j = 0; j < r && !t->addrs_known; j++) {
            if (!t->want[j] || t->addrs[j][0]) continue;    /* known: through the leader (>>tcp relay) */
            snprintf(key, sizeof(key), "%saddr/%d", t->prefix, j);
            _DM_TRY(_dm_tcp_store_get_str(t, key, t->addrs[j], 64));
        }
        _DM_TRY(_dm_tcp_connect_wanted(t, deadline));
    }
    _DM_TRY(_dm_tcp_hosts(t, s));
    /* every reader of this rank's address key has connected: a ring neighbour (the gather
       above needed every rank, so every rank is past its own reads). A leader also forgets its
       host's ranks' keys, which it set; a rank that went through a leader has none. */
    if (!t->addrs_known && (!t->relay || t->relay->role != _DM_TCP_LOCAL)) {
        _dm_tcp_forget_addr(t);
        _dm_tcp_relay_forget(t);
    }
    _DM_TRY(_dm_peers_find(&t->lk, t->want));
    for (j = 0; j < W; j++) n += t->want[j];
    _DM_TRY(_dm_tcp_fit_nofile(t));
    _DM_TRY(_dm_tcp_connect_wanted(t, deadline));
    _DM_LOG(&t->base.logger, DM_LOG_INFO, "tcp: rank %d of %d: %d peers connected for the schedules (P), the rest "
            "on demand", r, W, n);
    return DM_OK;
}

/* >>tcp arrival  Before connecting, each rank waits until every rank of its group has
   published its address, in short slices (200 ms) so that a split also watches the parent's
   connections to the members meanwhile (>>tcp watch); after 1 s, then every 10 s, a log line
   names the ranks still missing and for how long. The first rank here sets
   "<prefix>world_size"; a rank that holds a different world size fails at once, naming both
   values. The waits use a silent clone of the store: a slice that times out is not an error.
   On a tcp store what a rank waits for is one key: a rank (a leader, for a batch of its host's
   ranks) that has set addresses adds their number to "<prefix>arrived", and the add that
   reaches the world size sets "<prefix>ready". (Waiting for the W address keys themselves sent
   the W keys in every slice's WAIT: 30 W bytes per waiting rank five times a second, 8 MB a
   second per rank at 16k ranks.) A file store's ranks still wait for the W keys: there a wait
   reads local files, and an add takes the directory's lock (measured at 256 ranks, the
   counter made create 0.6 s slower). Which ranks are missing is asked only for a log line or the final
   message: W CHECKs sent in one burst (_dm_store_present); above 1024 ranks only rank 0 names
   them, the others count them.
   Between slices (at most every 200 ms) a rank also asks whether the store's server has
   refused clients for lack of descriptors (_dm_store_refusal): then the ranks still missing
   cannot come, and it fails at once with the server's words (the cause, the connections it
   holds, its limit) instead of at the deadline. A host's leader (>>tcp relay) waits here for
   the host: in 25 ms slices while its ranks are still arriving, publishing them between. */
static void _dm_tcp_rank_list(const int* ranks, int n, char* out, size_t cap) {
    int i = 0;
    size_t len = 0;
    out[0] = 0;
    while (i < n && len + 24 < cap) {
        int k = i;
        while (k + 1 < n && ranks[k + 1] == ranks[k] + 1) k++;
        if (k == i) len += (size_t)snprintf(out + len, cap - len, "%s%d", i ? ", " : "", ranks[i]);
        else len += (size_t)snprintf(out + len, cap - len, "%s%d-%d", i ? ", " : "", ranks[i], ranks[k]);
        i = k + 1;
    }
    if (i < n) snprintf(out + len, cap - len, ", ...");
}

/* n more ranks' addresses are in the store (set before, on the same connection): "<prefix>arrived"
   counts them, and the add that reaches the world size sets "<prefix>ready", the one key the
   others wait for. */
static dm_status _dm_tcp_arrive(_dm_tcp* t, int n) {
    char key[600];
    int64_t v = 0;
    dm_store* g = _dm_tcp_st(t);
    dm_status st;
    snprintf(key, sizeof(key), "%sarrived", t->prefix);
    if ((st = dm_store_add(g, key, n, &v)) != DM_OK) return _dm_tcp_store_fail(t, st, "add", key);
    if (v < t->base.size) return DM_OK;
    snprintf(key, sizeof(key), "%sready", t->prefix);
    if ((st = dm_store_set(g, key, "1", 1)) != DM_OK) return _dm_tcp_store_fail(t, st, "set", key);
    return DM_OK;
}
/* Which ranks have no address in the store yet, into missing (the count returned; -1 when the
   store did not say). Every rank names them up to 1024 ranks; above, only rank 0 does (one
   burst of W checks), the others count them ("arrived"), so that a wait of thousands of ranks
   costs the store a burst per log line, not one per waiting rank. */
static int _dm_tcp_missing_ranks(_dm_tcp* t, dm_store* w, char** keys, int* missing, bool* present) {
    int W = t->base.size, j, n = 0;
    w->timeout_ms = 1000;
    if (W > 1024 && t->base.rank != 0 && t->counted) {
        char key[600];
        int64_t v = 0;
        snprintf(key, sizeof(key), "%sarrived", t->prefix);
        return dm_store_add(w, key, 0, &v) == DM_OK && v <= W ? W - (int)v : -1;
    }
    if (_dm_store_present(w, (const char* const*)keys, (size_t)W, present) != DM_OK) return -1;
    for (j = 0; j < W; j++)
        if (!present[j]) missing[n++] = j;
    return n;
}
/* "ranks 3, 8-11 of 12" (or "12 ranks of 16384" where they are counted, not named) into list;
   the count's plural ending returned. */
static const char* _dm_tcp_missing_text(_dm_tcp* t, const int* missing, int n, char* list, size_t cap) {
    if (n < 0) snprintf(list, cap, "still missing");    /* the store did not say */
    else if (t->base.size > 1024 && t->base.rank != 0 && t->counted)
        snprintf(list, cap, "%d of them (rank 0 names them)", n);
    else _dm_tcp_rank_list(missing, n, list, cap);
    return n == 1 ? "" : "s";
}
static dm_status _dm_tcp_await_ranks(_dm_tcp* t, const _dm_tcp_setup* s, int64_t deadline) {
    int W = t->base.size, nmissing;
    char key[600], mine[24], other[24], list[200], refused[_DM_ST_NOTICE_TEXT + 1];
    void* held = NULL;
    size_t held_n = 0;
    char* keys_one[1];
    char** keys = NULL;
    int* missing = NULL;
    bool* present = NULL;
    int64_t start = _dm_now_ms(), next_log = start + 1000, next_refusal = 0;
    dm_store* w = NULL;
    dm_status st;
    const char* ending;
    int j;
    snprintf(mine, sizeof(mine), "%d", W);
    snprintf(key, sizeof(key), "%sworld_size", t->prefix);
    st = dm_store_compare_set(_dm_tcp_st(t), key, "", 0, mine, strlen(mine), &held, &held_n);
    if (st != DM_OK) return _dm_tcp_store_fail(t, st, "compare_set", key);
    snprintf(other, sizeof(other), "%.*s", (int)(held_n < 20 ? held_n : 20), (const char*)held);
    dm_store_free(t->rdv ? t->rdv : t->store, held);
    if (strcmp(other, mine) != 0)
        return _DM_FAIL(&t->base, DM_ERR_INVALID_ARG, "tcp: world size disagreement: this rank (rank %d) has "
                        "world size %d, another rank of the group has %s (every rank must be given the same "
                        "WORLD_SIZE / launcher size)", t->base.rank, W, other);
    if (W == 1) return _dm_tcp_relay_finish(t);
    /* a tcp store counts arrivals; a file store's waits read local files, and its adds take
       the directory's lock: W keys are cheaper there than W locked adds */
    t->counted = _dm_store_where(_dm_tcp_st(t)) != NULL;
    if (t->counted && (st = _dm_tcp_arrive(t, 1)) != DM_OK) return st;     /* this rank's address is in */
    st = dm_store_clone_prefixed(_dm_tcp_st(t), "", &w);
    keys = (char**)_dm_calloc(&t->base.allocator, (size_t)W * sizeof(char*));
    missing = (int*)_dm_malloc(&t->base.allocator, sizeof(int) * (size_t)W);
    present = (bool*)_dm_malloc(&t->base.allocator, sizeof(bool) * (size_t)W);
    if (st != DM_OK || !keys || !missing || !present) {
        st = _DM_FAIL(&t->base, DM_ERR_OUT_OF_MEMORY, "tcp: out of memory");
        goto done;
    }
    memset(&w->logger, 0, sizeof(w->logger));
    for (j = 0; j < W; j++) {
        keys[j] = (char*)_dm_malloc(&t->base.allocator, strlen(t->prefix) + 24);
        if (!keys[j]) { st = _DM_FAIL(&t->base, DM_ERR_OUT_OF_MEMORY, "tcp: out of memory"); goto done; }
        sprintf(keys[j], "%saddr/%d", t->prefix, j);
    }
    snprintf(key, sizeof(key), "%sready", t->prefix);
    keys_one[0] = key;
    for (;;) {
        bool arriving = t->relay && t->relay->role == _DM_TCP_LEADER && t->relay->expect > 0;
        int64_t now, left;
        int ms, slice = arriving ? 25 : 200;
        if ((st = _dm_tcp_relay_pump(t, s, arriving ? 25 : 0)) != DM_OK) goto done;
        now = _dm_now_ms();
        left = deadline - now;
        ms = (int)(left < slice ? (left < 1 ? 1 : left) : slice);
        /* the slice bounds the wait; the deadline bounds the requests (WAIT, CANCEL_WAIT) */
        w->timeout_ms = deadline == INT64_MAX ? -1 : (int)(left < 1 ? 1 : left > INT_MAX ? INT_MAX : left);
        st = t->counted ? dm_store_wait(w, (const char* const*)keys_one, 1, ms)
                        : dm_store_wait(w, (const char* const*)keys, (size_t)W, ms);
        if (st == DM_ERR_TIMEOUT && w->sh->broken) {    /* the store itself did not answer */
            st = _DM_FAIL(&t->base, st, "tcp: setup: store wait failed: %s", dm_store_last_error(w));
            goto done;
        }
        if (st != DM_ERR_TIMEOUT) {
            if (st != DM_OK) st = _DM_FAIL(&t->base, st, "tcp: setup: store wait failed: %s", dm_store_last_error(w));
            else st = _dm_tcp_relay_finish(t);
            goto done;
        }
        if ((st = _dm_tcp_watch_now(t)) != DM_OK) goto done;
        now = _dm_now_ms();
        if (now >= next_refusal) {      /* the server may have refused the ranks still missing */
            next_refusal = now + 200;
            w->timeout_ms = 1000;
            if (_dm_store_refusal(w, refused, sizeof(refused)) == DM_OK && refused[0]) {
                nmissing = _dm_tcp_missing_ranks(t, w, keys, missing, present);
                ending = _dm_tcp_missing_text(t, missing, nmissing, list, sizeof(list));
                st = _DM_FAIL(&t->base, DM_ERR_NETWORK, "tcp: setup failed: rank%s %s of %d cannot join: the store at "
                              "%s refused clients: %s", ending, list, W, w->sh->where, refused);
                goto done;
            }
            now = _dm_now_ms();
        }
        if (now < deadline && now < next_log) continue;
        nmissing = _dm_tcp_missing_ranks(t, w, keys, missing, present);
        ending = _dm_tcp_missing_text(t, missing, nmissing, list, sizeof(list));
        if (_dm_now_ms() >= deadline) {
            if (nmissing > 0)
                st = _DM_FAIL(&t->base, DM_ERR_TIMEOUT, "tcp: setup timed out after %lld s: rank%s %s of %d never "
                              "joined (no address under \"%s\")", (long long)((_dm_now_ms() - start) / 1000),
                              ending, list, W, t->prefix);
            else    /* none missing, or the store would not say: its replies are what failed */
                st = _DM_FAIL(&t->base, DM_ERR_TIMEOUT, "tcp: setup timed out after %lld s waiting for the %d ranks' "
                              "addresses under \"%s\" at the store %s: %s (a reply of the store lost, or tampered "
                              "with on the way?): %s", (long long)((_dm_now_ms() - start) / 1000), W, t->prefix,
                              w->sh->where, nmissing == 0 ? "every address is there but the wait did not end"
                                                          : "the store did not say which are missing",
                              dm_store_last_error(w)[0] ? dm_store_last_error(w) : "no store error");
            goto done;
        }
        if (nmissing != 0)
            _DM_LOG(&t->base.logger, DM_LOG_WARN, "tcp: rank %d has waited %lld s for rank%s %s of %d to join "
                    "(deadline in %lld s)", t->base.rank, (long long)((_dm_now_ms() - start + 500) / 1000), ending,
                    list, W, (long long)((deadline - _dm_now_ms()) / 1000));
        next_log = _dm_now_ms() + 10000;
    }
done:
    _dm_tcp_keys_free(t, keys, W);
    _dm_free(&t->base.allocator, missing);
    _dm_free(&t->base.allocator, present);
    dm_store_destroy(w);
    return st;
}

/* >>tcp build  A group from a resolved setup: listeners, addresses through the store, hosts,
   shared memory, connections to P, the engine (_dm_tcp_build). */
/* A listener on at's address, ephemeral port: *fd and its "host:port" (64 bytes). */
static dm_status _dm_tcp_listen(_dm_tcp* t, const struct sockaddr_storage* at, int* fd, char* addr) {
    struct sockaddr_storage sa;
    socklen_t salen;
    int one = 1;
    memcpy(&sa, at, sizeof(sa));
    salen = sa.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    if (sa.ss_family == AF_INET6) ((struct sockaddr_in6*)&sa)->sin6_port = 0;
    else ((struct sockaddr_in*)&sa)->sin_port = 0;
    *fd = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (*fd < 0) return _DM_FAIL(&t->base, DM_ERR_NETWORK, "tcp: socket() failed (%s)", strerror(errno));
    setsockopt(*fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(*fd, (struct sockaddr*)&sa, salen) != 0 || listen(*fd, 512) != 0) {
        char where[64];
        _dm_tcp_format_addr((struct sockaddr*)&sa, where, sizeof(where));
        close(*fd);
        *fd = -1;
        return _DM_FAIL(&t->base, DM_ERR_NETWORK, "tcp: cannot listen on %s (%s)", where, strerror(errno));
    }
    salen = sizeof(sa);
    getsockname(*fd, (struct sockaddr*)&sa, &salen);
    _dm_tcp_format_addr((struct sockaddr*)&sa, addr, 64);
    return DM_OK;
}

/* The rendezvous: generation, listen, publish, connect down / accept up, acks, host names. */
static dm_status _dm_tcp_build(const _dm_tcp_setup* s, dm_collective** out) {
    _dm_tcp* t;
    struct sockaddr_storage sa;
    char key[600], self_addr[64];
    int64_t gen = 0, deadline;
    uint64_t group;
    int lfd = -1, j;
    dm_status st;

    t = (_dm_tcp*)_dm_calloc(&s->allocator, sizeof(_dm_tcp));
    if (!t) {
        if (s->own_store) dm_store_destroy(s->store);
        if (s->addrs) { close(s->lfd); close(s->rfd); }
        return DM_ERR_OUT_OF_MEMORY;
    }
    t->lfd = t->rfd = -1;
    if (s->addrs) {             /* split: the listeners are this build's from here on */
        lfd = s->lfd;
        t->rfd = s->rfd;
        t->addrs_known = true;
    }
    _dm_collective_init(&t->base, &t->core, &_dm_tcp_vtable, s->rank, s->size, s->timeout_ms, &s->logger, &s->allocator);
    t->store = s->store;
    t->own_store = s->own_store;
    _dm_copy_name(t->user_prefix, sizeof(t->user_prefix), s->prefix);
    _dm_copy_name(t->ifname, sizeof(t->ifname), s->ifname ? s->ifname : "");
    _dm_copy_name(t->token, sizeof(t->token), s->token ? s->token : "");
    t->transport = s->transport;
    t->encrypt = s->encrypt;
    _dm_copy_name(t->site, sizeof(t->site), s->site ? s->site : "");
    t->nsock = s->nsock > 0 ? s->nsock : 1;
    t->fds = (int*)_dm_malloc(&t->base.allocator, sizeof(int) * (size_t)s->size * (size_t)t->nsock);
    t->claims = t->fds;
    t->addrs = (char(*)[64])_dm_calloc(&t->base.allocator, 64 * (size_t)s->size);
    t->raddrs = (char(*)[64])_dm_calloc(&t->base.allocator, 64 * (size_t)s->size);
    st = _dm_eng_init(&t->lk, &t->base, "tcp", s->chunk_bytes);
    t->lk.site_probe = true;
    if (st == DM_ERR_ENV) goto fail;            /* DISTMESH_ALGO: its message is in last_error */
    if (st != DM_OK || !t->fds || !t->addrs || !t->raddrs) {
        st = _DM_FAIL(&t->base, DM_ERR_OUT_OF_MEMORY, "tcp: out of memory");
        goto fail;
    }
    t->lk.notice_post = _dm_tcp_notice_post;
    t->lk.notice_read = _dm_tcp_notice_read;
    for (j = 0; j < s->size * t->nsock; j++) t->fds[j] = -1;
    deadline = _dm_deadline(t->base.timeout_ms);
    /* the rendezvous: store requests end by the deadline, the parent's connections are watched */
    if (t->store && dm_store_clone_prefixed(t->store, "", &t->rdv) != DM_OK) {
        st = _DM_FAIL(&t->base, DM_ERR_OUT_OF_MEMORY, "tcp: out of memory");
        goto fail;
    }
    t->rdv_deadline = deadline;
    t->parent = s->parent;
    t->members = s->members;

    /* a host's leader listens for its host's ranks before anything else (>>tcp relay) */
    if (!s->addrs && (st = _dm_tcp_relay_open(t, s)) != DM_OK) goto fail;
    if (s->addrs) {             /* split: every member's listeners are known already */
        memcpy(t->addrs, s->addrs, 64 * (size_t)s->size);
        memcpy(t->raddrs, s->raddrs, 64 * (size_t)s->size);
        memcpy(&t->self_sa, s->bind_sa, sizeof(t->self_sa));
    } else {
        /* listen on the chosen interface, ephemeral port; the recovery listener beside it */
        if (s->bind_sa) memcpy(&sa, s->bind_sa, sizeof(sa));
        else if ((st = _dm_tcp_pick_addr(t, t->ifname, s->route_host, &sa)) != DM_OK) goto fail;
        if ((st = _dm_tcp_listen(t, &sa, &lfd, self_addr)) != DM_OK) goto fail;
        memcpy(&t->self_sa, &sa, sizeof(sa));
        if ((st = _dm_tcp_listen(t, &sa, &t->rfd, t->raddrs[s->rank])) != DM_OK) goto fail;
        _dm_copy_name(t->addrs[s->rank], 64, self_addr);
        /* a rank of a leader's host: its leader meets the store for it (or it goes direct) */
        if (t->relay && t->relay->role == _DM_TCP_LOCAL && (st = _dm_tcp_relay_join(t, deadline)) != DM_OK) goto fail;
    }
    if (!t->relay || t->relay->role != _DM_TCP_LOCAL) {
        /* generation: create/destroy cycles under one prefix get fresh keys. No rank can start
           the next cycle's add before every rank did this one's (connecting needs everyone's
           address). A leader adds for itself here and for its host's ranks as they come. */
        if (s->once) {
            gen = 1;
        } else {
            snprintf(key, sizeof(key), "%sgen", t->user_prefix);
            st = dm_store_add(_dm_tcp_st(t), key, 1, &gen);
            if (st != DM_OK) { _dm_tcp_store_fail(t, st, "add", key); goto fail; }
        }
        snprintf(t->prefix, sizeof(t->prefix), "%.480sg%lld/", t->user_prefix, (long long)((gen - 1) / s->size));
    }
    group = _dm_tcp_hash(1, t->prefix, NULL);
    if (!s->addrs && (!t->relay || t->relay->role != _DM_TCP_LOCAL)) {
        snprintf(key, sizeof(key), "%saddr/%d", t->prefix, s->rank);
        st = dm_store_set(_dm_tcp_st(t), key, self_addr, strlen(self_addr));
        if (st != DM_OK) { _dm_tcp_store_fail(t, st, "set", key); goto fail; }
        if ((st = _dm_tcp_await_ranks(t, s, deadline)) != DM_OK) goto fail;
    }

    /* the listener stays for the group's life (>>tcp lazy) */
    t->lfd = lfd;
    lfd = -1;
    t->group = group;
    t->serving = true;
    t->lk.connect = _dm_tcp_eng_connect;
    t->lk.poll_fill = _dm_tcp_eng_poll_fill;
    t->lk.service = _dm_tcp_eng_service;
    t->lk.hangup = _dm_tcp_eng_hangup;
    if ((st = _dm_tcp_connect_sparse(t, s, deadline)) != DM_OK) goto fail;
    _dm_tcp_relay_end(t, DM_OK);
    if ((st = _dm_tcp_shm_for_host(t)) != DM_OK) goto fail;
    if ((st = _dm_tcp_more_sockets(t, deadline)) != DM_OK) goto fail;
    if ((st = _dm_tcp_seal_settle(t)) != DM_OK) goto fail;
    _dm_tcp_serve_trim(t);
    t->built = true;
    /* the store stays for what is rare after create (notices, grow), its connection closed
       until then (>>tcp relay): the store host holds nothing for a built group */
    dm_store_destroy(t->rdv);
    t->rdv = NULL;
    if (t->own_store) _dm_store_idle(t->store);
    t->parent = NULL;
    t->members = NULL;
    *out = &t->base;
    return DM_OK;
fail:
    if (lfd >= 0) close(lfd);
    _dm_tcp_relay_end(t, st);       /* the host's ranks waiting on this leader learn why */
    if (s->err) _dm_copy_name(s->err, s->err_cap, t->base.last_error);
    _dm_tcp_free(t);
    return st;
}

/* Failed creates have no object to hold the message: it goes to the logger only. */
static dm_status _dm_tcp_report(const dm_logger* lg, dm_status st, const char* msg) {
    char err[DM_LAST_ERROR_SIZE];
    return _DM_REPORT(lg, err, sizeof(err), st, "%s", msg);
}

/* >>tcp hostlist  Slurm's hostlist syntax: items separated by top-level commas; an item is text
   with [..] groups of comma-separated numbers and lo-hi ranges (lo's digits give the zero
   padding); several groups multiply out, the last group varying fastest. */
#define _DM_HL_MAX 1000000L
/* Item s[0..n): number of hosts (-1 malformed); host idx appended to out when idx in range. */
static long _dm_hl_item(const char* s, size_t n, long idx, char* out, size_t cap) {
    const char* lb = (const char*)memchr(s, '[', n);
    const char *rb, *p, *rest;
    size_t restn, used = out ? strlen(out) : 0;
    long restcount, total = 0;
    if (!lb) {
        if (memchr(s, ']', n) || n == 0) return -1;
        if (out && idx == 0) snprintf(out + used, cap - used, "%.*s", (int)n, s);
        return 1;
    }
    rb = (const char*)memchr(lb, ']', n - (size_t)(lb - s));
    if (!rb || memchr(s, ']', (size_t)(lb - s)) || rb == lb + 1) return -1;
    rest = rb + 1;
    restn = n - (size_t)(rest - s);
    restcount = restn ? _dm_hl_item(rest, restn, -1, NULL, 0) : 1;
    if (restcount < 0) return -1;
    for (p = lb + 1; p < rb;) {
        long lo, hi;
        int width = 0;
        char* end;
        if (*p < '0' || *p > '9') return -1;
        while (p + width < rb && p[width] >= '0' && p[width] <= '9') width++;
        lo = strtol(p, &end, 10);
        hi = lo;
        p = end;
        if (*p == '-') {
            if (p[1] < '0' || p[1] > '9') return -1;
            hi = strtol(p + 1, &end, 10);
            p = end;
        }
        if (hi < lo || hi - lo >= _DM_HL_MAX || p > rb || (*p != ',' && p != rb)) return -1;
        if ((hi - lo + 1) * restcount > _DM_HL_MAX - total * restcount) return -1;
        if (out && idx >= total * restcount && idx < (total + hi - lo + 1) * restcount) {
            long k = idx - total * restcount;
            snprintf(out + used, cap - used, "%.*s%0*ld", (int)(lb - s), s, width, lo + k / restcount);
            if (restn) _dm_hl_item(rest, restn, k % restcount, out, cap);
        }
        total += hi - lo + 1;
        if (*p == ',') p++;
    }
    return total * restcount;
}

DM_API_IMPL long dm_slurm_hostlist(const char* list, long index, char* out, size_t cap) {
    long total = 0;
    const char* p = list;
    if (out && cap) out[0] = 0;
    if (!list || !*list) return -1;
    while (*p) {
        const char* q = p;
        int depth = 0;
        long n;
        while (*q && (depth || *q != ',')) {
            if (*q == '[') depth++;
            else if (*q == ']') depth--;
            if (depth < 0 || depth > 1) return -1;
            q++;
        }
        if (depth) return -1;
        n = _dm_hl_item(p, (size_t)(q - p), index - total, (out && cap && index >= total) ? out : NULL, cap);
        if (n < 0 || n > _DM_HL_MAX - total) return -1;
        total += n;
        p = *q ? q + 1 : q;
        if (*q && !*p) return -1;          /* trailing comma */
    }
    return total;
}
#undef _DM_HL_MAX

/* >>tcp launch  A private rendezvous from the launcher's own job identity (see dm_tcp_launch). */
/* Whether path is a directory (not a link) of this user that no one else may enter. */
static bool _dm_tcp_dir_is_private(const char* path) {
    struct stat st;
    return lstat(path, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == getuid() && (st.st_mode & 077) == 0;
}
/* The per-user directory, created 0700; refused unless it is ours, a directory and private. */
static bool _dm_tcp_private_dir(char* out, size_t cap, char* err, size_t errcap) {
    const char* xdg = getenv("XDG_RUNTIME_DIR");
    const char* tmp = getenv("TMPDIR");
    struct stat st;
    if (xdg && xdg[0] == '/' && stat(xdg, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == getuid())
        snprintf(out, cap, "%s/distmesh", xdg);
    else
        snprintf(out, cap, "%s/distmesh-%lu", (tmp && tmp[0] == '/') ? tmp : "/tmp", (unsigned long)getuid());
    if (mkdir(out, 0700) != 0 && errno != EEXIST) {
        snprintf(err, errcap, "cannot create the private rendezvous directory %s (%s)", out, strerror(errno));
        return false;
    }
    if (!_dm_tcp_dir_is_private(out)) {
        snprintf(err, errcap, "refusing the rendezvous directory %s: it must be a directory owned by uid %lu "
                 "with mode 0700", out, (unsigned long)getuid());
        return false;
    }
    return true;
}

/* file://<dir>/<launcher>-<job id>, the job id reduced to [A-Za-z0-9._-]. */
static bool _dm_tcp_job_store_at(dm_tcp_launch* l, const char* dir, const char* launcher, const char* job) {
    char leaf[96];
    size_t i, n = 0;
    n = (size_t)snprintf(leaf, sizeof(leaf), "%s-", launcher);
    for (i = 0; job[i] && n + 1 < sizeof(leaf); i++) {
        char ch = job[i];
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                  ch == '.' || ch == '-' || ch == '_';
        leaf[n++] = ok ? ch : '_';
    }
    leaf[n] = 0;
    snprintf(l->url, sizeof(l->url), "file://%s/%s", dir, leaf);
    if (mkdir(l->url + 7, 0700) != 0 && errno != EEXIST) {
        snprintf(l->error, sizeof(l->error), "cannot create %s (%s)", l->url + 7, strerror(errno));
        return false;
    }
    return true;
}
/* The same in the private directory (_dm_tcp_private_dir), left in place after the job. */
static bool _dm_tcp_job_store(dm_tcp_launch* l, const char* launcher, const char* job) {
    char dir[300];
    if (!_dm_tcp_private_dir(dir, sizeof(dir), l->error, sizeof(l->error))) return false;
    return _dm_tcp_job_store_at(l, dir, launcher, job);
}
/* The launcher's own directory for this job (an absolute path, a directory of this user that no
   one else may enter), or NULL. */
static const char* _dm_tcp_launcher_dir(const char* dir) {
    return dir && dir[0] == '/' && strlen(dir) <= 300 && _dm_tcp_dir_is_private(dir) ? dir : NULL;
}

static const char* _dm_tcp_getenv1(const char* a, const char* b, const char* c) {
    const char* v = a ? getenv(a) : NULL;
    if ((!v || !*v) && b) v = getenv(b);
    if ((!v || !*v) && c) v = getenv(c);
    return (v && *v) ? v : NULL;
}

static bool _dm_tcp_launch_openmpi(dm_tcp_launch* l, const dm_env* env) {
    const char* job = _dm_tcp_getenv1("OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "OMPI_MCA_orte_ess_jobid");
    const char* sess;
    if (!env->local_from_launcher || env->local_world_size != env->world_size) {
        snprintf(l->error, sizeof(l->error), "mpirun runs these %d ranks on several hosts, so distmesh needs "
                 "a store every host reaches: set MASTER_ADDR=<host of rank 0> and MASTER_PORT=<free port> for "
                 "every rank (mpirun -x MASTER_ADDR=... -x MASTER_PORT=29500 ...), or "
                 "DISTMESH_STORE=file:///<directory shared by every host>", env->world_size);
        return false;
    }
    if (!job) {
        snprintf(l->error, sizeof(l->error), "mpirun without a job id (OMPI_MCA_ess_base_jobid, PMIX_NAMESPACE): "
                 "set MASTER_ADDR and MASTER_PORT, or DISTMESH_STORE=file:///<dir>");
        return false;
    }
    /* mpirun's session directory for this job: made fresh and removed by mpirun at the end.
       Job ids repeat over thousands of launches (16 bits of them come from mpirun's pid), and a
       store left by an earlier job of another size would split this one's generation
       (>>tcp build): its ranks would wait for each other under two prefixes until the deadline. */
    sess = _dm_tcp_launcher_dir(_dm_tcp_getenv1("PMIX_SERVER_TMPDIR", "OMPI_MCA_orte_jobfam_session_dir", NULL));
    if (sess) return _dm_tcp_job_store_at(l, sess, "distmesh-ompi", job);
    return _dm_tcp_job_store(l, "ompi", job);
}

static bool _dm_tcp_launch_slurm(dm_tcp_launch* l, const dm_env* env) {
    const char* job = getenv("SLURM_JOB_ID");
    const char* step = getenv("SLURM_STEP_ID");
    const char* nodes = _dm_tcp_getenv1("SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST");
    const char* nn = _dm_tcp_getenv1("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES");
    int jobid = 0, stepid = 0, nnodes = 0, port = 0, nodeid = -1, localid = -1;
    long count;
    char first[256], id[64];
    if (!job || !_dm_parse_int(job, 0, INT_MAX, &jobid) ||
        (step && !_dm_parse_int(step, 0, INT_MAX, &stepid))) {
        snprintf(l->error, sizeof(l->error), "srun without a usable SLURM_JOB_ID / SLURM_STEP_ID (\"%.32s\" / "
                 "\"%.32s\"): set MASTER_ADDR and MASTER_PORT, or DISTMESH_STORE", job ? job : "", step ? step : "");
        return false;
    }
    count = nodes ? dm_slurm_hostlist(nodes, 0, first, sizeof(first)) : -1;
    if (nn && !_dm_parse_int(nn, 1, INT_MAX, &nnodes)) nnodes = 0;
    if (nnodes == 0 && count > 0) nnodes = (int)count;
    if (nnodes == 1) {
        snprintf(id, sizeof(id), "%d.%d", jobid, stepid);
        return _dm_tcp_job_store(l, "slurm", id);
    }
    if (count < 1) {
        snprintf(l->error, sizeof(l->error), "srun over %d nodes but the node list (SLURM_STEP_NODELIST, "
                 "SLURM_JOB_NODELIST) is %s: set MASTER_ADDR and MASTER_PORT", nnodes,
                 nodes ? "malformed" : "missing");
        return false;
    }
    if (getenv("MASTER_ADDR") && *getenv("MASTER_ADDR")) _dm_copy_name(first, sizeof(first), getenv("MASTER_ADDR"));
    if (!getenv("MASTER_PORT") || !_dm_parse_int(getenv("MASTER_PORT"), 1, 65535, &port))
        port = 15000 + (int)(((long long)jobid * 16 + stepid % 16) % 20000);
    if (!getenv("SLURM_NODEID") || !_dm_parse_int(getenv("SLURM_NODEID"), 0, INT_MAX, &nodeid)) nodeid = -1;
    if (!getenv("SLURM_LOCALID") || !_dm_parse_int(getenv("SLURM_LOCALID"), 0, INT_MAX, &localid)) localid = -1;
    l->is_server = nodeid >= 0 && localid >= 0 ? (nodeid == 0 && localid == 0) : env->rank == 0;
    if (strchr(first, ':')) snprintf(l->url, sizeof(l->url), "tcp://[%s]:%d", first, port);
    else snprintf(l->url, sizeof(l->url), "tcp://%s:%d", first, port);
    return true;
}

DM_API_IMPL dm_status dm_tcp_launch_detect(dm_tcp_launch* out) {
    dm_env env;
    bool ok = false;
    if (!out) return DM_ERR_INVALID_ARG;
    memset(out, 0, sizeof(*out));
    out->launcher = "default";
    if (dm_env_detect(&env) != DM_OK) {
        snprintf(out->error, sizeof(out->error), "%s", env.error);
        return DM_ERR_ENV;
    }
    out->launcher = env.source;
    if (strcmp(env.source, "openmpi") == 0) ok = _dm_tcp_launch_openmpi(out, &env);
    else if (strcmp(env.source, "slurm") == 0) ok = _dm_tcp_launch_slurm(out, &env);
    else if (strcmp(env.source, "torchrun") == 0)
        snprintf(out->error, sizeof(out->error), "RANK and WORLD_SIZE are set but MASTER_ADDR and MASTER_PORT "
                 "are not: torchrun sets all four; launching by hand, set MASTER_ADDR=<host of rank 0> and "
                 "MASTER_PORT=<free port> on every rank, or DISTMESH_STORE=file:///<shared dir>");
    else if (strcmp(env.source, "pmi") == 0)
        snprintf(out->error, sizeof(out->error), "PMI launchers (mpiexec of MPICH / Intel MPI) give no job id "
                 "distmesh can use: set MASTER_ADDR and MASTER_PORT for every rank (mpiexec -genv MASTER_ADDR "
                 "<host of rank 0> -genv MASTER_PORT 29500), or DISTMESH_STORE=file:///<shared dir>");
    else
        snprintf(out->error, sizeof(out->error), "no launcher detected (world size %d from %s): set "
                 "MASTER_ADDR and MASTER_PORT, or DISTMESH_STORE=tcp://host:port or file:///<shared dir>",
                 env.world_size, env.source);
    if (!ok) out->url[0] = 0;
    return ok ? DM_OK : DM_ERR_ENV;
}

/* >>tcp create  dm_tcp_create: the desc and the environment checked and resolved, then built. */
/* desc.transport, else DISTMESH_TRANSPORT, else auto. A bad desc value is DM_ERR_INVALID_ARG, a
   bad environment value DM_ERR_ENV (>>config registry; its choices are _DM_TCP_AUTO, _SHM,
   _SOCKETS in order); both name what is accepted. */
static dm_status _dm_tcp_parse_transport(const char* given, int* out, char* err, size_t cap) {
    static const char* const names[] = { "auto", "shm", "tcp" };
    int k;
    *out = _DM_TCP_AUTO;
    if (!given) return _dm_cfg_int(_DM_CFG_TRANSPORT, out, err, cap);
    for (k = 0; k < 3; k++)
        if (strcmp(given, names[k]) == 0) { *out = k; return DM_OK; }
    snprintf(err, cap, "tcp: desc.transport is \"%.40s\"; expected auto, shm or tcp", given);
    return DM_ERR_INVALID_ARG;
}

/* desc.sockets_per_peer, else DISTMESH_SOCKETS_PER_PEER (whose range is 1.._DM_TCP_MAX_SOCKETS),
   else 1; bad values as for transport. */
static dm_status _dm_tcp_parse_sockets(int given, int* out, char* err, size_t cap) {
    *out = 1;
    if (given != 0) {
        if (given >= 1 && given <= _DM_TCP_MAX_SOCKETS) { *out = given; return DM_OK; }
        snprintf(err, cap, "tcp: desc.sockets_per_peer is %d; expected 1..%d (0: the default)", given,
                 _DM_TCP_MAX_SOCKETS);
        return DM_ERR_INVALID_ARG;
    }
    return _dm_cfg_int(_DM_CFG_SOCKETS_PER_PEER, out, err, cap);
}

/* Whether the group seals its links to other hosts (>>tcp seal): desc.encrypt (1 on, -1 off),
   else DISTMESH_ENCRYPT, else auto; the store's rule (distmesh_store.h >>store seal). */
static dm_status _dm_tcp_parse_encrypt(int given, const char* token, bool* out, char* err, size_t cap) {
    return _dm_st_parse_encrypt("tcp", given, token, out, err, cap);
}

static dm_status _dm_tcp_join(_dm_tcp_setup* s, dm_collective** out);
static dm_status _dm_tcp_join_flag(int given, bool* out, char* err, size_t cap);

static dm_status _dm_tcp_create_checked(const dm_tcp_desc* desc, dm_collective** out) {
    _DM_ZERO(dm_tcp_desc, d);
    _DM_ZERO(_dm_tcp_setup, s);
    char err[DM_LAST_ERROR_SIZE], url[320], host[256], why[DM_LAST_ERROR_SIZE], attempt[200];
    dm_env env;
    dm_status st;
    bool join = false;
    if (!out) return _DM_REPORT(NULL, err, sizeof(err), DM_ERR_INVALID_ARG, "tcp: out is NULL");
    *out = NULL;
    if (desc) d = *desc;
    if (!_dm_allocator_valid(&d.allocator))
        return _DM_REPORT(&d.logger, err, sizeof(err), DM_ERR_INVALID_ARG,
                          "tcp: allocator needs both alloc_fn and free_fn, or neither");
    _DM_TRY(_dm_cfg_check_create(&d.logger, d.timeout_ms, err, sizeof(err)));
    st = _dm_tcp_join_flag(d.join, &join, err, sizeof(err));
    if (st != DM_OK) return _dm_tcp_report(&d.logger, st, err);
    st = dm_env_detect(&env);
    /* a rank and world given here win over the launcher's variables, even broken ones */
    if (st != DM_OK && d.world_size > 0 && !join) st = _dm_env_detect_unlaunched(&env);
    if (st != DM_OK) return _dm_tcp_report(&d.logger, st, env.error);
    if (join) { d.world_size = 1; d.rank = 0; }    /* assigned by the grow (>>tcp grow) */
    if (d.world_size == 0) { d.world_size = env.world_size; d.rank = env.rank; }
    if (d.world_size < 1 || d.rank < 0 || d.rank >= d.world_size)
        return _DM_REPORT(&d.logger, err, sizeof(err), DM_ERR_INVALID_ARG,
                          "tcp: rank %d is not in 0..world_size-1 (world_size %d)", d.rank, d.world_size);
    if (!join) _dm_create_rank(d.rank);
    d.logger = _dm_logger_or_default(&d.logger, join ? -1 : d.rank);
    s.rank = d.rank;
    s.size = d.world_size;
    s.timeout_ms = d.timeout_ms ? d.timeout_ms : env.timeout_ms;
    s.prefix = d.prefix ? d.prefix : "distmesh/";
    if (strlen(s.prefix) > 150)
        return _DM_REPORT(&d.logger, err, sizeof(err), DM_ERR_INVALID_ARG, "tcp: prefix longer than 150 bytes");
    /* under torchrun, the attempt's own keys (>>store for backends) */
    if ((st = _dm_store_attempt_prefix(s.prefix, attempt, sizeof(attempt), why, sizeof(why))) != DM_OK)
        return _DM_REPORT(&d.logger, err, sizeof(err), st, "tcp: %s", why);
    s.prefix = attempt;
    s.ifname = d.ifname;
    if (!d.ifname && (st = _dm_cfg_str(_DM_CFG_SOCKET_IFNAME, &s.ifname, err, sizeof(err))) != DM_OK)
        return _dm_tcp_report(&d.logger, st, err);
    if (!s.ifname || !*s.ifname) s.ifname = getenv("GLOO_SOCKET_IFNAME");
    s.token = d.token;
    if (!d.token && (st = _dm_cfg_str(_DM_CFG_TOKEN, &s.token, err, sizeof(err))) != DM_OK)
        return _dm_tcp_report(&d.logger, st, err);
    if (s.token && strlen(s.token) > _DM_ST_TOKEN_MAX)
        return _DM_REPORT(&d.logger, err, sizeof(err), DM_ERR_INVALID_ARG, "tcp: token longer than %d bytes",
                          _DM_ST_TOKEN_MAX);
    st = _dm_tcp_parse_encrypt(d.encrypt, s.token, &s.encrypt, err, sizeof(err));
    if (st != DM_OK) return _dm_tcp_report(&d.logger, st, err);
    s.site = d.site;
    if (!d.site && (st = _dm_cfg_str(_DM_CFG_SITE, &s.site, err, sizeof(err))) != DM_OK)
        return _dm_tcp_report(&d.logger, st, err);
    if (s.site && strlen(s.site) > 63)
        return _DM_REPORT(&d.logger, err, sizeof(err), DM_ERR_INVALID_ARG, "tcp: desc.site longer than 63 bytes");
    s.chunk_bytes = d.chunk_bytes;
    st = _dm_tcp_parse_sockets(d.sockets_per_peer, &s.nsock, err, sizeof(err));
    if (st != DM_OK) return _dm_tcp_report(&d.logger, st, err);
    st = _dm_tcp_parse_transport(d.transport, &s.transport, err, sizeof(err));
    if (st != DM_OK) return _dm_tcp_report(&d.logger, st, err);
    s.logger = d.logger;
    s.allocator = d.allocator;
    s.route_host = env.master_addr[0] ? env.master_addr : NULL;
    /* the launcher's local rank and size, when the desc's rank is the launcher's */
    s.env_local = !join && env.local_from_launcher && d.rank == env.rank && d.world_size == env.world_size;
    s.env_local_rank = env.local_rank;
    s.env_local_size = env.local_world_size;
    /* the launcher's local ranks: local rank 0 meets the store for its host (>>tcp relay) */
    if (s.env_local && env.local_world_size > 1) {
        s.relay = env.local_rank == 0 ? _DM_TCP_LEADER : _DM_TCP_LOCAL;
        s.relay_expect = env.local_world_size - 1;
    }
    s.store = d.store;
    host[0] = 0;
    if (!s.store) {
        _DM_ZERO(dm_store_desc, sd);
        const char* agent = getenv("TORCHELASTIC_USE_AGENT_STORE");
        const char* u = d.store_url;
        bool from_launch = false, launch_server = false;
        if (!u && (st = _dm_cfg_str(_DM_CFG_STORE, &u, err, sizeof(err))) != DM_OK)
            return _dm_tcp_report(&d.logger, st, err);
        if ((!u || !*u) && (!env.master_addr[0] || env.master_port <= 0)) {
            dm_tcp_launch l;
            if (dm_tcp_launch_detect(&l) != DM_OK)
                return _DM_REPORT(&d.logger, err, sizeof(err), DM_ERR_ENV, "tcp: no store: %s", l.error);
            _dm_copy_name(url, sizeof(url), l.url);
            from_launch = true;
            launch_server = l.is_server;
        } else if (!u || !*u) {
            snprintf(url, sizeof(url), "tcp://%s:%d", env.master_addr, env.master_port);
        } else {
            _dm_copy_name(url, sizeof(url), u);
        }
        if (strncmp(url, "tcp://", 6) == 0) {
            const char* h = url + 6;
            const char* colon = strrchr(h, ':');
            size_t n = colon ? (size_t)(colon - h) : strlen(h);
            if (*h == '[' && n >= 2) { h++; n -= 2; }
            if (n < sizeof(host)) { memcpy(host, h, n); host[n] = 0; }
            s.route_host = host;
        }
        sd.url = url;
        sd.is_server = !join && strncmp(url, "tcp://", 6) == 0 &&
                       (from_launch ? launch_server : d.rank == 0 && !(agent && strcmp(agent, "True") == 0));
        sd.timeout_ms = s.timeout_ms;
        sd.token = s.token ? s.token : "";    /* the same token guards the store */
        sd.encrypt = s.encrypt ? 1 : -1;      /* and the store's connections follow the links */
        sd.logger = d.logger;
        sd.allocator = d.allocator;
        /* a second world in this process shares it. Through a relay (>>tcp relay) the store
           connects at its first request: a leader's, after it listens for its host's ranks
           (which then wait for it, however late the store host starts); never, for a rank
           whose leader meets the store for it */
        st = _dm_store_create_opt(&sd, true, s.relay != _DM_TCP_DIRECT, &s.store, why, sizeof(why));
        if (st != DM_OK)    /* the store's reason again: a failed create's last word names the cause */
            return _DM_REPORT(&d.logger, err, sizeof(err), st, "tcp: cannot open the store %s: %s", url, why);
        s.own_store = true;
    }
    return join ? _dm_tcp_join(&s, out) : _dm_tcp_build(&s, out);
}

/* The rendezvous of a group made from t (split, grow): t's interface, token, transports and
   sizes, under prefix (used once), watching t's connections to the members (a member that dies
   meanwhile fails it at once); why gets the failure's message. The store is the caller's. */
static void _dm_tcp_child_setup(const _dm_tcp* t, _dm_tcp_setup* s, const char* prefix, int rank, int size,
                                const int* members, char* why, size_t why_cap) {
    why[0] = 0;
    s->rank = rank;
    s->size = size;
    s->timeout_ms = t->base.timeout_ms;
    s->prefix = prefix;
    s->ifname = t->ifname;
    s->token = t->token;
    s->route_host = NULL;
    s->bind_sa = &t->self_sa;   /* t's interface and address family */
    s->once = true;
    s->chunk_bytes = t->lk.chunk;
    s->nsock = t->nsock;
    s->transport = t->transport;
    s->encrypt = t->encrypt;
    s->site = t->site;
    s->logger = t->base.logger;
    s->allocator = t->base.allocator;
    s->parent = t;
    s->members = members;
    s->err = why;
    s->err_cap = why_cap;
}

/* >>tcp split  Each member opens its listeners first (on the parent's address), then every rank
   gives (color, key, both listener addresses) to every other over the parent, so the members
   connect to each other without the store (whose host may be gone after a dm_shrink). They
   rendezvous like create, ordered by (key, old rank), under the group prefix
   "<prefix>split<seq>/<color>/" (the hello's group id). The parent's connections to the members
   are watched meanwhile: one that dies fails the split on every member with DM_ERR_PEER_LOST
   at once. A split that fails after the exchange breaks the parent like a failed collective. */
#define _DM_SPLIT_REC (8 + 2 * 64)     /* color i32, key i32, listener, recovery listener */
static dm_status _dm_tcp_split(dm_collective* c, int color, int key, dm_collective** out) {
    _dm_tcp* t = (_dm_tcp*)c;
    unsigned char mine[_DM_SPLIT_REC];
    unsigned char* all;
    int* members = NULL;
    char(*addrs)[64] = NULL;
    char(*raddrs)[64] = NULL;
    int W = c->size, j, k, new_rank = 0, new_size = 0, lfd = -1, rfd = -1, missing = -1;
    char prefix[512], why[DM_LAST_ERROR_SIZE];
    dm_status st;
    void* small[16];
    void** ptrs = small;
    _DM_ZERO(_dm_tcp_setup, s);
    *out = NULL;
    _DM_TRY(_dm_tcp_check_broken(t, "split"));
    all = (unsigned char*)_dm_malloc(&c->allocator, _DM_SPLIT_REC * (size_t)W);
    if (W > 16) ptrs = (void**)_dm_malloc(&c->allocator, sizeof(void*) * (size_t)W);
    if (!all || !ptrs) {
        _dm_free(&c->allocator, all);
        if (ptrs != small) _dm_free(&c->allocator, ptrs);
        return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "tcp: split: out of memory");
    }
    memset(mine, 0, sizeof(mine));
    _dm_tcp_put32(mine, (uint32_t)color);
    _dm_tcp_put32(mine + 4, (uint32_t)key);
    /* a listener that cannot open leaves its address empty: every member sees that below */
    if (color >= 0 && _dm_tcp_listen(t, &t->self_sa, &lfd, (char*)mine + 8) == DM_OK &&
        _dm_tcp_listen(t, &t->self_sa, &rfd, (char*)mine + 8 + 64) != DM_OK)
        mine[8] = 0;
    for (j = 0; j < W; j++) ptrs[j] = all + (size_t)j * _DM_SPLIT_REC;
    st = _dm_coll_all_gather_list(&t->lk, _DM_K_SPLIT, mine, (void* const*)ptrs, _DM_SPLIT_REC, DM_UINT8);
    if (ptrs != small) _dm_free(&c->allocator, ptrs);
    if (st != DM_OK || color < 0) goto done;
    for (j = 0; j < W; j++) {
        int cj = (int)_dm_tcp_get32(all + (size_t)j * _DM_SPLIT_REC), kj = (int)_dm_tcp_get32(all + (size_t)j * _DM_SPLIT_REC + 4);
        if (cj != color) continue;
        new_size++;
        if (kj < key || (kj == key && j < c->rank)) new_rank++;
    }
    if (strlen(t->prefix) + 40 > sizeof(t->user_prefix)) {   /* the same on every rank: nothing breaks */
        st = _DM_FAIL(c, DM_ERR_INVALID_ARG, "tcp: split: groups nested too deeply (store prefix \"%s\")", t->prefix);
        goto done;
    }
    /* the parent rank of each new rank, in (key, parent rank) order, and its addresses */
    members = (int*)_dm_malloc(&c->allocator, sizeof(int) * (size_t)new_size);
    addrs = (char(*)[64])_dm_calloc(&c->allocator, 64 * (size_t)new_size);
    raddrs = (char(*)[64])_dm_calloc(&c->allocator, 64 * (size_t)new_size);
    if (!members || !addrs || !raddrs) {
        _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "tcp: split: out of memory");
        st = _dm_eng_break(&t->lk, DM_ERR_OUT_OF_MEMORY);
        goto done;
    }
    for (j = 0; j < W; j++) {
        const unsigned char* rj = all + (size_t)j * _DM_SPLIT_REC;
        int r = 0, kj = (int)_dm_tcp_get32(rj + 4);
        if ((int)_dm_tcp_get32(rj) != color) continue;
        for (k = 0; k < W; k++) {
            const unsigned char* rk = all + (size_t)k * _DM_SPLIT_REC;
            int kk = (int)_dm_tcp_get32(rk + 4);
            if ((int)_dm_tcp_get32(rk) == color && (kk < kj || (kk == kj && k < j))) r++;
        }
        members[r] = j;
        memcpy(addrs[r], rj + 8, 63);
        memcpy(raddrs[r], rj + 8 + 64, 63);
        if (!addrs[r][0] && missing < 0) missing = j;
    }
    if (missing >= 0) {
        _DM_FAIL(c, DM_ERR_NETWORK, "tcp: split #%llu (color %d): rank %d could not open its listeners (see its log)",
                 (unsigned long long)c->seq, color, missing);
        st = _dm_eng_break(&t->lk, DM_ERR_NETWORK);
        goto done;
    }
    snprintf(prefix, sizeof(prefix), "%.470ssplit%llu/%d/", t->prefix, (unsigned long long)c->seq, color);
    _dm_tcp_child_setup(t, &s, prefix, new_rank, new_size, members, why, sizeof(why));
    /* may be NULL: notices and dm_grow only. A handle of its own (reference counted): the new
       group may outlive this one */
    s.store = NULL;
    if (t->store && dm_store_clone_prefixed(t->store, "", &s.store) != DM_OK) s.store = NULL;
    s.own_store = s.store != NULL;
    s.addrs = (const char(*)[64])addrs;
    s.raddrs = (const char(*)[64])raddrs;
    s.lfd = lfd;
    s.rfd = rfd;
    lfd = rfd = -1;             /* the build's now, whatever happens */
    st = _dm_tcp_build(&s, out);
    if (st != DM_OK) {
        _DM_FAIL(c, st, "tcp: split #%llu (color %d, %d members) failed: %s", (unsigned long long)c->seq, color,
                 new_size, why[0] ? why : dm_status_name(st));
        st = _dm_eng_break(&t->lk, st);
        goto done;
    }
    (*out)->timeout_ms = c->timeout_ms;
done:
    if (lfd >= 0) close(lfd);
    if (rfd >= 0) close(rfd);
    _dm_free(&c->allocator, all);
    _dm_free(&c->allocator, members);
    _dm_free(&c->allocator, addrs);
    _dm_free(&c->allocator, raddrs);
    return st;
}

/* >>tcp grow  The members call dm_grow(c, n_new, &out) at a step boundary; each newcomer calls
   dm_tcp_create with desc.join (or DISTMESH_JOIN=1) and desc.prefix the group's user prefix
   (the world's desc.prefix; a grown or shrunk group keeps its parent's). They meet in the
   group's store under "<prefix>grow/":
     ticket    a counter the newcomers take in arrival order: newcomer k holds ticket k
     seated    a counter member rank 0 takes one number of per seat it places
     seat/<k>  placed by member rank 0 for ticket k: "<round> <size> <rank> <transport>
               <sockets> <chunk>"; the newcomer holding ticket k reads it, deletes it and joins.
               "void" marks a ticket given up (a newcomer whose deadline passed, or a seat the
               members took back after a failed grow): both sides skip it.
   The round is the number of the first seat tried: unique under the prefix, so each grow's
   rendezvous, under "<prefix>grow<round>/" (used once, like split), is fresh however often the
   group grows. Member rank 0 places the seats, then an all-gather over c gives every member the
   round and checks that all asked for the same n_new. Then members and newcomers build the new
   group: a full rendezvous (new connections, the hello's token check for everyone); members
   keep their ranks, newcomers take size .. size + n_new - 1 in ticket order. Deadlines: the
   members' is c's timeout (a newcomer that never comes: DM_ERR_TIMEOUT naming its rank), a
   newcomer's is desc.timeout_ms for its seat and again for the rendezvous. A failed grow
   leaves c usable; member rank 0 takes back the seats not read yet. What stays in the store:
   the two counters per prefix, and a "void" key per ticket given up. */
#define _DM_TCP_GROW_MAGIC 0x57524744   /* "DGRW": the members' all-gather of a grow */
#define _DM_TCP_GROW_FIELDS 5           /* magic, n_new, rank 0's status, round low, round high */

static void _dm_tcp_grow_key(char* key, size_t cap, const char* user_prefix, const char* name, long long k) {
    if (k < 0) snprintf(key, cap, "%.480sgrow/%s", user_prefix, name);
    else snprintf(key, cap, "%.480sgrow/%s/%lld", user_prefix, name, k);
}
static void _dm_tcp_seat_value(const _dm_tcp* t, long long round, int size, int rank, char* out, size_t cap) {
    snprintf(out, cap, "%lld %d %d %d %d %llu", round, size, rank, t->transport, t->nsock,
             (unsigned long long)t->lk.chunk);
}

static void _dm_tcp_grow_revoke(_dm_tcp* t, dm_store* g, const int64_t* seats, int n_placed, int64_t round,
                                int n_new);
/* Member rank 0: places n_new seats on the next tickets (seats[i] for rank size + i) and
   returns the round. A ticket already "void" is skipped. A failure takes back what it placed. */
static dm_status _dm_tcp_grow_place(_dm_tcp* t, dm_store* g, int n_new, int64_t* seats, int64_t* round, int* placed_n);
static dm_status _dm_tcp_grow_open(_dm_tcp* t, dm_store* g, int n_new, int64_t* seats, int64_t* round) {
    int placed = 0;
    dm_status st = _dm_tcp_grow_place(t, g, n_new, seats, round, &placed);
    if (st != DM_OK) _dm_tcp_grow_revoke(t, g, seats, placed, *round, n_new);
    return st;
}
static dm_status _dm_tcp_grow_place(_dm_tcp* t, dm_store* g, int n_new, int64_t* seats, int64_t* round, int* placed_n) {
    char key[600], val[128];
    int i = 0;
    *round = -1;
    while (i < n_new) {
        int64_t k = 0;
        void* held = NULL;
        size_t held_n = 0, n;
        bool placed;
        dm_status st;
        _dm_tcp_grow_key(key, sizeof(key), t->user_prefix, "seated", -1);
        if ((st = dm_store_add(g, key, 1, &k)) != DM_OK)
            return _DM_FAIL(&t->base, st, "tcp: grow: store add \"%s\" failed: %s", key, dm_store_last_error(g));
        if (*round < 0) *round = k - 1;
        _dm_tcp_seat_value(t, (long long)*round, t->base.size + n_new, t->base.size + i, val, sizeof(val));
        _dm_tcp_grow_key(key, sizeof(key), t->user_prefix, "seat", (long long)(k - 1));
        n = strlen(val);
        if ((st = dm_store_compare_set(g, key, "", 0, val, n, &held, &held_n)) != DM_OK)
            return _DM_FAIL(&t->base, st, "tcp: grow: store compare_set \"%s\" failed: %s", key, dm_store_last_error(g));
        placed = held_n == n && memcmp(held, val, n) == 0;
        dm_store_free(g, held);
        if (placed) *placed_n = ++i, seats[i - 1] = k - 1;
    }
    return DM_OK;
}

/* Member rank 0 after a failed grow: seats nobody read become "void" (a seat already read is
   gone from the store, and compare_set then writes nothing). */
static void _dm_tcp_grow_revoke(_dm_tcp* t, dm_store* g, const int64_t* seats, int n_placed, int64_t round,
                                int n_new) {
    char key[600], val[128];
    int i;
    g->timeout_ms = _DM_TCP_NOTICE_MS;      /* bounded: the store may be what failed */
    for (i = 0; i < n_placed; i++) {
        void* held = NULL;
        size_t held_n = 0;
        _dm_tcp_seat_value(t, (long long)round, t->base.size + n_new, t->base.size + i, val, sizeof(val));
        _dm_tcp_grow_key(key, sizeof(key), t->user_prefix, "seat", (long long)seats[i]);
        if (dm_store_compare_set(g, key, val, strlen(val), "void", 4, &held, &held_n) == DM_OK) dm_store_free(g, held);
    }
}

/* The members' all-gather: every member's n_new, and rank 0's status and round. */
static dm_status _dm_tcp_grow_agree(_dm_tcp* t, int n_new, dm_status opened, int64_t* round) {
    dm_collective* c = &t->base;
    int32_t mine[_DM_TCP_GROW_FIELDS];
    int32_t* all;
    void* small[16];
    void** ptrs = small;
    int W = c->size, j;
    dm_status st;
    all = (int32_t*)_dm_malloc(&c->allocator, sizeof(int32_t) * _DM_TCP_GROW_FIELDS * (size_t)W);
    if (W > 16) ptrs = (void**)_dm_malloc(&c->allocator, sizeof(void*) * (size_t)W);
    if (!all || !ptrs) {
        _dm_free(&c->allocator, all);
        if (ptrs != small) _dm_free(&c->allocator, ptrs);
        return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "tcp: grow: out of memory");
    }
    mine[0] = (int32_t)_DM_TCP_GROW_MAGIC;
    mine[1] = n_new;
    mine[2] = (int32_t)opened;
    mine[3] = (int32_t)(uint32_t)((uint64_t)*round & 0xffffffffu);
    mine[4] = (int32_t)(uint32_t)((uint64_t)*round >> 32);
    for (j = 0; j < W; j++) ptrs[j] = all + _DM_TCP_GROW_FIELDS * j;
    /* the split kind with another count: a grow that meets a split is a mismatch on both */
    st = _dm_coll_all_gather_list(&t->lk, _DM_K_SPLIT, mine, (void* const*)ptrs, _DM_TCP_GROW_FIELDS, DM_INT32);
    if (ptrs != small) _dm_free(&c->allocator, ptrs);
    for (j = 0; st == DM_OK && j < W; j++) {
        const int32_t* a = all + _DM_TCP_GROW_FIELDS * j;
        if (a[0] != (int32_t)_DM_TCP_GROW_MAGIC || a[1] != n_new)
            st = _DM_FAIL(c, DM_ERR_INVALID_ARG, "tcp: grow: rank %d asked for %d newcomers, rank %d for %d (every "
                          "member must pass the same n_new)", c->rank, n_new, j, a[0] == (int32_t)_DM_TCP_GROW_MAGIC ?
                          a[1] : -1);
    }
    if (st == DM_OK && all[2] != DM_OK)
        st = c->rank == 0 ? opened : _DM_FAIL(c, (dm_status)all[2], "tcp: grow: member rank 0 could not place the "
                                              "newcomers' seats in the store (%s; see rank 0's log)",
                                              dm_status_name((dm_status)all[2]));
    if (st == DM_OK) *round = (int64_t)(((uint64_t)(uint32_t)all[4] << 32) | (uint64_t)(uint32_t)all[3]);
    _dm_free(&c->allocator, all);
    return st;
}

static dm_status _dm_tcp_grow(dm_collective* c, int n_new, dm_collective** out) {
    _dm_tcp* t = (_dm_tcp*)c;
    int W = c->size, j;
    int64_t round = -1;
    int64_t* seats = NULL;
    int* members = NULL;
    dm_store* g = NULL;
    char prefix[512], why[DM_LAST_ERROR_SIZE];
    dm_status st, opened = DM_OK;
    _DM_ZERO(_dm_tcp_setup, s);
    *out = NULL;
    _DM_TRY(_dm_tcp_check_broken(t, "grow"));
    if (!t->store) return _DM_FAIL(c, DM_ERR_UNSUPPORTED, "tcp: grow needs the group's store, which is gone");
    seats = (int64_t*)_dm_calloc(&c->allocator, sizeof(int64_t) * (size_t)n_new);
    members = (int*)_dm_malloc(&c->allocator, sizeof(int) * (size_t)(W + n_new));
    if (!seats || !members || dm_store_clone_prefixed(t->store, "", &g) != DM_OK) {
        st = _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "tcp: grow: out of memory");
        goto done;
    }
    g->timeout_ms = c->timeout_ms;          /* the members' deadline, not the store's own */
    if (c->rank == 0) opened = _dm_tcp_grow_open(t, g, n_new, seats, &round);
    if ((st = _dm_tcp_grow_agree(t, n_new, opened, &round)) != DM_OK) {
        if (c->rank == 0 && opened == DM_OK) _dm_tcp_grow_revoke(t, g, seats, n_new, round, n_new);
        goto done;
    }
    for (j = 0; j < W + n_new; j++) members[j] = j < W ? j : -1;
    snprintf(prefix, sizeof(prefix), "%.470sgrow%lld/", t->user_prefix, (long long)round);
    _dm_tcp_child_setup(t, &s, prefix, c->rank, W + n_new, members, why, sizeof(why));
    /* the members rendezvous through their host's lowest rank (>>tcp relay) */
    for (j = 0; t->host_of && j < W; j++) s.relay_expect += j != c->rank && t->host_of[j] == t->host_of[c->rank];
    if (s.relay_expect > 0) s.relay = t->host_of[c->rank] == c->rank ? _DM_TCP_LEADER : _DM_TCP_LOCAL;
    /* the new group holds its own handle on the store (reference counted): c is usually
       destroyed right after, and the new group grows again through the same store */
    if (dm_store_clone_prefixed(t->store, "", &s.store) != DM_OK) {
        if (c->rank == 0) _dm_tcp_grow_revoke(t, g, seats, n_new, round, n_new);
        st = _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "tcp: grow: out of memory");
        goto done;
    }
    s.own_store = true;         /* _dm_tcp_build owns it from here, also when it fails */
    st = _dm_tcp_build(&s, out);
    if (st != DM_OK) {
        if (c->rank == 0) _dm_tcp_grow_revoke(t, g, seats, n_new, round, n_new);
        _DM_FAIL(c, st, "tcp: grow from %d to %d ranks (round %lld under \"%s\") failed: %s", W, W + n_new,
                 (long long)round, t->user_prefix, why[0] ? why : dm_status_name(st));
        goto done;
    }
    /* newcomers find the next grow under the same prefix */
    _dm_copy_name(((_dm_tcp*)*out)->user_prefix, sizeof(t->user_prefix), t->user_prefix);
    (*out)->timeout_ms = c->timeout_ms;
done:
    dm_store_destroy(g);
    _dm_free(&c->allocator, seats);
    _dm_free(&c->allocator, members);
    return st;
}

/* >>tcp join  A newcomer's side of dm_grow (DISTMESH_JOIN): it waits for its seat, then builds. */
/* desc.join, else DISTMESH_JOIN ("0" or "1"; anything else is DM_ERR_ENV). */
static dm_status _dm_tcp_join_flag(int given, bool* out, char* err, size_t cap) {
    int v = 0;
    *out = given != 0;
    if (given != 0) return DM_OK;
    if (_dm_cfg_int(_DM_CFG_JOIN, &v, err, cap) != DM_OK) return DM_ERR_ENV;
    *out = v != 0;
    return DM_OK;
}

/* A newcomer's seat: parsed from its value, checked. */
typedef struct _dm_tcp_seat { long long round; int size, rank, transport, nsock; unsigned long long chunk; } _dm_tcp_seat;
static bool _dm_tcp_seat_parse(const void* v, size_t n, _dm_tcp_seat* out) {
    char text[128];
    int used = 0;
    if (n == 0 || n >= sizeof(text)) return false;
    memcpy(text, v, n);
    text[n] = 0;
    if (sscanf(text, "%lld %d %d %d %d %llu%n", &out->round, &out->size, &out->rank, &out->transport, &out->nsock,
               &out->chunk, &used) != 6 || (size_t)used != n)
        return false;
    return out->round >= 0 && out->size >= 2 && out->rank >= 1 && out->rank < out->size && out->transport >= 0 &&
           out->transport <= 2 && out->nsock >= 1 && out->nsock <= _DM_TCP_MAX_SOCKETS && out->chunk > 0;
}

/* Waits for the seat of ticket k until deadline: 1 got it (in v, n), 0 "void" (skip the
   ticket), or a failure recorded in err. A seat that never comes is given up ("void") with a
   compare_set, which also catches one placed in the last moment. */
static int _dm_tcp_join_wait_seat(dm_store* w, const char* key, int64_t deadline, void** v, size_t* n, dm_status* st,
                                  char* err, size_t cap) {
    int64_t left = deadline == INT64_MAX ? -1 : deadline - _dm_now_ms();
    const char* k1 = key;
    w->timeout_ms = left < 0 ? -1 : left < 1 ? 1 : left > INT_MAX ? INT_MAX : (int)left;
    *st = dm_store_wait(w, &k1, 1, w->timeout_ms);
    if (*st == DM_OK) *st = dm_store_get(w, key, v, n);
    else if (*st == DM_ERR_TIMEOUT && !w->sh->broken) {
        w->timeout_ms = _DM_TCP_NOTICE_MS;
        *st = dm_store_compare_set(w, key, "", 0, "void", 4, v, n);
        if (*st == DM_OK && *n == 4 && memcmp(*v, "void", 4) == 0) {
            dm_store_free(w, *v);
            *v = NULL;
            *st = DM_ERR_TIMEOUT;
            snprintf(err, cap, "tcp: join: no group opened a grow for this newcomer within its deadline (ticket "
                     "\"%.200s\"; the members call dm_grow(c, n_new, &out), and the newcomer's prefix and store must "
                     "be the group's)", key);
            return -1;
        }
    }
    if (*st != DM_OK) {
        snprintf(err, cap, "tcp: join: waiting for a seat under \"%.200s\" failed: %.200s", key, dm_store_last_error(w));
        return -1;
    }
    if (*n == 4 && memcmp(*v, "void", 4) == 0) {
        dm_store_free(w, *v);
        *v = NULL;
        return 0;
    }
    return 1;
}

/* The newcomer's side: take a ticket, wait for its seat, build the group it names. */
static dm_status _dm_tcp_join(_dm_tcp_setup* s, dm_collective** out) {
    char key[600], prefix[512], err[DM_LAST_ERROR_SIZE], user_prefix[480];
    int64_t deadline = _dm_deadline(s->timeout_ms);
    _dm_tcp_seat seat;
    dm_store* w = NULL;
    dm_status st = DM_OK;
    int got = 0;
    err[0] = 0;
    if (dm_store_clone_prefixed(s->store, "", &w) != DM_OK) {
        st = DM_ERR_OUT_OF_MEMORY;
        snprintf(err, sizeof(err), "tcp: join: out of memory");
        goto fail;
    }
    memset(&w->logger, 0, sizeof(w->logger));   /* a wait that times out is reported once, below */
    while (got == 0) {
        int64_t ticket = 0, left = deadline == INT64_MAX ? -1 : deadline - _dm_now_ms();
        void* v = NULL;
        size_t n = 0;
        w->timeout_ms = left < 0 ? -1 : left < 1 ? 1 : left > INT_MAX ? INT_MAX : (int)left;
        _dm_tcp_grow_key(key, sizeof(key), s->prefix, "ticket", -1);
        if ((st = dm_store_add(w, key, 1, &ticket)) != DM_OK) {
            snprintf(err, sizeof(err), "tcp: join: store add \"%.200s\" failed: %.200s", key, dm_store_last_error(w));
            goto fail;
        }
        _dm_tcp_grow_key(key, sizeof(key), s->prefix, "seat", (long long)(ticket - 1));
        _DM_LOG(&s->logger, DM_LOG_INFO, "tcp: join: newcomer waits for its seat \"%s\"", key);
        got = _dm_tcp_join_wait_seat(w, key, deadline, &v, &n, &st, err, sizeof(err));
        if (got < 0) goto fail;
        if (got == 1) {
            bool ok = _dm_tcp_seat_parse(v, n, &seat);
            dm_store_free(w, v);
            if (!ok) {
                st = DM_ERR_PROTOCOL;
                snprintf(err, sizeof(err), "tcp: join: the seat \"%.200s\" holds no valid seat (another program "
                         "uses this prefix?)", key);
                goto fail;
            }
            dm_store_delete(w, key, NULL);      /* read: the members take back nothing */
        }
    }
    dm_store_destroy(w);
    w = NULL;
    _dm_copy_name(user_prefix, sizeof(user_prefix), s->prefix);
    snprintf(prefix, sizeof(prefix), "%.470sgrow%lld/", s->prefix, seat.round);
    s->rank = seat.rank;
    s->size = seat.size;
    s->prefix = prefix;
    s->once = true;
    s->transport = seat.transport;
    s->nsock = seat.nsock;
    s->chunk_bytes = (size_t)seat.chunk;
    st = _dm_tcp_build(s, out);     /* owns the store from here, also on failure */
    if (st == DM_OK) _dm_copy_name(((_dm_tcp*)*out)->user_prefix, sizeof(user_prefix), user_prefix);
    return st;
fail:
    dm_store_destroy(w);
    if (s->own_store) dm_store_destroy(s->store);
    return _dm_tcp_report(&s->logger, st, err);
}

/* >>tcp shrink  dm_shrink without the store (its host may be the rank that died) and without a
   rendezvous. Every rank has a second listener, the recovery listener (rfd), that no
   collective serves and no break closes, only destroy: a connection it refuses means the rank
   is gone. The survivors (the parent's ranks not excluded) connect to each other there, a
   full mesh among themselves, with the usual hello and token check under the group id of
   "<prefix>shrink/" (the higher rank connects; a lower rank whose recovery listener refuses
   is dead, and so is a higher rank that never connects while its listener refuses probes).
   Over these connections they agree on who is gone, with the end of a connection as a
   perfect failure detector (a rank's sockets end only when it dies or gives up):
     1. each sends every other its set (excluded or dead so far) and merges what it receives;
        a connection that ends marks its rank dead;
     2. rotating coordinator: for each rank c in order, c sends its set to every survivor it
        is connected to and each adopts what it receives; a rank whose coordinator died keeps
        its own. After the first coordinator that lives through its round every survivor
        holds that set, and the later rounds only pass it on, so all survivors end with the
        same set. A rank that dies after the agreement stays a member: the new group's first
        call fails with DM_ERR_PEER_LOST on every survivor, and a second shrink removes it.
   Frames (little-endian): magic "DMSK", kind u32 (1 set, 2 coordinator's set), from u32,
   world u32, the sender's new recovery listener (64 bytes; empty in step 1, before it opens),
   then the set as a bitmap of world bits. Nothing after the agreement talks: the new group is the
   parent's layout without the gone ranks (host identities do not change), keeps these
   connections (a break ends the parent's sockets, and they may hold half an aborted message),
   serves the parent's recovery listener as its own listener, knows the members' new recovery
   listeners from their frames and takes over the parent's store. So every survivor that
   finishes the agreement returns the same group, even when a rank dies right after it.
   Shared memory keeps the parent's segment, already mapped and faulted in: before the
   agreement each rank publishes, on every ring it writes, where the old stream stopped
   (_dm_ring.stop, with the new group's epoch); after it, each reader skips to that point, so
   whatever an aborted call left in a ring is dropped and the new stream starts clean, and the
   group takes the segment's next abort word. A segment has 8; past them a new segment is set
   up, which talks, as the extra sockets' setup does with several sockets per peer: a death
   during either fails the shrink on some ranks only. A parent on sockets alone gives a group
   on sockets alone. The parent can only be destroyed afterwards. */
#define _DM_SHRINK_MAGIC 0x4b534d44u    /* "DMSK" */
/* Probes of the higher ranks still missing: at once, then soon (a dying rank closes its sockets
   one by one, its listener maybe a moment after the socket that told this rank), then seldom
   (a live rank answers each probe, which costs it time). */
static int _dm_shrink_probe_gap_ms(int probes) { return probes < 2 ? 5 : probes < 4 ? 15 : 50; }

/* Which of a ring's two stop marks a shrink of p uses: the new group's slot's. Two suffice:
   this rank can mark for the shrink after next only once it has agreed the next one with every
   member, and a member takes part in that only after it has read this shrink's mark. One did
   not: a survivor that finished the agreement first could shrink again (a member died after
   the agreement) and overwrite the mark a slower survivor had still to read, which then timed
   out waiting for it while the others had their group. */
static int _dm_tcp_shrink_mark(const _dm_tcp* p) { return (p->shm_slot + 1) & 1; }

/* Where this rank's streams into the parent's rings stopped, for the readers (see above). The
   parent makes no more calls, so head no longer moves. */
static void _dm_tcp_shrink_stop_rings(_dm_tcp* p, uint32_t epoch) {
    int r, s = _dm_tcp_shrink_mark(p);
    for (r = 0; r < p->base.size && p->lk.links; r++) {
        _dm_link* l = p->lk.links[r];
        _dm_memlink* m;
        if (!l || l->vt != &_dm_shm_vt) continue;
        m = (_dm_memlink*)l;
        __atomic_store_n(&m->out->stop[s], m->out->head, __ATOMIC_RELAXED);
        __atomic_store_n(&m->out->stop_epoch[s], epoch, __ATOMIC_RELEASE);
    }
}
static uint32_t _dm_tcp_shrink_epoch(const _dm_tcp* n) { return (uint32_t)_dm_tcp_hash(7, n->prefix, NULL) | 1u; }

/* The parent's segment for the new group (see above); old_of[j]: the parent rank of new rank j.
   Each same-host member's memory link is the parent's (its rings, its bell) with the new side
   socket; the segment's layout is the first group's, whatever the numbering now. */
static dm_status _dm_tcp_shrink_shm(_dm_tcp* n, _dm_tcp* p, const int* old_of, int64_t deadline) {
    const _dm_layout* ny = &n->lk.lay;
    int me = n->base.rank, j, s = _dm_tcp_shrink_mark(p);
    uint32_t epoch = _dm_tcp_shrink_epoch(n);
    n->shm_vote = p->shm_vote;
    n->shm_slot = p->shm_slot + 1;
    if (!p->seg.base) return DM_OK;         /* this rank was alone on its host */
    _dm_shm_watch_stop(&p->seg, &p->base.allocator);
    for (j = 0; j < n->base.size; j++) {
        _dm_link* old = p->lk.links[old_of[j]];
        _dm_memlink *pm, *m;
        if (j == me || ny->host_of[j] != ny->host_of[me]) continue;
        if (!old || old->vt != &_dm_shm_vt)
            return _DM_FAIL(&n->base, DM_ERR_INTERNAL, "tcp: shrink: rank %d shares the host but had no "
                            "shared-memory link", j);
        pm = (_dm_memlink*)old;
        while (__atomic_load_n(&pm->in->stop_epoch[s], __ATOMIC_ACQUIRE) != epoch) {   /* set before the agreement */
            if (_dm_now_ms() >= deadline)
                return _DM_FAIL(&n->base, DM_ERR_TIMEOUT, "tcp: shrink: rank %d never marked its shared-memory "
                                "ring", j);
            sched_yield();
        }
        pm->in_tail = pm->in_head = __atomic_load_n(&pm->in->stop[s], __ATOMIC_RELAXED);
        pm->inl_len = 0;
        __atomic_store_n(&pm->in->tail, pm->in_tail, __ATOMIC_RELEASE);
        m = (_dm_memlink*)_dm_calloc(&n->base.allocator, sizeof(_dm_memlink));
        if (!m) return _DM_FAIL(&n->base, DM_ERR_OUT_OF_MEMORY, "tcp: out of memory");
        *m = *pm;
        m->side_fd = n->fds[j];
        snprintf(m->base.where, sizeof(m->base.where), "%.40s, shm", n->addrs[j]);
        n->lk.links[j]->vt->destroy(n->lk.links[j], &n->base.allocator);
        n->lk.links[j] = &m->base;
        _dm_bell_ring(m->peer_bell, m->bell_ops);   /* room for a writer that waits */
    }
    n->lk.bell = p->lk.bell;
    n->lk.bells = p->lk.bells;
    n->lk.nbells = p->lk.nbells;
    n->lk.bell_ops = p->lk.bell_ops;
    n->lk.abort = _dm_shm_abort_word(&p->seg, n->shm_slot);
    n->seg.base = p->seg.base;              /* the mapping moves to the new group */
    n->seg.size = p->seg.size;
    p->seg.base = NULL;
    _dm_shm_watch_start(&n->seg, &n->lk);
    return DM_OK;
}

/* The parent gives way: later calls fail with DM_ERR_ABORTED naming dm_shrink. */
static void _dm_tcp_retire(_dm_tcp* t) {
    if (t->lk.broken != DM_OK) return;
    t->lk.broken = DM_ERR_ABORTED;
    _dm_copy_name(t->lk.broken_msg, sizeof(t->lk.broken_msg),
                  "this collective was shrunk into a new one by dm_shrink; destroy it");
}

/* The agreement's group, still numbered like the parent: its recovery addresses, its recovery
   listener (moved), the same token and transports. */
static dm_status _dm_tcp_shrink_start(_dm_tcp* p, _dm_tcp** out) {
    dm_collective* c = &p->base;
    int W = c->size, j;
    _dm_tcp* n = (_dm_tcp*)_dm_calloc(&c->allocator, sizeof(_dm_tcp));
    *out = n;
    if (!n) return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "tcp: shrink: out of memory");
    n->lfd = n->rfd = -1;
    _dm_collective_init(&n->base, &n->core, &_dm_tcp_vtable, c->rank, W, c->timeout_ms, &c->logger, &c->allocator);
    n->base.timeout_ms = c->timeout_ms;
    n->nsock = p->nsock;
    n->transport = p->transport;
    _dm_copy_name(n->token, sizeof(n->token), p->token);
    n->encrypt = p->encrypt;
    _dm_copy_name(n->ifname, sizeof(n->ifname), p->ifname);
    _dm_copy_name(n->user_prefix, sizeof(n->user_prefix), p->user_prefix);
    memcpy(&n->self_sa, &p->self_sa, sizeof(n->self_sa));
    if (strlen(p->prefix) + 8 >= sizeof(n->prefix))
        return _DM_FAIL(c, DM_ERR_INVALID_ARG, "tcp: shrink: groups nested too deeply (store prefix \"%s\")", p->prefix);
    snprintf(n->prefix, sizeof(n->prefix), "%.500sshrink/", p->prefix);
    n->group = _dm_tcp_hash(1, n->prefix, NULL);
    n->fds = (int*)_dm_malloc(&c->allocator, sizeof(int) * (size_t)W * (size_t)n->nsock);
    n->addrs = (char(*)[64])_dm_calloc(&c->allocator, 64 * (size_t)W);
    n->raddrs = (char(*)[64])_dm_calloc(&c->allocator, 64 * (size_t)W);
    if (!n->fds || !n->addrs || !n->raddrs) return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "tcp: shrink: out of memory");
    for (j = 0; j < W * n->nsock; j++) n->fds[j] = -1;
    n->claims = n->fds;
    memcpy(n->addrs, p->raddrs, 64 * (size_t)W);
    n->lfd = p->rfd;
    p->rfd = -1;
    n->serving = true;
    n->built = true;            /* no watching: an ending connection is a death, not a failure */
    n->refusal_final = true;
    return DM_OK;
}

/* Connects the survivors: down to the lower ones, then accepts the higher ones while probing
   those missing. dead[] grows with every rank found gone. */
static dm_status _dm_tcp_shrink_connect(_dm_tcp* n, bool* dead, int64_t deadline) {
    int W = n->base.size, me = n->base.rank, j;
    int64_t next_probe = _dm_now_ms();
    int probes = 0;
    struct pollfd p[1 + _DM_TCP_HS_MAX];
    dm_status st;
    for (j = 0; j < W; j++)         /* a member that died before it announced one (see the agreement) */
        if (!n->addrs[j][0]) dead[j] = true;
    for (j = 0; j < me; j++) {
        if (dead[j]) continue;
        if (_dm_tcp_probe(n, j) < 0) { dead[j] = true; continue; }  /* a recovery listener is never late */
        st = _dm_tcp_connect_peer(n, j, n->group, deadline);
        if (st == DM_OK && (st = _dm_tcp_read_ack(n, j, deadline)) != DM_OK) {
            close(n->fds[j]);
            n->fds[j] = -1;
        }
        if (st == DM_ERR_PEER_LOST) dead[j] = true;
        else if (st != DM_OK) return st;
    }
    for (;;) {
        int64_t now = _dm_now_ms();
        int missing = 0, first = -1, np;
        for (j = me + 1; j < W; j++)
            if (!dead[j] && !_dm_tcp_has_peer(n, j) && missing++ == 0) first = j;
        if (missing == 0) return DM_OK;
        if (now >= deadline)
            return _DM_FAIL(&n->base, DM_ERR_TIMEOUT, "tcp: shrink timed out after %d ms waiting for rank %d (%d "
                            "ranks missing): alive but not in dm_shrink (give every survivor the same exclude list)",
                            n->base.timeout_ms, first, missing);
        np = _dm_tcp_serve_fill(n, p, 1 + _DM_TCP_HS_MAX, NULL);
        if (poll(p, (nfds_t)np, 5) < 0 && errno != EINTR)
            return _DM_FAIL(&n->base, DM_ERR_NETWORK, "tcp: shrink: poll failed (%s)", strerror(errno));
        _dm_tcp_serve(n, deadline);
        if (_dm_now_ms() < next_probe) continue;
        for (j = me + 1; j < W; j++)
            if (!dead[j] && !_dm_tcp_has_peer(n, j) && _dm_tcp_probe(n, j) < 0) dead[j] = true;
        next_probe = _dm_now_ms() + _dm_shrink_probe_gap_ms(probes++);
    }
}

/* One agreement frame to or from rank j; false when the connection ended or sent garbage
   (the rank is then dead to this one). A timeout is the caller's failure (*timed_out). */
static bool _dm_tcp_shrink_io(_dm_tcp* n, int j, unsigned char* f, size_t len, bool out, uint32_t kind,
                              int64_t deadline, bool* timed_out) {
    int rc = _dm_tcp_io_full(NULL, n->fds[j], f, len, out, deadline);
    if (rc == 0) *timed_out = true;
    if (rc != 1) return false;
    return out || (_dm_tcp_get32(f) == _DM_SHRINK_MAGIC && _dm_tcp_get32(f + 4) == kind &&
                   _dm_tcp_get32(f + 8) == (uint32_t)j && _dm_tcp_get32(f + 12) == (uint32_t)n->base.size);
}
#define _DM_SHRINK_SET 80            /* the bitmap's offset in a frame */
static void _dm_tcp_shrink_frame(const _dm_tcp* n, unsigned char* f, uint32_t kind, const bool* set) {
    int W = n->base.size, j;
    _dm_tcp_put32(f, _DM_SHRINK_MAGIC);
    _dm_tcp_put32(f + 4, kind);
    _dm_tcp_put32(f + 8, (uint32_t)n->base.rank);
    _dm_tcp_put32(f + 12, (uint32_t)W);
    memcpy(f + 16, n->raddrs[n->base.rank], 64);
    memset(f + _DM_SHRINK_SET, 0, ((size_t)W + 7) / 8);
    for (j = 0; j < W; j++)
        if (set[j]) f[_DM_SHRINK_SET + j / 8] |= (unsigned char)(1u << (j % 8));
}
static bool _dm_tcp_shrink_bit(const unsigned char* f, int j) {
    return (f[_DM_SHRINK_SET + j / 8] >> (j % 8)) & 1u;
}

/* The agreement (see above): on return gone[] is the set every survivor holds. up[j]: this
   rank's connection to j still works. */
static dm_status _dm_tcp_shrink_agree(_dm_tcp* n, bool* gone, int64_t deadline) {
    int W = n->base.size, me = n->base.rank, j, k;
    size_t len = _DM_SHRINK_SET + ((size_t)W + 7) / 8;
    unsigned char* f = (unsigned char*)_dm_malloc(&n->base.allocator, len);
    bool* up = (bool*)_dm_calloc(&n->base.allocator, sizeof(bool) * (size_t)W);
    bool timed_out = false;
    if (!f || !up) {
        _dm_free(&n->base.allocator, f);
        _dm_free(&n->base.allocator, up);
        return _DM_FAIL(&n->base, DM_ERR_OUT_OF_MEMORY, "tcp: shrink: out of memory");
    }
    for (j = 0; j < W; j++) up[j] = j != me && !gone[j] && n->fds[j] >= 0;
    /* 1: every survivor's set to every survivor */
    _dm_tcp_shrink_frame(n, f, 1, gone);
    for (j = 0; j < W; j++)
        if (up[j] && !_dm_tcp_shrink_io(n, j, f, len, true, 1, deadline, &timed_out)) up[j] = false;
    for (j = 0; j < W && !timed_out; j++) {
        if (!up[j]) continue;
        if (!_dm_tcp_shrink_io(n, j, f, len, false, 1, deadline, &timed_out)) { up[j] = false; continue; }
        for (k = 0; k < W; k++) gone[k] = gone[k] || _dm_tcp_shrink_bit(f, k);
    }
    for (j = 0; j < W; j++) gone[j] = gone[j] || (j != me && !up[j]);
    /* The new group's recovery listener, announced in this rank's round below. Not earlier: a
       port a dead rank's listener had may come back here, and every survivor has stopped
       probing once this rank has everyone's set (probes belong to the connections). */
    if (!timed_out && _dm_tcp_listen(n, &n->self_sa, &n->rfd, n->raddrs[me]) != DM_OK) {
        _dm_free(&n->base.allocator, f);
        _dm_free(&n->base.allocator, up);
        return DM_ERR_NETWORK;
    }
    /* 2: rotating coordinator */
    for (k = 0; k < W && !timed_out; k++) {
        if (k == me) {
            _dm_tcp_shrink_frame(n, f, 2, gone);
            for (j = 0; j < W; j++)
                if (up[j] && !_dm_tcp_shrink_io(n, j, f, len, true, 2, deadline, &timed_out)) up[j] = false;
        } else if (up[k]) {
            if (!_dm_tcp_shrink_io(n, k, f, len, false, 2, deadline, &timed_out)) { up[k] = false; continue; }
            memcpy(n->raddrs[k], f + 16, 63);
            for (j = 0; j < W; j++) gone[j] = _dm_tcp_shrink_bit(f, j);
        }
    }
    _dm_free(&n->base.allocator, f);
    _dm_free(&n->base.allocator, up);
    if (timed_out)
        return _DM_FAIL(&n->base, DM_ERR_TIMEOUT, "tcp: shrink timed out after %d ms agreeing on who is gone",
                        n->base.timeout_ms);
    return DM_OK;
}

static dm_status _dm_tcp_shrink_build(_dm_tcp* n, _dm_tcp* p, const int* old_of, int64_t deadline);
/* Renumbers the agreement's group to the members (gone[] false) and makes it a working group:
   links, a new recovery listener, hosts and shared memory, P, extra sockets. */
static dm_status _dm_tcp_shrink_finish(_dm_tcp* n, _dm_tcp* p, const bool* gone, int64_t deadline) {
    dm_allocator* a = &n->base.allocator;
    int W = n->base.size, me = n->base.rank, j, k = 0, N = 0;
    int *fds, *old_of;
    unsigned char* nonces;      /* the hellos' nonces by the new numbering (>>tcp seal) */
    dm_status st;
    char(*addrs)[64];
    char(*raddrs)[64];
    if (gone[me])
        return _DM_FAIL(&n->base, DM_ERR_ABORTED, "tcp: shrink: the survivors left rank %d out (it was excluded, "
                        "or seen as dead by the others)", me);
    for (j = 0; j < W; j++) N += !gone[j];
    fds = (int*)_dm_malloc(a, sizeof(int) * (size_t)N * (size_t)n->nsock);
    addrs = (char(*)[64])_dm_calloc(a, 64 * (size_t)N);
    raddrs = (char(*)[64])_dm_calloc(a, 64 * (size_t)N);
    old_of = (int*)_dm_malloc(a, sizeof(int) * (size_t)N);
    nonces = n->hs_nonces ? (unsigned char*)_dm_calloc(a, 65 * (size_t)N) : NULL;
    if (!fds || !addrs || !raddrs || !old_of || (n->hs_nonces && !nonces)) {
        _dm_free(a, nonces);
        _dm_free(a, fds);
        _dm_free(a, addrs);
        _dm_free(a, raddrs);
        _dm_free(a, old_of);
        return _DM_FAIL(&n->base, DM_ERR_OUT_OF_MEMORY, "tcp: shrink: out of memory");
    }
    for (j = 0; j < N * n->nsock; j++) fds[j] = -1;
    for (j = 0; j < W; j++) {
        if (gone[j]) {
            if (n->fds[j] >= 0) close(n->fds[j]);
            continue;
        }
        if (j == me) n->base.rank = k;
        old_of[k] = j;
        fds[k] = n->fds[j];
        memcpy(addrs[k], n->addrs[j], 64);
        memcpy(raddrs[k], n->raddrs[j], 64);
        if (nonces) memcpy(nonces + 65 * (size_t)k, n->hs_nonces + 65 * (size_t)j, 65);   /* >>tcp seal */
        k++;
    }
    if (n->hs_nonces) {
        memset(n->hs_nonces, 0, 65 * (size_t)W);
        _dm_free(a, n->hs_nonces);
        n->hs_nonces = nonces;
    }
    _dm_free(a, n->fds);
    _dm_free(a, n->addrs);
    _dm_free(a, n->raddrs);
    n->fds = n->claims = fds;
    n->addrs = addrs;
    n->raddrs = raddrs;
    n->base.size = N;
    me = n->base.rank;
    st = _dm_tcp_shrink_build(n, p, old_of, deadline);
    _dm_free(a, old_of);
    return st;
}
/* The parent's layout without the gone ranks: host_of (the lowest member on each host), the
   layout, local rank and size, the node name. */
static dm_status _dm_tcp_shrink_hosts(_dm_tcp* n, const _dm_tcp* p, const int* old_of) {
    const _dm_layout* py = &p->lk.lay;
    int N = n->base.size, me = n->base.rank, j, k;
    int* site_of = (int*)_dm_malloc(&n->base.allocator, sizeof(int) * (size_t)N);
    n->host_of = (int*)_dm_malloc(&n->base.allocator, sizeof(int) * (size_t)N);
    if (!n->host_of || !site_of) {
        _dm_free(&n->base.allocator, site_of);
        return _DM_FAIL(&n->base, DM_ERR_OUT_OF_MEMORY, "tcp: out of memory");
    }
    for (j = 0; j < N; j++) site_of[j] = py->site_of[py->host_of[old_of[j]]];
    n->base.local_rank = 0;
    n->base.local_size = 0;
    for (j = 0; j < N; j++) {
        int h = p->lk.lay.host_of[old_of[j]];
        for (k = 0; p->lk.lay.host_of[old_of[k]] != h; k++) {}
        n->host_of[j] = k;
    }
    for (j = 0; j < N; j++) {
        if (n->host_of[j] != n->host_of[me]) continue;
        if (j < me) n->base.local_rank++;
        n->base.local_size++;
    }
    _dm_copy_name(n->base.node_name, sizeof(n->base.node_name), p->base.node_name);
    _dm_copy_name(n->site, sizeof(n->site), p->site);
    _dm_eng_set_layout(&n->lk, n->host_of, site_of);
    _dm_free(&n->base.allocator, site_of);
    _dm_eng_set_policy(&n->lk, n->base.local_size);
    return DM_OK;
}
/* Connections only where the schedules need them (>>tcp sparse): the agreement's full mesh
   keeps P; both ends of a pair compute the same P, so both close the rest before either could
   use it, and a call that needs such a peer later connects on demand (>>tcp lazy). */
static void _dm_tcp_shrink_trim(_dm_tcp* n) {
    int j;
    for (j = 0; j < n->base.size; j++) {
        if (j == n->base.rank || n->want[j] || !n->lk.links[j]) continue;
        n->lk.links[j]->vt->destroy(n->lk.links[j], &n->base.allocator);
        n->lk.links[j] = NULL;
        close(n->fds[j]);
        n->fds[j] = -1;
    }
}
/* The renumbered group's links, listener, layout, shared memory and extra sockets. */
static dm_status _dm_tcp_shrink_build(_dm_tcp* n, _dm_tcp* p, const int* old_of, int64_t deadline) {
    dm_allocator* a = &n->base.allocator;
    int N = n->base.size, me = n->base.rank, j;
    _DM_TRY(_dm_eng_init(&n->lk, &n->base, "tcp", p->lk.chunk));
    n->lk.site_probe = true;
    n->lk.notice_post = _dm_tcp_notice_post;
    n->lk.notice_read = _dm_tcp_notice_read;
    n->lk.connect = _dm_tcp_eng_connect;
    n->lk.poll_fill = _dm_tcp_eng_poll_fill;
    n->lk.service = _dm_tcp_eng_service;
    n->lk.hangup = _dm_tcp_eng_hangup;
    for (j = 0; j < N; j++)
        if (j != me) _DM_TRY(_dm_tcp_add_link(n, j));
    _DM_TRY(_dm_tcp_shrink_hosts(n, p, old_of));
    n->want = (bool*)_dm_calloc(a, sizeof(bool) * (size_t)N);
    if (!n->want) return _DM_FAIL(&n->base, DM_ERR_OUT_OF_MEMORY, "tcp: out of memory");
    _DM_TRY(_dm_peers_find(&n->lk, n->want));
    _dm_tcp_shrink_trim(n);
    /* the same choice on every rank: the vote and the slot are the parent group's */
    if (p->shm_vote == 2 && p->shm_slot + 1 < _DM_SHM_ABORTS) _DM_TRY(_dm_tcp_shrink_shm(n, p, old_of, deadline));
    else if (p->shm_vote == 2) _DM_TRY(_dm_tcp_shm_for_host(n));   /* a new segment (this talks) */
    else n->shm_vote = p->shm_vote;     /* sockets, as in the parent */
    _DM_TRY(_dm_tcp_more_sockets(n, deadline));
    _DM_TRY(_dm_tcp_seal_settle(n));
    _dm_tcp_serve_trim(n);
    return DM_OK;
}

static dm_status _dm_tcp_shrink(dm_collective* c, const bool* excluded, int flags, dm_collective** out) {
    _dm_tcp* p = (_dm_tcp*)c;
    _dm_tcp* n = NULL;
    int W = c->size, j, N = 0;
    int64_t start = _dm_now_ms(), deadline = _dm_deadline(c->timeout_ms);
    bool* gone = (bool*)_dm_malloc(&c->allocator, sizeof(bool) * (size_t)W);
    dm_status st;
    if (!gone) return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "tcp: shrink: out of memory");
    memcpy(gone, excluded, sizeof(bool) * (size_t)W);
    if (p->rfd < 0) {
        _dm_free(&c->allocator, gone);
        return _DM_FAIL(c, DM_ERR_ABORTED, "tcp: shrink: this collective was already shrunk (or its shrink "
                        "failed); destroy it");
    }
    if (flags == DM_SHRINK_ABORT && p->lk.broken == DM_OK) {    /* the others fail fast and shrink too */
        _DM_FAIL(c, DM_ERR_ABORTED, "tcp: rank %d aborted the collective (dm_shrink with DM_SHRINK_ABORT)", c->rank);
        _dm_eng_break(&p->lk, DM_ERR_ABORTED);
    }
    st = _dm_tcp_shrink_start(p, &n);
    if (st == DM_OK) _dm_tcp_shrink_stop_rings(p, _dm_tcp_shrink_epoch(n));
    if (st == DM_OK) st = _dm_tcp_shrink_connect(n, gone, deadline);
    if (st == DM_OK) st = _dm_tcp_shrink_agree(n, gone, deadline);
    for (j = 0; j < W; j++) N += !gone[j];
    if (st == DM_OK) {
        n->store = p->store;                    /* the store moves, if it is still there */
        n->own_store = p->own_store;
        p->store = NULL;
        p->own_store = false;
        st = _dm_tcp_shrink_finish(n, p, gone, deadline);
    }
    _dm_tcp_retire(p);
    _dm_free(&c->allocator, gone);
    if (st != DM_OK) {
        _DM_FAIL(c, st, "tcp: shrink of rank %d (%d of %d ranks staying) failed: %s", c->rank, N, W,
                 n ? n->base.last_error : dm_status_name(st));
        if (n) _dm_tcp_free(n);
        return st;
    }
    _DM_LOG(&c->logger, DM_LOG_INFO, "tcp: rank %d of %d is rank %d of %d after dm_shrink (%lld ms)", c->rank, W,
            n->base.rank, N, (long long)(_dm_now_ms() - start));
    *out = &n->base;
    return DM_OK;
}

/* DM_SHRINK_ABORT or dm_abort from another thread than the one in a call: every socket (the
   shm links' side channels included) ends, so the call fails at once and the peers fail fast.
   After dm_abort the notice and the abort word go out first, so the peers read why. */
static void _dm_tcp_interrupt(dm_collective* c) {
    _dm_tcp* t = (_dm_tcp*)c;
    int j;
    _dm_eng_abort_notify(&t->lk);
    if (!t->fds) return;
    for (j = 0; j < c->size * t->nsock; j++) {
        int fd = __atomic_load_n(&t->fds[j], __ATOMIC_ACQUIRE);
        if (fd >= 0) shutdown(fd, SHUT_RDWR);
    }
}

DM_API_IMPL dm_status dm_tcp_create(const dm_tcp_desc* desc, dm_collective** out) {
    _dm_create_begin();
    return _dm_create_end(_dm_tcp_create_checked(desc, out), desc && desc->logger.func);
}

/* >>tcp init */
static dm_status _dm_init_checked(const dm_init_desc* desc, dm_collective** out) {
    _DM_ZERO(dm_init_desc, d);
    _DM_ZERO(dm_fake_desc, f);
    _DM_ZERO(dm_tcp_desc, td);
    dm_env env;
    dm_status st;
    char err[DM_LAST_ERROR_SIZE];
    int join = 0;
    if (!out) return _DM_REPORT(NULL, err, sizeof(err), DM_ERR_INVALID_ARG, "init: out is NULL");
    *out = NULL;
    if (desc) d = *desc;
    st = dm_env_detect(&env);
    if (st != DM_OK) return _dm_tcp_report(&d.logger, st, env.error);
    _dm_create_rank(env.rank);
    if ((st = _dm_cfg_int(_DM_CFG_JOIN, &join, err, sizeof(err))) != DM_OK) return _dm_tcp_report(&d.logger, st, err);
    if (env.world_size > 1 || join) {
        td.rank = env.rank;
        td.world_size = env.world_size;
        td.timeout_ms = d.timeout_ms;
        td.logger = d.logger;
        td.allocator = d.allocator;
        return dm_tcp_create(&td, out);
    }
    f.timeout_ms = d.timeout_ms;
    f.logger = d.logger;
    f.allocator = d.allocator;
    return dm_fake_create(&f, out);
}
DM_API_IMPL dm_status dm_init(const dm_init_desc* desc, dm_collective** out) {
    _dm_create_begin();
    return _dm_create_end(_dm_init_checked(desc, out), desc && desc->logger.func);
}
_DM_COLD_END
_DM_WARM_END
#endif /* DISTMESH_IMPLEMENTATION */

/*
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
*/
