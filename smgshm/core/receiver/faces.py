"""The engine faces of ``serve``: a vLLM, TokenSpeed or SGLang worker as SMG's gateway sees one.

Registration RPCs (HealthCheck, GetModelInfo, GetServerInfo), GetLoads and Abort answer
from the event loop at once; Generate reads its tensors in the reader pool (``executor``),
so a slow read never holds the loop and a stalled client holds no thread at all.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import signal
import time
from collections.abc import AsyncIterator
from concurrent.futures import Executor
from types import ModuleType
from typing import TYPE_CHECKING, Any

import grpc

from smgshm import __version__
from smgshm.core.engines import Engine, engine_named
from smgshm.core.errors import TooManyTensorsError, WireError
from smgshm.core.receiver.reader import MODEL_NAME, ReceiverState
from smgshm.core.receiver.worker import parse_and_read
from smgshm.core.transport.wire import Layout

if TYPE_CHECKING:
    from smgshm.core.receiver.modeldir import ModelDir

HEADERS_FLUSH_S = 0.2  # time for the response headers to reach the wire before a die-after-* fault


def engine_modules(engine: str) -> tuple[ModuleType, ModuleType, str]:
    """(pb2, pb2_grpc, service name) of an engine in smg-grpc-proto."""
    e = engine_named(engine)
    return e.pb2(), e.pb2_grpc(), e.service


def engine_servicer(state: ReceiverState, executor: Executor) -> tuple[Any, str]:
    """An engine servicer instance (async methods, for grpc.aio) and its full service name."""
    engine = engine_named(state.cfg.engine)
    pb = engine.pb2()
    base = getattr(engine.pb2_grpc(), f"{engine.service}Servicer")

    class EngineServicer(base):  # type: ignore[misc, valid-type]  # the engine's generated base, chosen at run time
        async def HealthCheck(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC method name
            return pb.HealthCheckResponse(healthy=True, message="Health")

        async def GetModelInfo(self, request: Any, context: Any) -> Any:  # noqa: N802
            return model_info(pb, engine, state.model)

        async def GetServerInfo(self, request: Any, context: Any) -> Any:  # noqa: N802
            return server_info(pb, engine, state)

        async def GetLoads(self, request: Any, context: Any) -> Any:  # noqa: N802
            load = pb.SchedulerLoad(
                dp_rank=0,
                num_running_reqs=state.active,
                num_total_reqs=state.active,
                max_total_num_tokens=state.model.max_context_length if state.model else 4096,
                max_running_requests=state.cfg.workers,
            )
            stamp = datetime.datetime.now(datetime.timezone.utc).isoformat()
            return pb.GetLoadsResponse(timestamp=stamp, version=f"smgshm-{__version__}", dp_rank_count=1, loads=[load])

        async def Abort(self, request: Any, context: Any) -> Any:  # noqa: N802
            # Generate answers at once, so there is never anything in flight to abort.
            return pb.AbortResponse(success=True, message="") if engine.abort_status else pb.AbortResponse()

        async def Generate(self, raw: bytes, context: Any) -> AsyncIterator[Any]:  # noqa: N802
            # Registered with no deserializer (see raw_generate_handlers): the request arrives
            # as its bytes, so inline payloads are read in place, not copied out of protobuf.
            async for m in generate(pb, engine, state, executor, raw, context):
                yield m

    if not engine.shm:
        del EngineServicer.Generate, EngineServicer.GetLoads, EngineServicer.Abort  # not SMG-SHM engines
    return EngineServicer(), engine.full_service


def server_info(pb: ModuleType, engine: Engine, state: ReceiverState) -> Any:
    ns = state.cfg.advertised_namespace_id()
    up = time.time() - state.started
    if not engine.info_structs:  # vLLM: flat fields, the id one of them
        # A non-empty mm_processor is what makes the gateway send this worker media refs.
        refs = {"mm_processor": "inprocess", "mm_media_ref_schemes": "data", "mm_processor_source": "flag"}
        return pb.GetServerInfoResponse(
            active_requests=state.active,
            last_receive_timestamp=state.last_receive,
            uptime_seconds=up,
            server_type="smgshm",
            shm_namespace_id=ns,
            **(refs if state.cfg.worker_processing else {}),
        )
    resp = pb.GetServerInfoResponse(active_requests=state.active, uptime_seconds=up)
    resp.server_args.update({"model_path": MODEL_NAME})
    if engine.namespace_id_at == "scheduler_info" and ns:  # no dedicated field: a key of scheduler_info
        resp.scheduler_info.update({"shm_namespace_id": ns})
    if engine.server_type:
        resp.server_type = engine.server_type
    setattr(resp, engine.version_field, f"smgshm-{__version__}")
    return resp


def model_info(pb: ModuleType, engine: Engine, model: ModelDir | None) -> Any:
    """GetModelInfo: from the model directory served, or smgshm's own name without one."""
    if model is None:
        common: dict[str, Any] = {"model_path": MODEL_NAME, "served_model_name": MODEL_NAME, "max_context_length": 4096}
        if engine.model_modalities:
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
    if engine.model_modalities:
        from smg_grpc_proto.generated import common_pb2

        return pb.GetModelInfoResponse(
            **common, supports_multimodal=True, supported_modalities=[common_pb2.IMAGE], model_dtype="float32"
        )
    return pb.GetModelInfoResponse(**common, is_generation=True)


