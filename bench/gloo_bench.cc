// gloo_bench: Gloo's all-reduce, for scripts/compare.sh (loopback) and scripts/bench_hosts.sh
// (network namespaces), written against Debian's libgloo-dev, the 2022 snapshot with the classic
// algorithm classes.
//   gloo_bench ALGO RANK WORLD STORE_DIR ITERS WARMUP BYTES...
// The ranks meet through a FileStore in STORE_DIR; each listens on GLOO_BENCH_HOSTNAME (an
// address of this host; default 127.0.0.1).
// ALGO: ring_chunked | halving_doubling. Prints one line per size:
//   gloo_<algo> ranks=N bytes=B us=T     (T: mean microseconds per all-reduce, slowest rank)
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

template <typename Algo>
static double time_allreduce(std::shared_ptr<gloo::Context> ctx, size_t count, int iters, int warmup) {
    std::vector<float> data(count, 1.0f);
    std::vector<float*> ptrs{data.data()};
    Algo algo(ctx, ptrs, static_cast<int>(count));
    for (int i = 0; i < warmup; i++) algo.run();
    // Line the ranks up so the clock starts together, as dm_bench's barrier does.
    std::vector<float> token(1, 0.0f);
    std::vector<float*> tptr{token.data()};
    gloo::AllreduceRingChunked<float> sync(ctx, tptr, 1);
    sync.run();
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; i++) algo.run();
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
    // The slowest rank's time: a max-reduction of one float (as microseconds).
    std::vector<float> t(1, static_cast<float>(us));
    std::vector<float*> tp{t.data()};
    gloo::AllreduceRingChunked<float> mx(ctx, tp, 1, gloo::ReductionFunction<float>::max);
    mx.run();
    return t[0];
}

int main(int argc, char** argv) {
    if (argc < 8) {
        std::fprintf(stderr, "usage: gloo_bench ring_chunked|halving_doubling RANK WORLD STORE_DIR ITERS WARMUP BYTES...\n");
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
        double us = algo == "halving_doubling"
                        ? time_allreduce<gloo::AllreduceHalvingDoubling<float>>(ctx, count, iters, warmup)
                        : time_allreduce<gloo::AllreduceRingChunked<float>>(ctx, count, iters, warmup);
        if (rank == 0) std::printf("gloo_%s ranks=%d bytes=%zu us=%.3f\n", algo.c_str(), world, count * sizeof(float), us);
        std::fflush(stdout);
    }
    return 0;
}
