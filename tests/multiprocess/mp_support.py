"""Shared by the multi-process test harnesses (test_multiprocess.py, test_ps.py, test_cuda_multiprocess.py)."""
import re

_RANK_PREFIX = re.compile(r"\[(\d+)\] (.*)")


def rank_lines(output):
    """{rank: [lines]} from the output of scripts/gradwire-run, which prefixes each rank's lines with "[R] "."""
    lines = {}
    for line in output.splitlines():
        m = _RANK_PREFIX.match(line)
        if m:
            lines.setdefault(int(m.group(1)), []).append(m.group(2))
    return lines
