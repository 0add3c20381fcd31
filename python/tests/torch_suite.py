"""PyTorch's own distributed suite (torch/testing/_internal/distributed/distributed_test.py,
DistributedTest._DistTestBase, shipped in the torch wheel) on the "distmesh" backend beside Gloo:
`make test-torch-suite` (the CPU part, world sizes 2 and 3, one table) and, in `make test`, a
subset (tests/torch_suite.mk). Three ways to run this file:

  as torch's runner does (test/distributed/test_distributed_spawn.py in PyTorch's repository):
      BACKEND=distmesh WORLD_SIZE=2 TEMP_DIR=<dir with barrier/ and test_dir/> \\
          INIT_METHOD=file://<dir>/init python torch_suite.py [unittest arguments]
  one child of the table (--child RESULTS TEST...): runs the tests one after another in this
      environment, a "START name" and a "RESULT {json}" line for each in RESULTS;
  the table (--table OUT [--worlds 2,3] [--tests a,b | --subset] [--limit S] [--budget S]): for
      each world size, Gloo then distmesh, each test under a hard limit (torch's own, through
      DISTRIBUTED_TESTS_DEFAULT_TIMEOUT, and this driver's: a child past limit + 60 s is killed
      with its ranks and the test counted as a hang), then OUT/table.md and OUT/results.json.
      Exit status 1 when a test that passes under Gloo fails or hangs under distmesh.

Every spawned rank imports this module, so `import distmesh.torch` below registers the backend
in each. Environment as torch's runner sets it: BACKEND, WORLD_SIZE (not RANK: torch's ranks get
their rank as an argument of init_process_group), TEMP_DIR, INIT_METHOD.

The suite's gates: many tests are skipped unless BACKEND == "gloo" or BACKEND is in a set of
DistTestCases.backend_feature (common_distributed.py). For "distmesh" a gate is opened (OPENINGS
below, listed in docs/python.md) only for a CPU feature distmesh has, and only on tests that are
not GPU tests (GPU_DECORATORS, GPU_NAME); a test with any other gate closed stays skipped.
GPU tests (a GPU decorator or name) are not run under either backend: the table lists them.
REFUSED lists tests torch itself refuses for any backend not named "gloo" (they stay gated)."""
import fnmatch
import inspect
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))

# ---- the gates ----------------------------------------------------------------------------
# gate reason (as the suite words it, {B} the backend) -> why distmesh has what the gate asks
OPENINGS = {
    "The {B} backend does not support DistributedDataParallel":
        "DistTestCases.backend_feature['ddp']: DDP on CPU runs on distmesh (allreduce, broadcast, "
        "futures; test_torch.py / test_torch2.py train it against Gloo)",
    "Test requires backend {B} to be one of {{'gloo', 'nccl', 'ucc'}}":
        "backend_feature['gpu'] used as 'a backend torch tests DDP and object collectives on': "
        "opened only for tests that run on CPU under a non-NCCL backend",
    "Test requires backend {B} to be one of {{'gloo'}}":
        "require_backend_is_available({'gloo'}) on CPU collectives distmesh has "
        "(all_reduce_coalesced, scatter_object_list, DDP's no_sync)",
    "get_future is only supported on mpi, nccl and gloo":
        "distmesh's Work has get_future() (completed by the group's completer thread)",
    "Only gloo backend supports timeouts":
        "every distmesh call has a deadline (the group's timeout); it raises DistBackendError",
    "GLOO Batch Send Recv CPU":
        "batch_isend_irecv on CPU tensors: distmesh has isend / irecv",
}
# Tests whose body builds its CPU case only under `BACKEND == "mpi" or BACKEND == "gloo"` (any
# other backend reaches an unset variable: UnboundLocalError 'ddp_model'): their gates stay closed.
GLOO_BODY = re.compile(r"^test_accumulate_gradients_no_sync")
# torch refuses these for any backend not named "gloo" (distributed_c10d.monitored_barrier:
# "monitored_barrier is only implemented for GLOO backend"): their gate stays closed
REFUSED = re.compile(r"monitored_barrier")
GPU_DECORATORS = re.compile(r"@(skip_if_no_gpu|skip_if_lt_x_gpu|requires_nccl|with_nccl_blocking_wait)\b")
GPU_NAME = re.compile(r"cuda|gpu|nccl", re.I)

