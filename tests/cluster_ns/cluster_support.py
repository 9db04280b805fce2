"""Harness for tests that run jobs across the emulated hosts of scripts/cluster.

    import cluster_support as cs
    cs.require_namespaces()                           # exit 77 (skipped) without root / ip netns
    with cs.emulated_cluster(2, bandwidth="1gbit", tag="lau") as c:   # always taken down
        job = cs.start_launcher_job(c, [2, 2], [WORKER, "collectives"])
        assert job.wait(bound=120)                    # False: timed out, everything was killed
        assert job.passed_ranks() == {0, 1, 2, 3}, job.output()

Jobs:
  start_launcher_job(c, per_host, argv)   scripts/gradwire-run --nnodes H --node-rank R ... once per host
  start_mpirun_job(c, per_host, argv)     mpirun inside host 0, daemons started by scripts/cluster-rsh
  start_env_job(c, per_host, argv, env_of) one process per rank, environment from env_of(host, local, rank)
Each returns a Job: wait(bound), wait_for(regex, bound), kill(), output(), host_output(i),
returncodes, passed_ranks(), rank_lines(); a Job is also a context manager that kills what is
left on exit. Every process runs in its own session, and cluster down stops whatever is still
inside the hosts, so nothing outlives a test.
"""
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "scripts")
LAUNCHER = os.path.join(SCRIPTS, "gradwire-run")
CLUSTER = os.path.join(SCRIPTS, "cluster")
RSH = os.path.join(SCRIPTS, "cluster-rsh")
sys.path.insert(0, SCRIPTS)
import gwcluster  # noqa: E402

SKIP = 77
MASTER_PORT = 29500          # every cluster is fresh: nothing else listens on its addresses
JOIN_TIMEOUT_S = 30          # GRADWIRE_TIMEOUT for the jobs: a missing rank fails the join, no hang
_PASS = re.compile(r"rank (\d+): PASS")
_PREFIX = re.compile(r"^\[(\d+)\] (.*)$")


def require_namespaces():
    """Exits 77 (ctest: skipped), saying why, when this machine cannot make emulated hosts."""
    problem = gwcluster.support_problem()
    if problem:
        print(f"SKIPPED: {problem}", flush=True)
        sys.exit(SKIP)


def unique_name(tag):
    """A cluster name no other test process uses at the same time."""
    return f"{tag}{os.getpid()}"[:32]


@contextlib.contextmanager
def emulated_cluster(hosts, bandwidth=None, tag="t"):
    """A gwcluster.Cluster of `hosts` hosts named after `tag` and this process; always down afterwards."""
    with gwcluster.cluster(hosts, bandwidth, name=unique_name(tag)) as c:
        yield c


def listening(c, host):
    """(address, port) of every listening TCP socket inside host `host`."""
    out = c.run(host, ["ss", "-ltnH"], capture_output=True, text=True, check=True).stdout
    sockets = []
    for line in out.splitlines():
        local = line.split()[3]
        addr, port = local.rsplit(":", 1)
        sockets.append((addr.strip("[]"), int(port)))
    return sockets


descendants = gwcluster.descendants


