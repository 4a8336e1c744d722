"""smgshm's Diagnostics servicer and the grpc.aio server that hosts every service of ``serve``.

The server answers as a vLLM, TokenSpeed or SGLang worker (``engines``), serves
``grpc.health.v1``, reflection (v1 and v1alpha) and smgshm's own Diagnostics service. It runs on an
asyncio loop in a thread of its own, so ``start_receiver`` returns at once and works
from plain (non-async) callers; blocking reads run in a bounded reader pool. A client
whose request never arrives holds no thread, so it cannot starve others nor the
health service (the threaded server it replaces was wedged by 8 such calls).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import grpc

from smgshm import __version__
from smgshm.core.address import bound_address, grpc_host_port, listen_addrinfo
from smgshm.core.engines import ENGINES, engine_named
from smgshm.core.errors import TooManyTensorsError, TransportError, WireError
from smgshm.core.receiver.faces import HandlerOverride, engine_modules, engine_servicer, raw_generate_handlers
from smgshm.core.receiver.fds import HANDSHAKE_TIMEOUT_S, IDLE_TIMEOUT_S, connection_cap
from smgshm.core.receiver.memory import Trimmer
from smgshm.core.receiver.modeldir import MODEL_TYPE, WORKER_MODEL_TYPE, ensure_model_dir
from smgshm.core.receiver.reader import Receipt, ReceiverConfig, ReceiverState, receive
from smgshm.core.receiver.receipts import MAX_PER_CALL, ReceiptRing, receipt_as
from smgshm.core.receiver.receipts import to_proto as receipt_proto
from smgshm.core.receiver.reflection import enable_reflection
from smgshm.core.transport.protowire import parse_excised, resolve
from smgshm.core.transport.wire import Layout
from smgshm.rpc.v1 import diag_pb2, diag_pb2_grpc

DIAG_SERVICE = "smgshm.rpc.v1.Diagnostics"
START_TIMEOUT_S = 30.0

__all__ = ["DIAG_SERVICE", "RunningReceiver", "engine_modules", "start_receiver"]


_LAYOUTS = {diag_pb2.Layout.Value(e.diag_layout): Layout(e.name) for e in ENGINES if e.diag_layout}


def receive_request(raw: bytes, cfg: ReceiverConfig) -> tuple[Any, list[Receipt]]:
    """Diagnostics Receive without gRPC: (the ReceiveRequest, a receipt per tensor). Its
    MultimodalInputs and their inline payloads are read as views into ``raw`` (protowire),
    never copied. WireError when unparseable or the layout is unknown."""
    from google.protobuf.message import DecodeError

    desc = diag_pb2.ReceiveRequest.DESCRIPTOR
    target = (desc.full_name, desc.fields_by_name["multimodal_inputs"].number)
    try:
        request, payloads = parse_excised(diag_pb2.ReceiveRequest, raw, frozenset({target}))
    except DecodeError as err:
        raise WireError("cannot parse ReceiveRequest", nbytes=len(raw)) from err
    layout = _LAYOUTS.get(request.layout)
    if layout is None:
        raise WireError("layout must be " + " or ".join(e.diag_layout for e in ENGINES if e.diag_layout))
    return request, receive(layout, resolve(request.multimodal_inputs, payloads), cfg)


def raw_receive_handlers(servicer: Any) -> dict[str, Any]:
    """Method handlers that replace the generated ones: Receive takes its request as bytes."""
    return {
        "Receive": grpc.unary_unary_rpc_method_handler(
            servicer.Receive,
            request_deserializer=None,
            response_serializer=diag_pb2.ReceiveResponse.SerializeToString,
        )
    }


class _Changes:
    """Wakes every waiting watcher when the ring gets receipts: told from any thread, awaited on the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.event = asyncio.Event()

    def notify(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: serve has stopped
            self.loop.call_soon_threadsafe(self._fire)

    def _fire(self) -> None:
        self.event.set()
        self.event = asyncio.Event()  # the next wait is for the next add


class DiagnosticsServicer(diag_pb2_grpc.DiagnosticsServicer):  # type: ignore[misc]  # generated gRPC base: untyped
    """smgshm's own service: identity, and reading tensors as SMG's servicer does.

    Built on the server's loop: watchers wait on it for the ring's news."""

    def __init__(self, state: ReceiverState, executor: Executor) -> None:
        self.state = state
        self.executor = executor
        self.watchers = 0  # only the loop thread touches it
        self.changes = _Changes(asyncio.get_running_loop())
        state.ring.subscribe(self.changes.notify)

    async def Identity(self, request: Any, context: Any) -> Any:  # noqa: N802
        cfg, ident = self.state.cfg, self.state.identity()
        return diag_pb2.IdentityResponse(
            namespace_id=cfg.advertised_namespace_id(),
            boot_id=ident.boot_id,
            shm_dev=ident.shm_dev,
            shm_dir=ident.shm_dir,
            uid=ident.uid,
            gid=ident.gid,
            pid=ident.pid,
            pid_namespace=ident.pid_namespace,
            hostname=ident.hostname,
            shm_total_bytes=ident.shm_total_bytes,
            shm_free_bytes=ident.shm_free_bytes,
            unlink_after_read=cfg.unlink_after_read,
            reader=cfg.reader,
            version=__version__,
            engine=cfg.engine,
            max_message_bytes=cfg.max_message_bytes,
        )

    async def Receive(self, raw: bytes, context: Any) -> Any:  # noqa: N802
        # Registered with no deserializer (see raw_receive_handlers): the request arrives as its
        # bytes, and its MultimodalInputs, then their inline payloads, are read in place.
        t0 = time.perf_counter_ns()
        self.state.active += 1  # only the loop thread touches these counters
        self.state.last_receive = time.time()
        loop = asyncio.get_running_loop()
        try:
            if self.state.cfg.fault == "slow-read":  # as Generate's: in flight while it waits
                await asyncio.sleep(self.state.cfg.fault_delay_s)
            request, receipts = await loop.run_in_executor(self.executor, receive_request, raw, self.state.cfg)
        except TooManyTensorsError as err:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(err))
        except WireError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        finally:
            self.state.active -= 1
            if self.state.trimmer is not None:
                self.state.trimmer.after(len(raw))
        out = diag_pb2.ReceiveResponse(
            request_id=request.request_id, receipts=[receipt_as(diag_pb2.TensorReceipt, r) for r in receipts]
        )
        out.elapsed_ns = time.perf_counter_ns() - t0
        return out

    async def Receipts(self, request: Any, context: Any) -> Any:  # noqa: N802
        limit = min(int(request.max) or MAX_PER_CALL, MAX_PER_CALL)
        got, nxt, dropped = self.state.ring.after(int(request.after_seq), limit)
        return diag_pb2.ReceiptsResponse(receipts=[receipt_proto(r) for r in got], next_seq=nxt, dropped=dropped)

    async def WatchReceipts(self, request: Any, context: Any) -> AsyncIterator[Any]:  # noqa: N802
        cfg = self.state.cfg
        if self.watchers >= cfg.max_watchers:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"too many watchers (limit={cfg.max_watchers})")
        self.watchers += 1
        try:
            await context.send_initial_metadata(())  # the watch is live: the client need not wait for a receipt
            loop = asyncio.get_running_loop()
            end = loop.time() + cfg.watch_max_s
            after = int(request.after_seq)
            # Waiting on the loop holds no thread and costs nothing until the ring is added to; a
            # client that goes away (or its deadline, or stop()) cancels this coroutine.
            while (left := end - loop.time()) > 0:
                changed = self.changes.event  # taken before reading: an add after the read sets it
                got, _, _ = self.state.ring.after(after)
                for r in got:
                    yield receipt_proto(r)
                    after = r.seq
                if not got:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(changed.wait(), left)
        finally:
            self.watchers -= 1


