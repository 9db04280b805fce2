#!/usr/bin/env python3
"""The multi-process suite over transport::mpi, started by OpenMPI's mpirun.

    test_mpi.py MP_WORKER_MPI PS_WORKER_MPI MPI_RUNTIME_WORKER [unittest args]     e.g. Correctness, Failures, Runtime

The same worker scenarios as test_multiprocess.py runs over TCP and UCX (mp_worker.cpp,
ps_worker.cpp), each rank checking its results against float64 references, plus what MPI
lets a rank see of failures, and (mpi_runtime_worker.cpp) the thread level a program
initialised MPI at, a rank killed under --enable-recovery, a failing MPI_Imrecv, and a
receive dropped while its message arrives. Exits 77 (skipped) without
mpirun. Every run is bounded.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

from mp_support import alive, poll_until

MP_WORKER, PS_WORKER, RUNTIME_WORKER = sys.argv[1], sys.argv[2], sys.argv[3]
SKIP = 77
# Shared memory unless a case says otherwise; --oversubscribe: more ranks than cores.
MPIRUN = ["mpirun", "--oversubscribe", "--allow-run-as-root"]
# gradwire-run's and torchrun's variables would win over OpenMPI's in cluster::detect().
ENV = {k: v for k, v in os.environ.items()
       if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "MASTER_ADDR", "GRADWIRE_JOB_TOKEN")}
_RANK_LINE = re.compile(r"^rank (\d+): (.*)$")


def run(ranks, worker, *args, mca=(), env=None, bound=120):
    """Runs `worker args` on `ranks` ranks under mpirun; returns (status, {rank: [lines]}, seconds, output)."""
    cmd = MPIRUN + [a for kv in mca for a in ("--mca", *kv)]
    for name, value in (env or {}).items():
        cmd += ["-x", f"{name}={value}"]
    cmd += ["-np", str(ranks), worker, *args]
    start = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=bound, env=ENV)
    lines = {}
    for line in p.stdout.splitlines():
        m = _RANK_LINE.match(line)
        if m:
            lines.setdefault(int(m.group(1)), []).append(m.group(2))
    return p.returncode, lines, time.monotonic() - start, p.stdout


class Correctness(unittest.TestCase):
    def check_pass(self, ranks, *args, worker=MP_WORKER, **kw):
        status, lines, _, out = run(ranks, worker, *args, **kw)
        self.assertEqual(status, 0, out)
        for r in range(ranks):
            self.assertTrue(any(l.startswith("PASS") for l in lines.get(r, [])), f"rank {r} did not pass:\n{out}")
        return lines

    def test_collectives_against_float64_reference(self):
        # ring, halving-doubling, hierarchical, auto (one-shot at small sizes), average,
        # broadcast, reduce_scatter, all_gather, barrier; sizes 0, 1, 7, 1000003.
        for n in (2, 3, 4):
            with self.subTest(ranks=n):
                self.check_pass(n, "collectives")

    def test_collectives_over_the_tcp_btl(self):  # as between hosts: OpenMPI's TCP instead of shared memory
        self.check_pass(3, "collectives", mca=[("btl", "self,tcp")])

    def test_bucketing_and_async_engine(self):
        self.check_pass(3, "bucketing")
        self.check_pass(3, "async")

    def test_point_to_point_out_of_order_and_size_mismatch(self):
        self.check_pass(2, "point-to-point")

    def test_strategies_equal_one_device_large_batch(self):
        for n, opt in ((2, "sgd"), (3, "momentum"), (4, "adam"), (3, "central-momentum"), (3, "local-sgd")):
            with self.subTest(ranks=n, optimizer=opt):
                self.check_pass(n, "train", opt)

    def test_sync_parameter_server_equals_all_reduce(self):
        # 2 workers and 1 server (the last rank): the chief compares with a serial reference.
        lines = self.check_pass(3, "sync", worker=PS_WORKER, env={"GRADWIRE_NUM_PS": "1"})
        self.assertTrue(any("PASS server" in l for l in lines.get(2, [])), lines)


class Failures(unittest.TestCase):
    def test_mismatched_collectives_name_both_ranks_and_values(self):
        # Rank 1's neighbours see the mismatch; their abort messages tell every other rank.
        cases = {"count": ("count=1001", "count=1000"), "dtype": ("f64", "f32"), "op": ("broadcast", "all_reduce")}
        for kind, values in cases.items():
            with self.subTest(kind=kind):
                status, lines, took, out = run(4, MP_WORKER, "mismatch", kind, bound=60)
                self.assertEqual(status, 0, out)
                for r in range(4):
                    got = " ".join(lines.get(r, []))
                    self.assertIn("EXPECTED mismatch", got, out)
                    for v in ("rank 1", *values):
                        self.assertIn(v, got, out)
                self.assertLess(took, 30)

    def test_deadline_is_a_timeout_naming_peer_tag_and_size(self):
        status, lines, took, out = run(2, MP_WORKER, "timeout", bound=60)
        self.assertEqual(status, 0, out)
        for r in range(2):
            got = " ".join(lines.get(r, []))
            self.assertIn("EXPECTED timeout", got, out)
            self.assertIn(f"receive from rank {(r + 1) % 2} (tag 4242, 12345 bytes)", got, out)
            self.assertIn("PASS timeout", got, out)
        self.assertLess(took, 30)

    def test_killed_rank_ends_the_job_in_bounded_time(self):
        # OpenMPI's launcher ends the job when a rank dies without MPI_Finalize: the
        # survivors are killed (they would otherwise wait for the dead rank until their
        # deadline: over shared memory MPI reports nothing). What the user sees is
        # mpirun's report naming the rank and the signal, and a non-zero status.
        status, lines, took, out = run(3, MP_WORKER, "kill", "1", bound=60)
        self.assertNotEqual(status, 0, out)
        self.assertRegex(out, r"rank 1 with PID \d+ on node \S+ exited on signal 9", out)
        self.assertLess(took, 30, "the job must end at once, not at the survivors' deadline")





class Runtime(unittest.TestCase):
    """What a program sees of MPI itself: the thread level it initialised MPI at, a rank
    killed while the job goes on, and an MPI call that fails (mpi_runtime_worker.cpp)."""

    LEVELS = {"single": "MPI_THREAD_SINGLE", "funneled": "MPI_THREAD_FUNNELED",
              "serialized": "MPI_THREAD_SERIALIZED", "multiple": "MPI_THREAD_MULTIPLE"}

    def thread_level(self, level):
        status, lines, _, out = run(2, RUNTIME_WORKER, "thread-level", level, bound=60)
        self.assertEqual(status, 0, out)
        for r in range(2):
            self.assertEqual(lines.get(r, [])[:1], [f"provided {self.LEVELS[level]}"], out)  # what MPI_Query_thread says
        return [lines[r][1:] for r in range(2)], out

    def passes(self, mode, bound=120, mca=(), passed=None):
        """Runs mpi_runtime_worker MODE on 2 ranks; each must print only its PASS line."""
        status, lines, _, out = run(2, RUNTIME_WORKER, mode, mca=mca, bound=bound)
        self.assertEqual(status, 0, out)
        self.assertNotIn("FAIL", out)
        for r in (0, 1):
            self.assertEqual(lines.get(r, []), [passed or f"PASS {mode}"], out)

    def test_mpi_initialised_funneled_or_single_is_refused_naming_both_levels(self):
        # docs/transports.md: "an MPI initialised with FUNNELED or SINGLE is refused with a
        # config error that says what to call instead".
        for level in ("funneled", "single"):
            with self.subTest(level=level):
                per_rank, out = self.thread_level(level)
                for r, rest in enumerate(per_rank):
                    self.assertEqual(len(rest), 1, out)
                    self.assertTrue(rest[0].startswith("REFUSED configuration error: transport::mpi: "), out)
                    for words in (f"MPI provides {self.LEVELS[level]}", "engine thread",
                                  "MPI_Init_thread(MPI_THREAD_SERIALIZED) or MPI_THREAD_MULTIPLE"):
                        self.assertIn(words, rest[0], f"rank {r}:\n{out}")

    def test_mpi_initialised_serialized_or_multiple_is_joined(self):
        # The other side of the refusal: SERIALIZED "is enough" (and MULTIPLE is more), and an
        # all-reduce over the transport then matches the sum the worker computes itself.
        for level in ("serialized", "multiple"):
            with self.subTest(level=level):
                per_rank, out = self.thread_level(level)
                self.assertEqual(per_rank, [["PASS joined"], ["PASS joined"]], out)

    def killed_under_recovery(self, mca):
        # docs/transports.md: a rank killed under `mpirun --enable-recovery` is a `timeout` at
        # the operation deadline (GRADWIRE_STEP_TIMEOUT) on the others, over shared memory or
        # TCP. Rank 0 posts a receive from rank 1 before the kill and waits on it after; then
        # it starts an all-reduce. Every step is ordered by files, not by time.
        step_timeout = 1.0
        with tempfile.TemporaryDirectory() as d:
            cmd = MPIRUN + ["--enable-recovery"] + [a for kv in mca for a in ("--mca", *kv)]
            cmd += ["-x", f"GRADWIRE_STEP_TIMEOUT={step_timeout:g}", "-np", "2", RUNTIME_WORKER, "recovery", d]
            job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV,
                                   start_new_session=True)
            try:
                def ready():
                    if job.poll() is not None:
                        raise AssertionError(f"mpirun ended before its ranks were ready:\n{job.stdout.read()}")
                    return all(os.path.exists(os.path.join(d, f"rank{r}.pid")) for r in range(2))
                poll_until(ready, 30, "the ranks were not ready")
                with open(os.path.join(d, "rank1.pid")) as f:
                    victim = int(f.read())
                os.kill(victim, signal.SIGKILL)
                poll_until(lambda: not alive(victim), 10, "rank 1 did not end after SIGKILL")
                with open(os.path.join(d, "killed"), "w"):
                    pass
                out, _ = job.communicate(timeout=30)
            finally:
                if job.poll() is None:  # mpirun stops its ranks on SIGTERM; SIGKILL if it does not
                    os.killpg(job.pid, signal.SIGTERM)
                    try:
                        job.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        os.killpg(job.pid, signal.SIGKILL)
                        job.wait()
        survivor = [m.group(2) for m in map(_RANK_LINE.match, out.splitlines()) if m and m.group(1) == "0"]
        expected = [line for line in survivor if line.startswith("EXPECTED")]
        self.assertEqual(len(expected), 2, out)
        self.assertEqual(survivor[-1], "DONE", out)  # mpirun let rank 0 live on after rank 1 died
        names = ["receive from rank 1 (tag 4242, 12345 bytes) did not complete before its deadline",
                 "receive from rank 1 (tag "]  # the all-reduce: rank 1 is its only peer
        for line, words in zip(expected, names):
            m = re.match(r"EXPECTED timeout after ([0-9.]+) s: rank 0: (.*)$", line)
            self.assertIsNotNone(m, out)
            self.assertIn(words, m.group(2), out)
            self.assertIn("did not complete before its deadline", m.group(2), out)
            took = float(m.group(1))
            self.assertGreaterEqual(took, step_timeout, f"failed before the deadline:\n{out}")
            self.assertLess(took, step_timeout + 3.0, f"not at the deadline:\n{out}")
        self.assertNotIn("FAIL", out)

    def test_failed_imrecv_ends_the_receive_with_mpis_error_not_at_its_deadline(self):
        # When MPI_Imrecv fails (injected by the worker through the MPI profiling interface),
        # the receive completes at once with a gradwire error naming the operation and MPI's
        # error: not a timeout at its deadline (60 s), and not a success with nothing received.
        # The job then goes on: both ranks pass a checked all-reduce.
        status, lines, _, out = run(2, RUNTIME_WORKER, "imrecv-fails", bound=120)
        self.assertEqual(status, 0, out)
        self.assertNotIn("FAIL", out)
        self.assertEqual(lines.get(1, []), ["PASS imrecv-fails"], out)
        rank0 = lines.get(0, [])
        self.assertEqual(len(rank0), 3, out)
        expected, mpi_says, passed = rank0
        self.assertTrue(mpi_says.startswith("MPI says: ") and len(mpi_says) > len("MPI says: "), out)
        mpi_text = mpi_says[len("MPI says: "):]
        self.assertTrue(expected.startswith("EXPECTED "), out)
        self.assertFalse(expected.startswith("EXPECTED timeout"), out)
        self.assertIn("rank 0: receive from rank 1 (tag 4242, 12345 bytes): " + mpi_text, expected, out)
        self.assertEqual(passed, "PASS imrecv-fails", out)

    def test_a_receive_dropped_while_its_message_arrives_writes_nothing_after_the_drop(self):
        # The receive's 16 MiB are matched and still arriving when rank 0 drops it (over
        # OpenMPI's TCP, where a large message moves only as both ranks progress): the drop
        # lets it finish, so the buffer the caller then reuses is never written again.
        self.passes("drop-arriving", mca=[("btl", "self,tcp")])

    def test_each_transport_frees_the_communicator_it_duplicated(self):
        # A program that builds transport::mpi once per phase must not leak a communicator
        # each time: the worker counts MPI_Comm_idup and MPI_Comm_free (profiling interface)
        # over three transports, each destroyed before the next is built.
        self.passes("comm-freed", passed="PASS comm-freed 3 of 3")

    def test_a_message_above_2_gib_arrives_whole_and_an_uncountable_one_is_refused(self):
        # MPI counts are ints: above 2 GiB the transport sends in 4-byte units. Rank 0 checks
        # every word of 2 GiB + 8 bytes against the pattern rank 1 wrote; 2 GiB + 2 bytes is
        # refused with invalid_argument naming the size.
        self.passes("large-message", bound=240)

    def test_a_dropped_send_is_handed_to_mpi_at_once_and_still_delivered(self):
        # MPI cannot cancel a send: dropping one that has not completed (16 MiB, no receive
        # posted) frees its request at once, without waiting for it (no MPI_Test, counted
        # through the profiling interface), and the receiver still gets it whole later.
        self.passes("drop-send")

    def test_killed_rank_under_enable_recovery_is_a_timeout_over_shared_memory(self):
        self.killed_under_recovery(mca=[])

    def test_killed_rank_under_enable_recovery_is_a_timeout_over_tcp(self):
        self.killed_under_recovery(mca=[("btl", "self,tcp")])


if __name__ == "__main__":
    if shutil.which("mpirun") is None:
        print("SKIPPED: mpirun is not installed (Debian: apt-get install openmpi-bin)")
        sys.exit(SKIP)
    unittest.main(argv=[sys.argv[0]] + sys.argv[4:], verbosity=2)
