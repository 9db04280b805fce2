#!/usr/bin/env python3
"""Runs a command in a network namespace of its own: loopback up, and the given sysctls
set there only (net.* sysctls belong to the namespace; the host's are untouched).

    in_netns.py [--sysctl KEY=VALUE]... -- COMMAND [ARGS...]

For a test that needs the kernel's network to behave otherwise than the host's does,
e.g. net.ipv4.tcp_syn_retries=1 so that a connect the peer never answers fails with
ETIMEDOUT after 3 s instead of 2 minutes. Exits 77 (ctest: skipped, never passed) where
a namespace cannot be made: not root, no unshare(2), or no `ip`.
"""
import ctypes
import os
import shutil
import subprocess
import sys

SKIP = 77
CLONE_NEWNET = 0x40000000


def main(argv):
    if "--" not in argv:
        sys.exit("usage: in_netns.py [--sysctl KEY=VALUE]... -- COMMAND [ARGS...]")
    split = argv.index("--")
    options, command = argv[:split], argv[split + 1:]
    sysctls = []
    while options:
        if options[0] != "--sysctl" or len(options) < 2 or "=" not in options[1]:
            sys.exit(f"in_netns.py: expected --sysctl KEY=VALUE, got {options[0]!r}")
        sysctls.append(options[1].split("=", 1))
        options = options[2:]
    if not command:
        sys.exit("in_netns.py: no command to run")
    if os.geteuid() != 0 or shutil.which("ip") is None:
        print("in_netns.py: skipped: a network namespace needs root and iproute2's `ip`", flush=True)
        return SKIP
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        print(f"in_netns.py: skipped: unshare(CLONE_NEWNET): {os.strerror(ctypes.get_errno())}", flush=True)
        return SKIP
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    for key, value in sysctls:
        path = "/proc/sys/" + key.replace(".", "/")
        with open(path, "w") as f:
            f.write(value)
        with open(path) as f:
            if f.read().strip() != value:
                sys.exit(f"in_netns.py: {key} did not take the value {value}")
    os.execvp(command[0], command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
