#!/usr/bin/env python3
"""Rendezvous through the store host, on paper: connections, requests and bytes that one create
costs the process hosting the store, for distmesh (a host's ranks through its leader, and every
rank a client) against torch's Gloo process group (every rank a TCPStore client, then Gloo's
full-mesh rendezvous through the store). docs/scale.md prints its table and says where each
count comes from.

  scripts/rendezvous_model.py                 the docs' table: 1k, 4k, 16k ranks, 8 per host
  scripts/rendezvous_model.py W L SLICES      one layout: W ranks, L per host, the number of
                                              200 ms wait slices a rank spends waiting for the
                                              world (the launch's spread: 10 = 2 s)

Every size is a wire size of c10d's TCPStore protocol (torch 2.x; distmesh_store.h >>store wire):
a request is an opcode byte and its fields, a string or value is a u64 length and its bytes, a
reply is what the opcode answers. Keys and values are distmesh's own ("distmesh/g0/addr/12345",
"10.1.2.3:45678") and Gloo's (gloo/transport/tcp/context.cc, createAndConnectAllPairs). No token
(a token adds 149 bytes to each connection's handshake) and no TCP/IP headers.
"""
import sys

KEY = 22            # "distmesh/g0/addr/12345"
VAL = 18            # "10.1.2.3:45678" and a little
STR = 8             # a string's u64 length


def s(n):
    """A c10d string of n bytes on the wire."""
    return STR + n


CONNECT = (10, 4)   # VALIDATE (opcode, u32 magic) + PING (opcode, u32 nonce); the nonce echoed
ADD = (1 + s(12) + 8, 8)
SET_ADDR = (1 + s(KEY) + s(VAL), 0)
CAS_WORLD = (1 + s(22) + s(0) + s(5), s(5))
ADD_ARRIVED = (1 + s(19) + 8, 8)
WAIT_READY = (1 + 8 + s(16), 1)     # WAIT ["<prefix>ready"]; then CANCEL_WAIT at the slice's end
CANCEL = (1, 1)
CHECK_REFUSED = (1 + 8 + s(22), 1)  # CHECK ["distmesh-store/refused"], once a slice
GET_ADDR = (1 + 8 + s(KEY) + 1 + s(KEY), 1 + s(VAL))   # get = WAIT [key] + GET
DELETE = (1 + s(KEY), 8)


def add(acc, msg, times=1):
    """Adds times requests of (bytes in, bytes out) to acc = [requests, in, out]."""
    acc[0] += times
    acc[1] += msg[0] * times
    acc[2] += msg[1] * times


def distmesh_direct(W, slices):
    """Every rank a client (before this change, and by-hand launches without LOCAL_RANK)."""
    a = [0, 0, 0]
    add(a, CONNECT, 2 * W)                     # two requests (VALIDATE, PING) per connection
    add(a, ADD, W)
    add(a, SET_ADDR, W)
    add(a, CAS_WORLD, W)
    add(a, ADD_ARRIVED, W)
    add(a, WAIT_READY, slices * W)
    add(a, CANCEL, slices * W)
    add(a, CHECK_REFUSED, slices * W)
    add(a, GET_ADDR, W + 1)                    # the ring neighbour below (rank W-1: two)
    add(a, DELETE, W + 3)                      # its address; rank 0 the world's three keys
    return {"peak": W, "after": 0, "req": a[0], "in": a[1], "out": a[2]}


def distmesh_before(W, slices):
    """Every rank a client, as before issue 28: its connection held after create, and each wait
    slice a WAIT for the W address keys themselves."""
    a = [0, 0, 0]
    add(a, CONNECT, 2 * W)
    add(a, ADD, W)
    add(a, SET_ADDR, W)
    add(a, CAS_WORLD, W)
    add(a, (1 + 8 + W * s(KEY), 1), slices * W)
    add(a, CANCEL, slices * W)
    add(a, GET_ADDR, W + 1)
    add(a, DELETE, W + 1)
    return {"peak": W, "after": W, "req": a[0], "in": a[1], "out": a[2]}


