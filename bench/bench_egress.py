"""Egress broker vs the same request made directly by the host with the same client (http.client, a new
connection per request, as the broker makes), against a loopback server: p50 per request for 1 KB and
1 MB bodies, and throughput with 8 concurrent executions. Loopback only; every loop is bounded.

Then the same through a sandbox (``--backend``, default subprocess; ``none`` skips it): a program calls
``fetch()`` in a loop and times each call itself (``time.perf_counter`` inside the sandbox: the frame out,
the broker's request, the reply and its raw body frame back), against the host's own request timed the same
way; and 8 sandboxes fetching at once against 8 host threads (requests per second between the first
request's start and the last one's end, seen by the host).

    python bench/bench_egress.py [--rounds N] [--backend subprocess|docker|gvisor|runc|runsc|none]
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing
import statistics
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sandforge.runtime.egress import EgressBroker, EgressPolicy, EgressSection, FetchRequest
from sandforge.sandbox import ExecutionRequest, Limits, Sandbox, SandboxConfig
from sandforge.sandbox.exchange import no_bridge
from sandforge.sandbox.protocol import BridgeReply, CallFrame

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
    parser.add_argument("--backend", default="subprocess")
    parser.add_argument("--server-thread", action="store_true", help="serve from a thread of this process")
    args = parser.parse_args()
    server = _Server(("127.0.0.1", 0), _Handler)
    port = server.server_address[1]
    # By default the server is a process of its own, as a real one is: in a thread here it would compete for
    # this process's GIL with the broker (and with the direct client), which measures the GIL, not the path.
    serving: Any = None
    if args.server_thread:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    else:
        serving = multiprocessing.get_context("fork").Process(target=server.serve_forever, daemon=True)
        serving.start()
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
    if args.backend != "none":
        through_sandbox(broker, port, args.rounds, args.backend, direct)
    if serving is not None:
        serving.terminate()
        serving.join(5)
    else:
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


# --------------------------------------------------------------------------------- through a sandbox
LIMITS = Limits(timeout_s=300, memory_mb=512, disk_mb=4)
#: Each program times its own fetches (the sandbox's clock), after one warm-up fetch.
LOOP = """
import time
spent = []
fetch(args[0])
for _ in range(args[1]):
    began = time.perf_counter()
    response = fetch(args[0])
    spent.append(time.perf_counter() - began)
    if len(response.content) != args[2]:
        raise ValueError("short body")
return spent
"""


class Bridge:
    """One broker session per execution; the body travels raw (``egress_parts``) unless ``base64``."""

    def __init__(self, broker: EgressBroker, *, base64: bool = False) -> None:
        self.broker, self.base64 = broker, base64
        self.session: Any = None
        self.first = self.last = 0.0
        self.count = 0

    def __call__(self, call: CallFrame) -> BridgeReply:
        return no_bridge(call)

    def _session(self, deadline: float) -> Any:
        if self.session is None:
            self.session = self.broker.session(deadline=deadline)
        return self.session

    def egress_parts(self, request: bytes, deadline: float) -> tuple[bytes, bytes | None]:
        began = time.monotonic()
        if self.base64:
            reply: tuple[bytes, bytes | None] = (self._session(deadline).handle(request), None)
        else:
            reply = self._session(deadline).handle_parts(request)
        self.first = self.first or began
        self.last, self.count = time.monotonic(), self.count + 1
        return reply


def _sandbox_p50(
    sandbox: Sandbox, broker: EgressBroker, url: str, size: int, count: int, *, base64: bool
) -> list[float]:
    request = ExecutionRequest(code=LOOP, args=[url, count, size], limits=LIMITS)
    out = sandbox.execute(request, bridge=Bridge(broker, base64=base64))
    if not out.ok:
        raise RuntimeError(f"bench program failed: {out.error_type}: {out.error_message}")
    assert isinstance(out.value, list)
    return [float(v) for v in out.value if isinstance(v, int | float)]


def through_sandbox(
    broker: EgressBroker, port: int, rounds: int, backend: str, direct: Callable[[int, str], int]
) -> None:
    """p50 per request through a sandbox (raw body frame, and base64 in the JSON reply) vs the host's own
    request; then 8 sandboxes at once vs 8 host threads."""
    with Sandbox(SandboxConfig(backend=backend, pool_size=0)) as sandbox:
        print(f"through a sandbox ({backend}): fetch() timed inside the program, the host's request on the host")
        print(f"{'size':>5} {'direct p50':>11} {'sandbox p50':>12} {'ratio':>6} {'base64 p50':>11} {'ratio':>6}")
        for size, nbytes in SIZES.items():
            url = f"http://bench.test:{port}/{size}"
            count = rounds if size == "1KB" else max(20, rounds // 4)
            chunk = max(10, count // 5)
            timings: dict[str, list[float]] = {"direct": [], "sandbox": [], "base64": []}
            for _ in range(max(1, count // chunk)):  # interleaved chunks: drift in load hits all alike
                for _ in range(chunk):
                    began = time.perf_counter()
                    direct(port, size)
                    timings["direct"].append(time.perf_counter() - began)
                timings["sandbox"] += _sandbox_p50(sandbox, broker, url, nbytes, chunk, base64=False)
                timings["base64"] += _sandbox_p50(sandbox, broker, url, nbytes, chunk, base64=True)
            p50 = {name: statistics.median(values) * 1000 for name, values in timings.items()}
            print(
                f"{size:>5} {p50['direct']:>9.3f}ms {p50['sandbox']:>10.3f}ms {p50['sandbox'] / p50['direct']:>5.2f}x "
                f"{p50['base64']:>9.3f}ms {p50['base64'] / p50['direct']:>5.2f}x"
            )
        _concurrent(sandbox, broker, port, max(20, rounds // 2), direct)


def _concurrent(sandbox: Sandbox, broker: EgressBroker, port: int, per: int, direct: Callable[[int, str], int]) -> None:
    url = f"http://bench.test:{port}/1KB"
    bridges = [Bridge(broker) for _ in range(8)]

    def run(bridge: Bridge) -> None:
        request = ExecutionRequest(code=LOOP, args=[url, per, 1024], limits=LIMITS)
        out = sandbox.execute(request, bridge=bridge)
        if not out.ok:
            raise RuntimeError(f"bench program failed: {out.error_type}: {out.error_message}")

    threads = [threading.Thread(target=run, args=(bridge,)) for bridge in bridges]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    span = max(b.last for b in bridges) - min(b.first for b in bridges)
    sandboxed = sum(b.count for b in bridges) / span

    marks: list[tuple[float, float]] = []

    def host() -> None:
        began = time.monotonic()
        for _ in range(per + 1):
            direct(port, "1KB")
        marks.append((began, time.monotonic()))

    host_threads = [threading.Thread(target=host) for _ in range(8)]
    for thread in host_threads:
        thread.start()
    for thread in host_threads:
        thread.join()
    hosted = 8 * (per + 1) / (max(m[1] for m in marks) - min(m[0] for m in marks))
    print(
        f"8 concurrent, 1KB: host {hosted:.0f} requests/s, 8 sandboxes {sandboxed:.0f} requests/s "
        f"({sandboxed / hosted:.2f}x)"
    )


if __name__ == "__main__":
    main()
