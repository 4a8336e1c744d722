"""The engine table: the CLI offers what it lists, and its protocol facts are the generated code's."""

from __future__ import annotations

import click
import pytest

from smgshm.cli.probe import probe
from smgshm.cli.send import send
from smgshm.cli.serve import serve
from smgshm.core.engines import DETECT_ORDER, ENGINES, SERVED, SHM_ENGINES, Engine, engine_named
from smgshm.core.transport.wire import Layout


def _choices(command: click.Command, option: str) -> list[str]:
    param = next(p for p in command.params if p.name == option)
    assert isinstance(param.type, click.Choice)
    return list(param.type.choices)


def test_cli_choices_are_the_table() -> None:
    assert _choices(probe, "engine") == [e.name for e in ENGINES]
    assert _choices(serve, "engine") == list(SERVED) == ["vllm", "tokenspeed", "sglang"]
    assert _choices(send, "layout") == list(SHM_ENGINES) == ["vllm", "tokenspeed"]
    assert [layout.value for layout in Layout] == list(SHM_ENGINES)


def test_detection_order_is_the_gateways() -> None:
    # smg-facts §2.1: detect_backend tries sglang -> vllm -> trtllm -> tokenspeed -> mlx.
    assert [e.name for e in DETECT_ORDER] == ["sglang", "vllm", "trtllm", "tokenspeed", "mlx"]
    assert len({e.detect_rank for e in ENGINES}) == len(ENGINES)
    assert engine_named("mlx").title == "MLX"
    with pytest.raises(KeyError):
        engine_named("external")


def _fields(pb: object, message: str) -> set[str]:
    desc = pb.DESCRIPTOR.message_types_by_name.get(message)  # type: ignore[attr-defined]
    return set(desc.fields_by_name) if desc is not None else set()


@pytest.mark.parametrize("e", ENGINES, ids=lambda e: e.name)
def test_engine_resolves_its_proto_and_matches_it(e: Engine) -> None:
    pb, pb_grpc = e.pb2(), e.pb2_grpc()
    assert pb.DESCRIPTOR.package == e.package
    assert pb.DESCRIPTOR.services_by_name[e.service].full_name == e.full_service
    assert hasattr(pb_grpc, f"{e.service}Stub")
    assert hasattr(pb_grpc, f"{e.service}Servicer")

    td = pb.DESCRIPTOR.message_types_by_name.get("TensorData")
    shm_arm = td is not None and "payload" in td.oneofs_by_name and "shm" in td.fields_by_name
    assert e.shm == shm_arm
    info = _fields(pb, "GetServerInfoResponse")
    assert (e.namespace_id_at == "field") == ("shm_namespace_id" in info)
    assert e.info_structs == ("server_args" in info)
    if e.namespace_id_at == "scheduler_info":
        assert "scheduler_info" in info
    assert e.version_field in info | {""}
    assert not e.server_type or "server_type" in info
    assert e.health_status == ("status" in _fields(pb, "HealthCheckResponse"))
    assert e.response_request_id == ("request_id" in _fields(pb, "GenerateResponse"))
    assert e.abort_status == ("success" in _fields(pb, "AbortResponse"))
    assert e.model_modalities == ("supported_modalities" in _fields(pb, "GetModelInfoResponse"))
    request = pb.DESCRIPTOR.message_types_by_name["GenerateRequest"]
    assert e.text_input == ("input" in request.oneofs_by_name)
    assert e.media_refs == ("media_refs" in request.fields_by_name)
    assert e.extra_mm_inputs == ("extra_mm_inputs" in request.fields_by_name)
    if e.shm:
        assert e.mm_items == ("items" in _fields(pb, "MultimodalInputs"))
        holder = pb.DESCRIPTOR.message_types_by_name["MultimodalItem" if e.mm_items else "MultimodalInputs"]
        assert holder.fields_by_name[e.primary_tensor].message_type is td


@pytest.mark.parametrize("e", [e for e in ENGINES if e.diag_layout], ids=lambda e: e.name)
def test_diag_layout_names_a_value(e: Engine) -> None:
    from smgshm.rpc.v1 import diag_pb2

    assert diag_pb2.Layout.Value(e.diag_layout) > 0
    assert e.shm, "Diagnostics Receive reads the layouts of SHM engines only"
