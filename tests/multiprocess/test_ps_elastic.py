#!/usr/bin/env python3
"""Elastic workers of an asynchronous parameter server over TCP: killed, frozen and replaced.

    test_ps_elastic.py PS_WORKER FASHION_MNIST DATA_DIR [unittest args]

A worker's replacement is a process started with the same rank and GRADWIRE_REJOIN=1:
the servers take it back, it pulls the current parameters and pushes on. Every case
bounds its own time; ranks are started one by one (elastic_job.py), not by gradwire-run.
"""
import os
import random
import re
import sys
import time
import unittest

from elastic_job import ElasticJob

PS_WORKER, FASHION_MNIST, DATA = sys.argv[1], sys.argv[2], sys.argv[3]


def stats(job, rank):
    for line in job.current(rank).lines:
        if "STATS" in line:
            return dict(kv.split("=", 1) for kv in line.split("STATS", 1)[1].split())
    return {}


def wait_until(predicate, timeout, step=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return False


class ElasticWorkers(unittest.TestCase):
    def test_a_killed_worker_is_replaced_and_taken_back(self):
        job = ElasticJob([PS_WORKER, "rejoin", "2"], workers=3, servers=2, env={"GRADWIRE_TIMEOUT": "60"})
        job.start()
        try:
            self.assertTrue(wait_until(lambda: not job.alive(2), 60), "worker 2 never killed itself")
            job.replace(2)
            self.assertTrue(job.wait(90), "the job did not finish:\n" + job.output())
        finally:
            job.stop()
        out = job.output()
        self.assertEqual(job.incarnations[2][0].proc.returncode, -9, out)
        for r in range(job.size):
            self.assertEqual(job.current(r).proc.returncode, 0, out)
            self.assertIn("PASS", job.current(r).text(), out)
        for s in (3, 4):
            self.assertEqual(stats(job, s)["lost"], "2", out)
            self.assertEqual(stats(job, s)["rejoined"], "2", out)
        # The replacement pushed (it took part), from the servers' current parameters.
        pushes = int(re.search(r"PASS pushes=(\d+)", job.current(2).text()).group(1))
        self.assertGreater(pushes, 0, out)

    def test_replacements_that_cannot_rejoin_are_refused_and_the_job_goes_on(self):
        # Worker 1 kills itself at its 10th step (25 ms a step); then two bad replacements and a good one.
        job = ElasticJob([PS_WORKER, "rejoin", "1"], workers=3, servers=1, env={"GRADWIRE_TIMEOUT": "60"})
        job.start()
        try:
            # Once worker 1 is dead the job has long been set up (the server takes workers
            # back only from then on) and worker 2 is alive (it trains until the end).
            self.assertTrue(wait_until(lambda: not job.alive(1), 60), "worker 1 never killed itself")
            job.replace(0)  # rank 0 serves the store: it cannot rejoin
            job.replace(2)  # worker 2 is alive: the server refuses a second process as rank 2
            job.replace(1)
            self.assertTrue(job.wait(90), "the job did not finish:\n" + job.output())
        finally:
            job.stop()
        out = job.output()
        for rank, why in ((0, "rank 0 cannot rejoin a job"), (2, "rank 2 is still connected to rank 3")):
            refused = job.incarnations[rank][1]
            self.assertEqual(refused.proc.returncode, 1, out)
            self.assertIn(why, refused.text(), out)
            self.assertEqual(job.incarnations[rank][0].proc.returncode, 0, out)
            self.assertIn("PASS", job.incarnations[rank][0].text(), out)
        self.assertEqual(job.current(1).proc.returncode, 0, out)
        self.assertEqual(stats(job, 3)["rejoined"], "1", out)


class Chaos(unittest.TestCase):
    """Fashion-MNIST, 4 async workers and 2 servers: workers killed and replaced at random times, one
    frozen for a while; the run still reaches 88% test accuracy and the servers count every loss and
    rejoin."""

    def test_fashion_mnist_reaches_88_percent_through_kills_restarts_and_a_freeze(self):
        seed = int(os.environ.get("GRADWIRE_CHAOS_SEED", "7"))
        rng = random.Random(seed)
        epochs = int(os.environ.get("GRADWIRE_CHAOS_EPOCHS", "8"))
        job = ElasticJob([FASHION_MNIST, "--strategy", "parameter_server", "--ps-mode", "async", "--transport", "tcp",
                          "--epochs", str(epochs), "--data", DATA],
                         workers=4, servers=2, env={"GRADWIRE_TIMEOUT": "120"})
        # What happens after the chief reports epoch k, at a seeded moment within the next
        # epoch: kill -9 and replace, a freeze, and a worker killed a second time.
        victims = rng.sample([1, 2, 3], 3)
        plan = {1: ("kill", victims[0]), 2: ("freeze", victims[1]), 3: ("kill", victims[2]), 4: ("kill", victims[0])}
        kills = 0

        def epochs_done():
            return len([l for l in job.current(0).lines if re.match(r"epoch\s+\d+/", l)])

        job.start()
        try:
            for epoch, (what, victim) in sorted(plan.items()):
                self.assertTrue(wait_until(lambda: epochs_done() >= epoch or not job.alive(0), 300), job.output())
                self.assertTrue(job.alive(0), "the run ended before the chaos did:\n" + job.output())
                time.sleep(rng.uniform(0.0, 0.5))
                if what == "freeze":
                    job.freeze(victim, rng.uniform(1.5, 3.0))
                    continue
                job.kill(victim)
                kills += 1
                time.sleep(rng.uniform(0.1, 0.5))
                job.replace(victim)
            self.assertTrue(job.wait(600), "the job did not finish:\n" + job.output())
        finally:
            job.stop()
        out = job.output() + "\nevents: " + repr(job.events)
        print(out)
        for r in range(job.size):
            self.assertEqual(job.current(r).proc.returncode, 0, out)
        chief = job.current(0).text()
        accuracies = [float(a) for a in re.findall(r"test_acc\s+([\d.]+)%", chief)]
        self.assertEqual(len(accuracies), epochs, out)
        self.assertGreaterEqual(accuracies[-1], 88.0, out)  # the final model
        for s in (4, 5):
            line = next(l for l in job.current(s).lines if l.startswith("ps rank"))
            lost = int(re.search(r"lost_workers (\d+)", line).group(1))
            rejoined = int(re.search(r"rejoined_workers (\d+)", line).group(1))
            self.assertEqual((lost, rejoined), (kills, kills), out)
            # Every gradient that arrived was applied, through the losses (a worker killed
            # mid-push sent none).
            gradients, applied, dropped = (int(re.search(rf"{k} (\d+)", line).group(1))
                                           for k in ("gradients", "applied", "dropped"))
            self.assertEqual(applied + dropped, gradients, out)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + sys.argv[4:], verbosity=2)
