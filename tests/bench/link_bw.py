"""Loopback TCP bandwidth: the link a buddy restore crosses on one machine (figure 4m).

STREAMS connections at once each send MIB MiB from memory to a receiver that reads into a
preallocated buffer; prints {"streams", "bytes", "seconds", "bytes_per_s"} as JSON (the best
of REPEATS runs). Usage: link_bw.py [--streams=2] [--mib=256] [--repeats=3]
"""
import argparse
import json
import socket
import threading
import time


def run(streams, nbytes):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(streams)
    port = listener.getsockname()[1]
    payload = memoryview(bytearray(b"\x5a" * (4 << 20)))

    def receive(conn):
        buf = bytearray(4 << 20)
        view = memoryview(buf)
        left = nbytes
        while left > 0:
            n = conn.recv_into(view, min(len(buf), left))
            if n == 0:
                break
            left -= n
        conn.close()

    def send():
        s = socket.create_connection(("127.0.0.1", port))
        left = nbytes
        while left > 0:
            n = min(len(payload), left)
            s.sendall(payload[:n])
            left -= n
        s.close()

    accepted = []

    def accept():
        for _ in range(streams):
            conn, _ = listener.accept()
            t = threading.Thread(target=receive, args=(conn,))
            t.start()
            accepted.append(t)

    acceptor = threading.Thread(target=accept)
    acceptor.start()
    start = time.perf_counter()
    senders = [threading.Thread(target=send) for _ in range(streams)]
    for t in senders:
        t.start()
    for t in senders:
        t.join()
    acceptor.join()
    for t in accepted:
        t.join()
    elapsed = time.perf_counter() - start
    listener.close()
    return elapsed


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--streams", type=int, default=2)
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    nbytes = a.mib << 20
    best = min(run(a.streams, nbytes) for _ in range(a.repeats))
    total = nbytes * a.streams
    print(json.dumps({"streams": a.streams, "bytes": total, "seconds": best,
                      "bytes_per_s": total / best}))


if __name__ == "__main__":
    main()
