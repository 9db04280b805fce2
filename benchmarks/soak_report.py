#!/usr/bin/env python3
"""The sampler and the report of benchmarks/soak.sh.

    soak_report.py sample WORK MINUTE CSV     one row per process of every long job (and the system) into CSV
    soak_report.py stop-step WORK/JOB SECONDS the step every rank of JOB stops after (written to its stop file)
    soak_report.py final WORK CSV OUT         growth per process, totals, the short jobs; exit 1 on a miss

WORK holds a folder per long job: rank<R>.status files that soak_worker rewrites every second
(pid, role, steps, checks, wrong, errors, state), launcher.pid (gradwire-run), kind, and after
the stop rc (gradwire-run's exit status). WORK/short.csv lists the short jobs soak.sh looped.
"""
import csv
import glob
import os
import sys

# Memory is judged on a process's private resident memory (RssAnon + RssFile: its heap,
# stacks and the pages of its code), where a leak lives. Resident shared memory (RssShmem)
# is reported but judged by its mappings instead: UCX's shared-memory transport maps a few
# segments of about 4 MiB at connect time (its FIFOs and bounce buffers, shared with the
# peer) and their pages count as resident once touched, which goes on slowly over a run
# (10-minute runs: +64, +28, +12, +4 KiB in minutes 2-5, then nothing). That RSS
# is bounded by the segments' size; a leak there would map new segments, so the size of
# the shared mappings (shm_mapped_kib, from /proc/PID/smaps) must not grow at all.
#
# Growth allowed from the end of the first minute to the end, per process. A steady process
# still moves a little: glibc's allocator keeps freed chunks (a trimmed top, a thread's
# arena taking a new 64 KiB heap when a message of another size comes), and pages of the
# heap touched for the first time late in a run (a rare path, a larger reply) count in RSS
# once. Both are bounded and do not grow with the steps; a leak does (a few bytes a step is
# megabytes over 100 000 steps). 512 KiB is above the noise of these runs (the largest
# private growth seen in 10-minute runs was one step of 48 KiB, once, in an asio_tcp rank:
# docs/reliability.md#soak) and below what a leak of 8 bytes a step makes in 10 minutes
# (the long jobs take 70 000 to 180 000 steps).
RSS_TOLERANCE_KIB = 512
# Descriptors: none. A process's sockets, eventfds and shared-memory files are opened at
# connect time; one more at the end is one left open.
FD_TOLERANCE = 0
SHM_MAPPED_TOLERANCE_KIB = 0

FIELDS = ["minute", "job", "kind", "rank", "role", "pid", "rss_kib", "private_kib", "shmem_kib", "shm_mapped_kib",
          "vm_kib", "fds", "steps", "checks", "wrong", "errors", "state"]
SHARED_MAPPING = ("/dev/shm/", "/SYSV", "/memfd:")


def read_status(path):
    try:
        with open(path) as f:
            return dict(kv.split("=", 1) for kv in f.read().split())
    except (OSError, ValueError):
        return None


def proc_sample(pid):
    """Memory (KiB: VmRSS, RssAnon + RssFile, RssShmem, size of shared-memory mappings, VmSize) and
    open descriptors of a live process: a dict, or None once it is gone."""
    try:
        st = {}
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmSize"):
                    st[key] = int(value.split()[0])
        mapped, shared = 0, False
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                head = line.split()
                if "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
                    shared = len(head) >= 6 and head[5].startswith(SHARED_MAPPING)
                elif shared and head[0] == "Size:":
                    mapped += int(head[1])
        return dict(rss_kib=st["VmRSS"], private_kib=st["RssAnon"] + st["RssFile"], shmem_kib=st["RssShmem"],
                    shm_mapped_kib=mapped, vm_kib=st["VmSize"], fds=len(os.listdir(f"/proc/{pid}/fd")))
    except (OSError, ValueError, KeyError):
        return None


GONE = dict(rss_kib=None, private_kib=None, shmem_kib=None, shm_mapped_kib=None, vm_kib=None, fds=None)


