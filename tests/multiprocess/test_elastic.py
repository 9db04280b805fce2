#!/usr/bin/env python3
"""Elastic all-reduce in real processes (elastic_worker.cpp, over loopback TCP or UCX): a job that
shrinks past a lost rank and goes on, its replicas bit-identical and equal to a float64
reference over exactly the gradients the survivors summed; one that fails, naming the
lost rank, below min_replicas; and (TCP) one that grows back: the launcher restarts a
killed rank, which rejoins and takes its state from the others.

usage: test_elastic.py GRADWIRE_RUN ELASTIC_WORKER [unittest args]
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest

from mp_support import poll_until, rank_lines

LAUNCHER = WORKER = None
RANKS = 4
PASS = re.compile(r"rank (\d+): PASS view (\d+) members (\S+) lost (\S+) redone (\d+) hash ([0-9a-f]{16}) diff (\S+) "
                  r"cut (-?\d+)")


def passes(lines):
    """{rank: (view, members, lost, redone, hash, cut)} of the ranks that printed PASS."""
    out = {}
    for rank, ls in lines.items():
        for l in ls:
            m = PASS.match(l)
            if m:
                out[rank] = (int(m.group(2)), m.group(3), m.group(4), int(m.group(5)), m.group(6), int(m.group(8)))
    return out


def start(args, sync, env=None, ranks=RANKS, launcher=()):
    e = dict(os.environ, GW_TEST_SYNC_DIR=sync, GRADWIRE_TIMEOUT="30")
    e.update(env or {})
    cmd = [LAUNCHER, "-n", str(ranks), "--keep-going", *launcher, "--", WORKER, *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=e,
                            start_new_session=True)


def finish(p, bound=120):
    try:
        out, _ = p.communicate(timeout=bound)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return out, rank_lines(out)


def run(*args, env=None, ranks=RANKS, launcher=()):
    with tempfile.TemporaryDirectory(prefix="gw-elastic-") as sync:
        return finish(start(args, sync, env, ranks, launcher))


class Shrink(unittest.TestCase):
    def assert_survived(self, out, lines, victim, redone=None):
        got = passes(lines)
        survivors = [r for r in range(RANKS) if r != victim]
        self.assertEqual(sorted(got), survivors, out)
        members = ",".join(str(r) for r in survivors)
        for r in survivors:
            view, m, lost, done, _, _ = got[r]
            self.assertEqual((view, m, lost), (1, members, str(victim)), out)
            if redone is not None:
                self.assertEqual(done, redone, out)
        self.assertEqual(len({got[r][4] for r in survivors}), 1, f"replicas differ after the loss:\n{out}")

    def test_without_a_loss_every_step_sums_every_rank(self):
        out, lines = run("shrink", "-1", "5", "12")
        got = passes(lines)
        self.assertEqual(sorted(got), list(range(RANKS)), out)
        for r in range(RANKS):
            self.assertEqual(got[r][:4], (0, "0,1,2,3", "-", 0), out)
        self.assertEqual(len({v[4] for v in got.values()}), 1, out)

    def check_loss_at_step(self, victim):
        # The victim dies at the start of step 5, once the others have finished step 4: the
        # survivors, waiting in step 5, agree on view 1 and sum their step-5 gradients again.
        # The worker checks its parameters against the float64 reference itself (diff < 1e-5).
        out, lines = run("shrink", str(victim), "5", "12")
        self.assertIn(f"rank {victim}: DYING at step 5", out)
        self.assert_survived(out, lines, victim, redone=1)

    def test_loss_of_rank_0(self):
        self.check_loss_at_step(0)

    def test_loss_of_a_middle_rank(self):
        self.check_loss_at_step(2)

    def test_loss_of_the_last_rank(self):
        self.check_loss_at_step(RANKS - 1)

    def test_a_job_of_two_survives_a_kill(self):
        # One of two is no majority, but a rank whose connection closed is gone for sure: no
        # other side of a partition can go on, so the survivor does (min_replicas 1).
        out, lines = run("shrink", "1", "5", "12", ranks=2)
        self.assertIn("rank 1: DYING at step 5", out)
        if "ucx" in os.path.basename(WORKER) and os.environ.get("UCX_TLS") == "tcp":
            # UCX over TCP reports a killed peer as an endpoint timeout, which a silence looks
            # like too: not gone for sure, so one of two stops (docs/elastic.md).
            self.assertIn("rank 0: EXPECTED peer_lost: elastic: lost rank 1; 1 of view 0's 2 ranks remain, not a "
                          "strict majority, and not every rank lost is gone for sure", out)
            return
        got = passes(lines)
        self.assertEqual(sorted(got), [0], out)
        self.assertEqual(got[0][:4], (1, "0", "1", 1), out)

    def test_below_min_replicas_every_survivor_fails_naming_the_lost_rank(self):
        out, lines = run("shrink", "1", "5", "12", env={"GRADWIRE_MIN_REPLICAS": "4"})
        self.assertEqual(passes(lines), {}, out)
        # A survivor that decides later may also name the survivors that failed before it
        # (gone by then); every one names rank 1 and the rule.
        for r in (0, 2, 3):
            said = "\n".join(lines.get(r, []))
            m = re.search(rf"rank {r}: EXPECTED peer_lost: elastic: lost ((?:rank \d(?:, )?)+); (\d) of view 0's 4 ranks "
                          r"remain, fewer than min_replicas = 4", said)
            self.assertIsNotNone(m, out)
            self.assertIn("rank 1", m.group(1).split(", "), out)
            self.assertEqual(int(m.group(2)), 4 - len(m.group(1).split(", ")), out)

    def test_min_replicas_that_is_not_a_number_is_refused(self):
        out, lines = run("shrink", "-1", "5", "12", env={"GRADWIRE_MIN_REPLICAS": "three"})
        for r in range(RANKS):
            self.assertIn(f'rank {r}: FAIL GRADWIRE_MIN_REPLICAS="three": expected a positive integer',
                          "\n".join(lines.get(r, [])), out)

    def outside(self, victim, act, env=None, pace_ms=20):
        """Runs `train` (80 steps) and applies act(pid) to `victim` once it has done 10 steps."""
        with tempfile.TemporaryDirectory(prefix="gw-elastic-") as sync:
            p = start(["train", "80", str(pace_ms)], sync, env)
            try:
                pid_file = os.path.join(sync, f"pid-{victim}")
                poll_until(lambda: os.path.exists(pid_file) and os.path.getsize(pid_file) > 0, 60, "the victim's pid")
                poll_until(lambda: os.path.exists(os.path.join(sync, f"step10-{victim}")) or p.poll() is not None, 60,
                           "the victim's step 10")
                with open(pid_file) as f:
                    act(int(f.read()))
            except BaseException:
                os.killpg(p.pid, signal.SIGKILL)
                raise
            return finish(p)

    def assert_matches_a_reference(self, out, lines, victim):
        """The survivors of a loss at an unknown step: each found the step from which the
        float64 reference without the victim matches its parameters, the same one, mid-run."""
        cuts = {v[5] for r, v in passes(lines).items() if r != victim}
        self.assertEqual(len(cuts), 1, out)
        # The victim is acted on once it has finished its step 10 (it writes step10-R as step
        # 11 begins), but its last messages of step 10 may still be in its transport's
        # hands: the survivors may lose it inside step 10 and redo that step without it
        # (seen over UCX tcp under load: cut 10). So the first step without it is 10 or later.
        self.assertTrue(10 <= cuts.pop() < 80, out)

    def test_kill_9_mid_run(self):
        victim = 1
        out, lines = self.outside(victim, lambda pid: os.kill(pid, signal.SIGKILL))
        self.assertIn(f"rank {victim} was killed by SIGKILL", out)
        self.assert_survived(out, lines, victim)
        self.assert_matches_a_reference(out, lines, victim)

    def test_sigstop_past_the_stall_timeout(self):
        # A stopped process keeps its connections (its kernel answers): the survivors' waits
        # give up after GRADWIRE_STALL_TIMEOUT, and the agreement suspects the silent rank
        # after as long, and tells it so. Continued while they still train (their 70 steps
        # left, of 100 ms each, outlast the freeze), it finds itself left out and stops,
        # saying so. (Continued
        # only after they all finished and closed their connections, it would take them
        # for gone and go on alone: docs/elastic.md, "What is not decided yet".)
        victim = 2

        def freeze(pid):
            os.kill(pid, signal.SIGSTOP)
            time.sleep(6)  # past the stall timeout and the agreement's wait (2 s each)
            os.kill(pid, signal.SIGCONT)

        out, lines = self.outside(victim, freeze, env={"GRADWIRE_STALL_TIMEOUT": "2"}, pace_ms=100)
        self.assert_survived(out, lines, victim)
        self.assert_matches_a_reference(out, lines, victim)
        said = "\n".join(lines.get(victim, []))
        self.assertIn(f"rank {victim}: EXPECTED peer_lost: rank {victim} was left out of view 1: the others went on "
                      "without it", said, out)
        # Resumed, it must not take the others' stale proposals for agreement and form a view
        # that keeps everyone (which nobody else holds).
        self.assertNotRegex(said, r"keeps (\d+) of \1 ranks", out)


class Rejoin(unittest.TestCase):
    def check_rejoin(self, victim):
        # The victim dies at the start of step 5; the launcher starts it again a second later
        # (GRADWIRE_REJOIN=1); the survivors take it in at a step boundary J and hand it the
        # parameters and the step count. Every rank checks the float64 reference that leaves
        # the victim out of steps 5..J-1 (diff < 1e-5), and all four hashes are equal.
        out, lines = run("rejoin", str(victim), "5", "6", launcher=("--max-restarts", "1"))
        self.assertIn(f"rank {victim}: DYING at step 5", out)
        self.assertIn(f"rank {victim} was killed by SIGKILL; restarting it", out)
        joined = re.search(rf"rank {victim}: REJOINED at step (\d+)", out)
        self.assertIsNotNone(joined, out)
        got = passes(lines)
        self.assertEqual(sorted(got), list(range(RANKS)), out)
        for r in range(RANKS):
            view, members, _, _, _, cut = got[r]
            self.assertEqual(members, "0,1,2,3", out)
            self.assertEqual(cut, int(joined.group(1)), out)
            self.assertEqual(view, got[0][0], out)
        self.assertGreater(int(joined.group(1)), 5, out)
        self.assertEqual(len({v[4] for v in got.values()}), 1, f"replicas differ after the rejoin:\n{out}")

    def test_a_killed_middle_rank_restarted_by_the_launcher_rejoins(self):
        self.check_rejoin(2)

    def test_a_killed_last_rank_restarted_by_the_launcher_rejoins(self):
        self.check_rejoin(RANKS - 1)

    def test_two_ranks_lost_in_turn_are_each_replaced_the_second_reaching_the_first_replacement(self):
        # Rank 2 dies at step 5 and is restarted; once its replacement is in (step J1), rank 3
        # dies at J1 + 2 and is restarted too. Its replacement must link to rank 2's, which
        # listens at the address it published, or no member set ever holds its request.
        out, lines = run("rejoin", "2", "5", "6", "3", launcher=("--max-restarts", "1"))
        for victim in (2, 3):
            self.assertIn(f"rank {victim} was killed by SIGKILL; restarting it", out)
        first = re.search(r"rank 2: REJOINED at step (\d+)", out)
        second = re.search(r"rank 3: REJOINED at step (\d+)", out)
        self.assertIsNotNone(first, out)
        self.assertIsNotNone(second, out)
        self.assertIn(f"rank 3: DYING at step {int(first.group(1)) + 2}", out)
        got = passes(lines)
        self.assertEqual(sorted(got), list(range(RANKS)), out)
        for r in range(RANKS):
            self.assertEqual(got[r][1], "0,1,2,3", out)
            self.assertEqual(got[r][5], int(second.group(1)), out)
        self.assertGreater(int(second.group(1)), int(first.group(1)) + 2, out)
        self.assertEqual(len({v[4] for v in got.values()}), 1, f"replicas differ after the second rejoin:\n{out}")

    def test_a_replacement_of_rank_0_is_refused_naming_why(self):
        # Rank 0 serves the rendezvous store: a process started as its replacement says so.
        # (Every rank is started as a replacement here; the others find no store and time out.)
        out, lines = run("shrink", "-1", "5", "12", env={"GRADWIRE_REJOIN": "1", "GRADWIRE_TIMEOUT": "3"})
        self.assertIn("rank 0 cannot rejoin a job (GRADWIRE_REJOIN=1): it serves the rendezvous store",
                      "\n".join(lines.get(0, [])), out)


class Abandon(unittest.TestCase):
    ABANDON = re.compile(r"rank (\d+): PASS abandon (received|abandoned|-) lost (\S+)$")

    def test_a_receive_dropped_mid_message_cuts_off_the_tolerated_sender_not_the_rank(self):
        # The elastic all-reduce drops a step's receives when its view changes; one from a
        # lost rank may be half through. The sender (the last of 3) stops itself mid-message;
        # rank 1 times out on the receive, which withdraws it. Over TCP (asio_tcp, UCX on
        # TCP) the bytes were half through: the sender must be cut off at once, and ranks 0
        # and 1 go on. (UCX on shared memory reads the stopped process's memory with CMA:
        # the receive may complete instead.)
        out, lines = run("abandon", ranks=3)
        got = {}
        for rank, ls in lines.items():
            for l in ls:
                m = self.ABANDON.match(l)
                if m:
                    got[rank] = (m.group(2), m.group(3))
        self.assertEqual(sorted(got), [0, 1], out)
        self.assertEqual(got[0], ("-", "-"), out)
        over_tcp = "ucx" not in os.path.basename(WORKER) or os.environ.get("UCX_TLS") == "tcp"
        if over_tcp:
            # Dropped mid-message, the sender is cut off. The message may also have arrived
            # whole before the sender stopped: its 5 ms of progress are a deadline between
            # progress calls, and with rank 1 reading along one call of UCX on TCP once moved
            # all 64 MiB (a CI run on a loaded machine). Nothing was dropped then, and nobody
            # is cut off.
            self.assertIn(got[1], (("abandoned", "2"), ("received", "-")), out)


if __name__ == "__main__":
    LAUNCHER, WORKER = sys.argv[1], sys.argv[2]
    unittest.main(argv=[sys.argv[0]] + sys.argv[3:], verbosity=2)
