from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DeviceStatus(_message.Message):
    __slots__ = ("uuid", "index", "healthy", "numa", "health_reason", "model", "pci_bus_id")
    UUID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    NUMA_FIELD_NUMBER: _ClassVar[int]
    HEALTH_REASON_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PCI_BUS_ID_FIELD_NUMBER: _ClassVar[int]
    uuid: str
    index: int
    healthy: bool
    numa: int
    health_reason: str
    model: str
    pci_bus_id: str
    def __init__(self, uuid: _Optional[str] = ..., index: _Optional[int] = ..., healthy: _Optional[bool] = ..., numa: _Optional[int] = ..., health_reason: _Optional[str] = ..., model: _Optional[str] = ..., pci_bus_id: _Optional[str] = ...) -> None: ...

class RegistrationStatus(_message.Message):
    __slots__ = ("registered", "last_registration_unix", "count", "last_error", "failed_attempts")
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    LAST_REGISTRATION_UNIX_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    FAILED_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    registered: bool
    last_registration_unix: float
    count: int
    last_error: str
    failed_attempts: int
    def __init__(self, registered: _Optional[bool] = ..., last_registration_unix: _Optional[float] = ..., count: _Optional[int] = ..., last_error: _Optional[str] = ..., failed_attempts: _Optional[int] = ...) -> None: ...

class GetStatusResponse(_message.Message):
    __slots__ = ("resource_name", "kubelet_dir", "socket_name", "topology_name", "backend", "node_name", "devices", "registration", "device_list_strategy", "watchers", "version")
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    KUBELET_DIR_FIELD_NUMBER: _ClassVar[int]
    SOCKET_NAME_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_NAME_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_FIELD_NUMBER: _ClassVar[int]
    DEVICE_LIST_STRATEGY_FIELD_NUMBER: _ClassVar[int]
    WATCHERS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    resource_name: str
    kubelet_dir: str
    socket_name: str
    topology_name: str
    backend: str
    node_name: str
    devices: _containers.RepeatedCompositeFieldContainer[DeviceStatus]
    registration: RegistrationStatus
    device_list_strategy: str
    watchers: int
    version: str
    def __init__(self, resource_name: _Optional[str] = ..., kubelet_dir: _Optional[str] = ..., socket_name: _Optional[str] = ..., topology_name: _Optional[str] = ..., backend: _Optional[str] = ..., node_name: _Optional[str] = ..., devices: _Optional[_Iterable[_Union[DeviceStatus, _Mapping]]] = ..., registration: _Optional[_Union[RegistrationStatus, _Mapping]] = ..., device_list_strategy: _Optional[str] = ..., watchers: _Optional[int] = ..., version: _Optional[str] = ...) -> None: ...
