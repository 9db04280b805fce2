"""What every benchmark on emulated hosts does around its runs: find its binary, check that
hosts can be emulated, make its results folder, say when and on what it ran, hold the
cluster (taken down on Ctrl-C, SIGTERM or SIGHUP too) and write its CSVs.
(k_of_n_hosts.py, state_transfer_hosts.py, straggler_hosts.py.)"""
import csv
import json
import os
import signal
import subprocess
import sys
import time

from elastic_trials import ROOT, Job, gwcluster


def find_binary(parser, given, relative, hint):
    """`given` if set (checked), else ROOT/build-*/relative, else ROOT/build/relative; else a
    usage error that gives `hint` (how to build it)."""
    if given is not None:
        if not os.access(given, os.X_OK):
            parser.error(f"--binary {given}: not an executable file")
        return given
    first, rest = relative.split("/", 1)
    for path in (os.path.join(ROOT, first, rest), os.path.join(ROOT, "build", rest)):
        if os.access(path, os.X_OK):
            return path
    parser.error(f"no {rest} in {first}/ or build/: {hint}, or pass --binary PATH")


def require_emulated_hosts(parser):
    if os.geteuid() != 0:
        parser.error("emulated hosts need root (network namespaces, scripts/cluster); run it as root")
    problem = gwcluster.support_problem()
    if problem:
        parser.error(f"emulated hosts unavailable: {problem}")


def results_dir(name):
    path = os.path.join(os.environ.get("GRADWIRE_RESULTS_DIR", os.path.join(ROOT, "results")), name)
    os.makedirs(path, exist_ok=True)
    return path


def begin(name, note=""):
    """SIGTERM and SIGHUP become Ctrl-C (so a cluster's with block takes it down), and a line
    says when, on how many cores and under what load the run starts."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.default_int_handler)
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(f"# {name}: {time.strftime('%F %T', time.gmtime())} UTC, {os.cpu_count()} cores, load {load}"
          + (f"; {note}" if note else ""), flush=True)


def on_cluster(script, hosts, tag, body):
    """body(cluster) on `hosts` emulated hosts; None when it returned, else the exit status
    (the cluster could not be made: 1; interrupted: 130), said on stderr."""
    try:
        with gwcluster.cluster(hosts, name=f"{tag}{os.getpid()}") as cluster:
            body(cluster)
    except gwcluster.ClusterError as e:
        print(f"{script}: emulated cluster: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{script}: interrupted; cluster taken down", file=sys.stderr)
        return 130
    return None


def write_csv(path, header, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def tx_bytes(cluster, host):
    """Bytes host `host`'s eth0 has sent (its kernel counter: payload, headers of every layer and
    retransmissions, whatever program sent them)."""
    out = subprocess.run(["ip", "-n", cluster.host_ns(host), "-s", "-j", "link", "show", "eth0"],
                         capture_output=True, text=True, check=True).stdout
    return int(json.loads(out)[0]["stats64"]["tx"]["bytes"])


def run_job(argv, cluster, env, port, stem, timeout, ranks, launcher_args=()):
    """One job of `ranks` ranks, one per host (elastic_trials.Job), waited for until `timeout`
    (+15 s, then killed): (everything it printed, the launchers' exit codes), or (output,
    None) when it had to be killed."""
    job = Job(argv, cluster, env, port, stem, timeout, ranks=ranks, launcher_args=launcher_args)
    try:
        finished = job.wait(time.monotonic() + timeout + 15)
    finally:
        job.kill()
    return job.output(), ([p.returncode for p in job.procs] if finished else None)
