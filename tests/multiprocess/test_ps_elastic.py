#!/usr/bin/env python3
"""Elastic workers of an asynchronous parameter server over TCP: killed, frozen and replaced.

    test_ps_elastic.py PS_WORKER FASHION_MNIST DATA_DIR [unittest args]

A worker's replacement is a process started with the same rank and GRADWIRE_REJOIN=1:
the servers take it back, it pulls the current parameters and pushes on. Every case
bounds its own time; ranks are started one by one (elastic_job.py), not by gradwire-run.
Classes: ElasticWorkers and Chaos (one ctest test), WorkerLostMidPush (another: it needs no
Fashion-MNIST).
"""
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import unittest

from elastic_job import ElasticJob

PS_WORKER, FASHION_MNIST, DATA = sys.argv[1], sys.argv[2], sys.argv[3]


def stats(job, rank):
    """The STATS line of the rank's latest incarnation that printed one (a refused replacement prints none)."""
    for inc in reversed(job.incarnations[rank]):
        for line in inc.lines:
            if "STATS" in line:
                return dict(kv.split("=", 1) for kv in line.split("STATS", 1)[1].split())
    return {}


def counts(text):
    return [int(x) for x in text.split(",") if x]


def assert_replaced_and_taken_back(test, job, victim):
    """Checks that `victim`'s first incarnation died by SIGKILL, every rank's current one passed,
    and every server lost it once and took its replacement back; returns the replacement's pushes."""
    out = job.output()
    test.assertEqual(job.incarnations[victim][0].proc.returncode, -9, out)
    for r in range(job.size):
        test.assertEqual(job.current(r).proc.returncode, 0, out)
        test.assertIn("PASS", job.current(r).text(), out)
    for s in range(job.workers, job.size):
        test.assertEqual(stats(job, s)["lost"], str(victim), out)
        test.assertEqual(stats(job, s)["rejoined"], str(victim), out)
    return int(re.search(r"PASS pushes=(\d+)", job.current(victim).text()).group(1))


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
        pushes = assert_replaced_and_taken_back(self, job, 2)
        # The replacement pushed (it took part), from the servers' current parameters.
        self.assertGreater(pushes, 0, job.output())

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
            job.replace(3)  # the server: only a worker of an asynchronous parameter server can rejoin
            job.replace(1)
            self.assertTrue(job.wait(90), "the job did not finish:\n" + job.output())
        finally:
            job.stop()
        out = job.output()
        for rank, kind, why in (
                (0, "config",
                 "asio_tcp: rank 0 cannot rejoin a job (GRADWIRE_REJOIN=1): it serves the rendezvous store"),
                (2, "peer_lost", "rank 2 is still connected to rank 3: are two processes running as rank 2?"),
                (3, "config", "parameter_server: rank 3 joined as a replacement (GRADWIRE_REJOIN=1), but only a worker "
                              "of an asynchronous parameter server (async, bounded staleness) can rejoin")):
            refused = job.incarnations[rank][1]
            self.assertEqual(refused.proc.returncode, 1, out)
            self.assertIn(f"FAIL errc={kind}: ", refused.text(), out)
            self.assertIn(why, refused.text(), out)
            self.assertEqual(job.incarnations[rank][0].proc.returncode, 0, out)
            self.assertIn("PASS", job.incarnations[rank][0].text(), out)
        self.assertEqual(job.current(1).proc.returncode, 0, out)
        self.assertEqual(stats(job, 3)["rejoined"], "1", out)

    def finish_replacement(self, job, inc, timeout=30):
        """Waits for a replacement that must fail; returns its output."""
        try:
            inc.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.fail(f"the replacement of rank {inc.rank} did not end within {timeout} s:\n" + job.output())
        inc.reader.join(5)
        self.assertEqual(inc.proc.returncode, 1, job.output())
        return inc.text()

    def test_a_replacement_in_a_sync_job_or_of_a_server_is_a_config_error(self):
        # Sync, 3 workers + 1 server: worker 1 kills itself at step 5, which fails every rank;
        # rank 0 holds (its rendezvous store serving) until released, so that the replacements
        # join and reach the parameter server's setup, which refuses them: a sync-mode worker,
        # and the server.
        with tempfile.TemporaryDirectory(prefix="gw-ps-sync-") as sync:
            job = ElasticJob([PS_WORKER, "sync-rejoin", "1"], workers=3, servers=1,
                             env={"GRADWIRE_TIMEOUT": "20", "GW_TEST_SYNC_DIR": sync})
            job.start()
            try:
                self.assertTrue(wait_until(lambda: not job.alive(1), 30),
                                "worker 1 never killed itself:\n" + job.output())
                self.assertTrue(wait_until(lambda: "HOLDING" in job.current(0).text(), 30), job.output())
                # Both at once: each waits out the peers that do not answer its hello (rank 0,
                # held outside any transport call, for prompt_reply_timeout: 10 s).
                replacements = job.replace(1), job.replace(3)
                worker, server = (self.finish_replacement(job, inc) for inc in replacements)
                with open(os.path.join(sync, "release"), "w"):
                    pass
                self.assertTrue(job.wait(30), "the job did not end:\n" + job.output())
            finally:
                job.stop()
            out = job.output()
        self.assertEqual(job.incarnations[1][0].proc.returncode, -9, out)
        for r in (0, 2, 3):  # the loss of a sync worker: peer_lost on every rank, naming it
            first = job.incarnations[r][0].text()
            self.assertIn(f"rank {r}: EXPECTED peer lost: ", first, out)
            self.assertIn(f"rank {r}: lost rank 1: its connection closed", first, out)
        for rank, text in ((1, worker), (3, server)):
            self.assertIn(f"rank {rank}: FAIL errc=config: parameter_server: rank {rank} joined as a replacement "
                          "(GRADWIRE_REJOIN=1), but only a worker of an asynchronous parameter server (async, bounded "
                          "staleness) can rejoin a running job; restart the whole job instead", text, out)

    def test_a_replacement_of_a_worker_that_said_goodbye_is_refused_and_the_job_goes_on(self):
        # Async, 3 workers + 1 server: worker 2 finishes normally after 5 steps (its strategy
        # tells the servers, its transport says goodbye); the others train until released.
        with tempfile.TemporaryDirectory(prefix="gw-ps-sync-") as sync:
            job = ElasticJob([PS_WORKER, "finish-early", "2"], workers=3, servers=1,
                             env={"GRADWIRE_TIMEOUT": "20", "GW_TEST_SYNC_DIR": sync})
            job.start()
            try:
                self.assertTrue(wait_until(lambda: not job.alive(2), 30), "worker 2 never finished:\n" + job.output())
                self.assertEqual(job.incarnations[2][0].proc.returncode, 0, job.output())
                self.assertTrue(job.alive(0) and job.alive(3), "the job ended early:\n" + job.output())
                text = self.finish_replacement(job, job.replace(2))
                self.assertTrue(job.alive(3), "the server ended before the replacement was refused:\n" + job.output())
                with open(os.path.join(sync, "release"), "w"):
                    pass
                self.assertTrue(job.wait(30), "the job did not finish:\n" + job.output())
            finally:
                job.stop()
            out = job.output()
        self.assertIn("rank 2: FAIL errc=peer_lost: parameter_server: this replacement of worker rank 2 could not "
                      "rejoin the running job (the job goes on without it)", text, out)
        self.assertIn("is not linked to rank 3: rank 3 refused this rank's connection: "
                      "rank 2 has finished (it said goodbye): it cannot rejoin", text, out)
        # The refusal carries the reason alone: its kind is said once, by this rank's error.
        self.assertNotIn("configuration error: configuration error", text, out)
        for r in (0, 1, 3):
            self.assertEqual(job.current(r).proc.returncode, 0, out)
            self.assertIn("PASS", job.current(r).text(), out)
        self.assertEqual((stats(job, 3)["lost"], stats(job, 3)["rejoined"]), ("", ""), out)

    def test_a_replacement_after_the_servers_finished_names_them_then_the_store(self):
        # Async, 3 workers + 1 server: worker 1 kills itself at step 5, the others train 30
        # steps; rank 0 then tells the server it finished and holds (its store serving) until
        # released. A replacement of worker 1 after the server has exited: peer_lost naming the
        # server. After rank 0 has exited too: timeout naming the store (GRADWIRE_TIMEOUT=2).
        with tempfile.TemporaryDirectory(prefix="gw-ps-sync-") as sync:
            job = ElasticJob([PS_WORKER, "servers-finish", "1"], workers=3, servers=1,
                             env={"GRADWIRE_TIMEOUT": "20", "GW_TEST_SYNC_DIR": sync})
            job.start()
            try:
                self.assertTrue(wait_until(lambda: not job.alive(3), 60), "the server never finished:\n" + job.output())
                self.assertTrue(wait_until(lambda: "HOLDING" in job.current(0).text(), 30), job.output())
                late = self.finish_replacement(job, job.replace(1))
                with open(os.path.join(sync, "release"), "w"):
                    pass
                self.assertTrue(wait_until(lambda: not job.alive(0), 30), "rank 0 did not end:\n" + job.output())
                start = time.monotonic()
                later = self.finish_replacement(job, job.replace(1, env={"GRADWIRE_TIMEOUT": "2"}))
                waited = time.monotonic() - start
                self.assertTrue(job.wait(30), "the job did not end:\n" + job.output())
            finally:
                job.stop()
            out = job.output()
        self.assertEqual(job.incarnations[1][0].proc.returncode, -9, out)
        for r in (0, 2, 3):
            self.assertEqual(job.incarnations[r][0].proc.returncode, 0, out)
            self.assertIn("PASS", job.incarnations[r][0].text(), out)
        self.assertIn("rank 1: FAIL errc=peer_lost: parameter_server: this replacement of worker rank 1 could not "
                      "rejoin the running job (the job goes on without it)", late, out)
        self.assertIn("rank 1 (a replacement process, GRADWIRE_REJOIN=1) is not linked to rank 3: "
                      "nobody answers at its address; it has finished or is gone", late, out)
        store = f"127.0.0.1:{job.base['MASTER_PORT']}"
        self.assertIn("rank 1: FAIL errc=timeout: ", later, out)
        self.assertIn(f"nobody listened at {store} (the rendezvous store (MASTER_ADDR:MASTER_PORT))", later, out)
        self.assertGreater(waited, 1, out)  # it waited (most of) its GRADWIRE_TIMEOUT out ...
        self.assertLess(waited, 15, out)         # ... not the job's 20 s


