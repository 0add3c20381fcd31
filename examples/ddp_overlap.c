/* Data-parallel training with communication hidden behind the backward pass, the way PyTorch's
   DistributedDataParallel (DDP) does it, in plain C.

   Every rank holds the same small MLP (tanh hidden layers, a linear output) and trains it by
   SGD on its own shard of a synthetic regression problem. After each backward pass the ranks
   average their gradients with an all-reduce, so every rank applies the same update and the
   weights stay the same bytes everywhere. The point of the example is *when* that all-reduce
   runs:

     no overlap   forward, backward (all layers), all-reduce every gradient, SGD step
     overlap      forward, backward with the gradients cut into buckets: as soon as the last
                  layer of a bucket has its gradient, dm_all_reduce_async sends the bucket off
                  and the backward pass goes on with the earlier layers while the library's
                  progress thread reduces it; dm_wait_all at the end of backward, SGD step

   so with overlap a step costs about max(backward, communication) instead of their sum -- as
   far as free CPU cores allow: the progress thread copies and reduces, so it needs a core of its
   own to run truly alongside the backward loop (R ranks on one host: 2R cores). With fewer, the
   two take turns and overlap gains little; `make bench-overlap` measures it (bench/dm_overlap.c).

   Run (two ranks on two threads of this process when no launcher placed it; prints the loss,
   the time per step, how much of it was spent waiting for gradients, and a final check that
   all ranks hold identical weights):

     build/plain/examples/ddp_overlap                      overlap, 2 ranks on threads
     build/plain/examples/ddp_overlap --no-overlap         the same without overlap, to compare
     examples/launch_by_hand.sh build/plain/examples/ddp_overlap   4 processes (NPROC=4)
     torchrun --nproc_per_node 2 --master_port 29500 --no_python build/plain/examples/ddp_overlap

     build/plain/examples/ddp_overlap --elastic            3 processes; rank 1 is kill -9'd at
                                                           step 21, the others shrink and go on
     build/plain/examples/ddp_overlap --rejoin             the same, and a restarted process
                                                           rejoins at step 41 (dm_grow)
   (see "--elastic" below: elastic_main).

   Compressed gradients (docs/design.md "Compression"): --compress int8|bf16 averages them with
   dm_all_reduce_compressed, one error-feedback state per bucket (--no-feedback: none); only the
   stage between hosts is compressed, so with threads give --hosts H (simulated hosts, ranks in
   blocks):  ddp_overlap --threads 4 --hosts 2 --steps 200 --compress int8
   Options: --steps N (default 60), --bucket-mb MiB (default 1: DDP's bucket_cap_mb, 25 there,
   would put this 3 MiB model in one bucket, sent after backward with nothing left to overlap),
   --hidden N (width, default 512), --layers N (hidden layers, default 4), --batch N (samples per
   rank per step, default 32), --lr X (default 0.05), --threads N (ranks when no launcher placed
   this process, default 2), --no-overlap; with --elastic / --rejoin: --ranks N (2..8, default 3),
   --victim R (default 1), --kill-at STEP (steps finished when the victim dies, default steps / 3;
   0: nobody dies), --rejoin-at STEP (default 2 * steps / 3).
   Build: cc -std=c11 -DDISTMESH_TCP -I. examples/ddp_overlap.c distmesh.c -luv -pthread -lm
   (or `make`: build/plain/examples/ddp_overlap). Without -DDISTMESH_TCP it still builds and
   runs on threads, but a launcher's processes could not reach each other. */
#define _POSIX_C_SOURCE 200809L
#include "distmesh.h"
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <signal.h>
#include <unistd.h>
#include <sys/types.h>
#include <sys/wait.h>

#define IN_DIM 64          /* input features */
#define TEACHER_HIDDEN 16  /* the hidden function the model learns */
#define SHARD 2048         /* samples per rank */
#define MAX_LAYERS 16
#define MAX_RANKS 8        /* --elastic --ranks */

typedef struct options {
    int steps, hidden, layers, batch, threads, overlap;
    int hosts;              /* --hosts: the threads' ranks on this many simulated hosts */
    dm_compress compress;   /* --compress none|bf16|int8 (DM_COMPRESS_DEFAULT when not given) */
    int feedback;           /* 0 with --no-feedback: compressed without error-feedback state */
    int elastic, rejoin, ranks, victim, kill_at, rejoin_at;   /* --elastic, see elastic_main */
    double bucket_mb;
    float lr;
} options;

/* One fully connected layer: out x in weights (row-major), then out biases, stored at `off` in
   the flat parameter array and at the same place in the flat gradient array. Keeping all
   gradients in one array is what makes buckets cheap: a bucket is a contiguous slice of it, so
   one all-reduce call covers several layers without copying them together first (DDP copies
   gradients into bucket buffers; here they already live there). */
typedef struct layer {
    int in, out;
    size_t off, count;
} layer;

/* A bucket: layers first..last (first <= last), a contiguous slice of the gradients. */
typedef struct bucket {
    int first, last;
    size_t off, count;
    dm_request* req;     /* in flight between dm_all_reduce_async and dm_wait_all, else NULL */
    dm_compress_state* state;   /* --compress: its error feedback (what compression dropped on
                                   this rank, added back next step), one per bucket; or NULL */
} bucket;

