from mship.common.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListOrder(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LIST_ORDER_UNSPECIFIED: _ClassVar[ListOrder]
    LIST_ORDER_ASC: _ClassVar[ListOrder]
    LIST_ORDER_DESC: _ClassVar[ListOrder]

class RunStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUN_STATUS_UNSPECIFIED: _ClassVar[RunStatus]
    RUN_STATUS_QUEUED: _ClassVar[RunStatus]
    RUN_STATUS_IN_PROGRESS: _ClassVar[RunStatus]
    RUN_STATUS_COMPLETED: _ClassVar[RunStatus]
    RUN_STATUS_INCOMPLETE: _ClassVar[RunStatus]
    RUN_STATUS_FAILED: _ClassVar[RunStatus]
    RUN_STATUS_CANCELLED: _ClassVar[RunStatus]
LIST_ORDER_UNSPECIFIED: ListOrder
LIST_ORDER_ASC: ListOrder
LIST_ORDER_DESC: ListOrder
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

class InputItem(_message.Message):
    __slots__ = ("id", "item_json")
    ID_FIELD_NUMBER: _ClassVar[int]
    ITEM_JSON_FIELD_NUMBER: _ClassVar[int]
    id: str
    item_json: str
    def __init__(self, id: _Optional[str] = ..., item_json: _Optional[str] = ...) -> None: ...

class StoredResponse(_message.Message):
    __slots__ = ("key", "previous_response_id", "response_json", "conversation_json", "created_at", "input_items", "run")
    KEY_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_RESPONSE_ID_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_JSON_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_JSON_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    INPUT_ITEMS_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    key: ResponseKey
    previous_response_id: str
    response_json: str
    conversation_json: str
    created_at: float
    input_items: _containers.RepeatedCompositeFieldContainer[InputItem]
    run: RunStatusRecord
    def __init__(self, key: _Optional[_Union[ResponseKey, _Mapping]] = ..., previous_response_id: _Optional[str] = ..., response_json: _Optional[str] = ..., conversation_json: _Optional[str] = ..., created_at: _Optional[float] = ..., input_items: _Optional[_Iterable[_Union[InputItem, _Mapping]]] = ..., run: _Optional[_Union[RunStatusRecord, _Mapping]] = ...) -> None: ...

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

class ListInputItemsRequest(_message.Message):
    __slots__ = ("key", "limit", "order", "after")
    KEY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    key: ResponseKey
    limit: int
    order: ListOrder
    after: str
    def __init__(self, key: _Optional[_Union[ResponseKey, _Mapping]] = ..., limit: _Optional[int] = ..., order: _Optional[_Union[ListOrder, str]] = ..., after: _Optional[str] = ...) -> None: ...

class ListInputItemsResponse(_message.Message):
    __slots__ = ("data", "first_id", "last_id", "has_more")
    DATA_FIELD_NUMBER: _ClassVar[int]
    FIRST_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_ID_FIELD_NUMBER: _ClassVar[int]
    HAS_MORE_FIELD_NUMBER: _ClassVar[int]
    data: _containers.RepeatedCompositeFieldContainer[InputItem]
    first_id: str
    last_id: str
    has_more: bool
    def __init__(self, data: _Optional[_Iterable[_Union[InputItem, _Mapping]]] = ..., first_id: _Optional[str] = ..., last_id: _Optional[str] = ..., has_more: _Optional[bool] = ...) -> None: ...

class RunStatusRecord(_message.Message):
    __slots__ = ("key", "status", "owner", "updated_at", "owner_expires_at", "created_at", "last_sequence", "detail")
    KEY_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    OWNER_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    key: ResponseKey
    status: RunStatus
    owner: str
    updated_at: float
    owner_expires_at: float
    created_at: float
    last_sequence: int
    detail: str
    def __init__(self, key: _Optional[_Union[ResponseKey, _Mapping]] = ..., status: _Optional[_Union[RunStatus, str]] = ..., owner: _Optional[str] = ..., updated_at: _Optional[float] = ..., owner_expires_at: _Optional[float] = ..., created_at: _Optional[float] = ..., last_sequence: _Optional[int] = ..., detail: _Optional[str] = ...) -> None: ...

class CreateRunRequest(_message.Message):
    __slots__ = ("response", "status", "owner", "lease_s", "failure_event_json")
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    LEASE_S_FIELD_NUMBER: _ClassVar[int]
    FAILURE_EVENT_JSON_FIELD_NUMBER: _ClassVar[int]
    response: StoredResponse
    status: RunStatus
    owner: str
    lease_s: float
    failure_event_json: str
    def __init__(self, response: _Optional[_Union[StoredResponse, _Mapping]] = ..., status: _Optional[_Union[RunStatus, str]] = ..., owner: _Optional[str] = ..., lease_s: _Optional[float] = ..., failure_event_json: _Optional[str] = ...) -> None: ...

class SetRunStatusRequest(_message.Message):
    __slots__ = ("key", "status", "expected", "owner", "lease_s")
    KEY_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    LEASE_S_FIELD_NUMBER: _ClassVar[int]
    key: ResponseKey
    status: RunStatus
    expected: _containers.RepeatedScalarFieldContainer[RunStatus]
    owner: str
    lease_s: float
    def __init__(self, key: _Optional[_Union[ResponseKey, _Mapping]] = ..., status: _Optional[_Union[RunStatus, str]] = ..., expected: _Optional[_Iterable[_Union[RunStatus, str]]] = ..., owner: _Optional[str] = ..., lease_s: _Optional[float] = ...) -> None: ...

class GetRunStatusRequest(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: ResponseKey
    def __init__(self, key: _Optional[_Union[ResponseKey, _Mapping]] = ...) -> None: ...

class RenewRunRequest(_message.Message):
    __slots__ = ("key", "owner", "lease_s")
    KEY_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    LEASE_S_FIELD_NUMBER: _ClassVar[int]
    key: ResponseKey
    owner: str
    lease_s: float
    def __init__(self, key: _Optional[_Union[ResponseKey, _Mapping]] = ..., owner: _Optional[str] = ..., lease_s: _Optional[float] = ...) -> None: ...

class FinishRunRequest(_message.Message):
    __slots__ = ("key", "status", "expected", "owner", "response", "events")
    KEY_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    key: ResponseKey
    status: RunStatus
    expected: _containers.RepeatedScalarFieldContainer[RunStatus]
    owner: str
    response: StoredResponse
    events: _containers.RepeatedCompositeFieldContainer[RunEvent]
    def __init__(self, key: _Optional[_Union[ResponseKey, _Mapping]] = ..., status: _Optional[_Union[RunStatus, str]] = ..., expected: _Optional[_Iterable[_Union[RunStatus, str]]] = ..., owner: _Optional[str] = ..., response: _Optional[_Union[StoredResponse, _Mapping]] = ..., events: _Optional[_Iterable[_Union[RunEvent, _Mapping]]] = ...) -> None: ...

class ExpireRunsRequest(_message.Message):
    __slots__ = ("limit",)
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    limit: int
    def __init__(self, limit: _Optional[int] = ...) -> None: ...

class ExpireRunsResponse(_message.Message):
    __slots__ = ("failed",)
    FAILED_FIELD_NUMBER: _ClassVar[int]
    failed: _containers.RepeatedCompositeFieldContainer[RunStatusRecord]
    def __init__(self, failed: _Optional[_Iterable[_Union[RunStatusRecord, _Mapping]]] = ...) -> None: ...

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
    __slots__ = ("key", "events", "owner")
    KEY_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    key: ResponseKey
    events: _containers.RepeatedCompositeFieldContainer[RunEvent]
    owner: str
    def __init__(self, key: _Optional[_Union[ResponseKey, _Mapping]] = ..., events: _Optional[_Iterable[_Union[RunEvent, _Mapping]]] = ..., owner: _Optional[str] = ...) -> None: ...

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

class StoredRun(_message.Message):
    __slots__ = ("record", "failure_event_json")
    RECORD_FIELD_NUMBER: _ClassVar[int]
    FAILURE_EVENT_JSON_FIELD_NUMBER: _ClassVar[int]
    record: RunStatusRecord
    failure_event_json: str
    def __init__(self, record: _Optional[_Union[RunStatusRecord, _Mapping]] = ..., failure_event_json: _Optional[str] = ...) -> None: ...

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
