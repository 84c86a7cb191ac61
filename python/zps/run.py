"""zps-run - a zps job on this host: the server and N copies of a training
script, as torchrun starts a job's processes.

    zps-run --workers 2 -- python3 train.py --epochs 3
    zps-run --workers 4 --shards 2 --steps 900 --global-batch 64 -- python3 train.py
    zps-run --coordinator tcp://head:5555 --workers 4 -- python3 train.py   # workers only

Without --coordinator it starts zps-server (shard 0; with --shards S also
shards 1..S-1) on a free loopback port, waits for it to listen, then the
workers. Every argument before `--` that is not zps-run's own goes to shard
0, which holds the job (--steps, --global-batch, --optimizer, ...); the
model is --model external (the workers declare it) unless one is given.
Shards 1.. get only --shard, --shards, --coordinator and --listen.

Each worker finds in its environment ZPS_COORDINATOR (where shard 0
listens: zps.torch.Run(None, model, ...) and zps-worker read it),
ZPS_RANK_HINT (0..N-1, plus --rank-offset: which copy it is; the job's
ranks come from the coordinator, in the order workers join),
ZPS_WORKERS (N) and, with --share, ZPS_SHARE.

Every line a child writes is printed with its name in front ("server: ",
"shard 1: ", "worker 0: "). Ctrl-C or SIGTERM goes on to every child. When
a child fails (exits non-zero, or the server before the job's end), the
others get SIGTERM, then SIGKILL after --stop-timeout, and zps-run exits
with that child's status (128 + N for a signal N). 0 when every worker and
the server exit 0. The children are killed by their process groups (each
child leads one), never by name.

Several hosts: zps-run --workers G --job-workers G*H ... on the first
(its server waits for all), zps-run --coordinator tcp://FIRST:PORT
--workers G --rank-offset K on each other (a --listen that they reach,
e.g. --listen tcp://0.0.0.0:5555, goes to the server).
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

__all__ = ["main"]

POLL_S = 0.05


def _die(msg, code=2):
    print(f"zps-run: {msg}", file=sys.stderr)
    sys.exit(code)


def find_server():
    """zps-server: $ZPS_BIN_DIR, beside this Python (a venv's or prefix's
    bin/), the bin/ of the source tree this package lies in, then PATH."""
    tried = []
    here = os.path.dirname(os.path.abspath(__file__))
    dirs = []
    if os.environ.get("ZPS_BIN_DIR"):
        dirs.append(os.environ["ZPS_BIN_DIR"])
    dirs += [os.path.join(sys.prefix, "bin"), os.path.dirname(sys.executable),
             os.path.normpath(os.path.join(here, "..", "..", "bin"))]
    for d in dirs:
        path = os.path.join(d, "zps-server")
        if path in tried:
            continue
        tried.append(path)
        if os.access(path, os.X_OK):
            return path
    found = shutil.which("zps-server")
    if found:
        return found
    _die(f"no zps-server in {', '.join(tried)} or PATH (HINT: make, then set ZPS_BIN_DIR "
         f"to its bin/)", 1)


def parse(argv):
    cut = argv.index("--") if "--" in argv else len(argv)
    own, command = argv[:cut], argv[cut + 1:]
    p = argparse.ArgumentParser(
        prog="zps-run", allow_abbrev=False,
        usage="zps-run --workers N [--shards S] [--coordinator ENDPOINT] [options] "
              "[SERVER-FLAGS...] -- COMMAND [ARGS...]",
        description="A zps job on this host: zps-server and N copies of a training script, "
                    "as torchrun starts a job's processes (docs/pytorch.md, Launch).",
        epilog="Other flags before -- go to zps-server's shard 0 (zps-server --help).")
    arg = p.add_argument
    arg("--workers", metavar="N", type=int, required=True, help="copies of COMMAND to start here")
    arg("--job-workers", metavar="M", type=int, help="the workers zps-server waits for (default "
        "--workers; more when other hosts run zps-run --coordinator)")
    arg("--shards", metavar="S", type=int, default=1, help="server processes (default 1)")
    arg("--coordinator", metavar="ENDPOINT", help="start no server: join the job whose shard 0 "
        "listens at ENDPOINT (a cluster's other hosts)")
    arg("--share", metavar="K", type=int, help="ZPS_SHARE: each worker's fixed samples per step")
    arg("--rank-offset", metavar="R", type=int, default=0, help="ZPS_RANK_HINT of the first "
        "worker here (several hosts: 0, N, 2N, ...)")
    arg("--server-timeout", metavar="SECONDS", type=float, default=30.0, help="s to wait for "
        "the servers to listen (default 30)")
    arg("--server-exit-timeout", metavar="SECONDS", type=float, default=60.0, help="s the "
        "server may run on once every worker exited 0 (default 60)")
    arg("--stop-timeout", metavar="SECONDS", type=float, default=10.0, help="s between SIGTERM "
        "and SIGKILL when stopping the children (default 10)")
    a, server_flags = p.parse_known_args(own)
    if cut == len(argv):
        _die("give the training command after --: zps-run --workers 2 -- python3 train.py")
    if not command:
        p.error("no command after --")
    if a.workers < 1:
        p.error(f"--workers {a.workers}: at least 1")
    if a.shards < 1:
        p.error(f"--shards {a.shards}: at least 1")
    if a.coordinator and (server_flags or a.shards != 1 or a.job_workers):
        what = " ".join(server_flags) or ("--shards" if a.shards != 1 else "--job-workers")
        p.error(f"--coordinator starts no server: {what} would go to one")
    return a, server_flags, command


class Child:
    """One process in a process group of its own, its output prefixed."""

    def __init__(self, name, argv, env, out_lock):
        self.name = name
        try:
            self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         start_new_session=True)
        except OSError as e:
            _die(f"{name}: cannot start {argv[0]}: {e.strerror}", 1)
        self.pid = self.proc.pid
        self.sent = None  # the signal zps-run passed on to it
        prefix = f"{name}: ".encode()
        self.readers = [threading.Thread(target=_relay, args=(src, dst, prefix, out_lock),
                                         daemon=True)
                        for src, dst in ((self.proc.stdout, sys.stdout),
                                         (self.proc.stderr, sys.stderr))]
        for t in self.readers:
            t.start()

    def poll(self):
        return self.proc.poll()

    def signal(self, sig):
        """To the child's process group (the child and what it started)."""
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def status(self):
        rc = self.proc.returncode
        return 128 - rc if rc < 0 else rc