class Chaos(unittest.TestCase):
    """Fashion-MNIST, 4 async workers and 2 servers: workers killed and replaced at random times, one
    frozen for a while; the run still reaches 88% test accuracy and the servers count every loss and
    rejoin."""

    def test_fashion_mnist_reaches_88_percent_through_kills_restarts_and_a_freeze(self):
        seed = int(os.environ.get("GRADWIRE_CHAOS_SEED", "7"))
        rng = random.Random(seed)
        # 12: the last replacement (after epoch 4) must find the servers still serving; at 8,
        # on a quick machine (0.6 s an epoch), the job ended before it could rejoin.
        epochs = int(os.environ.get("GRADWIRE_CHAOS_EPOCHS", "12"))
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


class WorkerLostMidPush(unittest.TestCase):
    """Its own ctest test: it needs neither Fashion-MNIST nor the examples (FASHION_MNIST and DATA_DIR unused)."""

    def test_a_worker_lost_while_a_server_takes_its_push_is_dropped_then_taken_back(self):
        # Each server holds right after worker 2's 10th gradient (ps_worker rejoin-mid-push) until
        # its transport has seen worker 2 die: the server learns of the loss between taking the
        # push and asking for the worker's next request. It must drop the worker there (and take
        # its replacement back), not wait on for a request the dead process will never send.
        job = ElasticJob([PS_WORKER, "rejoin-mid-push", "2"], workers=3, servers=2, env={"GRADWIRE_TIMEOUT": "60"})
        job.start()
        try:
            holding = lambda: sum("HOLDING after worker 2's gradient 10" in job.current(s).text() for s in (3, 4))
            self.assertTrue(wait_until(lambda: holding() == 2, 60), "the servers never held:\n" + job.output())
            job.kill(2)
            self.assertTrue(wait_until(lambda: all("HELD until its transport lost worker 2" in job.current(s).text()
                                                   for s in (3, 4)), 30), job.output())
            job.replace(2)
            self.assertTrue(job.wait(90), "the job did not finish:\n" + job.output())
        finally:
            job.stop()
        replacement = assert_replaced_and_taken_back(self, job, 2)
        for s in (3, 4):  # the held push was received: the first incarnation's 10 and the replacement's
            self.assertEqual(counts(stats(job, s)["pushes"])[2], 10 + replacement, job.output())


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + sys.argv[4:], verbosity=2)
