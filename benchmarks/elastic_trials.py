#!/usr/bin/env python3
"""The trials of benchmarks/elastic.sh: an elastic all-reduce job loses a rank, how long until
every survivor completes a step again, and are the survivors still right?

    elastic_trials.py --mode loopback|hosts [--cluster NAME --rate RATE --port P]
                      --kinds kill0,kill-mid,kill-last,partition,sigstop --trials N
                      --worker ELASTIC_WORKER --csv FILE --logs DIR
                      [--steps 60] [--pace-ms 20] [--trial-timeout 120]

One trial: 4 ranks of `elastic_worker train STEPS PACE_MS` (tests/multiprocess/elastic_worker.cpp),
started by scripts/gradwire-run --keep-going: on this host (loopback) or one rank on each host
0..3 of the emulated cluster NAME (scripts/cluster, made and shaped by the caller). Once the
victim has written step10-R, the loss: time.monotonic_ns(), then
    kill0, kill-mid, kill-last   kill -9 of rank 0, 1, 3
    partition                    host 2's eth0 down (healed once the job has ended)
    sigstop                      SIGSTOP of rank 2 for 6 s, then SIGCONT (GRADWIRE_STALL_TIMEOUT=2)
Recovery = the latest survivor's first "RECOVERED ... at NS" (the step it completed in the new
view; steady_clock is CLOCK_MONOTONIC, the clock of time.monotonic_ns()) minus the loss. A trial
passes if it ended within --trial-timeout, every survivor printed RECOVERED and PASS in a view
of exactly the three survivors with the victim lost, their hashes are equal (bit-identical
replicas), each found the step (cut >= 0) from which the float64 reference that leaves the
victim out matches its parameters, all the same step and that step at the loss (11 .. the
step completed in the new view + 1), and the victim stopped as it should (killed; partition
and sigstop: "EXPECTED peer_lost", left out of the view). Why 60 steps by default: SGD on fresh
batches forgets its past, and from about 100 steps on the reference that leaves the victim out
from step 0 matches as well as the true one (cut 0), so the check would no longer see the loss.
Trials go round the kinds (trial 1 of every kind, then trial 2, ...), so that a noisy minute of
the machine lands on every kind. Appends one CSV row per trial to --csv; keeps each trial's
output in --logs.
"""
import argparse
import contextlib
import csv
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LAUNCHER = os.path.join(ROOT, "scripts", "gradwire-run")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import gwcluster  # noqa: E402  (scripts/: emulated hosts, descendants)

RANKS = 4
# kind: (victim rank, what is done to it)
KINDS = {
    "kill0": (0, "kill -9 of rank 0"),
    "kill-mid": (1, "kill -9 of rank 1"),
    "kill-last": (3, "kill -9 of rank 3"),
    "partition": (2, "host 2's link down"),
    "sigstop": (2, "SIGSTOP of rank 2 for 6 s"),
}
STOP_S = 6.0           # how long a SIGSTOPped rank stays stopped (past 2 x GRADWIRE_STALL_TIMEOUT)
STALL_TIMEOUT_S = "2"  # GRADWIRE_STALL_TIMEOUT of the sigstop trials
LOSS_AFTER_STEP = 10   # the victim is hit once it wrote step10-R (after its step 10)
START_BOUND_S = 60.0   # the victim's pid file and step 10, from the start
JOIN_TIMEOUT_S = "30"  # GRADWIRE_TIMEOUT: a rank that never joins fails the job instead of hanging it
FIELDS = ["mode", "rate", "kind", "victim", "trial", "status", "recovery_s", "recovery_first_s", "recovered_step",
          "survivors_passed", "bit_identical", "cut", "view", "victim_outcome", "wall_s", "note", "log"]

RECOVERED = re.compile(r"rank (\d+): RECOVERED view (\d+) step (\d+) at (\d+)")
PASS = re.compile(r"rank (\d+): PASS view (\d+) members (\S+) lost (\S+) redone (\d+) hash ([0-9a-f]{16}) diff (\S+) "
                  r"cut (-?\d+)")
