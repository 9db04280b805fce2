#!/usr/bin/env python3
"""scripts/gradwire-run: environment per rank, prefixes, failures, restarts, signals, timeouts, usage.

Usage: test_launcher.py path/to/gradwire-run [unittest args]

GRADWIRE_TEST_PRINT_SPEC (set by ctest): tests/cluster/print_spec, which prints what
cluster::detect() derives; the port-formula tests (DerivedPort) need it.
"""
import json
import os
import pathlib
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "multiprocess"))
from mp_support import alive, poll_until  # noqa: E402

LAUNCHER = None


def run(*args, env=None, timeout=30):
    """Runs the launcher; returns (returncode, stdout, stderr, seconds)."""
    start = time.monotonic()
    proc = subprocess.run([sys.executable, LAUNCHER, *args], capture_output=True, text=True, timeout=timeout,
                          env=env)
    return proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start




def read_pids(directory):
    pids = []
    for name in os.listdir(directory):
        with open(os.path.join(directory, name)) as f:
            text = f.read()
            if text.endswith("\n"):  # written completely
                pids.extend(int(pid) for pid in text.split())
    return pids


def wait_for_files(directory, count, limit=10.0):
    """Waits until the ranks have written `count` pids."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if len(read_pids(directory)) >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"{count} ranks did not start within {limit} s")



def fnv1a_64(text):
    """FNV-1a, 64 bits (offset basis 14695981039346656037, prime 1099511628211)."""
    h = 0xcbf29ce484222325
    for byte in text.encode():
        h = ((h ^ byte) * 0x100000001b3) % (1 << 64)
    return h


def derived_port(job_key):
    """launching.md: 20000 + FNV-1a-64(key) % 10000."""
    return 20000 + fnv1a_64(job_key) % 10000


class Environment(unittest.TestCase):
    def test_every_rank_gets_its_variables(self):
        names = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "GRADWIRE_JOB_TOKEN"]
        program = "import json, os; print(json.dumps({n: os.environ.get(n) for n in %r}))" % names
        env = {k: v for k, v in os.environ.items() if k != "GRADWIRE_JOB_TOKEN"}
        code, out, err, _ = run("-n", "3", sys.executable, "-c", program, env=env)
        self.assertEqual(code, 0, err)
        seen = [json.loads(line.split(" ", 1)[1]) for line in out.splitlines()]
        self.assertEqual(sorted(v["RANK"] for v in seen), ["0", "1", "2"])
        for v in seen:
            self.assertEqual(v["WORLD_SIZE"], "3")
            self.assertEqual(v["LOCAL_RANK"], v["RANK"])
            self.assertEqual(v["LOCAL_WORLD_SIZE"], "3")
            self.assertEqual(v["MASTER_ADDR"], "127.0.0.1")
            self.assertTrue(1 <= int(v["MASTER_PORT"]) <= 65535)
            self.assertRegex(v["GRADWIRE_JOB_TOKEN"], r"^[0-9a-f]{32}$")
        self.assertEqual(len({v["MASTER_PORT"] for v in seen}), 1)
        self.assertEqual(len({v["GRADWIRE_JOB_TOKEN"] for v in seen}), 1)
        # The line's prefix is the rank that printed it.
        for line in out.splitlines():
            self.assertEqual(line.split(" ", 1)[0], "[%s]" % json.loads(line.split(" ", 1)[1])["RANK"])

    def test_given_master_and_token_are_passed_on(self):
        env = dict(os.environ, GRADWIRE_JOB_TOKEN="from-the-caller")
        code, out, err, _ = run("-n", "2", "--master-addr", "10.1.2.3", "--master-port", "29999", "--",
                                "sh", "-c", 'echo "$MASTER_ADDR $MASTER_PORT $GRADWIRE_JOB_TOKEN"', env=env)
        self.assertEqual(code, 0, err)
        self.assertEqual(sorted(out.splitlines()),
                         ["[0] 10.1.2.3 29999 from-the-caller", "[1] 10.1.2.3 29999 from-the-caller"])

    def test_chosen_port_stays_reserved_for_the_store(self):
        # While the job runs, nothing else may bind MASTER_PORT, yet rank 0's store
        # (SO_REUSEADDR, as support/asio.hpp's listen) can listen there and be reached.
        program = """if 1:
            import os, socket
            port = int(os.environ["MASTER_PORT"])
            other = socket.socket()
            try:
                other.bind(("127.0.0.1", port))
                print("taken by another program")
            except OSError:
                print("refused to another program")
            store = socket.socket()
            store.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            store.bind(("127.0.0.1", port))
            store.listen()
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
            print("store listens")
        """
        code, out, err, _ = run("-n", "1", "--no-prefix", sys.executable, "-c", program)
        self.assertEqual(code, 0, err)
        self.assertEqual(out.splitlines(), ["refused to another program", "store listens"])

    def env_of_ranks(self, *launcher_args, names, env):
        program = "import json, os; print(json.dumps({n: os.environ.get(n) for n in %r}))" % names
        code, out, err, _ = run(*launcher_args, sys.executable, "-c", program, env=env)
        self.assertEqual(code, 0, err)
        return sorted((json.loads(line.split(" ", 1)[1]) for line in out.splitlines()), key=lambda v: int(v["RANK"]))

    def test_ps_adds_servers_after_the_workers_and_tells_every_rank(self):
        # launching.md: "--ps S starts S more ranks after the N workers ... (world size N+S) and
        # sets GRADWIRE_NUM_PS=S on every rank". The caller's own GRADWIRE_NUM_PS=7 must not leak.
        names = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GRADWIRE_NUM_PS"]
        env = dict(os.environ, GRADWIRE_NUM_PS="7")
        seen = self.env_of_ranks("-n", "2", "--ps", "3", names=names, env=env)
        self.assertEqual([v["RANK"] for v in seen], ["0", "1", "2", "3", "4"])
        for v in seen:
            self.assertEqual((v["WORLD_SIZE"], v["LOCAL_WORLD_SIZE"], v["GRADWIRE_NUM_PS"]), ("5", "5", "3"), v)
            self.assertEqual(v["LOCAL_RANK"], v["RANK"])
        # Without --ps the launcher sets nothing: the caller's setting is what the ranks see.
        without = {k: v for k, v in os.environ.items() if k != "GRADWIRE_NUM_PS"}
        seen = self.env_of_ranks("-n", "2", names=names, env=without)
        self.assertEqual([(v["RANK"], v["WORLD_SIZE"], v["GRADWIRE_NUM_PS"]) for v in seen],
                         [("0", "2", None), ("1", "2", None)])

    def test_one_machine_is_group_0_of_1(self):
        # launching.md: "Every rank also gets torchrun's GROUP_RANK and NODE_RANK (0 here) and
        # GROUP_WORLD_SIZE (1)", whatever the caller's environment held.
        names = ["RANK", "GROUP_RANK", "NODE_RANK", "GROUP_WORLD_SIZE"]
        env = dict(os.environ, GROUP_RANK="5", NODE_RANK="5", GROUP_WORLD_SIZE="7")
        for args in (("-n", "3"), ("-n", "1", "--ps", "1")):
            with self.subTest(args=args):
                seen = self.env_of_ranks(*args, names=names, env=env)
                self.assertEqual(len(seen), 3 if args[1] == "3" else 2)
                for v in seen:
                    self.assertEqual((v["GROUP_RANK"], v["NODE_RANK"], v["GROUP_WORLD_SIZE"]), ("0", "0", "1"), v)


class Output(unittest.TestCase):
    def test_prefixes_keep_stdout_and_stderr_apart(self):
        code, out, err, _ = run("-n", "2", "sh", "-c", 'echo out $RANK; echo err $RANK >&2; printf "no newline"')
        self.assertEqual(code, 0, err)
        self.assertEqual(sorted(out.splitlines()), ["[0] no newline", "[0] out 0", "[1] no newline", "[1] out 1"])
        self.assertEqual(sorted(err.splitlines()), ["[0] err 0", "[1] err 1"])

    def test_the_launchers_own_lines_stay_whole_beside_the_ranks(self):
        # Rank 0 writes 100000 lines to stderr while ranks 1-9 fail one by one, and the launcher
        # reports each failure on the same stderr: every line must stay whole. (The reports were
        # print()ed, which writes a newline apart: a rank's line copied in between ran on behind
        # "gradwire-run: rank R exited ...", in about half of these runs; a test harness then
        # missed that rank's line.)
        script = 'if [ "$RANK" = 0 ]; then seq 1 100000 >&2; else sleep "0.0$RANK"; exit 1; fi'
        for _ in range(5):
            code, _, err, _ = run("-n", "10", "--keep-going", "sh", "-c", script)
            self.assertEqual(code, 1, err[-2000:])
            lines = err.splitlines()
            reports = sorted(line for line in lines if line.startswith("gradwire-run: "))
            self.assertEqual(reports, sorted(f"gradwire-run: rank {r} exited with status 1" for r in range(1, 10)))
            copied = [line for line in lines if not line.startswith("gradwire-run: ")]
            self.assertEqual(copied, [f"[0] {i}" for i in range(1, 100001)])

    def test_no_prefix(self):
        code, out, err, _ = run("-n", "2", "--no-prefix", "sh", "-c", "echo out $RANK")
        self.assertEqual(code, 0, err)
        self.assertEqual(sorted(out.splitlines()), ["out 0", "out 1"])

    def test_bind_core_pins_each_rank_to_its_own_core(self):
        program = "import os; print(sorted(os.sched_getaffinity(0)))"
        code, out, err, _ = run("-n", "3", "--bind", "core", sys.executable, "-c", program)
        self.assertEqual(code, 0, err)
        cores = sorted(os.sched_getaffinity(0))
        # "[R] [core]": the launcher's prefixes keep the ranks' lines whole.
        got = {int(line[1:line.index("]")]): line.split(" ", 1)[1] for line in out.splitlines()}
        for rank in range(3):
            self.assertEqual(got[rank], str([cores[rank % len(cores)]]))


class Failures(unittest.TestCase):
    def test_failing_rank_stops_the_others_and_its_status_propagates(self):
        with tempfile.TemporaryDirectory() as pids:
            # Ranks 0 and 2 sleep (in a child of sh, which must be stopped too) once they have
            # written their pids; rank 1 fails once both pid files are there (a bounded poll).
            script = ('if [ "$RANK" = 1 ]; then i=0; until [ -s %s/0 ] && [ -s %s/2 ]; do '
                      'i=$((i+1)); [ $i -gt 400 ] && exit 9; sleep 0.02; done; exit 3; fi; '
                      'sleep 30 & echo "$$ $!" > %s/$RANK; wait' % (pids, pids, pids))
            code, _, err, seconds = run("-n", "3", "sh", "-c", script)
            self.assertEqual(code, 3, err)
            self.assertIn("gradwire-run: rank 1 exited with status 3; stopping the other ranks", err)
            self.assertLess(seconds, 4.0, "the sleeping ranks were not stopped promptly")
            self.assertEqual(sorted(os.listdir(pids)), ["0", "2"])
            for name in os.listdir(pids):
                started = pathlib.Path(pids, name).read_text().split()
                self.assertEqual(len(started), 2, f"rank {name}: {started}")  # sh and its sleep
                for pid in started:
                    self.assertFalse(alive(int(pid)), f"process {pid} of rank {name} survived")

    def test_rank_killed_by_sigkill(self):
        code, _, err, seconds = run("-n", "2", "sh", "-c", 'if [ "$RANK" = 0 ]; then kill -9 $$; fi; sleep 30')
        self.assertEqual(code, 128 + 9, err)
        self.assertIn("gradwire-run: rank 0 was killed by SIGKILL; stopping the other ranks", err)
        self.assertLess(seconds, 4.0)

    def test_rank_ignoring_sigterm_gets_sigkill_after_the_grace(self):
        with tempfile.TemporaryDirectory() as marks:
            # Rank 1 ignores SIGTERM, then says so (a file); rank 0 fails once it has (a bounded poll).
            script = ('if [ "$RANK" = 0 ]; then i=0; until [ -e %s/trapped ]; do i=$((i+1)); [ $i -gt 400 ] && exit 9; '
                      'sleep 0.02; done; exit 1; fi; trap "" TERM; echo $$ > %s/trapped; while :; do sleep 0.1; done'
                      % (marks, marks))
            code, _, err, seconds = run("-n", "2", "sh", "-c", script)
            self.assertEqual(code, 1, err)
            self.assertIn("gradwire-run: rank 0 exited with status 1; stopping the other ranks", err)
            self.assertGreater(seconds, 4.5)  # the 5 s grace
            self.assertLess(seconds, 9.0)
            self.assertFalse(alive(int(pathlib.Path(marks, "trapped").read_text())), "rank 1 survived SIGKILL")

    def test_keep_going_waits_for_all_and_reports_each_failure(self):
        with tempfile.TemporaryDirectory() as pids:
            # Rank 0 fails first; rank 1 is killed once rank 0 is gone; rank 2 finishes once both
            # are. "Gone": reaped by the launcher (a zombie still answers kill -0), which has then
            # seen the failure. gone R: a bounded poll for rank R's pid file and its end.
            gone = ('i=0; until [ -s %(d)s/R ] && ! kill -0 "$(cat %(d)s/R)" 2>/dev/null; do '
                    'i=$((i+1)); [ $i -gt 400 ] && exit 9; sleep 0.02; done; ')
            script = ('case $RANK in 0) echo $$ > %(d)s/0; exit 4;; 1) echo $$ > %(d)s/1; ' + gone.replace("R", "0") +
                      'kill -9 $$;; 2) ' + gone.replace("R", "0") + gone.replace("R", "1") + 'echo finished;; esac')
            script = script % {"d": pids}
            code, out, err, _ = run("-n", "3", "--keep-going", "sh", "-c", script)
        self.assertEqual(code, 4, err)
        self.assertIn("[2] finished", out)
        self.assertIn("gradwire-run: rank 0 exited with status 4", err)
        self.assertIn("gradwire-run: rank 1 was killed by SIGKILL", err)
        self.assertNotIn("stopping", err)

    def test_success_exits_zero(self):
        self.assertEqual(run("-n", "4", "true")[0], 0)

    def test_timeout(self):
        code, _, err, seconds = run("-n", "2", "--timeout", "0.5", "sh", "-c", "sleep 30")
        self.assertEqual(code, 124, err)
        self.assertIn("timed out after 0.5 s", err)
        self.assertLess(seconds, 4.0)

    def test_program_that_cannot_start(self):
        code, _, err, _ = run("-n", "2", "/nonexistent/program")
        self.assertEqual(code, 127)
        self.assertIn("cannot start '/nonexistent/program'", err)


def start_ranks(pids, script, count):
    """Starts the launcher on 2 ranks of `sh -c script` (which write their pids into the folder
    `pids`, %s in the script) and waits until `count` pids are written."""
    launcher = subprocess.Popen([sys.executable, LAUNCHER, "-n", "2", "sh", "-c", script % pids],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for_files(pids, count)
    except BaseException:
        launcher.kill()
        launcher.communicate()
        raise
    return launcher


class Signals(unittest.TestCase):
    def test_sigterm_to_the_launcher_stops_every_rank(self):
        with tempfile.TemporaryDirectory() as pids:
            launcher = start_ranks(pids, 'sleep 30 & echo "$$ $!" > %s/$RANK; wait', 4)
            try:
                start = time.monotonic()
                launcher.send_signal(signal.SIGTERM)
                code = launcher.wait(timeout=10)
            finally:
                if launcher.poll() is None:
                    launcher.kill()
                launcher.communicate()
            self.assertEqual(code, 128 + signal.SIGTERM)
            self.assertLess(time.monotonic() - start, 4.0)
            for name in os.listdir(pids):
                for pid in pathlib.Path(pids, name).read_text().split():
                    self.assertFalse(alive(int(pid)), f"process {pid} of rank {name} survived")


    def test_no_rank_outlives_a_killed_launcher(self):
        # SIGKILL leaves the launcher no say (a test's timeout, the OOM killer): the ranks, each in
        # a process group of its own, must still stop instead of running on as orphans.
        with tempfile.TemporaryDirectory() as pids:
            launcher = start_ranks(pids, 'echo $$ > %s/$RANK; exec sleep 30', 2)
            launcher.kill()
            launcher.communicate()
            ranks = read_pids(pids)
            poll_until(lambda: not any(alive(pid) for pid in ranks), 10, "the ranks did not stop after their launcher was killed")

    # A rank that counts the SIGINTs it gets (its handler appends to int.R), and runs until
    # the test creates `go` (a bounded poll: it exits 9 after 30 s); then it writes how
    # many it got to count.R and exits 0. pid.R appears once its handler is in place.
    COUNTING_RANK = """if 1:
        import os, signal, sys, time
        d, rank = sys.argv[1], os.environ["RANK"]
        got = []
        def on_int(signum, frame):
            got.append(signum)
            with open(os.path.join(d, "int." + rank), "a") as f:
                f.write("INT\\n")
        signal.signal(signal.SIGINT, on_int)
        with open(os.path.join(d, "tmp." + rank), "w") as f:
            f.write("%d\\n" % os.getpid())
        os.rename(os.path.join(d, "tmp." + rank), os.path.join(d, "pid." + rank))
        give_up = time.monotonic() + 30
        while not os.path.exists(os.path.join(d, "go")):
            if time.monotonic() > give_up:
                sys.exit(9)
            time.sleep(0.01)
        with open(os.path.join(d, "count." + rank), "w") as f:
            f.write("%d\\n" % len(got))
    """

    def start_counting_ranks(self, d, ranks):
        err = open(os.path.join(d, "launcher.err"), "w+")
        launcher = subprocess.Popen([sys.executable, LAUNCHER, "-n", str(ranks), sys.executable, "-c",
                                     self.COUNTING_RANK, d], stdout=subprocess.DEVNULL, stderr=err)
        self.addCleanup(err.close)
        self.addCleanup(lambda: launcher.poll() is None and (launcher.kill(), launcher.wait()))
        files = lambda prefix: [os.path.join(d, f"{prefix}.{r}") for r in range(ranks)]
        poll_until(lambda: all(os.path.exists(f) for f in files("pid")), 20, "the ranks did not start")
        return launcher, err, files

    def test_sigint_is_forwarded_to_every_rank_once(self):
        # launching.md: gradwire-run "forwards SIGINT/SIGTERM to the ranks ... and exits
        # 128+signal". Once: a rank that takes a second SIGINT as "stop now" must not get
        # two from one Ctrl-C. The launcher says "got SIGINT; stopping the ranks" just before
        # it would send anything more; only then may the ranks finish (`go`).
        with tempfile.TemporaryDirectory() as d:
            launcher, err, files = self.start_counting_ranks(d, 2)
            launcher.send_signal(signal.SIGINT)
            poll_until(lambda: all(os.path.exists(f) for f in files("int")), 10, "the ranks did not see SIGINT")
            poll_until(lambda: "gradwire-run: got SIGINT; stopping the ranks" in pathlib.Path(err.name).read_text(),
                       10, "the launcher did not say it stops the ranks")
            pathlib.Path(d, "go").touch()
            code = launcher.wait(timeout=10)
            self.assertEqual(code, 128 + signal.SIGINT, pathlib.Path(err.name).read_text())
            for r, f in enumerate(files("count")):
                self.assertEqual(pathlib.Path(f).read_text(), "1\n", f"rank {r}: SIGINTs received")

    def test_second_sigint_kills_the_ranks_at_once(self):
        # launching.md: "a second Ctrl-C kills them at once": the ranks ignore the first one
        # (they only count it), so only SIGKILL ends them before the 5 s grace would.
        with tempfile.TemporaryDirectory() as d:
            launcher, err, files = self.start_counting_ranks(d, 2)
            pids = [int(pathlib.Path(f).read_text()) for f in files("pid")]
            launcher.send_signal(signal.SIGINT)
            poll_until(lambda: all(os.path.exists(f) for f in files("int")), 10, "the ranks did not see SIGINT")
            self.assertTrue(all(alive(pid) for pid in pids), "a rank ended on the first SIGINT: it should only count it")
            start = time.monotonic()
            launcher.send_signal(signal.SIGINT)
            code = launcher.wait(timeout=10)
            took = time.monotonic() - start
            self.assertEqual(code, 128 + signal.SIGINT, pathlib.Path(err.name).read_text())
            self.assertLess(took, 3.0, "the ranks were not killed at once (the grace before SIGKILL is 5 s)")
            for pid in pids:
                self.assertFalse(alive(pid), f"rank process {pid} survived the second SIGINT")
            self.assertFalse(any(os.path.exists(f) for f in files("count")), "a rank finished instead of being killed")


class Restarts(unittest.TestCase):
    """--max-restarts R: a failed rank is started again alone, with GRADWIRE_REJOIN=1 and
    GRADWIRE_RESTART_COUNT=k, up to R times; the other ranks go on."""
    # argv: DIR ACTION-OF-RANK-0 ACTION-OF-RANK-1 ...; every run appends its environment (a JSON
    # line) to DIR/runs.RANK, then acts ("finish": exits 0). A wait is a bounded poll: the rank
    # exits 9 after 30 s.
    RANK_PROGRAM = """if 1:
        import json, os, signal, subprocess, sys, time
        d, rank = sys.argv[1], os.environ["RANK"]
        action = sys.argv[2 + int(rank)]
        replacement = os.environ.get("GRADWIRE_REJOIN") == "1"
        names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "GRADWIRE_JOB_TOKEN", "GRADWIRE_REJOIN", "GRADWIRE_RESTART_COUNT")
        run = {n: os.environ.get(n) for n in names}
        run.update(pid=os.getpid(), started=time.monotonic())

        def runs(r):
            try:
                with open(os.path.join(d, "runs." + r)) as f:
                    return [json.loads(line) for line in f if line.endswith("\\n")]
            except FileNotFoundError:
                return []

        def wait_for(condition):
            give_up = time.monotonic() + 30
            while not condition():
                if time.monotonic() > give_up:
                    sys.exit(9)
                time.sleep(0.01)

        def ended(r):  # its last run was reaped by the launcher (a zombie still answers kill 0)
            try:
                os.kill(runs(r)[-1]["pid"], 0)
                return False
            except (IndexError, ProcessLookupError):
                return bool(runs(r))

        if action == "kill-once" and not replacement:  # leaves a child in its process group
            run["child"] = subprocess.Popen(["sleep", "30"]).pid
        run["ending"] = time.monotonic()
        with open(os.path.join(d, "runs." + rank), "a") as f:
            f.write(json.dumps(run) + "\\n")
        if action == "kill-once" and not replacement:
            os.kill(os.getpid(), signal.SIGKILL)
        elif action == "exit-3" or (action == "exit-3-once" and not replacement):
            sys.exit(3)
        elif action.startswith("await-replacement-of-"):
            wait_for(lambda: len(runs(action.rsplit("-", 1)[1])) >= 2)
            open(os.path.join(d, "done." + rank), "w").close()
        elif action.startswith("await-end-of-"):
            wait_for(lambda: ended(action.rsplit("-", 1)[1]))
        elif action == "await-go":  # the test never says go: only the launcher ends it
            wait_for(lambda: os.path.exists(os.path.join(d, "go")))
    """

    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.dir)
        self.program = os.path.join(self.dir, "rank.py")
        pathlib.Path(self.program).write_text(self.RANK_PROGRAM)
        self.env = {k: v for k, v in os.environ.items() if k not in ("GRADWIRE_REJOIN", "GRADWIRE_RESTART_COUNT")}

    def launch(self, options, actions):
        """Runs the launcher with `options` on one rank per action; returns (code, stderr)."""
        code, _, err, _ = run("-n", str(len(actions)), *options, sys.executable, self.program, self.dir, *actions,
                              env=self.env)
        return code, err

    def runs(self, rank):
        path = pathlib.Path(self.dir, f"runs.{rank}")
        lines = path.read_text().splitlines(keepends=True) if path.exists() else []
        return [json.loads(line) for line in lines if line.endswith("\n")]

    def clear(self):
        """Forgets the runs of an earlier launch."""
        for name in os.listdir(self.dir):
            if name != "rank.py":
                os.remove(os.path.join(self.dir, name))

    def test_a_failed_rank_is_restarted_alone_with_its_environment_and_the_job_succeeds(self):
        # Rank 1 fails on its first run; ranks 0 and 2 wait for its replacement, then end 0: they
        # ran through the failure (the launcher did not stop them).
        for failure, description in (("kill-once", "was killed by SIGKILL"), ("exit-3-once", "exited with status 3")):
            with self.subTest(failure=failure):
                self.clear()
                code, err = self.launch(["--max-restarts", "2", "--restart-delay", "0.2"],
                                        ["await-replacement-of-1", failure, "await-replacement-of-1"])
                self.assertEqual(code, 0, err)
                self.assertIn(f"gradwire-run: rank 1 {description}; restarting it in 0.2 s (restart 1 of 2) "
                              f"with GRADWIRE_REJOIN=1\n", err)
                self.assertNotIn("stopping", err)
                first, replacement = self.runs(1)
                self.assertEqual((first["GRADWIRE_REJOIN"], first["GRADWIRE_RESTART_COUNT"]), (None, None))
                self.assertEqual((replacement["GRADWIRE_REJOIN"], replacement["GRADWIRE_RESTART_COUNT"]), ("1", "1"))
                same = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                        "GRADWIRE_JOB_TOKEN")
                self.assertEqual({n: replacement[n] for n in same}, {n: first[n] for n in same})
                self.assertEqual((first["RANK"], first["WORLD_SIZE"]), ("1", "3"))
                for rank in (0, 2):
                    self.assertEqual(len(self.runs(rank)), 1, f"rank {rank} was restarted")
                    self.assertTrue(pathlib.Path(self.dir, f"done.{rank}").exists(), f"rank {rank} did not finish")
                if "child" in first:  # what the killed run left in its group does not meet its replacement
                    poll_until(lambda: not alive(first["child"]), 10, "the killed rank's child survived its restart")

    def test_the_replacement_starts_after_the_default_delay(self):
        code, err = self.launch(["--max-restarts", "1"], ["await-replacement-of-1", "exit-3-once"])
        self.assertEqual(code, 0, err)
        self.assertIn("gradwire-run: rank 1 exited with status 3; restarting it in 1 s (restart 1 of 1) "
                      "with GRADWIRE_REJOIN=1\n", err)
        first, replacement = self.runs(1)
        # A lower bound only (one monotonic clock for all processes): load only makes it later.
        self.assertGreaterEqual(replacement["started"] - first["ending"], 1.0)

    def test_restarts_are_capped_then_the_failure_stops_the_job(self):
        # Rank 1 fails every time: started R+1 = 3 times, then the job fails with its status and
        # rank 0 (still waiting) is stopped as without restarts.
        code, err = self.launch(["--max-restarts", "2", "--restart-delay", "0"], ["await-go", "exit-3"])
        self.assertEqual(code, 3, err)
        runs = self.runs(1)
        self.assertEqual([(r["GRADWIRE_REJOIN"], r["GRADWIRE_RESTART_COUNT"]) for r in runs],
                         [(None, None), ("1", "1"), ("1", "2")])
        for k in (1, 2):
            self.assertIn(f"gradwire-run: rank 1 exited with status 3; restarting it in 0 s (restart {k} of 2) "
                          f"with GRADWIRE_REJOIN=1\n", err)
        self.assertIn("gradwire-run: rank 1 exited with status 3 after 2 restarts; stopping the other ranks\n", err)
        (waiting,) = self.runs(0)
        self.assertFalse(alive(waiting["pid"]), "rank 0 was not stopped")

    def test_the_job_waits_for_a_replacement_when_no_other_rank_runs(self):
        code, err = self.launch(["--max-restarts", "1", "--restart-delay", "0.2"], ["exit-3-once"])
        self.assertEqual(code, 0, err)
        self.assertEqual([r["GRADWIRE_RESTART_COUNT"] for r in self.runs(0)], [None, "1"])

    def test_a_rank_that_exits_0_is_not_restarted(self):
        # Rank 0 runs on until the launcher has reaped rank 1: with no delay, a restart would
        # have started before the job ends.
        code, err = self.launch(["--max-restarts", "3", "--restart-delay", "0"], ["await-end-of-1", "finish"])
        self.assertEqual(code, 0, err)
        self.assertEqual([len(self.runs(r)) for r in (0, 1)], [1, 1])
        self.assertNotIn("restart", err)

    def test_zero_restarts_is_the_old_behaviour(self):
        for options in ([], ["--max-restarts", "0"]):
            with self.subTest(options=options):
                self.clear()
                code, err = self.launch(options, ["await-go", "exit-3"])
                self.assertEqual(code, 3, err)
                self.assertEqual(err, "gradwire-run: rank 1 exited with status 3; stopping the other ranks\n")
                self.assertEqual(len(self.runs(1)), 1)
                self.assertNotIn("GRADWIRE_REJOIN=1", err)

    def test_no_restart_once_the_launcher_stops_the_job(self):
        # --timeout during the delay: the pending restart is dropped. (5 s: rank 1 has failed by then.)
        code, err = self.launch(["--max-restarts", "1", "--restart-delay", "60", "--timeout", "5"],
                                ["await-go", "exit-3"])
        self.assertEqual(code, 124, err)
        self.assertIn("restarting it in 60 s (restart 1 of 1)", err)
        self.assertEqual(len(self.runs(1)), 1)
        # SIGTERM to the launcher: the ranks it ends are not restarted.
        self.clear()
        launcher = subprocess.Popen([sys.executable, LAUNCHER, "-n", "2", "--max-restarts", "3", "--restart-delay",
                                     "0", sys.executable, self.program, self.dir, "await-go", "await-go"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=self.env)
        try:
            poll_until(lambda: self.runs(0) and self.runs(1), 20, "the ranks did not start")
            launcher.send_signal(signal.SIGTERM)
            _, err = launcher.communicate(timeout=20)
        finally:
            if launcher.poll() is None:
                launcher.kill()
                launcher.communicate()
        self.assertEqual(launcher.returncode, 128 + signal.SIGTERM, err)
        self.assertNotIn("restart", err)
        self.assertEqual([len(self.runs(r)) for r in (0, 1)], [1, 1])

    def test_bad_values_exit_2_naming_the_option(self):
        for args, message in ((["--max-restarts", "-1"], "--max-restarts -1: give 0 or more"),
                              (["--max-restarts", "x"], "--max-restarts"),
                              (["--restart-delay", "-0.5"], "--restart-delay -0.5: give a number of seconds"),
                              (["--restart-delay", "nan"], "--restart-delay nan"),
                              (["--restart-delay", "inf"], "--restart-delay inf")):
            with self.subTest(args=args):
                code, _, err, _ = run("-n", "2", *args, "true")
                self.assertEqual(code, 2, err)
                self.assertIn("usage:", err)
                self.assertIn(message, err)


class MultiNode(unittest.TestCase):
    """--nnodes: one launcher per node; here every "node" is this machine (the namespace tests
    in tests/cluster_ns run them on emulated hosts)."""
    NAMES = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "GROUP_WORLD_SIZE",
             "MASTER_ADDR", "MASTER_PORT", "GRADWIRE_JOB_TOKEN"]

    def nodes(self, counts, per_node, env):
        program = "import json, os; print(json.dumps({n: os.environ.get(n) for n in %r}))" % self.NAMES
        seen, errs = [], []
        for node in range(len(counts)):
            code, out, err, _ = run("--nnodes", str(len(counts)), "--node-rank", str(node), "--nproc-per-node",
                                    per_node, "--master-addr", "127.0.0.1", "--master-port", "29999",
                                    sys.executable, "-c", program, env=env)
            self.assertEqual(code, 0, err)
            seen += [json.loads(line.split(" ", 1)[1]) for line in out.splitlines()]
            errs.append(err)
        return seen, errs

    def test_uneven_nodes_get_torchrun_variables(self):
        env = {k: v for k, v in os.environ.items() if k != "GRADWIRE_JOB_TOKEN"}
        counts = [1, 2, 3]
        seen, errs = self.nodes(counts, "1,2,3", env)
        self.assertEqual(sorted(int(v["RANK"]) for v in seen), list(range(6)))
        offsets = [0, 1, 3]
        for v in seen:
            node = int(v["NODE_RANK"])
            self.assertEqual(v["GROUP_RANK"], v["NODE_RANK"])
            self.assertEqual(int(v["RANK"]), offsets[node] + int(v["LOCAL_RANK"]))
            self.assertEqual(int(v["LOCAL_WORLD_SIZE"]), counts[node])
            self.assertEqual((v["WORLD_SIZE"], v["GROUP_WORLD_SIZE"], v["MASTER_PORT"]), ("6", "3", "29999"))
        # No token given: every node derives the same one, and says that it is not a secret.
        self.assertEqual(len({v["GRADWIRE_JOB_TOKEN"] for v in seen}), 1)
        self.assertRegex(seen[0]["GRADWIRE_JOB_TOKEN"], r"^[0-9a-f]{32}$")
        for node, err in enumerate(errs):
            self.assertIn(f"GRADWIRE_JOB_TOKEN is not set: node {node} derives the job token", err)

    def test_a_given_token_is_used_and_one_count_means_every_node(self):
        seen, errs = self.nodes([2, 2], "2", dict(os.environ, GRADWIRE_JOB_TOKEN="secret"))
        self.assertEqual(sorted((v["NODE_RANK"], v["RANK"], v["LOCAL_RANK"]) for v in seen),
                         [("0", "0", "0"), ("0", "1", "1"), ("1", "2", "0"), ("1", "3", "1")])
        self.assertTrue(all(v["GRADWIRE_JOB_TOKEN"] == "secret" and v["WORLD_SIZE"] == "4" for v in seen))
        self.assertFalse(any("derives" in e for e in errs))

    def test_failure_names_the_global_rank(self):
        code, _, err, _ = run("--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2", "--master-port", "29999",
                              "sh", "-c", 'test "$LOCAL_RANK" = 1 && exit 5; sleep 30')
        self.assertEqual(code, 5, err)
        self.assertIn("gradwire-run: rank 3 exited with status 5; stopping the other ranks", err)

    def test_bad_multi_node_usage(self):
        cases = {("--nnodes", "2", "--nproc-per-node", "2", "--master-port", "1"): "needs --node-rank",
                 ("--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "2"): "needs --master-port",
                 ("--nnodes", "2", "--node-rank", "2", "--nproc-per-node", "2", "--master-port", "1"): "out of range",
                 ("--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "1,2,3", "--master-port", "1"): "3 counts",
                 ("--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "1,0", "--master-port", "1"): "at least 1",
                 ("-n", "2", "--nproc-per-node", "2"): "not both",
                 ("--nnodes", "2", "--node-rank", "0", "-n", "2", "--ps", "1", "--master-port", "1"): "GRADWIRE_NUM_PS"}
        for args, message in cases.items():
            with self.subTest(args=args):
                code, _, err, _ = run(*args, "true")
                self.assertEqual(code, 2, err)
                self.assertIn(message, err)


class DerivedPort(unittest.TestCase):
    """The port and token cluster::detect() derives from mpirun's and Slurm's job ids
    (launching.md), against the documented formula computed here."""
    CLEAN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GRADWIRE_JOB_TOKEN",
             "GRADWIRE_NUM_PS", "TF_CONFIG")

    def setUp(self):
        self.print_spec = os.environ.get("GRADWIRE_TEST_PRINT_SPEC")
        if not self.print_spec:
            self.skipTest("GRADWIRE_TEST_PRINT_SPEC (tests/cluster/print_spec) is not set")
        self.env = {k: v for k, v in os.environ.items()
                    if k not in self.CLEAN and not k.startswith(("SLURM_", "OMPI_", "PMIX_"))}

    @staticmethod
    def fields(line):
        return dict(re.findall(r"(\w+)=(\S*)", line))

    def test_slurm_port_and_token_follow_the_documented_formula(self):
        # "the port is 20000 + FNV-1a-64("slurm:" + SLURM_JOB_ID + "." + SLURM_STEP_ID) % 10000,
        # and the token slurm:<job id>.<step id>"; ranks of one step agree, steps differ.
        rng = random.Random()
        jobs = [(str(rng.randrange(1, 10**7)), str(rng.randrange(0, 100))) for _ in range(4)]
        ports = set()
        for job, step in jobs:
            for rank in (0, 1):
                env = dict(self.env, SLURM_PROCID=str(rank), SLURM_NTASKS="2", SLURM_LOCALID=str(rank),
                           SLURM_NODEID="0", SLURM_TASKS_PER_NODE="2", SLURM_JOB_ID=job, SLURM_STEP_ID=step)
                p = subprocess.run([self.print_spec], capture_output=True, text=True, env=env, timeout=30)
                self.assertEqual(p.returncode, 0, p.stderr)
                got = self.fields(p.stdout)
                with self.subTest(job=job, step=step, rank=rank):
                    self.assertEqual(got["source"], "slurm", p.stdout)
                    self.assertEqual(got["rank"], str(rank), p.stdout)
                    self.assertEqual(got["master"], f"127.0.0.1:{derived_port(f'slurm:{job}.{step}')}", p.stdout)
                    self.assertEqual(got["token"], f"slurm:{job}.{step}", p.stdout)
            ports.add(derived_port(f"slurm:{job}.{step}"))
        self.assertGreater(len(ports), 1, "four random jobs gave one port: the comparison proves little")

    def test_mpirun_port_and_token_follow_the_documented_formula(self):
        # "the port: 20000 + FNV-1a-64("openmpi:" + jobid) % 10000 ... the token:
        # openmpi:<jobid>:<OMPI_MCA_orte_precondition_transports>", jobid from
        # OMPI_MCA_ess_base_jobid (OpenMPI 4) or PMIX_NAMESPACE (OpenMPI 5). Each rank
        # writes what mpirun gave it and what detect() made of it.
        if shutil.which("mpirun") is None:
            self.skipTest("mpirun is not installed")
        with tempfile.TemporaryDirectory() as d:
            script = ('f="$1/$OMPI_COMM_WORLD_RANK"; printf "%s|%s|%s\\n" "$OMPI_MCA_ess_base_jobid" "$PMIX_NAMESPACE" '
                      '"$OMPI_MCA_orte_precondition_transports" > "$f.env"; exec "$2" > "$f.spec"')
            cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "sh", "-c", script, "sh", d,
                   self.print_spec]
            p = subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=60)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            for rank in (0, 1):
                with self.subTest(rank=rank):
                    jobid, namespace, secret = pathlib.Path(d, f"{rank}.env").read_text().rstrip("\n").split("|")
                    job = jobid or namespace
                    self.assertTrue(job, "mpirun exported no job id")
                    got = self.fields(pathlib.Path(d, f"{rank}.spec").read_text())
                    self.assertEqual(got["source"], "openmpi")
                    self.assertEqual(got["rank"], str(rank))
                    self.assertEqual(got["master"], f"127.0.0.1:{derived_port('openmpi:' + job)}")
                    self.assertEqual(got["token"], f"openmpi:{job}:{secret}" if secret else f"openmpi:{job}")


class Usage(unittest.TestCase):
    def test_bad_usage_exits_2(self):
        for args in (["true"], ["-n", "0", "true"], ["-n", "-1", "true"], ["-n", "two", "true"], ["-n", "2"],
                     ["-n", "2", "--"], ["-n", "2", "--master-port", "70000", "true"],
                     ["-n", "2", "--timeout", "0", "true"], ["-n", "2", "--bogus", "true"]):
            with self.subTest(args=args):
                code, _, err, _ = run(*args)
                self.assertEqual(code, 2, err)
                self.assertIn("usage:", err)

    def test_help(self):
        code, out, _, _ = run("--help")
        self.assertEqual(code, 0)
        self.assertIn("gradwire-run -n N", out)
        self.assertIn("--keep-going", out)
        self.assertIn("--max-restarts", out)
        self.assertIn("GRADWIRE_REJOIN=1", out)

    def test_program_options_are_not_the_launchers(self):
        code, out, err, _ = run("-n", "1", "sh", "-c", 'printf "%s\\n" "$*"', "sh", "-n", "5", "--timeout", "x")
        self.assertEqual(code, 0, err)
        self.assertEqual(out, "[0] -n 5 --timeout x\n")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    LAUNCHER = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
