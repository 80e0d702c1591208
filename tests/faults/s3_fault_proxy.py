#!/usr/bin/env python3
"""An HTTP proxy in front of a real S3 server that answers chosen requests with 503 SlowDown, and
holds chosen requests until enough of them arrived to send them on together (a race on demand).

Usage: s3_fault_proxy.py BACKEND_URL PORT_FILE CONTROL_FILE

Forwards every request to BACKEND_URL unchanged (method, path and query, every header — the
Host header too, so SigV4 signatures still verify — and the body), and the answer back. When
CONTROL_FILE holds a number N > 0, the next N requests are answered 503 with S3's SlowDown
error instead (their bodies read and dropped), and N counts down in the file; the count of
503s served so far is appended to CONTROL_FILE + ".served", one line per 503. Writes its port
to PORT_FILE once it listens. Runs until killed.

Rendezvous: when CONTROL_FILE + ".hold" holds "N REGEX", requests whose "METHOD PATH" matches
REGEX wait until N of them are waiting (or 60 s passed), then all go on at once; each arrival
is appended to CONTROL_FILE + ".held" ("METHOD PATH"), and "timeout" if the wait ran out. Two
processes whose requests meet there have both done everything before those requests: the
race between them is then one the server alone decides.
"""
import http.client
import http.server
import os
import re
import sys
import threading
import urllib.parse

SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
             b'<Message>Please reduce your request rate.</Message></Error>')
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"}


def main():
    backend = urllib.parse.urlsplit(sys.argv[1])
    port_file, control = sys.argv[2], sys.argv[3]
    lock = threading.Lock()

    def take_failure():
        with lock:
            try:
                with open(control) as f:
                    left = int(f.read().strip() or "0")
            except (OSError, ValueError):
                return False
            if left <= 0:
                return False
            with open(control, "w") as f:
                f.write(str(left - 1))
            with open(control + ".served", "a") as f:
                f.write("503\n")
            return True

    # The rendezvous: one round of N held requests at a time.
    hold = {"waiting": 0, "round": 0}
    arrived = threading.Condition(lock)

    def rendezvous(request_line):
        try:
            with open(control + ".hold") as f:
                count, pattern = f.read().strip().split(" ", 1)
        except (OSError, ValueError):
            return
        if not re.search(pattern, request_line):
            return
        with arrived:
            with open(control + ".held", "a") as f:
                f.write(request_line + "\n")
            my_round = hold["round"]
            hold["waiting"] += 1
            if hold["waiting"] >= int(count):
                hold["waiting"] = 0
                hold["round"] += 1
                arrived.notify_all()
                return
            if not arrived.wait_for(lambda: hold["round"] != my_round, timeout=60):
                hold["waiting"] -= 1
                with open(control + ".held", "a") as f:
                    f.write("timeout\n")

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):
            pass

        def _body(self):
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""

        def _reply(self, status, headers, body):
            self.send_response(status)
            length = str(len(body))
            for name, value in headers:
                if name.lower() == "content-length":
                    if self.command == "HEAD":
                        length = value  # the object's size, not this empty body's
                elif name.lower() not in HOP_BY_HOP:
                    self.send_header(name, value)
            self.send_header("Content-Length", length)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _handle(self):
            body = self._body()
            rendezvous("%s %s" % (self.command, self.path))
            if take_failure():
                self._reply(503, [("Content-Type", "application/xml")], SLOW_DOWN)
                return
            conn = http.client.HTTPConnection(backend.hostname, backend.port, timeout=120)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                conn.request(self.command, self.path, body=body, headers=headers)
                answer = conn.getresponse()
                data = answer.read()
                self._reply(answer.status, answer.getheaders(), data)
            except OSError as e:
                self._reply(502, [("Content-Type", "text/plain")], str(e).encode())
            finally:
                conn.close()

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    with open(port_file + ".tmp", "w") as f:
        f.write(str(server.server_address[1]))
    os.rename(port_file + ".tmp", port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
