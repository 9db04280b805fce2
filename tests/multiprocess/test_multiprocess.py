#!/usr/bin/env python3
"""Multi-process tests: real ranks on loopback TCP, started by scripts/gradwire-run.

    test_multiprocess.py LAUNCHER WORKER [unittest args]   e.g. -k kill

Every case bounds its own time: a hang fails the test instead of stalling CI.
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

from mp_support import rank_lines

LAUNCHER, WORKER = sys.argv[1], sys.argv[2]
# The deadline for joining a job in the failure cases: short, so that they finish fast.
JOIN_TIMEOUT_S = 5


def run(ranks, *args, keep_going=False, extra=(), env=None, bound=120):
    """Runs WORKER on `ranks` ranks; returns (exit status, {rank: [lines]}, seconds)."""
    cmd = [LAUNCHER] + ([] if "--nproc-per-node" in extra else ["-n", str(ranks)]) + [*extra]
    cmd += (["--keep-going"] if keep_going else []) + ["--", WORKER, *args]
    e = dict(os.environ, **dict({"GRADWIRE_TIMEOUT": str(JOIN_TIMEOUT_S)}, **(env or {})))
    start = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=bound, env=e)
    took = time.monotonic() - start
    lines = rank_lines(p.stdout)
    return p.returncode, lines, took, p.stdout


class Correctness(unittest.TestCase):
    def check_pass(self, ranks, *args):
        status, lines, _, out = run(ranks, *args)
        self.assertEqual(status, 0, out)
        for r in range(ranks):
            self.assertTrue(any("PASS" in l for l in lines.get(r, [])), f"rank {r} did not pass:\n{out}")

    def test_collectives_against_float64_reference(self):
        for n in (2, 3, 4):
            with self.subTest(ranks=n):
                self.check_pass(n, "collectives")

    def test_bucketing_of_50_mixed_tensors(self):
        for n in (2, 3):
            with self.subTest(ranks=n):
                self.check_pass(n, "bucketing")

    def test_async_all_reduces_in_flight(self):
        self.check_pass(3, "async")

    def test_point_to_point_out_of_order_and_size_mismatch(self):
        self.check_pass(2, "point-to-point")

    @unittest.skipUnless("ucx" in os.path.basename(WORKER), "one-sided access is a UCX transport capability")
    def test_one_sided_put_and_get(self):
        for n in (2, 3):
            with self.subTest(ranks=n):
                self.check_pass(n, "one-sided")

    def test_multi_worker_mirrored_equals_one_device_large_batch(self):
        for n, opt in ((2, "sgd"), (3, "momentum"), (4, "adam"), (3, "central-momentum"), (3, "local-sgd")):
            with self.subTest(ranks=n, optimizer=opt):
                self.check_pass(n, "train", opt)


class Failures(unittest.TestCase):
    def expect(self, lines, rank, kind, *names):
        got = " ".join(lines.get(rank, []))
        self.assertIn(f"EXPECTED {kind}", got, f"rank {rank}: {got}")
        for n in names:
            self.assertIn(n, got, f"rank {rank}: {got}")

    def test_killed_rank_is_reported_by_every_survivor(self):
        for n, victim in ((2, 1), (4, 2)):
            with self.subTest(ranks=n, victim=victim):
                status, lines, took, out = run(n, "kill", str(victim), keep_going=True, bound=60)
                self.assertNotEqual(status, 0)  # the victim died by SIGKILL
                for r in range(n):
                    if r != victim:
                        self.expect(lines, r, "peer lost", f"lost rank {victim}")
                self.assertLess(took, 30, "survivors must fail at once, not at their deadline")

    def test_mismatched_collectives_name_both_ranks_and_values(self):
        cases = {"count": ("count=1001", "count=1000"), "dtype": ("f64", "f32"), "op": ("broadcast", "all_reduce")}
        for kind, values in cases.items():
            with self.subTest(kind=kind):
                status, lines, took, out = run(4, "mismatch", kind, keep_going=True, bound=60)
                self.assertEqual(status, 0, out)
                for r in range(4):
                    self.expect(lines, r, "mismatch", "rank 1", *values)
                self.assertLess(took, 30)

    def test_a_send_in_flight_when_its_rank_fails_ends_with_the_failure(self):
        # mp_worker's fail-sending: rank 0 fails while 64 MiB wait for a receive rank 1 never
        # posts; the send ends with rank 0's own failure, and rank 0 frees the buffer and the
        # request and tears the transport down without a fault (under ASan: no touch of either).
        status, lines, took, out = run(2, "fail-sending", keep_going=True, bound=90)
        self.assertEqual(status, 0, out)
        self.expect(lines, 0, "mismatch", "rank 0 failed with a send in flight")
        self.assertIn("EXPECTED", " ".join(lines.get(1, [])), out)  # its next wait fails
        for r in (0, 1):
            self.assertIn(f"rank {r}: PASS fail-sending", "\n".join(lines.get(r, [])), out)
        if "ucx" in os.path.basename(WORKER) and os.environ.get("UCX_TLS") == "tcp":
            # The failure closed the endpoints, so UCX let go of the send: no request is left
            # in it when the transport goes. (Over shared memory UCX 1.13 keeps a rendezvous
            # send whose receiver never came even past a forced close, and says so at exit.)
            self.assertNotIn("was not returned to mpool", out)

    def test_aborting_rank_waits_until_a_busy_peer_heard_why(self):
        # Rank 0 stays out of the transport until rank 1 has begun to abort ("answers") or
        # until rank 1's abort has returned ("silent"); see mp_worker's abort_heard. Either
        # way rank 0 learns rank 1's reason, not only that it left. UCX's aborting rank waits
        # for its peers' answers, at most a second (docs/transports.md): with a peer that
        # answers, it returns after that peer began listening and well within the second;
        # with a silent one, it gives up after the second. (Times: one monotonic clock.)
        ucx = "ucx" in os.path.basename(WORKER)
        for how in ("answers", "silent"):
            with self.subTest(peer=how):
                status, lines, took, out = run(2, "abort-heard", how, keep_going=True, bound=60)
                self.assertEqual(status, 0, out)
                self.expect(lines, 0, "mismatch", "rank 0: rank 1 failed: a reason only rank 1 knows")
                m = re.search(r"abort began at ([0-9.]+), returned at ([0-9.]+), took ([0-9.]+) s",
                              " ".join(lines.get(1, [])))
                self.assertIsNotNone(m, out)
                returned, abort_took = float(m.group(2)), float(m.group(3))
                listening = float(re.search(r"listening at ([0-9.]+)", " ".join(lines.get(0, []))).group(1))
                if how == "silent":
                    self.assertGreaterEqual(listening, returned, out)  # nobody listened while it aborted
                if not ucx:
                    continue
                if how == "answers":
                    self.assertGreaterEqual(returned, listening, f"the abort returned before rank 0 answered:\n{out}")
                    self.assertLess(abort_took, 0.9, f"the abort did not return on rank 0's answer:\n{out}")
                else:
                    self.assertGreaterEqual(abort_took, 0.95, f"the abort gave up before its second:\n{out}")
                    self.assertLess(abort_took, 1.5, f"the abort waited more than its second:\n{out}")

    def test_ranks_that_abort_at_once_each_return_on_the_others_answer(self):
        # Ranks 0 and 1 fail at the same moment and stay alive until both aborts returned
        # (mp_worker's abort-heard both). Each is aborting, so it answers the other's abort
        # without failing again; UCX's abort must return on that answer, well within its
        # second, not wait for an endpoint that closes only after the other's abort returned.
        ucx = "ucx" in os.path.basename(WORKER)
        status, lines, took, out = run(2, "abort-heard", "both", keep_going=True, bound=60)
        self.assertEqual(status, 0, out)
        for r in (0, 1):
            m = re.search(r"abort began at ([0-9.]+), returned at ([0-9.]+), took ([0-9.]+) s",
                          " ".join(lines.get(r, [])))
            self.assertIsNotNone(m, f"rank {r} did not report its abort:\n{out}")
            self.assertLess(float(m.group(3)), 0.9 if ucx else 5, f"rank {r}'s abort waited:\n{out}")
        self.assertLess(took, 30)

    def test_receive_deadline_is_a_timeout_naming_peer_tag_and_size(self):
        # Each rank waits, with a 0.5 s deadline, for a message the next rank never sends.
        ranks = 3
        status, lines, took, out = run(ranks, "timeout", bound=60)
        self.assertEqual(status, 0, out)
        for r in range(ranks):
            peer = (r + 1) % ranks
            self.expect(lines, r, "timeout", f"rank {r}: receive from rank {peer} (tag 4242, 12345 bytes) did not "
                                             "complete before its deadline (is a rank missing or behind?)")
            # At its deadline, not before and not much after (mp_worker checks 0.5 <= s <= 10).
            after = re.search(r"PASS timeout after ([0-9.]+) s", " ".join(lines.get(r, [])))
            self.assertIsNotNone(after, out)
            self.assertGreaterEqual(float(after.group(1)), 0.5, out)
            self.assertLess(float(after.group(1)), 5, out)
        self.assertLess(took, 30, out)

    def test_rank_that_never_starts_is_named_at_the_join_deadline(self):
        # Ranks 0-2 of 4 start (node 0 of 2 nodes); node 1, rank 3, never does. Rank 0 serves
        # the rendezvous store and gives up at its deadline, naming rank 3 and what to check.
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        timeout_s = 2
        extra = ["--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "3,1", "--master-port", str(port)]
        env = {"GRADWIRE_TIMEOUT": str(timeout_s), "GRADWIRE_JOB_TOKEN": "absent-rank-test"}
        status, lines, took, out = run(3, "absent", "3", keep_going=True, extra=extra, bound=60, env=env)
        self.assertEqual(status, 0, out)
        got = " ".join(lines.get(0, []))
        self.assertIn("EXPECTED timeout", got, out)
        # (TCP: "rank 3 did not connect within MS ms (it never published its host identity)";
        # UCX: "rank 3 did not connect (publish its UCX address) within MS ms"; then the hint.)
        m = re.search(r"rank 0: ranks? 3 did not connect (\([^)]*\) )?within (\d+) ms\b.*: did (it|they) start, "
                      r"with the same WORLD_SIZE and job token\?", got)
        self.assertIsNotNone(m, out)
        self.assertGreater(int(m.group(2)), timeout_s * 1000 // 2, out)  # the join's deadline, in ms
        self.assertLessEqual(int(m.group(2)), timeout_s * 1000, out)
        for r in (1, 2):  # they time out naming rank 3 too, or see the store go with rank 0
            got = " ".join(lines.get(r, []))
            self.assertRegex(got, r"EXPECTED timeout: rank %d: ranks? 3 did not connect|EXPECTED peer lost" % r, out)
        self.assertGreaterEqual(took, timeout_s * 0.9, "rank 0 gave up before its deadline")
        self.assertLess(took, timeout_s + 20)

    def test_wrong_job_token_is_refused(self):
        status, lines, took, out = run(3, "wrong-token", "1", keep_going=True, bound=60)
        self.assertEqual(status, 0, out)
        self.expect(lines, 1, "authentication failed", "GRADWIRE_JOB_TOKEN")
        self.expect(lines, 0, "timeout")
        self.assertRegex(" ".join(lines.get(0, [])), r"rank 0: ranks? 1 did not connect (\([^)]*\) )?within \d+ ms\b"
                                                     r".*: did (it|they) start, with the same WORLD_SIZE and job "
                                                     r"token\?", out)
        self.assertLess(took, JOIN_TIMEOUT_S + 20)

    def test_port_in_use_is_a_clear_error(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen()
            port = s.getsockname()[1]
            status, lines, took, out = run(2, "join", extra=["--master-port", str(port)], bound=60)
        self.assertNotEqual(status, 0)
        # Rank 0 serves the store: errc::config (mp_worker prints "FAIL errc::KIND: what()"),
        # in docs/errors.md's words, naming the address and what the port is for.
        got = " ".join(lines.get(0, []))
        self.assertIn(f"rank 0: FAIL errc::config: cannot listen on 127.0.0.1:{port} (the rendezvous store's port "
                      f"(MASTER_PORT)): the port is in use, by another job or a process of an earlier one; choose "
                      f"another port, or 0 where any free port will do: configuration error", got, out)
        self.assertLess(took, 30)


class Stall(unittest.TestCase):
    """A rank stopped with SIGSTOP (alive, connected, not calling) while the others train."""

    def run_frozen(self, ranks, victim, freeze_s, env, steps=150):
        """Runs `stall` on `ranks` ranks, stops `victim` once it has done 10 steps, for freeze_s,
        then continues it."""
        with tempfile.TemporaryDirectory(prefix="gw-stall-") as pids:
            e = dict(os.environ, GRADWIRE_TIMEOUT=str(JOIN_TIMEOUT_S), GW_TEST_PID_DIR=pids,
                     GW_TEST_ELEMENTS="65536", **env)  # 256 KiB steps: the ring, so waits form a chain
            cmd = [LAUNCHER, "-n", str(ranks), "--keep-going", "--", WORKER, "stall", str(victim), str(steps)]
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=e,
                                 start_new_session=True)
            try:
                path = os.path.join(pids, f"rank{victim}.pid")
                deadline = time.monotonic() + 60
                while not (os.path.exists(path) and os.path.getsize(path)) and time.monotonic() < deadline:
                    time.sleep(0.05)
                self.assertTrue(os.path.exists(path), "the victim never started")
                time.sleep(0.05)
                with open(path) as f:
                    pid = int(f.read())
                stepped = os.path.join(pids, f"rank{victim}.step10")  # mid-run: the worker says when
                while not os.path.exists(stepped) and time.monotonic() < deadline and p.poll() is None:
                    time.sleep(0.02)
                self.assertTrue(os.path.exists(stepped), "the victim never finished 10 steps")
                os.kill(pid, signal.SIGSTOP)
                time.sleep(freeze_s)
                os.kill(pid, signal.SIGCONT)
                out, _ = p.communicate(timeout=90)
            finally:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        return p.returncode, rank_lines(out), out

    @unittest.skipIf("ucx" in os.path.basename(WORKER), "stall reports with chains and the stall timeout are asio_tcp's")
    def test_stall_warning_names_the_frozen_rank_and_is_only_a_warning(self):
        # Frozen for 7 s with GRADWIRE_HEARTBEAT=1 (lost after 5 silent intervals): its kernel
        # still answers, so it is not reported lost; every waiting rank warns once, naming it.
        ranks, victim = 4, 2
        status, lines, out = self.run_frozen(ranks, victim, 7, {"GRADWIRE_STALL_WARN": "2", "GRADWIRE_HEARTBEAT": "1"})
        self.assertEqual(status, 0, out)
        for r in range(ranks):
            got = "\n".join(lines.get(r, []))
            self.assertIn(f"rank {r}: PASS stall", got, out)
            self.assertNotIn("lost", got, out)
            if r == victim:
                continue
            warnings = [l for l in lines.get(r, []) if "warning:" in l]
            self.assertEqual(len(warnings), 1, f"rank {r} must warn exactly once:\n{out}")
            self.assertIn("in all_reduce (operation #", warnings[0])
            self.assertRegex(warnings[0], r"step \d+\)")
            self.assertIn(f"rank {victim} has said nothing: it is alive", warnings[0], out)

    @unittest.skipUnless("ucx" in os.path.basename(WORKER), "UCX's own, simpler stall warning")
    def test_stall_warning_over_ucx_names_the_rank_waited_for(self):
        ranks, victim = 3, 2
        status, lines, out = self.run_frozen(ranks, victim, 4, {"GRADWIRE_STALL_WARN": "2"})
        self.assertEqual(status, 0, out)
        named = 0
        for r in range(ranks):
            self.assertIn(f"rank {r}: PASS stall", "\n".join(lines.get(r, [])), out)
            if r != victim:
                warnings = [l for l in lines.get(r, []) if "warning:" in l]
                self.assertEqual(len(warnings), 1, f"rank {r} must warn exactly once:\n{out}")
                self.assertIn("in all_reduce (operation #", warnings[0])
                named += f"for rank {victim}:" in warnings[0]
        self.assertGreater(named, 0, out)

    @unittest.skipIf("ucx" in os.path.basename(WORKER), "stall reports with chains and the stall timeout are asio_tcp's")
    def test_stall_timeout_fails_every_other_rank_naming_the_frozen_one(self):
        ranks, victim = 3, 1
        start = time.monotonic()
        status, lines, out = self.run_frozen(ranks, victim, 6, {"GRADWIRE_STALL_TIMEOUT": "4"})
        self.assertNotEqual(status, 0, out)  # the frozen rank fails once continued
        for r in range(ranks):
            if r != victim:
                got = " ".join(lines.get(r, []))
                self.assertIn("EXPECTED timeout", got, out)
                self.assertIn(f"rank {victim} stalled", got, out)
        self.assertLess(time.monotonic() - start, 60)

    def test_step_timeout_from_the_environment_bounds_each_operation(self):
        ranks, victim = 3, 1
        start = time.monotonic()
        status, lines, out = self.run_frozen(ranks, victim, 5, {"GRADWIRE_STEP_TIMEOUT": "2"})
        for r in range(ranks):
            if r != victim:
                got = " ".join(lines.get(r, []))
                self.assertRegex(got, r"EXPECTED (timeout|peer lost)", out)
                self.assertIn("before its deadline", got, out)
        self.assertLess(time.monotonic() - start, 60)
        status, lines, _, out = run(2, "stall", "0", "1", keep_going=True, env={"GRADWIRE_STEP_TIMEOUT": "soon"}, bound=60)
        self.assertNotEqual(status, 0, out)
        self.assertIn("GRADWIRE_STEP_TIMEOUT='soon'", out)

    def test_bad_settings_are_config_errors(self):
        integer, seconds = "is not an integer from 0 to 3600", "is not a number of seconds from 0.001 to 1e7"
        for name, value, says in (("GRADWIRE_HEARTBEAT", "-1", integer), ("GRADWIRE_STALL_WARN", "soon", seconds),
                                  ("GRADWIRE_STALL_TIMEOUT", "0", seconds), ("GRADWIRE_HEARTBEAT", "1.5", integer),
                                  # a unit the parser does not read is refused, not dropped (30 s for 30 us);
                                  # a non-ASCII one too, whose first byte is negative as a signed char
                                  ("GRADWIRE_STALL_WARN", "30\u00b5s", seconds)):
            with self.subTest(name=name, value=value):
                status, lines, _, out = run(2, "join", keep_going=True, env={name: value}, bound=60)
                self.assertNotEqual(status, 0, out)
                # Every rank reads the variable when it joins: errc::config naming it and its value
                # (mp_worker prints "FAIL errc::KIND: what()").
                for r in range(2):
                    self.assertIn(f"rank {r}: FAIL errc::config: {name}='{value}' {says}: configuration error",
                                  " ".join(lines.get(r, [])), out)


class Mpirun(unittest.TestCase):
    """The same worker, started by OpenMPI's mpirun: no gradwire launcher, no code change."""

    @unittest.skipUnless(shutil.which("mpirun"), "mpirun not installed (Debian: openmpi-bin)")
    def test_collectives_and_training_under_mpirun(self):
        for args in (["collectives"], ["train", "sgd"]):
            with self.subTest(args=args):
                cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "3", WORKER, *args]
                p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=180)
                self.assertEqual(p.returncode, 0, p.stdout)
                for r in range(3):
                    self.assertIn(f"rank {r}: PASS", p.stdout)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + sys.argv[3:], verbosity=2)
