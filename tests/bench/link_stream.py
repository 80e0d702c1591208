"""A plain TCP stream over a real link, the baseline of the buddy restore across hosts
(tests/bench/buddy_hosts.sh): what the link itself carries, memory to memory, with nothing
checked.

  link_stream.py recv --listen ADDR:PORT --streams N --mib S   (prints one JSON object)
  link_stream.py send --connect ADDR:PORT --streams N --mib S

The receiver takes N connections, each carrying S MiB into its part of a pre-faulted buffer
(recv_into, which releases the GIL), and prints {"streams", "bytes", "seconds" (first byte
received -> last), "bytes_per_s"}. It prints "listening" on stderr once it accepts. Exits 1 if a
stream ends short.
"""

import argparse
import json
import socket
import sys
import threading
import time


def recv(a):
    host, port = a.listen.rsplit(":", 1)
    per = a.mib << 20
    buf = bytearray(per * a.streams)
    buf[:] = b"\1" * len(buf)  # pre-faulted, as a restored model's tensors are
    view = memoryview(buf)
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((host, int(port)))
    server.listen(a.streams)
    print("listening", file=sys.stderr, flush=True)
    conns = [server.accept()[0] for _ in range(a.streams)]
    first, got = [], [0] * a.streams

    def take(i):
        part = view[i * per:(i + 1) * per]
        n = conns[i].recv_into(part[:1 << 20])
        first.append(time.perf_counter())
        while n and got[i] + n < per:
            got[i] += n
            n = conns[i].recv_into(part[got[i]:got[i] + (1 << 20)])
        got[i] += n

    threads = [threading.Thread(target=take, args=(i,)) for i in range(a.streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    end = time.perf_counter()
    if sum(got) != len(buf):
        sys.exit("link_stream: received %d of %d bytes" % (sum(got), len(buf)))
    seconds = end - min(first)
    print(json.dumps({"streams": a.streams, "bytes": len(buf), "seconds": seconds,
                      "bytes_per_s": len(buf) / seconds}))


def send(a):
    host, port = a.connect.rsplit(":", 1)
    data = memoryview(b"\x5a" * (a.mib << 20))
    conns = [socket.create_connection((host, int(port))) for _ in range(a.streams)]
    threads = [threading.Thread(target=c.sendall, args=(data,)) for c in conns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in conns:
        c.close()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["recv", "send"])
    p.add_argument("--listen", default="")
    p.add_argument("--connect", default="")
    p.add_argument("--streams", type=int, default=2)
    p.add_argument("--mib", type=int, default=256)
    a = p.parse_args()
    if a.streams < 1 or a.mib < 1:
        sys.exit("link_stream: --streams and --mib must be at least 1")
    (recv if a.mode == "recv" else send)(a)


if __name__ == "__main__":
    main()
