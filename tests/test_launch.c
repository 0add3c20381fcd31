/* Launchers without MASTER_* variables (distmesh_tcp.h >>tcp launch): the Slurm hostlist parser,
   the rendezvous derived from simulated mpirun / srun environments (variables only), the
   messages that say what to set, the launcher's LOCAL_RANK winning over host names, a world
   size disagreement named as such, waiters naming missing ranks, and the launcher examples
   (examples/launch_*.sh) for real: `mpirun -np 4` (skipped where openmpi-bin is missing),
   Debian's torchrun (skipped where torch does not import), srun in a private single-node Slurm
   (skipped where slurm-wlm, munge or root is missing) and by hand. Ranks are forked children
   (tests/test_world.h: reaped within 60 s) or the launchers' processes; every rank has a hard
   deadline (DISTMESH_TIMEOUT), every launcher runs under `timeout`, and the program under
   tests/run.sh's timeout. */
#define _GNU_SOURCE
#include "distmesh.h"
#include <errno.h>
#include "prelude.h"
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "test_world.h"

#ifndef DM_EXAMPLE
#define DM_EXAMPLE "build/plain/examples/tcp_all_reduce"
#endif
#ifndef DM_SRCDIR
#define DM_SRCDIR "."
#endif

static char g_tmp[64];
static tw_world g_ranks;        /* the running test's forked ranks */

static const char* const g_launch_vars[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_USE_AGENT_STORE", "DISTMESH_STORE", "DISTMESH_RANK", "DISTMESH_WORLD_SIZE",
    "DISTMESH_LOCAL_RANK", "DISTMESH_LOCAL_WORLD_SIZE", "DISTMESH_TIMEOUT", "XDG_RUNTIME_DIR",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "PMIX_SERVER_TMPDIR",
    "OMPI_MCA_orte_jobfam_session_dir", "PMI_RANK", "PMI_SIZE",
    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE", "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_STEP_NUM_NODES", "SLURM_NNODES",
    "SLURM_JOB_NUM_NODES", "SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST",
};

static void clear_env(void) {
    size_t i;
    tw_kill_all(&g_ranks);      /* a failed test's ranks, if any */
    memset(&g_ranks, 0, sizeof(g_ranks));
    for (i = 0; i < sizeof(g_launch_vars) / sizeof(g_launch_vars[0]); i++) unsetenv(g_launch_vars[i]);
    setenv("TMPDIR", g_tmp, 1);
}

