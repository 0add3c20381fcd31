/* libFuzzer target: the store server's request parser (issue 9). Each input drives one client
   of a fresh in-memory server: byte 0 picks the mode (bit 0: the store has a token, so the
   authentication step parses first; bits 1-7: where the input is cut into reads), the rest
   arrives as the client's bytes through the server's own read path (_dm_srv_alloc +
   _dm_srv_on_read), replies go to a socket pair that is drained. Bounds are small so the quota
   and limit paths run too. Built and run by `make fuzz` (tests/fuzz.mk), not by `make test`. */
#define _GNU_SOURCE
#define DISTMESH_IMPLEMENTATION
#include "distmesh.h"
#include <sys/socket.h>

static void drain(int fd) {
    char b[65536];
    while (recv(fd, b, sizeof(b), MSG_DONTWAIT) > 0) {}
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    _dm_srv* s;
    _dm_srv_client* c;
    int sv[2];
    size_t off = 1, cut;
    if (size < 1) return 0;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return 0;
    s = (_dm_srv*)calloc(1, sizeof(*s));
    c = (_dm_srv_client*)calloc(1, sizeof(*c));
    s->lim.max_value = 4096;
    s->lim.max_conn = 16384;
    s->lim.max_total = 65536;
    s->lim.stall_ms = 1000;
    if (data[0] & 1) { s->lim.token_len = 4; memcpy(s->lim.token, "fuzz", 4); }
    s->nbuckets = 64;
    s->buckets = (_dm_kv**)calloc(s->nbuckets, sizeof(_dm_kv*));
    uv_loop_init(&s->loop);
    c->srv = s;
    uv_tcp_init(&s->loop, &c->tcp);
    uv_tcp_open(&c->tcp, sv[0]);
    s->clients = c;
    snprintf(c->peer, sizeof(c->peer), "fuzz");
    c->auth = s->lim.token_len ? 1 : 0;
    c->reading = true;          /* as after uv_read_start; the bytes are fed below */
    cut = 1 + (size_t)(data[0] >> 1) * 7;
    while (off < size && s->clients && !c->closing && !c->flush_close) {
        size_t want = size - off < cut ? size - off : cut;
        while (want && !c->closing && !c->flush_close) {
            uv_buf_t buf;
            size_t n;
            _dm_srv_alloc((uv_handle_t*)&c->tcp, 65536, &buf);
            if (buf.len == 0) { _dm_srv_on_read((uv_stream_t*)&c->tcp, UV_ENOBUFS, &buf); break; }
            n = want < buf.len ? want : buf.len;
            memcpy(buf.base, data + off, n);
            off += n;
            want -= n;
            _dm_srv_on_read((uv_stream_t*)&c->tcp, (ssize_t)n, &buf);
        }
        uv_run(&s->loop, UV_RUN_NOWAIT);   /* may run the close callback: c is gone then */
        drain(sv[1]);
    }
    _dm_srv_free(s);            /* closes the client, runs the callbacks, frees entries */
    close(sv[1]);
    return 0;
}
