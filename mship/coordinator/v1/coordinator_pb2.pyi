from mship.common.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DeployMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DEPLOY_MODE_UNSPECIFIED: _ClassVar[DeployMode]
    DEPLOY_MODE_ADDITIVE: _ClassVar[DeployMode]
    DEPLOY_MODE_RECONCILE: _ClassVar[DeployMode]

class ModelPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODEL_PHASE_UNSPECIFIED: _ClassVar[ModelPhase]
    MODEL_PHASE_SCHEDULED: _ClassVar[ModelPhase]
    MODEL_PHASE_LOADING: _ClassVar[ModelPhase]
    MODEL_PHASE_READY: _ClassVar[ModelPhase]
    MODEL_PHASE_FAILED: _ClassVar[ModelPhase]
    MODEL_PHASE_UNCHANGED: _ClassVar[ModelPhase]
    MODEL_PHASE_REMOVING: _ClassVar[ModelPhase]
    MODEL_PHASE_REMOVED: _ClassVar[ModelPhase]
    MODEL_PHASE_RESCALED: _ClassVar[ModelPhase]
    MODEL_PHASE_PENDING: _ClassVar[ModelPhase]

class DeployState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DEPLOY_STATE_UNSPECIFIED: _ClassVar[DeployState]
    DEPLOY_STATE_QUEUED: _ClassVar[DeployState]
    DEPLOY_STATE_RUNNING: _ClassVar[DeployState]
    DEPLOY_STATE_SUCCEEDED: _ClassVar[DeployState]
    DEPLOY_STATE_FAILED: _ClassVar[DeployState]
    DEPLOY_STATE_CANCELLED: _ClassVar[DeployState]

class LeaseEnd(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LEASE_END_UNSPECIFIED: _ClassVar[LeaseEnd]
    LEASE_END_RELEASED: _ClassVar[LeaseEnd]
    LEASE_END_EXPIRED: _ClassVar[LeaseEnd]
DEPLOY_MODE_UNSPECIFIED: DeployMode
DEPLOY_MODE_ADDITIVE: DeployMode
DEPLOY_MODE_RECONCILE: DeployMode
MODEL_PHASE_UNSPECIFIED: ModelPhase
MODEL_PHASE_SCHEDULED: ModelPhase
MODEL_PHASE_LOADING: ModelPhase
MODEL_PHASE_READY: ModelPhase
MODEL_PHASE_FAILED: ModelPhase
MODEL_PHASE_UNCHANGED: ModelPhase
MODEL_PHASE_REMOVING: ModelPhase
MODEL_PHASE_REMOVED: ModelPhase
MODEL_PHASE_RESCALED: ModelPhase
MODEL_PHASE_PENDING: ModelPhase
DEPLOY_STATE_UNSPECIFIED: DeployState
DEPLOY_STATE_QUEUED: DeployState
DEPLOY_STATE_RUNNING: DeployState
DEPLOY_STATE_SUCCEEDED: DeployState
DEPLOY_STATE_FAILED: DeployState
DEPLOY_STATE_CANCELLED: DeployState
LEASE_END_UNSPECIFIED: LeaseEnd
LEASE_END_RELEASED: LeaseEnd
LEASE_END_EXPIRED: LeaseEnd

class DeployRequest(_message.Message):
    __slots__ = ("models", "mode", "use_committed", "drain_timeout_s", "supersede")
    MODELS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    USE_COMMITTED_FIELD_NUMBER: _ClassVar[int]
    DRAIN_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    SUPERSEDE_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[_common_pb2.ModelSpec]
    mode: DeployMode
    use_committed: bool
    drain_timeout_s: float
    supersede: bool
    def __init__(self, models: _Optional[_Iterable[_Union[_common_pb2.ModelSpec, _Mapping]]] = ..., mode: _Optional[_Union[DeployMode, str]] = ..., use_committed: _Optional[bool] = ..., drain_timeout_s: _Optional[float] = ..., supersede: _Optional[bool] = ...) -> None: ...

class ModelProgress(_message.Message):
    __slots__ = ("name", "version", "phase", "reason", "ready_replicas", "target_replicas")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    READY_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    TARGET_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    phase: ModelPhase
    reason: str
    ready_replicas: int
    target_replicas: int
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., phase: _Optional[_Union[ModelPhase, str]] = ..., reason: _Optional[str] = ..., ready_replicas: _Optional[int] = ..., target_replicas: _Optional[int] = ...) -> None: ...

