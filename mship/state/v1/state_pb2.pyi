from mship.common.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RunStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUN_STATUS_UNSPECIFIED: _ClassVar[RunStatus]
    RUN_STATUS_QUEUED: _ClassVar[RunStatus]
    RUN_STATUS_IN_PROGRESS: _ClassVar[RunStatus]
    RUN_STATUS_COMPLETED: _ClassVar[RunStatus]
    RUN_STATUS_INCOMPLETE: _ClassVar[RunStatus]
    RUN_STATUS_FAILED: _ClassVar[RunStatus]
    RUN_STATUS_CANCELLED: _ClassVar[RunStatus]
RUN_STATUS_UNSPECIFIED: RunStatus
RUN_STATUS_QUEUED: RunStatus
RUN_STATUS_IN_PROGRESS: RunStatus
RUN_STATUS_COMPLETED: RunStatus
RUN_STATUS_INCOMPLETE: RunStatus
RUN_STATUS_FAILED: RunStatus
RUN_STATUS_CANCELLED: RunStatus

class ResponseKey(_message.Message):
    __slots__ = ("identity", "response_id")
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_ID_FIELD_NUMBER: _ClassVar[int]
    identity: str
    response_id: str
    def __init__(self, identity: _Optional[str] = ..., response_id: _Optional[str] = ...) -> None: ...

class StoredResponse(_message.Message):
    __slots__ = ("key", "previous_response_id", "response_json", "conversation_json", "created_at")
    KEY_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_RESPONSE_ID_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_JSON_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_JSON_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    key: ResponseKey
    previous_response_id: str
    response_json: str
    conversation_json: str
    created_at: float
    def __init__(self, key: _Optional[_Union[ResponseKey, _Mapping]] = ..., previous_response_id: _Optional[str] = ..., response_json: _Optional[str] = ..., conversation_json: _Optional[str] = ..., created_at: _Optional[float] = ...) -> None: ...

class PutResponseRequest(_message.Message):
    __slots__ = ("response", "create_only")
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    CREATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    response: StoredResponse
    create_only: bool
    def __init__(self, response: _Optional[_Union[StoredResponse, _Mapping]] = ..., create_only: _Optional[bool] = ...) -> None: ...

class PutResponseResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetResponseRequest(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: ResponseKey
    def __init__(self, key: _Optional[_Union[ResponseKey, _Mapping]] = ...) -> None: ...

class DeleteResponseRequest(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: ResponseKey
    def __init__(self, key: _Optional[_Union[ResponseKey, _Mapping]] = ...) -> None: ...

class DeleteResponseResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    def __init__(self, deleted: _Optional[bool] = ...) -> None: ...

class RunStatusRecord(_message.Message):
    __slots__ = ("key", "status", "owner", "updated_at")
    KEY_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    key: ResponseKey
    status: RunStatus
    owner: str
    updated_at: float
    def __init__(self, key: _Optional[_Union[ResponseKey, _Mapping]] = ..., status: _Optional[_Union[RunStatus, str]] = ..., owner: _Optional[str] = ..., updated_at: _Optional[float] = ...) -> None: ...

class SetRunStatusRequest(_message.Message):
    __slots__ = ("key", "status", "expected", "owner")
    KEY_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    key: ResponseKey
    status: RunStatus
    expected: _containers.RepeatedScalarFieldContainer[RunStatus]
    owner: str
    def __init__(self, key: _Optional[_Union[ResponseKey, _Mapping]] = ..., status: _Optional[_Union[RunStatus, str]] = ..., expected: _Optional[_Iterable[_Union[RunStatus, str]]] = ..., owner: _Optional[str] = ...) -> None: ...

class GetRunStatusRequest(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: ResponseKey
    def __init__(self, key: _Optional[_Union[ResponseKey, _Mapping]] = ...) -> None: ...

class RunEvent(_message.Message):
    __slots__ = ("sequence", "event_json", "terminal")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    EVENT_JSON_FIELD_NUMBER: _ClassVar[int]
    TERMINAL_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    event_json: str
    terminal: bool
    def __init__(self, sequence: _Optional[int] = ..., event_json: _Optional[str] = ..., terminal: _Optional[bool] = ...) -> None: ...

class AppendEventsRequest(_message.Message):
    __slots__ = ("key", "events")
    KEY_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    key: ResponseKey
    events: _containers.RepeatedCompositeFieldContainer[RunEvent]
    def __init__(self, key: _Optional[_Union[ResponseKey, _Mapping]] = ..., events: _Optional[_Iterable[_Union[RunEvent, _Mapping]]] = ...) -> None: ...

class AppendEventsResponse(_message.Message):
    __slots__ = ("last_sequence",)
    LAST_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    last_sequence: int
    def __init__(self, last_sequence: _Optional[int] = ...) -> None: ...

class ReadEventsRequest(_message.Message):
    __slots__ = ("key", "after_sequence", "follow")
    KEY_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    key: ResponseKey
    after_sequence: int
    follow: bool
    def __init__(self, key: _Optional[_Union[ResponseKey, _Mapping]] = ..., after_sequence: _Optional[int] = ..., follow: _Optional[bool] = ...) -> None: ...

class ModelSet(_message.Message):
    __slots__ = ("gateway", "models", "committed_at", "deploy_id")
    GATEWAY_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_AT_FIELD_NUMBER: _ClassVar[int]
    DEPLOY_ID_FIELD_NUMBER: _ClassVar[int]
    gateway: str
    models: _containers.RepeatedCompositeFieldContainer[_common_pb2.ModelSpec]
    committed_at: float
    deploy_id: str
    def __init__(self, gateway: _Optional[str] = ..., models: _Optional[_Iterable[_Union[_common_pb2.ModelSpec, _Mapping]]] = ..., committed_at: _Optional[float] = ..., deploy_id: _Optional[str] = ...) -> None: ...

class PutModelSetRequest(_message.Message):
    __slots__ = ("model_set",)
    MODEL_SET_FIELD_NUMBER: _ClassVar[int]
    model_set: ModelSet
    def __init__(self, model_set: _Optional[_Union[ModelSet, _Mapping]] = ...) -> None: ...

class PutModelSetResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetModelSetRequest(_message.Message):
    __slots__ = ("gateway",)
    GATEWAY_FIELD_NUMBER: _ClassVar[int]
    gateway: str
    def __init__(self, gateway: _Optional[str] = ...) -> None: ...
