"""A vLLM worker that is not smgshm: it reads tensors only through SMG's own reader.

``python -m tests.support.mm_shm_worker MODEL_DIR [NAMESPACE_ID]`` prints its address and serves
until killed. With ``MM_SHM_WORKER_PORTS=N`` it listens on N ports (one line, addresses
space-separated: N workers of one process); with ``MM_SHM_WORKER_SLOW_FILE=PATH``, once that
file exists, every RPC (an unknown one too) answers after ``MM_SHM_WORKER_DELAY`` seconds.
Generate reads ``pixel_values`` and every model-specific tensor with
``smg_grpc_servicer.mm_shm.tensor_payload_bytes`` (SMG's servicer code: it unlinks
after reading), then answers as smg-facts §5.2 says. It has no Diagnostics service, so
e2e has no receipts from it: metrics and the shm dir are the only evidence.
"""

from __future__ import annotations

import os
import sys
import time
from concurrent import futures
from typing import Any


def main() -> None:
    import grpc
    from smg_grpc_proto.generated import vllm_engine_pb2 as pb
    from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc
    from smg_grpc_servicer import mm_shm

    from smgshm.core.host.namespace import read_namespace_id
    from smgshm.core.receiver.modeldir import ensure_model_dir

    md = ensure_model_dir(sys.argv[1])
    ns = sys.argv[2] if len(sys.argv) > 2 else read_namespace_id()
    reply = md.reply_token_id or md.eos_token_id

    class Worker(pb_grpc.VllmEngineServicer):  # type: ignore[misc]
        def HealthCheck(self, request: Any, context: Any) -> Any:  # noqa: N802
            return pb.HealthCheckResponse(healthy=True, message="Health")

        def GetModelInfo(self, request: Any, context: Any) -> Any:  # noqa: N802
            return pb.GetModelInfoResponse(
                model_path=md.path,
                tokenizer_path=md.path,
                served_model_name=md.served_model_name,
                max_context_length=md.max_context_length,
                vocab_size=md.vocab_size,
                model_type=md.model_type,
                architectures=list(md.architectures),
                eos_token_ids=[md.eos_token_id],
                supports_vision=True,
                is_generation=True,
            )

        def GetServerInfo(self, request: Any, context: Any) -> Any:  # noqa: N802
            return pb.GetServerInfoResponse(shm_namespace_id=ns, uptime_seconds=1.0)

        def GetLoads(self, request: Any, context: Any) -> Any:  # noqa: N802
            load = pb.SchedulerLoad(dp_rank=0, max_total_num_tokens=md.max_context_length, max_running_requests=8)
            return pb.GetLoadsResponse(timestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ"), dp_rank_count=1, loads=[load])

        def Abort(self, request: Any, context: Any) -> Any:  # noqa: N802
            return pb.AbortResponse()

        def Generate(self, request: Any, context: Any) -> Any:  # noqa: N802
            mm = request.mm_inputs
            if mm.HasField("pixel_values"):
                mm_shm.tensor_payload_bytes(mm.pixel_values)
            for td in mm.model_specific_tensors.values():
                mm_shm.tensor_payload_bytes(td)
            prompt = len(request.tokenized.input_ids)
            if request.stream:
                yield pb.GenerateResponse(
                    chunk=pb.GenerateStreamChunk(token_ids=[reply], prompt_tokens=prompt, completion_tokens=1)
                )
            yield pb.GenerateResponse(
                complete=pb.GenerateComplete(
                    output_ids=[reply],
                    finish_reason="stop",
                    prompt_tokens=prompt,
                    completion_tokens=1,
                    matched_token_id=md.eos_token_id,
                )
            )

    ports = int(os.environ.get("MM_SHM_WORKER_PORTS", "1"))
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max(4, 4 * ports)),
        interceptors=[_slow_interceptor()],
        options=[("grpc.max_receive_message_length", 256 * 1024 * 1024)],
    )
    pb_grpc.add_VllmEngineServicer_to_server(Worker(), server)
    bound = [server.add_insecure_port("127.0.0.1:0") for _ in range(ports)]
    assert all(bound), "cannot bind"
    server.start()
    print(" ".join(f"127.0.0.1:{port}" for port in bound), flush=True)
    server.wait_for_termination()


def _slow_interceptor() -> Any:
    """With ``MM_SHM_WORKER_SLOW_FILE``: once that file exists, every RPC answers late."""
    import grpc

    slow_file = os.environ.get("MM_SHM_WORKER_SLOW_FILE", "")
    delay = float(os.environ.get("MM_SHM_WORKER_DELAY", "1.5"))

    class Slow(grpc.ServerInterceptor):  # type: ignore[misc]
        """Each RPC answers late, in its handler thread (an unknown one too, then UNIMPLEMENTED)."""

        def intercept_service(self, continuation: Any, details: Any) -> Any:
            handler = continuation(details)
            if not slow_file or not os.path.exists(slow_file):
                return handler
            if handler is None:

                def unknown(request: Any, context: Any) -> Any:
                    time.sleep(delay)
                    context.abort(grpc.StatusCode.UNIMPLEMENTED, "unknown method")

                return grpc.unary_unary_rpc_method_handler(unknown)
            if handler.unary_unary is None:
                return handler

            def late(request: Any, context: Any) -> Any:
                time.sleep(delay)
                return handler.unary_unary(request, context)

            return handler._replace(unary_unary=late)

    return Slow()


if __name__ == "__main__":
    main()
