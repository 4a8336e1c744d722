"""The engines SMG's gateway talks to over gRPC, one row each: every fact that differs by engine.

psutil keeps its one axis of variation (the platform) in one place; smgshm keeps the engine here.
Code that behaves differently per engine reads a field of the engine's row instead of comparing
names, and the CLI's ``--engine``/``--layout`` choices are the rows' names. The facts are from
smg-facts §1 (wire schema) and §2 (discovery, the transport decision); tests/test_engines.py holds
the protocol fields equal to the generated descriptors.

Plain data: the CLI reads this at start-up, so nothing heavy (grpc, protobuf, generated code) is
imported here; ``Engine.pb2``/``pb2_grpc`` import an engine's stubs when called.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Literal

PROTO_PACKAGE = "smg_grpc_proto.generated"
DEFAULT = "vllm"  # what serve answers as and send lays tensors out as, unless told


@dataclass(frozen=True)
class Engine:
    """One engine's facts. Fields past the identity default to "no" (an engine without that trait)."""

    name: str  # SMG's runtime_type; the --engine value
    title: str  # as its project writes it
    proto: str  # <proto>_pb2 and <proto>_pb2_grpc in smg_grpc_proto.generated
    package: str  # the proto package
    service: str  # the gRPC service SMG calls
    detect_rank: int  # the gateway's detect_backend tries engines in this order (smg-facts §2.1)

    # Transport (§2.3): SMG may put this engine's tensors in /dev/shm (its TensorData has the shm arm).
    # smgshm serve answers Generate only for these.
    shm: bool = False
    # Where GetServerInfo advertises shm_namespace_id: its own field, a key of the scheduler_info Struct,
    # or nowhere (then `auto` always sends inline).
    namespace_id_at: Literal["field", "scheduler_info", ""] = ""
    served: bool = False  # smgshm serve can answer as this engine
    diag_layout: str = ""  # smgshm's Diagnostics Layout value for this engine's MultimodalInputs

    # Where tensors sit in a request, for the engines SMG may send SHM (§1.3).
    primary_tensor: str = ""  # the TensorData the gateway fills from the image
    mm_items: bool = False  # MultimodalInputs holds repeated items, each with its own tensors
    extra_mm_inputs: bool = False  # GenerateRequest.extra_mm_inputs carries further MultimodalInputs
    text_input: bool = False  # GenerateRequest's prompt is a oneof `input` {text, tokenized}
    media_refs: bool = False  # GenerateRequest.media_refs exists, exclusive with mm_inputs

    # Answers (§1.4, §1.5).
    health_status: bool = False  # HealthCheckResponse is {status} ("ok" is healthy), not {healthy, message}
    response_request_id: bool = False  # GenerateResponse echoes request_id
    abort_status: bool = False  # AbortResponse carries success and message
    info_structs: bool = False  # GetServerInfo carries server_args/scheduler_info Structs, not flat fields
    server_type: str = ""  # what the engine's own servicer puts in GetServerInfo.server_type
    version_field: str = ""  # GetServerInfo's field for the engine's version
    model_modalities: bool = False  # GetModelInfo lists supported_modalities instead of is_generation

    # Names the engine itself makes in /dev/shm (host.capacity's families).
    own_shm_prefix: str = ""
    own_shm_word: str = ""  # matched anywhere in the name, any case

    @property
    def full_service(self) -> str:
        """``<package>.<Service>``: the gRPC service name, and its grpc.health.v1 readiness name."""
        return f"{self.package}.{self.service}"

    def pb2(self) -> ModuleType:
        """The engine's generated message module (imports protobuf on first use)."""
        return importlib.import_module(f"{PROTO_PACKAGE}.{self.proto}_pb2")

    def pb2_grpc(self) -> ModuleType:
        """The engine's generated service module (imports grpc on first use)."""
        return importlib.import_module(f"{PROTO_PACKAGE}.{self.proto}_pb2_grpc")


VLLM = Engine(
    "vllm",
    "vLLM",
    "vllm_engine",
    "vllm.grpc.engine",
    "VllmEngine",
    detect_rank=1,
    shm=True,
    namespace_id_at="field",
    served=True,
    diag_layout="LAYOUT_VLLM",
    primary_tensor="pixel_values",
    extra_mm_inputs=True,
    text_input=True,
    media_refs=True,
    own_shm_word="vllm",
)
TOKENSPEED = Engine(
    "tokenspeed",
    "TokenSpeed",
    "tokenspeed_scheduler",
    "tokenspeed.grpc.scheduler",
    "TokenSpeedScheduler",
    detect_rank=3,
    shm=True,
    namespace_id_at="scheduler_info",
    served=True,
    diag_layout="LAYOUT_TOKENSPEED",
    primary_tensor="encoder_input",
    mm_items=True,
    response_request_id=True,
    abort_status=True,
    info_structs=True,
    version_field="tokenspeed_version",
    model_modalities=True,
)
SGLANG = Engine(
    "sglang",
    "SGLang",
    "sglang_scheduler",
    "sglang.grpc.scheduler",
    "SglangScheduler",
    detect_rank=0,
    served=True,
    response_request_id=True,
    abort_status=True,
    info_structs=True,
    server_type="grpc",
    version_field="sglang_version",
    own_shm_prefix="sgl_shm_",
)
TRTLLM = Engine(
    "trtllm",
    "TRT-LLM",
    "trtllm_service",
    "trtllm",
    "TrtllmService",
    detect_rank=2,
    health_status=True,
    response_request_id=True,
    abort_status=True,
)
MLX = Engine(
    "mlx",
    "MLX",
    "mlx_engine",
    "mlx.grpc.engine",
    "MlxEngine",
    detect_rank=4,
    text_input=True,
    server_type="mlx-grpc",
)

ENGINES: tuple[Engine, ...] = (VLLM, TOKENSPEED, SGLANG, TRTLLM, MLX)  # the order choices and lists show
_BY_NAME = {e.name: e for e in ENGINES}
DETECT_ORDER: tuple[Engine, ...] = tuple(sorted(ENGINES, key=lambda e: e.detect_rank))
SHM_ENGINES: tuple[str, ...] = tuple(e.name for e in ENGINES if e.shm)  # also the wire layouts
SERVED: tuple[str, ...] = tuple(e.name for e in ENGINES if e.served)


def engine_named(name: str) -> Engine:
    """The row of engine ``name``; KeyError for a name SMG does not know."""
    return _BY_NAME[name]
