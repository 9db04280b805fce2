#!/usr/bin/env python3
"""Side-by-side table of a gradwire benchmark and the peer baselines measured in the same run.

    compare.py --ours results/allreduce_inproc.csv --peers results/peers [--csv out.csv]

--ours is the CSV a gradwire benchmark writes (bench_table.hpp); --peers is a directory of
nccl-tests-style tables printed by ../shared/peers (one file per peer and rank count,
named PEER_N.txt). For every rank count and size both measured, prints our time and
busbw, each peer's busbw, and the ratio peer time / our time (above 1: gradwire is faster).
"""
import argparse
import csv
import pathlib
import re
import sys


def read_ours(path):
    """{ranks: {bytes: (time_us, busbw)}} from a gradwire benchmark CSV."""
    out = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            out.setdefault(int(row["ranks"]), {})[int(row["size_bytes"])] = (
                float(row["time_us"]), float(row["busbw_gbps"]))
    return out


def read_peer(path):
    """(ranks, {bytes: (time_us, busbw)}) from a peer's table; None if it holds no rows."""
    ranks, rows = None, {}
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("#"):
            m = re.search(r"nranks\s+(\d+)", line)
            if m:
                ranks = int(m.group(1))
            continue
        fields = line.split()
        if len(fields) >= 6 and fields[0].isdigit():
            rows[int(fields[0])] = (float(fields[2]), float(fields[4]))
    return (ranks, rows) if ranks and rows else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ours", required=True)
    ap.add_argument("--label", default="gradwire")
    ap.add_argument("--peers", required=True)
    ap.add_argument("--csv")
    a = ap.parse_args()

    ours = read_ours(a.ours)
    peers = {}  # ranks -> [(name, rows)]
    for p in sorted(pathlib.Path(a.peers).glob("*_[0-9]*.txt")):
        parsed = read_peer(p)
        if parsed is None:
            print(f"# {p.name}: no results (the peer failed or timed out; see the file)", file=sys.stderr)
            continue
        ranks, rows = parsed
        peers.setdefault(ranks, []).append((p.stem.rsplit("_", 1)[0], rows))

    writer = None
    if a.csv:
        out = open(a.csv, "w", newline="")
        writer = csv.writer(out)
        writer.writerow(["ranks", "size_bytes", "ours", "ours_time_us", "ours_busbw_gbps", "peer", "peer_time_us",
                         "peer_busbw_gbps", "speedup"])
    for ranks in sorted(ours):
        named = peers.get(ranks, [])
        if not named:
            print(f"# {ranks} ranks: no peer results to compare with")
            continue
        sizes = sorted(s for s in ours[ranks] if any(s in rows for _, rows in named))
        print(f"# {a.label} vs peers, {ranks} ranks, float32 sum all-reduce; busbw in GB/s; "
              f"x = peer time / {a.label} time (above 1: {a.label} faster)")
        head = f"# {'size(B)':>10} {'time(us)':>10} {'busbw':>7}"
        for name, _ in named:
            head += f" | {name[:16]:>16} {'x':>6}"
        print(head)
        for s in sizes:
            t, bw = ours[ranks][s]
            line = f"  {s:10d} {t:10.2f} {bw:7.3f}"
            for name, rows in named:
                if s in rows:
                    pt, pbw = rows[s]
                    speedup = pt / t if t > 0 else float("nan")
                    line += f" | {pbw:16.3f} {speedup:6.2f}"
                    if writer:
                        writer.writerow([ranks, s, a.label, f"{t:.3f}", f"{bw:.4f}", name, f"{pt:.3f}", f"{pbw:.4f}",
                                         f"{speedup:.3f}"])
                else:
                    line += f" | {'-':>16} {'-':>6}"
            print(line)
        print("#")
    return 0


if __name__ == "__main__":
    sys.exit(main())