typedef struct model {
    int nlayers, nbuckets;
    layer L[MAX_LAYERS];
    bucket B[MAX_LAYERS];
    int bucket_of[MAX_LAYERS];
    size_t nparams;
    float* params;
    float* grads;
    float* act[MAX_LAYERS + 1];   /* act[0] = input batch, act[l+1] = output of layer l */
    float* delta[2];              /* backward scratch: d loss / d (pre-activation), ping-pong */
} model;

/* ---- small deterministic random numbers (splitmix64): the same stream on every platform ---- */
static uint64_t next_u64(uint64_t* s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static float uniform(uint64_t* s, float a) {   /* uniform in [-a, a) */
    return a * (2.0f * (float)(next_u64(s) >> 40) / (float)(1ULL << 24) - 1.0f);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- the data: y = sum_j v_j tanh(u_j . x), the same teacher everywhere, x per rank ---- */
static void make_shard(int rank, float* x, float* y) {
    float u[TEACHER_HIDDEN][IN_DIM], v[TEACHER_HIDDEN];   /* 4 KiB: on each rank's own stack */
    uint64_t teacher = 7, mine = 1000 + (uint64_t)rank;   /* a different shard on every rank */
    int j, i, n;
    for (j = 0; j < TEACHER_HIDDEN; j++) {
        for (i = 0; i < IN_DIM; i++) u[j][i] = uniform(&teacher, 0.3f);
        v[j] = uniform(&teacher, 1.0f);
    }
    for (n = 0; n < SHARD; n++) {
        float t = 0;
        for (i = 0; i < IN_DIM; i++) x[(size_t)n * IN_DIM + i] = uniform(&mine, 1.0f);
        for (j = 0; j < TEACHER_HIDDEN; j++) {
            float z = 0;
            for (i = 0; i < IN_DIM; i++) z += u[j][i] * x[(size_t)n * IN_DIM + i];
            t += v[j] * tanhf(z);
        }
        y[n] = t;
    }
}

/* ---- the model ---- */
static int model_init(model* m, const options* o) {
    uint64_t seed = 42;   /* the same seed on every rank: the same initial weights */
    size_t off = 0, maxw = IN_DIM;
    int l, k;
    memset(m, 0, sizeof(*m));
    m->nlayers = o->layers + 1;
    for (l = 0; l < m->nlayers; l++) {
        layer* ly = &m->L[l];
        ly->in = l == 0 ? IN_DIM : o->hidden;
        ly->out = l == m->nlayers - 1 ? 1 : o->hidden;
        ly->off = off;
        ly->count = (size_t)ly->out * (size_t)ly->in + (size_t)ly->out;
        off += ly->count;
    }
    m->nparams = off;
    if (maxw < (size_t)o->hidden) maxw = (size_t)o->hidden;
    m->params = (float*)malloc(off * sizeof(float));
    m->grads = (float*)calloc(off, sizeof(float));
    m->delta[0] = (float*)malloc((size_t)o->batch * maxw * sizeof(float));
    m->delta[1] = (float*)malloc((size_t)o->batch * maxw * sizeof(float));
    if (!m->params || !m->grads || !m->delta[0] || !m->delta[1]) return -1;
    for (l = 0; l <= m->nlayers; l++) {
        size_t w = l == 0 ? IN_DIM : (size_t)m->L[l - 1].out;
        if (!(m->act[l] = (float*)malloc((size_t)o->batch * w * sizeof(float)))) return -1;
    }
    for (l = 0; l < m->nlayers; l++) {   /* Xavier-uniform weights, zero biases */
        layer* ly = &m->L[l];
        float a = sqrtf(6.0f / (float)(ly->in + ly->out));
        size_t i, nw = (size_t)ly->out * (size_t)ly->in;
        for (i = 0; i < nw; i++) m->params[ly->off + i] = uniform(&seed, a);
        for (i = 0; i < (size_t)ly->out; i++) m->params[ly->off + nw + i] = 0.0f;
    }

    /* Buckets, built the way DDP builds them: walk the layers in the order backward produces
       their gradients (last layer first) and close a bucket once it holds at least
       bucket_mb. Why buckets at all: one all-reduce per layer would pay the per-call latency
       (a round trip, a handshake) once per tensor, and one all-reduce of everything could only
       start after the whole backward pass -- nothing left to overlap it with. A few MiB per
       call is large enough to run at full bandwidth and small enough that the first bucket is
       ready early. Why in backward order: the first bucket to be ready is then the first one
       sent, so each bucket starts as soon as its own gradients exist, and every rank issues
       the buckets in the same order (collective calls are matched by their order, so all
       ranks must agree on it; here the layer structure fixes it). */
    k = -1;
    {
        size_t bytes = 0, cap = (size_t)(o->bucket_mb * 1024.0 * 1024.0);
        for (l = m->nlayers - 1; l >= 0; l--) {
            if (k < 0 || bytes >= cap) {              /* open a new bucket */
                k++;
                m->B[k].last = l;
                bytes = 0;
            }
            m->B[k].first = l;
            bytes += m->L[l].count * sizeof(float);
            m->bucket_of[l] = k;
        }
    }
    m->nbuckets = k + 1;
    for (k = 0; k < m->nbuckets; k++) {       /* layers first..last are adjacent in memory */
        bucket* b = &m->B[k];
        b->off = m->L[b->first].off;
        b->count = m->L[b->last].off + m->L[b->last].count - b->off;
    }
    return 0;
}

static void model_free(model* m) {
    int l;
    free(m->params);
    free(m->grads);
    free(m->delta[0]);
    free(m->delta[1]);
    for (l = 0; l <= m->nlayers; l++) free(m->act[l]);
}

/* Forward pass over a batch; returns the batch's mean squared error / 2 and leaves
   d loss / d output in delta[0] for backward. */
static float forward(model* m, int batch, const float* x, const float* y) {
    int l, b, o, i;
    float loss = 0;
    memcpy(m->act[0], x, (size_t)batch * IN_DIM * sizeof(float));
    for (l = 0; l < m->nlayers; l++) {
        const layer* ly = &m->L[l];
        const float* W = m->params + ly->off;
        const float* bias = W + (size_t)ly->out * ly->in;
        int last = l == m->nlayers - 1;
        for (b = 0; b < batch; b++) {
            const float* a = m->act[l] + (size_t)b * ly->in;
            float* z = m->act[l + 1] + (size_t)b * ly->out;
            for (o = 0; o < ly->out; o++) {
                const float* w = W + (size_t)o * ly->in;
                float s = bias[o];
                for (i = 0; i < ly->in; i++) s += w[i] * a[i];
                z[o] = last ? s : tanhf(s);
            }
        }
    }
    for (b = 0; b < batch; b++) {
        float e = m->act[m->nlayers][b] - y[b];
        loss += 0.5f * e * e;
        m->delta[0][b] = e / (float)batch;
    }
    return loss / (float)batch;
}

/* Gradients of layer l from delta_in (d loss / d its pre-activation); when l > 0 also
   delta_out for layer l-1. Writes only layer l's slice of m->grads. */
static void backward_layer(model* m, int l, int batch, const float* delta_in, float* delta_out) {
    const layer* ly = &m->L[l];
    const float* W = m->params + ly->off;
    float* dW = m->grads + ly->off;
    float* db = dW + (size_t)ly->out * ly->in;
    int b, o, i;
    memset(dW, 0, ly->count * sizeof(float));
    for (b = 0; b < batch; b++) {
        const float* a = m->act[l] + (size_t)b * ly->in;
        for (o = 0; o < ly->out; o++) {
            float d = delta_in[(size_t)b * ly->out + o];
            float* row = dW + (size_t)o * ly->in;
            for (i = 0; i < ly->in; i++) row[i] += d * a[i];
            db[o] += d;
        }
    }
    if (l == 0) return;
    for (b = 0; b < batch; b++) {
        const float* a = m->act[l] + (size_t)b * ly->in;    /* tanh outputs of layer l-1 */
        float* dz = delta_out + (size_t)b * ly->in;
        memset(dz, 0, (size_t)ly->in * sizeof(float));
        for (o = 0; o < ly->out; o++) {
            float d = delta_in[(size_t)b * ly->out + o];
            const float* w = W + (size_t)o * ly->in;
            for (i = 0; i < ly->in; i++) dz[i] += d * w[i];
        }
        for (i = 0; i < ly->in; i++) dz[i] *= 1.0f - a[i] * a[i];   /* tanh' */
    }
}

/* FNV-1a over the parameters' bytes: equal hashes on all ranks = (almost surely) equal bytes. */
static uint64_t params_hash(const model* m) {
    const unsigned char* p = (const unsigned char*)m->params;
    uint64_t h = 0xcbf29ce484222325ULL;
    size_t i;
    for (i = 0; i < m->nparams * sizeof(float); i++) h = (h ^ p[i]) * 0x100000001b3ULL;
    return h;
}

/* One step's forward, backward and gradient all-reduce (buckets, overlapped or not); the
   caller applies the SGD step. *t_wait gets the seconds spent waiting for gradients. On a
   failure no request is left in flight. */
static dm_status forward_backward_reduce(dm_collective* c, model* m, const options* o, const float* x,
                                         const float* y, float* loss, double* t_wait) {
    dm_request* reqs[MAX_LAYERS];
    dm_status st = DM_OK;
    double tw;
    int cur = 0, l, k;

    *loss = forward(m, o->batch, x, y);

    /* Backward, last layer first. */
    for (l = m->nlayers - 1; l >= 0; l--) {
        backward_layer(m, l, o->batch, m->delta[cur], m->delta[cur ^ 1]);
        cur ^= 1;
        k = m->bucket_of[l];
        if (o->overlap && l == m->B[k].first) {
            /* Layer l was the bucket's last gradient to be computed: send it now. From here
               until dm_wait_all says it is done, the slice grads[off, off+count) belongs
               to the library -- its progress thread reads it, sends it and writes the
               average back in place (send NULL = in place). The backward pass must not
               touch it, and does not: the layers still to come write their own slices,
               and they read the *parameters*, which nobody is changing. DM_MEAN: every
               rank gets the same bytes (sum in a fixed order, divided once), so the
               weights stay identical after the step. */
            st = dm_all_reduce_compressed_async(c, NULL, m->grads + m->B[k].off, m->B[k].count, DM_FLOAT32,
                                                DM_MEAN, o->compress, m->B[k].state, &m->B[k].req);
            if (st != DM_OK) break;     /* the buckets sent so far are waited for below */
        }
    }

    /* End of backward: everything still in flight must finish before the optimizer reads
       the gradients. With overlap only the tail is left (typically the last bucket, sent
       just now); without it, this is where all the communication happens. */
    tw = now_s();
    if (o->overlap) {
        dm_status sw;
        int n = 0;
        for (k = 0; k < m->nbuckets; k++)
            if (m->B[k].req) reqs[n++] = m->B[k].req;
        sw = dm_wait_all(reqs, (size_t)n);   /* frees them */
        for (k = 0; k < m->nbuckets; k++) m->B[k].req = NULL;
        if (st == DM_OK) st = sw;
    } else {
        for (k = 0; k < m->nbuckets && st == DM_OK; k++)
            st = dm_all_reduce_compressed(c, NULL, m->grads + m->B[k].off, m->B[k].count, DM_FLOAT32, DM_MEAN,
                                          o->compress, m->B[k].state);
    }
    *t_wait = now_s() - tw;
    return st;
}


#define CHECK(call)                                                                          \
    do {                                                                                     \
        st = (call);                                                                         \
        if (st != DM_OK) {                                                                   \
            fprintf(stderr, "rank %d: %s failed: %s: %s\n", dm_rank(c), #call,               \
                    dm_status_name(st), dm_last_error(c));                                   \
            goto done;                                                                       \
        }                                                                                    \
    } while (0)

static int train(dm_collective* c, void* user_data) {
    const options* o = (const options*)user_data;
    int rank = dm_rank(c), world = dm_world_size(c), step, k;
    float* x = (float*)malloc((size_t)SHARD * IN_DIM * sizeof(float));
    float* y = (float*)malloc((size_t)SHARD * sizeof(float));
    float loss_first = 0, loss = 0;
    double t_steps = 0, t_wait = 0;
    uint64_t hash[2];
    model m;
    dm_status st = DM_OK;

    if (model_init(&m, o) != 0 || !x || !y) {
        fprintf(stderr, "rank %d: out of memory\n", rank);
        st = DM_ERR_OUT_OF_MEMORY;
        goto done;
    }
    make_shard(rank, x, y);
    for (k = 0; k < m.nbuckets && o->feedback && (o->compress == DM_COMPRESS_INT8 || o->compress == DM_COMPRESS_BF16); k++)
        CHECK(dm_compress_state_create(m.B[k].count, &m.B[k].state));
    /* Same starting point everywhere. The seed already gives it; DDP broadcasts rank 0's
       parameters anyway at construction, so a rank that was initialised differently cannot
       silently train another model. */
    CHECK(dm_broadcast(c, m.params, m.nparams, DM_FLOAT32, 0));
    if (rank == 0) {
        printf("%d ranks (%s backend, %s transport), %zu parameters (%.2f MiB), %d buckets "
               "(backward order):", world, dm_backend_name(c), dm_transport_name(c), m.nparams,
               (double)m.nparams * 4 / 1048576.0, m.nbuckets);
        for (k = 0; k < m.nbuckets; k++)
            printf(" [layers %d..%d: %.2f MiB]", m.B[k].last, m.B[k].first,
                   (double)m.B[k].count * 4 / 1048576.0);
        printf("\n%s\n", o->overlap ? "overlap: buckets all-reduced during backward"
                                    : "no overlap: one all-reduce per bucket after backward");
    }

    for (step = 0; step < o->steps; step++) {
        size_t first = (size_t)step * (size_t)o->batch % (SHARD - (size_t)o->batch + 1);
        double t0 = now_s(), tw;

        st = forward_backward_reduce(c, &m, o, x + first * IN_DIM, y + first, &loss, &tw);
        t_wait += tw;
        if (st != DM_OK) {
            fprintf(stderr, "rank %d: step %d: %s: %s\n", rank, step + 1, dm_status_name(st), dm_last_error(c));
            goto done;
        }

        /* SGD step: the gradients are ours again, and the same on every rank. */
        {
            size_t i;
            for (i = 0; i < m.nparams; i++) m.params[i] -= o->lr * m.grads[i];
        }
        t_steps += now_s() - t0;
        if (step == 0 && rank == 0 && o->compress != DM_COMPRESS_DEFAULT)
            printf("gradients: %s (%s%s)\n", dm_last_algorithm(c), dm_compress_name(o->compress),
                   o->compress == DM_COMPRESS_NONE ? "" : o->feedback ? ", error feedback" : ", no error feedback");

        /* The average loss over ranks, now and then (a blocking all-reduce of one float). */
        if (step == 0 || step == o->steps - 1 || (step + 1) % 10 == 0) {
            float avg = loss;
            CHECK(dm_all_reduce(c, NULL, &avg, 1, DM_FLOAT32, DM_MEAN));
            if (step == 0) loss_first = avg;
            loss = avg;
            if (rank == 0) printf("step %3d  loss %.5f\n", step + 1, (double)avg);
        }
    }

    /* Did every rank end with the same weights? MIN and MAX of the hash agree only if so. */
    hash[0] = hash[1] = params_hash(&m);
    CHECK(dm_all_reduce(c, NULL, &hash[0], 1, DM_UINT64, DM_MIN));
    CHECK(dm_all_reduce(c, NULL, &hash[1], 1, DM_UINT64, DM_MAX));
    if (rank == 0) {
        printf("%.2f ms per step, of which %.2f ms waiting for gradients (%s)\n",
               1e3 * t_steps / o->steps, 1e3 * t_wait / o->steps,
               o->overlap ? "dm_wait_all" : "blocking all-reduces");
        printf("weights %s on all %d ranks (hash min %016llx max %016llx)\n",
               hash[0] == hash[1] ? "identical" : "DIFFER", world, (unsigned long long)hash[0],
               (unsigned long long)hash[1]);
        printf("loss %.6f -> %.6f: %s\n", (double)loss_first, (double)loss,
               loss < 0.5f * loss_first ? "down" : "NOT DOWN ENOUGH");
    }
    if (hash[0] != hash[1] || !(loss < 0.5f * loss_first)) st = DM_ERR_INTERNAL;
done:
    for (k = 0; k < m.nbuckets; k++) dm_compress_state_destroy(m.B[k].state);
    model_free(&m);
    free(x);
    free(y);
    return st;
}

#if defined(DISTMESH_TCP)
/* ---- --elastic: lose a rank, shrink, go on; --rejoin: grow back -------------------------------
   This process becomes a supervisor: it forks --ranks rank processes (default 3) that meet
   through a file store in a private temporary directory (a file store survives any rank's
   death; a TCP store would die with the rank that hosts it). When rank --victim (default 1)
   reaches step --kill-at (default steps / 3) it tells the supervisor and stalls; the supervisor
   kill -9's it while the others wait in that step's all-reduce. The survivors' next collective fails (DM_ERR_PEER_LOST); each then:
     - shrinks: dm_shrink(c, NULL, 0, DM_SHRINK_ABORT, &c2) (the requests in flight complete
       with their errors first; the survivors agree on who is gone);
     - agrees on the step to resume from: the last step every survivor finished (one may have
       finished one step more than another: it rolls back to its weights before that step),
       then checks that every survivor holds the same weights;
     - re-shards the data: the dataset is the --ranks original shards, rank i of S takes shards
       i, i + S, ...; and rescales: DM_MEAN now averages over the S survivors.
   With --rejoin the supervisor starts a replacement process right after the kill; it joins
   through the same store (desc.join) and waits. At step --rejoin-at (default 2 * steps / 3)
   the group calls dm_grow(c, 1, &g), rank 0 broadcasts the step and the weights, everyone
   re-shards again and trains on. --kill-at 0 kills nobody (--rejoin then grows the group by one
   newcomer). At the end every process checks that all ranks hold identical weights and that
   the loss went down; the supervisor exits 0 only if every survivor and the newcomer did. */
#define ELASTIC_PREFIX "ddp-elastic/"

/* The shards rank `rank` of `size` trains on: original shards rank, rank + size, ... of
   `shards`. *n gets the number of samples. */
static int load_shards(int rank, int size, int shards, float** x, float** y, size_t* n) {
    int j, k = 0;
    size_t per = (size_t)SHARD;
    for (j = rank; j < shards; j += size) k++;
    free(*x);
    free(*y);
    *x = (float*)malloc((size_t)k * per * IN_DIM * sizeof(float));
    *y = (float*)malloc((size_t)k * per * sizeof(float));
    if (!*x || !*y) return -1;
    for (j = rank, k = 0; j < shards; j += size, k++) make_shard(j, *x + (size_t)k * per * IN_DIM, *y + (size_t)k * per);
    *n = (size_t)k * per;
    return 0;
}

typedef struct elastic {
    dm_collective* c;
    model m;
    float* before_last;     /* the weights before the last step this rank finished */
    float* scratch;
    float *x, *y;
    size_t n;               /* samples in x, y */
    int done;               /* steps finished (SGD updates applied) */
    int grown;              /* the --rejoin grow happened (or this is the newcomer) */
    float loss_first, loss;
} elastic;

static int elastic_shard(elastic* e, const options* o) {
    int size = dm_world_size(e->c);
    if (load_shards(dm_rank(e->c), size, size > o->ranks ? size : o->ranks, &e->x, &e->y, &e->n) != 0) return -1;
    if (e->n < (size_t)o->batch) {
        fprintf(stderr, "rank %d: %zu samples, fewer than a batch\n", dm_rank(e->c), e->n);
        return -1;
    }
    return 0;
}

/* Both weights hashes' MIN and MAX over the group: 0 when every rank holds the same bytes. */
static dm_status weights_agree(dm_collective* c, const model* m, int* same) {
    uint64_t h[2];
    dm_status st;
    h[0] = h[1] = params_hash(m);
    if ((st = dm_all_reduce(c, NULL, &h[0], 1, DM_UINT64, DM_MIN)) != DM_OK) return st;
    if ((st = dm_all_reduce(c, NULL, &h[1], 1, DM_UINT64, DM_MAX)) != DM_OK) return st;
    *same = h[0] == h[1];
    return DM_OK;
}

/* After a failed step: shrink, agree on the step, roll back, re-shard. */
static dm_status elastic_recover(elastic* e, const options* o, dm_status why) {
    dm_collective* c2 = NULL;
    int old_rank = dm_rank(e->c), old_size = dm_world_size(e->c), same = 0;
    int32_t steps[2];
    double t0 = now_s(), t_shrunk;
    dm_status st = dm_shrink(e->c, NULL, 0, DM_SHRINK_ABORT, &c2);
    if (st != DM_OK) {
        fprintf(stderr, "rank %d: dm_shrink after %s failed: %s: %s\n", old_rank, dm_status_name(why),
                dm_status_name(st), dm_last_error(e->c));
        return st;
    }
    t_shrunk = now_s();
    dm_destroy(e->c);
    e->c = c2;
    /* every survivor finished step `done` - 1 or `done`: resume from the smaller */
    steps[0] = e->done;
    steps[1] = -e->done;
    if ((st = dm_all_reduce(c2, NULL, steps, 2, DM_INT32, DM_MIN)) != DM_OK) return st;
    if (-steps[1] - steps[0] > 1) {
        fprintf(stderr, "rank %d: survivors finished steps %d .. %d: more than one apart\n", dm_rank(c2), steps[0],
                -steps[1]);
        return DM_ERR_INTERNAL;
    }
    if (e->done > steps[0]) memcpy(e->m.params, e->before_last, e->m.nparams * sizeof(float));
    e->done = steps[0];
    if ((st = weights_agree(c2, &e->m, &same)) != DM_OK) return st;
    if (!same) {
        fprintf(stderr, "rank %d: the survivors' weights DIFFER at step %d\n", dm_rank(c2), e->done);
        return DM_ERR_INTERNAL;
    }
    if (elastic_shard(e, o) != 0) return DM_ERR_OUT_OF_MEMORY;
    printf("rank %d -> %d: %s at step %d; shrunk from %d to %d ranks in %.1f ms, weights identical, resuming "
           "at step %d on %zu samples\n", old_rank, dm_rank(c2), dm_status_name(why), e->done + 1, old_size,
           dm_world_size(c2), 1e3 * (t_shrunk - t0), e->done + 1, e->n);
    return DM_OK;
}

/* The group's rank 0 gives the newcomers the step and the weights (members: after dm_grow;
   the newcomer: after its join). */
static dm_status elastic_receive_state(elastic* e) {
    int32_t step = e->done;
    dm_status st = dm_broadcast(e->c, &step, 1, DM_INT32, 0);
    if (st == DM_OK) st = dm_broadcast(e->c, &e->loss_first, 1, DM_FLOAT32, 0);
    if (st == DM_OK) st = dm_broadcast(e->c, e->m.params, e->m.nparams, DM_FLOAT32, 0);
    e->done = step;
    return st;
}

static dm_status elastic_grow(elastic* e, const options* o) {
    dm_collective* g = NULL;
    double t0 = now_s();
    dm_status st = dm_grow(e->c, 1, &g);
    if (st != DM_OK) {
        fprintf(stderr, "rank %d: dm_grow failed: %s: %s\n", dm_rank(e->c), dm_status_name(st), dm_last_error(e->c));
        return st;
    }
    dm_destroy(e->c);
    e->c = g;
    e->grown = 1;
    if ((st = elastic_receive_state(e)) != DM_OK) return st;
    if (elastic_shard(e, o) != 0) return DM_ERR_OUT_OF_MEMORY;
    if (dm_rank(g) == 0)
        printf("grew to %d ranks at step %d in %.1f ms (the newcomer is rank %d; weights sent by broadcast)\n",
               dm_world_size(g), e->done + 1, 1e3 * (now_s() - t0), dm_world_size(g) - 1);
    return DM_OK;
}

/* Trains from step e->done to o->steps, surviving lost ranks; victim_fd >= 0: the victim's pipe
   to the supervisor. Returns 0 when this rank ends with the group's weights and a lower loss. */
static int elastic_train(elastic* e, const options* o, int victim_fd) {
    dm_status st = DM_OK;
    int same = 0;
    while (e->done < o->steps) {
        size_t first;
        float loss = 0, avg;
        double tw;
        if (victim_fd >= 0 && e->done == o->kill_at) {
            char k = 'k';
            if (write(victim_fd, &k, 1) != 1) return 1;
            /* the supervisor kill -9's us now; meanwhile the others wait in this step's
               all-reduce, so the death lands mid-step on every survivor */
            {
                struct timespec two = {2, 0};
                nanosleep(&two, NULL);
            }
            victim_fd = -1;
        }
        if (o->rejoin && !e->grown && e->done == o->rejoin_at && (st = elastic_grow(e, o)) != DM_OK) return 1;
        first = (size_t)e->done * (size_t)o->batch % (e->n - (size_t)o->batch + 1);
        st = forward_backward_reduce(e->c, &e->m, o, e->x + first * IN_DIM, e->y + first, &loss, &tw);
        avg = loss;
        if (st == DM_OK) st = dm_all_reduce(e->c, NULL, &avg, 1, DM_FLOAT32, DM_MEAN);
        if (st != DM_OK) {
            if (st != DM_ERR_PEER_LOST && st != DM_ERR_TIMEOUT && st != DM_ERR_ABORTED) {
                fprintf(stderr, "rank %d: step %d: %s: %s\n", dm_rank(e->c), e->done + 1, dm_status_name(st),
                        dm_last_error(e->c));
                return 1;
            }
            if (elastic_recover(e, o, st) != DM_OK) return 1;
            continue;
        }
        /* SGD step, keeping the weights before it (a survivor may have to roll back one step) */
        {
            float* t = e->before_last;
            size_t i;
            memcpy(e->scratch, e->m.params, e->m.nparams * sizeof(float));
            e->before_last = e->scratch;
            e->scratch = t;
            for (i = 0; i < e->m.nparams; i++) e->m.params[i] -= o->lr * e->m.grads[i];
        }
        if (e->done == 0) e->loss_first = avg;
        e->loss = avg;
        e->done++;
        if (dm_rank(e->c) == 0 && (e->done % 10 == 0 || e->done == o->steps))
            printf("step %3d  loss %.5f  (%d ranks)\n", e->done, (double)avg, dm_world_size(e->c));
    }
    if ((st = weights_agree(e->c, &e->m, &same)) != DM_OK) {
        fprintf(stderr, "rank %d: final check: %s: %s\n", dm_rank(e->c), dm_status_name(st), dm_last_error(e->c));
        return 1;
    }
    if (dm_rank(e->c) == 0)
        printf("elastic: weights %s on all %d ranks (hash %016llx); loss %.5f -> %.5f: %s\n",
               same ? "identical" : "DIFFER", dm_world_size(e->c), (unsigned long long)params_hash(&e->m),
               (double)e->loss_first, (double)e->loss, e->loss < 0.5f * e->loss_first ? "down" : "NOT DOWN ENOUGH");
    return same && e->loss < 0.5f * e->loss_first ? 0 : 1;
}

static void elastic_free(elastic* e) {
    dm_destroy(e->c);
    model_free(&e->m);
    free(e->before_last);
    free(e->scratch);
    free(e->x);
    free(e->y);
}

/* Warnings and errors only: the setup's info lines would drown the training log. */
static void log_warnings(dm_log_level level, dm_status st, const char* msg, const char* file, int line, void* user) {
    if (level <= DM_LOG_WARN) dm_log_stderr(level, st, msg, file, line, user);
}

/* One process: a rank of the original group (rank >= 0) or the newcomer (rank < 0). */
static int elastic_process(const options* o, const char* url, int rank, int victim_fd) {
    dm_tcp_desc d;
    elastic e;
    dm_status st;
    int rc = 1;
    memset(&e, 0, sizeof(e));
    memset(&d, 0, sizeof(d));
    d.store_url = url;
    d.prefix = ELASTIC_PREFIX;
    d.ifname = "lo";
    d.timeout_ms = 30000;
    d.logger.func = log_warnings;
    if (rank >= 0) { d.rank = rank; d.world_size = o->ranks; }
    else d.join = 1;
    if (model_init(&e.m, o) != 0) goto done;
    e.before_last = (float*)malloc(e.m.nparams * sizeof(float));
    e.scratch = (float*)malloc(e.m.nparams * sizeof(float));
    if (!e.before_last || !e.scratch) goto done;
    if ((st = dm_tcp_create(&d, &e.c)) != DM_OK) {
        fprintf(stderr, "%s %d: dm_tcp_create: %s\n", rank >= 0 ? "rank" : "newcomer", rank, dm_status_name(st));
        goto done;
    }
    if (rank < 0) {
        e.grown = 1;
        if ((st = elastic_receive_state(&e)) != DM_OK) goto done;
        printf("newcomer: joined as rank %d of %d at step %d, weights received\n", dm_rank(e.c),
               dm_world_size(e.c), e.done + 1);
    } else if (rank == 0) {
        printf("elastic: %d ranks (%s transport), %zu parameters; ", o->ranks, dm_transport_name(e.c), e.m.nparams);
        if (o->kill_at > 0) printf("kill -9 of rank %d at step %d", o->victim, o->kill_at + 1);
        else printf("nobody killed");
        printf("%s\n", o->rejoin ? o->kill_at > 0 ? ", a replacement rejoins" : ", a newcomer joins" : "");
    }
    if (elastic_shard(&e, o) != 0) goto done;
    rc = elastic_train(&e, o, victim_fd);
done:
    elastic_free(&e);
    return rc;
}

static int elastic_main(const options* o) {
    char dir[] = "/tmp/ddp_elastic_XXXXXX", url[64], cmd[96];
    pid_t pids[MAX_RANKS + 1];
    int pfd[2], r, nproc = 0, failed = 0;
    if (!mkdtemp(dir) || pipe(pfd) != 0) {
        perror("ddp_overlap --elastic");
        return 1;
    }
    snprintf(url, sizeof(url), "file://%s", dir);
    setvbuf(stdout, NULL, _IOLBF, 0);   /* every process's lines come whole and in time */
    for (r = 0; r < o->ranks; r++) {
        pid_t p = fork();
        if (p == 0) {
            close(pfd[0]);
            if (r != o->victim) close(pfd[1]);
            exit(elastic_process(o, url, r, r == o->victim && o->kill_at > 0 ? pfd[1] : -1));
        }
        pids[nproc++] = p;
    }
    close(pfd[1]);
    if (o->kill_at > 0) {
        char k;
        if (read(pfd[0], &k, 1) == 1) {
            kill(pids[o->victim], SIGKILL);
            printf("supervisor: kill -9 of rank %d (pid %d) at step %d\n", o->victim, (int)pids[o->victim],
                   o->kill_at + 1);
        } else {
            fprintf(stderr, "supervisor: rank %d ended before step %d\n", o->victim, o->kill_at + 1);
            failed++;
        }
    }
    close(pfd[0]);
    if (o->rejoin) {
        pid_t p;
        fflush(stdout);
        p = fork();
        if (p == 0) exit(elastic_process(o, url, -1, -1));
        pids[nproc++] = p;
    }
    for (r = 0; r < nproc; r++) {
        int status = 0;
        bool victim = r == o->victim && o->kill_at > 0;
        waitpid(pids[r], &status, 0);
        if (victim ? !(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
                   : !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
            fprintf(stderr, "supervisor: %s %d ended badly (status 0x%x)\n", r < o->ranks ? "rank" : "newcomer",
                    r < o->ranks ? r : 0, status);
            failed++;
        }
    }
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "supervisor: could not remove %s\n", dir);
    printf("elastic: %s\n", failed ? "FAILED" : "every survivor and newcomer finished with identical weights");
    return failed ? 1 : 0;
}

#endif /* DISTMESH_TCP */

static int parse(int argc, char** argv, options* o) {
    int i;
    o->steps = 60; o->hidden = 512; o->layers = 4; o->batch = 32; o->threads = 2;
    o->overlap = 1; o->bucket_mb = 1.0; o->lr = 0.05f;
    o->hosts = 1; o->compress = DM_COMPRESS_DEFAULT; o->feedback = 1;
    o->elastic = 0; o->rejoin = 0; o->ranks = 3; o->victim = 1; o->kill_at = -1; o->rejoin_at = -1;
    for (i = 1; i < argc; i++) {
        const char* a = argv[i];
        const char* v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--no-overlap") == 0) { o->overlap = 0; continue; }
        if (strcmp(a, "--elastic") == 0) { o->elastic = 1; continue; }
        if (strcmp(a, "--rejoin") == 0) { o->elastic = 1; o->rejoin = 1; continue; }
        if (strcmp(a, "--no-feedback") == 0) { o->feedback = 0; continue; }
        if (!v) goto bad;
        if (strcmp(a, "--steps") == 0) o->steps = atoi(v);
        else if (strcmp(a, "--hidden") == 0) o->hidden = atoi(v);
        else if (strcmp(a, "--layers") == 0) o->layers = atoi(v);
        else if (strcmp(a, "--batch") == 0) o->batch = atoi(v);
        else if (strcmp(a, "--threads") == 0) o->threads = atoi(v);
        else if (strcmp(a, "--bucket-mb") == 0) o->bucket_mb = atof(v);
        else if (strcmp(a, "--lr") == 0) o->lr = (float)atof(v);
        else if (strcmp(a, "--ranks") == 0) o->ranks = atoi(v);
        else if (strcmp(a, "--victim") == 0) o->victim = atoi(v);
        else if (strcmp(a, "--kill-at") == 0) o->kill_at = atoi(v);
        else if (strcmp(a, "--rejoin-at") == 0) o->rejoin_at = atoi(v);
        else if (strcmp(a, "--hosts") == 0) o->hosts = atoi(v);
        else if (strcmp(a, "--compress") == 0) {
            if (strcmp(v, "none") == 0) o->compress = DM_COMPRESS_NONE;
            else if (strcmp(v, "bf16") == 0) o->compress = DM_COMPRESS_BF16;
            else if (strcmp(v, "int8") == 0) o->compress = DM_COMPRESS_INT8;
            else goto bad;
        }
        else goto bad;
        i++;
    }
    if (o->kill_at < 0) o->kill_at = o->steps / 3;
    if (o->rejoin_at < 0) o->rejoin_at = 2 * o->steps / 3;
    if (o->steps >= 1 && o->hidden >= 1 && o->layers >= 1 && o->layers < MAX_LAYERS &&
        o->batch >= 1 && o->batch <= SHARD && o->threads >= 1 && o->bucket_mb >= 0 &&
        o->hosts >= 1 && o->hosts <= o->threads && o->threads <= 64 &&
        (!o->elastic || (o->ranks >= 2 && o->ranks <= MAX_RANKS && o->victim >= 0 && o->victim < o->ranks &&
                         o->kill_at < o->steps && (!o->rejoin || (o->rejoin_at > o->kill_at && o->rejoin_at < o->steps)))))
        return 0;
bad:
    fprintf(stderr, "usage: %s [--steps N] [--bucket-mb MiB] [--hidden N] [--layers N<%d] "
            "[--batch N<=%d] [--lr X] [--threads N<=64] [--hosts H] [--no-overlap] [--compress none|bf16|int8] "
            "[--no-feedback]\n"
            "       %s --elastic [--rejoin] [--ranks 2..%d] [--victim R] [--kill-at STEP (0: none)] "
            "[--rejoin-at STEP > kill-at] [the options above]\n", argv[0], MAX_LAYERS, SHARD, argv[0], MAX_RANKS);
    return -1;
}

int main(int argc, char** argv) {
    options o;
    dm_env env;
    dm_status st;
    if (parse(argc, argv, &o) != 0) return 2;
    if (o.elastic) {
#if defined(DISTMESH_TCP)
        return elastic_main(&o);
#else
        fprintf(stderr, "--elastic needs the TCP backend (build with -DDISTMESH_TCP)\n");
        return 2;
#endif
    }
    st = dm_env_detect(&env);
    if (st != DM_OK) {
        fprintf(stderr, "%s\n", env.error);
        return 1;
    }
    if (env.is_distributed) {          /* a launcher started us: one rank per process */
        dm_init_desc desc = {0};
        dm_collective* c = NULL;
        desc.timeout_ms = 60000;
        desc.logger.func = dm_log_stderr;
        st = dm_init(&desc, &c);
        if (st != DM_OK) {
            fprintf(stderr, "init failed: %s\n", dm_strerror(st));
            return 1;
        }
        st = (dm_status)train(c, &o);
        dm_destroy(c);
    } else {                           /* no launcher: o.threads ranks on threads */
        dm_fake_desc desc = {0};
        int hosts[64], r;
        for (r = 0; r < o.threads; r++) hosts[r] = r * o.hosts / o.threads;    /* blocks, host order */
        desc.world_size = o.threads;
        desc.host_of = hosts;
        desc.timeout_ms = 60000;
        st = dm_thread_world_run(&desc, train, &o);
    }
    return st == DM_OK ? 0 : 1;
}