class DeployEvent(_message.Message):
    __slots__ = ("deploy_id", "state", "model", "message")
    DEPLOY_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    deploy_id: str
    state: DeployState
    model: ModelProgress
    message: str
    def __init__(self, deploy_id: _Optional[str] = ..., state: _Optional[_Union[DeployState, str]] = ..., model: _Optional[_Union[ModelProgress, _Mapping]] = ..., message: _Optional[str] = ...) -> None: ...

class Deployment(_message.Message):
    __slots__ = ("deploy_id", "state", "models", "error", "started_at", "finished_at")
    DEPLOY_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    deploy_id: str
    state: DeployState
    models: _containers.RepeatedCompositeFieldContainer[ModelProgress]
    error: str
    started_at: float
    finished_at: float
    def __init__(self, deploy_id: _Optional[str] = ..., state: _Optional[_Union[DeployState, str]] = ..., models: _Optional[_Iterable[_Union[ModelProgress, _Mapping]]] = ..., error: _Optional[str] = ..., started_at: _Optional[float] = ..., finished_at: _Optional[float] = ...) -> None: ...

class GetDeploymentRequest(_message.Message):
    __slots__ = ("deploy_id",)
    DEPLOY_ID_FIELD_NUMBER: _ClassVar[int]
    deploy_id: str
    def __init__(self, deploy_id: _Optional[str] = ...) -> None: ...

class CancelDeployRequest(_message.Message):
    __slots__ = ("deploy_id",)
    DEPLOY_ID_FIELD_NUMBER: _ClassVar[int]
    deploy_id: str
    def __init__(self, deploy_id: _Optional[str] = ...) -> None: ...

