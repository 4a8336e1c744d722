"""gRPC servicers of the reference receiver and the server that hosts them.

It answers as a vLLM, TokenSpeed or SGLang worker for the RPCs SMG's gateway calls
at registration (HealthCheck, GetModelInfo, GetServerInfo), serves
``grpc.health.v1`` and reflection, and smgshm's own Diagnostics service.
"""

from __future__ import annotations

import datetime
import os
import signal
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import grpc

from smgshm import __version__
from smgshm.core.errors import TooManyTensorsError, TransportError, WireError
from smgshm.core.modeldir import ModelDir, ensure_model_dir
from smgshm.core.receipts import MAX_PER_CALL, ReceiptRing
from smgshm.core.receipts import to_proto as receipt_proto
from smgshm.core.receiver import MODEL_NAME, ReceiverConfig, ReceiverState, receive
from smgshm.core.tensors import DIGEST_ALGO
from smgshm.core.wire import Layout
from smgshm.core.worker import read_generate
from smgshm.rpc.v1 import diag_pb2, diag_pb2_grpc

DIAG_SERVICE = "smgshm.rpc.v1.Diagnostics"


def engine_modules(engine: str) -> tuple[ModuleType, ModuleType, str]:
    """(pb2, pb2_grpc, service name) of an engine in smg-grpc-proto."""
    from smg_grpc_proto.generated import (
        sglang_scheduler_pb2,
        sglang_scheduler_pb2_grpc,
        tokenspeed_scheduler_pb2,
        tokenspeed_scheduler_pb2_grpc,
        vllm_engine_pb2,
        vllm_engine_pb2_grpc,
    )

    table = {
        "vllm": (vllm_engine_pb2, vllm_engine_pb2_grpc, "VllmEngine"),
        "tokenspeed": (tokenspeed_scheduler_pb2, tokenspeed_scheduler_pb2_grpc, "TokenSpeedScheduler"),
        "sglang": (sglang_scheduler_pb2, sglang_scheduler_pb2_grpc, "SglangScheduler"),
    }
    return table[engine]


