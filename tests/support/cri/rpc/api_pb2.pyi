from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NamespaceMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POD: _ClassVar[NamespaceMode]
    CONTAINER: _ClassVar[NamespaceMode]
    NODE: _ClassVar[NamespaceMode]
    TARGET: _ClassVar[NamespaceMode]

class PodSandboxState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SANDBOX_READY: _ClassVar[PodSandboxState]
    SANDBOX_NOTREADY: _ClassVar[PodSandboxState]

class MountPropagation(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROPAGATION_PRIVATE: _ClassVar[MountPropagation]
    PROPAGATION_HOST_TO_CONTAINER: _ClassVar[MountPropagation]
    PROPAGATION_BIDIRECTIONAL: _ClassVar[MountPropagation]

class ContainerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONTAINER_CREATED: _ClassVar[ContainerState]
    CONTAINER_RUNNING: _ClassVar[ContainerState]
    CONTAINER_EXITED: _ClassVar[ContainerState]
    CONTAINER_UNKNOWN: _ClassVar[ContainerState]
POD: NamespaceMode
CONTAINER: NamespaceMode
NODE: NamespaceMode
TARGET: NamespaceMode
SANDBOX_READY: PodSandboxState
SANDBOX_NOTREADY: PodSandboxState
PROPAGATION_PRIVATE: MountPropagation
PROPAGATION_HOST_TO_CONTAINER: MountPropagation
PROPAGATION_BIDIRECTIONAL: MountPropagation
CONTAINER_CREATED: ContainerState
CONTAINER_RUNNING: ContainerState
CONTAINER_EXITED: ContainerState
CONTAINER_UNKNOWN: ContainerState

class VersionRequest(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: str
    def __init__(self, version: _Optional[str] = ...) -> None: ...

class VersionResponse(_message.Message):
    __slots__ = ("version", "runtime_name", "runtime_version", "runtime_api_version")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_NAME_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_VERSION_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_API_VERSION_FIELD_NUMBER: _ClassVar[int]
    version: str
    runtime_name: str
    runtime_version: str
    runtime_api_version: str
    def __init__(self, version: _Optional[str] = ..., runtime_name: _Optional[str] = ..., runtime_version: _Optional[str] = ..., runtime_api_version: _Optional[str] = ...) -> None: ...

class NamespaceOption(_message.Message):
    __slots__ = ("network", "pid", "ipc", "target_id")
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    IPC_FIELD_NUMBER: _ClassVar[int]
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    network: NamespaceMode
    pid: NamespaceMode
    ipc: NamespaceMode
    target_id: str
    def __init__(self, network: _Optional[_Union[NamespaceMode, str]] = ..., pid: _Optional[_Union[NamespaceMode, str]] = ..., ipc: _Optional[_Union[NamespaceMode, str]] = ..., target_id: _Optional[str] = ...) -> None: ...

class LinuxSandboxSecurityContext(_message.Message):
    __slots__ = ("namespace_options", "privileged")
    NAMESPACE_OPTIONS_FIELD_NUMBER: _ClassVar[int]
    PRIVILEGED_FIELD_NUMBER: _ClassVar[int]
    namespace_options: NamespaceOption
    privileged: bool
    def __init__(self, namespace_options: _Optional[_Union[NamespaceOption, _Mapping]] = ..., privileged: _Optional[bool] = ...) -> None: ...

class LinuxPodSandboxConfig(_message.Message):
    __slots__ = ("cgroup_parent", "security_context")
    CGROUP_PARENT_FIELD_NUMBER: _ClassVar[int]
    SECURITY_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    cgroup_parent: str
    security_context: LinuxSandboxSecurityContext
    def __init__(self, cgroup_parent: _Optional[str] = ..., security_context: _Optional[_Union[LinuxSandboxSecurityContext, _Mapping]] = ...) -> None: ...

class PodSandboxMetadata(_message.Message):
    __slots__ = ("name", "uid", "namespace", "attempt")
    NAME_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    name: str
    uid: str
    namespace: str
    attempt: int
    def __init__(self, name: _Optional[str] = ..., uid: _Optional[str] = ..., namespace: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class PodSandboxConfig(_message.Message):
    __slots__ = ("metadata", "hostname", "log_directory", "labels", "annotations", "linux")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    METADATA_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    LOG_DIRECTORY_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    LINUX_FIELD_NUMBER: _ClassVar[int]
    metadata: PodSandboxMetadata
    hostname: str
    log_directory: str
    labels: _containers.ScalarMap[str, str]
    annotations: _containers.ScalarMap[str, str]
    linux: LinuxPodSandboxConfig
    def __init__(self, metadata: _Optional[_Union[PodSandboxMetadata, _Mapping]] = ..., hostname: _Optional[str] = ..., log_directory: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., annotations: _Optional[_Mapping[str, str]] = ..., linux: _Optional[_Union[LinuxPodSandboxConfig, _Mapping]] = ...) -> None: ...

class RunPodSandboxRequest(_message.Message):
    __slots__ = ("config", "runtime_handler")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_HANDLER_FIELD_NUMBER: _ClassVar[int]
    config: PodSandboxConfig
    runtime_handler: str
    def __init__(self, config: _Optional[_Union[PodSandboxConfig, _Mapping]] = ..., runtime_handler: _Optional[str] = ...) -> None: ...

class RunPodSandboxResponse(_message.Message):
    __slots__ = ("pod_sandbox_id",)
    POD_SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    pod_sandbox_id: str
    def __init__(self, pod_sandbox_id: _Optional[str] = ...) -> None: ...

class StopPodSandboxRequest(_message.Message):
    __slots__ = ("pod_sandbox_id",)
    POD_SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    pod_sandbox_id: str
    def __init__(self, pod_sandbox_id: _Optional[str] = ...) -> None: ...

class StopPodSandboxResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RemovePodSandboxRequest(_message.Message):
    __slots__ = ("pod_sandbox_id",)
    POD_SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    pod_sandbox_id: str
    def __init__(self, pod_sandbox_id: _Optional[str] = ...) -> None: ...

class RemovePodSandboxResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PodSandboxStatusRequest(_message.Message):
    __slots__ = ("pod_sandbox_id", "verbose")
    POD_SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    VERBOSE_FIELD_NUMBER: _ClassVar[int]
    pod_sandbox_id: str
    verbose: bool
    def __init__(self, pod_sandbox_id: _Optional[str] = ..., verbose: _Optional[bool] = ...) -> None: ...

class PodSandboxStatus(_message.Message):
    __slots__ = ("id", "metadata", "state", "created_at", "labels", "annotations")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    id: str
    metadata: PodSandboxMetadata
    state: PodSandboxState
    created_at: int
    labels: _containers.ScalarMap[str, str]
    annotations: _containers.ScalarMap[str, str]
    def __init__(self, id: _Optional[str] = ..., metadata: _Optional[_Union[PodSandboxMetadata, _Mapping]] = ..., state: _Optional[_Union[PodSandboxState, str]] = ..., created_at: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., annotations: _Optional[_Mapping[str, str]] = ...) -> None: ...

class PodSandboxStatusResponse(_message.Message):
    __slots__ = ("status", "info")
    class InfoEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    STATUS_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    status: PodSandboxStatus
    info: _containers.ScalarMap[str, str]
    def __init__(self, status: _Optional[_Union[PodSandboxStatus, _Mapping]] = ..., info: _Optional[_Mapping[str, str]] = ...) -> None: ...

class PodSandboxStateValue(_message.Message):
    __slots__ = ("state",)
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: PodSandboxState
    def __init__(self, state: _Optional[_Union[PodSandboxState, str]] = ...) -> None: ...

class PodSandboxFilter(_message.Message):
    __slots__ = ("id", "state", "label_selector")
    class LabelSelectorEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    id: str
    state: PodSandboxStateValue
    label_selector: _containers.ScalarMap[str, str]
    def __init__(self, id: _Optional[str] = ..., state: _Optional[_Union[PodSandboxStateValue, _Mapping]] = ..., label_selector: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ListPodSandboxRequest(_message.Message):
    __slots__ = ("filter",)
    FILTER_FIELD_NUMBER: _ClassVar[int]
    filter: PodSandboxFilter
    def __init__(self, filter: _Optional[_Union[PodSandboxFilter, _Mapping]] = ...) -> None: ...

class PodSandbox(_message.Message):
    __slots__ = ("id", "metadata", "state", "created_at", "labels", "annotations")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    id: str
    metadata: PodSandboxMetadata
    state: PodSandboxState
    created_at: int
    labels: _containers.ScalarMap[str, str]
    annotations: _containers.ScalarMap[str, str]
    def __init__(self, id: _Optional[str] = ..., metadata: _Optional[_Union[PodSandboxMetadata, _Mapping]] = ..., state: _Optional[_Union[PodSandboxState, str]] = ..., created_at: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., annotations: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ListPodSandboxResponse(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[PodSandbox]
    def __init__(self, items: _Optional[_Iterable[_Union[PodSandbox, _Mapping]]] = ...) -> None: ...

class ImageSpec(_message.Message):
    __slots__ = ("image", "annotations")
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    image: str
    annotations: _containers.ScalarMap[str, str]
    def __init__(self, image: _Optional[str] = ..., annotations: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Mount(_message.Message):
    __slots__ = ("container_path", "host_path", "readonly", "selinux_relabel", "propagation")
    CONTAINER_PATH_FIELD_NUMBER: _ClassVar[int]
    HOST_PATH_FIELD_NUMBER: _ClassVar[int]
    READONLY_FIELD_NUMBER: _ClassVar[int]
    SELINUX_RELABEL_FIELD_NUMBER: _ClassVar[int]
    PROPAGATION_FIELD_NUMBER: _ClassVar[int]
    container_path: str
    host_path: str
    readonly: bool
    selinux_relabel: bool
    propagation: MountPropagation
    def __init__(self, container_path: _Optional[str] = ..., host_path: _Optional[str] = ..., readonly: _Optional[bool] = ..., selinux_relabel: _Optional[bool] = ..., propagation: _Optional[_Union[MountPropagation, str]] = ...) -> None: ...

class ContainerMetadata(_message.Message):
    __slots__ = ("name", "attempt")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    name: str
    attempt: int
    def __init__(self, name: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class Int64Value(_message.Message):
    __slots__ = ("value",)
    VALUE_FIELD_NUMBER: _ClassVar[int]
    value: int
    def __init__(self, value: _Optional[int] = ...) -> None: ...

class KeyValue(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class Capability(_message.Message):
    __slots__ = ("add_capabilities", "drop_capabilities", "add_ambient_capabilities")
    ADD_CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    DROP_CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    ADD_AMBIENT_CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    add_capabilities: _containers.RepeatedScalarFieldContainer[str]
    drop_capabilities: _containers.RepeatedScalarFieldContainer[str]
    add_ambient_capabilities: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, add_capabilities: _Optional[_Iterable[str]] = ..., drop_capabilities: _Optional[_Iterable[str]] = ..., add_ambient_capabilities: _Optional[_Iterable[str]] = ...) -> None: ...

class SecurityProfile(_message.Message):
    __slots__ = ("profile_type", "localhost_ref")
    class ProfileType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        RuntimeDefault: _ClassVar[SecurityProfile.ProfileType]
        Unconfined: _ClassVar[SecurityProfile.ProfileType]
        Localhost: _ClassVar[SecurityProfile.ProfileType]
    RuntimeDefault: SecurityProfile.ProfileType
    Unconfined: SecurityProfile.ProfileType
    Localhost: SecurityProfile.ProfileType
    PROFILE_TYPE_FIELD_NUMBER: _ClassVar[int]
    LOCALHOST_REF_FIELD_NUMBER: _ClassVar[int]
    profile_type: SecurityProfile.ProfileType
    localhost_ref: str
    def __init__(self, profile_type: _Optional[_Union[SecurityProfile.ProfileType, str]] = ..., localhost_ref: _Optional[str] = ...) -> None: ...

class LinuxContainerSecurityContext(_message.Message):
    __slots__ = ("capabilities", "privileged", "namespace_options", "run_as_user", "readonly_rootfs", "no_new_privs", "run_as_group", "seccomp")
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    PRIVILEGED_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_OPTIONS_FIELD_NUMBER: _ClassVar[int]
    RUN_AS_USER_FIELD_NUMBER: _ClassVar[int]
    READONLY_ROOTFS_FIELD_NUMBER: _ClassVar[int]
    NO_NEW_PRIVS_FIELD_NUMBER: _ClassVar[int]
    RUN_AS_GROUP_FIELD_NUMBER: _ClassVar[int]
    SECCOMP_FIELD_NUMBER: _ClassVar[int]
    capabilities: Capability
    privileged: bool
    namespace_options: NamespaceOption
    run_as_user: Int64Value
    readonly_rootfs: bool
    no_new_privs: bool
    run_as_group: Int64Value
    seccomp: SecurityProfile
    def __init__(self, capabilities: _Optional[_Union[Capability, _Mapping]] = ..., privileged: _Optional[bool] = ..., namespace_options: _Optional[_Union[NamespaceOption, _Mapping]] = ..., run_as_user: _Optional[_Union[Int64Value, _Mapping]] = ..., readonly_rootfs: _Optional[bool] = ..., no_new_privs: _Optional[bool] = ..., run_as_group: _Optional[_Union[Int64Value, _Mapping]] = ..., seccomp: _Optional[_Union[SecurityProfile, _Mapping]] = ...) -> None: ...

class LinuxContainerConfig(_message.Message):
    __slots__ = ("security_context",)
    SECURITY_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    security_context: LinuxContainerSecurityContext
    def __init__(self, security_context: _Optional[_Union[LinuxContainerSecurityContext, _Mapping]] = ...) -> None: ...

class ContainerConfig(_message.Message):
    __slots__ = ("metadata", "image", "command", "args", "working_dir", "envs", "mounts", "labels", "annotations", "log_path", "linux")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    METADATA_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    WORKING_DIR_FIELD_NUMBER: _ClassVar[int]
    ENVS_FIELD_NUMBER: _ClassVar[int]
    MOUNTS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    LOG_PATH_FIELD_NUMBER: _ClassVar[int]
    LINUX_FIELD_NUMBER: _ClassVar[int]
    metadata: ContainerMetadata
    image: ImageSpec
    command: _containers.RepeatedScalarFieldContainer[str]
    args: _containers.RepeatedScalarFieldContainer[str]
    working_dir: str
    envs: _containers.RepeatedCompositeFieldContainer[KeyValue]
    mounts: _containers.RepeatedCompositeFieldContainer[Mount]
    labels: _containers.ScalarMap[str, str]
    annotations: _containers.ScalarMap[str, str]
    log_path: str
    linux: LinuxContainerConfig
    def __init__(self, metadata: _Optional[_Union[ContainerMetadata, _Mapping]] = ..., image: _Optional[_Union[ImageSpec, _Mapping]] = ..., command: _Optional[_Iterable[str]] = ..., args: _Optional[_Iterable[str]] = ..., working_dir: _Optional[str] = ..., envs: _Optional[_Iterable[_Union[KeyValue, _Mapping]]] = ..., mounts: _Optional[_Iterable[_Union[Mount, _Mapping]]] = ..., labels: _Optional[_Mapping[str, str]] = ..., annotations: _Optional[_Mapping[str, str]] = ..., log_path: _Optional[str] = ..., linux: _Optional[_Union[LinuxContainerConfig, _Mapping]] = ...) -> None: ...

class CreateContainerRequest(_message.Message):
    __slots__ = ("pod_sandbox_id", "config", "sandbox_config")
    POD_SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_CONFIG_FIELD_NUMBER: _ClassVar[int]
    pod_sandbox_id: str
    config: ContainerConfig
    sandbox_config: PodSandboxConfig
    def __init__(self, pod_sandbox_id: _Optional[str] = ..., config: _Optional[_Union[ContainerConfig, _Mapping]] = ..., sandbox_config: _Optional[_Union[PodSandboxConfig, _Mapping]] = ...) -> None: ...

class CreateContainerResponse(_message.Message):
    __slots__ = ("container_id",)
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    def __init__(self, container_id: _Optional[str] = ...) -> None: ...

class StartContainerRequest(_message.Message):
    __slots__ = ("container_id",)
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    def __init__(self, container_id: _Optional[str] = ...) -> None: ...

class StartContainerResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StopContainerRequest(_message.Message):
    __slots__ = ("container_id", "timeout")
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    timeout: int
    def __init__(self, container_id: _Optional[str] = ..., timeout: _Optional[int] = ...) -> None: ...

class StopContainerResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RemoveContainerRequest(_message.Message):
    __slots__ = ("container_id",)
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    def __init__(self, container_id: _Optional[str] = ...) -> None: ...

class RemoveContainerResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ContainerStatusRequest(_message.Message):
    __slots__ = ("container_id", "verbose")
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    VERBOSE_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    verbose: bool
    def __init__(self, container_id: _Optional[str] = ..., verbose: _Optional[bool] = ...) -> None: ...

class ContainerStatus(_message.Message):
    __slots__ = ("id", "metadata", "state", "created_at", "started_at", "finished_at", "exit_code", "reason", "message", "log_path")
    ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LOG_PATH_FIELD_NUMBER: _ClassVar[int]
    id: str
    metadata: ContainerMetadata
    state: ContainerState
    created_at: int
    started_at: int
    finished_at: int
    exit_code: int
    reason: str
    message: str
    log_path: str
    def __init__(self, id: _Optional[str] = ..., metadata: _Optional[_Union[ContainerMetadata, _Mapping]] = ..., state: _Optional[_Union[ContainerState, str]] = ..., created_at: _Optional[int] = ..., started_at: _Optional[int] = ..., finished_at: _Optional[int] = ..., exit_code: _Optional[int] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., log_path: _Optional[str] = ...) -> None: ...

class ContainerStatusResponse(_message.Message):
    __slots__ = ("status", "info")
    class InfoEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    STATUS_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    status: ContainerStatus
    info: _containers.ScalarMap[str, str]
    def __init__(self, status: _Optional[_Union[ContainerStatus, _Mapping]] = ..., info: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Image(_message.Message):
    __slots__ = ("id", "repo_tags", "repo_digests", "size")
    ID_FIELD_NUMBER: _ClassVar[int]
    REPO_TAGS_FIELD_NUMBER: _ClassVar[int]
    REPO_DIGESTS_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    id: str
    repo_tags: _containers.RepeatedScalarFieldContainer[str]
    repo_digests: _containers.RepeatedScalarFieldContainer[str]
    size: int
    def __init__(self, id: _Optional[str] = ..., repo_tags: _Optional[_Iterable[str]] = ..., repo_digests: _Optional[_Iterable[str]] = ..., size: _Optional[int] = ...) -> None: ...

class ImageFilter(_message.Message):
    __slots__ = ("image",)
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    image: ImageSpec
    def __init__(self, image: _Optional[_Union[ImageSpec, _Mapping]] = ...) -> None: ...

class ListImagesRequest(_message.Message):
    __slots__ = ("filter",)
    FILTER_FIELD_NUMBER: _ClassVar[int]
    filter: ImageFilter
    def __init__(self, filter: _Optional[_Union[ImageFilter, _Mapping]] = ...) -> None: ...

class ListImagesResponse(_message.Message):
    __slots__ = ("images",)
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    images: _containers.RepeatedCompositeFieldContainer[Image]
    def __init__(self, images: _Optional[_Iterable[_Union[Image, _Mapping]]] = ...) -> None: ...

class ImageStatusRequest(_message.Message):
    __slots__ = ("image", "verbose")
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    VERBOSE_FIELD_NUMBER: _ClassVar[int]
    image: ImageSpec
    verbose: bool
    def __init__(self, image: _Optional[_Union[ImageSpec, _Mapping]] = ..., verbose: _Optional[bool] = ...) -> None: ...

class ImageStatusResponse(_message.Message):
    __slots__ = ("image", "info")
    class InfoEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    image: Image
    info: _containers.ScalarMap[str, str]
    def __init__(self, image: _Optional[_Union[Image, _Mapping]] = ..., info: _Optional[_Mapping[str, str]] = ...) -> None: ...
