/* distmesh_store.h -- the rendezvous store of distmesh. MIT license at end of file.

   Do not include this file directly: distmesh.h includes it at its end, before the backend
   headers, when DISTMESH_TCP, DISTMESH_NCCL or DISTMESH_STORE is defined (pass them as -D flags,
   in every TU). The TCP and NCCL backends rendezvous through it.

   WHAT IT IS
   A dm_store is a key-value store shared by the ranks of a job, reached by URL:

       tcp://host:port       PyTorch c10d TCPStore, torch 2.x wire protocol. The process with
       tcp://[::1]:port      is_server hosts the server on its own thread (libuv, own loop);
                             every store (server process included) is a client over TCP.
       file:///abs/dir       one file per key in a shared directory (NFS, local disk).

   desc.url 0 -> $DISTMESH_STORE, else tcp://$MASTER_ADDR:$MASTER_PORT. With
   TORCHELASTIC_USE_AGENT_STORE=True (torchrun >= 2.x) the agent already serves the store on
   MASTER_PORT, so is_server is ignored and every rank is a client.

   Interop with torch: torch's TCPStore client prepends "/" to every key and torch's PrefixStore
   joins with "/": torch's PrefixStore("default_pg", store).set("x") is the wire key
   "/default_pg/x". A distmesh store with prefix "/default_pg/" sees the same keys.

   Semantics follow c10d: get waits for the key (WAIT then GET) until the timeout; add keeps the
   value as decimal text ("42"); compare_set on a missing key sets it only when `expected` is
   empty and returns the value now held (or `expected` when the key is missing and nothing was
   set); wait/get that time out return DM_ERR_TIMEOUT naming the keys; EOF or reset from the
   server -> DM_ERR_PEER_LOST, and the store is unusable afterwards (destroy it).

   BUILDS
   The TCP client and the file store need libc and POSIX sockets only. The server runs on libuv
   and is compiled where libuv is part of the build: with DISTMESH_TCP. A build without it
   (DISTMESH_NCCL alone, or DISTMESH_STORE) connects to a store hosted elsewhere -- a distmesh
   server in another process, torch's TCPStore, torchrun's agent store -- or uses a file store;
   asking it to host (is_server, TORCHELASTIC_USE_AGENT_STORE unset) fails with
   DM_ERR_UNSUPPORTED and a message saying so. (The server is not rewritten on libc for such
   builds: one server to keep right against torch's clients and hostile input is enough, and a
   job launched without torchrun can use a file store or build with DISTMESH_TCP.)

   OPTIONS (define before including distmesh.h, or pass with -D)
       DISTMESH_STORE    this header without a backend: client and file store, libc only (off;
                         implied by DISTMESH_TCP and DISTMESH_NCCL). Not the environment
                         variable of the same name, which names the store's url
       DISTMESH_TCP      also the server (libuv)                                      (off)
       DISTMESH_OPENSSL  sealed connections with a token (AES-256-GCM, >>store seal): link
                         -lcrypto (OpenSSL 1.1 or later); in every TU                 (off)

   ENVIRONMENT
       DISTMESH_STORE            the url when desc.url is 0
       MASTER_ADDR, MASTER_PORT  else tcp://MASTER_ADDR:MASTER_PORT
       TORCHELASTIC_USE_AGENT_STORE=True   the store already runs: is_server is ignored
       DISTMESH_TOKEN            desc.token's default (see dm_store_desc)
       DISTMESH_ENCRYPT          desc.encrypt's default: auto|0|1 (see dm_store_desc)
       DISTMESH_TIMEOUT          desc.timeout_ms's default, seconds
       DISTMESH_STORE_MAX_VALUE, _MAX_CONN, _MAX_TOTAL, _STALL_MS   the server's bounds

   DESCRIPTORS
   The server holds a descriptor per client, so the process that hosts it raises its soft limit
   on open files (RLIMIT_NOFILE) to the hard limit when it starts serving (logged at debug
   level). A client it cannot take for lack of descriptors (EMFILE, ENFILE) is told so at once
   -- a distmesh client's create fails with the cause, the connections the server holds and its
   limit -- and clients already connected find the same words under "distmesh-store/refused"
   (the TCP backend's wait for the world does). The TCP backend holds no store connection once a
   group is built, and while it is built a host's ranks reach the store through one connection
   (distmesh_tcp.h >>tcp relay), so the server holds a connection per host during a rendezvous.

   THREADS AND MEMORY
   Every call on a store (and on its clones, which share its connection) holds the store's mutex
   for the whole request, so several threads may share one store; a long wait blocks the others.
   dm_store_last_error is per object and meant for the thread that got the failure; after a
   failed dm_store_create, dm_store_last_error(NULL) is this thread's reason. Values
   returned by get / compare_set / multi_get are allocated with the store's allocator and
   released with dm_store_free. libuv allocates on its own.

   ADDING A STORE KIND
   Write one table and its functions, and register its URL scheme: a `static const
   _dm_store_ops` (>>store object: open, close and one slot per operation, initialised by
   position) with the functions it names, in a section of its own; and one line in
   _dm_store_kinds (>>store kinds): the scheme, the url forms that messages list, the table.
   Nothing else changes: the public functions (>>store public) do the common work once --
   argument and key checks, the prefix, the lock, the last error, a broken connection -- and
   call the slot. The tcp client (>>store tcp client, >>store tcp ops) and the file store
   (>>store file io, >>store file ops) are the two kinds to copy from; tests/test_store_kinds.c
   runs every operation on each (add the new kind there too).

   PRIVATE PREFIXES
       _dm_store_  _DM_STORE_   the store object, the operations table, create, the public layer
       _dm_st_     _DM_ST_      what both ends share: the wire (_DM_STQ_: request opcodes),
                                codes, bytes, proofs
       _dm_stbuf_               the growable byte buffer
       _dm_srv_    _DM_SRV_     the server (libuv); _dm_kv: its entries
       _dm_stcli_               the tcp client kind
       _dm_fstore_              the file store kind

   COMPILE COST  The implementation sits between _DM_COLD_BEGIN and _DM_COLD_END: it runs at
   rendezvous, not per collective, and compiles as for debugging whatever the includer's -O level
   (distmesh.h >>compile cost).

   SECTIONS (search for ">>" and the name)
       >>store api               the declarations: limits, dm_store_desc, the functions
       >>store wire              c10d's opcodes and fields, authentication, notices, constants
       >>store codes             system codes -> dm_status and a "(cause)" text, without libuv
       >>store bytes             growable buffer, little-endian, hash, decimal parse
       >>store proofs            nonces, HMAC proofs, constant-time comparison
       >>store seal              encryption on or off; sealed records after the handshake: keys
       >>store limits            the server's bounds and the token, as create resolves them; the
                                 process's descriptor limit raised
       >>store server map        the server's types, its key-value map
       >>store server quota      every byte held charged to one quota; flow control
       >>store server replies    queued writes, values written from their entries, waiters
       >>store server closing    closing and dropping clients, notices
       >>store server handshake  the server's half of authentication
       >>store server requests   parsing and executing one c10d request
       >>store server input      the input buffer and the read path
       >>store server descriptors  the limit raised, a reserve, refusing a client with why
       >>store server accept     accepting by hand, a client made
       >>store server lifecycle  tick, stop, free, start
       >>store no server         a build without libuv: hosting refused
       >>store object            dm_store, its shared part, keys, the operations table
       >>store tcp client        socket I/O with deadlines, notices, wait and cancel, connect
       >>store tcp ops           the tcp kind's slots and table
       >>store file io           paths, atomic writes, the lock, polling waits
       >>store file ops          the file kind's slots and table
       >>store kinds             URL schemes -> tables
       >>store create            desc and environment, limits, choosing the kind
       >>store public            dm_store_*: the common checks, then the slot
       >>store for backends      the server's address, going idle, a refusal to read
*/
#ifndef DISTMESH_H
#error "include distmesh.h with DISTMESH_TCP, DISTMESH_NCCL or DISTMESH_STORE defined instead"
#endif

#ifndef DISTMESH_STORE_H
#define DISTMESH_STORE_H

#ifdef __cplusplus
extern "C" {
#endif

/* >>store api  Limits of the server (a request beyond them closes that client with a protocol
   error) and of the client (values larger than DM_STORE_MAX_VALUE are refused before sending). */
enum {
    DM_STORE_MAX_KEY = 64 * 1024,               /* bytes of one key, prefix included */
    DM_STORE_MAX_VALUE = 64 * 1024 * 1024,      /* bytes of one value */
    DM_STORE_MAX_KEYS = 128 * 1024              /* keys of one wait / check / multi request */
};

typedef struct dm_store dm_store;

typedef struct dm_store_desc {
    const char* url;        /* "tcp://host:port" (IPv6: tcp://[::1]:port), "file:///abs/dir";
                               0 -> DISTMESH_STORE env, else tcp://MASTER_ADDR:MASTER_PORT */
    bool is_server;         /* tcp: host the server in this process (rank 0); ignored when
                               TORCHELASTIC_USE_AGENT_STORE=True (torchrun's agent serves it).
                               Needs the server (DISTMESH_TCP): else DM_ERR_UNSUPPORTED.
                               Port 0 -> an ephemeral port, see dm_store_port. The server binds
                               the url's host when it is a numeric loopback address (127.x,
                               ::1), else every interface (dual-stack ::, else 0.0.0.0). The
                               process's soft RLIMIT_NOFILE goes up to its hard limit */
    const char* prefix;     /* 0 -> ""; prepended to every key, e.g. "default_pg/0/" */
    int timeout_ms;         /* 0 -> DISTMESH_TIMEOUT or DM_DEFAULT_TIMEOUT_MS; < 0 -> forever;
                               connect retries and every request, wait and get honour it */
    dm_logger logger;       /* 0 -> the default (distmesh.h dm_logger); the server thread logs protocol errors here */
    dm_allocator allocator; /* 0 -> malloc/free; set both or neither */
    const char* token;      /* 0 -> DISTMESH_TOKEN; unset or "" -> no authentication. With a token
                               every connection first proves it (HMAC-SHA256 challenge-response
                               over fresh nonces from both sides) and the server serves nothing
                               to a client that has not: a distmesh-only store (torch's clients
                               cannot authenticate). Client and server need the same token */
    /* Server memory bounds (0 -> the environment variable, else the default). A client that
       goes beyond one is closed with a logged reason; the others are not affected. */
    size_t max_value;       /* DISTMESH_STORE_MAX_VALUE, DM_STORE_MAX_VALUE: bytes of one value */
    size_t max_conn_bytes;  /* DISTMESH_STORE_MAX_CONN, 2 x max_value + 1 MiB: one client's
                               request being received, and separately its unread replies */
    size_t max_total_bytes; /* DISTMESH_STORE_MAX_TOTAL, 256 MiB: everything the server holds --
                               keys and values (at most 7/8 of it) and every client's buffers. A
                               write that does not fit closes its client; buffers that do not fit
                               close the client holding the most buffered bytes. A distmesh
                               client reads why (DM_ERR_OUT_OF_MEMORY) at its next call */
    int stall_ms;           /* DISTMESH_STORE_STALL_MS, 30000: a client that does not read its
                               replies is no longer read from; after this long without progress
                               it is closed */
    int encrypt;            /* tcp with a token: 0 -> DISTMESH_ENCRYPT (auto|0|1; auto: on when
                               there is a token and the build has DISTMESH_OPENSSL); 1 on, -1
                               off. On: after the token's handshake every byte both ways is
                               AES-256-GCM records (SECURITY.md). Client and server must agree:
                               else the handshake refuses the client, naming the setting. 1
                               without a token: DM_ERR_INVALID_ARG (DM_ERR_ENV from the
                               variable); 1 without DISTMESH_OPENSSL: DM_ERR_UNSUPPORTED */
} dm_store_desc;

/* Connects (retrying until the timeout: the server may start later) and, with is_server,
   starts the server first. Fails with *out == NULL. */
DM_API dm_status dm_store_create(const dm_store_desc* desc, dm_store** out);
/* A second handle on parent's connection / server / directory (reference counted, so the two
   may be destroyed in any order); its keys get parent's prefix + prefix. */
DM_API dm_status dm_store_clone_prefixed(dm_store* parent, const char* prefix, dm_store** out);
/* Accepts NULL. The last handle closes the connection and stops the server thread. */
DM_API void dm_store_destroy(dm_store* s);

DM_API dm_status dm_store_set(dm_store* s, const char* key, const void* value, size_t size);
/* Waits for the key until the store timeout (like c10d get); *out_value (never NULL on success,
   even for an empty value) is freed with dm_store_free. */
DM_API dm_status dm_store_get(dm_store* s, const char* key, void** out_value, size_t* out_size);
DM_API void dm_store_free(dm_store* s, void* value);
/* Waits until every key exists. timeout_ms 0 -> the store timeout, < 0 -> forever. */
DM_API dm_status dm_store_wait(dm_store* s, const char* const* keys, size_t nkeys, int timeout_ms);
/* Adds delta to the integer held as decimal text (a missing key counts as 0); out (may be NULL)
   gets the new value. */
DM_API dm_status dm_store_add(dm_store* s, const char* key, int64_t delta, int64_t* out);
/* c10d compare_set: if the key holds `expected`, or is missing and expected_size == 0, it gets
   `desired`. out_value / out_size (both NULL or both set) get the value now held (`expected`
   when the key is missing and was not set); free with dm_store_free. */
DM_API dm_status dm_store_compare_set(dm_store* s, const char* key, const void* expected,
                                      size_t expected_size, const void* desired,
                                      size_t desired_size, void** out_value, size_t* out_size);
/* out_deleted (may be NULL): whether the key existed. */
DM_API dm_status dm_store_delete(dm_store* s, const char* key, bool* out_deleted);
/* Whether every key exists now (no waiting). */
DM_API dm_status dm_store_check(dm_store* s, const char* const* keys, size_t nkeys,
                                bool* out_all_present);
/* Keys in the whole store (every prefix). */
DM_API dm_status dm_store_num_keys(dm_store* s, int64_t* out);
/* "" after success; never NULL. */
DM_API const char* dm_store_last_error(const dm_store* s);
/* The port the server listens on (useful with port 0), else the port connected to; 0 for a
   file store or NULL. */
DM_API int dm_store_port(const dm_store* s);

/* Additions beyond the core set (c10d APPEND, MULTI_SET, MULTI_GET). */
/* Appends bytes to the key's value (a missing key is created). */
DM_API dm_status dm_store_append(dm_store* s, const char* key, const void* value, size_t size);
/* Sets n keys in one request. */
DM_API dm_status dm_store_multi_set(dm_store* s, const char* const* keys,
                                    const void* const* values, const size_t* sizes, size_t n);
/* Waits for n keys (store timeout), then gets them in one request: out_values[i] (each freed
   with dm_store_free) and out_sizes[i] are arrays of n the caller provides. */
DM_API dm_status dm_store_multi_get(dm_store* s, const char* const* keys, size_t n,
                                    void** out_values, size_t* out_sizes);


#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DISTMESH_STORE_H */

/* ============================================================================================ */
#if defined(DISTMESH_IMPLEMENTATION) && !defined(DISTMESH_STORE_IMPL_INCLUDED)
#define DISTMESH_STORE_IMPL_INCLUDED

/* libc and POSIX sockets only; uv.h comes with the server (>>store server map). */
#include <sys/types.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <fcntl.h>
#include <dirent.h>
/* The server's accept4 is a GNU call: declared here when the includer's mode hid it (see
   distmesh.h >>libc; the TCP backend, which includes this header, relies on it too). */
#if defined(__GLIBC__) && !defined(__cplusplus) && !defined(__USE_GNU)
extern int accept4(int fd, struct sockaddr* addr, socklen_t* addr_len, int flags);
#endif

_DM_COLD_BEGIN
/* >>store wire  c10d TCPStore, torch 2.x (checked byte for byte against torch 2.11's client and
   both of its servers, see tests/fixtures/torch-2.11-wire.jsonl). A request is one opcode byte
   and its fields; integers are little-endian; a string or value is a uint64 length + bytes.
     VALIDATE    u32 magic 0x3C85F7CE                         (first request; no reply)
     PING        u32 nonce                         -> u32 nonce
     SET         key, value                                    (no reply)
     COMPARE_SET key, expected, desired            -> value now held
     GET         key                               -> value ("" when missing)
     ADD         key, i64 delta                    -> i64 new value (stored as decimal text)
     CHECK       u64 n, n keys                     -> u8 READY 0 / NOT_READY 1
     WAIT        u64 n, n keys                     -> u8 STOP_WAITING 0, when all exist
     GETNUMKEYS                                    -> i64
     DELETE_KEY  key                               -> i64 number deleted (0 / 1)
     APPEND      key, value                                    (no reply)
     MULTI_GET   u64 n, n keys                     -> n values
     MULTI_SET   u64 n, n (key, value)                         (no reply)
     CANCEL_WAIT                                   -> u8 WAIT_CANCELED 1 (after any STOP_WAITING
                                                      that raced with it)
   torch's client does get as WAIT [key] then GET, multi_get as WAIT keys then MULTI_GET. */
enum {
    _DM_STQ_VALIDATE = 0, _DM_STQ_SET, _DM_STQ_COMPARE_SET, _DM_STQ_GET, _DM_STQ_ADD,
    _DM_STQ_CHECK, _DM_STQ_WAIT, _DM_STQ_GETNUMKEYS, _DM_STQ_DELETE_KEY, _DM_STQ_APPEND,
    _DM_STQ_MULTI_GET, _DM_STQ_MULTI_SET, _DM_STQ_CANCEL_WAIT, _DM_STQ_PING
};
/* torch < 2.2 (1.13 captured on the wire, see tests/fixtures): no VALIDATE/PING handshake and
   other opcodes -- SET 0, COMPARE_SET 1, GET 2, ADD 3, CHECK 4, WAIT 5, GETNUMKEYS 6, WATCH_KEY 7,
   DELETE_KEY 8 -- with the same fields and replies for everything both have. The server tells
   the two apart per connection from the first bytes (a 2.x client always opens with VALIDATE 0
   + magic; a 1.13 SET's key length can't be the magic); the client falls back when a server
   drops its VALIDATE + PING and answers a 1.13 GETNUMKEYS instead. Protocol 1 has no APPEND,
   MULTI_*, CANCEL_WAIT or PING: multi_* become loops, a wait with a deadline polls CHECK. */
enum { _DM_ST_PROTO_2 = 0, _DM_ST_PROTO_1 = 1 };
static const unsigned char _dm_st_v1_from_v2[] = { 255, 0, 1, 2, 3, 4, 5, 6, 8, 255, 255, 255, 255, 255 };
static const unsigned char _dm_st_v2_from_v1[] = { _DM_STQ_SET, _DM_STQ_COMPARE_SET, _DM_STQ_GET, _DM_STQ_ADD,
                                                   _DM_STQ_CHECK, _DM_STQ_WAIT, _DM_STQ_GETNUMKEYS, 255,
                                                   _DM_STQ_DELETE_KEY };
#define _DM_ST_MAGIC 0x3C85F7CEu
#define _DM_ST_READY 0
#define _DM_ST_NOT_READY 1
#define _DM_ST_STOP_WAITING 0
#define _DM_ST_WAIT_CANCELED 1
/* Authentication (distmesh only, when the store has a token), before anything else:
     client: AUTH u8 0xA5, u32 magic "DMSA", u32 version V, client nonce[32]
     server: u32 magic "DMSA", u32 status 0, server nonce[32],
             HMAC(token, "distmesh store vV server\0" || client nonce || server nonce)
     client: HMAC(token, "distmesh store vV client\0" || server nonce || client nonce)
     server: u32 0 (admitted), or u32 1 and close (refused)
   V is 1 for a plain connection and 2 for a sealed one (DISTMESH_ENCRYPT, desc.encrypt: after
   the admission every byte both ways is sealed records, >>store seal). A server whose setting
   differs answers the hello with "DMSA" and status 2 (it seals, the client does not) or 3 (it
   does not, the client does) and closes: the client fails naming the setting. V is in both
   proofs, so a man in the middle who rewrites it fails the handshake (no downgrade). Each side
   proves the token over the other side's fresh nonce, so a recorded handshake is worth
   nothing on a new connection; the role label keeps one side's proof from serving as the
   other's. A client that sends anything else first gets u32 "DMAU" (in place of the PING
   echo a c10d client waits for) and is closed. */
#define _DM_STQ_AUTH 0xA5u
#define _DM_ST_AUTH_MAGIC 0x41534d44u     /* "DMSA" */
#define _DM_ST_AUTH_NEEDED 0x55414d44u    /* "DMAU" */
#define _DM_ST_AUTH_VERSION 1u           /* a plain connection after the handshake */
#define _DM_ST_AUTH_SEALED 2u            /* sealed records after it (>>store seal) */
#define _DM_ST_AUTH_SEAL_DIFFERS 2u      /* a challenge's status: the server seals, the client not */
#define _DM_ST_AUTH_PLAIN_DIFFERS 3u     /* ... the server does not seal, the client does */
#define _DM_ST_AUTH_HELLO 41
#define _DM_ST_AUTH_CHALLENGE 72
#define _DM_ST_AUTH_BUF 128               /* input buffer of a client not yet authenticated */
#define _DM_ST_AUTH_MS 10000              /* to authenticate after connecting */
#define _DM_ST_HIGH_WATER ((size_t)1 << 20) /* unread reply bytes above which a client is not read */
#define _DM_ST_TOKEN_MAX 255
enum { _DM_ST_OK = 0, _DM_ST_NOAUTH, _DM_ST_BADSERVER, _DM_ST_REFUSED, _DM_ST_NEEDTOKEN, _DM_ST_NOTICED,
       _DM_ST_SERVER_SEALS, _DM_ST_SERVER_PLAIN, _DM_ST_HELLO_CHANGED };
/* Why the server closed a client (distmesh only): c10d has no error reply (SET has no reply at
   all), so a client the server closes for a bound or a malformed request would only see EOF. A
   distmesh client marks its PING nonce (top byte 'D': torch's nonce is its pid, below 2^22),
   and an authenticated client is a distmesh client too; such a client gets, in place of its
   next reply, and then the connection closes:
     notice      8 bytes FF "DMNOTE" 7F, i32 status, u16 length, that many bytes of reason
   The magic is no reply a client can expect: a 1-byte reply is 0 or 1, and as a u64 length it
   is above DM_STORE_MAX_VALUE (an ADD whose result is exactly that value, one in 2^64, would
   read as a notice). A client the server cannot take at all, for lack of descriptors (see
   >>store server descriptors), gets a notice as soon as it is accepted, before any request:
   in place of its PING echo (whose first byte is never FF: a distmesh nonce is 0x44xxxxxx,
   little-endian) or of the authentication challenge (which starts "DMSA"). */
#define _DM_ST_NONCE_MARK 0x44000000u
/* Where a server that refused clients for lack of descriptors keeps why (unprefixed; set only
   then, see >>store server descriptors). */
#define _DM_ST_REFUSED_KEY "distmesh-store/refused"
#define _DM_ST_REFUSED_LINGER_MS 10000    /* a refusing server's last service to late clients */
#define _DM_ST_NOTICE_HEAD 14
#define _DM_ST_NOTICE_TEXT 300
static const unsigned char _dm_st_notice_magic[8] = { 0xFF, 'D', 'M', 'N', 'O', 'T', 'E', 0x7F };
/* Stored keys and values may fill the quota but for this share (1/8) of it, which is kept for
   connection buffers: a store full of data still answers every client. */
#define _DM_ST_BUFFER_SHARE 8
/* Values of at least this many bytes are not copied: a SET that fills the client's input buffer
   keeps that buffer as the value, and a GET's reply is written from the value itself (storing V
   bytes never needs 2V, nor does reading them back). */
#define _DM_ST_INPLACE_MIN ((size_t)64 << 10)
#define _DM_ST_NOTICE_MS 1000             /* to deliver a notice before the close */
/* The default quota. distmesh's own rendezvous holds little: measured, 34 keys and 3 KiB of keys
   and values at 32 ranks (about 100 B a rank), plus a 4 KiB buffer per connected rank. 256 MiB
   is room for that at any scale, and still for one value of the default largest size (64 MiB)
   stored, read back and a second being received at once. */
#define _DM_ST_MAX_TOTAL ((size_t)256 << 20)

/* >>store codes  A failed system call is a negative errno value everywhere in the store, which
   is libuv's numbering on POSIX (UV_ECONNREFUSED == -ECONNREFUSED), with libuv's values for end
   of file and the resolver's failures; so the server's libuv codes and the client's and file
   store's share one translation to dm_status, and a "(cause)" reads as libuv words it
   ("ECONNREFUSED: connection refused"), with or without libuv in the build. */
#define _DM_ST_EOF (-4095)
#define _DM_ST_EAI_AGAIN (-3001)
#define _DM_ST_EAI_NONAME (-3008)
_DM_PRIVATE dm_status _dm_st_status(int code) {
    switch (code) {
    case 0: return DM_OK;
    case -ETIMEDOUT: return DM_ERR_TIMEOUT;
    case -ECONNRESET: case -EPIPE: case _DM_ST_EOF: case -ECONNABORTED: case -ENOTCONN:
        return DM_ERR_PEER_LOST;
    case -ENOMEM: case -ENOBUFS: return DM_ERR_OUT_OF_MEMORY;
    case -EINVAL: return DM_ERR_INVALID_ARG;
    case -ENOENT: case -EACCES: case -EPERM: case -EEXIST: case -ENOSPC: case -EROFS:
    case -EISDIR: case -ENOTDIR: case -ENAMETOOLONG: case -EIO: case -EMFILE: case -ENFILE:
        return DM_ERR_IO;
    default: return DM_ERR_NETWORK; /* ECONNREFUSED, EHOSTUNREACH, EADDRINUSE, EAI_*, ... */
    }
}
/* The code of errno e (> 0; 0 reads as EIO). */
_DM_PRIVATE int _dm_st_errno(int e) { return e > 0 ? -e : -EIO; }
/* The names and texts libuv gives these codes (tests/test_store_kinds.c compares them with
   uv_err_name and uv_strerror wherever libuv is built in). */
#define _DM_ST_CAUSE(e, text) { -(e), #e, text },
static const struct { int code; const char* name; const char* text; } _dm_st_causes[] = {
    _DM_ST_CAUSE(EPERM, "operation not permitted") _DM_ST_CAUSE(ENOENT, "no such file or directory")
    _DM_ST_CAUSE(ESRCH, "no such process") _DM_ST_CAUSE(EINTR, "interrupted system call")
    _DM_ST_CAUSE(EIO, "i/o error") _DM_ST_CAUSE(ENXIO, "no such device or address")
    _DM_ST_CAUSE(E2BIG, "argument list too long") _DM_ST_CAUSE(EBADF, "bad file descriptor")
    _DM_ST_CAUSE(EAGAIN, "resource temporarily unavailable") _DM_ST_CAUSE(ENOMEM, "not enough memory")
    _DM_ST_CAUSE(EACCES, "permission denied") _DM_ST_CAUSE(EFAULT, "bad address in system call argument")
    _DM_ST_CAUSE(EBUSY, "resource busy or locked") _DM_ST_CAUSE(EEXIST, "file already exists")
    _DM_ST_CAUSE(EXDEV, "cross-device link not permitted") _DM_ST_CAUSE(ENODEV, "no such device")
    _DM_ST_CAUSE(ENOTDIR, "not a directory") _DM_ST_CAUSE(EISDIR, "illegal operation on a directory")
    _DM_ST_CAUSE(EINVAL, "invalid argument") _DM_ST_CAUSE(ENFILE, "file table overflow")
    _DM_ST_CAUSE(EMFILE, "too many open files") _DM_ST_CAUSE(ENOTTY, "inappropriate ioctl for device")
    _DM_ST_CAUSE(ETXTBSY, "text file is busy") _DM_ST_CAUSE(EFBIG, "file too large")
    _DM_ST_CAUSE(ENOSPC, "no space left on device") _DM_ST_CAUSE(ESPIPE, "invalid seek")
    _DM_ST_CAUSE(EROFS, "read-only file system") _DM_ST_CAUSE(EMLINK, "too many links")
    _DM_ST_CAUSE(EPIPE, "broken pipe") _DM_ST_CAUSE(ERANGE, "result too large")
    _DM_ST_CAUSE(ENAMETOOLONG, "name too long") _DM_ST_CAUSE(ENOSYS, "function not implemented")
    _DM_ST_CAUSE(ENOTEMPTY, "directory not empty") _DM_ST_CAUSE(ELOOP, "too many symbolic links encountered")
#if defined(ENONET)
    _DM_ST_CAUSE(ENONET, "machine is not on the network")
#endif
    _DM_ST_CAUSE(EPROTO, "protocol error") _DM_ST_CAUSE(EOVERFLOW, "value too large for defined data type")
    _DM_ST_CAUSE(EILSEQ, "illegal byte sequence") _DM_ST_CAUSE(ENOTSOCK, "socket operation on non-socket")
    _DM_ST_CAUSE(EDESTADDRREQ, "destination address required") _DM_ST_CAUSE(EMSGSIZE, "message too long")
    _DM_ST_CAUSE(EPROTOTYPE, "protocol wrong type for socket") _DM_ST_CAUSE(ENOPROTOOPT, "protocol not available")
    _DM_ST_CAUSE(EPROTONOSUPPORT, "protocol not supported")
    _DM_ST_CAUSE(ESOCKTNOSUPPORT, "socket type not supported")
    _DM_ST_CAUSE(ENOTSUP, "operation not supported on socket")
    _DM_ST_CAUSE(EAFNOSUPPORT, "address family not supported")
    _DM_ST_CAUSE(EADDRINUSE, "address already in use") _DM_ST_CAUSE(EADDRNOTAVAIL, "address not available")
    _DM_ST_CAUSE(ENETDOWN, "network is down") _DM_ST_CAUSE(ENETUNREACH, "network is unreachable")
    _DM_ST_CAUSE(ECONNABORTED, "software caused connection abort")
    _DM_ST_CAUSE(ECONNRESET, "connection reset by peer") _DM_ST_CAUSE(ENOBUFS, "no buffer space available")
    _DM_ST_CAUSE(EISCONN, "socket is already connected") _DM_ST_CAUSE(ENOTCONN, "socket is not connected")
    _DM_ST_CAUSE(ESHUTDOWN, "cannot send after transport endpoint shutdown")
    _DM_ST_CAUSE(ETIMEDOUT, "connection timed out") _DM_ST_CAUSE(ECONNREFUSED, "connection refused")
    _DM_ST_CAUSE(EHOSTDOWN, "host is down") _DM_ST_CAUSE(EHOSTUNREACH, "host is unreachable")
    _DM_ST_CAUSE(EALREADY, "connection already in progress")
#if defined(EREMOTEIO)
    _DM_ST_CAUSE(EREMOTEIO, "remote I/O error")
#endif
    _DM_ST_CAUSE(ECANCELED, "operation canceled")
    { _DM_ST_EOF, "EOF", "end of file" },
    { _DM_ST_EAI_AGAIN, "EAI_AGAIN", "temporary failure" },
    { _DM_ST_EAI_NONAME, "EAI_NONAME", "unknown node or service" },
};
#undef _DM_ST_CAUSE
/* "ECONNREFUSED: connection refused" into buf, for the "(cause)" of a message. */
_DM_PRIVATE const char* _dm_st_cause(int code, char* buf, size_t cap) {
    size_t i;
    for (i = 0; i < sizeof(_dm_st_causes) / sizeof(_dm_st_causes[0]); i++)
        if (_dm_st_causes[i].code == code) {
            snprintf(buf, cap, "%s: %s", _dm_st_causes[i].name, _dm_st_causes[i].text);
            return buf;
        }
    snprintf(buf, cap, "Unknown system error %d: Unknown system error %d", code, code);
    return buf;
}

/* >>store bytes  A growable byte buffer on an allocator (oom sticks until reset), little-endian
   integers, a hash, and c10d's decimal integers. */
typedef struct _dm_stbuf {
    unsigned char* p;
    size_t len, cap;
    bool oom;
    const dm_allocator* a;
} _dm_stbuf;
_DM_PRIVATE bool _dm_stbuf_reserve(_dm_stbuf* b, size_t extra) {
    unsigned char* np;
    size_t ncap;
    if (b->oom) return false;
    if (extra > SIZE_MAX / 2 - b->len) { b->oom = true; return false; }
    if (b->len + extra <= b->cap) return true;
    ncap = b->cap ? b->cap : 256;
    while (ncap < b->len + extra) ncap *= 2;
    np = (unsigned char*)_dm_malloc(b->a, ncap);
    if (!np) { b->oom = true; return false; }
    if (b->len) memcpy(np, b->p, b->len);
    _dm_free(b->a, b->p);
    b->p = np;
    b->cap = ncap;
    return true;
}
_DM_PRIVATE void _dm_stbuf_put(_dm_stbuf* b, const void* d, size_t n) {
    if (!_dm_stbuf_reserve(b, n)) return;
    if (n) memcpy(b->p + b->len, d, n);
    b->len += n;
}
_DM_PRIVATE void _dm_stbuf_u8(_dm_stbuf* b, unsigned v) {
    unsigned char c = (unsigned char)v;
    _dm_stbuf_put(b, &c, 1);
}
_DM_PRIVATE void _dm_stbuf_u64(_dm_stbuf* b, uint64_t v) {
    unsigned char le[8];
    int i;
    for (i = 0; i < 8; i++) le[i] = (unsigned char)(v >> (8 * i));
    _dm_stbuf_put(b, le, 8);
}
_DM_PRIVATE void _dm_stbuf_u32(_dm_stbuf* b, uint32_t v) {
    unsigned char le[4];
    int i;
    for (i = 0; i < 4; i++) le[i] = (unsigned char)(v >> (8 * i));
    _dm_stbuf_put(b, le, 4);
}
/* uint64 length + bytes */
_DM_PRIVATE void _dm_stbuf_str(_dm_stbuf* b, const void* d, size_t n) {
    _dm_stbuf_u64(b, (uint64_t)n);
    _dm_stbuf_put(b, d, n);
}
_DM_PRIVATE void _dm_stbuf_free(_dm_stbuf* b) {
    _dm_free(b->a, b->p);
    b->p = NULL;
    b->len = b->cap = 0;
    b->oom = false;
}
_DM_PRIVATE uint64_t _dm_st_get_u64(const unsigned char* p) {
    uint64_t v = 0;
    int i;
    for (i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
_DM_PRIVATE uint32_t _dm_st_get_u32(const unsigned char* p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
_DM_PRIVATE uint64_t _dm_st_hash(const void* d, size_t n) {   /* FNV-1a */
    const unsigned char* p = (const unsigned char*)d;
    uint64_t h = 1469598103934665603ull;
    size_t i;
    for (i = 0; i < n; i++) { h ^= p[i]; h *= 1099511628211ull; }
    return h;
}
/* c10d keeps add's value as decimal text and parses it like std::stoll: optional blanks, sign,
   digits, anything after ignored. false when there are no digits or it overflows. */
_DM_PRIVATE bool _dm_st_parse_i64(const unsigned char* p, size_t n, int64_t* out) {
    size_t i = 0;
    bool neg = false, any = false;
    uint64_t v = 0, lim;
    while (i < n && (p[i] == ' ' || (p[i] >= '\t' && p[i] <= '\r'))) i++;
    if (i < n && (p[i] == '+' || p[i] == '-')) neg = p[i++] == '-';
    lim = neg ? (uint64_t)INT64_MAX + 1u : (uint64_t)INT64_MAX;
    for (; i < n && p[i] >= '0' && p[i] <= '9'; i++) {
        unsigned d = (unsigned)(p[i] - '0');
        if (v > (lim - d) / 10) return false;
        v = v * 10 + d;
        any = true;
    }
    if (!any) return false;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return true;
}

/* >>store proofs  Nonces, proofs and constant-time comparison, for both ends (see >>store wire). */
/* n bytes from the kernel's generator; without /dev/urandom, SHA-256 over clocks, pid, a
   counter and addresses (unpredictable enough to keep nonces from repeating, not a CSPRNG). */
_DM_PRIVATE void _dm_st_random(unsigned char* out, size_t n) {
    static unsigned long counter;
    size_t got = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        while (got < n) {
            ssize_t r = read(fd, out + got, n - got);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) break;
            got += (size_t)r;
        }
        close(fd);
    }
    while (got < n) {
        struct { struct timespec a, b; pid_t pid; unsigned long k; const void* p; size_t got; } seed;
        unsigned char d[32];
        size_t take = n - got < 32 ? n - got : 32;
        memset(&seed, 0, sizeof(seed));
        clock_gettime(CLOCK_REALTIME, &seed.a);
        clock_gettime(CLOCK_MONOTONIC, &seed.b);
        seed.pid = getpid();
        seed.k = ++counter;
        seed.p = (const void*)&seed;
        seed.got = got;
        dm_sha256(&seed, sizeof(seed), d);
        memcpy(out + got, d, take);
        got += take;
    }
}
_DM_PRIVATE bool _dm_st_ct_equal(const unsigned char* a, const unsigned char* b, size_t n) {
    unsigned char acc = 0;
    size_t i;
    for (i = 0; i < n; i++) acc = (unsigned char)(acc | (a[i] ^ b[i]));
    return acc == 0;
}
/* HMAC(token, role "\0" first second), the two nonces 32 bytes each; the role names the
   handshake's version (1 plain, 2 sealed: >>store wire). */
_DM_PRIVATE void _dm_st_auth_mac(const char* token, size_t tn, bool server, unsigned version,
                                 const unsigned char* first, const unsigned char* second, unsigned char out[32]) {
    static const char srv[] = "distmesh store v1 server", cli[] = "distmesh store v1 client";
    unsigned char msg[sizeof(srv) + 64];
    memcpy(msg, server ? srv : cli, sizeof(srv));
    msg[16] = (unsigned char)('0' + version);      /* the digit after "distmesh store v" */
    memcpy(msg + sizeof(srv), first, 32);
    memcpy(msg + sizeof(srv) + 32, second, 32);
    dm_hmac_sha256(token, tn, msg, sizeof(msg), out);
}

/* >>store seal  A connection that encrypts (DISTMESH_ENCRYPT, desc.encrypt: _dm_st_parse_encrypt)
   carries, from the byte after the server's admission (>>store wire) to its end, both ways,
   sealed records: the core's (distmesh_engine.h >>sealed records: u32 length, AES-256-GCM ciphertext,
   16-byte tag; the direction's record counter as the nonce), under one key per direction,
       HKDF-SHA256(salt: client nonce || server nonce of the handshake, ikm: the token,
                   info: "distmesh store aead v1: client to server" / "... server to client")
   Fresh nonces from both sides key every connection anew, and a record replayed, reordered,
   dropped, cut short, flipped or taken from another connection fails its tag: the server drops
   that client (logged), the client's call fails with DM_ERR_PROTOCOL and the store is broken;
   no byte of a record that fails is used. What a request or reply is does not change inside
   the records (c10d's bytes, notices included); a record may hold several or part of one. */
#define _DM_ST_SEAL_INFO_C2S "distmesh store aead v1: client to server"
#define _DM_ST_SEAL_INFO_S2C "distmesh store aead v1: server to client"
/* The key of one direction of the connection whose handshake had these nonces. */
_DM_PRIVATE void _dm_st_seal_key(const char* token, size_t tn, const unsigned char nonce_c[32],
                                 const unsigned char nonce_s[32], bool to_server, unsigned char out[32]) {
    unsigned char salt[64];
    const char* info = to_server ? _DM_ST_SEAL_INFO_C2S : _DM_ST_SEAL_INFO_S2C;
    memcpy(salt, nonce_c, 32);
    memcpy(salt + 32, nonce_s, 32);
    _dm_hkdf_sha256(salt, sizeof(salt), token, tn, info, strlen(info), out);
}
/* Whether connections (the store's; the TCP backend's links between hosts, who "tcp") encrypt:
   given (a desc's encrypt: 1 on, -1 off), else DISTMESH_ENCRYPT (auto|0|1), else auto: on when
   there is a token and the build has libcrypto (DISTMESH_OPENSSL). On without a token is
   refused (DM_ERR_ENV from the environment, DM_ERR_INVALID_ARG from the desc), on without
   DISTMESH_OPENSSL is DM_ERR_UNSUPPORTED. */
_DM_PRIVATE dm_status _dm_st_parse_encrypt(const char* who, int given, const char* token, bool* out, char* err,
                                           size_t cap) {
    int mode = 0;               /* the registry's choices: 0 auto, 1 off ("0"), 2 on ("1") */
    bool has_token = token && *token;
    dm_status st;
    *out = false;
    if (given == 1) mode = 2;
    else if (given == -1) mode = 1;
    else if (given != 0) {
        snprintf(err, cap, "%s: desc.encrypt is %d; expected 1 (on), -1 (off) or 0 (DISTMESH_ENCRYPT, else auto)",
                 who, given);
        return DM_ERR_INVALID_ARG;
    } else if ((st = _dm_cfg_int(_DM_CFG_ENCRYPT, &mode, err, cap)) != DM_OK) {
        return st;
    }
    if (mode == 2 && !has_token) {
        if (given)
            snprintf(err, cap, "%s: desc.encrypt is 1 but there is no token (desc.token, DISTMESH_TOKEN): the keys "
                     "come from the token", who);
        else
            snprintf(err, cap, "%s: DISTMESH_ENCRYPT=1 needs DISTMESH_TOKEN (or desc.token): the keys come from the "
                     "token", who);
        return given ? DM_ERR_INVALID_ARG : DM_ERR_ENV;
    }
#if !defined(DISTMESH_OPENSSL)
    if (mode == 2) {
        snprintf(err, cap, "%s: %s asks for encryption, but this build has no libcrypto: define DISTMESH_OPENSSL (in "
                 "every TU) and link -lcrypto (OpenSSL 1.1 or later)", who, given ? "desc.encrypt 1" :
                 "DISTMESH_ENCRYPT=1");
        return DM_ERR_UNSUPPORTED;
    }
    *out = false;               /* auto without libcrypto: plain (SECURITY.md) */
#else
    *out = mode == 2 || (mode == 0 && has_token);
#endif
    return DM_OK;
}
struct _dm_st_seal;
#if defined(DISTMESH_OPENSSL)
/* One connection's records, both directions; rec holds a record coming in (the server: the
   bytes as they arrive, whole records opened from the front, rec growing from
   _DM_ST_SEAL_START to the largest record only when one needs it; the client: one record at a
   time, its plaintext taken from rec + _DM_AEAD_HEAD [ppos, plen)), out a record going out
   (the client's; the server seals into its queued writes). */
#define _DM_ST_SEAL_START ((size_t)4096)
typedef struct _dm_st_seal {
    _dm_rec tx, rx;
    size_t fill, cap;           /* bytes in rec, and its size */
    size_t ppos, plen;          /* the client: opened plaintext not yet taken */
    unsigned char* rec;
    unsigned char* out;         /* _DM_AEAD_MAX bytes; NULL at the server */
} _dm_st_seal;
_DM_PRIVATE void _dm_st_seal_free(const dm_allocator* a, _dm_st_seal* z) {
    if (!z) return;
    _dm_rec_free(&z->tx);
    _dm_rec_free(&z->rx);
    if (z->rec) memset(z->rec, 0, z->cap);
    if (z->out) memset(z->out, 0, _DM_AEAD_MAX);
    _dm_free(a, z->rec);
    _dm_free(a, z->out);
    _dm_free(a, z);
}
/* The bytes a server's records hold (charged to its quota). */
_DM_PRIVATE size_t _dm_st_seal_bytes(const _dm_st_seal* z) { return sizeof(*z) + z->cap; }
/* A connection's records keyed from its handshake (server: the server's end): NULL when out of
   memory or libcrypto failed. */
_DM_PRIVATE _dm_st_seal* _dm_st_seal_new(const dm_allocator* a, const char* token, size_t tn, const unsigned char nonce_c[32],
                                         const unsigned char nonce_s[32], bool server) {
    unsigned char kc[32], ks[32];
    _dm_st_seal* z = (_dm_st_seal*)_dm_calloc(a, sizeof(*z));
    bool ok;
    if (!z) return NULL;
    z->cap = server ? _DM_ST_SEAL_START : _DM_AEAD_MAX;
    z->rec = (unsigned char*)_dm_malloc(a, z->cap);
    z->out = server ? NULL : (unsigned char*)_dm_malloc(a, _DM_AEAD_MAX);
    _dm_st_seal_key(token, tn, nonce_c, nonce_s, true, kc);
    _dm_st_seal_key(token, tn, nonce_c, nonce_s, false, ks);
    ok = z->rec && (server || z->out) && _dm_rec_init(&z->tx, true, server ? ks : kc);
    ok = ok && _dm_rec_init(&z->rx, false, server ? kc : ks);
    memset(kc, 0, sizeof(kc));
    memset(ks, 0, sizeof(ks));
    if (!ok) {
        _dm_st_seal_free(a, z);
        return NULL;
    }
    return z;
}
/* The bytes n plaintext bytes take as records. */
_DM_PRIVATE size_t _dm_st_sealed_size(size_t n) {
    return n + (n + _DM_AEAD_RECORD - 1) / _DM_AEAD_RECORD * (_DM_AEAD_HEAD + _DM_AEAD_TAG);
}
/* Seals the pieces' total bytes as records into dst (_dm_st_sealed_size(total) bytes): false
   when libcrypto failed. */
_DM_PRIVATE bool _dm_st_seal_pieces(_dm_rec* r, const _dm_iov* iov, int niov, size_t total, unsigned char* dst) {
    _dm_iov part[_DM_LINK_IOV_MAX];
    size_t skip = 0;            /* bytes of iov[i] already sealed */
    int i = 0;
    while (total) {
        size_t n = total < _DM_AEAD_RECORD ? total : _DM_AEAD_RECORD, got = 0;
        int np = 0, j = i;
        size_t off = skip;
        while (got < n && j < niov && np < _DM_LINK_IOV_MAX) {
            size_t k;
            if (iov[j].len == 0) { j++; continue; }
            k = iov[j].len - off < n - got ? iov[j].len - off : n - got;
            part[np].buf = (const unsigned char*)iov[j].buf + off;
            part[np++].len = k;
            got += k;
            if (off + k == iov[j].len) { j++; off = 0; } else off += k;
        }
        if (got != n || !_dm_rec_seal(r, part, np, n, dst)) return false;
        i = j;
        skip = off;
        dst += n + _DM_AEAD_HEAD + _DM_AEAD_TAG;
        total -= n;
    }
    return true;
}
#endif /* DISTMESH_OPENSSL */

/* >>store limits  What create resolves from the desc and the environment (>>store create): the
   server's bounds, and the token both ends prove. */
typedef struct _dm_store_limits {
    size_t max_value, max_conn, max_total;
    int stall_ms;
    bool encrypt;               /* sealed records after the handshake (>>store seal) */
    size_t token_len;           /* 0: no authentication */
    char token[_DM_ST_TOKEN_MAX + 1];
} _dm_store_limits;

/* The soft RLIMIT_NOFILE up to the hard one, logged at debug level as "who: raised ...: why" (a
   hard limit of RLIM_INFINITY is above what the kernel allows, fs.nr_open: then nr_open). The
   store host does it before it serves (>>store server descriptors), a TCP rank when the
   connections its schedules need would not fit (distmesh_tcp.h >>tcp sparse). */
_DM_PRIVATE void _dm_st_raise_nofile(const dm_logger* lg, const char* who, const char* why) {
    struct rlimit rl;
    rlim_t was;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= rl.rlim_max) return;
    was = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
        FILE* f = fopen("/proc/sys/fs/nr_open", "r");
        unsigned long long nr = 0;
        if (f) {
            if (fscanf(f, "%llu", &nr) != 1) nr = 0;
            fclose(f);
        }
        rl.rlim_cur = nr > (unsigned long long)was && (rlim_t)nr < rl.rlim_max ? (rlim_t)nr : was;
        if (rl.rlim_cur == was || setrlimit(RLIMIT_NOFILE, &rl) != 0) {
            _DM_LOG(lg, DM_LOG_DEBUG, "%s: could not raise the soft limit on open files (RLIMIT_NOFILE %llu, hard "
                    "%llu): %s", who, (unsigned long long)was, (unsigned long long)rl.rlim_max, strerror(errno));
            return;
        }
    }
    _DM_LOG(lg, DM_LOG_DEBUG, "%s: raised this process's soft limit on open files (RLIMIT_NOFILE) from %llu to %llu "
            "(its hard limit %llu): %s", who, (unsigned long long)was, (unsigned long long)rl.rlim_cur,
            (unsigned long long)rl.rlim_max, why);
}