class Job:
    """Processes of one job, each inside an emulated host; output to files, read at any time."""

    def __init__(self, c, commands, env=None):
        """commands: [(host, argv, extra_env)]; env: the base environment (default: os.environ)."""
        self.cluster = c
        self.dir = tempfile.TemporaryDirectory(prefix="gw-job-")
        self.procs, self.paths, self.hosts = [], [], []
        base = dict(os.environ if env is None else env)
        base.setdefault("GRADWIRE_TIMEOUT", str(JOIN_TIMEOUT_S))
        try:
            for i, (host, argv, extra) in enumerate(commands):
                path = os.path.join(self.dir.name, f"{i}.out")
                with open(path, "wb") as out:
                    # Own session: kill() reaches the command and everything it started.
                    self.procs.append(c.popen(host, argv, env=dict(base, **(extra or {})), stdout=out,
                                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                              start_new_session=True))
                self.paths.append(path)
                self.hosts.append(host)
        except BaseException:
            self.kill()
            raise
        self.timed_out = False

    # --- waiting -------------------------------------------------------------------
    def wait(self, bound):
        """Waits up to `bound` s for every process; on time-out kills them all and returns False."""
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline:
            if all(p.poll() is not None for p in self.procs):
                return True
            time.sleep(0.05)
        self.timed_out = True
        self.kill()
        return False

    def wait_for(self, pattern, bound, count=1):
        """Waits until `pattern` (a regex) matches `count` times in the output; the matches, or None."""
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline:
            found = re.findall(pattern, self.output(), re.M)
            if len(found) >= count:
                return found
            if all(p.poll() is not None for p in self.procs):
                return None
            time.sleep(0.05)
        return None

    def kill(self, sig=signal.SIGKILL):
        """Sends `sig` to every process and all it started (SIGKILL: and reaps them).

        SIGTERM to a gradwire-run lets it stop its ranks itself (with its 5 s grace); SIGKILL goes
        to every descendant at once, as gradwire-run puts each rank in a process group of its own."""
        targets = [p.pid for p in self.procs if p.poll() is None]
        if sig == signal.SIGKILL:
            targets += descendants(targets)
        for pid in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        if sig == signal.SIGKILL:
            for p in self.procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()
        self.dir.cleanup()

    # --- results --------------------------------------------------------------------
    @property
    def returncodes(self):
        return [p.poll() for p in self.procs]

    def host_output(self, i):
        """What command i (in start order) printed so far, stdout and stderr together."""
        with open(self.paths[i], "rb") as f:
            return f.read().decode(errors="replace")

    def output(self):
        return "".join(f"--- host {h} ---\n" + self.host_output(i) for i, h in enumerate(self.hosts))

    def passed_ranks(self):
        """The ranks that printed "rank R: PASS"."""
        return {int(r) for r in _PASS.findall(self.output())}

    def rank_lines(self):
        """{rank: [lines]} from gradwire-run's "[R] " prefixes."""
        lines = {}
        for line in self.output().splitlines():
            m = _PREFIX.match(line)
            if m:
                lines.setdefault(int(m.group(1)), []).append(m.group(2))
        return lines


def launcher_commands(c, per_host, argv, master_port=MASTER_PORT, launcher_args=()):
    """gradwire-run on hosts 0..len(per_host)-1 with per_host[i] ranks on host i."""
    counts = ",".join(str(n) for n in per_host)
    common = ["--nnodes", str(len(per_host)), "--nproc-per-node", counts, "--master-addr", c.addr(0),
              "--master-port", str(master_port), *launcher_args]
    return [(h, [sys.executable, LAUNCHER, "--node-rank", str(h), *common, "--", *argv], None)
            for h in range(len(per_host))]


def start_launcher_job(c, per_host, argv, env=None, master_port=MASTER_PORT, launcher_args=()):
    """One gradwire-run per host (node rank = host index); the token comes from GRADWIRE_JOB_TOKEN
    in `env`, else each node derives it from the master address and port."""
    return Job(c, launcher_commands(c, per_host, argv, master_port, launcher_args), env)


def mpirun_argv(c, per_host, argv, mca=()):
    """mpirun's command line, to run inside host 0: the daemons it starts through cluster-rsh call it
    back over the bridge (from the root namespace they could not reach it)."""
    hosts = ",".join(f"{c.host_ns(h)}:{n}" for h, n in enumerate(per_host))
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "plm_rsh_agent", RSH, "-H", hosts,
            "-np", str(sum(per_host)), "--mca", "oob_tcp_if_include", "eth0", "--mca", "btl_tcp_if_include", "eth0",
            *mca, "-x", f"MASTER_ADDR={c.addr(0)}", *argv]


def start_mpirun_job(c, per_host, argv, env=None, mca=()):
    """mpirun inside host 0 over every host; gradwire's variables come from mpirun (port and token
    derived from its job id), MASTER_ADDR is host 0's address."""
    e = {k: v for k, v in (os.environ if env is None else env).items()
         if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT", "GRADWIRE_JOB_TOKEN")}
    return Job(c, [(0, mpirun_argv(c, per_host, argv, mca), None)], e)


def start_env_job(c, per_host, argv, env_of, env=None):
    """One process per rank, started directly in its host with env_of(host, local, rank) added (for
    launchers that do not exist here, such as Slurm's srun)."""
    commands, rank = [], 0
    for h, n in enumerate(per_host):
        for local in range(n):
            commands.append((h, list(argv), env_of(h, local, rank)))
            rank += 1
    return Job(c, commands, env)


def mpirun_available():
    return shutil.which("mpirun") is not None