@dataclass
class RunningReceiver:
    """A started server; ``address`` has the real port when 0 was asked for."""

    server: Any  # grpc.aio.Server, driven from ``loop``
    address: str
    engine_service: str
    state: ReceiverState
    loop: asyncio.AbstractEventLoop = field(repr=False)
    thread: threading.Thread = field(repr=False)
    executor: ThreadPoolExecutor = field(repr=False)
    _stopped: bool = field(repr=False, default=False)

    def stop(self, grace: float = 2.0) -> None:
        """Stop within about ``grace`` seconds: in-flight calls get ``grace`` to finish and are
        then cancelled; reads already running finish (they are bounded), queued ones never start."""
        if self._stopped:
            return
        self._stopped = True
        self.state.stopping.set()
        # Best effort: whatever happens here, the loop is stopped below.
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self.server.stop(grace), self.loop).result(grace + 2)
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(grace + 2)


def bind_failure(address: str) -> str:
    """Why ``address`` cannot be bound, in the kernel's words ("address in use"): gRPC only says it failed."""
    import errno
    import socket

    try:
        hp = grpc_host_port(address, listen=True)
    except ValueError as err:
        return str(err)
    if hp is None:
        return "the address is not host:port or unix:PATH, or the socket path is not usable"
    host, port = hp
    try:
        family, sockaddr = listen_addrinfo(host, port)
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind(sockaddr)
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            return "address in use (another process listens on that port)"
        return (err.strerror or str(err)).lower()
    return "gRPC refused the address"