EXPECTED = re.compile(r"rank (\d+): EXPECTED (\S+): (.*)")
FAIL = re.compile(r"rank (\d+): FAIL (.*)")
SIGNALLED = re.compile(r"gradwire-run: rank (\d+) was killed by (\S+)")


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=("loopback", "hosts"), required=True)
    p.add_argument("--cluster", help="hosts: the emulated cluster's name (scripts/cluster --name), 4 hosts, up")
    p.add_argument("--rate", default="-", help="hosts: the links' rate, for the CSV (the caller shapes them)")
    p.add_argument("--port", type=int, default=29600, help="hosts: the first trial's master port (+1 per trial)")
    p.add_argument("--kinds", default=",".join(KINDS), help="comma-separated, of: " + ", ".join(KINDS))
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--worker", required=True, help="the elastic_worker binary")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--pace-ms", type=int, default=20)
    p.add_argument("--trial-timeout", type=float, default=120.0, help="seconds; a trial still running is failed")
    p.add_argument("--csv", required=True, help="appended to (header written if the file is new or empty)")
    p.add_argument("--logs", required=True, help="folder for each trial's output")
    o = p.parse_args(argv)
    o.kinds = [k for k in re.split(r"[,\s]+", o.kinds) if k]
    for k in o.kinds:
        if k not in KINDS:
            p.error(f"--kinds: unknown kind '{k}'; known: {', '.join(KINDS)}")
    if o.mode == "hosts" and not o.cluster:
        p.error("--mode hosts needs --cluster NAME (a cluster of 4 hosts that scripts/cluster made)")
    if o.mode == "loopback" and "partition" in o.kinds:
        p.error("partition needs emulated hosts (--mode hosts); leave it out of --kinds in loopback")
    if o.trials < 1 or o.steps < 20 or o.pace_ms < 0:
        p.error("--trials >= 1, --steps >= 20 (the loss comes after step 10), --pace-ms >= 0")
    if not os.access(o.worker, os.X_OK):
        p.error(f"--worker {o.worker}: not an executable file")
    return o


descendants = gwcluster.descendants


class Job:
    """The launchers of one job of `ranks` ranks running `argv` (one launcher per host, a rank
    each, on `cluster`; one launcher for them all when cluster is None), output to one file
    each. `launcher_args`: more gradwire-run options; its own --timeout (`timeout` s) stops
    the ranks a little before a caller's bound kills everything."""

    def __init__(self, argv, cluster, env, port, log_stem, timeout, ranks=RANKS, launcher_args=()):
        self.procs, self.paths = [], []
        bound = ["--keep-going", "--timeout", f"{timeout:g}", *launcher_args]
        if cluster is None:
            commands = [[sys.executable, LAUNCHER, "-n", str(ranks), *bound, "--", *argv]]
        else:
            common = ["--nnodes", str(ranks), "--nproc-per-node", "1", "--master-addr", cluster.addr(0),
                      "--master-port", str(port), *bound]
            commands = [cluster.exec_args(h, [sys.executable, LAUNCHER, "--node-rank", str(h), *common, "--", *argv])
                        for h in range(ranks)]
        try:
            for i, cmd in enumerate(commands):
                path = f"{log_stem}.{i}.out" if len(commands) > 1 else f"{log_stem}.out"
                with open(path, "wb") as out:
                    self.procs.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                                       stdin=subprocess.DEVNULL, start_new_session=True))
                self.paths.append(path)
        except BaseException:
            self.kill()
            raise

    def running(self):
        return any(p.poll() is None for p in self.procs)

    def wait(self, deadline):
        """True if every launcher ended before `deadline` (time.monotonic())."""
        while self.running():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def kill(self):
        """SIGKILL to every launcher and everything below it (ranks have process groups of their own)."""
        targets = [p.pid for p in self.procs if p.poll() is None]
        targets += descendants(targets)
        for pid in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)

    def output(self):
        text = []
        for path in self.paths:
            with open(path, "rb") as f:
                text.append(f.read().decode(errors="replace"))
        return "\n".join(text)


def wait_for(condition, deadline):
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def base_env():
    # The defaults (heartbeat, stall and step timeouts) are what is measured: the caller's
    # GRADWIRE_* settings are left out.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GRADWIRE_", "GW_TEST_"))}
    env["GRADWIRE_TIMEOUT"] = JOIN_TIMEOUT_S
    env["GRADWIRE_JOB_TOKEN"] = secrets.token_hex(16)  # the same on every host of the job
    return env


