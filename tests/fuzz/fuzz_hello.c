/* libFuzzer target: the data-connection hello of the TCP backend (issue 9). Byte 0 picks the
   side: even, the acceptor (_dm_tcp_hello_accept) reads the input as a connector's hello and
   proof; odd, the connector (_dm_tcp_hello_connect) reads it as the acceptor's challenge. The
   input arrives through a socket pair whose far end is then shut, so short inputs end in EOF,
   never in a wait. Built and run by `make fuzz` (tests/fuzz.mk), not by `make test`. */
#define _GNU_SOURCE
#define DISTMESH_IMPLEMENTATION
#include "distmesh.h"
#include <sys/socket.h>

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    _dm_tcp t;
    int fds[4] = { -1, -1, -1, -1 }, sv[2], peer = -1;
    char addrs[4][64];
    bool connector;
    uint64_t group;
    if (size < 1 || size > 4096) return 0;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return 0;
    connector = data[0] & 1;
    memset(&t, 0, sizeof(t));
    memset(addrs, 0, sizeof(addrs));
    t.base.rank = connector ? 1 : 0;
    t.base.size = 4;
    snprintf(t.prefix, sizeof(t.prefix), "distmesh/g0/");
    snprintf(t.token, sizeof(t.token), "fuzz");
    t.fds = fds;
    t.claims = fds;             /* the handshakes fill the first sockets (one per peer) */
    t.nsock = 1;
    t.addrs = addrs;
    snprintf(addrs[0], 64, "127.0.0.1:1000");
    snprintf(addrs[1], 64, "127.0.0.1:1001");
    group = _dm_tcp_hash(1, t.prefix, NULL);
    if (send(sv[1], data + 1, size - 1, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) { close(sv[0]); close(sv[1]); return 0; }
    shutdown(sv[1], SHUT_WR);
    fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL, 0) | O_NONBLOCK);
    if (connector) (void)_dm_tcp_hello_connect(&t, sv[0], 0, group, _dm_now_ms() + 1000);
    else (void)_dm_tcp_hello_accept(&t, sv[0], group, _dm_now_ms() + 1000, &peer);
    close(sv[0]);
    close(sv[1]);
    return 0;
}
