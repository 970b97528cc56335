"""The load itself: sources that keep requests going and record their outcomes.

A `LocalSource` runs in the calling event loop; a `ProcessSource` runs a `LocalSource` in a
worker process (multiprocessing, spawn) and is driven over a pipe. Requests are encoded
once, before the load starts (over HTTP the whole request, headers included: see
`inferd_tools.bench.http`); the hot path only sends bytes and records a time. A run with
several requests (a perf_analyzer `--input-data` file's entries) sends them in turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import random
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import orjson

from inferd_tools.bench.http import HttpConnection, HttpError, build_request, endpoint
from inferd_tools.bench.stats import SUCCESS, Samples

GRPC_INFER = "/inference.GRPCInferenceService/ModelInfer"
GRPC_OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]


@dataclass(frozen=True)
class Target:
    """Where and what to send: everything a worker process needs (picklable)."""

    protocol: str  # "http" or "grpc"
    address: str  # http: http://host:port; grpc: host:port
    model: str
    version: str
    bodies: tuple[bytes, ...]  # sent in turn, request by request
    # HTTP: each body's headers (a binary body's own Inference-Header-Content-Length).
    headers: tuple[dict[str, str], ...] = ()
    timeout_s: float = 60.0
    max_connections: int = 256  # open loop: requests past it wait in the client (and count)

    @property
    def infer_path(self) -> str:
        version = f"/versions/{self.version}" if self.version else ""
        return f"/v2/models/{self.model}{version}/infer"

    @property
    def infer_url(self) -> str:
        return f"{self.address}{self.infer_path}"


@dataclass(frozen=True)
class Load:
    """Closed loop: `concurrency` requests always outstanding. Open loop: `rate` requests a
    second, evenly spaced (first one `phase_s` after start) or Poisson."""

    concurrency: int = 0
    rate: float = 0.0
    poisson: bool = False
    phase_s: float = 0.0
    seed: int = 0
    # This source's share of several (worker `part` of `parts`): it starts its turn through
    # the requests at its own offset, so the sources do not send the same ones in step.
    part: int = 0
    parts: int = 1


class LocalSource:
    def __init__(self, target: Target) -> None:
        self.target = target
        self.samples = Samples()
        self._tasks: set[asyncio.Task[None]] = set()
        self._running = False
        self._channel: Any = None
        self._infer: Any = None
        # The requests, sent in turn (HTTP: whole requests; gRPC: messages), and the next's.
        self._requests: tuple[bytes, ...] = ()
        self._next = 0
        # HTTP: idle keep-alive connections (LIFO), all open ones, and their timeout watch.
        self._idle: list[HttpConnection] = []
        self._conns: set[HttpConnection] = set()
        self._watchdog: asyncio.Task[None] | None = None

    async def open(self) -> None:
        if self.target.protocol == "grpc":
            import grpc

            self._channel = grpc.aio.insecure_channel(self.target.address, options=GRPC_OPTIONS)
            # No serializers: the request is sent as the bytes encoded once, and the response
            # is not parsed (a load generator only needs the status).
            self._infer = self._channel.unary_unary(GRPC_INFER)
            self._requests = self.target.bodies
        else:
            self._endpoint = endpoint(self.target.address)
            t = self.target
            headers = t.headers or ({},) * len(t.bodies)
            self._requests = tuple(
                build_request(t.address, t.infer_path, body, h)
                for body, h in zip(t.bodies, headers, strict=True)
            )
            self._watchdog = asyncio.get_running_loop().create_task(self._watch_timeouts())

    async def close(self) -> None:
        await self.stop()
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(BaseException):
                await self._watchdog
            self._watchdog = None
        for conn in self._conns:
            conn.close()
        self._conns.clear()
        self._idle.clear()
        if self._channel is not None:
            await self._channel.close()

    # --- sending ---------------------------------------------------------------------

    def _take(self) -> bytes:
        """The next request in turn."""
        requests = self._requests
        index = self._next
        self._next = index + 1 if index + 1 < len(requests) else 0
        return requests[index]

    async def _connect(self) -> HttpConnection:
        host, port, ssl_context = self._endpoint
        _, conn = await asyncio.wait_for(
            asyncio.get_running_loop().create_connection(
                HttpConnection, host, port, ssl=ssl_context
            ),
            self.target.timeout_s,
        )
        self._conns.add(conn)
        return conn

    async def _send_http(self) -> str:
        idle = self._idle
        conn = None
        while idle:
            conn = idle.pop()
            if not conn.closed:
                break
            self._conns.discard(conn)
            conn = None
        if conn is None:
            try:
                conn = await self._connect()
            except (OSError, TimeoutError):
                return "connection_error"
        try:
            status = await conn.request(self._take())
        except TimeoutError:
            self._conns.discard(conn)
            return "timeout"
        except (HttpError, OSError):
            self._conns.discard(conn)
            conn.close()
            return "connection_error"
        except BaseException:  # cancelled mid-request: the connection is unusable
            self._conns.discard(conn)
            conn.close()
            raise
        outcome = str(status)
        if outcome not in SUCCESS:
            self.samples.note_error(f"{outcome}: {_error_message(conn.error_body)}")
        if conn.closed:
            self._conns.discard(conn)
        else:
            idle.append(conn)
        return outcome

    async def _watch_timeouts(self) -> None:
        """Fail requests that have waited longer than the timeout (checked a few times a
        second: cheaper than a timer per request)."""
        timeout = self.target.timeout_s
        interval = min(0.25, timeout / 4)
        while True:
            await asyncio.sleep(interval)
            now = time.perf_counter()
            for conn in list(self._conns):
                if conn.busy and now - conn.started > timeout:
                    self._conns.discard(conn)
                    conn.timed_out()

    async def _send_grpc(self) -> str:
        import grpc

        try:
            await self._infer(self._take(), timeout=self.target.timeout_s)
        except grpc.aio.AioRpcError as e:
            code = str(e.code().name)
            self.samples.note_error(f"{code}: {e.details() or ''}")
            return code
        return "OK"

    def _record(self, outcome: str, latency_s: float) -> None:
        samples = self.samples
        samples.outcomes[outcome] += 1
        if outcome in SUCCESS:
            samples.latencies.append(latency_s)

    async def _closed_loop(self) -> None:
        send = self._send_grpc if self.target.protocol == "grpc" else self._send_http
        clock = time.perf_counter
        while self._running:
            self.samples.sent += 1
            started = clock()
            outcome = await send()
            self._record(outcome, clock() - started)

    async def _one(self, intended: float, limiter: asyncio.Semaphore) -> None:
        send = self._send_grpc if self.target.protocol == "grpc" else self._send_http
        async with limiter:
            if not self._running:
                return  # stopped while waiting for a connection: never sent
            outcome = await send()
        # From the *intended* send time: time spent waiting for the client (a connection,
        # a late timer) or for a stalled server counts, so no coordinated omission.
        self._record(outcome, time.perf_counter() - intended)

    async def _open_loop(self, load: Load) -> None:
        rng = random.Random(load.seed)
        limiter = asyncio.Semaphore(self.target.max_connections)
        gap = 1.0 / load.rate
        clock = time.perf_counter
        next_send = clock() + load.phase_s
        while self._running:
            now = clock()
            while next_send <= now:
                self.samples.sent += 1
                self._spawn(self._one(next_send, limiter))
                next_send += rng.expovariate(load.rate) if load.poisson else gap
            await asyncio.sleep(max(0.0, next_send - clock()))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- control ---------------------------------------------------------------------

    async def start(self, load: Load) -> None:
        await self.stop()
        self._running = True
        self._next = len(self._requests) * load.part // load.parts
        if load.rate > 0:
            self._spawn(self._open_loop(load))
        else:
            for _ in range(load.concurrency):
                self._spawn(self._closed_loop())

    def drain(self) -> Samples:
        """What was recorded since the last drain."""
        samples, self.samples = self.samples, Samples()
        return samples

    async def stop(self, grace_s: float = 1.0) -> Samples:
        """Send nothing more, give the requests in flight `grace_s` to finish (so the server
        does not see them cancelled), cancel the rest, and drain. Nothing done after the
        last drain is measured; the next drain starts clean."""
        self._running = False
        tasks = list(self._tasks)
        if tasks:
            await asyncio.wait(tasks, timeout=grace_s)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        self._tasks.clear()
        return self.drain()


def _error_message(body: bytes) -> str:
    """An error response's message: its JSON `error` field (KServe v2, Triton), else the text."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:  # not JSON, or cut short at the bytes kept
        doc = None
    if isinstance(doc, dict) and "error" in doc:
        return str(doc["error"])
    return body.decode(errors="replace").strip()