async def _die(context: Any = None) -> None:
    """A fault: the process dies at once, as a crashed worker does (SIGKILL: no cleanup, no
    graceful shutdown). With ``context``, the response headers are sent first."""
    if context is not None:
        await context.send_initial_metadata(())
        await asyncio.sleep(HEADERS_FLUSH_S)
    os.kill(os.getpid(), signal.SIGKILL)


def raw_generate_handlers(pb: ModuleType, servicer: Any) -> dict[str, Any]:
    """Method handlers that replace the generated ones: Generate takes its request as bytes."""
    return {
        "Generate": grpc.unary_stream_rpc_method_handler(
            servicer.Generate, request_deserializer=None, response_serializer=pb.GenerateResponse.SerializeToString
        )
    }


class HandlerOverride:
    """A stand-in for the server, handed to a generated ``add_*Servicer_to_server``: it passes
    every method handler through to ``server`` except those in ``overrides``."""

    def __init__(self, server: Any, overrides: dict[str, Any]) -> None:
        self.server = server
        self.overrides = overrides

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass  # rebuilt from the method table in add_registered_method_handlers, with the overrides

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        merged = {**handlers, **{k: v for k, v in self.overrides.items() if k in handlers}}
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, merged),))
        self.server.add_registered_method_handlers(service, merged)


async def _read(state: ReceiverState, executor: Executor, layout: Layout, raw: bytes, context: Any) -> Any:
    """Parse and read in the reader pool; typed refusals become typed gRPC errors."""
    loop = asyncio.get_running_loop()
    state.active += 1  # only the loop thread touches these counters
    state.last_receive = time.time()
    try:
        if state.cfg.fault == "slow-read":  # in flight (active) while it waits, the request held
            await asyncio.sleep(state.cfg.fault_delay_s)  # cancelled with the call, or by stop()
        return await loop.run_in_executor(executor, parse_and_read, layout, raw, state.cfg, state.ring)
    except TooManyTensorsError as err:
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(err))
    except WireError as err:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
    finally:
        state.active -= 1
        if state.trimmer is not None:
            state.trimmer.after(len(raw))


async def generate(
    pb: ModuleType, engine: Engine, state: ReceiverState, executor: Executor, raw: bytes, context: Any
) -> AsyncIterator[Any]:
    """Generate as smg-facts §5.2: read every tensor (receipts), then a chunk if streaming and a complete."""
    layout = Layout(engine.name)
    fault = state.cfg.fault
    if fault == "die-before-read":
        await _die()
    if fault == "die-after-headers":
        await _die(context)
    request, outcome = await _read(state, executor, layout, raw, context)
    del raw  # the payload views went with the receipts; let the bytes go before answering
    if fault == "die-after-read":
        await _die(context)
    if outcome.refused:
        bad = outcome.refused[0]
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"{len(outcome.refused)} of {len(outcome.receipts)} tensors refused; {bad.key}: {bad.error_message}",
        )
    token = state.model.reply_token_id if state.model else 0
    eos = state.model.eos_token_id if state.model else 0
    n = outcome.prompt_tokens
    rid = {"request_id": outcome.request_id} if engine.response_request_id else {}
    if request.stream:
        chunk = pb.GenerateStreamChunk(token_ids=[token], prompt_tokens=n, completion_tokens=1)
        yield pb.GenerateResponse(**rid, chunk=chunk)
    complete = pb.GenerateComplete(
        output_ids=[token], finish_reason="stop", prompt_tokens=n, completion_tokens=1, matched_token_id=eos
    )
    yield pb.GenerateResponse(**rid, complete=complete)
