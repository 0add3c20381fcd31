/* delay_line: a packet-level delay line for `make bench-hosts DELAY=<ms>` (scripts/bench_hosts.sh).
 *
 * It creates a TUN device (layer 3, IFF_NO_PI, IFF_VNET_HDR) in the namespace it runs in, reads
 * every IP packet the kernel routes into it, stamps it with the monotonic clock and writes it back
 * into the same device DELAY ms later, in arrival order. The kernel then routes the packet on as
 * if it had arrived on the TUN device. Nothing is terminated or rewritten: TCP stays end to end
 * between the hosts (their congestion control, windows and retransmissions see the delay as a
 * longer path), unlike a proxy, which would end each connection at the router.
 *
 * The queue is one ring of bytes (-q, default 64 MiB; at 1 Gbit/s and 25 ms one host's link has
 * ~3 MB in flight): a packet that finds no room is dropped at the tail and counted. Offloads
 * (TUNSETOFFLOAD: checksum, TSO4/6) are asked for so that TCP's GSO packets (up to 64 KiB) cross
 * the device whole, a few thousand per second per Gbit/s rather than ~85000 frames: the virtio
 * header the kernel puts before each packet is kept and handed back unchanged (-o 0: no offloads).
 * Single-threaded: ppoll() until the oldest packet is due or the device is readable.
 *
 *   delay_line -i dl0 -d 25 [-q 64M] [-o 1]
 * Prints "ready dl0" once the device exists, and its counters when SIGTERM or SIGINT ends it
 * (packets and bytes in and out, tail drops, the most queued, and how late packets left: the
 * mean, the most, how many more than 1 and 5 ms; lateness comes from this process not running,
 * e.g. on a loaded machine, and from writes, which carry the forwarding to the next host).
 * Needs CAP_NET_ADMIN (root) and /dev/net/tun. Builds with -std=c11 -Wall -Wextra -Wpedantic. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/if_tun.h>
#include <net/if.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#define MAX_PKT (65536 + 256)      /* a GSO packet with its virtio header, with room to spare */
#define WRAP 0xffffffffu           /* an entry length: the writer went back to the ring's start */
#define BATCH 64                   /* packets read per wake-up before the due ones are sent */

struct entry {                     /* before each packet in the ring, 16-byte aligned */
    int64_t due_ns;
    uint32_t len;
    uint32_t pad;
};

static volatile sig_atomic_t stop;
static void on_signal(int sig) { (void)sig; stop = 1; }

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static size_t span(size_t len) { return (sizeof(struct entry) + len + 15) & ~(size_t)15; }

static int parse_size(const char* s, size_t* out) {
    char* end;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s) return -1;
    if (*end == 'K' || *end == 'k') { v <<= 10; end++; }
    else if (*end == 'M' || *end == 'm') { v <<= 20; end++; }
    else if (*end == 'G' || *end == 'g') { v <<= 30; end++; }
    if (*end || v < 4 * (unsigned long long)MAX_PKT) return -1;
    *out = (size_t)v;
    return 0;
}