/* ============================================================================================ */
#if defined(DISTMESH_TCP)
#include <uv.h>

/* >>store server map  The server: libuv, one thread, one loop owned by the server (never the
   default loop). Everything in the server sections runs on the server thread after
   dm_store_create has bound and listened. Here: its types, and the key-value map (every byte of
   its entries charged to the quota, >>store server quota). */

/* The server's libuv codes are libuv's numbering on POSIX, which >>store codes translates for
   every part of the store: checked here, where uv.h is at hand. */
typedef char _dm_srv_codes_agree[(UV_EOF == _DM_ST_EOF && UV_EAI_AGAIN == _DM_ST_EAI_AGAIN &&
                                  UV_EAI_NONAME == _DM_ST_EAI_NONAME && UV_ETIMEDOUT == -ETIMEDOUT &&
                                  UV_ECONNREFUSED == -ECONNREFUSED && UV_EADDRINUSE == -EADDRINUSE) ? 1 : -1];


typedef struct _dm_kv {
    struct _dm_kv* next;
    uint64_t hash;
    unsigned char* key;
    size_t key_len;
    unsigned char* val;         /* allocated with at least 1 byte */
    size_t val_len, val_cap;
    struct _dm_srv_pin* pin;    /* while replies are written straight from val */
} _dm_kv;
/* A value being written to clients from the entry itself (a large GET reply, not copied). While
   refs > 0 its bytes stay: an entry that replaces or drops its value meanwhile hands them over
   (owner NULL), and the last write frees them and their charge. */
typedef struct _dm_srv_pin {
    _dm_kv* owner;              /* the entry whose value this is; NULL once it let go */
    unsigned char* val;
    size_t cap;
    unsigned refs;
} _dm_srv_pin;

struct _dm_srv_client;
typedef struct _dm_srv_wkey {
    uint64_t hash;
    const unsigned char* key;   /* into the waiter's own copy */
    size_t len;
    bool done;
} _dm_srv_wkey;
/* One pending WAIT of one client: the keys that were missing when it arrived. */
typedef struct _dm_srv_waiter {
    struct _dm_srv_waiter *prev, *next;
    struct _dm_srv_client* client;
    size_t nkeys, remaining;
    _dm_srv_wkey* keys;         /* same allocation as the waiter */
} _dm_srv_waiter;

typedef struct _dm_srv {
    uv_loop_t loop;
    uv_poll_t listener;         /* readable when clients wait to be accepted (>>store server accept) */
    int lfd;                    /* the listening socket, -1 none; accepted by hand, not by libuv */
    int reserve;                /* a descriptor held back to answer a client when the others run out */
    bool accept_paused;         /* out of descriptors and no reserve: the listener rests a tick */
    unsigned nclients;          /* client connections held (not closing); atomic: _dm_srv_stop reads */
    unsigned long refused;      /* clients refused for lack of descriptors; atomic, as nclients */
    int64_t last_client_ms;     /* when a client was last accepted or refused; atomic, as nclients */
    int64_t refused_logged;     /* when that was last logged */
    uv_async_t stop;
    uv_timer_t tick;            /* drops clients that do not authenticate or do not read */
    pthread_t thread;
    bool thread_started, listener_open, stop_open, tick_open;
    _dm_store_limits lim;
    size_t held;                /* bytes charged to lim.max_total: entries, input buffers, replies */
    size_t data;                /* the entries' part of held: keys, values and their records */
    unsigned closes;            /* clients closed so far (a close may free waiters mid-scan) */
    _dm_kv** buckets;
    size_t nbuckets, nkeys;
    struct _dm_srv_client* clients;
    _dm_srv_waiter* waiters;
    int port;
    dm_logger logger;
    dm_allocator allocator;
} _dm_srv;

typedef struct _dm_srv_client {
    uv_tcp_t tcp;               /* first: a handle pointer is a client pointer */
    _dm_srv* srv;
    struct _dm_srv_client *prev, *next;
    unsigned char* in;          /* received, not yet parsed bytes */
    size_t in_len, in_cap;
    size_t need;                /* don't parse again before in_len reaches this */
    size_t charged;             /* input buffer bytes charged to srv->held */
    size_t queued;              /* reply bytes handed to libuv, not yet written */
    size_t uncharged;           /* the part of queued written from pinned values (not copies) */
    int64_t since;              /* accept time while authenticating; last write progress */
    unsigned char auth;         /* 0 admitted, 1 hello expected, 2 proof expected */
    bool reading, flush_close;  /* flush_close: close once the queued replies are written */
    bool released;              /* closing: its bytes are no longer charged */
    unsigned char nonce_c[32], nonce_s[32];
    struct _dm_st_seal* seal;   /* admitted with encryption: its records (>>store seal); else NULL */
    bool validated, closing;
    unsigned char proto;        /* _DM_ST_PROTO_2, or _DM_ST_PROTO_1 for a torch < 2.2 client */
    bool notices;               /* a distmesh client: told why before it is closed (>>store wire) */
    bool in_process;            /* inside _dm_srv_process: `in` is a view, not to be freed here */
    bool adopted;               /* the request just served took `in` over as a value */
    size_t view_off;            /* where the view _dm_srv_process parses starts in the buffer */
    size_t refused;             /* growth the quota refused in the alloc callback (0: none) */
    _dm_srv_waiter* waiter;
    char peer[64];
} _dm_srv_client;

typedef struct _dm_srv_write {
    uv_write_t req;
    const dm_allocator* a;      /* the bytes follow the struct in the same allocation */
    size_t n;                   /* bytes written, */
    size_t charged;             /* of which charged to the quota (all but a pinned value's) */
    _dm_srv_pin* pin;           /* the value written after the bytes, or NULL */
} _dm_srv_write;

/* -- the map -- */
_DM_PRIVATE _dm_kv** _dm_srv_slot(_dm_srv* s, const void* key, size_t n, uint64_t h) {
    _dm_kv** pp = &s->buckets[h & (s->nbuckets - 1)];
    for (; *pp; pp = &(*pp)->next)
        if ((*pp)->hash == h && (*pp)->key_len == n && memcmp((*pp)->key, key, n) == 0) break;
    return pp;
}
_DM_PRIVATE _dm_kv* _dm_srv_find(_dm_srv* s, const void* key, size_t n) {
    return *_dm_srv_slot(s, key, n, _dm_st_hash(key, n));
}
/* An entry's charge: its record, key and value capacity, in both held and data. */
_DM_PRIVATE size_t _dm_srv_kv_bytes(const _dm_kv* e) { return sizeof(*e) + e->key_len + e->val_cap; }
_DM_PRIVATE void _dm_srv_uncharge_data(_dm_srv* s, size_t b) {
    s->held = s->held > b ? s->held - b : 0;
    s->data = s->data > b ? s->data - b : 0;
}
/* e lets go of its value: freed now, or by the last write still sending it (see _dm_srv_pin). */
_DM_PRIVATE void _dm_srv_release_val(_dm_srv* s, _dm_kv* e) {
    if (e->pin) {
        e->pin->owner = NULL;
        e->pin = NULL;
    } else {
        _dm_free(&s->allocator, e->val);
        _dm_srv_uncharge_data(s, e->val_cap);
    }
    e->val = NULL;
    e->val_len = e->val_cap = 0;
}
/* The bytes a new value may count on being freed now: none while replies are written from it. */
_DM_PRIVATE size_t _dm_srv_freeable(const _dm_kv* e) { return e->pin ? 0 : e->val_cap; }
_DM_PRIVATE void _dm_srv_unpin(_dm_srv* s, _dm_srv_pin* p) {
    if (--p->refs) return;
    if (p->owner) {
        p->owner->pin = NULL;
    } else {
        _dm_free(&s->allocator, p->val);
        _dm_srv_uncharge_data(s, p->cap);
    }
    _dm_free(&s->allocator, p);
}
_DM_PRIVATE void _dm_srv_kv_free(_dm_srv* s, _dm_kv* e) {
    _dm_srv_release_val(s, e);
    _dm_srv_uncharge_data(s, _dm_srv_kv_bytes(e));
    _dm_free(&s->allocator, e->key);
    _dm_free(&s->allocator, e);
}
_DM_PRIVATE void _dm_srv_grow(_dm_srv* s) {
    size_t nb = s->nbuckets * 2, i;
    _dm_kv** b = (_dm_kv**)_dm_calloc(&s->allocator, nb * sizeof(*b));
    if (!b) return; /* keep the old table: longer chains, still correct */
    for (i = 0; i < s->nbuckets; i++) {
        _dm_kv* e = s->buckets[i];
        while (e) {
            _dm_kv* nx = e->next;
            e->next = b[e->hash & (nb - 1)];
            b[e->hash & (nb - 1)] = e;
            e = nx;
        }
    }
    _dm_free(&s->allocator, s->buckets);
    s->buckets = b;
    s->nbuckets = nb;
}
/* Whether keys and values may grow by data_more bytes, and everything held by held_more, while
   `less` bytes of theirs go (a replaced value): within the data share (the quota less
   1/_DM_ST_BUFFER_SHARE) and within the quota. The moment a value and its replacement coexist
   is not charged: the charge is what is held once the request is served. */
_DM_PRIVATE bool _dm_srv_fits(const _dm_srv* s, size_t data_more, size_t held_more, size_t less) {
    size_t cap = s->lim.max_total - s->lim.max_total / _DM_ST_BUFFER_SHARE;
    size_t data = s->data - (less < s->data ? less : s->data), held = s->held - (less < s->held ? less : s->held);
    return data <= cap && data_more <= cap - data && held <= s->lim.max_total &&
           held_more <= s->lim.max_total - held;
}
/* Replaces (append false) or extends (append true) the value; NULL when out of memory, or over
   the quota (*over_quota set). */
_DM_PRIVATE _dm_kv* _dm_srv_put(_dm_srv* s, const unsigned char* key, size_t kn,
                                const unsigned char* val, size_t vn, bool append, bool* over_quota) {
    uint64_t h = _dm_st_hash(key, kn);
    _dm_kv** pp = _dm_srv_slot(s, key, kn, h);
    _dm_kv* e = *pp;
    *over_quota = false;
    if (!e) {
        if (!_dm_srv_fits(s, sizeof(*e) + kn + vn, sizeof(*e) + kn + vn, 0)) { *over_quota = true; return NULL; }
        e = (_dm_kv*)_dm_calloc(&s->allocator, sizeof(*e));
        if (!e) return NULL;
        e->key = (unsigned char*)_dm_malloc(&s->allocator, kn);
        e->val = (unsigned char*)_dm_malloc(&s->allocator, vn);
        if (!e->key || !e->val) {
            _dm_free(&s->allocator, e->key);
            _dm_free(&s->allocator, e->val);
            _dm_free(&s->allocator, e);
            return NULL;
        }
        if (kn) memcpy(e->key, key, kn);
        if (vn) memcpy(e->val, val, vn);
        e->key_len = kn;
        e->val_len = e->val_cap = vn;
        e->hash = h;
        s->held += _dm_srv_kv_bytes(e);
        s->data += _dm_srv_kv_bytes(e);
        *pp = e;
        if (++s->nkeys > s->nbuckets) _dm_srv_grow(s);
        return e;
    }
    if (append && e->val_len + vn <= e->val_cap) {
        if (vn) memcpy(e->val + e->val_len, val, vn);
        e->val_len += vn;
        return e;
    }
    {
        size_t keep = append ? e->val_len : 0, cap = keep + vn;
        unsigned char* nv;
        if (append && cap < 2 * e->val_cap) cap = 2 * e->val_cap;
        if (!_dm_srv_fits(s, cap, cap, _dm_srv_freeable(e))) { *over_quota = true; return NULL; }
        nv = (unsigned char*)_dm_malloc(&s->allocator, cap);
        if (!nv) return NULL;
        if (keep) memcpy(nv, e->val, keep);
        if (vn) memcpy(nv + keep, val, vn);
        _dm_srv_release_val(s, e);
        s->held += cap;
        s->data += cap;
        e->val = nv;
        e->val_len = keep + vn;
        e->val_cap = cap;
    }
    return e;
}
/* SET whose request is the whole of c's input buffer (request_len bytes at its start, nothing
   after it) and mostly value: the buffer becomes the value, moved to its start, and its bytes go
   from c's buffer charge to the data charge. NULL (*over_quota as for put) when it cannot;
   *adopted tells whether this path applied at all (else the caller copies with put). */