def victim_outcome(kind, victim, out):
    """(word, as expected?) for what became of the victim."""
    if any(int(m.group(1)) == victim for m in PASS.finditer(out)):
        return "PASS(did-not-stop)", False
    for m in SIGNALLED.finditer(out):
        if int(m.group(1)) == victim:
            return m.group(2), kind.startswith("kill") and m.group(2) == "SIGKILL"
    for m in EXPECTED.finditer(out):
        if int(m.group(1)) == victim:
            left_out = kind in ("partition", "sigstop") and m.group(2) == "peer_lost"
            return m.group(2), left_out
    for m in FAIL.finditer(out):
        if int(m.group(1)) == victim:
            return "FAIL", False
    return "no-word", False


def run_trial(o, cluster, kind, trial, port):
    victim, _ = KINDS[kind]
    survivors = [r for r in range(RANKS) if r != victim]
    label = "loopback" if o.mode == "loopback" else o.rate
    stem = os.path.join(o.logs, f"{label}-{kind}-{trial:02d}")
    env = base_env()
    if kind == "sigstop":
        env["GRADWIRE_STALL_TIMEOUT"] = STALL_TIMEOUT_S
    notes = []
    row = dict(mode=o.mode, rate=label, kind=kind, victim=victim, trial=trial, log=os.path.relpath(stem, o.logs))
    started = time.monotonic()
    loss_ns = None
    partitioned = False
    with tempfile.TemporaryDirectory(prefix="gw-elastic-bench-") as sync:
        env["GW_TEST_SYNC_DIR"] = sync
        job = Job([o.worker, "train", str(o.steps), str(o.pace_ms)], cluster, env, port, stem, o.trial_timeout)
        try:
            pid_file = os.path.join(sync, f"pid-{victim}")
            ready = wait_for(lambda: (os.path.exists(os.path.join(sync, f"step10-{victim}"))
                                      and os.path.exists(pid_file) and os.path.getsize(pid_file) > 0)
                             or not job.running(), started + START_BOUND_S)
            if not ready or not job.running():
                notes.append(f"the victim never reached step 10 ({'job ended' if ready else f'{START_BOUND_S:g} s'})")
            else:
                with open(pid_file) as f:
                    pid = int(f.read())
                if kind.startswith("kill"):
                    loss_ns = time.monotonic_ns()
                    os.kill(pid, signal.SIGKILL)
                elif kind == "partition":
                    partitioned = True  # healed in any case, even if taking the link down failed half-way
                    loss_ns = time.monotonic_ns()
                    cluster.partition(victim)
                else:
                    loss_ns = time.monotonic_ns()
                    os.kill(pid, signal.SIGSTOP)
                    time.sleep(STOP_S)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGCONT)
            ended = job.wait(started + o.trial_timeout + 15)
            if not ended:
                notes.append(f"hung: still running after {o.trial_timeout + 15:g} s, killed")
        finally:
            job.kill()
            if partitioned:
                cluster.heal(victim)
    out = job.output()
    if "timed out after" in out:
        notes.insert(0, f"hung: gradwire-run --timeout ({o.trial_timeout:g} s) stopped the job")
    row["wall_s"] = f"{time.monotonic() - started:.1f}"

    # Recovery: each survivor's first step completed in a new view.
    first = {}
    for m in RECOVERED.finditer(out):
        r = int(m.group(1))
        if r in survivors and r not in first:
            first[r] = (int(m.group(3)), int(m.group(4)))
    if loss_ns is not None and first:
        times = [(ns - loss_ns) / 1e9 for _, ns in first.values()]
        row["recovery_s"] = f"{max(times):.3f}" if len(first) == len(survivors) else ""
        row["recovery_first_s"] = f"{min(times):.3f}"
        row["recovered_step"] = max(k for k, _ in first.values())
    missing = [r for r in survivors if r not in first]
    if loss_ns is not None and missing:
        notes.append("no RECOVERED from rank " + ",".join(map(str, missing)))

    # Correctness: every survivor's PASS line.
    got = {}
    for m in PASS.finditer(out):
        got[int(m.group(1))] = m
    passed = [r for r in survivors if r in got]
    row["survivors_passed"] = f"{len(passed)}/{len(survivors)}"
    hashes = {got[r].group(6) for r in passed}
    cuts = sorted({int(got[r].group(8)) for r in passed})
    views = sorted({int(got[r].group(2)) for r in passed})
    row["bit_identical"] = "yes" if len(passed) == len(survivors) and len(hashes) == 1 else "no"
    row["cut"] = "/".join(map(str, cuts))
    row["view"] = "/".join(map(str, views))
    members = ",".join(map(str, survivors))
    for r in passed:
        m = got[r]
        if (m.group(3), m.group(4)) != (members, str(victim)):
            notes.append(f"rank {r}: members {m.group(3)} lost {m.group(4)} (want {members} lost {victim})")
    if len(passed) < len(survivors):
        for r in survivors:
            if r in got:
                continue
            said = [m.group(0) for pat in (EXPECTED, FAIL) for m in pat.finditer(out) if int(m.group(1)) == r]
            notes.append(f"rank {r} did not pass: {said[0][:160] if said else 'no word'}")
    if len(hashes) > 1:
        notes.append("survivors' hashes differ: " + ",".join(f"{r}={got[r].group(6)}" for r in passed))
    if any(c < 0 for c in cuts):
        notes.append("a survivor matched no float64 reference (cut -1)")
    if len(cuts) > 1:
        notes.append("survivors matched the reference from different steps")
    # The cut must be the loss: the victim finished steps 0..10, and the first step completed in
    # the new view (K) was summed without it, or it was the interrupted step that one survivor
    # had applied in the old view (cut K + 1). A cut elsewhere (cut 0 after too many --steps:
    # SGD has forgotten the first steps, every early cut matches) proves nothing about the loss.
    in_window = bool(cuts and first) and all(LOSS_AFTER_STEP + 1 <= c <= max(k for k, _ in first.values()) + 1
                                             for c in cuts if c >= 0)
    if cuts and min(cuts) >= 0 and not in_window:
        notes.append(f"cut {row['cut']} is not at the loss (steps {LOSS_AFTER_STEP + 1}..recovered step + 1)"
                     + (": fewer --steps" if cuts == [0] else ""))

    word, as_expected = victim_outcome(kind, victim, out)
    row["victim_outcome"] = word
    if not as_expected and loss_ns is not None:
        notes.append(f"victim: {word}")

    ok = (loss_ns is not None and not missing and len(passed) == len(survivors) and len(hashes) == 1
          and cuts and min(cuts) >= 0 and len(cuts) == 1 and in_window and as_expected
          and not any(n.startswith(("hung", "rank ")) for n in notes))
    row["status"] = "pass" if ok else "FAIL"
    row["note"] = "; ".join(notes)
    return row