int main(int argc, char** argv) {
    const char* name = "dl0";
    double delay_ms = -1;
    size_t cap = (size_t)64 << 20;
    int offload = 1, c;
    while ((c = getopt(argc, argv, "i:d:q:o:")) != -1) {
        char* end;
        switch (c) {
        case 'i': name = optarg; break;
        case 'd': delay_ms = strtod(optarg, &end); if (*end || delay_ms < 0 || delay_ms > 10000) delay_ms = -2; break;
        case 'q': if (parse_size(optarg, &cap)) { fprintf(stderr, "delay_line: -q %s: a size >= 264K (e.g. 64M)\n", optarg); return 2; } break;
        case 'o': offload = atoi(optarg) != 0; break;
        default: delay_ms = -2;
        }
    }
    if (delay_ms < 0 || strlen(name) >= IFNAMSIZ) {
        fprintf(stderr, "usage: delay_line -i ifname -d delay_ms [-q queue_bytes, default 64M] [-o 0|1 offloads]\n");
        return 2;
    }
    const int64_t delay_ns = (int64_t)(delay_ms * 1e6 + 0.5);

    int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) { perror("delay_line: /dev/net/tun"); return 1; }
    struct ifreq ifr;
    memset(&ifr, 0, sizeof(ifr));
    ifr.ifr_flags = IFF_TUN | IFF_NO_PI | IFF_VNET_HDR;
    memcpy(ifr.ifr_name, name, strlen(name) + 1);
    if (ioctl(fd, TUNSETIFF, &ifr) < 0) { perror("delay_line: TUNSETIFF"); return 1; }
    if (offload && ioctl(fd, TUNSETOFFLOAD, (unsigned long)(TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6)) < 0) {
        perror("delay_line: TUNSETOFFLOAD (going on without offloads)");
        offload = 0;
    }
    prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);   /* wake-ups on time, not up to 50 us late */

    unsigned char* ring = malloc(cap);
    unsigned char* scratch = malloc(MAX_PKT);
    if (!ring || !scratch) { fprintf(stderr, "delay_line: no memory for a %zu-byte queue\n", cap); return 1; }

    sigset_t block, open_mask;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    sigprocmask(SIG_BLOCK, &block, &open_mask);     /* delivered only inside ppoll: no lost wake-up */
    sigdelset(&open_mask, SIGTERM);
    sigdelset(&open_mask, SIGINT);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    printf("ready %s delay_ms=%g queue_bytes=%zu offloads=%s\n", ifr.ifr_name, delay_ms, cap, offload ? "on" : "off");
    fflush(stdout);

    /* The ring: entries from rpos on, in order, count of them; the writer appends at wpos. An
       entry never wraps: when the end has no room for MAX_PKT the writer marks WRAP (or leaves
       less than an entry header, which means the same) and goes on at 0. */
    size_t rpos = 0, wpos = 0, count = 0, queued = 0, max_queued = 0, max_count = 0;
    uint64_t in_pkts = 0, in_bytes = 0, out_pkts = 0, out_bytes = 0, drops = 0, drop_bytes = 0, werr = 0;
    int64_t late_max = 0, late_sum = 0;
    uint64_t late_1ms = 0, late_5ms = 0;           /* packets written more than 1 / 5 ms after due */
    const size_t need = span(MAX_PKT);
    while (!stop) {
        int64_t now = now_ns();
        while (count) {                              /* send what is due */
            if (cap - rpos < sizeof(struct entry) || ((struct entry*)(ring + rpos))->len == WRAP) rpos = 0;
            struct entry* e = (struct entry*)(ring + rpos);
            if (e->due_ns > now) break;
            if (write(fd, ring + rpos + sizeof(*e), e->len) != (ssize_t)e->len) werr++;
            else { out_pkts++; out_bytes += e->len; }
            int64_t late = now - e->due_ns;
            late_sum += late;
            if (late > late_max) late_max = late;
            late_1ms += late > 1000000;
            late_5ms += late > 5000000;
            queued -= e->len;
            rpos += span(e->len);
            if (--count == 0) rpos = wpos = 0;
            now = now_ns();
        }
        struct timespec ts, *tp = NULL;
        if (count) {
            if (cap - rpos < sizeof(struct entry) || ((struct entry*)(ring + rpos))->len == WRAP) rpos = 0;
            int64_t wait = ((struct entry*)(ring + rpos))->due_ns - now;
            if (wait < 0) wait = 0;
            ts.tv_sec = (time_t)(wait / 1000000000);
            ts.tv_nsec = (long)(wait % 1000000000);
            tp = &ts;
        }
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = ppoll(&p, 1, tp, &open_mask);
        if (r < 0) {
            if (errno == EINTR) continue;
            perror("delay_line: ppoll");
            break;
        }
        if (r == 0 || !(p.revents & POLLIN)) continue;
        for (int i = 0; i < BATCH; i++) {            /* read what is there, each stamped on arrival */
            unsigned char* dst = NULL;
            if (count == 0 || wpos > rpos) {         /* free: [wpos, cap) and [0, rpos) */
                if (cap - wpos >= need) dst = ring + wpos;
                else if (rpos >= need || count == 0) {
                    if (cap - wpos >= sizeof(struct entry)) ((struct entry*)(ring + wpos))->len = WRAP;
                    if (count == 0) rpos = 0;
                    wpos = 0;
                    dst = ring;
                }
            } else if (rpos - wpos >= need) {        /* free: [wpos, rpos) */
                dst = ring + wpos;
            }
            unsigned char* buf = dst ? dst + sizeof(struct entry) : scratch;
            ssize_t n = read(fd, buf, MAX_PKT);
            if (n < 0) {
                if (errno != EAGAIN && errno != EINTR) { perror("delay_line: read"); stop = 1; }
                break;
            }
            if (n == 0) break;
            in_pkts++;
            in_bytes += (uint64_t)n;
            if (!dst) { drops++; drop_bytes += (uint64_t)n; continue; }   /* tail drop: no room */
            struct entry* e = (struct entry*)dst;
            e->due_ns = now_ns() + delay_ns;
            e->len = (uint32_t)n;
            wpos += span((size_t)n);
            count++;
            queued += (size_t)n;
            if (queued > max_queued) max_queued = queued;
            if (count > max_count) max_count = count;
        }
    }
    printf("delay_line %s: in_pkts=%llu in_bytes=%llu out_pkts=%llu out_bytes=%llu dropped_pkts=%llu dropped_bytes=%llu"
           " write_errors=%llu left_in_queue=%zu max_queued_bytes=%zu max_queued_pkts=%zu late_us_mean=%.1f late_us_max=%.1f"
           " late_over_1ms=%llu late_over_5ms=%llu\n",
           ifr.ifr_name, (unsigned long long)in_pkts, (unsigned long long)in_bytes, (unsigned long long)out_pkts,
           (unsigned long long)out_bytes, (unsigned long long)drops, (unsigned long long)drop_bytes,
           (unsigned long long)werr, count, max_queued, max_count,
           out_pkts + werr ? (double)late_sum / 1e3 / (double)(out_pkts + werr) : 0.0, (double)late_max / 1e3,
           (unsigned long long)late_1ms, (unsigned long long)late_5ms);
    fflush(stdout);
    free(ring);
    free(scratch);
    close(fd);
    return 0;
}