def _engine_servicer(state: ReceiverState) -> tuple[Any, str]:
    """An engine servicer instance and its full service name."""
    pb, pb_grpc, svc = engine_modules(state.cfg.engine)
    base = getattr(pb_grpc, f"{svc}Servicer")
    engine = state.cfg.engine

    class EngineServicer(base):  # type: ignore[misc, valid-type]
        def HealthCheck(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC method name
            return pb.HealthCheckResponse(healthy=True, message="Health")

        def GetModelInfo(self, request: Any, context: Any) -> Any:  # noqa: N802
            return model_info(pb, engine, state.model)

        def GetLoads(self, request: Any, context: Any) -> Any:  # noqa: N802
            with state.lock:
                active = state.active
            load = pb.SchedulerLoad(
                dp_rank=0,
                num_running_reqs=active,
                num_total_reqs=active,
                max_total_num_tokens=state.model.max_context_length if state.model else 4096,
                max_running_requests=state.cfg.workers,
            )
            stamp = datetime.datetime.now(datetime.timezone.utc).isoformat()
            return pb.GetLoadsResponse(timestamp=stamp, version=f"smgshm-{__version__}", dp_rank_count=1, loads=[load])

        def Abort(self, request: Any, context: Any) -> Any:  # noqa: N802
            # Generate answers at once, so there is never anything in flight to abort.
            return pb.AbortResponse() if engine == "vllm" else pb.AbortResponse(success=True, message="")

        def Generate(self, request: Any, context: Any) -> Iterator[Any]:  # noqa: N802
            yield from generate(pb, engine, state, request, context)

        def GetServerInfo(self, request: Any, context: Any) -> Any:  # noqa: N802
            ns = state.cfg.advertised_namespace_id()
            up = time.time() - state.started
            if engine == "vllm":
                return pb.GetServerInfoResponse(
                    active_requests=state.active,
                    last_receive_timestamp=state.last_receive,
                    uptime_seconds=up,
                    server_type="smgshm",
                    shm_namespace_id=ns,
                )
            resp = pb.GetServerInfoResponse(active_requests=state.active, uptime_seconds=up)
            resp.server_args.update({"model_path": MODEL_NAME})
            if engine == "tokenspeed":
                # TokenSpeed has no dedicated field: the id is a key of scheduler_info.
                if ns:
                    resp.scheduler_info.update({"shm_namespace_id": ns})
                resp.tokenspeed_version = f"smgshm-{__version__}"
            else:
                resp.server_type = "grpc"
                resp.sglang_version = f"smgshm-{__version__}"
            return resp

    return EngineServicer(), pb.DESCRIPTOR.services_by_name[svc].full_name


def model_info(pb: ModuleType, engine: str, model: ModelDir | None) -> Any:
    """GetModelInfo: from the model directory served, or smgshm's own name without one."""
    if model is None:
        common: dict[str, Any] = {"model_path": MODEL_NAME, "served_model_name": MODEL_NAME, "max_context_length": 4096}
        if engine == "tokenspeed":
            return pb.GetModelInfoResponse(**common, model_type="smgshm")
        return pb.GetModelInfoResponse(**common, is_generation=True, supports_vision=True, model_type="smgshm")
    common = {
        "model_path": model.path,
        "tokenizer_path": model.path,
        "served_model_name": model.served_model_name,
        "max_context_length": model.max_context_length,
        "vocab_size": model.vocab_size,
        "model_type": model.model_type,
        "architectures": list(model.architectures),
        "eos_token_ids": [model.eos_token_id],
        "supports_vision": True,
    }
    if engine == "tokenspeed":
        from smg_grpc_proto.generated import common_pb2

        return pb.GetModelInfoResponse(
            **common, supports_multimodal=True, supported_modalities=[common_pb2.IMAGE], model_dtype="float32"
        )
    return pb.GetModelInfoResponse(**common, is_generation=True)


HEADERS_FLUSH_S = 0.2  # time for the response headers to reach the wire before a die-after-* fault


def _die(context: Any = None) -> None:
    """A fault: the process dies at once, as a crashed worker does (SIGKILL: no cleanup, no
    graceful shutdown). With ``context``, the response headers are sent first."""
    if context is not None:
        context.send_initial_metadata(())
        time.sleep(HEADERS_FLUSH_S)
    os.kill(os.getpid(), signal.SIGKILL)


def generate(pb: ModuleType, engine: str, state: ReceiverState, request: Any, context: Any) -> Iterator[Any]:
    """Generate as smg-facts §5.2: read every tensor (receipts), then a chunk if streaming and a complete."""
    layout = Layout.VLLM if engine == "vllm" else Layout.TOKENSPEED
    fault = state.cfg.fault
    if fault == "die-before-read":
        _die()
    if fault == "die-after-headers":
        _die(context)
    if fault == "slow-read":
        state.stopping.wait(state.cfg.fault_delay_s)
    with state.lock:
        state.active += 1
        state.last_receive = time.time()
    try:
        outcome = read_generate(layout, request, state.cfg, state.ring)
    except TooManyTensorsError as err:
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(err))
    except WireError as err:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
    finally:
        with state.lock:
            state.active -= 1
    if fault == "die-after-read":
        _die(context)
    if outcome.refused:
        bad = outcome.refused[0]
        context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"{len(outcome.refused)} of {len(outcome.receipts)} tensors refused; {bad.key}: {bad.error_message}",
        )
    token = state.model.reply_token_id if state.model else 0
    eos = state.model.eos_token_id if state.model else 0
    n = outcome.prompt_tokens
    rid = {"request_id": outcome.request_id} if engine == "tokenspeed" else {}
    if request.stream:
        chunk = pb.GenerateStreamChunk(token_ids=[token], prompt_tokens=n, completion_tokens=1)
        yield pb.GenerateResponse(**rid, chunk=chunk)
    complete = pb.GenerateComplete(
        output_ids=[token], finish_reason="stop", prompt_tokens=n, completion_tokens=1, matched_token_id=eos
    )
    yield pb.GenerateResponse(**rid, complete=complete)