_DM_PRIVATE _dm_kv* _dm_srv_put_adopt(_dm_srv_client* c, const unsigned char* key, size_t kn,
                                      const unsigned char* val, size_t vn, size_t request_len,
                                      bool* adopted, bool* over_quota) {
    _dm_srv* s = c->srv;
    uint64_t h = _dm_st_hash(key, kn);
    _dm_kv** pp = _dm_srv_slot(s, key, kn, h);
    _dm_kv* e = *pp;
    size_t record = e ? 0 : sizeof(*e) + kn, cap = c->in_cap;
    *adopted = *over_quota = false;
    if (vn < _DM_ST_INPLACE_MIN || c->view_off != 0 || c->in_len != request_len || cap > vn + vn / 4 + 4096 ||
        c->charged != cap)
        return NULL;
    *adopted = true;
    /* the buffer is already in held: data grows by all of it, held only by the record */
    if (!_dm_srv_fits(s, record + cap, record, e ? _dm_srv_freeable(e) : 0)) {
        *over_quota = true;
        return NULL;
    }
    if (!e) {
        e = (_dm_kv*)_dm_calloc(&s->allocator, sizeof(*e));
        if (e) e->key = (unsigned char*)_dm_malloc(&s->allocator, kn ? kn : 1);
        if (!e || !e->key) { _dm_free(&s->allocator, e); return NULL; }
        if (kn) memcpy(e->key, key, kn);
        e->key_len = kn;
        e->hash = h;
        *pp = e;
        s->held += record;
        s->data += record;
        if (++s->nkeys > s->nbuckets) _dm_srv_grow(s);
    } else {
        _dm_srv_release_val(s, e);
    }
    memmove(c->in, val, vn);
    e->val = c->in;
    e->val_len = vn;
    e->val_cap = cap;
    s->data += cap;             /* held already counts it, as c's buffer */
    c->in = NULL;
    c->in_len = c->in_cap = c->charged = 0;
    c->adopted = true;
    return e;
}
_DM_PRIVATE bool _dm_srv_erase(_dm_srv* s, const unsigned char* key, size_t kn) {
    _dm_kv** pp = _dm_srv_slot(s, key, kn, _dm_st_hash(key, kn));
    _dm_kv* e = *pp;
    if (!e) return false;
    *pp = e->next;
    _dm_srv_kv_free(s, e);
    s->nkeys--;
    return true;
}

/* -- clients -- */
_DM_PRIVATE void _dm_srv_close_client(_dm_srv_client* c);
_DM_PRIVATE void _dm_srv_process(_dm_srv_client* c);
_DM_PRIVATE void _dm_srv_alloc(uv_handle_t* h, size_t suggested, uv_buf_t* buf);
_DM_PRIVATE void _dm_srv_on_read(uv_stream_t* st, ssize_t nread, const uv_buf_t* buf);
_DM_PRIVATE _DM_PRINTF(3, 4) void _dm_srv_drop(_dm_srv_client* c, dm_status st, const char* fmt, ...);

/* >>store server quota  Every byte the server holds is charged to the total quota first:
   entries (keys, values, records; at most the data share of it, see _dm_srv_fits), each
   client's input buffer (capacity, bounded by max_conn) and its queued replies (bounded by
   max_conn). Buffers that would go over the quota make room by dropping the client holding the
   most buffered bytes, unless that is the client asking, which is refused then. */
_DM_PRIVATE size_t _dm_srv_buffered(const _dm_srv_client* c) { return c->charged + c->queued - c->uncharged; }
/* Charges `extra` buffer bytes for c. False when c is the one to refuse; the caller refuses it
   (never from libuv's alloc callback: closing the handle there makes libuv call the read
   callback it has just cleared, a NULL pointer). */
_DM_PRIVATE bool _dm_srv_make_room(_dm_srv_client* c, size_t extra) {
    _dm_srv* s = c->srv;
    while (extra > s->lim.max_total || s->held > s->lim.max_total - extra) {
        _dm_srv_client *big = NULL, *x;
        for (x = s->clients; x; x = x->next)
            if (!x->closing && !x->flush_close && (!big || _dm_srv_buffered(x) > _dm_srv_buffered(big))) big = x;
        if (!big || big == c || _dm_srv_buffered(big) == 0) return false;
        _dm_srv_drop(big, DM_ERR_OUT_OF_MEMORY, "the store is at its memory quota of %zu bytes "
                     "(DISTMESH_STORE_MAX_TOTAL) and this client holds the most buffered bytes (%zu)",
                     s->lim.max_total, _dm_srv_buffered(big));
    }
    s->held += extra;
    return true;
}
_DM_PRIVATE void _dm_srv_refuse_quota(_dm_srv_client* c, size_t extra) {
    _dm_srv_drop(c, DM_ERR_OUT_OF_MEMORY, "the store is at its memory quota of %zu bytes (DISTMESH_STORE_MAX_TOTAL; "
                 "%zu held, %zu of them keys and values) and this client needs %zu more for its buffers",
                 c->srv->lim.max_total, c->srv->held, c->srv->data, extra);
}
/* Reading follows the reply backlog: a client that does not read its replies is not read from
   (its requests wait in the kernel), so it cannot make the server queue more. */
_DM_PRIVATE void _dm_srv_flow(_dm_srv_client* c) {
    if (c->closing || c->flush_close) return;
    if (c->queued > _DM_ST_HIGH_WATER) {
        if (c->reading) {
            uv_read_stop((uv_stream_t*)&c->tcp);
            c->reading = false;
            c->since = _dm_now_ms();
        }
    } else if (!c->reading) {
        if (uv_read_start((uv_stream_t*)&c->tcp, _dm_srv_alloc, _dm_srv_on_read) < 0) _dm_srv_close_client(c);
        else c->reading = true;
    }
}

/* >>store server replies  Replies are queued with libuv (copied, or a large value written from its
   pinned entry), their bytes charged until written; a completed WAIT is a reply too. */
_DM_PRIVATE void _dm_srv_on_written(uv_write_t* req, int status) {
    _dm_srv_write* w = (_dm_srv_write*)req->data;
    _dm_srv_client* c = (_dm_srv_client*)req->handle;
    _dm_srv* s = c->srv;
    c->queued -= w->n;
    c->uncharged -= w->n - w->charged;
    if (!c->released) s->held -= w->charged;
    if (w->pin) _dm_srv_unpin(s, w->pin);
    if (!c->auth) c->since = _dm_now_ms();   /* progress (authenticating: the deadline stays) */
    _dm_free(w->a, w);
    if (c->closing) return;
    if (status < 0 && status != UV_ECANCELED) { _dm_srv_close_client(c); return; }
    if (c->flush_close) {
        if (c->queued == 0) _dm_srv_close_client(c);
        return;
    }
    if (!c->reading && c->queued <= _DM_ST_HIGH_WATER) _dm_srv_process(c);   /* parse what waits */
}
/* The bytes of the pieces (total of them) into dst as the client reads them: copied, or sealed
   as records for a client admitted with encryption (n: the bytes that takes). False when
   libcrypto failed. */
_DM_PRIVATE size_t _dm_srv_wire_size(const _dm_srv_client* c, size_t total) {
#if defined(DISTMESH_OPENSSL)
    if (c->seal) return _dm_st_sealed_size(total);
#endif
    (void)c;
    return total;
}
_DM_PRIVATE bool _dm_srv_wire_fill(_dm_srv_client* c, const _dm_iov* iov, int niov, size_t total, unsigned char* dst) {
    int i;
#if defined(DISTMESH_OPENSSL)
    if (c->seal) return _dm_st_seal_pieces(&c->seal->tx, iov, niov, total, dst);
#endif
    (void)c;
    (void)total;
    for (i = 0; i < niov; i++) {
        if (iov[i].len) memcpy(dst, iov[i].buf, iov[i].len);
        dst += iov[i].len;
    }
    return true;
}
_DM_PRIVATE void _dm_srv_queue_v(_dm_srv_client* c, const _dm_iov* iov, int niov, size_t plain, bool metered);
/* Queues bytes for the client (copied, or sealed); a failure closes the client. A notice
   (metered false: a few hundred bytes, once per client) is charged without asking the quota. */
_DM_PRIVATE void _dm_srv_queue(_dm_srv_client* c, const void* d, size_t n, bool metered) {
    _dm_iov one;
    one.buf = d;
    one.len = n;
    _dm_srv_queue_v(c, &one, 1, n, metered);
}
_DM_PRIVATE void _dm_srv_queue_v(_dm_srv_client* c, const _dm_iov* iov, int niov, size_t plain, bool metered) {
    _dm_srv_write* w;
    uv_buf_t buf;
    int rc;
    size_t n = _dm_srv_wire_size(c, plain);
    if (c->closing || plain == 0) return;
    if (metered && (n > c->srv->lim.max_conn || c->queued > c->srv->lim.max_conn - n)) {
        _dm_srv_drop(c, DM_ERR_PROTOCOL, "does not read its replies (%zu bytes queued, %zu more above the "
                     "per-connection limit DISTMESH_STORE_MAX_CONN of %zu)", c->queued, n, c->srv->lim.max_conn);
        return;
    }
    if (!metered) c->srv->held += n;
    else if (!_dm_srv_make_room(c, n)) { _dm_srv_refuse_quota(c, n); return; }
    w = (_dm_srv_write*)_dm_malloc(&c->srv->allocator, sizeof(*w) + n);
    if (!w) {
        c->srv->held -= n;
        if (metered) _dm_srv_drop(c, DM_ERR_OUT_OF_MEMORY, "out of memory queueing a reply of %zu bytes", n);
        else _dm_srv_close_client(c);
        return;
    }
    w->a = &c->srv->allocator;
    w->n = w->charged = n;
    w->pin = NULL;
    if (!_dm_srv_wire_fill(c, iov, niov, plain, (unsigned char*)(w + 1))) {
        c->srv->held -= n;
        _dm_free(w->a, w);
        _dm_srv_close_client(c);
        return;
    }
    buf.base = (char*)(w + 1);
    buf.len = n;
    w->req.data = w;
    c->queued += n;
    rc = uv_write(&w->req, (uv_stream_t*)&c->tcp, &buf, 1, _dm_srv_on_written); /* copies buf */
    if (rc < 0) {
        c->queued -= n;
        c->srv->held -= n;
        _dm_free(w->a, w);
        _dm_srv_close_client(c);
    }
}
_DM_PRIVATE void _dm_srv_send(_dm_srv_client* c, const void* d, size_t n) { _dm_srv_queue(c, d, n, true); }
_DM_PRIVATE void _dm_srv_send_stbuf(_dm_srv_client* c, _dm_stbuf* b) {
    if (b->oom) _dm_srv_close_client(c);
    else _dm_srv_send(c, b->p, b->len);
    _dm_stbuf_free(b);
}
/* A value as a reply (u64 length + bytes) written from the entry, pinned until written: only
   the 8-byte length is a copy, and only it is charged; the value's bytes already are. A sealed
   client's reply is records, a copy like any other reply (charged). */
_DM_PRIVATE void _dm_srv_send_value(_dm_srv_client* c, _dm_kv* e) {
    _dm_srv* s = c->srv;
    _dm_srv_write* w;
    _dm_srv_pin* p = e->pin;
    uv_buf_t bufs[2];
    size_t n = 8 + e->val_len;
    int i, rc;
    if (c->closing) return;
    if (c->seal) {
        unsigned char len8[8];
        _dm_iov v[2];
        for (i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)e->val_len >> (8 * i));
        v[0].buf = len8;
        v[0].len = 8;
        v[1].buf = e->val;
        v[1].len = e->val_len;
        _dm_srv_queue_v(c, v, 2, n, true);
        return;
    }
    if (n > s->lim.max_conn || c->queued > s->lim.max_conn - n) {
        _dm_srv_drop(c, DM_ERR_PROTOCOL, "does not read its replies (%zu bytes queued, %zu more above the "
                     "per-connection limit DISTMESH_STORE_MAX_CONN of %zu)", c->queued, n, s->lim.max_conn);
        return;
    }
    if (!p && (p = (_dm_srv_pin*)_dm_calloc(&s->allocator, sizeof(*p))) != NULL) {
        p->owner = e;
        p->val = e->val;
        p->cap = e->val_cap;
        e->pin = p;
    }
    w = p ? (_dm_srv_write*)_dm_malloc(&s->allocator, sizeof(*w) + 8) : NULL;
    if (!w) {
        if (p && p->refs == 0) { p->refs = 1; _dm_srv_unpin(s, p); }
        _dm_srv_drop(c, DM_ERR_OUT_OF_MEMORY, "out of memory queueing a reply of %zu bytes", n);
        return;
    }
    p->refs++;
    if (!_dm_srv_make_room(c, 8)) {
        _dm_free(&s->allocator, w);
        _dm_srv_unpin(s, p);
        _dm_srv_refuse_quota(c, 8);
        return;
    }
    for (i = 0; i < 8; i++) ((unsigned char*)(w + 1))[i] = (unsigned char)((uint64_t)e->val_len >> (8 * i));
    w->a = &s->allocator;
    w->n = n;
    w->charged = 8;
    w->pin = p;
    w->req.data = w;
    bufs[0].base = (char*)(w + 1);
    bufs[0].len = 8;
    bufs[1].base = (char*)p->val;
    bufs[1].len = e->val_len;
    c->queued += n;
    c->uncharged += n - 8;
    rc = uv_write(&w->req, (uv_stream_t*)&c->tcp, bufs, 2, _dm_srv_on_written);
    if (rc < 0) {
        c->queued -= n;
        c->uncharged -= n - 8;
        s->held -= 8;
        _dm_free(w->a, w);
        _dm_srv_unpin(s, p);
        _dm_srv_close_client(c);
    }
}

_DM_PRIVATE void _dm_srv_waiter_drop(_dm_srv* s, _dm_srv_waiter* w) {
    if (w->prev) w->prev->next = w->next;
    else s->waiters = w->next;
    if (w->next) w->next->prev = w->prev;
    if (w->client->waiter == w) w->client->waiter = NULL;
    _dm_free(&s->allocator, w);
}
/* A key now exists: every waiter that registered it counts it once; waiters done get
   STOP_WAITING. */
_DM_PRIVATE void _dm_srv_wake(_dm_srv* s, const unsigned char* key, size_t kn) {
    uint64_t h = _dm_st_hash(key, kn);
    _dm_srv_waiter* w = s->waiters;
    while (w) {
        _dm_srv_waiter* nx = w->next;
        size_t i;
        for (i = 0; i < w->nkeys; i++) {
            _dm_srv_wkey* k = &w->keys[i];
            if (!k->done && k->hash == h && k->len == kn && memcmp(k->key, key, kn) == 0) {
                k->done = true;
                w->remaining--;
            }
        }
        if (w->remaining == 0) {
            unsigned char b = _DM_ST_STOP_WAITING;
            _dm_srv_client* c = w->client;
            unsigned closes = s->closes;
            _dm_srv_waiter_drop(s, w);
            _dm_srv_send(c, &b, 1);
            if (s->closes != closes) nx = s->waiters;  /* the quota closed someone: rescan (done keys stay done) */
        }
        w = nx;
    }
}

/* >>store server closing  A client goes: on EOF, on a write error, or dropped for a reason it is
   told first when it is a distmesh client (a notice, see >>store wire). */
_DM_PRIVATE void _dm_srv_on_client_closed(uv_handle_t* h) {
    _dm_srv_client* c = (_dm_srv_client*)h;
    _dm_srv* s = c->srv;
    if (c->prev) c->prev->next = c->next;
    else s->clients = c->next;
    if (c->next) c->next->prev = c->prev;
    _dm_free(&s->allocator, c->in);
#if defined(DISTMESH_OPENSSL)
    if (c->seal) s->held -= _dm_st_seal_bytes(c->seal);
    _dm_st_seal_free(&s->allocator, c->seal);
#endif
    _dm_free(&s->allocator, c);
}
/* The input buffer goes (a client that is closing or being told why reads nothing more): its
   charge at once, so the quota can count on it, its memory unless _dm_srv_process is parsing a
   view of it (it calls this again when it is done) or the close callback will. */
_DM_PRIVATE void _dm_srv_release_input(_dm_srv_client* c) {
    c->srv->held -= c->charged;
    c->charged = 0;
    if (c->in_process || c->closing) return;
    _dm_free(&c->srv->allocator, c->in);
    c->in = NULL;
    c->in_len = c->in_cap = 0;
}
_DM_PRIVATE void _dm_srv_close_client(_dm_srv_client* c) {
    if (c->closing) return;
    c->closing = true;
    c->srv->closes++;
    __atomic_sub_fetch(&c->srv->nclients, 1, __ATOMIC_RELAXED);     /* read by _dm_srv_stop */
    c->srv->held -= _dm_srv_buffered(c);      /* freed in the close and write callbacks */
    c->charged = 0;
    c->released = true;
    if (c->waiter) _dm_srv_waiter_drop(c->srv, c->waiter);
    uv_close((uv_handle_t*)&c->tcp, _dm_srv_on_client_closed);
}
/* Stops reading c, queues its last bytes (unmetered) and closes it once they are written (the
   tick closes it if they do not move for _DM_ST_NOTICE_MS). */
_DM_PRIVATE void _dm_srv_last_words(_dm_srv_client* c, const void* d, size_t n) {
    if (c->reading) uv_read_stop((uv_stream_t*)&c->tcp);
    c->reading = false;
    c->flush_close = true;
    c->since = _dm_now_ms();
    if (c->waiter) _dm_srv_waiter_drop(c->srv, c->waiter);
    _dm_srv_release_input(c);
    _dm_srv_queue(c, d, n, false);
    if (!c->closing && c->queued == 0) _dm_srv_close_client(c);
}
/* Closes a client that broke a bound, failed to authenticate or sent a malformed request,
   logging the reason; a distmesh client gets the reason first (a notice, see >>store wire). */
_DM_PRIVATE _DM_PRINTF(3, 4) void _dm_srv_drop(_dm_srv_client* c, dm_status st, const char* fmt, ...) {
    char what[_DM_ST_NOTICE_TEXT], msg[420];
    unsigned char note[_DM_ST_NOTICE_HEAD + _DM_ST_NOTICE_TEXT];
    size_t n;
    va_list ap;
    if (c->closing || c->flush_close) return;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    _DM_REPORT(&c->srv->logger, msg, sizeof(msg), st, "tcp-store: server closed client %s (%s)", c->peer, what);
    if (!c->notices) { _dm_srv_close_client(c); return; }
    n = strlen(what);
    memcpy(note, _dm_st_notice_magic, 8);
    note[8] = (unsigned char)((uint32_t)st); note[9] = (unsigned char)((uint32_t)st >> 8);
    note[10] = (unsigned char)((uint32_t)st >> 16); note[11] = (unsigned char)((uint32_t)st >> 24);
    note[12] = (unsigned char)n; note[13] = (unsigned char)(n >> 8);
    memcpy(note + _DM_ST_NOTICE_HEAD, what, n);
    _dm_srv_last_words(c, note, _DM_ST_NOTICE_HEAD + n);
}
_DM_PRIVATE _DM_PRINTF(2, 3) void _dm_srv_protocol_error(_dm_srv_client* c, const char* fmt, ...) {
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    _dm_srv_drop(c, DM_ERR_PROTOCOL, "%s", what);
}
/* Answers a client that may not go on with one u32 (status or "DMAU"), logs why, and closes it
   once that is written; nothing it sent later is read. */
_DM_PRIVATE void _dm_srv_refuse(_dm_srv_client* c, uint32_t code, const char* why) {
    unsigned char b[4];
    char msg[420];
    _DM_REPORT(&c->srv->logger, msg, sizeof(msg), DM_ERR_REFUSED, "tcp-store: server refused client %s (%s)",
               c->peer, why);
    b[0] = (unsigned char)code; b[1] = (unsigned char)(code >> 8);
    b[2] = (unsigned char)(code >> 16); b[3] = (unsigned char)(code >> 24);
    _dm_srv_last_words(c, b, 4);
}

/* >>store server handshake  One step of the handshake on the bytes at the start of the buffer, like
   _dm_srv_one: bytes consumed, or 0 (more needed, or the client was refused). */
/* The handshake's version this server takes (>>store wire): sealed or plain. */
_DM_PRIVATE uint32_t _dm_srv_auth_version(const _dm_srv* s) {
    return s->lim.encrypt ? _DM_ST_AUTH_SEALED : _DM_ST_AUTH_VERSION;
}
/* A client whose encryption setting differs: "DMSA" and the status that says which way, then
   the close (>>store wire). */
_DM_PRIVATE void _dm_srv_refuse_setting(_dm_srv_client* c) {
    bool sealed = c->srv->lim.encrypt;
    unsigned char b[8] = { 0x44, 0x4d, 0x53, 0x41, 0, 0, 0, 0 };       /* "DMSA" */
    char msg[420];
    b[4] = (unsigned char)(sealed ? _DM_ST_AUTH_SEAL_DIFFERS : _DM_ST_AUTH_PLAIN_DIFFERS);
    _DM_REPORT(&c->srv->logger, msg, sizeof(msg), DM_ERR_REFUSED, "tcp-store: server refused client %s (it has "
               "encryption %s and this server %s: set the same DISTMESH_ENCRYPT, or desc.encrypt, on every process)",
               c->peer, sealed ? "off" : "on", sealed ? "on" : "off");
    _dm_srv_last_words(c, b, sizeof(b));
}
/* The client proved the token: admitted (u32 0, the last plain bytes), and from here sealed when
   the server encrypts. False when the client was refused or dropped. */
_DM_PRIVATE bool _dm_srv_auth_done(_dm_srv_client* c) {
    unsigned char ok[4] = { 0, 0, 0, 0 };
    c->auth = 0;
    c->notices = true;          /* only a distmesh client authenticates */
    if (c->srv->lim.encrypt && c->in_len != 32) {
        _dm_srv_refuse(c, 1, "sent requests before it was admitted");   /* they would be plain */
        return false;
    }
    _dm_srv_send(c, ok, 4);
    if (c->closing || !c->srv->lim.encrypt) return !c->closing;
#if defined(DISTMESH_OPENSSL)
    {
        size_t need = sizeof(_dm_st_seal) + _DM_ST_SEAL_START;      /* _dm_st_seal_bytes of a new one */
        if (!_dm_srv_make_room(c, need)) { _dm_srv_refuse_quota(c, need); return false; }
        c->seal = _dm_st_seal_new(&c->srv->allocator, c->srv->lim.token, c->srv->lim.token_len, c->nonce_c,
                                  c->nonce_s, true);
        if (c->seal) return true;
        c->srv->held -= need;
    }
#endif
    _dm_srv_close_client(c);    /* out of memory (or no libcrypto): nothing can be said sealed */
    return false;
}
_DM_PRIVATE size_t _dm_srv_auth_step(_dm_srv_client* c) {
    const _dm_store_limits* L = &c->srv->lim;
    const unsigned char* p = c->in;
    unsigned char mac[32];
    uint32_t version = _dm_srv_auth_version(c->srv);
    if (c->auth == 1) {
        unsigned char rep[_DM_ST_AUTH_CHALLENGE];
        uint32_t v;
        if (p[0] != _DM_STQ_AUTH) {
            _dm_srv_refuse(c, _DM_ST_AUTH_NEEDED, "it did not authenticate: the store has a token "
                           "(set the same DISTMESH_TOKEN on the client; torch clients cannot authenticate)");
            return 0;
        }
        if (c->in_len < _DM_ST_AUTH_HELLO) { c->need = _DM_ST_AUTH_HELLO; return 0; }
        v = _dm_st_get_u32(p + 5);
        if (_dm_st_get_u32(p + 1) != _DM_ST_AUTH_MAGIC || (v != _DM_ST_AUTH_VERSION && v != _DM_ST_AUTH_SEALED)) {
            _dm_srv_refuse(c, 1, "malformed authentication hello");
            return 0;
        }
        if (v != version) { _dm_srv_refuse_setting(c); return 0; }
        memcpy(c->nonce_c, p + 9, 32);
        _dm_st_random(c->nonce_s, 32);
        memset(rep, 0, sizeof(rep));
        rep[0] = 0x44; rep[1] = 0x4d; rep[2] = 0x53; rep[3] = 0x41;   /* "DMSA", status 0 */
        memcpy(rep + 8, c->nonce_s, 32);
        _dm_st_auth_mac(L->token, L->token_len, true, version, c->nonce_c, c->nonce_s, rep + 40);
        c->auth = 2;
        _dm_srv_send(c, rep, sizeof(rep));
        return c->closing ? 0 : _DM_ST_AUTH_HELLO;
    }
    if (c->in_len < 32) { c->need = 32; return 0; }
    _dm_st_auth_mac(L->token, L->token_len, false, version, c->nonce_s, c->nonce_c, mac);
    if (!_dm_st_ct_equal(mac, p, 32)) {
        _dm_srv_refuse(c, 1, "wrong token proof: a different DISTMESH_TOKEN, or a replayed handshake");
        return 0;
    }
    return _dm_srv_auth_done(c) ? 32 : 0;
}

/* >>store server requests  Parsing and executing one request. A cursor over the client's
   buffer; every read checks that the bytes are there (else: more needed, remembered in `need`)
   and every length against its cap. */
typedef struct _dm_srv_cur {
    const unsigned char* p;
    size_t len, off, need;
    uint64_t max_value;         /* the server's per-value limit */
    const char* bad;            /* set when the request is malformed */
} _dm_srv_cur;
_DM_PRIVATE bool _dm_srv_have(_dm_srv_cur* k, size_t n) {
    if (k->bad) return false;
    if (n > k->len - k->off) {
        k->need = k->off + n;
        return false;
    }
    return true;
}
_DM_PRIVATE bool _dm_srv_rd_u64(_dm_srv_cur* k, uint64_t* v) {
    if (!_dm_srv_have(k, 8)) return false;
    *v = _dm_st_get_u64(k->p + k->off);
    k->off += 8;
    return true;
}
_DM_PRIVATE bool _dm_srv_rd_u32(_dm_srv_cur* k, uint32_t* v) {
    if (!_dm_srv_have(k, 4)) return false;
    *v = _dm_st_get_u32(k->p + k->off);
    k->off += 4;
    return true;
}
_DM_PRIVATE bool _dm_srv_rd_str(_dm_srv_cur* k, uint64_t cap, const char* what,
                                const unsigned char** d, size_t* n) {
    uint64_t len;
    if (!_dm_srv_rd_u64(k, &len)) return false;
    if (len > cap) { k->bad = what; return false; }
    if (!_dm_srv_have(k, (size_t)len)) return false;
    *d = k->p + k->off;
    *n = (size_t)len;
    k->off += (size_t)len;
    return true;
}
#define _DM_SRV_KEY(k, d, n) _dm_srv_rd_str((k), DM_STORE_MAX_KEY, "key longer than DM_STORE_MAX_KEY", (d), (n))
#define _DM_SRV_VAL(k, d, n) _dm_srv_rd_str((k), (k)->max_value, "value longer than the per-value limit (DISTMESH_STORE_MAX_VALUE)", (d), (n))
_DM_PRIVATE bool _dm_srv_rd_count(_dm_srv_cur* k, uint64_t* n) {
    if (!_dm_srv_rd_u64(k, n)) return false;
    if (*n > DM_STORE_MAX_KEYS) { k->bad = "key count above DM_STORE_MAX_KEYS"; return false; }
    return true;
}
/* Skips n keys (exec false: completeness check before anything is executed). */
_DM_PRIVATE bool _dm_srv_skip_keys(_dm_srv_cur* k, uint64_t n, bool values) {
    uint64_t i;
    const unsigned char* d;
    size_t len;
    for (i = 0; i < n; i++) {
        if (!_DM_SRV_KEY(k, &d, &len)) return false;
        if (values && !_DM_SRV_VAL(k, &d, &len)) return false;
    }
    return true;
}

_DM_PRIVATE bool _dm_srv_all_present(_dm_srv* s, _dm_srv_cur* k, uint64_t n) {
    uint64_t i;
    bool all = true;
    for (i = 0; i < n; i++) {
        const unsigned char* d = NULL;
        size_t len = 0;
        _DM_SRV_KEY(k, &d, &len);
        if (!_dm_srv_find(s, d, len)) all = false;
    }
    return all;
}

/* The first request of a connection says which protocol it speaks: VALIDATE + magic (2.x), or
   anything else (torch < 2.2, which never validates). False: wait for more bytes. */
