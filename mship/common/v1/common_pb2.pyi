from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ErrorReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_REASON_UNSPECIFIED: _ClassVar[ErrorReason]
    MODEL_NOT_FOUND: _ClassVar[ErrorReason]
    CONTEXT_TOO_LONG: _ClassVar[ErrorReason]
    INVALID_PARAMETER: _ClassVar[ErrorReason]
    OVERLOADED: _ClassVar[ErrorReason]
    NOT_READY: _ClassVar[ErrorReason]
    ENGINE_ERROR: _ClassVar[ErrorReason]
    UNSUPPORTED_INPUT: _ClassVar[ErrorReason]
    STORE_UNAVAILABLE: _ClassVar[ErrorReason]
    NOT_FOUND: _ClassVar[ErrorReason]
    CONFLICT: _ClassVar[ErrorReason]
    DEPLOY_IN_PROGRESS: _ClassVar[ErrorReason]
    UNAUTHENTICATED: _ClassVar[ErrorReason]
    ENGINE_DIED: _ClassVar[ErrorReason]

class Loader(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LOADER_UNSPECIFIED: _ClassVar[Loader]
    LOADER_VLLM: _ClassVar[Loader]
    LOADER_LLAMA_CPP: _ClassVar[Loader]
    LOADER_PIPER: _ClassVar[Loader]
    LOADER_FASTER_WHISPER: _ClassVar[Loader]

class Usecase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    USECASE_UNSPECIFIED: _ClassVar[Usecase]
    USECASE_GENERATE: _ClassVar[Usecase]
    USECASE_EMBED: _ClassVar[Usecase]
    USECASE_SPEECH: _ClassVar[Usecase]
    USECASE_TRANSCRIPTION: _ClassVar[Usecase]
ERROR_REASON_UNSPECIFIED: ErrorReason
MODEL_NOT_FOUND: ErrorReason
CONTEXT_TOO_LONG: ErrorReason
INVALID_PARAMETER: ErrorReason
OVERLOADED: ErrorReason
NOT_READY: ErrorReason
ENGINE_ERROR: ErrorReason
UNSUPPORTED_INPUT: ErrorReason
STORE_UNAVAILABLE: ErrorReason
NOT_FOUND: ErrorReason
CONFLICT: ErrorReason
DEPLOY_IN_PROGRESS: ErrorReason
UNAUTHENTICATED: ErrorReason
ENGINE_DIED: ErrorReason
LOADER_UNSPECIFIED: Loader
LOADER_VLLM: Loader
LOADER_LLAMA_CPP: Loader
LOADER_PIPER: Loader
LOADER_FASTER_WHISPER: Loader
USECASE_UNSPECIFIED: Usecase
USECASE_GENERATE: Usecase
USECASE_EMBED: Usecase
USECASE_SPEECH: Usecase
USECASE_TRANSCRIPTION: Usecase

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "cached_tokens", "reasoning_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REASONING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    reasoning_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., reasoning_tokens: _Optional[int] = ...) -> None: ...

class AutoscalingConfig(_message.Message):
    __slots__ = ("min_replicas", "max_replicas", "target_ongoing_requests", "upscale_delay_s", "downscale_delay_s")
    MIN_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    MAX_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    TARGET_ONGOING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    UPSCALE_DELAY_S_FIELD_NUMBER: _ClassVar[int]
    DOWNSCALE_DELAY_S_FIELD_NUMBER: _ClassVar[int]
    min_replicas: int
    max_replicas: int
    target_ongoing_requests: float
    upscale_delay_s: float
    downscale_delay_s: float
    def __init__(self, min_replicas: _Optional[int] = ..., max_replicas: _Optional[int] = ..., target_ongoing_requests: _Optional[float] = ..., upscale_delay_s: _Optional[float] = ..., downscale_delay_s: _Optional[float] = ...) -> None: ...

class ModelSpec(_message.Message):
    __slots__ = ("name", "model", "loader", "usecase", "num_cpus", "num_gpus", "num_replicas", "autoscaling", "max_model_len", "engine_args", "tool_parser", "reasoning_parser", "max_num_seqs", "llama_cpp", "rate_limits", "max_ongoing_requests", "max_queued_requests", "stall_timeout_s")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    LOADER_FIELD_NUMBER: _ClassVar[int]
    USECASE_FIELD_NUMBER: _ClassVar[int]
    NUM_CPUS_FIELD_NUMBER: _ClassVar[int]
    NUM_GPUS_FIELD_NUMBER: _ClassVar[int]
    NUM_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    AUTOSCALING_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ARGS_FIELD_NUMBER: _ClassVar[int]
    TOOL_PARSER_FIELD_NUMBER: _ClassVar[int]
    REASONING_PARSER_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_SEQS_FIELD_NUMBER: _ClassVar[int]
    LLAMA_CPP_FIELD_NUMBER: _ClassVar[int]
    RATE_LIMITS_FIELD_NUMBER: _ClassVar[int]
    MAX_ONGOING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    STALL_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    name: str
    model: str
    loader: Loader
    usecase: Usecase
    num_cpus: float
    num_gpus: float
    num_replicas: int
    autoscaling: AutoscalingConfig
    max_model_len: int
    engine_args: _struct_pb2.Struct
    tool_parser: str
    reasoning_parser: str
    max_num_seqs: int
    llama_cpp: LlamaCppOptions
    rate_limits: RateLimits
    max_ongoing_requests: int
    max_queued_requests: int
    stall_timeout_s: float
    def __init__(self, name: _Optional[str] = ..., model: _Optional[str] = ..., loader: _Optional[_Union[Loader, str]] = ..., usecase: _Optional[_Union[Usecase, str]] = ..., num_cpus: _Optional[float] = ..., num_gpus: _Optional[float] = ..., num_replicas: _Optional[int] = ..., autoscaling: _Optional[_Union[AutoscalingConfig, _Mapping]] = ..., max_model_len: _Optional[int] = ..., engine_args: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., tool_parser: _Optional[str] = ..., reasoning_parser: _Optional[str] = ..., max_num_seqs: _Optional[int] = ..., llama_cpp: _Optional[_Union[LlamaCppOptions, _Mapping]] = ..., rate_limits: _Optional[_Union[RateLimits, _Mapping]] = ..., max_ongoing_requests: _Optional[int] = ..., max_queued_requests: _Optional[int] = ..., stall_timeout_s: _Optional[float] = ...) -> None: ...

class ReplicaLimits(_message.Message):
    __slots__ = ("max_ongoing_requests", "max_queued_requests")
    MAX_ONGOING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    max_ongoing_requests: int
    max_queued_requests: int
    def __init__(self, max_ongoing_requests: _Optional[int] = ..., max_queued_requests: _Optional[int] = ...) -> None: ...

class RateLimits(_message.Message):
    __slots__ = ("requests_per_minute", "tokens_per_minute")
    REQUESTS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    requests_per_minute: int
    tokens_per_minute: int
    def __init__(self, requests_per_minute: _Optional[int] = ..., tokens_per_minute: _Optional[int] = ...) -> None: ...

class LlamaCppOptions(_message.Message):
    __slots__ = ("n_ctx", "n_parallel", "n_threads", "n_gpu_layers", "chat_template", "server_binary", "server_args", "runtime")
    N_CTX_FIELD_NUMBER: _ClassVar[int]
    N_PARALLEL_FIELD_NUMBER: _ClassVar[int]
    N_THREADS_FIELD_NUMBER: _ClassVar[int]
    N_GPU_LAYERS_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    SERVER_BINARY_FIELD_NUMBER: _ClassVar[int]
    SERVER_ARGS_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    n_ctx: int
    n_parallel: int
    n_threads: int
    n_gpu_layers: int
    chat_template: str
    server_binary: str
    server_args: _containers.RepeatedScalarFieldContainer[str]
    runtime: str
    def __init__(self, n_ctx: _Optional[int] = ..., n_parallel: _Optional[int] = ..., n_threads: _Optional[int] = ..., n_gpu_layers: _Optional[int] = ..., chat_template: _Optional[str] = ..., server_binary: _Optional[str] = ..., server_args: _Optional[_Iterable[str]] = ..., runtime: _Optional[str] = ...) -> None: ...

class Endpoint(_message.Message):
    __slots__ = ("host", "port")
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    host: str
    port: int
    def __init__(self, host: _Optional[str] = ..., port: _Optional[int] = ...) -> None: ...