/* "A=1 B=2 ..." into the environment */
static void put_env(const char* spec) {
    char buf[1024], *save = NULL, *tok;
    snprintf(buf, sizeof(buf), "%s", spec);
    for (tok = strtok_r(buf, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
        char* eq = strchr(tok, '=');
        assert_non_null(eq);
        *eq = 0;
        setenv(tok, eq + 1, 1);
    }
}

static int setup(void** state) { (void)state; return tmpdir_make(g_tmp, sizeof(g_tmp), "dm_launch"); }
static int teardown(void** state) { (void)state; return tmpdir_remove(g_tmp); }

static void expect_host(const char* list, long index, long count, const char* host) {
    char out[64];
    long n = dm_slurm_hostlist(list, index, out, sizeof(out));
    if (n != count || (host && strcmp(out, host) != 0))
        fail_msg("hostlist \"%s\"[%ld]: got %ld hosts, \"%s\"; expected %ld, \"%s\"", list, index, n, out, count,
                 host ? host : "");
}

static void test_launch_hostlist_parser(void** state) {
    (void)state;
    expect_host("node01", 0, 1, "node01");
    expect_host("node[01-04,07]", 0, 5, "node01");
    expect_host("node[01-04,07]", 3, 5, "node04");
    expect_host("node[01-04,07]", 4, 5, "node07");
    expect_host("a1,b[8-10],c", 2, 5, "b9");
    expect_host("a1,b[8-10],c", 3, 5, "b10");
    expect_host("a1,b[8-10],c", 4, 5, "c");
    expect_host("node[008-010]", 2, 3, "node010");
    expect_host("rack[1-2]-n[01-03]", 0, 6, "rack1-n01");
    expect_host("rack[1-2]-n[01-03]", 4, 6, "rack2-n02");
    expect_host("gpu-a[3]x", 0, 1, "gpu-a3x");
    expect_host("node[1-2]", 5, 2, "");          /* out of range: count only */
    expect_host("", 0, -1, NULL);
    expect_host("node[", 0, -1, NULL);
    expect_host("node[]", 0, -1, NULL);
    expect_host("node[4-1]", 0, -1, NULL);
    expect_host("node[1-x]", 0, -1, NULL);
    expect_host("node]1[", 0, -1, NULL);
    expect_host("a,", 0, -1, NULL);
    expect_host("a,,b", 0, -1, NULL);
    expect_host("n[[1]]", 0, -1, NULL);
    expect_host("n[0-99999999]", 0, -1, NULL);   /* more than a million hosts */
    assert_int_equal(dm_slurm_hostlist(NULL, 0, NULL, 0), -1);
}

static void test_launch_slurm_two_nodes_first_node_job_port(void** state) {
    dm_tcp_launch l;
    (void)state;
    clear_env();
    put_env("SLURM_PROCID=5 SLURM_NTASKS=8 SLURM_LOCALID=1 SLURM_NODEID=1 SLURM_NTASKS_PER_NODE=4 "
            "SLURM_JOB_ID=1234 SLURM_STEP_ID=2 SLURM_STEP_NUM_NODES=2 SLURM_STEP_NODELIST=node[07-08] "
            "SLURM_JOB_NODELIST=node[01-09]");
    assert_int_equal(dm_tcp_launch_detect(&l), DM_OK);
    assert_string_equal(l.launcher, "slurm");
    /* 15000 + (16 * 1234 + 2) % 20000 */
    assert_string_equal(l.url, "tcp://node07:34746");
    assert_false(l.is_server);
    put_env("SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NODEID=0");
    assert_int_equal(dm_tcp_launch_detect(&l), DM_OK);
    assert_true(l.is_server);
    /* without the step's list the job's is used; MASTER_PORT alone picks the port */
    unsetenv("SLURM_STEP_NODELIST");
    put_env("MASTER_PORT=4000");
    assert_int_equal(dm_tcp_launch_detect(&l), DM_OK);
    assert_string_equal(l.url, "tcp://node01:4000");
    put_env("SLURM_JOB_NODELIST=node[01-");
    unsetenv("MASTER_PORT");
    assert_int_equal(dm_tcp_launch_detect(&l), DM_ERR_ENV);
    assert_non_null(strstr(l.error, "MASTER_ADDR"));
}

static void test_launch_single_host_private_file_store(void** state) {
    dm_tcp_launch l;
    char dir[128];
    struct stat st;
    (void)state;
    clear_env();
    put_env("SLURM_PROCID=1 SLURM_NTASKS=4 SLURM_LOCALID=1 SLURM_NTASKS_PER_NODE=4 SLURM_JOB_ID=77 "
            "SLURM_STEP_ID=0 SLURM_STEP_NUM_NODES=1 SLURM_STEP_NODELIST=n1");
    assert_int_equal(dm_tcp_launch_detect(&l), DM_OK);
    snprintf(dir, sizeof(dir), "file://%s/distmesh-%lu/slurm-77.0", g_tmp, (unsigned long)getuid());
    assert_string_equal(l.url, dir);
    snprintf(dir, sizeof(dir), "%s/distmesh-%lu", g_tmp, (unsigned long)getuid());
    assert_int_equal(stat(dir, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0700);
    clear_env();
    put_env("OMPI_COMM_WORLD_RANK=2 OMPI_COMM_WORLD_SIZE=4 OMPI_COMM_WORLD_LOCAL_RANK=2 "
            "OMPI_COMM_WORLD_LOCAL_SIZE=4 OMPI_MCA_ess_base_jobid=3291611137");
    assert_int_equal(dm_tcp_launch_detect(&l), DM_OK);
    assert_string_equal(l.launcher, "openmpi");
    assert_non_null(strstr(l.url, "/ompi-3291611137"));
    /* a directory that is not private is refused */
    assert_int_equal(chmod(dir, 0755), 0);
    assert_int_equal(dm_tcp_launch_detect(&l), DM_ERR_ENV);
    assert_non_null(strstr(l.error, "mode 0700"));
    assert_int_equal(chmod(dir, 0700), 0);
}

/* mpirun's session directory for the job (PMIX_SERVER_TMPDIR, else
   OMPI_MCA_orte_jobfam_session_dir) holds the store when it is a private directory of this
   user; one that others may enter is passed over for the private directory. */
static void test_launch_openmpi_store_in_session_dir(void** state) {
    dm_tcp_launch l;
    char sess[128], want[256], spec[512];
    struct stat st;
    (void)state;
    snprintf(sess, sizeof(sess), "%s/pid.4242", g_tmp);
    assert_int_equal(mkdir(sess, 0700), 0);
    clear_env();
    snprintf(spec, sizeof(spec), "OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_RANK=0 "
             "OMPI_COMM_WORLD_LOCAL_SIZE=2 OMPI_MCA_ess_base_jobid=3291611137 PMIX_SERVER_TMPDIR=%s", sess);
    put_env(spec);
    assert_int_equal(dm_tcp_launch_detect(&l), DM_OK);
    snprintf(want, sizeof(want), "file://%s/distmesh-ompi-3291611137", sess);
    assert_string_equal(l.url, want);
    assert_int_equal(stat(want + 7, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0700);
    assert_int_equal(chmod(sess, 0755), 0);
    assert_int_equal(dm_tcp_launch_detect(&l), DM_OK);
    snprintf(want, sizeof(want), "file://%s/distmesh-%lu/ompi-3291611137", g_tmp, (unsigned long)getuid());
    assert_string_equal(l.url, want);
    assert_int_equal(chmod(sess, 0700), 0);
    unsetenv("PMIX_SERVER_TMPDIR");
    setenv("OMPI_MCA_orte_jobfam_session_dir", sess, 1);
    assert_int_equal(dm_tcp_launch_detect(&l), DM_OK);
    snprintf(want, sizeof(want), "file://%s/distmesh-ompi-3291611137", sess);
    assert_string_equal(l.url, want);
}

static void test_launch_messages_say_what_to_set(void** state) {
    dm_tcp_launch l;
    (void)state;
    clear_env();
    put_env("OMPI_COMM_WORLD_RANK=2 OMPI_COMM_WORLD_SIZE=8 OMPI_COMM_WORLD_LOCAL_RANK=2 "
            "OMPI_COMM_WORLD_LOCAL_SIZE=4 OMPI_MCA_ess_base_jobid=5");
    assert_int_equal(dm_tcp_launch_detect(&l), DM_ERR_ENV);
    assert_non_null(strstr(l.error, "several hosts"));
    assert_non_null(strstr(l.error, "mpirun -x MASTER_ADDR"));
    clear_env();
    put_env("RANK=1 WORLD_SIZE=2");
    assert_int_equal(dm_tcp_launch_detect(&l), DM_ERR_ENV);
    assert_non_null(strstr(l.error, "MASTER_ADDR"));
    assert_non_null(strstr(l.error, "torchrun"));
    clear_env();
    put_env("PMI_RANK=1 PMI_SIZE=2");
    assert_int_equal(dm_tcp_launch_detect(&l), DM_ERR_ENV);
    assert_non_null(strstr(l.error, "-genv MASTER_ADDR"));
}

/* ---- forked ranks ---- */
static char g_log[2048];
static void capture(dm_log_level lvl, dm_status st, const char* msg, const char* file, int line, void* ud) {
    size_t n = strlen(g_log);
    (void)file; (void)line; (void)ud;
    snprintf(g_log + n, sizeof(g_log) - n, "%s[%d] %s\n", lvl == DM_LOG_WARN ? "W" : "E", (int)st, msg);
}

/* A forked rank: env spec, dm_init, writes its log and local rank/size to <g_tmp>/out.<tag>. */
typedef struct rank_spec { const char* spec; const char* tag; } rank_spec;
static int launch_rank(int index, void* ctx) {
    const rank_spec* x = (const rank_spec*)ctx;
    dm_init_desc d = {0};
    dm_collective* c = NULL;
    dm_status st;
    char path[160];
    FILE* f;
    (void)index;
    put_env(x->spec);
    d.logger.func = capture;
    st = dm_init(&d, &c);
    snprintf(path, sizeof(path), "%s/out.%s", g_tmp, x->tag);
    f = fopen(path, "w");
    if (f) {
        fprintf(f, "status %d local %d/%d\n%s", (int)st, c ? dm_local_rank(c) : -1,
                c ? dm_local_world_size(c) : -1, g_log);
        fclose(f);
    }
    dm_destroy(c);
    return st == DM_OK ? 0 : 1;
}
/* Forks a rank (65 s alarm) into g_ranks; its slot there. */
static int spawn_rank(const char* spec, const char* tag) {
    rank_spec x;
    x.spec = spec;
    x.tag = tag;
    g_ranks.alarm_s = 65;
    g_ranks.quick_exit = true;
    return tw_spawn(&g_ranks, NULL, g_ranks.n, launch_rank, &x);
}
static void read_out(const char* tag, char* buf, size_t cap) {
    char path[160];
    FILE* f;
    size_t n;
    snprintf(path, sizeof(path), "%s/out.%s", g_tmp, tag);
    f = fopen(path, "r");
    buf[0] = 0;
    if (!f) return;
    n = fread(buf, 1, cap - 1, f);
    buf[n] = 0;
    fclose(f);
}
/* The rank's exit status once it ended (60 s at most: then it is killed, 128 + 9). */
static int wait_child(int slot) {
    bool which[TW_MAX_PROCS] = { false };
    which[slot] = true;
    tw_reap_some(&g_ranks, which, 60);
    return tw_exit_code(&g_ranks, slot);
}

static void test_launch_local_rank_from_launcher_wins(void** state) {
    int pids[4];
    int r;
    char spec[512], tag[16], out[4096], want[64];
    (void)state;
    clear_env();
    for (r = 0; r < 4; r++) {
        snprintf(spec, sizeof(spec), "RANK=%d WORLD_SIZE=4 LOCAL_RANK=%d LOCAL_WORLD_SIZE=2 DISTMESH_TIMEOUT=20 "
                 "DISTMESH_STORE=file://%s/local", r, r % 2, g_tmp);
        snprintf(tag, sizeof(tag), "l%d", r);
        pids[r] = spawn_rank(spec, tag);
    }
    for (r = 0; r < 4; r++) assert_int_equal(wait_child(pids[r]), 0);
    for (r = 0; r < 4; r++) {
        snprintf(tag, sizeof(tag), "l%d", r);
        read_out(tag, out, sizeof(out));
        snprintf(want, sizeof(want), "status 0 local %d/2", r % 2);
        if (strncmp(out, want, strlen(want)) != 0) fail_msg("rank %d: %s", r, out);
        /* one host runs all four: the host names disagree, which is a warning */
        if (!strstr(out, "W[0] tcp: the launcher says local rank")) fail_msg("rank %d: no warning: %s", r, out);
    }
}

static void test_launch_world_size_disagreement_named(void** state) {
    int a, b;
    char spec[512], o1[4096], o2[4096];
    (void)state;
    clear_env();
    snprintf(spec, sizeof(spec), "RANK=0 WORLD_SIZE=2 DISTMESH_TIMEOUT=4 DISTMESH_STORE=file://%s/ws", g_tmp);
    a = spawn_rank(spec, "w0");
    snprintf(spec, sizeof(spec), "RANK=1 WORLD_SIZE=3 DISTMESH_TIMEOUT=4 DISTMESH_STORE=file://%s/ws", g_tmp);
    b = spawn_rank(spec, "w1");
    assert_int_equal(wait_child(a), 1);
    assert_int_equal(wait_child(b), 1);
    read_out("w0", o1, sizeof(o1));
    read_out("w1", o2, sizeof(o2));
    if (!(strstr(o1, "world size disagreement") && strstr(o1, "world size 2") && strstr(o1, "has 3")) &&
        !(strstr(o2, "world size disagreement") && strstr(o2, "world size 3") && strstr(o2, "has 2")))
        fail_msg("no rank named the disagreement:\n%s\n%s", o1, o2);
}

static void test_launch_waiters_name_missing_ranks(void** state) {
    int a;
    char spec[512], out[4096];
    (void)state;
    clear_env();
    snprintf(spec, sizeof(spec), "RANK=0 WORLD_SIZE=3 DISTMESH_TIMEOUT=2.5 DISTMESH_STORE=file://%s/miss", g_tmp);
    a = spawn_rank(spec, "m0");
    assert_int_equal(wait_child(a), 1);
    read_out("m0", out, sizeof(out));
    if (!strstr(out, "W[0] tcp: rank 0 has waited 1 s for ranks 1-2 of 3 to join"))
        fail_msg("no progress warning: %s", out);
    if (!strstr(out, "ranks 1-2 of 3 never joined")) fail_msg("no final message: %s", out);
    if (!strstr(out, "status -")) fail_msg("%s", out);
}

static void test_launch_missing_store_message(void** state) {
    int a;
    char out[4096];
    (void)state;
    clear_env();
    a = spawn_rank("RANK=1 WORLD_SIZE=2", "s0");
    assert_int_equal(wait_child(a), 1);
    read_out("s0", out, sizeof(out));
    if (!strstr(out, "tcp: no store: RANK and WORLD_SIZE are set but MASTER_ADDR and MASTER_PORT are not"))
        fail_msg("%s", out);
}

/* A job id that comes again (OpenMPI's repeat over thousands of launches: 16 bits of them come
   from mpirun's pid) with another world size: a 2-rank job, then a 3-rank job with the same id,
   each with its own session directory, as mpirun makes them. The second creates at once. With
   the store keyed by the id alone, it found the first job's generation counter at 2, and its
   ranks drew 3, 4 and 5: generation 0 for one, 1 for two, each waiting for 3 ranks until the
   deadline. */
static void test_launch_repeated_job_id_other_size(void** state) {
    int pids[3], r, w;
    char spec[512], tag[16], out[4096], sess[128];
    (void)state;
    for (w = 2; w <= 3; w++) {
        clear_env();
        snprintf(sess, sizeof(sess), "%s/pid.%d", g_tmp, 5000 + w);
        assert_int_equal(mkdir(sess, 0700), 0);
        for (r = 0; r < w; r++) {
            snprintf(spec, sizeof(spec), "OMPI_COMM_WORLD_RANK=%d OMPI_COMM_WORLD_SIZE=%d OMPI_COMM_WORLD_LOCAL_RANK=%d "
                     "OMPI_COMM_WORLD_LOCAL_SIZE=%d OMPI_MCA_ess_base_jobid=777 PMIX_SERVER_TMPDIR=%s DISTMESH_TIMEOUT=5",
                     r, w, r, w, sess);
            snprintf(tag, sizeof(tag), "j%d.%d", w, r);
            pids[r] = spawn_rank(spec, tag);
        }
        for (r = 0; r < w; r++) {
            snprintf(tag, sizeof(tag), "j%d.%d", w, r);
            if (wait_child(pids[r]) != 0) {
                read_out(tag, out, sizeof(out));
                fail_msg("job of %d ranks, rank %d: %s", w, r, out);
            }
        }
    }
}

/* ---- the launcher examples (examples/launch_*.sh running examples/tcp_all_reduce) ---- */
/* Runs examples/<script> on DM_EXAMPLE with ENV (a string of VAR=value words) under a hard
   timeout, output in OUT. Returns the exit status. */
static int run_example(const char* env, const char* script, char* out, size_t cap) {
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "env -u MAKEFLAGS -u MAKELEVEL DISTMESH_TIMEOUT=60 %s %s/examples/%s %s", env, DM_SRCDIR,
             script, DM_EXAMPLE);
    return tw_run_cmd(120, out, cap, cmd);
}
static int count_of(const char* out, const char* needle) {
    const char* p;
    int n = 0;
    for (p = out; (p = strstr(p, needle)) != NULL; p++) n++;
    return n;
}
static int free_port(void) {
    int port = tw_free_port();
    assert_true(port > 0);
    return port;
}

/* A real mpirun (examples/launch_mpirun.sh): no MASTER_*, no DISTMESH_* variables; local ranks
   from mpirun, shared memory between the ranks. */
static void test_launch_mpirun_np4(void** state) {
    char out[8192];
    int rc, lines;
    (void)state;
    if (system("command -v mpirun > /dev/null 2>&1") != 0) {
        fprintf(stderr, "SKIP: mpirun not installed (openmpi-bin)\n");
        skip();
    }
    clear_env();
    rc = run_example("NPROC=4", "launch_mpirun.sh", out, sizeof(out));
    lines = count_of(out, "mean 1.5, expected 1.5");
    if (rc != 0 || lines != 4) fail_msg("mpirun exit %d, %d good ranks:\n%s", rc, lines, out);
    if (!strstr(out, "local 3/4")) fail_msg("local ranks not from mpirun:\n%s", out);
    if (count_of(out, "of 4 (tcp backend, shm transport") != 4) fail_msg("transport:\n%s", out);
}

/* Debian's torchrun (torch 1.13 on Python 3.11) through examples/launch_torchrun.sh: static
   rendezvous on a free port, the agent's torch < 2.2 store, 2 ranks. The script's --redirects /
   --tee values get past torch 1.13's crash on Python 3.11 (see the script). */
static void test_launch_torchrun_example(void** state) {
    char out[8192], env[256];
    int rc;
    (void)state;
    if (system("/usr/bin/python3 -c 'import torch.distributed.run' > /dev/null 2>&1") != 0) {
        fprintf(stderr, "SKIP: torch does not import in /usr/bin/python3 (python3-torch)\n");
        skip();
    }
    clear_env();
    snprintf(env, sizeof(env), "NPROC=2 MASTER_PORT=%d TORCHRUN='/usr/bin/python3 -m torch.distributed.run'",
             free_port());
    rc = run_example(env, "launch_torchrun.sh", out, sizeof(out));
    if (rc != 0 || count_of(out, "mean 0.5, expected 0.5") != 2) fail_msg("torchrun exit %d:\n%s", rc, out);
    if (!strstr(out, "rank 1 of 2 (tcp backend, shm transport, local 1/2)")) fail_msg("placement:\n%s", out);
}

/* srun (examples/launch_srun.sh) in a private single-node Slurm (tests/slurm_single_node.sh: its
   own munge key, slurm.conf and ports); no MASTER_*, no DISTMESH_* variables. Skipped where that
   cannot run (not root, slurm-wlm or munge missing). */
static void test_launch_srun_example(void** state) {
    char cmd[2048], out[16384];
    int rc, ctld = free_port(), slurmd = free_port();
    (void)state;
    while (slurmd == ctld) slurmd = free_port();
    clear_env();
    snprintf(cmd, sizeof(cmd), "env -u MAKEFLAGS -u MAKELEVEL DISTMESH_TIMEOUT=60 NPROC=4 "
             "%s/tests/slurm_single_node.sh %s/slurm %d %d %s/examples/launch_srun.sh %s",
             DM_SRCDIR, g_tmp, ctld, slurmd, DM_SRCDIR, DM_EXAMPLE);
    rc = tw_run_cmd(120, out, sizeof(out), cmd);
    if (rc == 77) {
        fprintf(stderr, "SKIP: %s", out);
        skip();
    }
    if (rc != 0 || count_of(out, "mean 1.5, expected 1.5") != 4) fail_msg("srun exit %d:\n%s", rc, out);
    if (!strstr(out, "rank 3 of 4 (tcp backend, shm transport, local 3/4)")) fail_msg("placement:\n%s", out);
}

/* By hand (examples/launch_by_hand.sh): RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT only. */
static void test_launch_by_hand_example(void** state) {
    char out[8192], env[64];
    int rc;
    (void)state;
    clear_env();
    snprintf(env, sizeof(env), "NPROC=3 MASTER_PORT=%d", free_port());
    rc = run_example(env, "launch_by_hand.sh", out, sizeof(out));
    if (rc != 0 || count_of(out, "mean 1, expected 1") != 3) fail_msg("exit %d:\n%s", rc, out);
    if (!strstr(out, "local 2/3")) fail_msg("local ranks from host names:\n%s", out);
}

int main(int argc, char** argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_launch_hostlist_parser),
        cmocka_unit_test(test_launch_slurm_two_nodes_first_node_job_port),
        cmocka_unit_test(test_launch_single_host_private_file_store),
        cmocka_unit_test(test_launch_openmpi_store_in_session_dir),
        cmocka_unit_test(test_launch_messages_say_what_to_set),
        cmocka_unit_test(test_launch_local_rank_from_launcher_wins),
        cmocka_unit_test(test_launch_world_size_disagreement_named),
        cmocka_unit_test(test_launch_waiters_name_missing_ranks),
        cmocka_unit_test(test_launch_missing_store_message),
        cmocka_unit_test(test_launch_repeated_job_id_other_size),
        cmocka_unit_test(test_launch_mpirun_np4),
        cmocka_unit_test(test_launch_torchrun_example),
        cmocka_unit_test(test_launch_srun_example),
        cmocka_unit_test(test_launch_by_hand_example),
    };
    signal(SIGPIPE, SIG_IGN);
    return DM_RUN_TESTS(argc, argv, tests, setup, teardown);
}