# The subset `make test` runs (world size 2): every cause of issue 51's section 1. Each test
# below initializes with an explicit rank and WORLD_SIZE only in the environment (cause 3).
SUBSET = [
    "test_all_gather_coalesced_simple",      # cause 1: torch's output layout
    "test_all_gather_coalesced_with_empty",  # cause 1: an empty tensor among them
    "test_batch_isend_irecv_gloo",           # cause 2: irecv posted before isend (opened gate)
    "test_send_recv_any_source",             # cause 5: recv from any source
    "test_barrier_timeout_full_group",       # cause 4: torch's timeout error (opened gate)
    "test_destroy_full_group",               # cause 6: destroy_process_group on a group
    "test_all_reduce_sum",
    "test_broadcast",
    "test_all_gather",
    "test_reduce_sum",
    "test_DistributedDataParallel_requires_grad",   # DDP (opened gate)
]
OUTCOMES = ("passed", "failed", "hang", "skipped", "gpu")


def _record_gates(record):
    """Wraps common_utils' skip decorators before distributed_test imports them: each gate that
    fires records (test name, reason)."""
    from torch.testing._internal import common_utils as cu
    orig_if, orig = cu.skip_but_pass_in_sandcastle_if, cu.skip_but_pass_in_sandcastle

    def skip_if(condition, reason):
        inner = orig_if(condition, reason)

        def decorator(func):
            if condition:
                record.setdefault(func.__name__, []).append(reason)
            return inner(func)
        return decorator

    def skip(reason):
        inner = orig(reason)

        def decorator(func):
            record.setdefault(func.__name__, []).append(reason)
            return inner(func)
        return decorator
    cu.skip_but_pass_in_sandcastle_if, cu.skip_but_pass_in_sandcastle = skip_if, skip


def is_gpu_test(name, func):
    """A GPU test: its name says so, or a decorator that needs GPUs (or NCCL) whatever the backend."""
    if GPU_NAME.search(name):
        return True
    src = inspect.getsource(inspect.unwrap(func))
    return bool(GPU_DECORATORS.search(src.split("def " + name, 1)[0]))


def _same_sets(reason):
    """A gate's reason with each set literal's items sorted ("{'nccl', 'gloo'}" is printed in
    the order of the process's string hashes)."""
    return re.sub(r"\{([^{}]*)\}", lambda m: "{%s}" % ", ".join(sorted(x.strip() for x in m.group(1).split(","))),
                  reason)


def open_gates(base, gates, backend):
    """For "distmesh": clears the skip of each test whose every fired gate is in OPENINGS and
    that is no GPU test, not REFUSED and not GLOO_BODY. Returns {test: [reasons opened]}."""
    allowed = {_same_sets(k.format(B=backend)) for k in OPENINGS}
    opened = {}
    for name, reasons in gates.items():
        func = base.__dict__.get(name)
        if func is None or not getattr(func, "__unittest_skip__", False):
            continue
        if REFUSED.search(name) or GLOO_BODY.search(name) or is_gpu_test(name, func) \
                or not all(_same_sets(r) in allowed for r in reasons):
            continue
        func.__unittest_skip__ = False
        opened[name] = reasons
    return opened


GATES, OPENED = {}, {}
if "BACKEND" in os.environ and "--table" not in sys.argv:
    import torch                                            # noqa: F401
    import distmesh.torch                                   # noqa: F401 -- registers "distmesh" (every rank)
    for var in ("WORLD_SIZE", "TEMP_DIR"):
        if var not in os.environ:
            raise RuntimeError("torch_suite.py: %s is not set (BACKEND, WORLD_SIZE, TEMP_DIR as torch's runner)" % var)
    _record_gates(GATES)
    from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend
    BACKEND = os.environ["BACKEND"]
    if BACKEND == "distmesh":
        OPENED = open_gates(DistributedTest._DistTestBase, GATES, BACKEND)

    # TORCH_SUITE_START=fork (the table's default, --start): the ranks are forked from the
    # process that runs the tests, which has imported torch and distmesh but made no group:
    # about 0.5 s a test instead of 15-25 s of torch imports per rank on this loaded 2-core
    # machine. Unset or spawn: spawned, as torch's runner starts them.
    _FORK = os.environ.get("TORCH_SUITE_START", "spawn") == "fork"

    class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            if _FORK:
                self._start_processes(torch.multiprocessing.get_context("fork").Process)
            else:
                self._spawn_processes()

    TestDistBackendWithSpawn.__name__ = TestDistBackendWithSpawn.__qualname__ = \
        "TestDistBackendWithSpawn" + BACKEND.upper()
    globals()[TestDistBackendWithSpawn.__name__] = TestDistBackendWithSpawn
    SUITE_CLASS = TestDistBackendWithSpawn


