from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Layout(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LAYOUT_UNSPECIFIED: _ClassVar[Layout]
    LAYOUT_VLLM: _ClassVar[Layout]
    LAYOUT_TOKENSPEED: _ClassVar[Layout]
LAYOUT_UNSPECIFIED: Layout
LAYOUT_VLLM: Layout
LAYOUT_TOKENSPEED: Layout

class IdentityRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class IdentityResponse(_message.Message):
    __slots__ = ("namespace_id", "boot_id", "shm_dev", "shm_dir", "uid", "gid", "pid", "pid_namespace", "hostname", "shm_total_bytes", "shm_free_bytes", "unlink_after_read", "reader", "version", "engine", "max_message_bytes")
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    SHM_DEV_FIELD_NUMBER: _ClassVar[int]
    SHM_DIR_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    PID_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    SHM_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHM_FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    UNLINK_AFTER_READ_FIELD_NUMBER: _ClassVar[int]
    READER_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    namespace_id: str
    boot_id: str
    shm_dev: int
    shm_dir: str
    uid: int
    gid: int
    pid: int
    pid_namespace: str
    hostname: str
    shm_total_bytes: int
    shm_free_bytes: int
    unlink_after_read: bool
    reader: str
    version: str
    engine: str
    max_message_bytes: int
    def __init__(self, namespace_id: _Optional[str] = ..., boot_id: _Optional[str] = ..., shm_dev: _Optional[int] = ..., shm_dir: _Optional[str] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ..., pid: _Optional[int] = ..., pid_namespace: _Optional[str] = ..., hostname: _Optional[str] = ..., shm_total_bytes: _Optional[int] = ..., shm_free_bytes: _Optional[int] = ..., unlink_after_read: _Optional[bool] = ..., reader: _Optional[str] = ..., version: _Optional[str] = ..., engine: _Optional[str] = ..., max_message_bytes: _Optional[int] = ...) -> None: ...

class ReceiveRequest(_message.Message):
    __slots__ = ("request_id", "layout", "multimodal_inputs")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    MULTIMODAL_INPUTS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    layout: Layout
    multimodal_inputs: bytes
    def __init__(self, request_id: _Optional[str] = ..., layout: _Optional[_Union[Layout, str]] = ..., multimodal_inputs: _Optional[bytes] = ...) -> None: ...

class ReceiveError(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class TensorReceipt(_message.Message):
    __slots__ = ("key", "payload_kind", "dtype", "shape", "nbytes", "digest_algo", "digest", "read_ns", "decode_ns", "unlinked", "shm_name", "error", "reader")
    KEY_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_KIND_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    DIGEST_ALGO_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    READ_NS_FIELD_NUMBER: _ClassVar[int]
    DECODE_NS_FIELD_NUMBER: _ClassVar[int]
    UNLINKED_FIELD_NUMBER: _ClassVar[int]
    SHM_NAME_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    READER_FIELD_NUMBER: _ClassVar[int]
    key: str
    payload_kind: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    nbytes: int
    digest_algo: str
    digest: bytes
    read_ns: int
    decode_ns: int
    unlinked: bool
    shm_name: str
    error: ReceiveError
    reader: str
    def __init__(self, key: _Optional[str] = ..., payload_kind: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., nbytes: _Optional[int] = ..., digest_algo: _Optional[str] = ..., digest: _Optional[bytes] = ..., read_ns: _Optional[int] = ..., decode_ns: _Optional[int] = ..., unlinked: _Optional[bool] = ..., shm_name: _Optional[str] = ..., error: _Optional[_Union[ReceiveError, _Mapping]] = ..., reader: _Optional[str] = ...) -> None: ...

class ReceiveResponse(_message.Message):
    __slots__ = ("request_id", "receipts", "elapsed_ns")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RECEIPTS_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_NS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    receipts: _containers.RepeatedCompositeFieldContainer[TensorReceipt]
    elapsed_ns: int
    def __init__(self, request_id: _Optional[str] = ..., receipts: _Optional[_Iterable[_Union[TensorReceipt, _Mapping]]] = ..., elapsed_ns: _Optional[int] = ...) -> None: ...

class ReceiptsRequest(_message.Message):
    __slots__ = ("after_seq", "max")
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    after_seq: int
    max: int
    def __init__(self, after_seq: _Optional[int] = ..., max: _Optional[int] = ...) -> None: ...

class GenerateReceipt(_message.Message):
    __slots__ = ("seq", "request_id", "engine", "key", "payload_kind", "shm_name", "dtype", "shape", "nbytes", "digest_algo", "digest", "read_ns", "unlinked", "age_ns", "received_unix_ns", "error", "reader", "decode_ns", "shm_owner_id")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_KIND_FIELD_NUMBER: _ClassVar[int]
    SHM_NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    DIGEST_ALGO_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    READ_NS_FIELD_NUMBER: _ClassVar[int]
    UNLINKED_FIELD_NUMBER: _ClassVar[int]
    AGE_NS_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    READER_FIELD_NUMBER: _ClassVar[int]
    DECODE_NS_FIELD_NUMBER: _ClassVar[int]
    SHM_OWNER_ID_FIELD_NUMBER: _ClassVar[int]
    seq: int
    request_id: str
    engine: str
    key: str
    payload_kind: str
    shm_name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    nbytes: int
    digest_algo: str
    digest: bytes
    read_ns: int
    unlinked: bool
    age_ns: int
    received_unix_ns: int
    error: ReceiveError
    reader: str
    decode_ns: int
    shm_owner_id: str
    def __init__(self, seq: _Optional[int] = ..., request_id: _Optional[str] = ..., engine: _Optional[str] = ..., key: _Optional[str] = ..., payload_kind: _Optional[str] = ..., shm_name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., nbytes: _Optional[int] = ..., digest_algo: _Optional[str] = ..., digest: _Optional[bytes] = ..., read_ns: _Optional[int] = ..., unlinked: _Optional[bool] = ..., age_ns: _Optional[int] = ..., received_unix_ns: _Optional[int] = ..., error: _Optional[_Union[ReceiveError, _Mapping]] = ..., reader: _Optional[str] = ..., decode_ns: _Optional[int] = ..., shm_owner_id: _Optional[str] = ...) -> None: ...

class ReceiptsResponse(_message.Message):
    __slots__ = ("receipts", "next_seq", "dropped")
    RECEIPTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_SEQ_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    receipts: _containers.RepeatedCompositeFieldContainer[GenerateReceipt]
    next_seq: int
    dropped: int
    def __init__(self, receipts: _Optional[_Iterable[_Union[GenerateReceipt, _Mapping]]] = ..., next_seq: _Optional[int] = ..., dropped: _Optional[int] = ...) -> None: ...
