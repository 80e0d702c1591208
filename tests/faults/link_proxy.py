#!/usr/bin/env python3
"""A TCP proxy whose link a test cuts and restores: agents dial it instead of the coordinator.

    link_proxy.py --target=HOST:PORT [--listen=127.0.0.1:0]

SIGUSR1 cuts the link: every proxied connection is reset (both sides see the connection
drop) and the listening socket is closed, so new connections are refused as by a host that
is unreachable. SIGUSR2 restores it: the proxy listens again on the same port. SIGTERM stops
it. Each event is one line on stdout, flushed, for the test to wait on:

    link_proxy: listening on 127.0.0.1:PORT
    link_proxy: cut: reset N connection(s); refusing new ones
    link_proxy: restored: listening on 127.0.0.1:PORT

Python's asyncio only; no third-party package.
"""

import argparse
import asyncio
import signal
import socket
import sys


def say(line):
    print("link_proxy: " + line, flush=True)


class LinkProxy:
    def __init__(self, host, port, target_host, target_port):
        self.host = host
        self.port = port
        self.target = (target_host, target_port)
        self.server = None
        self.transports = set()  # every open socket of every proxied connection
        self.cut = False

    async def listen(self):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        self.server = await asyncio.start_server(self.handle, sock=sock)

    async def handle(self, client_reader, client_writer):
        if self.cut:  # accepted just before the cut closed the listener
            client_writer.transport.abort()
            return
        try:
            target_reader, target_writer = await asyncio.open_connection(*self.target)
        except OSError:
            client_writer.transport.abort()
            return
        pair = (client_writer.transport, target_writer.transport)
        self.transports.update(pair)
        try:
            await asyncio.gather(self.pipe(client_reader, target_writer),
                                 self.pipe(target_reader, client_writer))
        finally:
            self.transports.difference_update(pair)
            for t in pair:
                t.abort()

    @staticmethod
    async def pipe(reader, writer):
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            try:
                writer.write_eof()
            except (OSError, RuntimeError):
                pass

    async def cut_link(self):
        if self.cut:
            return
        self.cut = True
        self.server.close()  # closes the listening socket now; connections are reset below
        reset = list(self.transports)
        for t in reset:
            t.abort()
        self.transports.clear()
        say("cut: reset %d connection(s); refusing new ones" % (len(reset) // 2))

    async def restore_link(self):
        if not self.cut:
            return
        await self.listen()
        self.cut = False
        say("restored: listening on %s:%d" % (self.host, self.port))


async def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="HOST:PORT to forward to")
    parser.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT (port 0: any)")
    args = parser.parse_args()
    target_host, target_port = args.target.rsplit(":", 1)
    host, port = args.listen.rsplit(":", 1)
    proxy = LinkProxy(host, int(port), target_host, int(target_port))
    await proxy.listen()
    say("listening on %s:%d" % (proxy.host, proxy.port))

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    pending = set()

    def later(coro):
        task = loop.create_task(coro)
        pending.add(task)
        task.add_done_callback(pending.discard)

    loop.add_signal_handler(signal.SIGUSR1, lambda: later(proxy.cut_link()))
    loop.add_signal_handler(signal.SIGUSR2, lambda: later(proxy.restore_link()))
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    await stop.wait()
    say("stopped")


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(0)