def distmesh_leaders(W, L, slices, batches=2):
    """A host's ranks through its leader (distmesh_tcp.h >>tcp relay)."""
    H = W // L
    a = [0, 0, 0]
    add(a, CONNECT, 2 * H)
    add(a, ADD, H)                              # the leader's own generation add ...
    add(a, SET_ADDR, H)                         # ... its address ...
    add(a, CAS_WORLD, H)                        # ... the world size, for the host
    add(a, ADD_ARRIVED, H)
    per_batch = (L - 1) / batches               # its ranks in `batches` batches: an ADD of the
    multi_set = (1 + 8 + per_batch * (s(KEY) + s(VAL)), 0)   # generation, a MULTI_SET, an ADD
    add(a, ADD, H * batches)                    # of the arrivals
    add(a, multi_set, H * batches)
    add(a, ADD_ARRIVED, H * batches)
    add(a, WAIT_READY, slices * H)
    add(a, CANCEL, slices * H)
    add(a, CHECK_REFUSED, slices * H)
    add(a, (1 + 8 + s(KEY) + 1 + 8 + s(KEY), 1 + s(VAL)), H + 1)   # WAIT + MULTI_GET of what
    add(a, DELETE, W + 3)                       # its ranks dial that it does not hold; deletes
    return {"peak": H, "after": 0, "req": a[0], "in": a[1], "out": a[2]}


def gloo_full_mesh(W, rank_as_seq=False):
    """torch's Gloo process group: every rank a TCPStore client (held for the job), then Gloo's
    createAndConnectAllPairs: one key per rank holding its hostname, its device address
    (sockaddr_storage + sequence number, 136 B) and a sequence number per pair (8 B each; none
    with GLOO_ENABLE_RANK_AS_SEQUENCE_NUMBER=1), which every rank reads whole for every rank
    (torch's get: WAIT then GET)."""
    value = 8 + 16 + 8 + 136 + (0 if rank_as_seq else 8 + 8 * W)
    a = [0, 0, 0]
    add(a, CONNECT, 2 * W)
    add(a, (1 + s(12) + s(value), 0), W)
    add(a, (1 + 8 + s(12) + 1 + s(12), 1 + s(value)), W * W)
    return {"peak": W, "after": W, "req": a[0], "in": a[1], "out": a[2]}


def size(b):
    for unit, div in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if b >= div:
            return f"{b / div:.1f} {unit}"
    return f"{b:.0f} B"


def count(n):
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return f"{n:.0f}"


def table(rows):
    print("| ranks | hosts | scheme | store connections: during create / after | requests | bytes in + out |"
          " data connections per rank |")
    print("| ---: | ---: | --- | ---: | ---: | ---: | --- |")
    for W, L, slices in rows:
        H = W // L
        schemes = [
            ("distmesh, a leader per host", distmesh_leaders(W, L, slices), "P"),
            ("distmesh, every rank a client", distmesh_direct(W, slices), "P"),
            ("distmesh before issue 28 (every rank a client)", distmesh_before(W, slices), "P"),
            ("torch Gloo (TCPStore + full mesh)", gloo_full_mesh(W), f"{W - 1}"),
            ("  ... GLOO_ENABLE_RANK_AS_SEQUENCE_NUMBER=1", gloo_full_mesh(W, True), f"{W - 1}"),
        ]
        for name, m, data in schemes:
            print(f"| {W} | {H} | {name} | {m['peak']} / {m['after']} | {count(m['req'])} | "
                  f"{size(m['in'] + m['out'])} | {data} |")


def main(argv):
    if len(argv) == 4:
        table([(int(argv[1]), int(argv[2]), int(argv[3]))])
    elif len(argv) == 1:
        table([(1024, 8, 10), (4096, 8, 10), (16384, 8, 10)])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