# --- worker processes ------------------------------------------------------------------


def _worker(conn: Connection, target: Target) -> None:
    factory = None
    if target.protocol == "http":
        try:
            import uvloop

            factory = uvloop.new_event_loop
        except ImportError:  # pragma: no cover - uvicorn[standard] brings uvloop
            pass
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(_serve(conn, target))


async def _serve(conn: Connection, target: Target) -> None:
    source = LocalSource(target)
    await source.open()
    loop = asyncio.get_running_loop()
    conn.send("ready")
    while True:
        command, arg = await loop.run_in_executor(None, conn.recv)
        try:
            if command == "start":
                await source.start(arg)
                conn.send(None)
            elif command == "drain":
                conn.send(source.drain())
            elif command == "stop":
                conn.send(await source.stop())
            else:  # "close"
                await source.close()
                conn.send(None)
                return
        except Exception as e:  # report, don't hang the parent
            conn.send(e)


class ProcessSource:
    """A LocalSource in its own process (spawned), driven over a pipe."""

    def __init__(self, target: Target) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_worker, args=(child, target), daemon=True)
        # Started with SIGINT ignored (it stays ignored across the spawn): a terminal's
        # Ctrl-C reaches the whole process group, and it is the parent's to act on, which
        # then stops its workers over the pipe and reports the levels measured so far.
        if threading.current_thread() is threading.main_thread():
            handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
            try:
                self._proc.start()
            finally:
                signal.signal(signal.SIGINT, handler)
        else:  # signal handlers can only be set from the main thread
            self._proc.start()
        child.close()

    async def _reply(self) -> Any:
        loop = asyncio.get_running_loop()
        try:
            reply = await loop.run_in_executor(None, self._conn.recv)
        except EOFError:
            raise RuntimeError("a bench worker process exited unexpectedly") from None
        if isinstance(reply, Exception):
            raise reply
        return reply

    async def _call(self, command: str, arg: Any = None) -> Any:
        self._conn.send((command, arg))
        return await self._reply()

    async def open(self) -> None:
        await self._reply()  # "ready"

    async def start(self, load: Load) -> None:
        await self._call("start", load)

    async def drain_async(self) -> Samples:
        result: Samples = await self._call("drain")
        return result

    async def stop(self) -> Samples:
        result: Samples = await self._call("stop")
        return result

    async def close(self) -> None:
        if self._proc.is_alive():
            with contextlib.suppress(Exception):
                await self._call("close")
        self._proc.join(timeout=5)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()


Source = LocalSource | ProcessSource


async def drain(source: Source) -> Samples:
    if isinstance(source, LocalSource):
        return source.drain()
    return await source.drain_async()


def split_load(load: Load, index: int, workers: int) -> Load:
    """Worker `index`'s share: concurrency split as evenly as it goes; the rate split evenly,
    constant-rate workers interleaved (phase) so the sum is still evenly spaced."""
    if load.rate > 0:
        share = load.rate / workers
        return Load(
            rate=share,
            poisson=load.poisson,
            phase_s=index / load.rate,
            seed=load.seed * 1000 + index,
            part=index,
            parts=workers,
        )
    base, extra = divmod(load.concurrency, workers)
    return Load(
        concurrency=base + (1 if index < extra else 0), seed=load.seed, part=index, parts=workers
    )


def merge(parts: list[Samples]) -> Samples:
    merged = Samples(outcomes=Counter())
    for part in parts:
        merged.extend(part)
    return merged