def main(argv):
    o = parse(argv)
    os.makedirs(o.logs, exist_ok=True)
    cluster = None
    if o.mode == "hosts":
        cluster = gwcluster.Cluster(o.cluster)
        if not cluster.state():
            sys.exit(f"elastic_trials.py: no cluster '{o.cluster}' (make it with scripts/cluster up --hosts 4 "
                     f"--name {o.cluster})")
    new = not os.path.exists(o.csv) or os.path.getsize(o.csv) == 0
    failed = 0
    label = "loopback" if o.mode == "loopback" else o.rate
    with open(o.csv, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        if new:
            w.writeheader()
        port = o.port
        for trial in range(1, o.trials + 1):
            for kind in o.kinds:
                row = run_trial(o, cluster, kind, trial, port)
                port += 1
                w.writerow(row)
                f.flush()
                failed += row["status"] != "pass"
                rec = row.get("recovery_s") or "-"
                print(f"# [{label}] {kind:<9} trial {trial:>2}: {row['status']:<4} recovery {rec:>6} s  survivors "
                      f"{row['survivors_passed']} bit-identical {row['bit_identical']} cut {row['cut'] or '-'} "
                      f"victim {row['victim_outcome']} ({row['wall_s']} s){'  ' + row['note'] if row['note'] else ''}",
                      flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