_DM_PRIVATE bool _dm_srv_detect_proto(_dm_srv_client* c) {
    if (c->in[0] == _DM_STQ_VALIDATE) {
        if (c->in_len < 5) { c->need = 5; return false; }
        if (_dm_st_get_u32(c->in + 1) == _DM_ST_MAGIC) return true;
        if (_dm_st_get_u32(c->in + 1) > DM_STORE_MAX_KEY) {   /* no 1.13 SET either: a bad magic */
            _dm_srv_protocol_error(c, "VALIDATE magic 0x%08X, expected 0x%08X", (unsigned)_dm_st_get_u32(c->in + 1),
                                   _DM_ST_MAGIC);
            return false;
        }
    }
    c->proto = _DM_ST_PROTO_1;
    c->validated = true;
    _DM_LOG(&c->srv->logger, DM_LOG_INFO, "tcp-store: %s speaks the torch < 2.2 protocol", c->peer);
    return true;
}

/* The reply to MULTI_GET is sized before it is built: above the per-connection limit the client
   is closed (a short request naming one big value many times would otherwise be amplified). */
_DM_PRIVATE bool _dm_srv_multi_get_fits(_dm_srv_client* c, _dm_srv_cur* k, size_t start, uint64_t n) {
    uint64_t i, total = 0;
    k->off = start;
    for (i = 0; i < n; i++) {
        const unsigned char* d = NULL;
        size_t len = 0;
        _dm_kv* e;
        _DM_SRV_KEY(k, &d, &len);
        e = _dm_srv_find(c->srv, d, len);
        total += 8 + (e ? e->val_len : 0);
        if (total > c->srv->lim.max_conn) {
            _dm_srv_drop(c, DM_ERR_PROTOCOL, "MULTI_GET of %llu keys: reply above the per-connection limit "
                         "of %zu bytes (DISTMESH_STORE_MAX_CONN)", (unsigned long long)n, c->srv->lim.max_conn);
            return false;
        }
    }
    return true;
}

/* Parses and executes one request at the start of the buffer. Returns bytes consumed, 0 when
   more bytes are needed (k.need set), or closes the client and returns 0 (c->closing). */
_DM_PRIVATE size_t _dm_srv_one(_dm_srv_client* c) {
    _dm_srv* s = c->srv;
    _dm_srv_cur k;
    unsigned op;
    const unsigned char *key = NULL, *v1 = NULL, *v2 = NULL;
    size_t kn = 0, n1 = 0, n2 = 0;
    uint64_t cnt = 0;
    bool over = false;
    _dm_stbuf out;
    memset(&k, 0, sizeof(k));
    memset(&out, 0, sizeof(out));
    out.a = &s->allocator;
    k.p = c->in;
    k.len = c->in_len;
    k.max_value = s->lim.max_value;
    op = k.p[k.off++];
    if (!c->validated && !_dm_srv_detect_proto(c)) return 0;
    if (c->proto == _DM_ST_PROTO_1)
        op = op < sizeof(_dm_st_v2_from_v1) ? _dm_st_v2_from_v1[op] : 255u;
    switch (op) {
    case _DM_STQ_VALIDATE: {
        uint32_t magic;
        if (!_dm_srv_rd_u32(&k, &magic)) break;
        if (magic != _DM_ST_MAGIC) {
            _dm_srv_protocol_error(c, "VALIDATE magic 0x%08X, expected 0x%08X", (unsigned)magic, _DM_ST_MAGIC);
            return 0;
        }
        c->validated = true;
        return k.off;
    }
    case _DM_STQ_PING: {
        uint32_t nonce;
        if (!_dm_srv_rd_u32(&k, &nonce)) break;
        if ((nonce & 0xFF000000u) == _DM_ST_NONCE_MARK) c->notices = true;
        _dm_stbuf_u32(&out, nonce);
        _dm_srv_send_stbuf(c, &out);
        return k.off;
    }
    case _DM_STQ_SET:
    case _DM_STQ_APPEND: {
        bool adopted = false;
        _dm_kv* e = NULL;
        if (!_DM_SRV_KEY(&k, &key, &kn) || !_DM_SRV_VAL(&k, &v1, &n1)) break;
        if (op == _DM_STQ_SET) e = _dm_srv_put_adopt(c, key, kn, v1, n1, k.off, &adopted, &over);
        if (!adopted) e = _dm_srv_put(s, key, kn, v1, n1, op == _DM_STQ_APPEND, &over);
        if (!e) goto oom;
        if (adopted) { key = e->key; kn = e->key_len; }   /* the request's bytes moved */
        _dm_srv_wake(s, key, kn);
        return k.off;
    }
    case _DM_STQ_COMPARE_SET: {
        _dm_kv* e;
        if (!_DM_SRV_KEY(&k, &key, &kn) || !_DM_SRV_VAL(&k, &v1, &n1) || !_DM_SRV_VAL(&k, &v2, &n2)) break;
        e = _dm_srv_find(s, key, kn);
        if (!e && n1 == 0) {
            if (!(e = _dm_srv_put(s, key, kn, v2, n2, false, &over))) goto oom;
        } else if (e && e->val_len == n1 && (n1 == 0 || memcmp(e->val, v1, n1) == 0)) {
            if (!(e = _dm_srv_put(s, key, kn, v2, n2, false, &over))) goto oom;
        }
        if (e) _dm_stbuf_str(&out, e->val, e->val_len);
        else _dm_stbuf_str(&out, v1, n1);   /* missing and not set: c10d answers `expected` */
        _dm_srv_send_stbuf(c, &out);
        if (e) _dm_srv_wake(s, key, kn);
        return k.off;
    }
    case _DM_STQ_GET: {
        _dm_kv* e;
        if (!_DM_SRV_KEY(&k, &key, &kn)) break;
        e = _dm_srv_find(s, key, kn);
        if (e && e->val_len >= _DM_ST_INPLACE_MIN) {
            _dm_srv_send_value(c, e);
            return k.off;
        }
        if (e) _dm_stbuf_str(&out, e->val, e->val_len);
        else _dm_stbuf_str(&out, NULL, 0);
        _dm_srv_send_stbuf(c, &out);
        return k.off;
    }
    case _DM_STQ_ADD: {
        uint64_t delta;
        int64_t cur = 0;
        char txt[32];
        _dm_kv* e;
        if (!_DM_SRV_KEY(&k, &key, &kn) || !_dm_srv_rd_u64(&k, &delta)) break;
        e = _dm_srv_find(s, key, kn);
        if (e && !_dm_st_parse_i64(e->val, e->val_len, &cur)) {
            _dm_srv_protocol_error(c, "ADD on a key whose value is not a decimal int64");
            return 0;
        }
        cur = (int64_t)((uint64_t)cur + delta); /* wraps like two's complement */
        snprintf(txt, sizeof(txt), "%lld", (long long)cur);
        if (!_dm_srv_put(s, key, kn, (const unsigned char*)txt, strlen(txt), false, &over)) goto oom;
        _dm_stbuf_u64(&out, (uint64_t)cur);
        _dm_srv_send_stbuf(c, &out);
        _dm_srv_wake(s, key, kn);
        return k.off;
    }
    case _DM_STQ_CHECK:
    case _DM_STQ_WAIT: {
        size_t start, i, missing = 0, bytes = 0;
        bool all;
        if (!_dm_srv_rd_count(&k, &cnt)) break;
        start = k.off;
        if (!_dm_srv_skip_keys(&k, cnt, false)) break;
        k.off = start;
        all = _dm_srv_all_present(s, &k, cnt);
        if (op == _DM_STQ_CHECK) {
            _dm_stbuf_u8(&out, all ? _DM_ST_READY : _DM_ST_NOT_READY);
            _dm_srv_send_stbuf(c, &out);
            return k.off;
        }
        if (all) {
            _dm_stbuf_u8(&out, _DM_ST_STOP_WAITING);
            _dm_srv_send_stbuf(c, &out);
            return k.off;
        }
        /* register the missing keys; one pending wait per client (a new one replaces it) */
        if (c->waiter) _dm_srv_waiter_drop(s, c->waiter);
        k.off = start;
        for (i = 0; i < cnt; i++) {
            _DM_SRV_KEY(&k, &key, &kn);
            if (!_dm_srv_find(s, key, kn)) { missing++; bytes += kn; }
        }
        {
            _dm_srv_waiter* w = (_dm_srv_waiter*)_dm_calloc(
                &s->allocator, sizeof(*w) + missing * sizeof(_dm_srv_wkey) + bytes);
            unsigned char* kp;
            size_t j = 0;
            if (!w) goto oom;
            w->keys = (_dm_srv_wkey*)(w + 1);
            kp = (unsigned char*)(w->keys + missing);
            k.off = start;
            for (i = 0; i < cnt; i++) {
                _DM_SRV_KEY(&k, &key, &kn);
                if (_dm_srv_find(s, key, kn)) continue;
                if (kn) memcpy(kp, key, kn);
                w->keys[j].key = kp;
                w->keys[j].len = kn;
                w->keys[j].hash = _dm_st_hash(key, kn);
                kp += kn;
                j++;
            }
            w->nkeys = w->remaining = missing;
            w->client = c;
            w->next = s->waiters;
            if (s->waiters) s->waiters->prev = w;
            s->waiters = w;
            c->waiter = w;
        }
        return k.off;
    }
    case _DM_STQ_GETNUMKEYS:
        _dm_stbuf_u64(&out, (uint64_t)s->nkeys);
        _dm_srv_send_stbuf(c, &out);
        return k.off;
    case _DM_STQ_DELETE_KEY:
        if (!_DM_SRV_KEY(&k, &key, &kn)) break;
        _dm_stbuf_u64(&out, _dm_srv_erase(s, key, kn) ? 1u : 0u);
        _dm_srv_send_stbuf(c, &out);
        return k.off;
    case _DM_STQ_MULTI_GET: {
        size_t start, i;
        if (!_dm_srv_rd_count(&k, &cnt)) break;
        start = k.off;
        if (!_dm_srv_skip_keys(&k, cnt, false)) break;
        if (!_dm_srv_multi_get_fits(c, &k, start, cnt)) return 0;
        k.off = start;
        for (i = 0; i < cnt; i++) {
            _dm_kv* e;
            _DM_SRV_KEY(&k, &key, &kn);
            e = _dm_srv_find(s, key, kn);
            if (e) _dm_stbuf_str(&out, e->val, e->val_len);
            else _dm_stbuf_str(&out, NULL, 0);
        }
        _dm_srv_send_stbuf(c, &out);
        return k.off;
    }
    case _DM_STQ_MULTI_SET: {
        size_t start, i;
        if (!_dm_srv_rd_count(&k, &cnt)) break;
        start = k.off;
        if (!_dm_srv_skip_keys(&k, cnt, true)) break;
        k.off = start;
        for (i = 0; i < cnt; i++) {
            _DM_SRV_KEY(&k, &key, &kn);
            _DM_SRV_VAL(&k, &v1, &n1);
            if (!_dm_srv_put(s, key, kn, v1, n1, false, &over)) goto oom;
            _dm_srv_wake(s, key, kn);
        }
        return k.off;
    }
    case _DM_STQ_CANCEL_WAIT:
        if (c->waiter) _dm_srv_waiter_drop(s, c->waiter);
        _dm_stbuf_u8(&out, _DM_ST_WAIT_CANCELED);
        _dm_srv_send_stbuf(c, &out);
        return k.off;
    default:
        _dm_srv_protocol_error(c, "unknown opcode %u", op);
        return 0;
    }
    /* incomplete or malformed */
    _dm_stbuf_free(&out);
    if (k.bad) {
        _dm_srv_protocol_error(c, "opcode %u: %s", op, k.bad);
        return 0;
    }
    c->need = k.need;
    return 0;
oom:
    _dm_stbuf_free(&out);
    if (over)
        _dm_srv_drop(c, DM_ERR_OUT_OF_MEMORY, "opcode %u: storing a key of %zu bytes and a value of %zu bytes would take "
                     "the store's keys and values over %zu bytes, 7/8 of its memory quota of %zu bytes "
                     "(DISTMESH_STORE_MAX_TOTAL); it holds %zu bytes of them", op, kn, op == _DM_STQ_COMPARE_SET ? n2 : n1,
                     s->lim.max_total - s->lim.max_total / _DM_ST_BUFFER_SHARE, s->lim.max_total, s->data);
    else
        _dm_srv_drop(c, DM_ERR_OUT_OF_MEMORY, "out of memory serving opcode %u", op);
    return 0;
}

/* >>store server input  The client's input buffer, and the read path that parses what arrived. */
/* The input buffer grows as bytes arrive (doubling from 4 KiB), never by what a request
   announces: a client that announces 64 MiB and sends 10 bytes costs 4 KiB. When the parser
   knows that the bytes it waits for end well beyond the buffer (need: a large value) and
   within twice the doubling, the buffer takes exactly that size instead of doubling past it:
   a 64 MiB value costs 64 MiB, not 128, and the copy that grows it holds at most 1.5x. (A
   request of many small fields moves need a little at a time: it just doubles.) Up to max_conn
   (_DM_ST_AUTH_BUF before authenticating). */
_DM_PRIVATE size_t _dm_srv_next_cap(const _dm_srv_client* c, size_t limit) {
    size_t cap = c->in_cap ? c->in_cap * 2 : 4096;
    if (c->need >= _DM_ST_INPLACE_MIN && c->need > c->in_cap && c->need - c->in_cap >= c->in_cap / 2 &&
        c->need / 2 <= cap)
        cap = c->need;
    return cap > limit ? limit : cap;
}
/* The buffer grown one step (up to limit), every byte charged to the quota: false when the
   quota refused (c->refused says how much) or memory ran out. */
_DM_PRIVATE bool _dm_srv_grow_input(_dm_srv_client* c, size_t limit) {
    size_t cap = _dm_srv_next_cap(c, limit);
    unsigned char* np;
    if (cap <= c->in_cap) return false;
    if (!_dm_srv_make_room(c, cap - c->in_cap)) {
        c->refused = cap - c->in_cap;
        return false;
    }
    np = (unsigned char*)_dm_malloc(&c->srv->allocator, cap);
    if (!np) {
        c->srv->held -= cap - c->in_cap;
        return false;
    }
    if (c->in_len) memcpy(np, c->in, c->in_len);
    _dm_free(&c->srv->allocator, c->in);
    c->in = np;
    c->charged += cap - c->in_cap;
    c->in_cap = cap;
    return true;
}
/* Every byte of the buffer is charged to the quota; a refusal is carried to the read callback
   (see _dm_srv_make_room). A sealed client's bytes go to its record buffer first
   (>>store seal): the buffer gets their plaintext. */
_DM_PRIVATE void _dm_srv_alloc(uv_handle_t* h, size_t suggested, uv_buf_t* buf) {
    _dm_srv_client* c = (_dm_srv_client*)h;
    size_t limit = c->auth ? _DM_ST_AUTH_BUF : c->srv->lim.max_conn;
    (void)suggested;
    buf->base = NULL;
    buf->len = 0;
    if (c->closing || c->flush_close) return;
#if defined(DISTMESH_OPENSSL)
    if (c->seal) {              /* never full: whole records leave it as they arrive */
        buf->base = (char*)(c->seal->rec + c->seal->fill);
        buf->len = c->seal->cap - c->seal->fill;
        return;
    }
#endif
    /* (not while the bytes the parser waits for fit: a large SET's buffer is its size, and its
       last bytes may leave a little free; doubling then let the next request in beside it, and
       the buffer could no longer become the value) */
    if (c->in_cap - c->in_len < 4096 && c->in_cap < limit && (c->need == 0 || c->need > c->in_cap))
        _dm_srv_grow_input(c, limit);
    if (c->in_cap == c->in_len) return;     /* full at the limit: read_cb gets UV_ENOBUFS */
    buf->base = (char*)(c->in + c->in_len);
    buf->len = c->in_cap - c->in_len;
}

/* The next request: the handshake while authenticating, then c10d requests. */
_DM_PRIVATE size_t _dm_srv_next(_dm_srv_client* c) {
    return c->auth ? _dm_srv_auth_step(c) : _dm_srv_one(c);
}

/* Parses and executes the buffered requests while the client reads its replies. */
_DM_PRIVATE void _dm_srv_process(_dm_srv_client* c) {
    size_t off = 0;
    c->need = 0;
    c->in_process = true;
    while (off < c->in_len && !c->closing && !c->flush_close && c->queued <= _DM_ST_HIGH_WATER) {
        size_t used;
        /* parse on a view that starts at off */
        unsigned char* base = c->in;
        size_t total = c->in_len;
        c->in = base + off;
        c->in_len = total - off;
        c->view_off = off;
        used = _dm_srv_next(c);
        if (c->adopted) {       /* the buffer became a value: it held that request only */
            c->adopted = false;
            off = 0;
            break;
        }
        c->in = base;
        c->in_len = total;
        if (!used) break;
        off += used;
    }
    c->in_process = false;
    if (c->closing) return;
    if (c->flush_close) { _dm_srv_release_input(c); return; }
    /* need was computed on the view that started at off, which now moves to 0 */
    if (off) {
        memmove(c->in, c->in + off, c->in_len - off);
        c->in_len -= off;
    }
    if (c->in_len == 0 && c->in_cap > 1024 * 1024) {   /* give a big buffer back when idle */
        _dm_free(&c->srv->allocator, c->in);
        c->srv->held -= c->charged;
        c->charged = 0;
        c->in = NULL;
        c->in_cap = 0;
    }
    _dm_srv_flow(c);
}

#if defined(DISTMESH_OPENSSL)
/* n plaintext bytes appended to the input buffer, grown as it would be by reads: false when
   the client was dropped (beyond max_conn, the quota, out of memory). */
_DM_PRIVATE bool _dm_srv_take_plain(_dm_srv_client* c, const unsigned char* p, size_t n) {
    while (c->in_cap - c->in_len < n) {
        if (c->in_cap < c->srv->lim.max_conn && _dm_srv_grow_input(c, c->srv->lim.max_conn)) continue;
        if (c->refused) _dm_srv_refuse_quota(c, c->refused);
        else _dm_srv_drop(c, DM_ERR_PROTOCOL, "request larger than %zu bytes (DISTMESH_STORE_MAX_CONN), or out "
                          "of memory", c->srv->lim.max_conn);
        return false;
    }
    memcpy(c->in + c->in_len, p, n);
    c->in_len += n;
    return true;
}
/* The record buffer grown to the largest record, for the one that starts it (charged): false
   when the client was dropped. */
_DM_PRIVATE bool _dm_srv_seal_grow(_dm_srv_client* c) {
    _dm_st_seal* z = c->seal;
    unsigned char* np;
    size_t more = _DM_AEAD_MAX - z->cap;
    if (!_dm_srv_make_room(c, more)) { _dm_srv_refuse_quota(c, more); return false; }
    np = (unsigned char*)_dm_malloc(&c->srv->allocator, _DM_AEAD_MAX);
    if (!np) {
        c->srv->held -= more;
        _dm_srv_drop(c, DM_ERR_OUT_OF_MEMORY, "out of memory for a sealed record of up to %zu bytes", _DM_AEAD_MAX);
        return false;
    }
    memcpy(np, z->rec, z->fill);
    memset(z->rec, 0, z->cap);
    _dm_free(&c->srv->allocator, z->rec);
    z->rec = np;
    z->cap = _DM_AEAD_MAX;
    return true;
}
/* Opens every whole record in the record buffer into the input buffer (>>store seal): false
   when the client was dropped (a record that fails: nothing of it is parsed). */
_DM_PRIVATE bool _dm_srv_unseal(_dm_srv_client* c) {
    _dm_st_seal* z = c->seal;
    size_t at = 0;
    while (z->fill - at >= _DM_AEAD_HEAD) {
        size_t n = _dm_rec_len(z->rec + at);
        if (n == 0) {
            _dm_srv_drop(c, DM_ERR_PROTOCOL, "a sealed record with a bad length (tampered with on the way?)");
            return false;
        }
        if (z->fill - at < _DM_AEAD_HEAD + n + _DM_AEAD_TAG) {
            if (at == 0 && z->cap < _DM_AEAD_HEAD + n + _DM_AEAD_TAG && !_dm_srv_seal_grow(c)) return false;
            break;              /* (at > 0: the record moves to the front first, then fits or grows) */
        }
        if (!_dm_rec_open(&z->rx, z->rec + at, n)) {
            _dm_srv_drop(c, DM_ERR_PROTOCOL, "a sealed record failed its authentication (tampered with, replayed, "
                         "reordered or dropped on the way, or another key)");
            return false;
        }
        if (!_dm_srv_take_plain(c, z->rec + at + _DM_AEAD_HEAD, n)) return false;
        at += _DM_AEAD_HEAD + n + _DM_AEAD_TAG;
    }
    if (at) {
        memmove(z->rec, z->rec + at, z->fill - at);
        z->fill -= at;
    }
    return true;
}
#endif

_DM_PRIVATE void _dm_srv_on_read(uv_stream_t* st, ssize_t nread, const uv_buf_t* buf) {
    _dm_srv_client* c = (_dm_srv_client*)st;
    (void)buf;
    if (c->closing || c->flush_close) return;
    if (nread == UV_ENOBUFS) {
        if (c->refused) _dm_srv_refuse_quota(c, c->refused);
        else if (c->auth) _dm_srv_refuse(c, 1, "sent more than a handshake before authenticating");
        else _dm_srv_drop(c, DM_ERR_PROTOCOL, "request larger than %zu bytes (DISTMESH_STORE_MAX_CONN), "
                          "or out of memory", c->srv->lim.max_conn);
        return;
    }
    if (nread < 0) {        /* EOF or reset: the client left; its pending wait goes with it */
        _dm_srv_close_client(c);
        return;
    }
#if defined(DISTMESH_OPENSSL)
    if (c->seal) {
        c->seal->fill += (size_t)nread;
        if (!_dm_srv_unseal(c)) return;
    } else
#endif
    c->in_len += (size_t)nread;
    if (c->in_len < c->need) return;
    _dm_srv_process(c);
}

/* >>store server descriptors  Every client holds a descriptor of the process that hosts the
   store, so the store host is where a job meets the limit on open files first (a job of W ranks
   that each connect holds W there). So the host raises its soft limit to the hard one before it
   serves (logged at debug level); and a client it cannot take for lack of descriptors is told
   why instead of being dropped. libuv's accept would drop it silently: on EMFILE it gives up a
   descriptor it keeps in reserve, accepts and closes every waiting connection, and does not
   call the server (libuv 1.44, src/unix/stream.c, uv__emfile_trick), so the client saw a reset
   and retried until its deadline. The server accepts by hand instead (>>store server accept)
   and keeps its own reserve: on EMFILE or ENFILE it closes the reserve, accepts the client,
   writes it a notice (>>store wire; read by a distmesh client during connect, which fails at
   once with the text) that names the cause, the connections held and the limit, closes it and
   takes the reserve back. The same text is stored under _DM_ST_REFUSED_KEY, so clients already
   connected and waiting for the refused ones can find why they are missing
   (_dm_store_refusal; the TCP backend asks after each slice of its wait for the world). */
/* Why a client cannot be taken: err EMFILE or ENFILE, the connections held, the limits. */
_DM_PRIVATE void _dm_srv_nofd_text(const _dm_srv* s, int err, char* out, size_t cap) {
    struct rlimit rl;
    unsigned long long soft = 0, hard = 0;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        soft = (unsigned long long)rl.rlim_cur;
        hard = (unsigned long long)rl.rlim_max;
    }
    if (err == ENFILE)
        snprintf(out, cap, "the store host's system is out of file descriptors (ENFILE: file table overflow; "
                 "fs.file-max) while its store holds %u client connections", s->nclients);
    else
        snprintf(out, cap, "the store host is out of file descriptors (EMFILE: too many open files): its store holds "
                 "%u client connections and the process's limit is %llu open files (RLIMIT_NOFILE, hard limit "
                 "%llu): raise it where the store is hosted (ulimit -n)", s->nclients, soft, hard);
}
/* The refusal stored under _DM_ST_REFUSED_KEY (waking whoever waits for it). */
_DM_PRIVATE void _dm_srv_note_refusal(_dm_srv* s, const char* text) {
    static const char key[] = _DM_ST_REFUSED_KEY;
    bool over = false;
    if (_dm_srv_put(s, (const unsigned char*)key, sizeof(key) - 1, (const unsigned char*)text, strlen(text), false,
                    &over))
        _dm_srv_wake(s, (const unsigned char*)key, sizeof(key) - 1);
}
/* Accepts a waiting client with the reserve's descriptor and writes it the notice (it is
   fresh: its socket buffer takes the few bytes at once), closes it, takes the reserve back.
   False when nothing could be told (no reserve, or another thread took the descriptor): the
   listener then rests until the next tick rather than spin on a connection it cannot take. */
_DM_PRIVATE bool _dm_srv_refuse_nofd(_dm_srv* s, int err) {
    char text[_DM_ST_NOTICE_TEXT], msg[_DM_ST_NOTICE_TEXT + 80];
    unsigned char note[_DM_ST_NOTICE_HEAD + _DM_ST_NOTICE_TEXT];
    size_t n;
    int fd;
    int64_t now = _dm_now_ms();
    if (s->reserve < 0) s->reserve = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (s->reserve < 0) return false;
    close(s->reserve);
    s->reserve = -1;
    fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    _dm_srv_nofd_text(s, err, text, sizeof(text));
    if (fd >= 0) {
        ssize_t w;
        n = strlen(text);
        memcpy(note, _dm_st_notice_magic, 8);
        note[8] = (unsigned char)(uint32_t)DM_ERR_NETWORK; note[9] = (unsigned char)((uint32_t)DM_ERR_NETWORK >> 8);
        note[10] = (unsigned char)((uint32_t)DM_ERR_NETWORK >> 16);
        note[11] = (unsigned char)((uint32_t)DM_ERR_NETWORK >> 24);
        note[12] = (unsigned char)n; note[13] = (unsigned char)(n >> 8);
        memcpy(note + _DM_ST_NOTICE_HEAD, text, n);
        w = send(fd, note, _DM_ST_NOTICE_HEAD + n, MSG_DONTWAIT | MSG_NOSIGNAL);
        (void)w;                /* best effort: the client sees the close either way */
        close(fd);
        __atomic_add_fetch(&s->refused, 1, __ATOMIC_RELAXED);
        __atomic_store_n(&s->last_client_ms, now, __ATOMIC_RELAXED);
    }
    s->reserve = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    if (s->refused == 1 || now - s->refused_logged >= 1000) {
        _DM_REPORT(&s->logger, msg, sizeof(msg), DM_ERR_NETWORK, "tcp-store: server refused a client (%lu so far): %s",
                   s->refused, text);
        s->refused_logged = now;
    }
    _dm_srv_note_refusal(s, text);
    return true;
}

/* >>store server accept  The listening socket is watched by a uv_poll_t and accepted here (see
   >>store server descriptors for why not by libuv); each client becomes a uv_tcp_t. */
_DM_PRIVATE void _dm_srv_admit(_dm_srv* s, int fd) {
    _dm_srv_client* c;
    struct sockaddr_storage ss;
    int sl = (int)sizeof(ss);
    c = (_dm_srv_client*)_dm_calloc(&s->allocator, sizeof(*c));
    if (!c) {   /* the client sees the close */
        char msg[200];
        close(fd);
        _DM_REPORT(&s->logger, msg, sizeof(msg), DM_ERR_OUT_OF_MEMORY, "tcp-store: server accept (out of memory)");
        return;
    }
    c->srv = s;
    if (uv_tcp_init(&s->loop, &c->tcp) < 0) { close(fd); _dm_free(&s->allocator, c); return; }
    c->next = s->clients;
    if (s->clients) s->clients->prev = c;
    s->clients = c;
    __atomic_add_fetch(&s->nclients, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&s->last_client_ms, _dm_now_ms(), __ATOMIC_RELAXED);
    snprintf(c->peer, sizeof(c->peer), "?");
    if (uv_tcp_open(&c->tcp, (uv_os_sock_t)fd) < 0) { close(fd); _dm_srv_close_client(c); return; }
    uv_tcp_nodelay(&c->tcp, 1);
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr*)&ss, &sl) == 0) {
        char ip[INET6_ADDRSTRLEN] = "?";
        int port = 0;
        if (ss.ss_family == AF_INET6) {
            uv_ip6_name((const struct sockaddr_in6*)&ss, ip, sizeof(ip));
            port = ntohs(((const struct sockaddr_in6*)&ss)->sin6_port);
        } else {
            uv_ip4_name((const struct sockaddr_in*)&ss, ip, sizeof(ip));
            port = ntohs(((const struct sockaddr_in*)&ss)->sin_port);
        }
        snprintf(c->peer, sizeof(c->peer), "%s:%d", ip, port);
    }
    c->since = _dm_now_ms();
    c->auth = s->lim.token_len ? 1 : 0;
    if (uv_read_start((uv_stream_t*)&c->tcp, _dm_srv_alloc, _dm_srv_on_read) < 0) _dm_srv_close_client(c);
    else c->reading = true;
}
/* Takes every waiting client (at most 256 a wake, so the loop serves the others meanwhile). */
_DM_PRIVATE void _dm_srv_on_listen(uv_poll_t* p, int status, int events) {
    _dm_srv* s = (_dm_srv*)p->data;
    int i;
    (void)status; (void)events;
    for (i = 0; i < 256; i++) {
        int fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC), e = errno;
        if (fd >= 0) { _dm_srv_admit(s, fd); continue; }
        if (e == EINTR || e == ECONNABORTED) continue;
        if (e == EAGAIN || e == EWOULDBLOCK) return;
        if ((e == EMFILE || e == ENFILE) && _dm_srv_refuse_nofd(s, e)) continue;
        if (e != EMFILE && e != ENFILE) {
            char cause[200], msg[300];
            _DM_REPORT(&s->logger, msg, sizeof(msg), _dm_st_status(-e), "tcp-store: server accept failed (%s)",
                       _dm_st_cause(-e, cause, sizeof(cause)));
        }
        uv_poll_stop(&s->listener);         /* rest until the next tick */
        s->accept_paused = true;
        return;
    }
}

/* >>store server lifecycle  The tick, stopping, freeing and starting. */
/* Every half second: clients that did not authenticate in time, or whose replies have not
   moved for stall_ms while the server stopped reading from them, are closed; a listener that
   rested (>>store server accept) listens again. */
