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
    cmd = [LAUNCHER, "-n", str(ranks), *extra] + (["--keep-going"] if keep_going else []) + ["--", WORKER, *args]
    e = dict(os.environ, GRADWIRE_TIMEOUT=str(JOIN_TIMEOUT_S), **(env or {}))
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

    def test_aborting_rank_waits_until_a_busy_peer_heard_why(self):
        status, lines, took, out = run(2, "abort-heard", keep_going=True, bound=60)
        self.assertEqual(status, 0, out)
        self.expect(lines, 0, "mismatch", "rank 1 failed", "a reason only rank 1 knows")
        if "ucx" in os.path.basename(WORKER):  # it waited for rank 0's answer, at most a second
            sent = float(re.search(r"abort sent in ([0-9.]+) s", " ".join(lines.get(1, []))).group(1))
            self.assertGreater(sent, 0.2, out)
            self.assertLess(sent, 1.5, out)

    def test_wrong_job_token_is_refused(self):
        status, lines, took, out = run(3, "wrong-token", "1", keep_going=True, bound=60)
        self.assertEqual(status, 0, out)
        self.expect(lines, 1, "authentication failed", "GRADWIRE_JOB_TOKEN")
        self.expect(lines, 0, "timeout", "did not connect")
        self.assertLess(took, JOIN_TIMEOUT_S + 20)

    def test_port_in_use_is_a_clear_error(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen()
            port = s.getsockname()[1]
            status, lines, took, out = run(2, "join", extra=["--master-port", str(port)], bound=60)
        self.assertNotEqual(status, 0)
        got = " ".join(lines.get(0, []))
        self.assertIn(f"127.0.0.1:{port}", got, out)
        self.assertIn("in use", got, out)
        self.assertLess(took, 30)


class Stall(unittest.TestCase):
    """A rank stopped with SIGSTOP (alive, connected, not calling) while the others train."""

    def run_frozen(self, ranks, victim, freeze_s, env, steps=150):
        """Runs `stall` on `ranks` ranks, stops `victim` a second in for freeze_s, continues it."""
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
                time.sleep(1.0)  # some steps in
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
        for name, value in (("GRADWIRE_HEARTBEAT", "-1"), ("GRADWIRE_STALL_WARN", "soon"),
                            ("GRADWIRE_STALL_TIMEOUT", "0"), ("GRADWIRE_HEARTBEAT", "1.5")):
            if name == "GRADWIRE_STALL_TIMEOUT" and "ucx" in os.path.basename(WORKER):
                continue  # read by asio_tcp only
            with self.subTest(name=name, value=value):
                status, lines, _, out = run(2, "join", keep_going=True, env={name: value}, bound=60)
                self.assertNotEqual(status, 0, out)
                self.assertIn(f"{name}='{value}'", out)


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
