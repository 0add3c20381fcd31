"""Fixtures of the Python tests: a hard time limit per test, the C library's reference bytes
(ref_collectives), and worlds of worker processes (worker.py) driven over pipes.

Run by `make test` (python/tests/run_pytest.sh: the package built under build/, pytest from
Debian's python3-pytest), or by hand:
    PYTHONPATH=build/python/plain/lib /usr/bin/python3 -m pytest python/tests"""
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time

import pytest

if os.environ.get("DM_PY_NO_TORCH") == "1":    # ASan builds: torch stays out (importorskip skips)
    sys.modules["torch"] = None

# test_nccl_standin.py needs the extension built against the CUDA/NCCL stand-in
# (tests/python_nccl_standin.mk), which runs it alone with DM_PY_NCCL_STANDIN=1.
collect_ignore = [] if os.environ.get("DM_PY_NCCL_STANDIN") == "1" else ["test_nccl_standin.py"]

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
TEST_LIMIT_S = float(os.environ.get("DM_PY_TEST_LIMIT", "150"))


class HardLimitExpired(Exception):
    pass


@pytest.fixture(autouse=True)
def _hard_limit():
    """Every test ends by TEST_LIMIT_S: SIGALRM raises in it (a C call returns by its own
    deadline first: the workers and worlds here run with DISTMESH_TIMEOUT of 30 s or less;
    worker processes have their own limits, see World)."""
    def expired(signum, frame):
        raise HardLimitExpired("test ran past its %.0f s limit" % TEST_LIMIT_S)
    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, TEST_LIMIT_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="session")
def ref_tool(tmp_path_factory):
    """The reference program: built by make (DM_PY_REF), else compiled here."""
    path = os.environ.get("DM_PY_REF")
    if path and os.path.exists(path):
        return path
    path = str(tmp_path_factory.mktemp("ref") / "ref_collectives")
    subprocess.run([os.environ.get("CC", "cc"), "-std=c11", "-O2", "-I", ROOT, "-pthread",
                    os.path.join(HERE, "ref_collectives.c"), os.path.join(ROOT, "distmesh.c"), "-o", path, "-lm"],
                   check=True, timeout=300)
    return path


@pytest.fixture(scope="session")
def ref_file(ref_tool, tmp_path_factory):
    """ref_file(W): the path of the C library's bytes for a world of W ranks."""
    made = {}

    def get(world):
        if world not in made:
            path = str(tmp_path_factory.mktemp("ref%d" % world) / "ref.bin")
            subprocess.run([ref_tool, str(world), path], check=True, timeout=120)
            made[world] = path
        return made[world]
    return get


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class World:
    """n worker processes (worker.py, or script, SCENARIO ARGS...) with RANK / WORLD_SIZE and env, each
    under `limit` seconds. Lines go to a rank's stdin with send(); expect() reads the next line
    starting with a word from a rank's stdout. stderr goes to a file shown on failure."""

    def __init__(self, n, scenario, args=(), env=None, limit=90, tmp=None, script="worker.py"):
        self.n = n
        self.limit = limit
        self.started = time.monotonic()
        self.procs = []
        self.bufs = [b""] * n
        self.errs = []
        for r in range(n):
            e = dict(os.environ)
            e.update({"RANK": str(r), "WORLD_SIZE": str(n), "PYTHONUNBUFFERED": "1",
                      "DISTMESH_TIMEOUT": e.get("DISTMESH_TIMEOUT", "30")})
            e.update(env or {})
            err = open(os.path.join(str(tmp), "rank%d.stderr" % r), "w+") if tmp else subprocess.DEVNULL
            self.errs.append(err)
            self.procs.append(subprocess.Popen(
                [sys.executable, os.path.join(HERE, script), scenario] + [str(a) for a in args],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=e, cwd=HERE))

    def send(self, r, line):
        self.procs[r].stdin.write((line + "\n").encode())
        self.procs[r].stdin.flush()

    def expect(self, r, word, timeout=None):
        """The next line of rank r that starts with word (other lines are skipped)."""
        end = time.monotonic() + (timeout if timeout is not None else self.limit)
        p = self.procs[r]
        while True:
            while b"\n" in self.bufs[r]:
                line, self.bufs[r] = self.bufs[r].split(b"\n", 1)
                text = line.decode(errors="replace")
                if text.split(" ", 1)[0] == word:
                    return text[len(word):].strip()
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError("rank %d: no %r line in time%s" % (r, word, self.stderr(r)))
            ready, _, _ = select.select([p.stdout], [], [], min(left, 0.5))
            if ready:
                chunk = os.read(p.stdout.fileno(), 65536)
                if not chunk:
                    raise AssertionError("rank %d exited (%s) before a %r line%s" % (r, p.wait(), word, self.stderr(r)))
                self.bufs[r] += chunk

    def result(self, r, timeout=None):
        return json.loads(self.expect(r, "RESULT", timeout))

    def results(self, timeout=None):
        return [self.result(r, timeout) for r in range(self.n)]

    def stderr(self, r):
        f = self.errs[r]
        if f is subprocess.DEVNULL:
            return ""
        f.flush()
        f.seek(0)
        text = f.read()[-3000:]
        return "\n--- rank %d stderr ---\n%s" % (r, text) if text else ""

    def wait(self):
        codes = []
        for r, p in enumerate(self.procs):
            left = max(1.0, self.limit - (time.monotonic() - self.started))
            try:
                codes.append(p.wait(timeout=left))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append("timeout")
        return codes

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            for f in (p.stdin, p.stdout):
                try:
                    f.close()
                except OSError:
                    pass
        for f in self.errs:
            if f is not subprocess.DEVNULL:
                f.close()
