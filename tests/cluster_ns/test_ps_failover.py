#!/usr/bin/env python3
"""Parameter-server failover across emulated hosts: a server's host is cut off mid-run (its link
down: no FIN or RST ever arrives), and with the default heartbeat settings its workers and its
standby notice within 10 s, the standby takes the shard over and training ends with the same
parameters, bit for bit, as an uninterrupted run on the same hosts.

    test_ps_failover.py PS_WORKER [unittest args]

Hosts: 0 the two workers, 1 and 2 one server each, 3 their standbys (ps::sync, 2 workers: a
step's sum is the same in either order). Needs root and `ip netns`; otherwise exits 77 (skipped).
"""
import os
import re
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_support as cs  # noqa: E402

WORKER = sys.argv[1]
BOUND_S = 10.0  # detection within the heartbeat time (about 6.5 s by default), as for all-reduce
PER_HOST = [2, 1, 1, 2]
STEPS = "400"  # 10 ms each: the cut lands mid-run
_FAILOVER = re.compile(r"^\[([01])\] .*server rank 2 was lost .*fails over to standby rank 4", re.M)


def base_env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRADWIRE_") and not k.startswith("GW_TEST_")}
    env["GRADWIRE_TIMEOUT"] = "60"
    return env


def params(job):
    found = re.findall(r"^\[([01])\] rank \d: PASS .*params=(\w+)", job.output(), re.M)
    return dict((int(r), h) for r, h in found)


class Failover(unittest.TestCase):
    def run_job(self, c, port, cut):
        argv = [WORKER, "failover", "sync", "-1", "none", STEPS]
        # Across nodes the servers are the last ranks, named by GRADWIRE_NUM_PS on every node.
        with cs.start_launcher_job(c, PER_HOST, argv, env=dict(base_env(), GRADWIRE_NUM_PS="4"), master_port=port,
                                   launcher_args=("--keep-going",)) as job:
            self.assertIsNotNone(job.wait_for(r"rank [01]: training", bound=60, count=2), job.output())
            took = None
            if cut:
                time.sleep(1.0)
                cut_at = time.monotonic()
                c.partition(1)
                try:
                    found = job.wait_for(_FAILOVER.pattern, bound=BOUND_S + 5, count=2)
                    took = time.monotonic() - cut_at
                    self.assertIsNotNone(found, f"the workers did not fail over within {BOUND_S + 5} s:\n{job.output()}")
                    self.assertTrue(job.wait(bound=120), job.output())
                finally:
                    c.heal(1)
            else:
                self.assertTrue(job.wait(bound=120), job.output())
            out = job.output()
            codes = job.returncodes
            for h in (0, 2, 3):  # the cut-off server fails on its own; every other host passes
                self.assertEqual(codes[h], 0, f"host {h}:\n{out}")
            return params(job), out, took

    def test_a_cut_off_server_fails_over_within_the_heartbeat_time_and_ends_bit_identical(self):
        with cs.emulated_cluster(len(PER_HOST), tag="gwpsf") as c:
            reference, out, _ = self.run_job(c, cs.MASTER_PORT, cut=False)
            self.assertEqual(len(set(reference.values())), 1, out)
            got, out, took = self.run_job(c, cs.MASTER_PORT + 1, cut=True)
            print(f"failover: the workers switched to the standby {took:.2f} s after the cut", flush=True)
            self.assertLess(took, BOUND_S, out)
            self.assertEqual(got, reference, out)
            self.assertRegex(out, r"\[4\] rank 4: STATS .*role=standby promoted=1", out)


if __name__ == "__main__":
    cs.require_namespaces()
    unittest.main(argv=[sys.argv[0]] + sys.argv[2:], verbosity=2)
