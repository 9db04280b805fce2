#!/usr/bin/env python3
"""A TCP stream between two emulated hosts, without iperf.

    tcp_probe.py serve ADDR PORT            accept one connection, print "received N bytes in S s"
    tcp_probe.py listen ADDR PORT           accept connections (and close them) until killed
    tcp_probe.py send ADDR PORT SECONDS     stream for SECONDS, print "sent N bytes in S s: R MB/s"
    tcp_probe.py connect ADDR PORT TIMEOUT  exit 0 if a connection opens within TIMEOUT s, else 3

MB is 10^6 bytes. Used by test_cluster.py (reachability, partitions) and to measure links.
"""
import socket
import sys
import time

CHUNK = bytes(1 << 20)


def serve(addr, port):
    with socket.create_server((addr, int(port))) as s:
        print("listening", flush=True)
        c, _ = s.accept()
        total, start = 0, time.monotonic()
        with c:
            while True:
                b = c.recv(1 << 20)
                if not b:
                    break
                total += len(b)
        took = time.monotonic() - start
        print(f"received {total} bytes in {took:.3f} s: {total / took / 1e6:.1f} MB/s", flush=True)


def listen(addr, port):
    with socket.create_server((addr, int(port))) as s:
        print("listening", flush=True)
        while True:
            s.accept()[0].close()


def send(addr, port, seconds):
    with socket.create_connection((addr, int(port)), timeout=10) as c:
        total, start = 0, time.monotonic()
        end = start + float(seconds)
        while time.monotonic() < end:
            c.sendall(CHUNK)
            total += len(CHUNK)
        c.shutdown(socket.SHUT_WR)
        c.recv(1)  # the receiver's close: everything arrived
        took = time.monotonic() - start
    print(f"sent {total} bytes in {took:.3f} s: {total / took / 1e6:.1f} MB/s", flush=True)


def connect(addr, port, timeout):
    try:
        socket.create_connection((addr, int(port)), timeout=float(timeout)).close()
        print("connected", flush=True)
        return 0
    except OSError as e:
        print(f"no connection: {e}", flush=True)
        return 3


if __name__ == "__main__":
    verbs = {"serve": serve, "listen": listen, "send": send, "connect": connect}
    if len(sys.argv) < 2 or sys.argv[1] not in verbs:
        sys.exit(__doc__)
    sys.exit(verbs[sys.argv[1]](*sys.argv[2:]) or 0)