def _relay(src, dst, prefix, lock):
    out = getattr(dst, "buffer", dst)
    for line in iter(src.readline, b""):
        if not line.endswith(b"\n"):
            line += b"\n"
        with lock:
            try:
                out.write(prefix + line)
                out.flush()
            except (OSError, ValueError):
                pass
    src.close()


def _wait_endpoint(path, child, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path) and os.path.getsize(path) > 0:
            with open(path) as f:
                return f.read().strip()
        if child.poll() is not None:
            return None
        time.sleep(POLL_S)
    return None


class Launcher:
    def __init__(self, a, server_flags, command):
        self.a = a
        self.server_flags = server_flags
        self.command = command
        self.lock = threading.RLock()  # say() may run in a signal handler of its holder
        self.servers = []
        self.workers = []
        self.signalled = None

    def say(self, msg):
        with self.lock:
            print(f"zps-run: {msg}", file=sys.stderr, flush=True)

    def children(self):
        return self.servers + self.workers

    def _server_env(self):
        env = dict(os.environ)
        for k in ("ZPS_COORDINATOR", "ZPS_RANK_HINT", "ZPS_WORKERS", "ZPS_SHARE"):
            env.pop(k, None)  # zps-server reads ZPS_* as its flags
        return env

    def start_servers(self, tmp):
        a, flags = self.a, list(self.server_flags)
        server = find_server()
        if not any(f == "--model" or f.startswith("--model=") for f in flags):
            flags = ["--model", "external"] + flags
        if not any(f == "--listen" or f.startswith("--listen=") for f in flags):
            flags = ["--listen", "tcp://127.0.0.1:*"] + flags
        ep_file = os.path.join(tmp, "endpoint-0")
        env = self._server_env()
        argv = [server, "--shard", "0", "--shards", str(a.shards), "--workers",
                str(a.job_workers or a.workers), "--endpoint-file", ep_file] + flags
        s0 = Child("server", argv, env, self.lock)
        self.servers.append(s0)
        endpoint = _wait_endpoint(ep_file, s0, a.server_timeout)
        if endpoint is None:
            return self._no_endpoint(s0)
        for k in range(1, a.shards):
            f = os.path.join(tmp, f"endpoint-{k}")
            self.servers.append(Child(f"shard {k}", [
                server, "--shard", str(k), "--shards", str(a.shards), "--coordinator", endpoint,
                "--listen", "tcp://127.0.0.1:*", "--endpoint-file", f], env, self.lock))
        for k, sh in enumerate(self.servers[1:], 1):
            if _wait_endpoint(os.path.join(tmp, f"endpoint-{k}"), sh, a.server_timeout) is None:
                return self._no_endpoint(sh)
        return endpoint

    def _no_endpoint(self, child):
        if child.poll() is None:
            self.say(f"{child.name} did not listen within {self.a.server_timeout:g} s")
            return None
        self.say(f"{child.name} exited {child.status()} before listening")
        return None

    def start_workers(self, endpoint):
        a = self.a
        for i in range(a.workers):
            env = dict(os.environ)
            env.update(ZPS_COORDINATOR=endpoint, ZPS_RANK_HINT=str(a.rank_offset + i),
                       ZPS_WORKERS=str(a.workers))
            if a.share is not None:
                env["ZPS_SHARE"] = str(a.share)
            env.setdefault("PYTHONUNBUFFERED", "1")  # lines as they come, not per 8 KiB
            self.workers.append(Child(f"worker {a.rank_offset + i}", self.command, env,
                                      self.lock))
        if os.environ.get("ZPS_RUN_PID_FILE"):  # for tests: every child's pid
            with open(os.environ["ZPS_RUN_PID_FILE"], "w") as f:
                f.write("".join(f"{c.pid}\n" for c in self.children()))

    def on_signal(self, sig, _frame):
        if self.signalled is None:
            self.signalled = sig
            self.say(f"{signal.Signals(sig).name}: passing it to every child")
        for c in self.children():
            if c.poll() is None:
                c.sent = sig
                c.signal(sig)

    def watch(self):
        """Until every worker and server has exited 0 (0), or one failed: its status."""
        ended_at = None
        while True:
            if self.signalled is not None:
                return self.stop(128 + self.signalled, forward=False)
            for c in self.children():
                rc = c.poll()
                if rc is not None and rc != 0:
                    self.say(f"{c.name} (pid {c.pid}) exited {c.status()}; stopping the others")
                    return self.stop(c.status())
            if all(c.poll() is not None for c in self.children()):
                return 0
            if all(w.poll() is not None for w in self.workers):
                ended_at = ended_at or time.monotonic()
                if time.monotonic() - ended_at > self.a.server_exit_timeout:
                    self.say(f"every worker exited 0 but the server still runs after "
                             f"{self.a.server_exit_timeout:g} s (the job did not end)")
                    return self.stop(1)
            time.sleep(POLL_S)

    def stop(self, status, forward=True):
        """SIGTERM to each child still running (unless the signal zps-run
        got already went to it), SIGKILL after --stop-timeout."""
        live = [c for c in self.children() if c.poll() is None]
        for c in live:
            if forward or c.sent is None:
                c.signal(signal.SIGTERM if forward else self.signalled)
        deadline = time.monotonic() + self.a.stop_timeout
        while any(c.poll() is None for c in live) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        for c in live:
            if c.poll() is None:
                self.say(f"{c.name} (pid {c.pid}) still runs {self.a.stop_timeout:g} s after "
                         f"SIGTERM: SIGKILL")
                c.signal(signal.SIGKILL)
                c.proc.wait(timeout=10)
            c.signal(signal.SIGKILL)  # what it started and left behind in its group
        return status

    def finish(self):
        """The relays end at their pipes' end: bounded, a grandchild may hold one."""
        deadline = time.monotonic() + 5
        for c in self.children():
            for t in c.readers:
                t.join(timeout=max(0.0, deadline - time.monotonic()))


def main(argv=None):
    """zps-run's command line; returns its exit status (also sys.exit's)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    a, server_flags, command = parse(argv)
    run = Launcher(a, server_flags, command)
    prior = {s: signal.signal(s, run.on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with tempfile.TemporaryDirectory(prefix="zps-run-") as tmp:
            if a.coordinator:
                endpoint = a.coordinator
            else:
                endpoint = run.start_servers(tmp)
                if endpoint is None:
                    status = run.stop(128 + run.signalled if run.signalled else 1)
                    run.finish()
                    return status
                run.say(f"server at {endpoint}; starting {a.workers} worker(s)")
            if run.signalled is None:
                run.start_workers(endpoint)
            status = run.watch()
            run.finish()
            return status
    finally:
        for s, h in prior.items():
            signal.signal(s, h)


if __name__ == "__main__":
    sys.exit(main())
