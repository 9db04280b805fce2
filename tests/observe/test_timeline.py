#!/usr/bin/env python3
"""GRADWIRE_TIMELINE and GRADWIRE_LOG from real multi-process jobs on loopback.

    test_timeline.py LAUNCHER MP_WORKER PS_WORKER [unittest args]

A 2-process multi_worker_mirrored job and a 2-worker + 1-server parameter-server job write
one trace file each; the file must be JSON in the Trace Event Format with one track per
rank and the expected events (steps, all-reduces, broadcasts, optimizer steps, pushes and
pulls) carrying bytes and durations.
"""
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest
from decimal import Decimal

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "multiprocess"))
from mp_support import rank_lines  # noqa: E402

LAUNCHER, MP_WORKER, PS_WORKER = sys.argv[1:4]


def run(args, env, bound=180):
    e = dict(os.environ, GRADWIRE_TIMEOUT="30", **env)
    p = subprocess.run([LAUNCHER, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=bound, env=e)
    return p.returncode, p.stdout


def load(path):
    with open(path) as f:
        # Exactly (ts and dur are written to the nanosecond): as floats, microseconds of Unix
        # time keep only a quarter of a microsecond, and an optimizer step that ends just
        # before its step would seem to end after it.
        trace = json.load(f, parse_float=Decimal)  # must parse as a whole
    events = trace["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    return complete, names


def of(events, rank, name):
    return [e for e in events if e["pid"] == rank and e["name"] == name]


def inside(inner, outer):
    return outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]


class Timeline(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="gradwire-timeline-")
        self.path = os.path.join(self.dir, "trace.json")

    def check_common(self, events, names, ranks, began, ended):
        for r in range(ranks):
            self.assertEqual(names.get(r), f"rank {r} of {ranks}")
        # mp_worker trains a one_device reference beside the job: a one-rank job's own track.
        self.assertEqual({p: n for p, n in names.items() if p >= ranks}, {} if ranks == 3 else {100000: "rank 0 of 1"})
        # Every event lies inside the job's run as this test timed it, in microseconds of Unix
        # time (the ranks share the clock; 100 ms for the clocks' drift): a start or duration
        # in another unit, or a negative one, falls outside.
        slack = 100_000
        for e in events:
            self.assertGreaterEqual(e["ts"], began - slack, e)
            self.assertLessEqual(e["ts"] + e["dur"], ended + slack, e)
            self.assertGreater(e["dur"], 0, e)  # written to the nanosecond: every event took some time
            self.assertIn("bytes", e["args"], e)
            self.assertIn(e["tid"], (0, 1), e)

    def test_multi_worker_mirrored_two_processes(self):
        began = time.time() * 1e6
        status, out = run(["-n", "2", "--", MP_WORKER, "train", "sgd"],
                          {"GRADWIRE_TIMELINE": self.path, "GRADWIRE_LOG": "info"})
        ended = time.time() * 1e6
        self.assertEqual(status, 0, out)
        events, names = load(self.path)
        self.check_common(events, names, 2, began, ended)
        steps = [len(of(events, r, "step")) for r in range(2)]
        self.assertGreater(steps[0], 0)
        self.assertEqual(steps[0], steps[1], "both ranks took the same steps")
        for r in range(2):
            reductions = of(events, r, "all_reduce")
            self.assertGreaterEqual(len(reductions), steps[r])
            self.assertTrue(all(e["args"]["bytes"] > 0 and e["args"]["algorithm"] in
                                ("ring", "halving_doubling", "one_shot") for e in reductions))
            self.assertGreater(len(of(events, r, "broadcast")), 0)  # setup
            step_events = of(events, r, "step")
            self.assertTrue(all(e["args"]["bytes"] > 0 for e in step_events), "each step sent its gradient")
            updates = of(events, r, "optimizer_step")
            self.assertGreaterEqual(len(updates), steps[r])
            for u in updates:
                self.assertTrue(any(inside(u, s) for s in step_events), f"optimizer step outside any step: {u}")
        # The same steps happened at the same time on both ranks (one clock, synchronous).
        first = [of(events, r, "step")[-1] for r in range(2)]
        self.assertTrue(first[0]["ts"] < first[1]["ts"] + first[1]["dur"] and
                        first[1]["ts"] < first[0]["ts"] + first[0]["dur"], "last steps overlap in time")
        # GRADWIRE_LOG=info: lines prefixed by rank, from both ranks.
        lines = rank_lines(out)
        for r in range(2):
            logged = [l for l in lines.get(r, []) if l.startswith(f"[gradwire {r}/2 +")]
            self.assertTrue(any("info: communicator over gradwire::transport::asio_tcp" in l for l in logged), out)
            self.assertTrue(any("info: strategy ready in" in l for l in logged), out)
        # scripts/timeline-summary reads it: a row per rank and event.
        summary = subprocess.run([os.path.join(os.path.dirname(LAUNCHER), "timeline-summary"), self.path],
                                 stdout=subprocess.PIPE, text=True, check=True).stdout
        for r in range(2):
            row = next(l for l in summary.splitlines() if l.split()[:5] == ["rank", str(r), "of", "2", "step"])
            self.assertEqual(int(row.split()[5]), steps[r], summary)
        # A rerun replaces the trace instead of adding to it.
        status, out = run(["-n", "2", "--", MP_WORKER, "train", "sgd"], {"GRADWIRE_TIMELINE": self.path})
        self.assertEqual(status, 0, out)
        again, _ = load(self.path)
        self.assertEqual(len(of(again, 0, "step")), steps[0])
        self.assertEqual(len(again), len(events))
        self.assertNotIn("[gradwire ", out, "no log lines without GRADWIRE_LOG")

    def test_parameter_server_two_workers_one_server(self):
        began = time.time() * 1e6
        status, out = run(["-n", "2", "--ps", "1", "--", PS_WORKER, "async"],
                          {"GRADWIRE_TIMELINE": self.path, "GRADWIRE_LOG": "debug"})
        ended = time.time() * 1e6
        self.assertEqual(status, 0, out)
        events, names = load(self.path)
        self.check_common(events, names, 3, began, ended)
        for w in range(2):
            pushes, pulls, steps = of(events, w, "push"), of(events, w, "pull"), of(events, w, "step")
            self.assertEqual(len(pushes), 60)
            self.assertEqual(len(steps), 60)
            self.assertGreaterEqual(len(pulls), 60)  # and the one in setup
            for p in pushes:
                self.assertEqual(p["cat"], "ps")
                self.assertGreater(p["args"]["bytes"], 0)
                # The pull nests in its push, and a gradient cannot be staler than the
                # version the server answered that pull with.
                nested = [q for q in pulls if inside(q, p)]
                self.assertEqual(len(nested), 1, p)
                self.assertTrue(0 <= p["args"]["staleness"] <= nested[0]["args"]["version"], (p, nested[0]))
            self.assertEqual(of(events, w, "optimizer_step"), [], "workers do not run the optimizer")
        # Each push's staleness is what the server recorded for that gradient (its answer to the
        # step's pull says): counted over both workers, the server's own histogram (STATS).
        lines = rank_lines(out)
        server = next((l for l in lines.get(2, []) if "STATS" in l), None)
        self.assertIsNotNone(server, out)
        recorded = [int(x) for x in dict(kv.split("=", 1) for kv in server.split("STATS", 1)[1].split())["staleness"]
                    .split(",") if x]
        traced = collections.Counter(int(p["args"]["staleness"]) for w in range(2) for p in of(events, w, "push"))
        self.assertEqual(sum(recorded), 120, server)
        self.assertEqual([traced[k] for k in range(max(len(recorded), max(traced) + 1))], recorded, server)
        server_pushes = of(events, 2, "push")
        self.assertEqual(len(server_pushes), 120)
        self.assertEqual(sorted({e["args"]["worker"] for e in server_pushes}), [0, 1])
        self.assertEqual(len(of(events, 2, "optimizer_step")), 120)  # async: one update per gradient
        self.assertGreaterEqual(len(of(events, 2, "pull")), 120)
        # GRADWIRE_LOG=debug: every step's stats, with the worker's staleness.
        for w in range(2):
            stats = [l for l in lines.get(w, []) if "debug: step " in l]
            self.assertEqual(len(stats), 60, out)
            self.assertTrue(all("sent " in l and "staleness " in l for l in stats), stats[:3])
        self.assertTrue(any("info: parameter server done" in l for l in lines.get(2, [])), out)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + sys.argv[4:])
