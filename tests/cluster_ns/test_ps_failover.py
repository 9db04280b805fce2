#!/usr/bin/env python3
"""Parameter-server failover across emulated hosts: a server's host is cut off mid-run (its link
down: no FIN or RST ever arrives), and with the default heartbeat settings its workers and its
standby notice within 10 s, the standby takes the shard over and training ends with the same
parameters, bit for bit, as an uninterrupted run on the same hosts.

    test_ps_failover.py PS_WORKER [unittest args]

Hosts: 0 the two workers, 1 and 2 one server each, 3 their standbys (ps::sync, 2 workers: a
step's sum is the same in either order). Needs root and `ip netns`; otherwise exits 77 (skipped).

And the failover the workers refuse: a standby cut off from its server alone (`cluster cut`,
ps::async) falls more than ps::options::standby_lag updates behind while the server goes on;
when the server then dies, its workers fail with that reason instead of rolling back.
"""
import os
import re
import signal
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

    def test_an_async_standby_cut_off_from_its_server_earlier_is_refused_at_failover(self):
        # Hosts: 0 the workers, 1 server 2, 2 server 3, 3 standby 4, 4 standby 5. Only server 2 and
        # its standby lose touch: the server goes on alone (it says so), the standby takes the
        # shard over with the updates it had. When server 2 then dies, the workers must not fail
        # over to a standby that far behind (training on it would roll back what they pushed).
        with cs.emulated_cluster(5, tag="gwpsl") as c:
            argv = [WORKER, "failover", "async", "-1", "none", "100000"]  # paced 10 ms: ended by the test
            with cs.start_launcher_job(c, [2, 1, 1, 1, 1], argv, env=dict(base_env(), GRADWIRE_NUM_PS="4"),
                                       launcher_args=("--keep-going",)) as job:
                self.assertIsNotNone(job.wait_for(r"rank [01]: training", bound=60, count=2), job.output())
                time.sleep(1.0)
                c.cut(1, 3)
                try:
                    self.assertIsNotNone(job.wait_for(r"^\[2\] .*lost its standby rank 4", bound=BOUND_S + 5),
                                         job.output())
                    time.sleep(2.0)  # server 2 applies updates alone: hundreds, far more than standby_lag (4)
                    server = job.procs[1]  # host 1's gradwire-run and rank 2 below it
                    for pid in [server.pid] + cs.descendants([server.pid]):
                        os.kill(pid, signal.SIGKILL)
                    refusals = job.wait_for(r"^\[[01]\] rank [01]: FAIL errc=peer_lost: .*standby rank 4 has (\d+) "
                                            r"updates, its lost server had (\d+) .*cut off from its server earlier",
                                            bound=60, count=2)
                finally:
                    c.mend(1, 3)
                out = job.output()
                self.assertIsNotNone(refusals, out)
                print(f"refusals (standby's updates, its lost server's): {refusals}", flush=True)
                for had, lost_server_had in refusals:
                    self.assertGreater(int(lost_server_had) - int(had), 4, out)  # more than standby_lag apart
                self.assertFalse(job.passed_ranks() & {0, 1}, out)


if __name__ == "__main__":
    cs.require_namespaces()
    unittest.main(argv=[sys.argv[0]] + sys.argv[2:], verbosity=2)
