"""Shared by the multi-process test harnesses (test_multiprocess.py, test_ps.py, test_mpi.py,
test_cuda_multiprocess.py, ../launcher/test_launcher.py, ../observe/test_timeline.py)."""
import re
import time

_RANK_PREFIX = re.compile(r"\[(\d+)\] (.*)")


def rank_lines(output):
    """{rank: [lines]} from the output of scripts/gradwire-run, which prefixes each rank's lines with "[R] "."""
    lines = {}
    for line in output.splitlines():
        m = _RANK_PREFIX.match(line)
        if m:
            lines.setdefault(int(m.group(1)), []).append(m.group(2))
    return lines


def alive(pid):
    """False once process `pid` has ended: gone, a zombie not yet reaped, or reaped between
    opening its /proc entry and reading it (ESRCH, ProcessLookupError)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def poll_until(condition, limit, what):
    """A bounded poll of `condition`: raises AssertionError("<what> within <limit> s") if it
    does not hold in time (a sleep here never stages what a test asserts)."""
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {limit} s")
        time.sleep(0.02)
