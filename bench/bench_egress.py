"""Egress broker vs the same request made directly by the host with the same client (http.client, a new
connection per request, as the broker makes), against a loopback server: p50 per request for 1 KB and
1 MB bodies, and throughput with 8 concurrent executions. Loopback only; every loop is bounded.

    python bench/bench_egress.py [--rounds N]
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sandforge.runtime.egress import EgressBroker, EgressPolicy, EgressSection, FetchRequest

SIZES = {"1KB": 1024, "1MB": 1024 * 1024}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        body = b"x" * SIZES[self.path.strip("/")]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128


def direct(port: int, size: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", f"/{size}", headers={"Connection": "close"})
        return len(conn.getresponse().read())
    finally:
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    server = _Server(("127.0.0.1", 0), _Handler)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    section = EgressSection.model_validate(
        {
            "allow": [{"url": f"http://bench.test:{port}/**"}],
            "allow_ranges": ["127.0.0.1/32"],
            "resolve": {"bench.test": "127.0.0.1"},
            "limits": {"max_requests": 10_000, "max_total_bytes": 4 * 1024**3},
        }
    )
    broker = EgressBroker(EgressPolicy().merge(section))
    latency(broker, port, args.rounds)
    concurrency(broker, port, max(10, args.rounds // 4))
    server.shutdown()


def latency(broker: EgressBroker, port: int, rounds: int) -> None:
    """p50 per request, direct vs through the broker vs through its JSON wire, per body size."""
    session = broker.session()

    def brokered(size: str) -> int:
        return len(session.fetch(FetchRequest.of(f"http://bench.test:{port}/{size}")).body_b64)

    def wire(size: str) -> int:
        return len(session.handle(FetchRequest.of(f"http://bench.test:{port}/{size}").model_dump_json()))

    print(f"{'size':>5} {'direct p50':>11} {'broker p50':>11} {'ratio':>6} {'wire p50':>9} {'ratio':>6}")
    for size in SIZES:
        count = rounds if size == "1KB" else max(20, rounds // 4)
        timings: dict[str, list[float]] = {"direct": [], "broker": [], "wire": []}
        calls: dict[str, Callable[[], int]] = {
            "direct": lambda size=size: direct(port, size),  # type: ignore[misc]
            "broker": lambda size=size: brokered(size),  # type: ignore[misc]
            "wire": lambda size=size: wire(size),  # type: ignore[misc]
        }
        for _ in range(count):  # interleaved, so drift in machine load hits all three alike
            for name, call in calls.items():
                start = time.perf_counter()
                call()
                timings[name].append(time.perf_counter() - start)
        p50 = {name: statistics.median(values) * 1000 for name, values in timings.items()}
        print(
            f"{size:>5} {p50['direct']:>9.3f}ms {p50['broker']:>9.3f}ms {p50['broker'] / p50['direct']:>5.2f}x "
            f"{p50['wire']:>7.3f}ms {p50['wire'] / p50['direct']:>5.2f}x"
        )


def concurrency(broker: EgressBroker, port: int, per_thread: int) -> None:
    """Requests per second with 8 threads (each its own broker session, as 8 executions), direct vs broker."""
    for name in ("direct", "broker"):

        def worker(name: str = name) -> None:
            own = broker.session()
            for _ in range(per_thread):
                if name == "direct":
                    direct(port, "1KB")
                else:
                    own.fetch(FetchRequest.of(f"http://bench.test:{port}/1KB"))

        threads = [threading.Thread(target=worker) for _ in range(8)]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - start
        print(f"8 concurrent, 1KB, {name}: {8 * per_thread / elapsed:.0f} requests/s")


if __name__ == "__main__":
    main()