def jobs(work):
    return sorted(d for d in os.listdir(work) if os.path.isfile(os.path.join(work, d, "kind")))


def read_text(path, default=""):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default


def tcp_time_wait():
    """Sockets in TIME_WAIT on this machine (IPv4 and IPv6): short jobs that leave ports behind show here."""
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                n += sum(1 for line in f.readlines()[1:] if line.split()[3] == "06")
        except OSError:
            pass
    return n


def short_totals(work):
    runs = fails = steps = wrong = 0
    path = os.path.join(work, "short.csv")
    if os.path.exists(path):
        with open(path) as f:
            for row in csv.DictReader(f):
                runs += 1
                fails += row["rc"] != "0" or row["errors"] != "0"
                steps += int(row["steps"] or 0)
                wrong += int(row["wrong"] or 0)
    return runs, fails, steps, wrong


def sample(work, minute, csv_path):
    rows = []
    for job in jobs(work):
        d = os.path.join(work, job)
        kind = read_text(os.path.join(d, "kind"))
        launcher = read_text(os.path.join(d, "launcher.pid"))
        if launcher:
            mem = proc_sample(launcher)
            rows.append(dict(minute=minute, job=job, kind=kind, rank="-", role="launcher", pid=launcher,
                             **(mem or GONE), steps="", checks="", wrong="", errors="",
                             state="running" if mem else "gone"))
        for path in sorted(glob.glob(os.path.join(d, "rank*.status")), key=lambda p: int(p.split("rank")[-1][:-7])):
            st = read_status(path)
            if st is None:
                continue
            mem = proc_sample(st["pid"])
            rows.append(dict(minute=minute, job=job, kind=kind, rank=st["rank"], role=st["role"], pid=st["pid"],
                             **(mem or GONE), steps=st["steps"], checks=st["checks"], wrong=st["wrong"],
                             errors=st["errors"], state=st["state"] if mem else "gone:" + st["state"]))
    runs, fails, steps, wrong = short_totals(work)
    rows.append(dict(minute=minute, job="system", kind="short jobs", rank="-", role=f"time_wait={tcp_time_wait()}",
                     pid="-", **dict(GONE, fds=len(os.listdir("/dev/shm"))), steps=steps, checks=runs, wrong=wrong,
                     errors=fails, state="-"))
    new = not os.path.exists(csv_path)
    with open(csv_path, "a", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        if new:
            w.writeheader()
        w.writerows(rows)
    print(f"--- minute {minute} ---")
    print(f"{'job':<10} {'rank':>4} {'role':<8} {'pid':>7} {'RSS KiB':>8} {'private':>8} {'shmem':>6} "
          f"{'shm map':>7} {'fds':>4} {'steps':>9} {'wrong':>5} {'err':>3} state")
    for r in rows[:-1]:
        v = {k: "-" if r[k] is None else r[k] for k in ("rss_kib", "private_kib", "shmem_kib", "shm_mapped_kib", "fds")}
        print(f"{r['job']:<10} {r['rank']:>4} {r['role']:<8} {r['pid']:>7} {v['rss_kib']:>8} {v['private_kib']:>8} "
              f"{v['shmem_kib']:>6} {v['shm_mapped_kib']:>7} {v['fds']:>4} {r['steps']:>9} {r['wrong']:>5} "
              f"{r['errors']:>3} {r['state']}")
    s = rows[-1]
    print(f"short jobs: {s['checks']} run, {s['errors']} failed, {s['steps']} steps, {s['wrong']} wrong; "
          f"system: {s['role']}, /dev/shm entries={s['fds']}")
    sys.stdout.flush()


def stop_step(job_dir, seconds):
    """A step beyond every rank's: the most steps reported plus 10 s at the mean rate so far (at least 200)."""
    steps = [int(st["steps"]) for p in glob.glob(os.path.join(job_dir, "rank*.status"))
             if (st := read_status(p)) and st["role"] == "worker"]
    top = max(steps, default=0)
    rate = top / max(1.0, float(seconds))
    print(top + max(200, int(rate * 10)))


def final(work, csv_path, out_path):
    with open(csv_path) as f:
        rows = [r for r in csv.DictReader(f) if r["job"] != "system"]
    minutes = sorted({int(r["minute"]) for r in rows})
    first, last = minutes[0], minutes[-1]
    by_pid = {}
    for r in rows:
        by_pid.setdefault((r["job"], r["pid"]), []).append(r)
    misses = []
    per_process = []
    for (job, pid), samples in sorted(by_pid.items(), key=lambda kv: (kv[0][0], kv[1][0]["rank"])):
        samples.sort(key=lambda r: int(r["minute"]))
        a = next((r for r in samples if int(r["minute"]) == first and r["rss_kib"]), None)
        b = next((r for r in samples if int(r["minute"]) == last and r["rss_kib"]), None)
        rec = dict(job=job, kind=samples[0]["kind"], rank=samples[0]["rank"], role=samples[0]["role"], pid=pid)
        if a is None or b is None:
            misses.append(f"{job} rank {rec['rank']} ({rec['role']}, pid {pid}) did not live from minute {first} to "
                          f"minute {last}")
            continue
        for key in ("rss", "private", "shmem", "shm_mapped"):
            rec[f"{key}_first"], rec[f"{key}_last"] = int(a[f"{key}_kib"]), int(b[f"{key}_kib"])
        rec.update(fd_first=int(a["fds"]), fd_last=int(b["fds"]),
                   rss_peak=max(int(r["rss_kib"]) for r in samples if r["rss_kib"]))
        if rec["private_last"] - rec["private_first"] > RSS_TOLERANCE_KIB:
            misses.append(f"{job} rank {rec['rank']} ({rec['role']}): private RSS grew "
                          f"{rec['private_last'] - rec['private_first']} KiB (> {RSS_TOLERANCE_KIB}) from minute {first} "
                          f"to {last}")
        if rec["shm_mapped_last"] - rec["shm_mapped_first"] > SHM_MAPPED_TOLERANCE_KIB:
            misses.append(f"{job} rank {rec['rank']} ({rec['role']}): shared-memory mappings grew "
                          f"{rec['shm_mapped_first']} -> {rec['shm_mapped_last']} KiB")
        if rec["fd_last"] - rec["fd_first"] > FD_TOLERANCE:
            misses.append(f"{job} rank {rec['rank']} ({rec['role']}): open descriptors {rec['fd_first']} -> {rec['fd_last']}")
        per_process.append(rec)

    # The final state of every rank, after the stop: steps, checks, wrong, errors, and the job's exit status.
    summary = {}
    for job in jobs(work):
        d = os.path.join(work, job)
        kind = read_text(os.path.join(d, "kind"))
        rc = read_text(os.path.join(d, "rc"), "missing")
        s = summary.setdefault(job, dict(kind=kind, procs=0, steps=0, checks=0, wrong=0, errors=0, rc=rc))
        for p in glob.glob(os.path.join(d, "rank*.status")):
            st = read_status(p) or {}
            s["procs"] += 1
            if st.get("role") == "worker":
                s["steps"] = max(s["steps"], int(st.get("steps", 0)))
            s["checks"] += int(st.get("checks", 0))
            s["wrong"] += int(st.get("wrong", 0))
            s["errors"] += int(st.get("errors", 0))
            if st.get("state") != "done":
                misses.append(f"{job} {os.path.basename(p)[:-7]}: ended in state {st.get('state')}")
        if rc != "0":
            misses.append(f"{job}: gradwire-run exited with {rc}")
        if s["wrong"]:
            misses.append(f"{job}: {s['wrong']} wrong result(s)")
        if s["errors"]:
            misses.append(f"{job}: {s['errors']} error(s)")

    lines = [f"## Soak: {last} minute(s), long jobs (growth from the end of minute {first} to the end of minute {last})",
             "",
             "Per process (launcher first, then rank 0, 1, ...): KiB at the end of minute 1 -> at the end; the "
             "growth column is the largest among the job's processes.",
             "",
             "| job | kind | processes | steps | checks | VmRSS KiB | private RSS KiB (max growth) | shmem RSS KiB "
             "(shm mapped) | fds | errors | wrong |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for job, s in summary.items():
        procs = [p for p in per_process if p["job"] == job]
        pairs = lambda key: " / ".join(f"{p[key + '_first']}->{p[key + '_last']}" for p in procs)
        growth = max((p["private_last"] - p["private_first"] for p in procs), default=0)
        mapped = sorted({f"{p['shm_mapped_first']}->{p['shm_mapped_last']}" for p in procs if p["shm_mapped_first"]})
        lines.append(f"| {job} | {s['kind']} | {s['procs']} ranks + launcher | {s['steps']} | {s['checks']} | "
                     f"{pairs('rss')} | {pairs('private')} ({growth:+d}) | {pairs('shmem')} "
                     f"({', '.join(mapped) or 'none'}) | {pairs('fd')} | {s['errors']} | {s['wrong']} |")
    runs, fails, steps, wrong = short_totals(work)
    kinds = {}
    path = os.path.join(work, "short.csv")
    if os.path.exists(path):
        with open(path) as f:
            for row in csv.DictReader(f):
                k = kinds.setdefault(row["kind"], [0, 0, 0, 0])
                k[0] += 1
                k[1] += row["rc"] != "0" or row["errors"] != "0"
                k[2] += int(row["steps"] or 0)
                k[3] += int(row["wrong"] or 0)
    lines += ["", "| short job kind | runs | failed | steps | wrong |", "|---|---|---|---|---|"]
    lines += [f"| {k} | {v[0]} | {v[1]} | {v[2]} | {v[3]} |" for k, v in sorted(kinds.items())]
    lines.append(f"| all | {runs} | {fails} | {steps} | {wrong} |")
    if runs == 0:
        misses.append("no short job ran")
    if fails:
        misses.append(f"{fails} short job(s) failed")
    if wrong:
        misses.append(f"short jobs: {wrong} wrong result(s)")
    with open(csv_path) as f:
        system = [r for r in csv.DictReader(f) if r["job"] == "system"]
    if system:
        lines += ["", "system (informational; other users of the machine count too): " + ", ".join(
            f"min {r['minute']}: {r['role']} shm={r['fds']}" for r in system)]
    lines += ["", f"tolerance per process: private RSS +{RSS_TOLERANCE_KIB} KiB, shared-memory mappings "
                  f"+{SHM_MAPPED_TOLERANCE_KIB} KiB, descriptors +{FD_TOLERANCE}", ""]
    lines += ["MISSED: " + m for m in misses] if misses else ["every target met: flat private RSS, shared mappings and descriptors, 0 errors, 0 wrong"]
    text = "\n".join(lines)
    print(text)
    with open(out_path, "w") as f:
        f.write(text + "\n")
    per_path = os.path.splitext(out_path)[0] + "-processes.csv"
    with open(per_path, "w", newline="") as f:
        w = csv.DictWriter(f, ["job", "kind", "rank", "role", "pid", "rss_first", "rss_last", "rss_peak", "private_first",
                               "private_last", "shmem_first", "shmem_last", "shm_mapped_first", "shm_mapped_last",
                               "fd_first", "fd_last"])
        w.writeheader()
        w.writerows(per_process)
    return 1 if misses else 0


def main(argv):
    if len(argv) >= 4 and argv[0] == "sample":
        sample(argv[1], int(argv[2]), argv[3])
        return 0
    if len(argv) >= 3 and argv[0] == "stop-step":
        stop_step(argv[1], argv[2])
        return 0
    if len(argv) >= 4 and argv[0] == "final":
        return final(argv[1], argv[2], argv[3])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
