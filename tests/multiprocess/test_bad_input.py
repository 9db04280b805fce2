#!/usr/bin/env python3
"""Bad input over a network transport, in real processes (scripts/gradwire-run):

    test_bad_input.py LAUNCHER WORKER

a rank that builds another model gets, like every rank, a mismatch at construction naming both
models; a NaN gradient on one rank (finite check on) fails every rank within seconds, naming it.
"""
import os
import subprocess
import sys
import time
import unittest

from mp_support import rank_lines

LAUNCHER, WORKER = sys.argv[1], sys.argv[2]


def run(ranks, mode):
    cmd = [LAUNCHER, "-n", str(ranks), "--keep-going", "--", WORKER, mode]
    start = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120,
                       env=dict(os.environ, GRADWIRE_TIMEOUT="30"))
    return p.returncode, rank_lines(p.stdout), time.monotonic() - start, p.stdout


class BadInput(unittest.TestCase):
    def test_a_rank_with_another_model_fails_every_rank_at_construction(self):
        status, lines, took, out = run(3, "model")
        self.assertEqual(status, 0, out)
        for r in range(3):
            got = " ".join(lines.get(r, []))
            self.assertIn("ERROR mismatch between ranks", got, out)
            self.assertIn("rank 0 has 2 tensors of f32, 1017 elements: [1001], [4, 4]", got, out)
            self.assertIn("tensor 0 is [1001] on rank 0, [1000] on rank 1", got, out)
        self.assertLess(took, 20)  # at construction, not at a deadline

    def test_a_nan_gradient_on_one_rank_fails_every_rank_naming_it(self):
        status, lines, took, out = run(3, "nan")
        self.assertEqual(status, 0, out)
        for r in range(3):
            got = " ".join(lines.get(r, []))
            self.assertIn("strategy::step on rank 1: gradient 0 (parameter of shape [1001]) holds nan at element 123",
                          got, out)
            self.assertIn("ERROR invalid argument" if r == 1 else "ERROR peer lost", got, out)
        self.assertLess(took, 20)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + sys.argv[3:], verbosity=2)
