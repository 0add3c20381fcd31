// gloo_bench: Gloo's all-reduce and all-gather, for scripts/compare.sh (loopback) and
// scripts/bench_hosts.sh (network namespaces), written against Debian's libgloo-dev, the 2022
// snapshot with the classic algorithm classes.
//   gloo_bench ALGO RANK WORLD STORE_DIR ITERS WARMUP BYTES...
// The ranks meet through a FileStore in STORE_DIR; each listens on GLOO_BENCH_HOSTNAME (an
// address of this host; default 127.0.0.1).
// ALGO: ring_chunked | halving_doubling (all-reduce, BYTES per rank), allgather (AllgatherRing,
// Gloo's ring over every rank; BYTES received, BYTES / WORLD sent, as dm_bench counts an
// all-gather; the snapshot's newer gloo::allgather took 272 ms for 1 MB on 3 ranks over loopback,
// torch 1.13's own Gloo 3.4 ms, so the classic class is the Gloo measured), barrier
// (BarrierAllToAll: every rank signals every other; one line of 0 bytes whatever BYTES). Prints
// one line per size:
//   gloo_<algo> ranks=N bytes=B us=T     (T: mean microseconds per call, slowest rank)
#include <gloo/allgather_ring.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier_all_to_all.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

// The mean time of iters calls of run() after warmup ones, the slowest rank's.
template <typename Run>
static double time_calls(std::shared_ptr<gloo::Context> ctx, Run run, int iters, int warmup) {
    for (int i = 0; i < warmup; i++) run();
    // Line the ranks up so the clock starts together, as dm_bench's barrier does.
    std::vector<float> token(1, 0.0f);
    std::vector<float*> tptr{token.data()};
    gloo::AllreduceRingChunked<float> sync(ctx, tptr, 1);
    sync.run();
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; i++) run();
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
    // The slowest rank's time: a max-reduction of one float (as microseconds).
    std::vector<float> t(1, static_cast<float>(us));
    std::vector<float*> tp{t.data()};
    gloo::AllreduceRingChunked<float> mx(ctx, tp, 1, gloo::ReductionFunction<float>::max);
    mx.run();
    return t[0];
}

template <typename Algo>
static double time_allreduce(std::shared_ptr<gloo::Context> ctx, size_t count, int iters, int warmup) {
    std::vector<float> data(count, 1.0f);
    std::vector<float*> ptrs{data.data()};
    Algo algo(ctx, ptrs, static_cast<int>(count));
    return time_calls(ctx, [&] { algo.run(); }, iters, warmup);
}

// count elements from each rank into count x world.
static double time_allgather(std::shared_ptr<gloo::Context> ctx, size_t count, int iters, int warmup) {
    std::vector<float> in(count, 1.0f), out(count * static_cast<size_t>(ctx->size));
    std::vector<const float*> ptrs{in.data()};
    gloo::AllgatherRing<float> algo(ctx, ptrs, out.data(), static_cast<int>(count));
    return time_calls(ctx, [&] { algo.run(); }, iters, warmup);
}

int main(int argc, char** argv) {
    if (argc < 8) {
        std::fprintf(stderr, "usage: gloo_bench ring_chunked|halving_doubling|allgather|barrier RANK WORLD STORE_DIR ITERS WARMUP BYTES...\n");
        return 2;
    }
    std::string algo = argv[1];
    int rank = std::atoi(argv[2]), world = std::atoi(argv[3]);
    std::string dir = argv[4];
    int iters = std::atoi(argv[5]), warmup = std::atoi(argv[6]);
    gloo::transport::tcp::attr attr;
    const char* host = std::getenv("GLOO_BENCH_HOSTNAME");
    attr.hostname = host && *host ? host : "127.0.0.1";
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore file_store(dir);
    gloo::rendezvous::PrefixStore store("gloo_bench", file_store);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, world);
    ctx->setTimeout(std::chrono::seconds(120));
    ctx->connectFullMesh(store, dev);
    for (int i = 7; i < argc; i++) {
        size_t bytes = std::strtoull(argv[i], nullptr, 10);
        size_t count = bytes / sizeof(float) ? bytes / sizeof(float) : 1;
        double us;
        if (algo == "barrier") {
            gloo::BarrierAllToAll barrier(ctx);
            us = time_calls(ctx, [&] { barrier.run(); }, iters, warmup);
            if (rank == 0) std::printf("gloo_barrier ranks=%d bytes=0 us=%.3f\n", world, us);
            break;
        }
        if (algo == "allgather") {
            count = count / static_cast<size_t>(world) ? count / static_cast<size_t>(world) : 1;
            us = time_allgather(ctx, count, iters, warmup);
            count *= static_cast<size_t>(world);
        } else if (algo == "halving_doubling") {
            us = time_allreduce<gloo::AllreduceHalvingDoubling<float>>(ctx, count, iters, warmup);
        } else {
            us = time_allreduce<gloo::AllreduceRingChunked<float>>(ctx, count, iters, warmup);
        }
        if (rank == 0) std::printf("gloo_%s ranks=%d bytes=%zu us=%.3f\n", algo.c_str(), world, count * sizeof(float), us);
        std::fflush(stdout);
    }
    // Linger before closing the pairs: a rank that exits with a peer's last notification unread
    // resets the connection, and across a delay line the reset can reach a peer still reading
    // its last message (seen with the barrier at 25 ms one way: "Connection closed by peer").
    std::this_thread::sleep_for(std::chrono::seconds(1));
    return 0;
}