_DM_PRIVATE void _dm_srv_on_tick(uv_timer_t* tm) {
    _dm_srv* s = (_dm_srv*)tm->data;
    _dm_srv_client* c = s->clients;
    int64_t now = _dm_now_ms();
    while (c) {
        _dm_srv_client* nx = c->next;
        if (!c->closing && c->flush_close && now - c->since > _DM_ST_NOTICE_MS)
            _dm_srv_close_client(c);    /* its last words did not go out */
        else if (!c->closing && c->auth && now - c->since > _DM_ST_AUTH_MS)
            _dm_srv_drop(c, DM_ERR_TIMEOUT, "did not authenticate within %d ms", _DM_ST_AUTH_MS);
        else if (!c->closing && !c->reading && c->queued && now - c->since > s->lim.stall_ms)
            _dm_srv_drop(c, DM_ERR_TIMEOUT, "does not read its replies: %zu bytes unread for %d ms "
                         "(DISTMESH_STORE_STALL_MS)", c->queued, s->lim.stall_ms);
        c = nx;
    }
    if (s->accept_paused && s->listener_open && uv_poll_start(&s->listener, UV_READABLE, _dm_srv_on_listen) == 0)
        s->accept_paused = false;
}

/* The listening socket is closed once its poll handle is (never under an active poll). */
_DM_PRIVATE void _dm_srv_on_listener_closed(uv_handle_t* h) {
    _dm_srv* s = (_dm_srv*)h->data;
    if (s->lfd >= 0) close(s->lfd);
    s->lfd = -1;
}
_DM_PRIVATE void _dm_srv_on_stop(uv_async_t* a) {
    _dm_srv* s = (_dm_srv*)a->data;
    _dm_srv_client* c = s->clients;
    while (c) {
        _dm_srv_client* nx = c->next;
        _dm_srv_close_client(c);
        c = nx;
    }
    if (s->listener_open) uv_close((uv_handle_t*)&s->listener, _dm_srv_on_listener_closed);
    s->listener_open = false;
    if (s->tick_open) uv_close((uv_handle_t*)&s->tick, NULL);
    s->tick_open = false;
    uv_close((uv_handle_t*)&s->stop, NULL);
    s->stop_open = false;
}
_DM_PRIVATE void* _dm_srv_thread(void* arg) {
    _dm_srv* s = (_dm_srv*)arg;
    uv_run(&s->loop, UV_RUN_DEFAULT);   /* returns once on_stop has closed every handle */
    return NULL;
}
/* Frees everything; the loop must have no open handle (thread joined, or never started). */
_DM_PRIVATE void _dm_srv_free(_dm_srv* s) {
    size_t i;
    if (!s) return;
    if (s->listener_open) uv_close((uv_handle_t*)&s->listener, _dm_srv_on_listener_closed);
    if (s->stop_open) uv_close((uv_handle_t*)&s->stop, NULL);
    if (s->tick_open) uv_close((uv_handle_t*)&s->tick, NULL);
    {
        _dm_srv_client* c = s->clients;
        for (; c; c = c->next) _dm_srv_close_client(c);
    }
    uv_run(&s->loop, UV_RUN_DEFAULT);   /* runs the close callbacks */
    uv_loop_close(&s->loop);
    if (s->lfd >= 0) close(s->lfd);
    if (s->reserve >= 0) close(s->reserve);
    while (s->waiters) _dm_srv_waiter_drop(s, s->waiters);
    for (i = 0; i < s->nbuckets; i++) {
        _dm_kv* e = s->buckets[i];
        while (e) { _dm_kv* nx = e->next; _dm_srv_kv_free(s, e); e = nx; }
    }
    _dm_free(&s->allocator, s->buckets);
    _dm_free(&s->allocator, s);
}
_DM_PRIVATE void _dm_srv_stop(_dm_srv* s) {
    if (!s) return;
    if (s->thread_started && __atomic_load_n(&s->refused, __ATOMIC_RELAXED) > 0) {
        /* It refused clients for lack of descriptors, so its host's create is failing: the
           clients still connected are likely waiting for the refused ones and read why at their
           next look (_DM_ST_REFUSED_KEY), and ranks that start late are still connecting (told
           with a notice, or, once descriptors are free, served and shown the key). Serve them
           until none is connected and none came for a second, _DM_ST_REFUSED_LINGER_MS at
           most, rather than leave them to retry a vanished server until their deadlines. */
        int64_t end = _dm_now_ms() + _DM_ST_REFUSED_LINGER_MS;
        const struct timespec ts = { 0, 10 * 1000000L };
        while (_dm_now_ms() < end && (__atomic_load_n(&s->nclients, __ATOMIC_RELAXED) > 0 ||
                                      _dm_now_ms() - __atomic_load_n(&s->last_client_ms, __ATOMIC_RELAXED) < 1000))
            nanosleep(&ts, NULL);
    }
    if (s->thread_started) {
        uv_async_send(&s->stop);
        pthread_join(s->thread, NULL);
        s->thread_started = false;
    }
    _dm_srv_free(s);
}

/* A listening socket on sa: 0 and *fd, or a negative errno (the socket closed). */
_DM_PRIVATE int _dm_srv_listen_on(const struct sockaddr* sa, socklen_t len, bool v6only, int* fd) {
    int one = 1, off = 0, rc;
    *fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (*fd < 0) return _dm_st_errno(errno);
    setsockopt(*fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));     /* as libuv binds */
    if (sa->sa_family == AF_INET6) setsockopt(*fd, IPPROTO_IPV6, IPV6_V6ONLY, v6only ? &one : &off, sizeof(one));
    if (bind(*fd, sa, len) == 0 && listen(*fd, 1024) == 0) return 0;
    rc = _dm_st_errno(errno);
    close(*fd);
    *fd = -1;
    return rc;
}
/* Binds host:port (numeric loopback host: exactly it; else dual-stack ::, else 0.0.0.0),
   listens, starts the thread. err gets "what (cause)" on failure. */
_DM_PRIVATE dm_status _dm_srv_start(const char* host, int port, const dm_logger* lg, const dm_allocator* a,
                                    const _dm_store_limits* lim, _dm_srv** out, char* err, size_t cap) {
    _dm_srv* s;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    int rc;
    char cause[200];
    bool loop_open = false;
    const char* bound = host;
    *out = NULL;
    _dm_st_raise_nofile(lg, "tcp-store", "the store holds a descriptor per client");
    s = (_dm_srv*)_dm_calloc(a, sizeof(*s));
    if (!s) { snprintf(err, cap, "out of memory"); return DM_ERR_OUT_OF_MEMORY; }
    s->allocator = *a;
    s->logger = *lg;
    s->lim = *lim;
    s->lfd = -1;
    s->reserve = open("/dev/null", O_RDONLY | O_CLOEXEC);
    s->nbuckets = 64;
    s->buckets = (_dm_kv**)_dm_calloc(a, s->nbuckets * sizeof(_dm_kv*));
    if (!s->buckets) { rc = UV_ENOMEM; goto fail_what; }
    if ((rc = uv_loop_init(&s->loop)) < 0) goto fail_what;
    loop_open = true;
    if ((rc = uv_async_init(&s->loop, &s->stop, _dm_srv_on_stop)) < 0) goto fail_what;
    s->stop_open = true;
    s->stop.data = s;
    if ((rc = uv_timer_init(&s->loop, &s->tick)) < 0) goto fail_what;
    s->tick_open = true;
    s->tick.data = s;
    if ((rc = uv_timer_start(&s->tick, _dm_srv_on_tick, 500, 500)) < 0) goto fail_what;
    {
        struct sockaddr_in6 a6;
        struct sockaddr_in a4;
        bool loop6 = strcmp(host, "::1") == 0;
        bool loop4 = (strncmp(host, "127.", 4) == 0 && uv_ip4_addr(host, port, &a4) == 0) ||
                     (strcmp(host, "localhost") == 0 && uv_ip4_addr("127.0.0.1", port, &a4) == 0);
        if (loop4) {
            rc = _dm_srv_listen_on((const struct sockaddr*)&a4, sizeof(a4), false, &s->lfd);
        } else if (loop6) {
            uv_ip6_addr("::1", port, &a6);
            rc = _dm_srv_listen_on((const struct sockaddr*)&a6, sizeof(a6), true, &s->lfd);
        } else {
            bound = "::";
            uv_ip6_addr("::", port, &a6);
            rc = _dm_srv_listen_on((const struct sockaddr*)&a6, sizeof(a6), false, &s->lfd);
            if (rc < 0 && rc != UV_EADDRINUSE) {   /* no IPv6 here: IPv4 on every interface */
                bound = "0.0.0.0";
                uv_ip4_addr("0.0.0.0", port, &a4);
                rc = _dm_srv_listen_on((const struct sockaddr*)&a4, sizeof(a4), false, &s->lfd);
            }
        }
        if (rc < 0) {
            snprintf(err, cap, "cannot listen on %.64s port %d (%.100s)%s", bound, port,
                     _dm_st_cause(rc, cause, sizeof(cause)),
                     rc == UV_EADDRINUSE ? ": another process serves this port (another job, or torchrun's "
                                           "agent: then set TORCHELASTIC_USE_AGENT_STORE=True); choose another "
                                           "MASTER_PORT / store url" : "");
            _dm_srv_free(s);
            return _dm_st_status(rc);
        }
    }
    if (getsockname(s->lfd, (struct sockaddr*)&ss, &sl) != 0) { rc = _dm_st_errno(errno); goto fail_what; }
    s->port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6*)&ss)->sin6_port)
                                       : ntohs(((struct sockaddr_in*)&ss)->sin_port);
    if ((rc = uv_poll_init_socket(&s->loop, &s->listener, (uv_os_sock_t)s->lfd)) < 0) goto fail_what;
    s->listener_open = true;
    s->listener.data = s;
    if ((rc = uv_poll_start(&s->listener, UV_READABLE, _dm_srv_on_listen)) < 0) goto fail_what;
    if (pthread_create(&s->thread, NULL, _dm_srv_thread, s) != 0) { rc = UV_EAGAIN; goto fail_what; }
    s->thread_started = true;
    *out = s;
    return DM_OK;
fail_what:
    snprintf(err, cap, "cannot start the server (%.100s)", _dm_st_cause(rc, cause, sizeof(cause)));
    if (loop_open) _dm_srv_free(s);
    else {
        if (s->reserve >= 0) close(s->reserve);
        _dm_free(a, s->buckets);
        _dm_free(a, s);
    }
    return _dm_st_status(rc);
}
/* The port the server listens on (the one it chose, for port 0). */
_DM_PRIVATE int _dm_srv_port(const _dm_srv* s) { return s->port; }

#else /* !DISTMESH_TCP */
/* >>store no server  Without libuv there is no server: a store that would host one fails with
   DM_ERR_UNSUPPORTED, saying what to do instead (see BUILDS at the top). */
typedef struct _dm_srv _dm_srv;     /* never made here */
_DM_PRIVATE dm_status _dm_srv_start(const char* host, int port, const dm_logger* lg, const dm_allocator* a,
                                    const _dm_store_limits* lim, _dm_srv** out, char* err, size_t cap) {
    (void)host; (void)port; (void)lg; (void)a; (void)lim;
    *out = NULL;
    snprintf(err, cap, "this build cannot host a store: the server needs libuv, built in with DISTMESH_TCP "
                       "(connect to a store hosted elsewhere -- another process's, torch's TCPStore or "
                       "torchrun's agent store -- or use file:///dir)");
    return DM_ERR_UNSUPPORTED;
}
_DM_PRIVATE void _dm_srv_stop(_dm_srv* s) { (void)s; }
_DM_PRIVATE int _dm_srv_port(const _dm_srv* s) { (void)s; return 0; }
#endif /* DISTMESH_TCP */

/* ============================================================================================ */
/* >>store object  A dm_store is a handle (prefix, timeout, logger, allocator, last error) on a
   shared part that its clones share, reference counted: the lock held for each whole request,
   the kind's operations table and the kind's own state (the tcp client's connection and the
   server it may host, the file store's directory). */

typedef struct _dm_store_shared _dm_store_shared;
typedef struct _dm_store_ops _dm_store_ops;

struct _dm_store_shared {
    pthread_mutex_t mu;         /* held for each whole request; guards refs */
    int refs;
    const _dm_store_ops* ops;   /* the kind; NULL until create has found it */
    void* impl;                 /* the kind's state, made by ops->open, freed by ops->close */
    bool broken;                /* a request failed midway: every later call fails at once (also
                                   read by the TCP backend: a wait that timed out on a broken
                                   store is the store's failure, not the peers') */
    char broken_why[160];
    char where[280];            /* what the connection goes to ("host:port"), for that message */
    bool lazy;                  /* connect at the first request, not at open (ops->ensure) */
    dm_allocator allocator;
    _dm_store_shared* hosted_next;   /* in _dm_store_hosted while registered there */
};

struct dm_store {
    _dm_store_shared* sh;
    char* prefix;
    size_t prefix_len;
    int timeout_ms;             /* resolved: > 0 or < 0 (forever) */
    bool one_try;               /* a (re)connect tries once: no waiting for a server that is not
                                   there (the TCP backend's abort notices: the store may have died) */
    dm_logger logger;
    dm_allocator allocator;
    char last_error[DM_LAST_ERROR_SIZE];
};

#define _DM_STORE_FAIL(s, st, ...) \
    _DM_REPORT(&(s)->logger, (s)->last_error, sizeof((s)->last_error), (st), __VA_ARGS__)

/* A key as the slots get it: checked, prefixed, and the caller's spelling for messages. */
typedef struct _dm_store_key {
    unsigned char* bytes;       /* prefix + key, NUL-terminated (the file store's names) */
    size_t len;                 /* without the NUL */
    const char* name;           /* the caller's key, without the prefix */
} _dm_store_key;

/* The operations of one store kind. The public functions (>>store public) call a slot with the
   store's lock held, its last error cleared, its connection not broken, the arguments checked
   and every key made (_dm_store_key); the slot does the kind's part and reports a failure with
   _DM_STORE_FAIL. Only the slots marked optional may be NULL. */
struct _dm_store_ops {
    const char* name;           /* "tcp", "file": for messages */
    /* Makes s->sh->impl for url (the whole url, scheme included) from the resolved desc, bounds
       and token; share_hosted: see _dm_store_create_ex. It may instead hand s a shared part this
       process already has (>>store kinds: _dm_store_hosted). A failure may leave impl for close. */
    dm_status (*open)(dm_store* s, const char* url, const dm_store_desc* d, const _dm_store_limits* lim,
                      bool share_hosted);
    /* The last reference went: frees sh->impl (NULL when open failed before making it). */
    void (*close)(_dm_store_shared* sh);
    dm_status (*set)(dm_store* s, const _dm_store_key* k, const void* value, size_t size);
    dm_status (*append)(dm_store* s, const _dm_store_key* k, const void* value, size_t size);
    /* Reads a key that wait has just found; *out (even for an empty value) is the caller's. */
    dm_status (*get)(dm_store* s, const _dm_store_key* k, void** out, size_t* out_size);
    dm_status (*add)(dm_store* s, const _dm_store_key* k, int64_t delta, int64_t* out);
    /* *out (the value now held, see dm_store_compare_set) is the caller's whatever the status. */
    dm_status (*compare_set)(dm_store* s, const _dm_store_key* k, const void* expected, size_t expected_size,
                             const void* desired, size_t desired_size, void** out, size_t* out_size);
    /* Until every key exists; timeout_ms > 0, or < 0 for ever. */
    dm_status (*wait)(dm_store* s, const _dm_store_key* k, size_t n, int timeout_ms);
    dm_status (*check)(dm_store* s, const _dm_store_key* k, size_t n, bool* out_all_present);
    dm_status (*delete_key)(dm_store* s, const _dm_store_key* k, bool* out_deleted);
    dm_status (*num_keys)(dm_store* s, int64_t* out);
    /* optional: else set, key by key */
    dm_status (*multi_set)(dm_store* s, const _dm_store_key* k, const void* const* values, const size_t* sizes,
                           size_t n);
    /* optional: else get, key by key (after one wait for them all); on failure the caller frees
       what was read */
    dm_status (*multi_get)(dm_store* s, const _dm_store_key* k, size_t n, void** out_values, size_t* out_sizes);
    int (*port)(const _dm_store_shared* sh);    /* optional: dm_store_port, else 0 */
    /* optional: called before every request of a store opened lazily (sh->lazy): connects when
       the kind has no connection yet. A failure fails that request only (the next one tries
       again), unlike a failure midway through one (_dm_store_break). */
    dm_status (*ensure)(dm_store* s);
};

/* Shared parts a kind registered so that a later create in this process shares them instead of
   opening its own: the tcp kind's hosted servers (a second is_server store on a port this
   process already serves shares that server and its connection, as a clone would, so a second
   world on the same store url works). The last release unlinks them under the same lock. */
static pthread_mutex_t _dm_store_hosted_mu = PTHREAD_MUTEX_INITIALIZER;
static _dm_store_shared* _dm_store_hosted;

_DM_PRIVATE void _dm_store_shared_release(_dm_store_shared* sh) {
    bool last;
    dm_allocator a;
    pthread_mutex_lock(&_dm_store_hosted_mu);
    pthread_mutex_lock(&sh->mu);
    last = --sh->refs == 0;
    pthread_mutex_unlock(&sh->mu);
    if (last) {
        _dm_store_shared** pp = &_dm_store_hosted;
        while (*pp && *pp != sh) pp = &(*pp)->hosted_next;
        if (*pp) *pp = sh->hosted_next;
    }
    pthread_mutex_unlock(&_dm_store_hosted_mu);
    if (!last) return;
    a = sh->allocator;
    if (sh->ops && sh->ops->close) sh->ops->close(sh);
    pthread_mutex_destroy(&sh->mu);
    _dm_free(&a, sh);
}
_DM_PRIVATE void _dm_store_free_obj(dm_store* s) {
    dm_allocator a = s->allocator;
    _dm_free(&a, s->prefix);
    _dm_free(&a, s);
}
/* Registers sh in _dm_store_hosted (see there). */
_DM_PRIVATE void _dm_store_register_hosted(_dm_store_shared* sh) {
    pthread_mutex_lock(&_dm_store_hosted_mu);
    sh->hosted_next = _dm_store_hosted;
    _dm_store_hosted = sh;
    pthread_mutex_unlock(&_dm_store_hosted_mu);
}
/* The shared part, held by a connection that can no longer be trusted (a failure midway through
   a request): every later call fails at once, saying why (>>store public). */
_DM_PRIVATE _DM_PRINTF(2, 3) void _dm_store_break(_dm_store_shared* sh, const char* fmt, ...) {
    va_list ap;
    sh->broken = true;
    va_start(ap, fmt);
    vsnprintf(sh->broken_why, sizeof(sh->broken_why), fmt, ap);
    va_end(ap);
}

/* "a", "b", "c" for messages (truncated). */
_DM_PRIVATE const char* _dm_store_keylist(dm_store* s, const _dm_store_key* k, size_t n, char* buf, size_t cap) {
    size_t i, used = 0;
    buf[0] = 0;
    for (i = 0; i < n && used + 8 < cap; i++) {
        int w = snprintf(buf + used, cap - used, "%s\"%.*s%s\"", i ? ", " : "",
                         (int)(s->prefix_len > 64 ? 64 : s->prefix_len), s->prefix ? s->prefix : "", k[i].name);
        if (w < 0) break;
        used += (size_t)w;
        if (used >= cap) { used = cap - 1; break; }
    }
    if (i < n && cap > 5) snprintf(buf + (used > cap - 5 ? cap - 5 : used), 5, "...");
    return buf;
}
_DM_PRIVATE void _dm_store_sleep_ms(int ms) {
    struct timespec ts;
    ts.tv_sec = ms / 1000;
    ts.tv_nsec = (long)(ms % 1000) * 1000000L;
    nanosleep(&ts, NULL);
}
/* The message of a url no kind takes (>>store kinds). */
_DM_PRIVATE dm_status _dm_store_bad_url(dm_store* s, const char* url);
/* ============================================================================================ */
/* >>store tcp client  The tcp kind: a blocking socket with poll() deadlines, one request at a
   time (under the handle's lock), to a c10d server -- this store's own (hosted by this process
   or another), torch's TCPStore (2.x, or < 2.2 with its old opcodes), torchrun's agent store.
   A failed system call is a code of >>store codes. */

typedef struct _dm_stcli {
    int fd;                     /* the connection, -1 once broken */
    int proto;                  /* _DM_ST_PROTO_2, or _DM_ST_PROTO_1 against a torch < 2.2 server */
    _dm_srv* server;            /* the server this process hosts for it, or NULL */
    int port;                   /* connected to (the server's own with port 0) */
    char host[256];
    size_t token_len;           /* authenticate with this token when > 0 */
    char token[_DM_ST_TOKEN_MAX + 1];
    bool encrypt;               /* sealed records after the handshake (>>store seal) */
    struct _dm_st_seal* seal;   /* the connection's records once admitted with encryption */
    const dm_allocator* a;      /* the store's (seal) */
    int32_t refusal_st;         /* a notice the server gave instead of a connection (_DM_ST_NOTICED) */
    char refusal[_DM_ST_NOTICE_TEXT + 1];
} _dm_stcli;
_DM_PRIVATE _dm_stcli* _dm_stcli_of(const dm_store* s) { return (_dm_stcli*)s->sh->impl; }

_DM_PRIVATE int _dm_stcli_poll_ms(int64_t deadline) {
    int64_t left;
    if (deadline == INT64_MAX) return 1000;
    left = deadline - _dm_now_ms();
    if (left <= 0) return 0;
    return left > 1000 ? 1000 : (int)left;
}
/* 0, or a code (-ETIMEDOUT at the deadline). */
_DM_PRIVATE int _dm_stcli_send_all(int fd, const unsigned char* p, size_t n, int64_t deadline) {
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w > 0) { p += w; n -= (size_t)w; continue; }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd pf;
            int ms = _dm_stcli_poll_ms(deadline), r;
            if (ms == 0) return -ETIMEDOUT;
            pf.fd = fd; pf.events = POLLOUT; pf.revents = 0;
            r = poll(&pf, 1, ms);
            if (r < 0 && errno != EINTR) return _dm_st_errno(errno);
            continue;
        }
        return _dm_st_errno(errno);
    }
    return 0;
}
_DM_PRIVATE int _dm_stcli_recv_all(int fd, unsigned char* p, size_t n, int64_t deadline) {
    while (n) {
        struct pollfd pf;
        int ms, r;
        ssize_t got;
        pf.fd = fd; pf.events = POLLIN; pf.revents = 0;
        ms = _dm_stcli_poll_ms(deadline);
        if (ms == 0) return -ETIMEDOUT;
        r = poll(&pf, 1, ms);
        if (r < 0) { if (errno == EINTR) continue; return _dm_st_errno(errno); }
        if (r == 0) continue;
        got = recv(fd, p, n, 0);
        if (got > 0) { p += got; n -= (size_t)got; continue; }
        if (got == 0) return _DM_ST_EOF;
        if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
        return _dm_st_errno(errno);
    }
    return 0;
}

/* A sealed connection's I/O (>>store seal): the plaintext of records, one at a time; a record
   that fails its tag or announces a bad length is -EBADMSG, and nothing of it is handed out.
   Without encryption (c->seal NULL) the socket's bytes as they are. */
_DM_PRIVATE void _dm_stcli_unseal_end(_dm_stcli* c) {
#if defined(DISTMESH_OPENSSL)
    _dm_st_seal_free(c->a, c->seal);
#endif
    c->seal = NULL;
}
#if defined(DISTMESH_OPENSSL)
/* The next record read and opened into c->seal->rec: 0 or a code. */
_DM_PRIVATE int _dm_stcli_next_record(_dm_stcli* c, int fd, int64_t deadline) {
    _dm_st_seal* z = c->seal;
    size_t n;
    int rc = _dm_stcli_recv_all(fd, z->rec, _DM_AEAD_HEAD, deadline);
    if (rc) return rc;
    if ((n = _dm_rec_len(z->rec)) == 0) return -EBADMSG;
    if ((rc = _dm_stcli_recv_all(fd, z->rec + _DM_AEAD_HEAD, n + _DM_AEAD_TAG, deadline)) != 0) return rc;
    if (!_dm_rec_open(&z->rx, z->rec, n)) return -EBADMSG;
    z->ppos = 0;
    z->plen = n;
    return 0;
}
#endif
_DM_PRIVATE int _dm_stcli_write(_dm_stcli* c, int fd, const unsigned char* p, size_t n, int64_t deadline) {
#if defined(DISTMESH_OPENSSL)
    while (c->seal && n) {
        _dm_iov one;
        int rc;
        one.buf = p;
        one.len = n < _DM_AEAD_RECORD ? n : _DM_AEAD_RECORD;
        if (!_dm_rec_seal(&c->seal->tx, &one, 1, one.len, c->seal->out)) return -EIO;
        rc = _dm_stcli_send_all(fd, c->seal->out, one.len + _DM_AEAD_HEAD + _DM_AEAD_TAG, deadline);
        if (rc) return rc;
        p += one.len;
        n -= one.len;
    }
    if (c->seal) return 0;
#endif
    (void)c;
    return _dm_stcli_send_all(fd, p, n, deadline);
}
_DM_PRIVATE int _dm_stcli_read(_dm_stcli* c, int fd, unsigned char* p, size_t n, int64_t deadline) {
#if defined(DISTMESH_OPENSSL)
    while (c->seal && n) {
        _dm_st_seal* z = c->seal;
        size_t k;
        int rc;
        if (z->ppos == z->plen && (rc = _dm_stcli_next_record(c, fd, deadline)) != 0) return rc;
        k = z->plen - z->ppos < n ? z->plen - z->ppos : n;
        memcpy(p, z->rec + _DM_AEAD_HEAD + z->ppos, k);
        z->ppos += k;
        p += k;
        n -= k;
    }
    if (c->seal) return 0;
#endif
    (void)c;
    return _dm_stcli_recv_all(fd, p, n, deadline);
}

/* Closes a connection that can no longer be trusted (the caller breaks the store with
   _dm_store_break, saying why). */
_DM_PRIVATE void _dm_stcli_drop(dm_store* s) {
    _dm_stcli* c = _dm_stcli_of(s);
    if (c->fd >= 0) { close(c->fd); c->fd = -1; }
    _dm_stcli_unseal_end(c);
}
/* The connection is unusable after a failure in the middle of a request. */
_DM_PRIVATE dm_status _dm_stcli_io_fail(dm_store* s, int code, const char* what) {
    char cause[200];
    _dm_stcli* c = _dm_stcli_of(s);
    dm_status st = code == -EBADMSG ? DM_ERR_PROTOCOL : _dm_st_status(code);   /* (>>store seal) */
    _dm_st_cause(code, cause, sizeof(cause));
    if (code == -EBADMSG)
        snprintf(cause, sizeof(cause), "EBADMSG: a sealed record from the server failed its authentication: "
                 "tampered with, replayed, reordered or cut on the way");
    _dm_stcli_drop(s);
    _dm_store_break(s->sh, "%.40s: %.100s", what, cause);
    if (code == _DM_ST_EOF) snprintf(cause, sizeof(cause), "EOF: the server closed the connection");
    return _DM_STORE_FAIL(s, st, "tcp-store: %s with %s:%d failed (%s)", what, c->host, c->port, cause);
}
/* Starts a client request in b: the opcode first; the caller appends its fields. */
_DM_PRIVATE void _dm_stcli_request(_dm_stbuf* b, dm_store* s, unsigned opcode) {
    memset(b, 0, sizeof(*b));
    b->a = &s->allocator;
    /* protocol 1 callers only ask for opcodes it has (see >>store wire) */
    if (_dm_stcli_of(s)->proto == _DM_ST_PROTO_1) opcode = _dm_st_v1_from_v2[opcode];
    _dm_stbuf_u8(b, opcode);
}
/* Why the server closed this client, when it said (a notice, see >>store wire). got: the n <= 8
   bytes of a reply already read that cannot be a reply (none after a failed send). DM_OK when
   there is no notice; else the connection is broken and the call fails with the server's
   status and reason. */
