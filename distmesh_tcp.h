/* distmesh_tcp.h -- the TCP ring backend of distmesh, on libuv. MIT license at end of file.

   Do not include this file directly: define DISTMESH_TCP (as a -D flag, in every TU) and include
   distmesh.h, which includes this header last. Link libuv (pkg-config libuv).

   WHAT IT IS
   Gloo-style collectives between processes and hosts over TCP. Ranks meet through a key-value
   store (c10d TCPStore protocol or a shared directory, see the store section), each rank
   listens on an ephemeral port of the chosen interface, publishes "host:port", and the ranks
   connect as a full mesh (rank j connects to every lower rank; a hello with magic, version,
   rank and an optional token digest is answered by an ack). Algorithms:
       all_reduce      <= 64 KiB: recursive doubling (non-power-of-two worlds fold the extra
                       ranks in and out); larger: ring reduce-scatter + all-gather, chunked and
                       pipelined (Gloo's allreduce_ring_chunked) -- received chunks are reduced
                       while the next ones are in flight; extra memory is one chunk
       all_gather      ring (also straight into all_gather_to_list's buffers)
       reduce_scatter  ring (in place: one extra block of recv_count elements)
       broadcast       pipelined chain from any root, forwarding bytes as they arrive
       barrier         dissemination
       split           all_gather of (color, key), then a new TCP collective over the members
                       through the same store under "<prefix>split<seq>/<color>/"
   MEAN is SUM followed by dm_divide_local on the reduced block before it is gathered.

   QUICK START (every rank; RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT as torchrun sets them)

       dm_collective* c = NULL;
       dm_tcp_desc d = {0};                     // everything from the environment
       if (dm_tcp_create(&d, &c) != DM_OK) { ... }   // or dm_init(NULL, &c)
       dm_all_reduce(c, NULL, grads, n, DM_FLOAT32, DM_MEAN);
       dm_destroy(c);

   ENVIRONMENT
       DISTMESH_STORE            tcp://host:port or file:///dir (else tcp://MASTER_ADDR:MASTER_PORT)
       TORCHELASTIC_USE_AGENT_STORE=True   the store already runs; rank 0 does not host it
       DISTMESH_SOCKET_IFNAME, GLOO_SOCKET_IFNAME   interface: "eth0", "eth" (prefix), "=eth0"
                                 (exact), "^lo,docker" (anything but these prefixes)
       DISTMESH_TOKEN            shared secret: peers without it are refused (DM_ERR_REFUSED)
       DISTMESH_TIMEOUT          seconds; the deadline of every blocking call

   FAILURES
   Every wait has a deadline (base.timeout_ms, dm_set_timeout). A peer's EOF or reset gives
   DM_ERR_PEER_LOST and shuts this rank's connections down so the failure reaches every rank
   quickly; a timeout names the op, its sequence number and the peer waited on. Each collective
   starts with a 32-byte fingerprint (op, dtype, count, root, reduce op, sequence) compared with
   the neighbour's: DM_ERR_MISMATCH with both descriptions. After any communication failure the
   collective is broken and every later call returns DM_ERR_ABORTED at once; destroy it.
   SIGPIPE is never raised (MSG_NOSIGNAL).

   The token digest is a keyed 128-bit non-cryptographic hash: it keeps stray and misconfigured
   processes out, it is not protection against someone who can read the traffic.
*/
#ifndef DISTMESH_H
#error "include distmesh.h with DISTMESH_TCP defined instead"
#endif

#include "wip/tcp_store.h"

#ifndef DISTMESH_TCP_H
#define DISTMESH_TCP_H

#ifdef __cplusplus
extern "C" {
#endif

/* >>tcp desc  Zero means default for every field. */
typedef struct dm_tcp_desc {
    int rank;                   /* with world_size 0: from dm_env_detect; else required, < world_size */
    int world_size;             /* 0 -> rank and world size from dm_env_detect */
    struct dm_store* store;     /* borrowed, used during create and split; 0 -> store_url */
    const char* store_url;      /* 0 -> DISTMESH_STORE, else tcp://MASTER_ADDR:MASTER_PORT (rank 0
                                   hosts a tcp:// store unless TORCHELASTIC_USE_AGENT_STORE=True) */
    const char* prefix;         /* 0 -> "distmesh/": key prefix of this group in the store */
    const char* ifname;         /* 0 -> DISTMESH_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, else the
                                   interface that routes to the store host / MASTER_ADDR */
    const char* token;          /* 0 -> DISTMESH_TOKEN, else none */
    size_t chunk_bytes;         /* 0 -> 512 KiB: pipelining unit of the ring algorithms */
    int timeout_ms;             /* 0 -> DISTMESH_TIMEOUT or DM_DEFAULT_TIMEOUT_MS; < 0 -> forever */
    dm_logger logger;           /* 0 -> silent */
    dm_allocator allocator;     /* 0 -> malloc/free (libuv allocates on its own) */
} dm_tcp_desc;

/* Collective call over all world_size ranks. Fails with *out == NULL. */
DM_API dm_status dm_tcp_create(const dm_tcp_desc* desc, dm_collective** out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DISTMESH_TCP_H */

#if defined(DISTMESH_IMPLEMENTATION) && !defined(DISTMESH_TCP_IMPL_INCLUDED)
#define DISTMESH_TCP_IMPL_INCLUDED
#include "wip/tcp_ring.h"
#endif /* DISTMESH_IMPLEMENTATION */

/*
MIT License

Copyright (c) 2025 the distmesh authors

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