# ---- one child: tests in this environment, results to a file ----------------------------------
def _outcome(result, name):
    for kind, items in (("failed", result.failures), ("failed", result.errors), ("skipped", result.skipped),
                        ("failed", result.unexpectedSuccesses)):
        for item in items:
            test, detail = item if isinstance(item, tuple) else (item, "")
            if test._testMethodName == name:
                text = detail if isinstance(detail, str) else str(detail)
                if kind == "failed" and re.search(r"Process \d+ terminated or timed out after", text):
                    kind = "hang"
                return kind, _what(text)
    return "passed", ""


def _what(text):
    """The line of a report that says what went wrong: the last 'SomethingError: ...' line (the
    rank's exception inside torch's 'Process N exited with error code' report), else the last line."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    named = [ln for ln in lines if re.match(r"^[\w.]*(Error|Exception|Timeout|SkipTest)\b", ln)]
    return (named or lines or [""])[-1][:300]


def child(results_path, names):
    base = DistributedTest._DistTestBase
    with open(results_path, "a") as out:
        for name in names:
            out.write("START %s\n" % name)
            out.flush()
            func = base.__dict__.get(name)
            if func is not None and is_gpu_test(name, func):
                rec = {"test": name, "outcome": "gpu", "detail": "GPU test (name or decorator): not run on CPU", "s": 0}
            else:
                t0 = time.monotonic()
                result = unittest.TestResult()
                unittest.defaultTestLoader.loadTestsFromName(name, SUITE_CLASS).run(result)
                kind, detail = _outcome(result, name)
                rec = {"test": name, "outcome": kind, "detail": detail, "s": round(time.monotonic() - t0, 1)}
                if name in OPENED:
                    rec["opened"] = OPENED[name]
            out.write("RESULT %s\n" % json.dumps(rec))
            out.flush()


# ---- the driver: children per backend and world size, the table -----------------------------
def all_tests(python):
    """The test names of _DistTestBase (imported in a child: torch decides them at import)."""
    code = ("import os; os.environ.update(BACKEND='gloo', WORLD_SIZE='2', TEMP_DIR='/tmp');"
            "from torch.testing._internal.distributed.distributed_test import DistributedTest as D;"
            "print(' '.join(sorted(n for n in dir(D._DistTestBase) if n.startswith('test_'))))")
    return subprocess.run([python, "-c", code], check=True, stdout=subprocess.PIPE, timeout=300,
                          env=dict(os.environ)).stdout.decode().split()


def run_world(python, backend, world, names, limit, deadline, log):
    """Runs names under backend at world size world; {test: record}. A child that goes quiet
    past limit + 60 s is killed (its process group: the ranks too), its test recorded as a hang,
    and the rest run in a new child."""
    done, left = {}, list(names)
    while left and time.monotonic() < deadline:
        tmp = tempfile.mkdtemp(prefix="torch_suite_%s%d_" % (backend, world))
        os.mkdir(os.path.join(tmp, "barrier"))
        os.mkdir(os.path.join(tmp, "test_dir"))
        env = dict(os.environ, BACKEND=backend, WORLD_SIZE=str(world), TEMP_DIR=tmp,
                   INIT_METHOD="file://%s/init_method" % tmp, DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=str(limit),
                   PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        for var in ("RANK", "LOCAL_RANK", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT"):
            env.pop(var, None)
        results = os.path.join(tmp, "results")
        open(results, "w").close()
        p = subprocess.Popen([python, os.path.abspath(__file__), "--child", results] + left, cwd=HERE, env=env,
                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        current, since, seen = None, time.monotonic(), 0
        while True:
            with open(results) as f:
                lines = f.read().splitlines()
            for line in lines[seen:]:
                if line.startswith("START "):
                    current, since = line[6:], time.monotonic()
                elif line.startswith("RESULT "):
                    rec = json.loads(line[7:])
                    done[rec["test"]] = rec
                    current = None
            seen = len(lines)
            if p.poll() is not None:
                break
            if (current and time.monotonic() - since > limit + 60) or time.monotonic() > deadline:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                if current:
                    done[current] = {"test": current, "outcome": "hang",
                                     "detail": "killed after %d s (the driver's limit)" % (limit + 60),
                                     "s": round(time.monotonic() - since, 1)}
                break
            time.sleep(0.5)
        if current and current not in done and p.returncode is not None:
            done[current] = {"test": current, "outcome": "failed", "detail": "the child exited (%s)" % p.returncode,
                             "s": round(time.monotonic() - since, 1)}
        left = [n for n in left if n not in done]
        subprocess.run(["rm", "-rf", tmp])
    return done


def write_table(out_dir, cols, table, names, seconds):
    counts = {c: {k: 0 for k in OUTCOMES} for c in cols}
    for c in cols:
        for n in names:
            rec = table[c].get(n)
            if rec:
                counts[c][rec["outcome"]] += 1
    regressions = []
    worlds = sorted({c[1] for c in cols})
    for w in worlds:
        for n in names:
            g, d = table.get(("gloo", w), {}).get(n), table.get(("distmesh", w), {}).get(n)
            if g and d and g["outcome"] == "passed" and d["outcome"] in ("failed", "hang"):
                regressions.append((n, w, d["outcome"], d["detail"]))
    gated = sorted({n for w in worlds for n in names
                    if table.get(("gloo", w), {}).get(n, {}).get("outcome") == "passed"
                    and table.get(("distmesh", w), {}).get(n, {}).get("outcome") == "skipped"})
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump({"columns": ["%s@%d" % c for c in cols], "seconds": round(seconds),
                   "results": {"%s@%d" % c: table[c] for c in cols}, "counts": {"%s@%d" % c: counts[c] for c in cols},
                   "regressions": regressions}, f, indent=1)
    lines = ["# PyTorch's distributed suite: Gloo and distmesh", "",
             "torch's `DistributedTest._DistTestBase`, written by python/tests/torch_suite.py in %d s." % seconds,
             "gpu: a GPU test, not run on CPU; hang: past the per-test limit; ranks started by %s."
             % os.environ.get("TORCH_SUITE_START", "spawn"), "",
             "| | " + " | ".join("%s, world %d" % c for c in cols) + " |",
             "|---|" + "---|" * len(cols)]
    for k in OUTCOMES:
        lines.append("| %s | " % k + " | ".join(str(counts[c][k]) for c in cols) + " |")
    lines += ["", "Passed under Gloo, failed or hung under distmesh: %d" % len(regressions)]
    lines += ["- %s (world %d): %s %s" % r for r in regressions]
    lines += ["", "Passed under Gloo, skipped under distmesh (a gate left closed, docs/python.md): %d" % len(gated)]
    lines += ["- %s: %s" % (n, next(table[("distmesh", w)][n]["detail"] for w in worlds
                                    if table.get(("distmesh", w), {}).get(n, {}).get("outcome") == "skipped"))
              for n in gated]
    lines += ["", "| test | " + " | ".join("%s@%d" % c for c in cols) + " |", "|---|" + "---|" * len(cols)]
    for n in names:
        cells = []
        for c in cols:
            rec = table[c].get(n)
            cell = rec["outcome"] if rec else "not run"
            if rec and rec.get("opened"):
                cell += " (gate opened)"
            if rec and rec["outcome"] in ("skipped", "failed", "hang") and rec["detail"]:
                cell += ": " + rec["detail"][:120].replace("|", "/")
            cells.append(cell)
        lines.append("| %s | %s |" % (n, " | ".join(cells)))
    with open(os.path.join(out_dir, "table.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return counts, regressions


def driver(argv):
    import argparse
    ap = argparse.ArgumentParser(prog="torch_suite.py --table")
    ap.add_argument("--table", required=True, help="folder for table.md and results.json")
    ap.add_argument("--worlds", default="2,3")
    ap.add_argument("--tests", default="", help="comma-separated names (default: every test)")
    ap.add_argument("--subset", action="store_true", help="the subset make test runs")
    ap.add_argument("--limit", type=int, default=120, help="seconds per test (torch's own limit)")
    ap.add_argument("--start", choices=("fork", "spawn"), default="fork",
                    help="how each test's ranks start (spawn: as torch's runner, much slower)")
    ap.add_argument("--budget", type=int, default=0, help="seconds for the whole run (0: none); what is "
                                                          "left when it runs out is 'not run'")
    ap.add_argument("--cmocka", action="store_true", help="also print cmocka's count lines (make test's program)")
    ap.add_argument("patterns", nargs="*", help="globs: run only the chosen tests whose names match one")
    a = ap.parse_args(argv)
    os.makedirs(a.table, exist_ok=True)
    os.environ["TORCH_SUITE_START"] = a.start
    python = sys.executable
    chosen = SUBSET if a.subset else [n for n in a.tests.split(",") if n]
    if a.patterns and chosen:
        chosen = [n for n in chosen if any(fnmatch.fnmatch(n, p) for p in a.patterns)]
        if not chosen:
            return 0                            # make test T=...: none of these matches
    known = all_tests(python)
    names = chosen or known
    unknown = [n for n in names if n not in known]
    if unknown:
        ap.error("not tests of torch's _DistTestBase: %s" % ", ".join(unknown))
    if a.patterns and not chosen:
        names = [n for n in names if any(fnmatch.fnmatch(n, p) for p in a.patterns)]
        if not names:
            return 0
    worlds = [int(w) for w in a.worlds.split(",")]
    cols = [(b, w) for w in worlds for b in ("gloo", "distmesh")]
    t0 = time.monotonic()
    deadline = t0 + a.budget if a.budget else float("inf")
    table = {}
    with open(os.path.join(a.table, "output.log"), "w") as log:
        for c in cols:
            print("torch_suite: %s at world size %d, %d tests" % (c[0], c[1], len(names)), flush=True)
            table[c] = run_world(python, c[0], c[1], names, a.limit, deadline, log)
            write_table(a.table, cols, {k: table.get(k, {}) for k in cols}, names, time.monotonic() - t0)
    counts, regressions = write_table(a.table, cols, table, names, time.monotonic() - t0)
    for c in cols:
        print("  %-8s world %d: %s" % (c[0], c[1], ", ".join("%d %s" % (counts[c][k], k) for k in OUTCOMES)))
    for r in regressions:
        print("REGRESSION: %s (world %d): distmesh %s: %s" % r)
    missing = [(n, c) for c in cols for n in names if n not in table[c]]
    for n, c in missing:
        print("NOT RUN: %s under %s at world size %d (the --budget ran out)" % (n, c[0], c[1]))
    if a.cmocka:                                # tests/run.sh adds these up
        passed = sum(1 for c in cols if c[0] == "distmesh" for n in names
                     if table[c].get(n, {}).get("outcome") == "passed")
        failed = len(regressions) + len(missing)
        skipped = len(names) * len(worlds) - passed - len(regressions)
        print("[  PASSED  ] %d test(s)." % passed)
        if skipped > 0:
            print("[  SKIPPED ] %d test(s)." % skipped)
        if failed:
            print("[  FAILED  ] %d test(s)." % failed)
        if missing:
            return 1
    print("torch_suite: %d s; table in %s" % (time.monotonic() - t0, os.path.join(a.table, "table.md")))
    return 1 if regressions else 0


def retable(out_dir):
    """table.md again from results.json (the table's layout changed, the results did not)."""
    with open(os.path.join(out_dir, "results.json")) as f:
        saved = json.load(f)
    cols = [(c.split("@")[0], int(c.split("@")[1])) for c in saved["columns"]]
    table = {c: saved["results"]["%s@%d" % c] for c in cols}
    names = []
    for c in cols:
        names += [n for n in table[c] if n not in names]
    write_table(out_dir, cols, table, names, saved["seconds"])


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--retable":
        retable(sys.argv[2])
        sys.exit(0)
    if "--table" in sys.argv:
        sys.exit(driver(sys.argv[1:]))
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3:])
        sys.exit(0)
    from torch.testing._internal.common_utils import run_tests
    run_tests()
