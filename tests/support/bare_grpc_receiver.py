"""gRPC's own cost of receiving one message, for test_receiver_copies.py to compare serve with.

``python -m tests.support.bare_grpc_receiver`` prints its port and serves ``/smgshm.test.Bare/Take``
until killed: a grpc.aio server (serve's options: a 256 MiB message limit) whose one handler
takes the request as bytes, with no deserializer, and answers its length. Whatever peak RSS
a message costs here is gRPC's, none of it smgshm's.
"""

from __future__ import annotations

import asyncio

MAX_MESSAGE_BYTES = 256 * 1024 * 1024


async def _take(raw: bytes, context: object) -> bytes:
    return str(len(raw)).encode()


async def _serve() -> None:
    import grpc

    opts = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES), ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
    server = grpc.aio.server(options=opts)
    handler = grpc.unary_unary_rpc_method_handler(_take)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("smgshm.test.Bare", {"Take": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(_serve())
