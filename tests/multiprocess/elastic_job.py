"""A job whose ranks can be killed, frozen and replaced one by one (test_ps_elastic.py, benchmarks/ps_chaos.sh).

scripts/gradwire-run starts a job as a whole; chaos needs each rank on its own: a rank is
started with the launcher's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
GRADWIRE_JOB_TOKEN, GRADWIRE_NUM_PS, ...), killed with SIGKILL, frozen with SIGSTOP and
thawed with SIGCONT, and replaced by a process started with GRADWIRE_REJOIN=1 under the
same rank. Every incarnation's output is kept, in order.
"""
import os
import secrets
import signal
import socket
import subprocess
import threading
import time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Incarnation:
    """One process of a rank, and what it printed (stdout and stderr, interleaved)."""

    def __init__(self, rank, number, proc):
        self.rank, self.number, self.proc = rank, number, proc
        self.lines = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in iter(self.proc.stdout.readline, b""):
            self.lines.append(line.decode(errors="replace").rstrip("\n"))

    def text(self):
        return "\n".join(self.lines)


class ElasticJob:
    def __init__(self, command, workers, servers, env=None):
        self.command, self.workers, self.servers = list(command), workers, servers
        self.size = workers + servers
        self.base = dict(os.environ, **(env or {}))
        self.base.update({
            "WORLD_SIZE": str(self.size), "LOCAL_WORLD_SIZE": str(self.size), "GROUP_RANK": "0", "NODE_RANK": "0",
            "GROUP_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
            "GRADWIRE_JOB_TOKEN": secrets.token_hex(16), "GRADWIRE_NUM_PS": str(servers),
        })
        self.base.pop("GRADWIRE_REJOIN", None)
        self.incarnations = {r: [] for r in range(self.size)}
        self.events = []  # (seconds since start, what happened)
        self.started = None

    def log(self, what):
        self.events.append((time.monotonic() - self.started, what))

    def _spawn(self, rank, rejoin, env=None):
        env = dict(self.base, RANK=str(rank), LOCAL_RANK=str(rank), **(env or {}))
        if rejoin:
            env["GRADWIRE_REJOIN"] = "1"
        proc = subprocess.Popen(self.command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        inc = Incarnation(rank, len(self.incarnations[rank]), proc)
        self.incarnations[rank].append(inc)
        return inc

    def start(self):
        self.started = time.monotonic()
        for r in range(self.size):
            self._spawn(r, rejoin=False)
        self.log(f"started {self.workers} workers + {self.servers} servers")

    def current(self, rank):
        return self.incarnations[rank][-1]

    def alive(self, rank):
        return self.current(rank).proc.poll() is None

    def kill(self, rank):
        self.current(rank).proc.send_signal(signal.SIGKILL)
        self.current(rank).proc.wait()
        self.log(f"kill -9 worker {rank}")

    def replace(self, rank, env=None):
        """Starts a replacement of `rank` (GRADWIRE_REJOIN=1; `env`: variables of its own)."""
        inc = self._spawn(rank, rejoin=True, env=env)
        self.log(f"restarted worker {rank} (GRADWIRE_REJOIN=1)")
        return inc

    def freeze(self, rank, seconds):
        self.current(rank).proc.send_signal(signal.SIGSTOP)
        self.log(f"SIGSTOP worker {rank} for {seconds:.1f} s")
        time.sleep(seconds)
        self.current(rank).proc.send_signal(signal.SIGCONT)
        self.log(f"SIGCONT worker {rank}")

    def servers_done(self):
        return all(not self.alive(r) for r in range(self.workers, self.size))

    def wait(self, timeout):
        """Waits for the latest incarnation of every rank; kills what is left at the deadline."""
        deadline = time.monotonic() + timeout
        timed_out = False
        for r in range(self.size):
            inc = self.current(r)
            try:
                inc.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
        if timed_out:
            self.stop()
        for incs in self.incarnations.values():
            for inc in incs:
                inc.reader.join(5)
        return not timed_out

    def stop(self):
        for incs in self.incarnations.values():
            for inc in incs:
                if inc.proc.poll() is None:
                    try:
                        os.killpg(inc.proc.pid, signal.SIGCONT)
                        os.killpg(inc.proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    inc.proc.wait()

    def output(self):
        """Every incarnation's lines, prefixed "[rank.incarnation]"."""
        out = []
        for r, incs in self.incarnations.items():
            for inc in incs:
                out += [f"[{r}.{inc.number}] {l}" for l in inc.lines]
        return "\n".join(out)
