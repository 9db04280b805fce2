#!/usr/bin/env python3
"""Elastic all-reduce across emulated hosts: a host's link goes down mid-run (no FIN or RST ever
arrives); the other three ranks find it by heartbeats, agree on the next view without it and
train to the end, bit-identical and matching the float64 reference that leaves the cut rank out
from the loss on, while the cut-off rank, a minority of one, stops with peer_lost.

    test_elastic_partition.py ELASTIC_WORKER [unittest args]

Two trials: host 2 cut, then host 0 (rank 0, the rendezvous store's host). 4 hosts x 1 rank,
default heartbeat settings. Needs root and `ip netns`; otherwise exits 77 (skipped).
"""
import os
import re
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_support as cs  # noqa: E402

WORKER = sys.argv[1]
HOSTS = 4
PASS = re.compile(r"^\[(\d+)\] rank \d+: PASS view (\d+) members (\S+) lost (\S+) redone (\d+) hash (\S+) "
                  r"diff (\S+) cut (-?\d+)$", re.M)


def base_env(sync):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRADWIRE_") and not k.startswith("GW_TEST_")}
    env.update(GRADWIRE_TIMEOUT="30", GW_TEST_SYNC_DIR=sync)
    return env


class ElasticPartition(unittest.TestCase):
    def trial(self, c, cut_host, port):
        survivors = [r for r in range(HOSTS) if r != cut_host]
        with tempfile.TemporaryDirectory(prefix="gw-elastic-ns-") as sync:
            argv = [WORKER, "train", "60", "20"]
            with cs.start_launcher_job(c, [1] * HOSTS, argv, env=base_env(sync), master_port=port,
                                       launcher_args=("--keep-going",)) as job:
                step10 = os.path.join(sync, f"step10-{cut_host}")
                deadline = time.monotonic() + 60
                while not os.path.exists(step10) and time.monotonic() < deadline:
                    time.sleep(0.02)  # a bounded poll of the victim's progress file
                self.assertTrue(os.path.exists(step10), job.output())
                c.partition(cut_host)
                try:
                    self.assertTrue(job.wait(bound=90), job.output())
                finally:
                    c.heal(cut_host)
                out = job.output()
        got = {int(m.group(1)): m for m in PASS.finditer(out)}
        self.assertEqual(sorted(got), survivors, out)
        members = ",".join(map(str, survivors))
        for r in survivors:
            m = got[r]
            self.assertEqual((m.group(2), m.group(3), m.group(4)), ("1", members, str(cut_host)), out)
        self.assertEqual(len({m.group(6) for m in got.values()}), 1, f"replicas differ:\n{out}")
        cuts = {int(m.group(8)) for m in got.values()}
        self.assertEqual(len(cuts), 1, out)
        self.assertTrue(10 <= cuts.pop() <= 14, f"the reference must leave the cut rank out from the cut on:\n{out}")
        self.assertRegex(out, rf"\[{cut_host}\] rank {cut_host}: EXPECTED peer_lost", out)

    def test_a_cut_host_is_left_behind_and_the_rest_train_on(self):
        with cs.emulated_cluster(HOSTS, tag="gwep") as c:
            for t, cut_host in enumerate((2, 0)):
                with self.subTest(cut_host=cut_host):
                    self.trial(c, cut_host, cs.MASTER_PORT + t)


if __name__ == "__main__":
    cs.require_namespaces()
    unittest.main(argv=[sys.argv[0]] + sys.argv[2:], verbosity=2)