async def _build(cfg: ReceiverConfig, state: ReceiverState, executor: Executor, address: str) -> tuple[Any, int, str]:
    from grpc_health.v1 import _async as health_async
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    opts = [
        ("grpc.max_receive_message_length", cfg.max_message_bytes),
        ("grpc.max_send_message_length", cfg.max_message_bytes),
        ("grpc.so_reuseport", 0),  # a second server on a busy port must fail, not share it
        # Connections never take the descriptors a read needs, and a silent one is let go (fds.py).
        ("grpc.max_allowed_incoming_connections", connection_cap()),
        ("grpc.server_handshake_timeout_ms", int(HANDSHAKE_TIMEOUT_S * 1000)),
        ("grpc.max_connection_idle_ms", int(IDLE_TIMEOUT_S * 1000)),
    ]
    server = grpc.aio.server(options=opts)
    engine, engine_name = engine_servicer(state, executor)
    e = engine_named(cfg.engine)
    add = getattr(e.pb2_grpc(), f"add_{e.service}Servicer_to_server")
    if e.shm:  # the engine's face answers Generate, which takes its request as bytes
        add(engine, HandlerOverride(server, raw_generate_handlers(e.pb2(), engine)))
    else:
        add(engine, server)
    state.trimmer = Trimmer(asyncio.get_running_loop(), executor)
    diag = DiagnosticsServicer(state, executor)
    diag_pb2_grpc.add_DiagnosticsServicer_to_server(diag, HandlerOverride(server, raw_receive_handlers(diag)))
    health_servicer = health_async.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", engine_name, DIAG_SERVICE):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    enable_reflection([engine_name, DIAG_SERVICE, health.SERVICE_NAME], server)
    try:
        port = server.add_insecure_port(address)
    except RuntimeError as err:
        raise TransportError(f"cannot bind: {bind_failure(address)}", endpoint=address) from err
    if port == 0 and not address.startswith("unix:"):
        raise TransportError(f"cannot bind: {bind_failure(address)}", endpoint=address)
    await server.start()
    return server, port, engine_name


def start_receiver(cfg: ReceiverConfig, address: str = "127.0.0.1:0") -> RunningReceiver:
    """Start the receiver on ``address`` (host:port or unix:PATH) and return at once; TransportError
    when it cannot listen there (a port out of range is refused, never bound modulo 65536)."""
    import torch  # noqa: F401 - import now, not inside the first request's timing

    try:
        grpc_host_port(address, listen=True)
    except ValueError as err:
        raise TransportError(f"cannot bind: {err}", endpoint=address) from None

    family = WORKER_MODEL_TYPE if cfg.worker_processing else MODEL_TYPE
    model = ensure_model_dir(cfg.model_dir, family) if cfg.model_dir is not None else None
    state = ReceiverState(cfg, ring=ReceiptRing(sink=cfg.on_receipt), model=model)
    executor = ThreadPoolExecutor(max_workers=cfg.workers, thread_name_prefix="smgshm-reader")
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="smgshm-serve", daemon=True)
    thread.start()
    try:
        server, port, engine_name = asyncio.run_coroutine_threadsafe(
            _build(cfg, state, executor, address), loop
        ).result(START_TIMEOUT_S)
    except BaseException:
        executor.shutdown(wait=False)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        raise
    return RunningReceiver(server, bound_address(address, port), engine_name, state, loop, thread, executor)