class DiagnosticsServicer(diag_pb2_grpc.DiagnosticsServicer):  # type: ignore[misc]
    """smgshm's own service: identity, and reading tensors as SMG's servicer does."""

    def __init__(self, state: ReceiverState) -> None:
        self.state = state

    def Identity(self, request: Any, context: Any) -> Any:  # noqa: N802
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

    def Receive(self, request: Any, context: Any) -> Any:  # noqa: N802
        t0 = time.perf_counter_ns()
        layouts = {diag_pb2.LAYOUT_VLLM: Layout.VLLM, diag_pb2.LAYOUT_TOKENSPEED: Layout.TOKENSPEED}
        layout = layouts.get(request.layout)
        if layout is None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "layout must be LAYOUT_VLLM or LAYOUT_TOKENSPEED")
        with self.state.lock:
            self.state.active += 1
            self.state.last_receive = time.time()
        try:
            receipts = receive(layout, request.multimodal_inputs, self.state.cfg)
        except TooManyTensorsError as err:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(err))
        except WireError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        finally:
            with self.state.lock:
                self.state.active -= 1
        out = diag_pb2.ReceiveResponse(request_id=request.request_id)
        for r in receipts:
            pr = out.receipts.add(
                key=r.key,
                payload_kind=r.payload_kind,
                dtype=r.dtype,
                shape=list(r.shape),
                nbytes=r.nbytes,
                digest_algo=DIGEST_ALGO if r.digest else "",
                digest=r.digest,
                read_ns=r.read_ns,
                decode_ns=r.decode_ns,
                unlinked=r.unlinked,
                shm_name=r.shm_name,
                reader=r.reader,
            )
            if r.error_code:
                pr.error.code, pr.error.message = r.error_code, r.error_message
        out.elapsed_ns = time.perf_counter_ns() - t0
        return out

    def Receipts(self, request: Any, context: Any) -> Any:  # noqa: N802
        limit = min(int(request.max) or MAX_PER_CALL, MAX_PER_CALL)
        got, nxt, dropped = self.state.ring.after(int(request.after_seq), limit)
        return diag_pb2.ReceiptsResponse(receipts=[receipt_proto(r) for r in got], next_seq=nxt, dropped=dropped)

    def WatchReceipts(self, request: Any, context: Any) -> Iterator[Any]:  # noqa: N802
        after = int(request.after_seq)
        # Wake up now and then to notice a client that went away (or a deadline that passed).
        while context.is_active():
            for r in self.state.ring.wait_after(after, timeout_s=0.25):
                yield receipt_proto(r)
                after = r.seq


@dataclass
class RunningReceiver:
    """A started server; ``address`` has the real port when 0 was asked for."""

    server: grpc.Server
    address: str
    engine_service: str
    state: ReceiverState

    def stop(self, grace: float = 2.0) -> None:
        self.state.stopping.set()
        self.server.stop(grace).wait(grace + 1)


def bind_failure(address: str) -> str:
    """Why ``address`` cannot be bound, in the kernel's words ("address in use"): gRPC only says it failed."""
    import errno
    import socket

    host, _, port = address.rpartition(":")
    if address.startswith("unix:") or not port.isdigit():
        return "the address is not host:port or unix:PATH, or the socket path is not usable"
    host = host.strip("[]")
    try:
        family = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((host, int(port)))
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            return "address in use (another process listens on that port)"
        return (err.strerror or str(err)).lower()
    return "gRPC refused the address"


def start_receiver(cfg: ReceiverConfig, address: str = "127.0.0.1:0") -> RunningReceiver:
    """Start the receiver on ``address`` (host:port or unix:PATH) and return at once."""
    import torch  # noqa: F401 - import now, not inside the first request's timing
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection

    model = ensure_model_dir(cfg.model_dir) if cfg.model_dir is not None else None
    state = ReceiverState(cfg, ring=ReceiptRing(sink=cfg.on_receipt), model=model)
    opts = [
        ("grpc.max_receive_message_length", cfg.max_message_bytes),
        ("grpc.max_send_message_length", cfg.max_message_bytes),
        ("grpc.so_reuseport", 0),  # a second server on a busy port must fail, not share it
    ]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=cfg.workers), options=opts)
    engine, engine_name = _engine_servicer(state)
    _, pb_grpc, svc = engine_modules(cfg.engine)
    getattr(pb_grpc, f"add_{svc}Servicer_to_server")(engine, server)
    diag_pb2_grpc.add_DiagnosticsServicer_to_server(DiagnosticsServicer(state), server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", engine_name, DIAG_SERVICE):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection(
        [engine_name, DIAG_SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME], server
    )
    try:
        port = server.add_insecure_port(address)
    except RuntimeError as err:
        raise TransportError(f"cannot bind: {bind_failure(address)}", endpoint=address) from err
    if port == 0 and not address.startswith("unix:"):
        raise TransportError(f"cannot bind: {bind_failure(address)}", endpoint=address)
    server.start()
    bound = address if address.startswith("unix:") else f"{address.rsplit(':', 1)[0]}:{port}"
    return RunningReceiver(server, bound, engine_name, state)