_DM_PRIVATE dm_status _dm_stcli_notice(dm_store* s, const unsigned char* got, size_t n, const char* what) {
    _dm_stcli* c = _dm_stcli_of(s);
    unsigned char b[_DM_ST_NOTICE_HEAD + _DM_ST_NOTICE_TEXT + 1];
    int64_t deadline = _dm_now_ms() + _DM_ST_NOTICE_MS;
    size_t len;
    int32_t code;
    dm_status st;
    if (c->fd < 0 || n > 8) return DM_OK;
    if (n) memcpy(b, got, n);
    if (memcmp(b, _dm_st_notice_magic, n) != 0) return DM_OK;
    if (_dm_stcli_read(c, c->fd, b + n, _DM_ST_NOTICE_HEAD - n, deadline) != 0 ||
        memcmp(b, _dm_st_notice_magic, 8) != 0)
        return DM_OK;
    len = (size_t)b[12] | ((size_t)b[13] << 8);
    if (len > _DM_ST_NOTICE_TEXT || _dm_stcli_read(c, c->fd, b + _DM_ST_NOTICE_HEAD, len, deadline) != 0)
        return DM_OK;
    b[_DM_ST_NOTICE_HEAD + len] = 0;
    code = (int32_t)_dm_st_get_u32(b + 8);
    st = code < 0 && strcmp(dm_status_name((dm_status)code), "DM_UNKNOWN_STATUS") != 0 ? (dm_status)code
                                                                                      : DM_ERR_PROTOCOL;
    _dm_stcli_drop(s);
    _dm_store_break(s->sh, "the server closed it: %.120s", (const char*)b + _DM_ST_NOTICE_HEAD);
    return _DM_STORE_FAIL(s, st, "tcp-store: %s: the server %s:%d closed this client (%s)", what, c->host, c->port,
                          (const char*)b + _DM_ST_NOTICE_HEAD);
}
_DM_PRIVATE dm_status _dm_stcli_send(dm_store* s, _dm_stbuf* b, const char* what) {
    int rc;
    if (b->oom) return _DM_STORE_FAIL(s, DM_ERR_OUT_OF_MEMORY, "tcp-store: %s (out of memory)", what);
    rc = _dm_stcli_write(_dm_stcli_of(s), _dm_stcli_of(s)->fd, b->p, b->len, _dm_deadline(s->timeout_ms));
    if (rc == -EPIPE || rc == -ECONNRESET) {    /* closed by the server: maybe it said why */
        dm_status st = _dm_stcli_notice(s, NULL, 0, what);
        if (st != DM_OK) return st;
    }
    if (rc) return _dm_stcli_io_fail(s, rc, what);
    return DM_OK;
}
_DM_PRIVATE dm_status _dm_stcli_recv(dm_store* s, void* p, size_t n, int64_t deadline, const char* what) {
    int rc = _dm_stcli_read(_dm_stcli_of(s), _dm_stcli_of(s)->fd, (unsigned char*)p, n, deadline);
    if (rc) return _dm_stcli_io_fail(s, rc, what);
    return DM_OK;
}
_DM_PRIVATE dm_status _dm_stcli_recv_u64(dm_store* s, uint64_t* v, const char* what) {
    unsigned char b[8];
    dm_status st = _dm_stcli_recv(s, b, 8, _dm_deadline(s->timeout_ms), what);
    if (st == DM_OK && memcmp(b, _dm_st_notice_magic, 8) == 0 && (st = _dm_stcli_notice(s, b, 8, what)) != DM_OK)
        return st;
    if (st == DM_OK) *v = _dm_st_get_u64(b);
    return st;
}
/* uint64 length + bytes into a new buffer of the store's allocator. */
_DM_PRIVATE dm_status _dm_stcli_recv_value(dm_store* s, void** out, size_t* out_n, const char* what) {
    uint64_t n;
    unsigned char* p;
    dm_status st = _dm_stcli_recv_u64(s, &n, what);
    if (st != DM_OK) return st;
    if (n > DM_STORE_MAX_VALUE) {
        _dm_stcli_drop(s);
        _dm_store_break(s->sh, "reply of %llu bytes", (unsigned long long)n);
        return _DM_STORE_FAIL(s, DM_ERR_PROTOCOL, "tcp-store: %s: reply of %llu bytes (above DM_STORE_MAX_VALUE)",
                              what, (unsigned long long)n);
    }
    p = (unsigned char*)_dm_malloc(&s->allocator, (size_t)n);
    if (!p) return _DM_STORE_FAIL(s, DM_ERR_OUT_OF_MEMORY, "tcp-store: %s (out of memory)", what);
    st = _dm_stcli_recv(s, p, (size_t)n, _dm_deadline(s->timeout_ms), what);
    if (st != DM_OK) { _dm_free(&s->allocator, p); return st; }
    *out = p;
    *out_n = (size_t)n;
    return DM_OK;
}
/* Protocol violation in a reply: the stream can't be trusted any more. */
_DM_PRIVATE dm_status _dm_stcli_bad_reply(dm_store* s, const char* what, unsigned got) {
    unsigned char first = (unsigned char)got;
    dm_status st = got == _dm_st_notice_magic[0] ? _dm_stcli_notice(s, &first, 1, what) : DM_OK;
    if (st != DM_OK) return st;
    _dm_stcli_drop(s);
    _dm_store_break(s->sh, "%s: unexpected reply byte %u", what, got);
    return _DM_STORE_FAIL(s, DM_ERR_PROTOCOL, "tcp-store: %s: unexpected reply byte %u from %s:%d",
                          what, got, _dm_stcli_of(s)->host, _dm_stcli_of(s)->port);
}

/* Protocol 1 has no CANCEL_WAIT: a wait with a deadline polls CHECK (every 20..200 ms). */
_DM_PRIVATE dm_status _dm_stcli_v1_wait(dm_store* s, const _dm_store_key* k, size_t n, int timeout_ms) {
    int64_t deadline = _dm_deadline(timeout_ms);
    int pause = 20;
    for (;;) {
        _dm_stbuf b;
        size_t i;
        unsigned char r;
        dm_status st;
        _dm_stcli_request(&b, s, _DM_STQ_CHECK);
        _dm_stbuf_u64(&b, (uint64_t)n);
        for (i = 0; i < n; i++) _dm_stbuf_str(&b, k[i].bytes, k[i].len);
        st = _dm_stcli_send(s, &b, "wait");
        _dm_stbuf_free(&b);
        if (st == DM_OK) st = _dm_stcli_recv(s, &r, 1, _dm_deadline(s->timeout_ms), "wait");
        if (st != DM_OK) return st;
        if (r == _DM_ST_READY) return DM_OK;
        if (r != _DM_ST_NOT_READY) return _dm_stcli_bad_reply(s, "wait", r);
        if (_dm_now_ms() >= deadline) {
            char list[300];
            return _DM_STORE_FAIL(s, DM_ERR_TIMEOUT, "tcp-store: wait for %s timed out after %d ms (ETIMEDOUT)",
                                  _dm_store_keylist(s, k, n, list, sizeof(list)), timeout_ms);
        }
        {
            int64_t left = deadline - _dm_now_ms();
            struct timespec ts;
            if (left > pause) left = pause;
            ts.tv_sec = 0;
            ts.tv_nsec = (long)(left > 0 ? left : 1) * 1000000L;
            nanosleep(&ts, NULL);
            pause = pause * 2 > 200 ? 200 : pause * 2;
        }
    }
}

/* WAIT; at the deadline CANCEL_WAIT, as torch's client does. */
_DM_PRIVATE dm_status _dm_stcli_wait(dm_store* s, const _dm_store_key* k, size_t n, int timeout_ms) {
    _dm_stcli* c = _dm_stcli_of(s);
    _dm_stbuf b;
    size_t i;
    unsigned char r;
    int rc;
    dm_status st;
    int64_t deadline = _dm_deadline(timeout_ms);
    if (c->proto == _DM_ST_PROTO_1 && timeout_ms >= 0) return _dm_stcli_v1_wait(s, k, n, timeout_ms);
    _dm_stcli_request(&b, s, _DM_STQ_WAIT);
    _dm_stbuf_u64(&b, (uint64_t)n);
    for (i = 0; i < n; i++) _dm_stbuf_str(&b, k[i].bytes, k[i].len);
    st = _dm_stcli_send(s, &b, "wait");
    _dm_stbuf_free(&b);
    if (st != DM_OK) return st;
    rc = _dm_stcli_read(c, c->fd, &r, 1, deadline);
    if (rc == 0) return r == _DM_ST_STOP_WAITING ? DM_OK : _dm_stcli_bad_reply(s, "wait", r);
    if (rc != -ETIMEDOUT) return _dm_stcli_io_fail(s, rc, "wait");
    /* timed out: cancel, then expect WAIT_CANCELED (after a STOP_WAITING that crossed it) */
    r = _DM_STQ_CANCEL_WAIT;
    rc = _dm_stcli_write(c, c->fd, &r, 1, _dm_deadline(s->timeout_ms));
    if (rc) return _dm_stcli_io_fail(s, rc, "cancel wait");
    if ((st = _dm_stcli_recv(s, &r, 1, _dm_deadline(s->timeout_ms), "cancel wait")) != DM_OK) return st;
    if (r == _DM_ST_STOP_WAITING) {
        if ((st = _dm_stcli_recv(s, &r, 1, _dm_deadline(s->timeout_ms), "cancel wait")) != DM_OK) return st;
    }
    if (r != _DM_ST_WAIT_CANCELED) return _dm_stcli_bad_reply(s, "cancel wait", r);
    {
        char list[300];
        return _DM_STORE_FAIL(s, DM_ERR_TIMEOUT, "tcp-store: wait for %s timed out after %d ms (ETIMEDOUT)",
                              _dm_store_keylist(s, k, n, list, sizeof(list)), timeout_ms);
    }
}

/* A notice the server sent instead of taking this connection (see >>store wire): got holds the
   n (4 or 8) bytes of the first reply already read. True when they start one: the rest read
   into c->refusal_st / c->refusal (as far as it came) and *refused set. */
_DM_PRIVATE bool _dm_stcli_connect_notice(_dm_stcli* c, int fd, const unsigned char* got, size_t n, int64_t deadline,
                                          int* refused) {
    unsigned char b[_DM_ST_NOTICE_HEAD + _DM_ST_NOTICE_TEXT];
    size_t len;
    if (memcmp(got, _dm_st_notice_magic, n) != 0) return false;
    memcpy(b, got, n);
    *refused = _DM_ST_NOTICED;
    c->refusal_st = (int32_t)DM_ERR_NETWORK;
    snprintf(c->refusal, sizeof(c->refusal), "the server closed the connection at once with a notice it could not "
             "finish sending");
    if (_dm_stcli_read(c, fd, b + n, _DM_ST_NOTICE_HEAD - n, deadline) != 0 || memcmp(b, _dm_st_notice_magic, 8) != 0)
        return true;
    len = (size_t)b[12] | ((size_t)b[13] << 8);
    if (len > _DM_ST_NOTICE_TEXT || _dm_stcli_read(c, fd, b + _DM_ST_NOTICE_HEAD, len, deadline) != 0) return true;
    c->refusal_st = (int32_t)_dm_st_get_u32(b + 8);
    if (c->refusal_st >= 0 || strcmp(dm_status_name((dm_status)c->refusal_st), "DM_UNKNOWN_STATUS") == 0)
        c->refusal_st = (int32_t)DM_ERR_PROTOCOL;
    memcpy(c->refusal, b + _DM_ST_NOTICE_HEAD, len);
    c->refusal[len] = 0;
    return true;
}

/* The client's half of the handshake (see >>store wire). 0, or a code with *refused set when
   the server answered in a way that retrying will not change. Admitted with encryption, the
   connection's records are keyed (c->seal) before anything else is sent. */
_DM_PRIVATE int _dm_stcli_auth(_dm_stcli* c, int fd, int64_t deadline, int* refused) {
    unsigned char hello[_DM_ST_AUTH_HELLO], rep[_DM_ST_AUTH_CHALLENGE], mac[32], st[4];
    const char* token = c->token;
    size_t tn = c->token_len;
    unsigned version = c->encrypt ? _DM_ST_AUTH_SEALED : _DM_ST_AUTH_VERSION;
    uint32_t status;
    int rc;
    hello[0] = _DM_STQ_AUTH;
    hello[1] = 0x44; hello[2] = 0x4d; hello[3] = 0x53; hello[4] = 0x41;   /* "DMSA" */
    hello[5] = (unsigned char)version; hello[6] = hello[7] = hello[8] = 0;
    _dm_st_random(hello + 9, 32);
    if ((rc = _dm_stcli_send_all(fd, hello, sizeof(hello), deadline)) != 0) return rc;
    rc = _dm_stcli_recv_all(fd, rep, 8, deadline);
    if (rc == 0 && _dm_stcli_connect_notice(c, fd, rep, 8, deadline, refused)) return -EPROTO;
    status = rc == 0 ? _dm_st_get_u32(rep + 4) : 0;
    if (rc == 0 && _dm_st_get_u32(rep) == _DM_ST_AUTH_MAGIC &&
        (status == _DM_ST_AUTH_SEAL_DIFFERS || status == _DM_ST_AUTH_PLAIN_DIFFERS)) {
        /* an answer about a hello this client did not send (it asked for what the server says
           it lacks) means the hello was changed on the way: not a setting to fix */
        bool contradicts = (status == _DM_ST_AUTH_SEAL_DIFFERS) == (version == _DM_ST_AUTH_SEALED);
        *refused = contradicts ? _DM_ST_HELLO_CHANGED
                   : status == _DM_ST_AUTH_SEAL_DIFFERS ? _DM_ST_SERVER_SEALS : _DM_ST_SERVER_PLAIN;
        return -EPROTO;
    }
    if (rc == 0) rc = _dm_stcli_recv_all(fd, rep + 8, sizeof(rep) - 8, deadline);
    if (rc == _DM_ST_EOF || rc == -ECONNRESET) *refused = _DM_ST_NOAUTH;
    if (rc) return rc;
    if (_dm_st_get_u32(rep) != _DM_ST_AUTH_MAGIC || status != 0) {
        *refused = _DM_ST_NOAUTH;
        return -EPROTO;
    }
    _dm_st_auth_mac(token, tn, true, version, hello + 9, rep + 8, mac);
    if (!_dm_st_ct_equal(mac, rep + 40, 32)) { *refused = _DM_ST_BADSERVER; return -EPROTO; }
    _dm_st_auth_mac(token, tn, false, version, rep + 8, hello + 9, mac);
    if ((rc = _dm_stcli_send_all(fd, mac, 32, deadline)) != 0) return rc;
    rc = _dm_stcli_recv_all(fd, st, 4, deadline);
    if (rc == _DM_ST_EOF || rc == -ECONNRESET || (rc == 0 && _dm_st_get_u32(st) != 0)) {
        *refused = _DM_ST_REFUSED;
        return rc ? rc : -EPROTO;
    }
    if (rc || !c->encrypt) return rc;
#if defined(DISTMESH_OPENSSL)
    c->seal = _dm_st_seal_new(c->a, token, tn, hello + 9, rep + 8, false);
#endif
    return c->seal ? 0 : -ENOMEM;
}

/* One connection attempt: connect, TCP_NODELAY, authentication when there is a token, then
   VALIDATE + PING (proto 2), or a 1.13 GETNUMKEYS answered with 8 bytes (proto 1). 0 or a code
   (*refused: see _dm_stcli_auth). */
_DM_PRIVATE int _dm_stcli_try_connect(const struct addrinfo* ai, _dm_stcli* c, int proto,
                                      int64_t deadline, int* out_fd, int* refused) {
    int fd, rc, fl;
    unsigned char req[16], rep[4];
    uint32_t nonce = _DM_ST_NONCE_MARK | ((uint32_t)getpid() & 0xFFFFFFu);   /* see >>store wire */
    _dm_stbuf b;
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) return _dm_st_errno(errno);
    fl = fcntl(fd, F_GETFL, 0);
    fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc < 0 && errno != EINPROGRESS && errno != EINTR) {
        rc = _dm_st_errno(errno);
        close(fd);
        return rc;
    }
    if (rc < 0) {
        for (;;) {
            struct pollfd pf;
            int ms = _dm_stcli_poll_ms(deadline), r, soerr = 0;
            socklen_t sl = sizeof(soerr);
            if (ms == 0) { close(fd); return -ETIMEDOUT; }
            pf.fd = fd; pf.events = POLLOUT; pf.revents = 0;
            r = poll(&pf, 1, ms);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) { rc = _dm_st_errno(errno); close(fd); return rc; }
            if (r == 0) continue;
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
            if (soerr) { close(fd); return _dm_st_errno(soerr); }
            break;
        }
    }
    fl = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &fl, sizeof(fl));
    _dm_stcli_unseal_end(c);        /* a failed attempt's records, if any */
    if (c->token_len && (rc = _dm_stcli_auth(c, fd, deadline, refused)) != 0) {
        _dm_stcli_unseal_end(c);
        close(fd);
        return rc;
    }
    memset(&b, 0, sizeof(b));
    b.p = req;
    b.cap = sizeof(req);
    if (proto == _DM_ST_PROTO_1) {
        unsigned char n8[8];
        _dm_stbuf_u8(&b, 6);            /* GETNUMKEYS of torch < 2.2 */
        if ((rc = _dm_stcli_write(c, fd, req, b.len, deadline)) != 0 ||
            (rc = _dm_stcli_read(c, fd, n8, 8, deadline)) != 0) {
            close(fd);
            return rc;
        }
        *out_fd = fd;
        return 0;
    }
    /* VALIDATE + PING in one segment, like torch's client (two sends, no reply in between) */
    _dm_stbuf_u8(&b, _DM_STQ_VALIDATE);
    _dm_stbuf_u32(&b, _DM_ST_MAGIC);
    _dm_stbuf_u8(&b, _DM_STQ_PING);
    _dm_stbuf_u32(&b, nonce);
    if ((rc = _dm_stcli_write(c, fd, req, b.len, deadline)) != 0 ||
        (rc = _dm_stcli_read(c, fd, rep, 4, deadline)) != 0) {
        close(fd);
        return rc;
    }
    if (_dm_st_get_u32(rep) != nonce) {
        if (_dm_st_get_u32(rep) == _DM_ST_AUTH_NEEDED) *refused = _DM_ST_NEEDTOKEN;
        else _dm_stcli_connect_notice(c, fd, rep, 4, deadline, refused);
        close(fd);
        return -EPROTO;
    }
    *out_fd = fd;
    return 0;
}

_DM_PRIVATE dm_status _dm_stcli_refused(dm_store* s, int why) {
    const _dm_stcli* c = _dm_stcli_of(s);
    const char* text;
    if (why == _DM_ST_NOTICED)      /* the server's own words: why it cannot take this client */
        return _DM_STORE_FAIL(s, (dm_status)c->refusal_st, "tcp-store: %s:%d refused this client: %s", c->host, c->port,
                              c->refusal);
    text =
        why == _DM_ST_SERVER_SEALS ? "the server encrypts its connections and this client does not: set the same "
                                     "DISTMESH_ENCRYPT (or desc.encrypt) on every process (or the server's answer "
                                     "was tampered with on the way)" :
        why == _DM_ST_SERVER_PLAIN ? "this client encrypts (DISTMESH_ENCRYPT, desc.encrypt) and the server does not: "
                                     "set the same DISTMESH_ENCRYPT on every process (the store host's build may "
                                     "lack DISTMESH_OPENSSL), or the server's answer was tampered with on the way" :
        why == _DM_ST_NEEDTOKEN ? "the store requires a token: set the job's DISTMESH_TOKEN (or desc.token) here too" :
        why == _DM_ST_BADSERVER ? "the server could not prove the token: it has a different DISTMESH_TOKEN, it is not "
                                  "the job's store, or its proof was tampered with on the way" :
        why == _DM_ST_REFUSED   ? "the server refused this client's token proof: the tokens differ, or the proof "
                                  "was tampered with on the way" :
        why == _DM_ST_HELLO_CHANGED ? "the server answered a hello this client did not send (about encryption, "
                                      "which this client asked for as the server does): the hello was changed on "
                                      "the way (tampered with)" :
                                  "the server closed the connection instead of authenticating: it has no token (set "
                                  "DISTMESH_TOKEN on the store host too), it is not a distmesh store (torch's "
                                  "TCPStore cannot authenticate), or the connection was cut on the way (tampered "
                                  "with)";
    return _DM_STORE_FAIL(s, DM_ERR_REFUSED, "tcp-store: %s:%d: %s", c->host, c->port, text);
}

/* Connects to c->host:c->port, retrying until the store's timeout (the server may start later),
   or once with s->one_try. */
_DM_PRIVATE dm_status _dm_stcli_connect(dm_store* s) {
    _dm_stcli* c = _dm_stcli_of(s);
    int64_t deadline = _dm_deadline(s->timeout_ms);
    int backoff = 10, last = 0, tries = 0;
    char portstr[16], cause[200];
    snprintf(portstr, sizeof(portstr), "%d", c->port);
    for (;;) {
        struct addrinfo hints, *res = NULL, *ai;
        int gai;
        memset(&hints, 0, sizeof(hints));
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        hints.ai_flags = AI_NUMERICSERV;
        tries++;
        gai = getaddrinfo(c->host, portstr, &hints, &res);
        if (gai != 0) {
            last = gai == EAI_SYSTEM ? _dm_st_errno(errno) : _DM_ST_EAI_NONAME;
            if (gai == EAI_AGAIN) last = _DM_ST_EAI_AGAIN;
            if (gai == EAI_MEMORY) last = -ENOMEM;
        } else {
            int refused = _DM_ST_OK;
            for (ai = res; ai && !refused; ai = ai->ai_next) {
                int fd = -1;
                int r = _dm_stcli_try_connect(ai, c, _DM_ST_PROTO_2, deadline, &fd, &refused);
                /* dropped during the handshake: maybe a torch < 2.2 server; ask it its way */
                if ((r == _DM_ST_EOF || r == -ECONNRESET) && !refused &&
                    _dm_stcli_try_connect(ai, c, _DM_ST_PROTO_1, deadline, &fd, &refused) == 0) {
                    c->proto = _DM_ST_PROTO_1;
                    _DM_LOG(&s->logger, DM_LOG_INFO, "tcp-store: %s:%d is a torch < 2.2 store; using its protocol",
                            c->host, c->port);
                    r = 0;
                }
                if (r == 0) { c->fd = fd; last = 0; break; }
                _dm_stcli_unseal_end(c);
                if (r != -ETIMEDOUT || !last) last = r;   /* keep the real cause over our deadline */
                if (r == -EBADMSG) break;
            }
            freeaddrinfo(res);
            if (last == 0) return DM_OK;
            if (refused) return _dm_stcli_refused(s, refused);
            /* a sealed record of the handshake that fails its tag was tampered with (or is not
               from the job's store): never retried, whatever the time left */
            if (last == -EBADMSG)
                return _DM_STORE_FAIL(s, DM_ERR_PROTOCOL,
                                      "tcp-store: connect to %s:%d failed (EBADMSG: a sealed record from the server "
                                      "failed its authentication: tampered with, replayed, reordered or cut on the "
                                      "way; not retried)", c->host, c->port);
            if (last == -EPROTO)
                return _DM_STORE_FAIL(s, DM_ERR_PROTOCOL,
                                      "tcp-store: %s:%d is not a torch 2.x TCPStore (wrong PING reply)",
                                      c->host, c->port);
        }
        if (s->one_try)
            return _DM_STORE_FAIL(s, last == -ENOMEM ? DM_ERR_OUT_OF_MEMORY : DM_ERR_NETWORK,
                                  "tcp-store: connect to %s:%d failed (%s)", c->host, c->port,
                                  _dm_st_cause(last ? last : -ETIMEDOUT, cause, sizeof(cause)));
        {   /* sleep the backoff, or what is left of the timeout */
            int64_t left = deadline == INT64_MAX ? backoff : deadline - _dm_now_ms();
            struct timespec ts;
            if (left <= 0) break;
            if (left > backoff) left = backoff;
            ts.tv_sec = (time_t)(left / 1000);
            ts.tv_nsec = (long)(left % 1000) * 1000000L;
            nanosleep(&ts, NULL);
        }
        backoff = backoff * 2 > 500 ? 500 : backoff * 2;
    }
    return _DM_STORE_FAIL(s, last == -ENOMEM ? DM_ERR_OUT_OF_MEMORY : DM_ERR_TIMEOUT,
                          "tcp-store: connect to %s:%d timed out after %d ms and %d tries (%s)",
                          c->host, c->port, s->timeout_ms, tries,
                          _dm_st_cause(last ? last : -ETIMEDOUT, cause, sizeof(cause)));
}

/* >>store tcp ops  One c10d request per slot (the opcodes of >>store wire); against a torch < 2.2
   server, which has no APPEND and no MULTI_*, append is DM_ERR_UNSUPPORTED and the multi_* slots
   go key by key. */

/* TORCHELASTIC_USE_AGENT_STORE: torch's getCvarBool truthy spellings. */
_DM_PRIVATE bool _dm_stcli_agent_store(void) {
    const char* v = getenv("TORCHELASTIC_USE_AGENT_STORE");
    if (!v) return false;
    return strcmp(v, "1") == 0 || strcmp(v, "true") == 0 || strcmp(v, "True") == 0 ||
           strcmp(v, "TRUE") == 0 || strcmp(v, "yes") == 0 || strcmp(v, "y") == 0;
}
/* The live store this process hosts on port (a reference taken), or NULL; *other_token when it
   exists with another token (or broken: not shareable). */
_DM_PRIVATE _dm_store_shared* _dm_stcli_hosted_share(int port, const _dm_store_limits* lim, bool* other_token) {
    _dm_store_shared* sh;
    *other_token = false;
    if (port <= 0) return NULL;
    pthread_mutex_lock(&_dm_store_hosted_mu);
    for (sh = _dm_store_hosted; sh; sh = sh->hosted_next) {
        const _dm_stcli* c = (const _dm_stcli*)sh->impl;
        if (strcmp(sh->ops->name, "tcp") != 0 || c->port != port) continue;
        pthread_mutex_lock(&sh->mu);
        if (c->token_len != lim->token_len || memcmp(c->token, lim->token, lim->token_len) != 0 ||
            c->encrypt != lim->encrypt)
            *other_token = true;
        else if (sh->refs > 0 && !sh->broken) sh->refs++;
        else *other_token = true;   /* broken: not shareable; say it is in use */
        pthread_mutex_unlock(&sh->mu);
        break;
    }
    pthread_mutex_unlock(&_dm_store_hosted_mu);
    return sh && !*other_token ? sh : NULL;
}

/* tcp://host:port, tcp://[v6]:port: hosts the server first with is_server, then connects. */
_DM_PRIVATE dm_status _dm_stcli_open(dm_store* s, const char* url, const dm_store_desc* d, const _dm_store_limits* lim,
                                     bool share_hosted) {
    _dm_stcli* c = (_dm_stcli*)_dm_calloc(&s->allocator, sizeof(*c));
    const char* h = url + 6;
    const char* colon;
    char* end = NULL;
    long port;
    size_t hl;
    dm_status st;
    if (!c) return _DM_STORE_FAIL(s, DM_ERR_OUT_OF_MEMORY, "tcp-store: out of memory");
    s->sh->impl = c;
    c->fd = -1;
    c->a = &s->sh->allocator;
    c->encrypt = lim->encrypt;
    c->token_len = lim->token_len;
    memcpy(c->token, lim->token, sizeof(c->token));
    if (h[0] == '[') {
        const char* rb = strchr(h, ']');
        if (!rb || rb[1] != ':') return _dm_store_bad_url(s, url);
        hl = (size_t)(rb - h - 1);
        memcpy(c->host, h + 1, hl < sizeof(c->host) ? hl : 0);
        colon = rb + 1;
    } else {
        colon = strrchr(h, ':');
        if (!colon) return _dm_store_bad_url(s, url);
        hl = (size_t)(colon - h);
        if (hl >= sizeof(c->host)) return _dm_store_bad_url(s, url);
        memcpy(c->host, h, hl);
    }
    if (hl == 0 || hl >= sizeof(c->host)) return _dm_store_bad_url(s, url);
    c->host[hl] = 0;
    errno = 0;
    port = strtol(colon + 1, &end, 10);
    if (errno || end == colon + 1 || (*end && *end != '/' && *end != '?') || port < 0 || port > 65535)
        return _dm_store_bad_url(s, url);
    c->port = (int)port;
    if (d->is_server && !_dm_stcli_agent_store()) {
        char what[600];
        bool other = false;
        _dm_store_shared* hosted = _dm_stcli_hosted_share((int)port, lim, &other);
        if (hosted && share_hosted) {   /* a second world on a url this process serves */
            _dm_store_shared_release(s->sh);
            s->sh = hosted;
            return DM_OK;
        }
        if (hosted || other) {
            if (hosted) _dm_store_shared_release(hosted);
            return _DM_STORE_FAIL(s, DM_ERR_NETWORK, "tcp-store: server %s: this process already serves port %ld (EADDRINUSE)%s",
                                  url, port, other ? " with another token or a broken connection: use another port"
                                                   : ": share that store (dm_store_clone_prefixed, or dm_tcp_desc.store)");
        }
        st = _dm_srv_start(c->host, c->port, &d->logger, &d->allocator, lim, &c->server, what, sizeof(what));
        if (st != DM_OK) return _DM_STORE_FAIL(s, st, "tcp-store: server %s: %s", url, what);
        c->port = _dm_srv_port(c->server);
    } else if (port == 0) {
        return _DM_STORE_FAIL(s, DM_ERR_INVALID_ARG, "tcp-store: %s: port 0 needs is_server (a client must know the port)",
                              url);
    }
    snprintf(s->sh->where, sizeof(s->sh->where), "%s:%d", c->host, c->port);
    if (!s->sh->lazy && (st = _dm_stcli_connect(s)) != DM_OK) return st;
    if (c->server) _dm_store_register_hosted(s->sh);
    return DM_OK;
}
/* A lazy store's connection, made at its first request (see _dm_store_ops.ensure). */
_DM_PRIVATE dm_status _dm_stcli_ensure(dm_store* s) {
    return _dm_stcli_of(s)->fd >= 0 ? DM_OK : _dm_stcli_connect(s);
}
_DM_PRIVATE void _dm_stcli_close(_dm_store_shared* sh) {
    _dm_stcli* c = (_dm_stcli*)sh->impl;
    if (!c) return;
    if (c->fd >= 0) close(c->fd);
    _dm_stcli_unseal_end(c);
    _dm_srv_stop(c->server);
    _dm_free(&sh->allocator, c);
}