class AcquireLeaseRequest(_message.Message):
    __slots__ = ("node_id", "holder", "ttl_s", "wait_s")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    holder: str
    ttl_s: float
    wait_s: float
    def __init__(self, node_id: _Optional[str] = ..., holder: _Optional[str] = ..., ttl_s: _Optional[float] = ..., wait_s: _Optional[float] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("lease_id", "granted", "node_id", "holder", "expires_at")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    granted: bool
    node_id: str
    holder: str
    expires_at: float
    def __init__(self, lease_id: _Optional[str] = ..., granted: _Optional[bool] = ..., node_id: _Optional[str] = ..., holder: _Optional[str] = ..., expires_at: _Optional[float] = ...) -> None: ...

class RenewLeaseRequest(_message.Message):
    __slots__ = ("lease_id", "ttl_s")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    ttl_s: float
    def __init__(self, lease_id: _Optional[str] = ..., ttl_s: _Optional[float] = ...) -> None: ...

class ReleaseLeaseRequest(_message.Message):
    __slots__ = ("lease_id",)
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    def __init__(self, lease_id: _Optional[str] = ...) -> None: ...

class ReleaseLeaseResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListLeasesRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class LeaseRecord(_message.Message):
    __slots__ = ("lease_id", "node_id", "holder", "granted_at", "ended_at", "end")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    GRANTED_AT_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    node_id: str
    holder: str
    granted_at: float
    ended_at: float
    end: LeaseEnd
    def __init__(self, lease_id: _Optional[str] = ..., node_id: _Optional[str] = ..., holder: _Optional[str] = ..., granted_at: _Optional[float] = ..., ended_at: _Optional[float] = ..., end: _Optional[_Union[LeaseEnd, str]] = ...) -> None: ...

class ListLeasesResponse(_message.Message):
    __slots__ = ("leases",)
    LEASES_FIELD_NUMBER: _ClassVar[int]
    leases: _containers.RepeatedCompositeFieldContainer[LeaseRecord]
    def __init__(self, leases: _Optional[_Iterable[_Union[LeaseRecord, _Mapping]]] = ...) -> None: ...

class ReplicaInfo(_message.Message):
    __slots__ = ("replica_id", "model", "version", "endpoint", "node_id", "pid", "max_model_len", "spec", "engine_load_s", "embedding_dimension", "accepts_images")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    ENGINE_LOAD_S_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_DIMENSION_FIELD_NUMBER: _ClassVar[int]
    ACCEPTS_IMAGES_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    model: str
    version: str
    endpoint: _common_pb2.Endpoint
    node_id: str
    pid: int
    max_model_len: int
    spec: _common_pb2.ModelSpec
    engine_load_s: float
    embedding_dimension: int
    accepts_images: bool
    def __init__(self, replica_id: _Optional[str] = ..., model: _Optional[str] = ..., version: _Optional[str] = ..., endpoint: _Optional[_Union[_common_pb2.Endpoint, _Mapping]] = ..., node_id: _Optional[str] = ..., pid: _Optional[int] = ..., max_model_len: _Optional[int] = ..., spec: _Optional[_Union[_common_pb2.ModelSpec, _Mapping]] = ..., engine_load_s: _Optional[float] = ..., embedding_dimension: _Optional[int] = ..., accepts_images: _Optional[bool] = ...) -> None: ...

class RegisterReplicaRequest(_message.Message):
    __slots__ = ("replica",)
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    replica: ReplicaInfo
    def __init__(self, replica: _Optional[_Union[ReplicaInfo, _Mapping]] = ...) -> None: ...

class RegisterReplicaResponse(_message.Message):
    __slots__ = ("heartbeat_interval_s",)
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    heartbeat_interval_s: float
    def __init__(self, heartbeat_interval_s: _Optional[float] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("replica_id", "inflight_calls", "running_requests", "waiting_requests", "leaving", "unhealthy", "limits")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_CALLS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    WAITING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    LEAVING_FIELD_NUMBER: _ClassVar[int]
    UNHEALTHY_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    inflight_calls: int
    running_requests: int
    waiting_requests: int
    leaving: bool
    unhealthy: bool
    limits: _common_pb2.ReplicaLimits
    def __init__(self, replica_id: _Optional[str] = ..., inflight_calls: _Optional[int] = ..., running_requests: _Optional[int] = ..., waiting_requests: _Optional[int] = ..., leaving: _Optional[bool] = ..., unhealthy: _Optional[bool] = ..., limits: _Optional[_Union[_common_pb2.ReplicaLimits, _Mapping]] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("known", "limits", "routed")
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    ROUTED_FIELD_NUMBER: _ClassVar[int]
    known: bool
    limits: _common_pb2.ReplicaLimits
    routed: bool
    def __init__(self, known: _Optional[bool] = ..., limits: _Optional[_Union[_common_pb2.ReplicaLimits, _Mapping]] = ..., routed: _Optional[bool] = ...) -> None: ...

class ModelRoute(_message.Message):
    __slots__ = ("name", "version", "usecase", "max_model_len", "replicas", "embedding_dimension", "rate_limits", "scale_to_zero", "accepts_images")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    USECASE_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_DIMENSION_FIELD_NUMBER: _ClassVar[int]
    RATE_LIMITS_FIELD_NUMBER: _ClassVar[int]
    SCALE_TO_ZERO_FIELD_NUMBER: _ClassVar[int]
    ACCEPTS_IMAGES_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    usecase: _common_pb2.Usecase
    max_model_len: int
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaInfo]
    embedding_dimension: int
    rate_limits: _common_pb2.RateLimits
    scale_to_zero: bool
    accepts_images: bool
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., usecase: _Optional[_Union[_common_pb2.Usecase, str]] = ..., max_model_len: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[ReplicaInfo, _Mapping]]] = ..., embedding_dimension: _Optional[int] = ..., rate_limits: _Optional[_Union[_common_pb2.RateLimits, _Mapping]] = ..., scale_to_zero: _Optional[bool] = ..., accepts_images: _Optional[bool] = ...) -> None: ...

class RoutingSnapshot(_message.Message):
    __slots__ = ("version", "models", "pending", "unhealthy")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    UNHEALTHY_FIELD_NUMBER: _ClassVar[int]
    version: int
    models: _containers.RepeatedCompositeFieldContainer[ModelRoute]
    pending: _containers.RepeatedScalarFieldContainer[str]
    unhealthy: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, version: _Optional[int] = ..., models: _Optional[_Iterable[_Union[ModelRoute, _Mapping]]] = ..., pending: _Optional[_Iterable[str]] = ..., unhealthy: _Optional[_Iterable[str]] = ...) -> None: ...

