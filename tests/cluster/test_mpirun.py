#!/usr/bin/env python3
"""mpirun -np 2 of print_spec: ranks 0 and 1 agree on the derived port and token. Exit 77: skipped."""
import os
import re
import shutil
import subprocess
import sys

SKIP = 77


def main():
    program = sys.argv[1]
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        print("SKIPPED: mpirun is not installed (Debian: apt-get install openmpi-bin)")
        return SKIP
    cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", program]
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT", "MASTER_ADDR", "GRADWIRE_JOB_TOKEN")}
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    print(run.stdout, run.stderr, sep="\n")
    if run.returncode != 0:
        print(f"FAILED: {' '.join(cmd)} exited with {run.returncode}")
        return 1
    lines = [dict(re.findall(r"(\w+)=(\S*)", line)) for line in run.stdout.splitlines() if line.startswith("rank=")]
    checks = [
        (len(lines) == 2, "two ranks printed"),
        (sorted(l.get("rank") for l in lines) == ["0", "1"], "ranks 0 and 1"),
        (all(l.get("world") == "2" for l in lines), "world size 2"),
        (all(l.get("source") == "openmpi" for l in lines), "source openmpi"),
        (len({l.get("master") for l in lines}) == 1, "equal master address and port"),
        (all(20000 <= int(l["master"].rsplit(":", 1)[1]) < 30000 for l in lines if "master" in l), "port in 20000..29999"),
        (len({l.get("token") for l in lines}) == 1 and lines and lines[0].get("token"), "equal non-empty tokens"),
    ]
    failed = [what for ok, what in checks if not ok]
    for what in failed:
        print("FAILED:", what)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