_DM_PRIVATE dm_status _dm_stcli_put(dm_store* s, const _dm_store_key* k, const void* value, size_t size, bool append) {
    const _dm_stcli* c = _dm_stcli_of(s);
    const char* what = append ? "append" : "set";
    _dm_stbuf b;
    dm_status st;
    if (append && c->proto == _DM_ST_PROTO_1)
        return _DM_STORE_FAIL(s, DM_ERR_UNSUPPORTED, "tcp-store: append: the torch < 2.2 store at %s:%d has no APPEND",
                              c->host, c->port);
    _dm_stcli_request(&b, s, append ? _DM_STQ_APPEND : _DM_STQ_SET);
    _dm_stbuf_str(&b, k->bytes, k->len);
    _dm_stbuf_str(&b, value, size);
    st = _dm_stcli_send(s, &b, what);
    _dm_stbuf_free(&b);
    return st;
}
_DM_PRIVATE dm_status _dm_stcli_set(dm_store* s, const _dm_store_key* k, const void* value, size_t size) {
    return _dm_stcli_put(s, k, value, size, false);
}
_DM_PRIVATE dm_status _dm_stcli_append(dm_store* s, const _dm_store_key* k, const void* value, size_t size) {
    return _dm_stcli_put(s, k, value, size, true);
}
_DM_PRIVATE dm_status _dm_stcli_get(dm_store* s, const _dm_store_key* k, void** out, size_t* out_size) {
    _dm_stbuf b;
    dm_status st;
    _dm_stcli_request(&b, s, _DM_STQ_GET);
    _dm_stbuf_str(&b, k->bytes, k->len);
    st = _dm_stcli_send(s, &b, "get");
    _dm_stbuf_free(&b);
    if (st == DM_OK) st = _dm_stcli_recv_value(s, out, out_size, "get");
    return st;
}
_DM_PRIVATE dm_status _dm_stcli_add(dm_store* s, const _dm_store_key* k, int64_t delta, int64_t* out) {
    _dm_stbuf b;
    uint64_t v = 0;
    dm_status st;
    _dm_stcli_request(&b, s, _DM_STQ_ADD);
    _dm_stbuf_str(&b, k->bytes, k->len);
    _dm_stbuf_u64(&b, (uint64_t)delta);
    st = _dm_stcli_send(s, &b, "add");
    _dm_stbuf_free(&b);
    if (st == DM_OK) st = _dm_stcli_recv_u64(s, &v, "add");
    if (st == DM_OK) *out = (int64_t)v;
    return st;
}
_DM_PRIVATE dm_status _dm_stcli_compare_set(dm_store* s, const _dm_store_key* k, const void* expected,
                                            size_t expected_size, const void* desired, size_t desired_size,
                                            void** out, size_t* out_size) {
    _dm_stbuf b;
    dm_status st;
    _dm_stcli_request(&b, s, _DM_STQ_COMPARE_SET);
    _dm_stbuf_str(&b, k->bytes, k->len);
    _dm_stbuf_str(&b, expected, expected_size);
    _dm_stbuf_str(&b, desired, desired_size);
    st = _dm_stcli_send(s, &b, "compare_set");
    _dm_stbuf_free(&b);
    if (st == DM_OK) st = _dm_stcli_recv_value(s, out, out_size, "compare_set");
    return st;
}
_DM_PRIVATE dm_status _dm_stcli_check(dm_store* s, const _dm_store_key* k, size_t n, bool* out_all_present) {
    _dm_stbuf b;
    unsigned char r = 0;
    size_t i;
    dm_status st;
    _dm_stcli_request(&b, s, _DM_STQ_CHECK);
    _dm_stbuf_u64(&b, (uint64_t)n);
    for (i = 0; i < n; i++) _dm_stbuf_str(&b, k[i].bytes, k[i].len);
    st = _dm_stcli_send(s, &b, "check");
    _dm_stbuf_free(&b);
    if (st == DM_OK) st = _dm_stcli_recv(s, &r, 1, _dm_deadline(s->timeout_ms), "check");
    if (st == DM_OK && r != _DM_ST_READY && r != _DM_ST_NOT_READY) st = _dm_stcli_bad_reply(s, "check", r);
    if (st == DM_OK) *out_all_present = r == _DM_ST_READY;
    return st;
}
_DM_PRIVATE dm_status _dm_stcli_delete(dm_store* s, const _dm_store_key* k, bool* out_deleted) {
    _dm_stbuf b;
    uint64_t v = 0;
    dm_status st;
    _dm_stcli_request(&b, s, _DM_STQ_DELETE_KEY);
    _dm_stbuf_str(&b, k->bytes, k->len);
    st = _dm_stcli_send(s, &b, "delete");
    _dm_stbuf_free(&b);
    if (st == DM_OK) st = _dm_stcli_recv_u64(s, &v, "delete");
    if (st == DM_OK) *out_deleted = v == 1;
    return st;
}
_DM_PRIVATE dm_status _dm_stcli_num_keys(dm_store* s, int64_t* out) {
    _dm_stbuf b;
    uint64_t v = 0;
    dm_status st;
    _dm_stcli_request(&b, s, _DM_STQ_GETNUMKEYS);
    st = _dm_stcli_send(s, &b, "num_keys");
    _dm_stbuf_free(&b);
    if (st == DM_OK) st = _dm_stcli_recv_u64(s, &v, "num_keys");
    if (st == DM_OK) *out = (int64_t)v;
    return st;
}
_DM_PRIVATE dm_status _dm_stcli_multi_set(dm_store* s, const _dm_store_key* k, const void* const* values,
                                          const size_t* sizes, size_t n) {
    _dm_stbuf b;
    size_t i;
    dm_status st = DM_OK;
    if (_dm_stcli_of(s)->proto == _DM_ST_PROTO_1) {
        for (i = 0; i < n && st == DM_OK; i++) st = _dm_stcli_put(s, &k[i], values[i], sizes[i], false);
        return st;
    }
    _dm_stcli_request(&b, s, _DM_STQ_MULTI_SET);
    _dm_stbuf_u64(&b, (uint64_t)n);
    for (i = 0; i < n; i++) { _dm_stbuf_str(&b, k[i].bytes, k[i].len); _dm_stbuf_str(&b, values[i], sizes[i]); }
    st = _dm_stcli_send(s, &b, "multi_set");
    _dm_stbuf_free(&b);
    return st;
}
_DM_PRIVATE dm_status _dm_stcli_multi_get(dm_store* s, const _dm_store_key* k, size_t n, void** out_values,
                                          size_t* out_sizes) {
    _dm_stbuf b;
    size_t i;
    dm_status st = DM_OK;
    if (_dm_stcli_of(s)->proto == _DM_ST_PROTO_1) {
        for (i = 0; i < n && st == DM_OK; i++) st = _dm_stcli_get(s, &k[i], &out_values[i], &out_sizes[i]);
        return st;
    }
    _dm_stcli_request(&b, s, _DM_STQ_MULTI_GET);
    _dm_stbuf_u64(&b, (uint64_t)n);
    for (i = 0; i < n; i++) _dm_stbuf_str(&b, k[i].bytes, k[i].len);
    st = _dm_stcli_send(s, &b, "multi_get");
    _dm_stbuf_free(&b);
    for (i = 0; i < n && st == DM_OK; i++) st = _dm_stcli_recv_value(s, &out_values[i], &out_sizes[i], "multi_get");
    return st;
}
_DM_PRIVATE int _dm_stcli_port(const _dm_store_shared* sh) { return ((const _dm_stcli*)sh->impl)->port; }

static const _dm_store_ops _dm_stcli_ops = {
    "tcp",                      /* name */
    _dm_stcli_open,             /* open: parse, host with is_server, connect */
    _dm_stcli_close,            /* close: the socket, the hosted server */
    _dm_stcli_set,              /* set: SET */
    _dm_stcli_append,           /* append: APPEND */
    _dm_stcli_get,              /* get: GET */
    _dm_stcli_add,              /* add: ADD */
    _dm_stcli_compare_set,      /* compare_set: COMPARE_SET */
    _dm_stcli_wait,             /* wait: WAIT, CANCEL_WAIT at the deadline */
    _dm_stcli_check,            /* check: CHECK */
    _dm_stcli_delete,           /* delete_key: DELETE_KEY */
    _dm_stcli_num_keys,         /* num_keys: GETNUMKEYS */
    _dm_stcli_multi_set,        /* multi_set: MULTI_SET */
    _dm_stcli_multi_get,        /* multi_get: MULTI_GET */
    _dm_stcli_port,             /* port: the port connected to */
    _dm_stcli_ensure            /* ensure: a lazy store connects at its first request */
};
/* ============================================================================================ */
/* >>store file io  The file kind: one file per key in a directory (NFS, local disk), named by
   the key's bytes in hex; a value is replaced by rename, so readers see all of it or nothing;
   read-modify-write operations (add, compare_set, append, delete) hold the directory's lock
   file; waits poll. */

/* The directory (the kind's state, s->sh->impl). */
_DM_PRIVATE const char* _dm_fstore_dir(const dm_store* s) { return (const char*)s->sh->impl; }

/* dir/<hex of key>; keys too long for a file name get "~" + two 64-bit hashes. */
_DM_PRIVATE char* _dm_fstore_path(dm_store* s, const unsigned char* key, size_t n) {
    const char* dir = _dm_fstore_dir(s);
    size_t dl = strlen(dir), i, cap = dl + 2 + (n * 2 > 240 ? 40 : n * 2) + 1;
    char* p = (char*)_dm_malloc(&s->allocator, cap);
    static const char hx[] = "0123456789abcdef";
    char* q;
    if (!p) return NULL;
    memcpy(p, dir, dl);
    q = p + dl;
    *q++ = '/';
    if (n * 2 > 240) {
        uint64_t h1 = _dm_st_hash(key, n), h2 = 0x9e3779b97f4a7c15ull;
        for (i = 0; i < n; i++) h2 = (h2 ^ key[n - 1 - i]) * 0x100000001b3ull + 0x7f4a7c15ull;
        snprintf(q, 40, "~%016llx%016llx", (unsigned long long)h1, (unsigned long long)h2);
        return p;
    }
    for (i = 0; i < n; i++) { *q++ = hx[key[i] >> 4]; *q++ = hx[key[i] & 15]; }
    *q = 0;
    if (n == 0) { q[0] = '_'; q[1] = 0; }   /* the empty key */
    return p;
}
_DM_PRIVATE dm_status _dm_fstore_errno(dm_store* s, const char* what, const char* path, int e) {
    char cause[200];
    int code = _dm_st_errno(e);
    return _DM_STORE_FAIL(s, _dm_st_status(code) == DM_ERR_NETWORK ? DM_ERR_IO : _dm_st_status(code),
                          "tcp-store: file store %s %s failed (%s)", what, path,
                          _dm_st_cause(code, cause, sizeof(cause)));
}
/* Reads the whole file; ENOENT -> DM_ERR_NOT_FOUND without a message. */
_DM_PRIVATE dm_status _dm_fstore_read(dm_store* s, const char* path, void** out, size_t* out_n) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat stt;
    unsigned char* p;
    size_t got = 0;
    if (fd < 0) {
        if (errno == ENOENT) return DM_ERR_NOT_FOUND;
        return _dm_fstore_errno(s, "open", path, errno);
    }
    if (fstat(fd, &stt) != 0) { int e = errno; close(fd); return _dm_fstore_errno(s, "stat", path, e); }
    if ((uint64_t)stt.st_size > DM_STORE_MAX_VALUE) {
        close(fd);
        return _DM_STORE_FAIL(s, DM_ERR_PROTOCOL, "tcp-store: file store %s holds %lld bytes (above DM_STORE_MAX_VALUE)",
                              path, (long long)stt.st_size);
    }
    p = (unsigned char*)_dm_malloc(&s->allocator, (size_t)stt.st_size);
    if (!p) { close(fd); return _DM_STORE_FAIL(s, DM_ERR_OUT_OF_MEMORY, "tcp-store: file store read %s (out of memory)", path); }
    while (got < (size_t)stt.st_size) {
        ssize_t r = read(fd, p + got, (size_t)stt.st_size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) { int e = errno; close(fd); _dm_free(&s->allocator, p); return _dm_fstore_errno(s, "read", path, e); }
        if (r == 0) break;  /* files are replaced by rename, never truncated: cannot happen */
        got += (size_t)r;
    }
    close(fd);
    *out = p;
    *out_n = got;
    return DM_OK;
}
/* write-to-temp + rename: readers see the old or the new value, never a partial one. */
_DM_PRIVATE dm_status _dm_fstore_write(dm_store* s, const char* path, const void* a, size_t an,
                                       const void* b, size_t bn) {
    char tmp[4096];
    int fd;
    size_t done = 0, total = an + bn;
    snprintf(tmp, sizeof(tmp), "%s/.tmp.%ld.%lx.%p", _dm_fstore_dir(s), (long)getpid(),
             (unsigned long)pthread_self(), (void*)&done);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return _dm_fstore_errno(s, "create", tmp, errno);
    while (done < total) {
        const unsigned char* src = done < an ? (const unsigned char*)a + done : (const unsigned char*)b + (done - an);
        size_t chunk = done < an ? an - done : total - done;
        ssize_t w = write(fd, src, chunk);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) { int e = errno; close(fd); unlink(tmp); return _dm_fstore_errno(s, "write", tmp, e); }
        done += (size_t)w;
    }
    if (close(fd) != 0) { int e = errno; unlink(tmp); return _dm_fstore_errno(s, "close", tmp, e); }
    if (rename(tmp, path) != 0) { int e = errno; unlink(tmp); return _dm_fstore_errno(s, "rename", path, e); }
    return DM_OK;
}
/* The directory's lock file, flock'ed exclusively (across processes, and across threads since
   each call opens its own file description); polled until the deadline. */
_DM_PRIVATE dm_status _dm_fstore_lock(dm_store* s, int* out_fd) {
    char path[4096];
    int fd, backoff = 1;
    int64_t deadline = _dm_deadline(s->timeout_ms);
    snprintf(path, sizeof(path), "%s/.lock", _dm_fstore_dir(s));
    fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return _dm_fstore_errno(s, "open", path, errno);
    while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno != EWOULDBLOCK && errno != EINTR) {
            int e = errno;
            close(fd);
            return _dm_fstore_errno(s, "flock", path, e);
        }
        if (_dm_now_ms() >= deadline) {
            close(fd);
            return _DM_STORE_FAIL(s, DM_ERR_TIMEOUT, "tcp-store: file store lock %s timed out after %d ms (ETIMEDOUT)",
                                  path, s->timeout_ms);
        }
        _dm_store_sleep_ms(backoff);
        backoff = backoff * 2 > 20 ? 20 : backoff * 2;
    }
    *out_fd = fd;
    return DM_OK;
}
_DM_PRIVATE void _dm_fstore_unlock(int fd) {
    flock(fd, LOCK_UN);
    close(fd);
}
_DM_PRIVATE dm_status _dm_fstore_wait(dm_store* s, const _dm_store_key* k, size_t n, int timeout_ms) {
    int64_t deadline = _dm_deadline(timeout_ms);
    int backoff = 1;
    size_t i = 0;
    for (;;) {
        for (; i < n; i++) {    /* keys once seen are not looked at again */
            char* path = _dm_fstore_path(s, k[i].bytes, k[i].len);
            int r;
            if (!path) return _DM_STORE_FAIL(s, DM_ERR_OUT_OF_MEMORY, "tcp-store: file store wait (out of memory)");
            r = access(path, F_OK);
            if (r != 0 && errno != ENOENT) {
                dm_status st = _dm_fstore_errno(s, "access", path, errno);
                _dm_free(&s->allocator, path);
                return st;
            }
            _dm_free(&s->allocator, path);
            if (r != 0) break;
        }
        if (i == n) return DM_OK;
        if (_dm_now_ms() >= deadline) {
            char list[300];
            return _DM_STORE_FAIL(s, DM_ERR_TIMEOUT, "tcp-store: file store wait for %s timed out after %d ms (ETIMEDOUT)",
                                  _dm_store_keylist(s, k, n, list, sizeof(list)), timeout_ms);
        }
        {
            int64_t left = deadline - _dm_now_ms();
            _dm_store_sleep_ms(left < backoff ? (int)(left > 0 ? left : 1) : backoff);
        }
        backoff = backoff * 2 > 50 ? 50 : backoff * 2;
    }
}
_DM_PRIVATE dm_status _dm_fstore_mkdirs(dm_store* s, const char* dir) {
    char path[4096];
    size_t i, n = strlen(dir);
    if (n == 0 || n >= sizeof(path))
        return _DM_STORE_FAIL(s, DM_ERR_INVALID_ARG, "tcp-store: file store directory \"%s\" is empty or too long", dir);
    memcpy(path, dir, n + 1);
    for (i = 1; i <= n; i++) {
        if (path[i] == '/' || path[i] == 0) {
            char c = path[i];
            path[i] = 0;
            if (mkdir(path, 0755) != 0 && errno != EEXIST) return _dm_fstore_errno(s, "mkdir", path, errno);
            path[i] = c;
        }
    }
    return DM_OK;
}

/* >>store file ops  The file kind's slots: reads and writes of the key's file, under the lock
   where the value read decides the value written. */

/* file:///abs/dir: the directory, made if missing (is_server has no meaning here). */
_DM_PRIVATE dm_status _dm_fstore_open(dm_store* s, const char* url, const dm_store_desc* d, const _dm_store_limits* lim,
                                      bool share_hosted) {
    const char* dir = url + 7;
    size_t n = strlen(dir);
    char* p;
    (void)d; (void)lim; (void)share_hosted;
    if (dir[0] != '/')
        return _DM_STORE_FAIL(s, DM_ERR_INVALID_ARG, "tcp-store: file store url \"%s\" needs an absolute path (file:///abs/dir)",
                              url);
    while (n > 1 && dir[n - 1] == '/') n--;
    p = (char*)_dm_malloc(&s->allocator, n + 1);
    if (!p) return _DM_STORE_FAIL(s, DM_ERR_OUT_OF_MEMORY, "tcp-store: out of memory");
    memcpy(p, dir, n);
    p[n] = 0;
    s->sh->impl = p;
    return _dm_fstore_mkdirs(s, p);
}
_DM_PRIVATE void _dm_fstore_close(_dm_store_shared* sh) { _dm_free(&sh->allocator, sh->impl); }

/* set (append false) or append: the old value and the new bytes, written as one file. */
_DM_PRIVATE dm_status _dm_fstore_put(dm_store* s, const _dm_store_key* k, const void* value, size_t size, bool append) {
    char* path = _dm_fstore_path(s, k->bytes, k->len);
    int lk = -1;
    dm_status st;
    if (!path) return _DM_STORE_FAIL(s, DM_ERR_OUT_OF_MEMORY, "tcp-store: %s (out of memory)", append ? "append" : "set");
    if ((st = _dm_fstore_lock(s, &lk)) == DM_OK) {
        void* old = NULL;
        size_t on = 0;
        if (append) {
            st = _dm_fstore_read(s, path, &old, &on);
            if (st == DM_ERR_NOT_FOUND) st = DM_OK;
        }
        if (st == DM_OK) st = _dm_fstore_write(s, path, old, on, value, size);
        _dm_free(&s->allocator, old);
        _dm_fstore_unlock(lk);
    }
    _dm_free(&s->allocator, path);
    return st;
}
_DM_PRIVATE dm_status _dm_fstore_set(dm_store* s, const _dm_store_key* k, const void* value, size_t size) {
    return _dm_fstore_put(s, k, value, size, false);
}
_DM_PRIVATE dm_status _dm_fstore_append(dm_store* s, const _dm_store_key* k, const void* value, size_t size) {
    return _dm_fstore_put(s, k, value, size, true);
}
_DM_PRIVATE dm_status _dm_fstore_get(dm_store* s, const _dm_store_key* k, void** out, size_t* out_size) {
    char* path = _dm_fstore_path(s, k->bytes, k->len);
    dm_status st;
    if (!path) return _DM_STORE_FAIL(s, DM_ERR_OUT_OF_MEMORY, "tcp-store: get (out of memory)");
    st = _dm_fstore_read(s, path, out, out_size);
    if (st == DM_ERR_NOT_FOUND)  /* deleted between the wait and the read */
        st = _DM_STORE_FAIL(s, DM_ERR_NOT_FOUND, "tcp-store: file store get \"%s%s\": deleted while read (ENOENT)",
                            s->prefix ? s->prefix : "", k->name);
    _dm_free(&s->allocator, path);
    return st;
}
_DM_PRIVATE dm_status _dm_fstore_add(dm_store* s, const _dm_store_key* k, int64_t delta, int64_t* out) {
    char* path = _dm_fstore_path(s, k->bytes, k->len);
    int lk = -1;
    dm_status st;
    if (!path) return _DM_STORE_FAIL(s, DM_ERR_OUT_OF_MEMORY, "tcp-store: add (out of memory)");
    if ((st = _dm_fstore_lock(s, &lk)) == DM_OK) {
        void* old = NULL;
        size_t on = 0;
        int64_t cur = 0;
        st = _dm_fstore_read(s, path, &old, &on);
        if (st == DM_ERR_NOT_FOUND) st = DM_OK;
        else if (st == DM_OK && !_dm_st_parse_i64((const unsigned char*)old, on, &cur))
            st = _DM_STORE_FAIL(s, DM_ERR_INVALID_ARG, "tcp-store: file store add \"%s%s\": the value is not a decimal int64",
                                s->prefix ? s->prefix : "", k->name);
        if (st == DM_OK) {
            char txt[32];
            cur = (int64_t)((uint64_t)cur + (uint64_t)delta);
            snprintf(txt, sizeof(txt), "%lld", (long long)cur);
            st = _dm_fstore_write(s, path, txt, strlen(txt), NULL, 0);
            if (st == DM_OK) *out = cur;
        }
        _dm_free(&s->allocator, old);
        _dm_fstore_unlock(lk);
    }
    _dm_free(&s->allocator, path);
    return st;
}
/* A copy of n bytes into *out (the value compare_set answers). */
_DM_PRIVATE dm_status _dm_fstore_answer(dm_store* s, const void* v, size_t n, void** out, size_t* out_size) {
    *out = _dm_malloc(&s->allocator, n);
    if (!*out) return _DM_STORE_FAIL(s, DM_ERR_OUT_OF_MEMORY, "tcp-store: compare_set (out of memory)");
    if (n) memcpy(*out, v, n);
    *out_size = n;
    return DM_OK;
}
_DM_PRIVATE dm_status _dm_fstore_compare_set(dm_store* s, const _dm_store_key* k, const void* expected,
                                             size_t expected_size, const void* desired, size_t desired_size,
                                             void** out, size_t* out_size) {
    char* path = _dm_fstore_path(s, k->bytes, k->len);
    int lk = -1;
    dm_status st;
    if (!path) return _DM_STORE_FAIL(s, DM_ERR_OUT_OF_MEMORY, "tcp-store: compare_set (out of memory)");
    if ((st = _dm_fstore_lock(s, &lk)) == DM_OK) {
        st = _dm_fstore_read(s, path, out, out_size);
        if (st == DM_ERR_NOT_FOUND) {   /* set only when expected is empty; answers what is held, or expected */
            st = expected_size == 0 ? _dm_fstore_write(s, path, desired, desired_size, NULL, 0) : DM_OK;
            if (st == DM_OK && expected_size == 0) st = _dm_fstore_answer(s, desired, desired_size, out, out_size);
            else if (st == DM_OK) st = _dm_fstore_answer(s, expected, expected_size, out, out_size);
        } else if (st == DM_OK && *out_size == expected_size && (expected_size == 0 || memcmp(*out, expected, expected_size) == 0)) {
            _dm_free(&s->allocator, *out);
            *out = NULL;
            *out_size = 0;
            st = _dm_fstore_write(s, path, desired, desired_size, NULL, 0);
            if (st == DM_OK) st = _dm_fstore_answer(s, desired, desired_size, out, out_size);
        }
        _dm_fstore_unlock(lk);
    }
    _dm_free(&s->allocator, path);
    return st;
}
_DM_PRIVATE dm_status _dm_fstore_check(dm_store* s, const _dm_store_key* k, size_t n, bool* out_all_present) {
    size_t i;
    bool all = true;
    dm_status st = DM_OK;
    for (i = 0; i < n && st == DM_OK && all; i++) {
        char* path = _dm_fstore_path(s, k[i].bytes, k[i].len);
        if (!path) { st = _DM_STORE_FAIL(s, DM_ERR_OUT_OF_MEMORY, "tcp-store: check (out of memory)"); break; }
        if (access(path, F_OK) != 0) {
            if (errno == ENOENT) all = false;
            else st = _dm_fstore_errno(s, "access", path, errno);
        }
        _dm_free(&s->allocator, path);
    }
    if (st == DM_OK) *out_all_present = all;
    return st;
}
_DM_PRIVATE dm_status _dm_fstore_delete(dm_store* s, const _dm_store_key* k, bool* out_deleted) {
    char* path = _dm_fstore_path(s, k->bytes, k->len);
    int lk = -1;
    dm_status st;
    if (!path) return _DM_STORE_FAIL(s, DM_ERR_OUT_OF_MEMORY, "tcp-store: delete (out of memory)");
    if ((st = _dm_fstore_lock(s, &lk)) == DM_OK) {
        if (unlink(path) == 0) *out_deleted = true;
        else if (errno != ENOENT) st = _dm_fstore_errno(s, "unlink", path, errno);
        _dm_fstore_unlock(lk);
    }
    _dm_free(&s->allocator, path);
    return st;
}
_DM_PRIVATE dm_status _dm_fstore_num_keys(dm_store* s, int64_t* out) {
    DIR* dir = opendir(_dm_fstore_dir(s));
    struct dirent* e;
    int64_t n = 0;
    if (!dir) return _dm_fstore_errno(s, "opendir", _dm_fstore_dir(s), errno);
    while ((e = readdir(dir)) != NULL)
        if (e->d_name[0] != '.') n++;   /* key files never start with '.' */
    closedir(dir);
    *out = n;
    return DM_OK;
}

static const _dm_store_ops _dm_fstore_ops = {
    "file",                     /* name */
    _dm_fstore_open,            /* open: the directory, made if missing */
    _dm_fstore_close,           /* close: its name */
    _dm_fstore_set,             /* set: write-to-temp + rename */
    _dm_fstore_append,          /* append: read, then write both, under the lock */
    _dm_fstore_get,             /* get: read the file */
    _dm_fstore_add,             /* add: read, parse, write, under the lock */
    _dm_fstore_compare_set,     /* compare_set: read, compare, write, under the lock */
    _dm_fstore_wait,            /* wait: poll the files' existence */
    _dm_fstore_check,           /* check: every file exists */
    _dm_fstore_delete,          /* delete_key: unlink under the lock */
    _dm_fstore_num_keys,        /* num_keys: the directory's key files */
    NULL,                       /* multi_set: set key by key */
    NULL,                       /* multi_get: get key by key */
    NULL,                       /* port: 0 */
    NULL                        /* ensure: nothing to connect */
};

/* ============================================================================================ */
/* >>store kinds  A url's scheme chooses the kind. A new kind adds its line here; forms is what
   the message for a url no kind takes lists for it. */
static const struct { const char* scheme; const char* forms; const _dm_store_ops* ops; } _dm_store_kinds[] = {
    { "tcp://", "tcp://host:port, tcp://[v6]:port", &_dm_stcli_ops },
    { "file://", "file:///dir", &_dm_fstore_ops },
};
enum { _DM_STORE_NKINDS = (int)(sizeof(_dm_store_kinds) / sizeof(_dm_store_kinds[0])) };

_DM_PRIVATE const _dm_store_ops* _dm_store_kind_of(const char* url) {
    int i;
    for (i = 0; i < _DM_STORE_NKINDS; i++)
        if (strncmp(url, _dm_store_kinds[i].scheme, strlen(_dm_store_kinds[i].scheme)) == 0) return _dm_store_kinds[i].ops;
    return NULL;
}
_DM_PRIVATE dm_status _dm_store_bad_url(dm_store* s, const char* url) {
    char forms[200];
    size_t used = 0;
    int i;
    forms[0] = 0;
    for (i = 0; i < _DM_STORE_NKINDS && used < sizeof(forms); i++) {
        int w = snprintf(forms + used, sizeof(forms) - used, "%s%s",
                         i == 0 ? "" : i == _DM_STORE_NKINDS - 1 ? " or " : ", ", _dm_store_kinds[i].forms);
        if (w < 0) break;
        used += (size_t)w;
    }
    return _DM_STORE_FAIL(s, DM_ERR_INVALID_ARG, "tcp-store: bad store url \"%s\" (expected %s)", url, forms);
}

/* ============================================================================================ */
/* >>store create  The desc and the environment resolved (url, timeout, token, the server's
   bounds), then the kind's open. */

/* A size in bytes from the desc, else its variable (>>config registry, distmesh.h: bytes with
   optional K/M/G suffixes), else dflt (for a variable whose registry default is none). */
_DM_PRIVATE dm_status _dm_store_size_opt(size_t desc_v, _dm_cfg_id id, size_t dflt, size_t* out,
                                         char* err, size_t cap) {
    uint64_t v = 0;
    if (desc_v) { *out = desc_v; return DM_OK; }
    if (_dm_cfg_bytes(id, &v, err, cap) != DM_OK) return DM_ERR_ENV;
    *out = v ? (size_t)v : dflt;
    return DM_OK;
}
/* The server's bounds, the token and (tcp) whether connections encrypt, from the desc and the
   environment. */
_DM_PRIVATE dm_status _dm_store_limits_resolve(const dm_store_desc* d, bool tcp, _dm_store_limits* L, char* err,
                                               size_t cap) {
    const char* tok = d->token;
    int stall = d->stall_ms;
    dm_status st;
    memset(L, 0, sizeof(*L));
    if (!tok && _dm_cfg_str(_DM_CFG_TOKEN, &tok, err, cap) != DM_OK) return DM_ERR_ENV;
    if (tok && strlen(tok) > _DM_ST_TOKEN_MAX) {
        snprintf(err, cap, "token longer than %d bytes", _DM_ST_TOKEN_MAX);
        return DM_ERR_INVALID_ARG;
    }
    if (tok) { L->token_len = strlen(tok); memcpy(L->token, tok, L->token_len); }
    if (tcp && (st = _dm_st_parse_encrypt("tcp-store", d->encrypt, tok, &L->encrypt, err, cap)) != DM_OK) return st;
    if (_dm_store_size_opt(d->max_value, _DM_CFG_STORE_MAX_VALUE, DM_STORE_MAX_VALUE, &L->max_value, err, cap) ||
        _dm_store_size_opt(d->max_conn_bytes, _DM_CFG_STORE_MAX_CONN, 2 * L->max_value + ((size_t)1 << 20),
                           &L->max_conn, err, cap) ||
        _dm_store_size_opt(d->max_total_bytes, _DM_CFG_STORE_MAX_TOTAL, _DM_ST_MAX_TOTAL, &L->max_total, err, cap) ||
        (stall <= 0 && _dm_cfg_int(_DM_CFG_STORE_STALL_MS, &stall, err, cap) != DM_OK))
        return DM_ERR_ENV;
    L->stall_ms = stall;
    return DM_OK;
}