class Keepalive(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class RoutingUpdate(_message.Message):
    __slots__ = ("snapshot", "keepalive")
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    KEEPALIVE_FIELD_NUMBER: _ClassVar[int]
    snapshot: RoutingSnapshot
    keepalive: Keepalive
    def __init__(self, snapshot: _Optional[_Union[RoutingSnapshot, _Mapping]] = ..., keepalive: _Optional[_Union[Keepalive, _Mapping]] = ...) -> None: ...

class WatchRoutingRequest(_message.Message):
    __slots__ = ("known_version", "subscriber_id")
    KNOWN_VERSION_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBER_ID_FIELD_NUMBER: _ClassVar[int]
    known_version: int
    subscriber_id: str
    def __init__(self, known_version: _Optional[int] = ..., subscriber_id: _Optional[str] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ("include_serve_apps",)
    INCLUDE_SERVE_APPS_FIELD_NUMBER: _ClassVar[int]
    include_serve_apps: bool
    def __init__(self, include_serve_apps: _Optional[bool] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("spec", "version", "app_name", "ready_replicas", "load_time_s")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    APP_NAME_FIELD_NUMBER: _ClassVar[int]
    READY_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    LOAD_TIME_S_FIELD_NUMBER: _ClassVar[int]
    spec: _common_pb2.ModelSpec
    version: str
    app_name: str
    ready_replicas: int
    load_time_s: float
    def __init__(self, spec: _Optional[_Union[_common_pb2.ModelSpec, _Mapping]] = ..., version: _Optional[str] = ..., app_name: _Optional[str] = ..., ready_replicas: _Optional[int] = ..., load_time_s: _Optional[float] = ...) -> None: ...

class ServeApp(_message.Message):
    __slots__ = ("name", "status", "running_replicas", "target_replicas")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    TARGET_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    name: str
    status: str
    running_replicas: int
    target_replicas: int
    def __init__(self, name: _Optional[str] = ..., status: _Optional[str] = ..., running_replicas: _Optional[int] = ..., target_replicas: _Optional[int] = ...) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models", "routing_version", "apps")
    MODELS_FIELD_NUMBER: _ClassVar[int]
    ROUTING_VERSION_FIELD_NUMBER: _ClassVar[int]
    APPS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelInfo]
    routing_version: int
    apps: _containers.RepeatedCompositeFieldContainer[ServeApp]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelInfo, _Mapping]]] = ..., routing_version: _Optional[int] = ..., apps: _Optional[_Iterable[_Union[ServeApp, _Mapping]]] = ...) -> None: ...

class ClusterStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeStatus(_message.Message):
    __slots__ = ("node_id", "name", "address", "alive", "is_head", "capabilities", "resources")
    class ResourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    IS_HEAD_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    name: str
    address: str
    alive: bool
    is_head: bool
    capabilities: _containers.RepeatedScalarFieldContainer[str]
    resources: _containers.ScalarMap[str, float]
    def __init__(self, node_id: _Optional[str] = ..., name: _Optional[str] = ..., address: _Optional[str] = ..., alive: _Optional[bool] = ..., is_head: _Optional[bool] = ..., capabilities: _Optional[_Iterable[str]] = ..., resources: _Optional[_Mapping[str, float]] = ...) -> None: ...

class ReplicaStatus(_message.Message):
    __slots__ = ("replica_id", "node_id", "endpoint", "state", "running_requests", "queued_requests", "limits")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    RUNNING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    node_id: str
    endpoint: str
    state: str
    running_requests: int
    queued_requests: int
    limits: _common_pb2.ReplicaLimits
    def __init__(self, replica_id: _Optional[str] = ..., node_id: _Optional[str] = ..., endpoint: _Optional[str] = ..., state: _Optional[str] = ..., running_requests: _Optional[int] = ..., queued_requests: _Optional[int] = ..., limits: _Optional[_Union[_common_pb2.ReplicaLimits, _Mapping]] = ...) -> None: ...

class ModelStatus(_message.Message):
    __slots__ = ("name", "version", "replicas")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaStatus]
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., replicas: _Optional[_Iterable[_Union[ReplicaStatus, _Mapping]]] = ...) -> None: ...

class PendingModel(_message.Message):
    __slots__ = ("name", "reason")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    name: str
    reason: str
    def __init__(self, name: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class RequestReplicaRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class RequestReplicaResponse(_message.Message):
    __slots__ = ("starting", "reason")
    STARTING_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    starting: bool
    reason: str
    def __init__(self, starting: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class ClusterStatusResponse(_message.Message):
    __slots__ = ("nodes", "models", "pending")
    NODES_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeStatus]
    models: _containers.RepeatedCompositeFieldContainer[ModelStatus]
    pending: _containers.RepeatedCompositeFieldContainer[PendingModel]
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeStatus, _Mapping]]] = ..., models: _Optional[_Iterable[_Union[ModelStatus, _Mapping]]] = ..., pending: _Optional[_Iterable[_Union[PendingModel, _Mapping]]] = ...) -> None: ...
