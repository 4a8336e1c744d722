"""gRPC server reflection under both names clients ask for: ``grpc.reflection.v1`` and ``v1alpha``.

grpcio-reflection ships only ``v1alpha``; v1-only clients (newer grpcurl, grpcui, Postman)
get UNIMPLEMENTED from it. ``v1`` is the same protocol under a new package: every message
and field number is unchanged, so one servicer answers both, its requests and responses
(de)serialized by the v1alpha classes. The v1 file descriptor is derived from v1alpha's
by renaming the package (so nothing is written by hand that can drift from it) and added
to the default pool, so ``file_containing_symbol("grpc.reflection.v1.ServerReflection")``
answers like every other service's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import grpc

V1_PACKAGE = "grpc.reflection.v1"
V1_SERVICE = f"{V1_PACKAGE}.ServerReflection"
V1_FILE = "grpc/reflection/v1/reflection.proto"  # the upstream name of v1's file

__all__ = ["V1_SERVICE", "enable_reflection", "v1_file_descriptor"]


def v1_file_descriptor() -> bytes:
    """The serialized v1 FileDescriptorProto: v1alpha's with its package (and every type
    reference into it) renamed; the language options name v1alpha's packages, so they go."""
    from google.protobuf import descriptor_pb2
    from grpc_reflection.v1alpha import reflection_pb2

    alpha = reflection_pb2.DESCRIPTOR.package
    proto = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(proto)
    proto.name, proto.package = V1_FILE, V1_PACKAGE
    proto.ClearField("options")

    def rename(type_name: str) -> str:
        prefix = f".{alpha}."
        return f".{V1_PACKAGE}.{type_name[len(prefix) :]}" if type_name.startswith(prefix) else type_name

    for message in proto.message_type:  # the reflection messages nest no types
        for f in message.field:
            if f.HasField("type_name"):
                f.type_name = rename(f.type_name)
    for service in proto.service:
        for method in service.method:
            method.input_type, method.output_type = rename(method.input_type), rename(method.output_type)
    return proto.SerializeToString()


def _ensure_v1_in_pool() -> None:
    from google.protobuf import descriptor_pool

    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(V1_FILE)
    except KeyError:
        pool.AddSerializedFile(v1_file_descriptor())


def enable_reflection(service_names: Iterable[str], server: Any) -> None:
    """Serve reflection of ``service_names`` (plus both reflection services) on the grpc.aio ``server``."""
    from grpc_reflection.v1alpha import reflection, reflection_pb2

    _ensure_v1_in_pool()
    servicer = reflection.aio.ReflectionServicer([*service_names, reflection.SERVICE_NAME, V1_SERVICE])
    handlers = {
        "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
            servicer.ServerReflectionInfo,
            request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
            response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
        )
    }
    for name in (reflection.SERVICE_NAME, V1_SERVICE):
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
        server.add_registered_method_handlers(name, handlers)