/* share_hosted: a server this process already hosts on the url's port is shared (the TCP
   backend's second world on one url); else that is EADDRINUSE, explained. lazy: a tcp store
   connects at its first request, not here (it still hosts the server now, with is_server): a
   rank whose host's leader meets the store for it (distmesh_tcp.h >>tcp relay) may never need a
   connection of its own. err (may be NULL) gets the failure's message, which also went to the
   desc's logger. */
_DM_PRIVATE dm_status _dm_store_create_opt(const dm_store_desc* desc, bool share_hosted, bool lazy, dm_store** out,
                                           char* err, size_t cap) {
    _DM_ZERO(dm_store_desc, d);
    dm_store* s;
    _dm_store_shared* sh;
    char url[600], msg[DM_LAST_ERROR_SIZE];
    const char* u;
    dm_status st;
    _dm_store_limits lim;
    if (err && cap) err[0] = 0;
    if (!out) return DM_ERR_INVALID_ARG;
    *out = NULL;
    if (!err || !cap) { err = msg; cap = sizeof(msg); }
    if (desc) d = *desc;
    if (!_dm_allocator_valid(&d.allocator))
        return _DM_REPORT(&d.logger, err, cap, DM_ERR_INVALID_ARG, "tcp-store: allocator needs both functions or neither");
    u = d.url;
    if (!u && _dm_cfg_str(_DM_CFG_STORE, &u, msg, sizeof(msg)) != DM_OK)
        return _DM_REPORT(&d.logger, err, cap, DM_ERR_ENV, "tcp-store: %s", msg);
    if (u && *u) {
        snprintf(url, sizeof(url), "%s", u);
    } else {
        const char* ma = getenv("MASTER_ADDR");
        const char* mp = getenv("MASTER_PORT");
        if (!ma || !*ma || !mp || !*mp)
            return _DM_REPORT(&d.logger, err, cap, DM_ERR_ENV,
                              "tcp-store: no store url (set desc.url, DISTMESH_STORE, or MASTER_ADDR and MASTER_PORT)");
        if (strchr(ma, ':') && ma[0] != '[') snprintf(url, sizeof(url), "tcp://[%s]:%s", ma, mp);
        else snprintf(url, sizeof(url), "tcp://%s:%s", ma, mp);
    }
    s = (dm_store*)_dm_calloc(&d.allocator, sizeof(*s));
    sh = (_dm_store_shared*)_dm_calloc(&d.allocator, sizeof(*sh));
    if (!s || !sh) {
        _dm_free(&d.allocator, s);
        _dm_free(&d.allocator, sh);
        return _DM_REPORT(&d.logger, err, cap, DM_ERR_OUT_OF_MEMORY, "tcp-store: out of memory");
    }
    s->sh = sh;
    s->logger = d.logger;
    s->allocator = d.allocator;
    sh->allocator = d.allocator;
    sh->refs = 1;
    sh->lazy = lazy;
    pthread_mutex_init(&sh->mu, NULL);
    {
        char what[200];
        if ((st = _dm_cfg_timeout(d.timeout_ms, &s->timeout_ms, what, sizeof(what))) != DM_OK ||
            (st = _dm_store_limits_resolve(&d, strncmp(url, "tcp://", 6) == 0, &lim, what, sizeof(what))) != DM_OK) {
            _DM_REPORT(&d.logger, err, cap, st, "%s%s", strncmp(what, "tcp-store: ", 11) ? "tcp-store: " : "", what);
            goto fail;
        }
    }
    if (d.prefix && *d.prefix) {
        s->prefix_len = strlen(d.prefix);
        s->prefix = (char*)_dm_malloc(&s->allocator, s->prefix_len + 1);
        if (!s->prefix) { st = _DM_REPORT(&d.logger, err, cap, DM_ERR_OUT_OF_MEMORY, "tcp-store: out of memory"); goto fail; }
        memcpy(s->prefix, d.prefix, s->prefix_len + 1);
    }
    sh->ops = _dm_store_kind_of(url);
    st = sh->ops ? sh->ops->open(s, url, &d, &lim, share_hosted) : _dm_store_bad_url(s, url);
    if (st != DM_OK) {
        snprintf(err, cap, "%s", s->last_error);
        goto fail;
    }
    s->last_error[0] = 0;
    *out = s;
    return DM_OK;
fail:
    _dm_store_shared_release(s->sh);
    _dm_store_free_obj(s);
    return st;
}
_DM_PRIVATE dm_status _dm_store_create_err(const dm_store_desc* desc, bool share_hosted, dm_store** out, char* err,
                                           size_t cap) {
    return _dm_store_create_opt(desc, share_hosted, false, out, err, cap);
}
_DM_PRIVATE dm_status _dm_store_create_ex(const dm_store_desc* desc, bool share_hosted, dm_store** out) {
    return _dm_store_create_opt(desc, share_hosted, false, out, NULL, 0);
}

/* ============================================================================================ */
/* >>store public  Every dm_store_* operation does the common work here once -- argument checks,
   the lock, the last error, a broken connection, keys checked and prefixed -- and then calls
   its slot of the kind's table (>>store object). */

/* A create like the collectives' (distmesh.h >>log): no logger -> the default one; a failure's
   message is this thread's dm_store_last_error(NULL) and dm_last_error(NULL). */
DM_API_IMPL dm_status dm_store_create(const dm_store_desc* desc, dm_store** out) {
    _DM_ZERO(dm_store_desc, d);
    if (desc) d = *desc;
    d.logger = _dm_logger_or_default(&d.logger, -1);
    _dm_create_begin();
    return _dm_create_end(_dm_store_create_ex(desc ? &d : NULL, false, out), desc && desc->logger.func);
}

DM_API_IMPL dm_status dm_store_clone_prefixed(dm_store* parent, const char* prefix, dm_store** out) {
    dm_store* s;
    size_t pl = prefix ? strlen(prefix) : 0;
    if (!out) return DM_ERR_INVALID_ARG;
    *out = NULL;
    if (!parent) return DM_ERR_INVALID_ARG;
    s = (dm_store*)_dm_calloc(&parent->allocator, sizeof(*s));
    if (s && parent->prefix_len + pl) {
        s->prefix = (char*)_dm_malloc(&parent->allocator, parent->prefix_len + pl + 1);
        if (!s->prefix) { _dm_free(&parent->allocator, s); s = NULL; }
        else {
            if (parent->prefix_len) memcpy(s->prefix, parent->prefix, parent->prefix_len);
            if (pl) memcpy(s->prefix + parent->prefix_len, prefix, pl);
            s->prefix[parent->prefix_len + pl] = 0;
            s->prefix_len = parent->prefix_len + pl;
        }
    }
    if (!s) return _DM_STORE_FAIL(parent, DM_ERR_OUT_OF_MEMORY, "tcp-store: clone (out of memory)");
    s->sh = parent->sh;
    s->timeout_ms = parent->timeout_ms;
    s->logger = parent->logger;
    s->allocator = parent->allocator;
    pthread_mutex_lock(&s->sh->mu);
    s->sh->refs++;
    pthread_mutex_unlock(&s->sh->mu);
    *out = s;
    return DM_OK;
}

DM_API_IMPL void dm_store_destroy(dm_store* s) {
    if (!s) return;
    _dm_store_shared_release(s->sh);
    _dm_store_free_obj(s);
}

DM_API_IMPL const char* dm_store_last_error(const dm_store* s) {
    return s ? s->last_error : _dm_tls_create.status != DM_OK ? _dm_tls_create.msg : "";
}
DM_API_IMPL int dm_store_port(const dm_store* s) {
    return s && s->sh->ops->port ? s->sh->ops->port(s->sh) : 0;
}
DM_API_IMPL void dm_store_free(dm_store* s, void* value) {
    if (value) _dm_free(s ? &s->allocator : NULL, value);
}

/* Every operation starts here (s not NULL): the lock, the last error cleared, a broken
   connection refused. DM_OK: the caller holds the lock and ends with _dm_store_leave. */
_DM_PRIVATE dm_status _dm_store_enter(dm_store* s) {
    dm_status st;
    pthread_mutex_lock(&s->sh->mu);
    s->last_error[0] = 0;
    if (!s->sh->broken && s->sh->lazy && s->sh->ops->ensure && (st = s->sh->ops->ensure(s)) != DM_OK) {
        pthread_mutex_unlock(&s->sh->mu);
        return st;
    }
    if (!s->sh->broken) return DM_OK;
    st = _DM_STORE_FAIL(s, DM_ERR_PEER_LOST, "tcp-store: connection to %s is unusable after an earlier failure (%s)",
                        s->sh->where, s->sh->broken_why);
    pthread_mutex_unlock(&s->sh->mu);
    return st;
}
_DM_PRIVATE dm_status _dm_store_leave(dm_store* s, dm_status st) {
    pthread_mutex_unlock(&s->sh->mu);
    return st;
}
/* A slot the kind does not have. */
_DM_PRIVATE dm_status _dm_store_missing(dm_store* s, const char* what) {
    return _DM_STORE_FAIL(s, DM_ERR_UNSUPPORTED, "tcp-store: %s: the %s store has no such operation", what,
                          s->sh->ops->name);
}

_DM_PRIVATE dm_status _dm_store_bad_key(dm_store* s, const char* what, const char* key) {
    if (!key) return _DM_STORE_FAIL(s, DM_ERR_INVALID_ARG, "tcp-store: %s: key is NULL", what);
    if (s->prefix_len + strlen(key) > DM_STORE_MAX_KEY)
        return _DM_STORE_FAIL(s, DM_ERR_INVALID_ARG, "tcp-store: %s: key longer than DM_STORE_MAX_KEY (%d bytes)",
                              what, (int)DM_STORE_MAX_KEY);
    return _DM_STORE_FAIL(s, DM_ERR_OUT_OF_MEMORY, "tcp-store: %s (out of memory)", what);
}
/* prefix + key into k (freed with _dm_store_key_free); a NULL, too long or unallocatable key
   fails with the message. */
_DM_PRIVATE dm_status _dm_store_key_make(dm_store* s, const char* what, const char* key, _dm_store_key* k) {
    size_t kl;
    k->bytes = NULL;
    k->len = 0;
    k->name = key;
    if (!key) return _dm_store_bad_key(s, what, key);
    kl = strlen(key);
    if (kl > DM_STORE_MAX_KEY || s->prefix_len + kl > DM_STORE_MAX_KEY) return _dm_store_bad_key(s, what, key);
    k->bytes = (unsigned char*)_dm_malloc(&s->allocator, s->prefix_len + kl + 1);
    if (!k->bytes) return _dm_store_bad_key(s, what, key);
    if (s->prefix_len) memcpy(k->bytes, s->prefix, s->prefix_len);
    memcpy(k->bytes + s->prefix_len, key, kl + 1);
    k->len = s->prefix_len + kl;
    return DM_OK;
}
_DM_PRIVATE void _dm_store_key_free(dm_store* s, _dm_store_key* k) { _dm_free(&s->allocator, k->bytes); }
/* n keys made into *out (freed with _dm_store_keys_free). */
_DM_PRIVATE dm_status _dm_store_keys(dm_store* s, const char* what, const char* const* keys, size_t n,
                                     _dm_store_key** out) {
    _dm_store_key* k;
    size_t i;
    *out = NULL;
    if (n && !keys) return _DM_STORE_FAIL(s, DM_ERR_INVALID_ARG, "tcp-store: %s: keys is NULL", what);
    if (n > DM_STORE_MAX_KEYS)
        return _DM_STORE_FAIL(s, DM_ERR_INVALID_ARG, "tcp-store: %s: %zu keys (above DM_STORE_MAX_KEYS)", what, n);
    k = (_dm_store_key*)_dm_calloc(&s->allocator, (n ? n : 1) * sizeof(*k));
    if (!k) return _DM_STORE_FAIL(s, DM_ERR_OUT_OF_MEMORY, "tcp-store: %s (out of memory)", what);
    for (i = 0; i < n; i++) {
        dm_status st = _dm_store_key_make(s, what, keys[i], &k[i]);
        if (st != DM_OK) {
            size_t j;
            for (j = 0; j < i; j++) _dm_store_key_free(s, &k[j]);
            _dm_free(&s->allocator, k);
            return st;
        }
    }
    *out = k;
    return DM_OK;
}
_DM_PRIVATE void _dm_store_keys_free(dm_store* s, _dm_store_key* k, size_t n) {
    size_t i;
    if (k) for (i = 0; i < n; i++) _dm_store_key_free(s, &k[i]);
    _dm_free(&s->allocator, k);
}

/* The slots that other operations are made of. */
_DM_PRIVATE dm_status _dm_store_wait_keys(dm_store* s, const _dm_store_key* k, size_t n, int timeout_ms) {
    return s->sh->ops->wait ? s->sh->ops->wait(s, k, n, timeout_ms) : _dm_store_missing(s, "wait");
}
_DM_PRIVATE dm_status _dm_store_get_key(dm_store* s, const _dm_store_key* k, void** out, size_t* out_size) {
    return s->sh->ops->get ? s->sh->ops->get(s, k, out, out_size) : _dm_store_missing(s, "get");
}
_DM_PRIVATE dm_status _dm_store_set_key(dm_store* s, const _dm_store_key* k, const void* value, size_t size,
                                        bool append) {
    const _dm_store_ops* ops = s->sh->ops;
    if (append) return ops->append ? ops->append(s, k, value, size) : _dm_store_missing(s, "append");
    return ops->set ? ops->set(s, k, value, size) : _dm_store_missing(s, "set");
}

/* set and append: the value's checks, the key, the slot. */
_DM_PRIVATE dm_status _dm_store_put(dm_store* s, const char* key, const void* value, size_t size, bool append) {
    const char* what = append ? "append" : "set";
    _dm_store_key k;
    dm_status st;
    if (size && !value) return _DM_STORE_FAIL(s, DM_ERR_INVALID_ARG, "tcp-store: %s: value is NULL", what);
    if (size > DM_STORE_MAX_VALUE)
        return _DM_STORE_FAIL(s, DM_ERR_INVALID_ARG, "tcp-store: %s: value of %zu bytes is above DM_STORE_MAX_VALUE",
                              what, size);
    if ((st = _dm_store_key_make(s, what, key, &k)) != DM_OK) return st;
    st = _dm_store_set_key(s, &k, value, size, append);
    _dm_store_key_free(s, &k);
    return st;
}
DM_API_IMPL dm_status dm_store_set(dm_store* s, const char* key, const void* value, size_t size) {
    dm_status st;
    if (!s) return DM_ERR_INVALID_ARG;
    if ((st = _dm_store_enter(s)) != DM_OK) return st;
    return _dm_store_leave(s, _dm_store_put(s, key, value, size, false));
}
DM_API_IMPL dm_status dm_store_append(dm_store* s, const char* key, const void* value, size_t size) {
    dm_status st;
    if (!s) return DM_ERR_INVALID_ARG;
    if ((st = _dm_store_enter(s)) != DM_OK) return st;
    return _dm_store_leave(s, _dm_store_put(s, key, value, size, true));
}

DM_API_IMPL dm_status dm_store_wait(dm_store* s, const char* const* keys, size_t nkeys, int timeout_ms) {
    dm_status st;
    _dm_store_key* k;
    if (!s) return DM_ERR_INVALID_ARG;
    if ((st = _dm_store_enter(s)) != DM_OK) return st;
    if ((st = _dm_store_keys(s, "wait", keys, nkeys, &k)) == DM_OK) {
        st = _dm_store_wait_keys(s, k, nkeys, timeout_ms ? timeout_ms : s->timeout_ms);
        _dm_store_keys_free(s, k, nkeys);
    }
    return _dm_store_leave(s, st);
}

DM_API_IMPL dm_status dm_store_get(dm_store* s, const char* key, void** out_value, size_t* out_size) {
    dm_status st;
    _dm_store_key k;
    if (out_value) *out_value = NULL;
    if (out_size) *out_size = 0;
    if (!s) return DM_ERR_INVALID_ARG;
    if ((st = _dm_store_enter(s)) != DM_OK) return st;
    if (!out_value || !out_size) st = _DM_STORE_FAIL(s, DM_ERR_INVALID_ARG, "tcp-store: get: out_value or out_size is NULL");
    else if ((st = _dm_store_key_make(s, "get", key, &k)) == DM_OK) {
        st = _dm_store_wait_keys(s, &k, 1, s->timeout_ms);
        if (st == DM_OK) st = _dm_store_get_key(s, &k, out_value, out_size);
        _dm_store_key_free(s, &k);
    }
    return _dm_store_leave(s, st);
}

DM_API_IMPL dm_status dm_store_multi_get(dm_store* s, const char* const* keys, size_t n, void** out_values,
                                         size_t* out_sizes) {
    dm_status st;
    _dm_store_key* k;
    size_t i;
    if (out_values) for (i = 0; i < n; i++) out_values[i] = NULL;
    if (out_sizes) for (i = 0; i < n; i++) out_sizes[i] = 0;
    if (!s) return DM_ERR_INVALID_ARG;
    if ((st = _dm_store_enter(s)) != DM_OK) return st;
    if (n && (!out_values || !out_sizes))
        st = _DM_STORE_FAIL(s, DM_ERR_INVALID_ARG, "tcp-store: multi_get: out_values or out_sizes is NULL");
    else if ((st = _dm_store_keys(s, "multi_get", keys, n, &k)) == DM_OK) {
        st = _dm_store_wait_keys(s, k, n, s->timeout_ms);
        if (st == DM_OK && s->sh->ops->multi_get) st = s->sh->ops->multi_get(s, k, n, out_values, out_sizes);
        else for (i = 0; i < n && st == DM_OK; i++) st = _dm_store_get_key(s, &k[i], &out_values[i], &out_sizes[i]);
        if (st != DM_OK)
            for (i = 0; i < n; i++) { _dm_free(&s->allocator, out_values[i]); out_values[i] = NULL; out_sizes[i] = 0; }
        _dm_store_keys_free(s, k, n);
    }
    return _dm_store_leave(s, st);
}

DM_API_IMPL dm_status dm_store_multi_set(dm_store* s, const char* const* keys, const void* const* values,
                                         const size_t* sizes, size_t n) {
    dm_status st;
    _dm_store_key* k;
    size_t i;
    if (!s) return DM_ERR_INVALID_ARG;
    if ((st = _dm_store_enter(s)) != DM_OK) return st;
    if (n && (!values || !sizes))
        return _dm_store_leave(s, _DM_STORE_FAIL(s, DM_ERR_INVALID_ARG, "tcp-store: multi_set: values or sizes is NULL"));
    for (i = 0; i < n; i++)
        if ((sizes[i] && !values[i]) || sizes[i] > DM_STORE_MAX_VALUE)
            return _dm_store_leave(s, _DM_STORE_FAIL(s, DM_ERR_INVALID_ARG,
                                                     "tcp-store: multi_set: value %zu is NULL or above DM_STORE_MAX_VALUE", i));
    if ((st = _dm_store_keys(s, "multi_set", keys, n, &k)) == DM_OK) {
        if (s->sh->ops->multi_set) st = s->sh->ops->multi_set(s, k, values, sizes, n);
        else for (i = 0; i < n && st == DM_OK; i++) st = _dm_store_set_key(s, &k[i], values[i], sizes[i], false);
        _dm_store_keys_free(s, k, n);
    }
    return _dm_store_leave(s, st);
}

DM_API_IMPL dm_status dm_store_add(dm_store* s, const char* key, int64_t delta, int64_t* out) {
    dm_status st;
    _dm_store_key k;
    int64_t v = 0;
    if (!s) return DM_ERR_INVALID_ARG;
    if ((st = _dm_store_enter(s)) != DM_OK) return st;
    if ((st = _dm_store_key_make(s, "add", key, &k)) == DM_OK) {
        st = s->sh->ops->add ? s->sh->ops->add(s, &k, delta, &v) : _dm_store_missing(s, "add");
        _dm_store_key_free(s, &k);
        if (st == DM_OK && out) *out = v;
    }
    return _dm_store_leave(s, st);
}

DM_API_IMPL dm_status dm_store_compare_set(dm_store* s, const char* key, const void* expected,
                                           size_t expected_size, const void* desired, size_t desired_size,
                                           void** out_value, size_t* out_size) {
    dm_status st;
    _dm_store_key k;
    void* got = NULL;
    size_t gn = 0;
    if (out_value) *out_value = NULL;
    if (out_size) *out_size = 0;
    if (!s) return DM_ERR_INVALID_ARG;
    if ((st = _dm_store_enter(s)) != DM_OK) return st;
    if ((expected_size && !expected) || (desired_size && !desired) || (!out_value) != (!out_size) ||
        expected_size > DM_STORE_MAX_VALUE || desired_size > DM_STORE_MAX_VALUE)
        return _dm_store_leave(s, _DM_STORE_FAIL(s, DM_ERR_INVALID_ARG,
                                                 "tcp-store: compare_set: NULL value with a size, out_value/out_size not "
                                                 "both set, or a value above DM_STORE_MAX_VALUE"));
    if ((st = _dm_store_key_make(s, "compare_set", key, &k)) == DM_OK) {
        st = s->sh->ops->compare_set ? s->sh->ops->compare_set(s, &k, expected, expected_size, desired, desired_size,
                                                               &got, &gn)
                                     : _dm_store_missing(s, "compare_set");
        _dm_store_key_free(s, &k);
        if (st == DM_OK && out_value) { *out_value = got; *out_size = gn; got = NULL; }
        _dm_free(&s->allocator, got);
    }
    return _dm_store_leave(s, st);
}

DM_API_IMPL dm_status dm_store_delete(dm_store* s, const char* key, bool* out_deleted) {
    dm_status st;
    _dm_store_key k;
    bool deleted = false;
    if (!s) return DM_ERR_INVALID_ARG;
    if ((st = _dm_store_enter(s)) != DM_OK) return st;
    if ((st = _dm_store_key_make(s, "delete", key, &k)) == DM_OK) {
        st = s->sh->ops->delete_key ? s->sh->ops->delete_key(s, &k, &deleted) : _dm_store_missing(s, "delete");
        _dm_store_key_free(s, &k);
        if (st == DM_OK && out_deleted) *out_deleted = deleted;
    }
    return _dm_store_leave(s, st);
}

DM_API_IMPL dm_status dm_store_check(dm_store* s, const char* const* keys, size_t nkeys, bool* out_all_present) {
    dm_status st;
    _dm_store_key* k;
    bool all = true;
    if (!s) return DM_ERR_INVALID_ARG;
    if ((st = _dm_store_enter(s)) != DM_OK) return st;
    if ((st = _dm_store_keys(s, "check", keys, nkeys, &k)) == DM_OK) {
        st = s->sh->ops->check ? s->sh->ops->check(s, k, nkeys, &all) : _dm_store_missing(s, "check");
        _dm_store_keys_free(s, k, nkeys);
        if (st == DM_OK && out_all_present) *out_all_present = all;
    }
    return _dm_store_leave(s, st);
}

DM_API_IMPL dm_status dm_store_num_keys(dm_store* s, int64_t* out) {
    dm_status st;
    int64_t n = 0;
    if (!s) return DM_ERR_INVALID_ARG;
    if ((st = _dm_store_enter(s)) != DM_OK) return st;
    st = s->sh->ops->num_keys ? s->sh->ops->num_keys(s, &n) : _dm_store_missing(s, "num_keys");
    if (st == DM_OK && out) *out = n;
    return _dm_store_leave(s, st);
}

/* >>store for backends  What the TCP and NCCL backends ask of a store beyond the public API. */
/* A world's key prefix under torchrun: "<prefix>attempt/<N>/" from TORCHELASTIC_RESTART_COUNT, as
   torch puts its own keys on the agent's store under "/worker/attempt_N". A store outlives an
   attempt (the agent's, a file store), and an attempt that died during create leaves keys there
   (a generation count and addresses, a unique id) that the next one must never read. Without the
   variable, prefix as it is; a value that is no count is DM_ERR_ENV with err naming it. */
_DM_PRIVATE dm_status _dm_store_attempt_prefix(const char* prefix, char* out, size_t cap, char* err, size_t err_cap) {
    const char* v = getenv("TORCHELASTIC_RESTART_COUNT");
    char* end = NULL;
    long n;
    if (!v || !*v) {
        snprintf(out, cap, "%s", prefix);
        return DM_OK;
    }
    errno = 0;
    n = strtol(v, &end, 10);
    if (errno || *end || n < 0 || n > INT_MAX || v[0] < '0' || v[0] > '9') {
        snprintf(err, err_cap, "TORCHELASTIC_RESTART_COUNT=\"%.40s\" is not a restart count (0, 1, ...)", v);
        return DM_ERR_ENV;
    }
    snprintf(out, cap, "%sattempt/%ld/", prefix, n);
    return DM_OK;
}

/* The server's address ("host:port") for a tcp store, NULL for another kind: what names the
   rendezvous of a host's ranks (distmesh_tcp.h >>tcp relay). */
_DM_PRIVATE const char* _dm_store_where(const dm_store* s) {
    return s && s->sh->ops == &_dm_stcli_ops ? s->sh->where : NULL;
}
/* Closes a tcp store's connection until its next request, which connects again (as a lazy
   store does): a group holds no store connection once it is built, so the store host holds
   none for it either. Skipped while another thread is in a request on the same connection
   (it stays until the next build), and on a broken store (which stays broken). */
_DM_PRIVATE void _dm_store_idle(dm_store* s) {
    _dm_stcli* c;
    if (!s || s->sh->ops != &_dm_stcli_ops || pthread_mutex_trylock(&s->sh->mu) != 0) return;
    c = _dm_stcli_of(s);
    if (!s->sh->broken && c->fd >= 0) {
        close(c->fd);
        c->fd = -1;
        s->sh->lazy = true;
    }
    pthread_mutex_unlock(&s->sh->mu);
}
/* Whether each of n keys exists now (present[i]), in one round trip on a tcp store (n CHECKs
   sent together, n answers read), key by key on another kind: which ranks are still missing,
   at any world size, costs the store one burst, not n round trips. */
_DM_PRIVATE dm_status _dm_store_present(dm_store* s, const char* const* keys, size_t n, bool* present) {
    _dm_store_key* k = NULL;
    dm_status st;
    size_t i;
    if (!s) return DM_ERR_INVALID_ARG;
    if ((st = _dm_store_enter(s)) != DM_OK) return st;
    if ((st = _dm_store_keys(s, "check", keys, n, &k)) != DM_OK) return _dm_store_leave(s, st);
    if (s->sh->ops == &_dm_stcli_ops && n > 0) {
        _dm_stbuf b;
        unsigned char* r = (unsigned char*)_dm_malloc(&s->allocator, n);
        _dm_stcli_request(&b, s, _DM_STQ_CHECK);
        for (i = 0; i < n; i++) {
            if (i) _dm_stbuf_u8(&b, _dm_stcli_of(s)->proto == _DM_ST_PROTO_1 ? _dm_st_v1_from_v2[_DM_STQ_CHECK]
                                                                              : (unsigned)_DM_STQ_CHECK);
            _dm_stbuf_u64(&b, 1);
            _dm_stbuf_str(&b, k[i].bytes, k[i].len);
        }
        st = r ? _dm_stcli_send(s, &b, "check")
               : _DM_STORE_FAIL(s, DM_ERR_OUT_OF_MEMORY, "tcp-store: check (out of memory)");
        _dm_stbuf_free(&b);
        if (st == DM_OK) st = _dm_stcli_recv(s, r, n, _dm_deadline(s->timeout_ms), "check");
        for (i = 0; st == DM_OK && i < n; i++) {
            if (r[i] != _DM_ST_READY && r[i] != _DM_ST_NOT_READY) st = _dm_stcli_bad_reply(s, "check", r[i]);
            else present[i] = r[i] == _DM_ST_READY;
        }
        _dm_free(&s->allocator, r);
    } else {
        for (i = 0; st == DM_OK && i < n; i++)
            st = s->sh->ops->check ? s->sh->ops->check(s, &k[i], 1, &present[i]) : _dm_store_missing(s, "check");
    }
    _dm_store_keys_free(s, k, n);
    return _dm_store_leave(s, st);
}
/* Whether the store's server has refused clients for lack of descriptors: DM_OK with why in out
   ("" when not), else the failed request's status. One CHECK of _DM_ST_REFUSED_KEY, outside
   the store's prefix (a GET as well when it is there). */
_DM_PRIVATE dm_status _dm_store_refusal(dm_store* s, char* out, size_t cap) {
    static const char name[] = _DM_ST_REFUSED_KEY;
    _dm_store_key k;
    bool there = false;
    void* v = NULL;
    size_t n = 0;
    dm_status st;
    out[0] = 0;
    if (!s || !s->sh->ops->check || !s->sh->ops->get) return DM_OK;
    if ((st = _dm_store_enter(s)) != DM_OK) return st;
    k.bytes = (unsigned char*)(uintptr_t)name;  /* the slots only read it */
    k.len = sizeof(name) - 1;
    k.name = name;
    st = s->sh->ops->check(s, &k, 1, &there);
    if (st == DM_OK && there && (st = s->sh->ops->get(s, &k, &v, &n)) == DM_OK) {
        size_t m = n < cap - 1 ? n : cap - 1;
        memcpy(out, v, m);
        out[m] = 0;
        _dm_free(&s->allocator, v);
    }
    return _dm_store_leave(s, st);
}

#undef _DM_SRV_KEY
#undef _DM_SRV_VAL

_DM_COLD_END
#endif /* DISTMESH_IMPLEMENTATION && !DISTMESH_STORE_IMPL_INCLUDED */

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
