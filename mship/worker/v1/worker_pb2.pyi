from mship.common.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LoadPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LOAD_PHASE_UNSPECIFIED: _ClassVar[LoadPhase]
    LOAD_PHASE_RESOLVING: _ClassVar[LoadPhase]
    LOAD_PHASE_LOADING: _ClassVar[LoadPhase]
    LOAD_PHASE_WARMING: _ClassVar[LoadPhase]
    LOAD_PHASE_READY: _ClassVar[LoadPhase]
    LOAD_PHASE_FAILED: _ClassVar[LoadPhase]

class ToolChoiceMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOOL_CHOICE_MODE_UNSPECIFIED: _ClassVar[ToolChoiceMode]
    TOOL_CHOICE_MODE_AUTO: _ClassVar[ToolChoiceMode]
    TOOL_CHOICE_MODE_NONE: _ClassVar[ToolChoiceMode]
    TOOL_CHOICE_MODE_REQUIRED: _ClassVar[ToolChoiceMode]
    TOOL_CHOICE_MODE_FUNCTION: _ClassVar[ToolChoiceMode]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_TOOL_CALLS: _ClassVar[FinishReason]
    FINISH_REASON_CANCELLED: _ClassVar[FinishReason]
    FINISH_REASON_ERROR: _ClassVar[FinishReason]

class AudioFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    AUDIO_FORMAT_UNSPECIFIED: _ClassVar[AudioFormat]
    AUDIO_FORMAT_WAV: _ClassVar[AudioFormat]
    AUDIO_FORMAT_PCM: _ClassVar[AudioFormat]
    AUDIO_FORMAT_MP3: _ClassVar[AudioFormat]
    AUDIO_FORMAT_FLAC: _ClassVar[AudioFormat]
    AUDIO_FORMAT_AAC: _ClassVar[AudioFormat]
    AUDIO_FORMAT_OPUS: _ClassVar[AudioFormat]
LOAD_PHASE_UNSPECIFIED: LoadPhase
LOAD_PHASE_RESOLVING: LoadPhase
LOAD_PHASE_LOADING: LoadPhase
LOAD_PHASE_WARMING: LoadPhase
LOAD_PHASE_READY: LoadPhase
LOAD_PHASE_FAILED: LoadPhase
TOOL_CHOICE_MODE_UNSPECIFIED: ToolChoiceMode
TOOL_CHOICE_MODE_AUTO: ToolChoiceMode
TOOL_CHOICE_MODE_NONE: ToolChoiceMode
TOOL_CHOICE_MODE_REQUIRED: ToolChoiceMode
TOOL_CHOICE_MODE_FUNCTION: ToolChoiceMode
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_TOOL_CALLS: FinishReason
FINISH_REASON_CANCELLED: FinishReason
FINISH_REASON_ERROR: FinishReason
AUDIO_FORMAT_UNSPECIFIED: AudioFormat
AUDIO_FORMAT_WAV: AudioFormat
AUDIO_FORMAT_PCM: AudioFormat
AUDIO_FORMAT_MP3: AudioFormat
AUDIO_FORMAT_FLAC: AudioFormat
AUDIO_FORMAT_AAC: AudioFormat
AUDIO_FORMAT_OPUS: AudioFormat

class LoadRequest(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: _common_pb2.ModelSpec
    def __init__(self, spec: _Optional[_Union[_common_pb2.ModelSpec, _Mapping]] = ...) -> None: ...

class LoadProgress(_message.Message):
    __slots__ = ("phase", "message", "elapsed_s", "max_model_len", "at")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_S_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    phase: LoadPhase
    message: str
    elapsed_s: float
    max_model_len: int
    at: float
    def __init__(self, phase: _Optional[_Union[LoadPhase, str]] = ..., message: _Optional[str] = ..., elapsed_s: _Optional[float] = ..., max_model_len: _Optional[int] = ..., at: _Optional[float] = ...) -> None: ...

class ContentPart(_message.Message):
    __slots__ = ("text", "image_url")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    IMAGE_URL_FIELD_NUMBER: _ClassVar[int]
    text: str
    image_url: str
    def __init__(self, text: _Optional[str] = ..., image_url: _Optional[str] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("id", "name", "arguments")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    arguments: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., arguments: _Optional[str] = ...) -> None: ...

class ChatMessage(_message.Message):
    __slots__ = ("role", "content", "parts", "name", "tool_call_id", "tool_calls", "reasoning")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    REASONING_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    parts: ContentParts
    name: str
    tool_call_id: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    reasoning: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ..., parts: _Optional[_Union[ContentParts, _Mapping]] = ..., name: _Optional[str] = ..., tool_call_id: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., reasoning: _Optional[str] = ...) -> None: ...

class ContentParts(_message.Message):
    __slots__ = ("parts",)
    PARTS_FIELD_NUMBER: _ClassVar[int]
    parts: _containers.RepeatedCompositeFieldContainer[ContentPart]
    def __init__(self, parts: _Optional[_Iterable[_Union[ContentPart, _Mapping]]] = ...) -> None: ...

class ChatInput(_message.Message):
    __slots__ = ("messages", "continue_final_message", "chat_template_kwargs_json")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    CONTINUE_FINAL_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_KWARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    continue_final_message: bool
    chat_template_kwargs_json: str
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., continue_final_message: _Optional[bool] = ..., chat_template_kwargs_json: _Optional[str] = ...) -> None: ...

class PromptInput(_message.Message):
    __slots__ = ("text", "token_ids")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class Tool(_message.Message):
    __slots__ = ("name", "description", "parameters_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    parameters_json: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., parameters_json: _Optional[str] = ...) -> None: ...

class ToolChoice(_message.Message):
    __slots__ = ("mode", "function_name")
    MODE_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_NAME_FIELD_NUMBER: _ClassVar[int]
    mode: ToolChoiceMode
    function_name: str
    def __init__(self, mode: _Optional[_Union[ToolChoiceMode, str]] = ..., function_name: _Optional[str] = ...) -> None: ...

class ResponseFormat(_message.Message):
    __slots__ = ("text", "json_object", "json_schema", "regex", "choice")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    JSON_OBJECT_FIELD_NUMBER: _ClassVar[int]
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    text: bool
    json_object: bool
    json_schema: JsonSchema
    regex: str
    choice: ChoiceList
    def __init__(self, text: _Optional[bool] = ..., json_object: _Optional[bool] = ..., json_schema: _Optional[_Union[JsonSchema, _Mapping]] = ..., regex: _Optional[str] = ..., choice: _Optional[_Union[ChoiceList, _Mapping]] = ...) -> None: ...

class JsonSchema(_message.Message):
    __slots__ = ("name", "schema_json", "strict")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    STRICT_FIELD_NUMBER: _ClassVar[int]
    name: str
    schema_json: str
    strict: bool
    def __init__(self, name: _Optional[str] = ..., schema_json: _Optional[str] = ..., strict: _Optional[bool] = ...) -> None: ...

class ChoiceList(_message.Message):
    __slots__ = ("choices",)
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    choices: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, choices: _Optional[_Iterable[str]] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "seed", "stop", "stop_token_ids", "ignore_eos", "min_tokens", "n", "logprobs", "top_logprobs", "keep_special_tokens", "include_stop_str_in_output")
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    KEEP_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_STOP_STR_IN_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    seed: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    ignore_eos: bool
    min_tokens: int
    n: int
    logprobs: bool
    top_logprobs: int
    keep_special_tokens: bool
    include_stop_str_in_output: bool
    def __init__(self, max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., min_p: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., ignore_eos: _Optional[bool] = ..., min_tokens: _Optional[int] = ..., n: _Optional[int] = ..., logprobs: _Optional[bool] = ..., top_logprobs: _Optional[int] = ..., keep_special_tokens: _Optional[bool] = ..., include_stop_str_in_output: _Optional[bool] = ...) -> None: ...

class InferRequest(_message.Message):
    __slots__ = ("request_id", "model", "chat", "prompt", "sampling", "tools", "tool_choice", "parallel_tool_calls", "response_format", "cache_salt", "priority", "parse_reasoning", "delivery")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CHAT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CHOICE_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FORMAT_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    PARSE_REASONING_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    chat: ChatInput
    prompt: PromptInput
    sampling: SamplingParams
    tools: _containers.RepeatedCompositeFieldContainer[Tool]
    tool_choice: ToolChoice
    parallel_tool_calls: bool
    response_format: ResponseFormat
    cache_salt: str
    priority: int
    parse_reasoning: bool
    delivery: Delivery
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., chat: _Optional[_Union[ChatInput, _Mapping]] = ..., prompt: _Optional[_Union[PromptInput, _Mapping]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., tools: _Optional[_Iterable[_Union[Tool, _Mapping]]] = ..., tool_choice: _Optional[_Union[ToolChoice, _Mapping]] = ..., parallel_tool_calls: _Optional[bool] = ..., response_format: _Optional[_Union[ResponseFormat, _Mapping]] = ..., cache_salt: _Optional[str] = ..., priority: _Optional[int] = ..., parse_reasoning: _Optional[bool] = ..., delivery: _Optional[_Union[Delivery, _Mapping]] = ...) -> None: ...

class Delivery(_message.Message):
    __slots__ = ("id", "tag")
    ID_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    id: str
    tag: int
    def __init__(self, id: _Optional[str] = ..., tag: _Optional[int] = ...) -> None: ...

class TopLogprob(_message.Message):
    __slots__ = ("token", "logprob", "bytes")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    token: str
    logprob: float
    bytes: bytes
    def __init__(self, token: _Optional[str] = ..., logprob: _Optional[float] = ..., bytes: _Optional[bytes] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token", "logprob", "bytes", "top")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    token: str
    logprob: float
    bytes: bytes
    top: _containers.RepeatedCompositeFieldContainer[TopLogprob]
    def __init__(self, token: _Optional[str] = ..., logprob: _Optional[float] = ..., bytes: _Optional[bytes] = ..., top: _Optional[_Iterable[_Union[TopLogprob, _Mapping]]] = ...) -> None: ...

class ToolCallDelta(_message.Message):
    __slots__ = ("index", "id", "name", "arguments")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    index: int
    id: str
    name: str
    arguments: str
    def __init__(self, index: _Optional[int] = ..., id: _Optional[str] = ..., name: _Optional[str] = ..., arguments: _Optional[str] = ...) -> None: ...

class Delta(_message.Message):
    __slots__ = ("index", "text", "reasoning", "tool_calls", "logprobs", "token_count")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    REASONING_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    index: int
    text: str
    reasoning: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCallDelta]
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    token_count: int
    def __init__(self, index: _Optional[int] = ..., text: _Optional[str] = ..., reasoning: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCallDelta, _Mapping]]] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., token_count: _Optional[int] = ...) -> None: ...

class ChoiceFinish(_message.Message):
    __slots__ = ("index", "finish_reason", "stop_sequence")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    STOP_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    index: int
    finish_reason: FinishReason
    stop_sequence: str
    def __init__(self, index: _Optional[int] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., stop_sequence: _Optional[str] = ...) -> None: ...

class Final(_message.Message):
    __slots__ = ("choices", "usage", "delivered")
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    DELIVERED_FIELD_NUMBER: _ClassVar[int]
    choices: _containers.RepeatedCompositeFieldContainer[ChoiceFinish]
    usage: _common_pb2.Usage
    delivered: int
    def __init__(self, choices: _Optional[_Iterable[_Union[ChoiceFinish, _Mapping]]] = ..., usage: _Optional[_Union[_common_pb2.Usage, _Mapping]] = ..., delivered: _Optional[int] = ...) -> None: ...

class InferEvent(_message.Message):
    __slots__ = ("delta", "final")
    DELTA_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    delta: Delta
    final: Final
    def __init__(self, delta: _Optional[_Union[Delta, _Mapping]] = ..., final: _Optional[_Union[Final, _Mapping]] = ...) -> None: ...

class DeliverRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DeliveryBatch(_message.Message):
    __slots__ = ("delivery_id", "tags", "events")
    DELIVERY_ID_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    delivery_id: str
    tags: _containers.RepeatedScalarFieldContainer[int]
    events: _containers.RepeatedCompositeFieldContainer[InferEvent]
    def __init__(self, delivery_id: _Optional[str] = ..., tags: _Optional[_Iterable[int]] = ..., events: _Optional[_Iterable[_Union[InferEvent, _Mapping]]] = ...) -> None: ...

class EmbedRequest(_message.Message):
    __slots__ = ("request_id", "model", "inputs", "dimensions", "prompts")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    inputs: _containers.RepeatedScalarFieldContainer[str]
    dimensions: int
    prompts: _containers.RepeatedCompositeFieldContainer[PromptInput]
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., inputs: _Optional[_Iterable[str]] = ..., dimensions: _Optional[int] = ..., prompts: _Optional[_Iterable[_Union[PromptInput, _Mapping]]] = ...) -> None: ...

class Embedding(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, values: _Optional[_Iterable[float]] = ...) -> None: ...

class EmbedResponse(_message.Message):
    __slots__ = ("embeddings", "usage")
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    embeddings: _containers.RepeatedCompositeFieldContainer[Embedding]
    usage: _common_pb2.Usage
    def __init__(self, embeddings: _Optional[_Iterable[_Union[Embedding, _Mapping]]] = ..., usage: _Optional[_Union[_common_pb2.Usage, _Mapping]] = ...) -> None: ...

class SynthesizeRequest(_message.Message):
    __slots__ = ("request_id", "model", "input", "voice", "speed", "format")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    VOICE_FIELD_NUMBER: _ClassVar[int]
    SPEED_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    input: str
    voice: str
    speed: float
    format: AudioFormat
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., input: _Optional[str] = ..., voice: _Optional[str] = ..., speed: _Optional[float] = ..., format: _Optional[_Union[AudioFormat, str]] = ...) -> None: ...

class AudioStart(_message.Message):
    __slots__ = ("format", "sample_rate", "channels")
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    format: AudioFormat
    sample_rate: int
    channels: int
    def __init__(self, format: _Optional[_Union[AudioFormat, str]] = ..., sample_rate: _Optional[int] = ..., channels: _Optional[int] = ...) -> None: ...

class SynthesizeDone(_message.Message):
    __slots__ = ("audio_seconds", "input_characters")
    AUDIO_SECONDS_FIELD_NUMBER: _ClassVar[int]
    INPUT_CHARACTERS_FIELD_NUMBER: _ClassVar[int]
    audio_seconds: float
    input_characters: int
    def __init__(self, audio_seconds: _Optional[float] = ..., input_characters: _Optional[int] = ...) -> None: ...

class SynthesizeEvent(_message.Message):
    __slots__ = ("start", "audio", "done")
    START_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    start: AudioStart
    audio: bytes
    done: SynthesizeDone
    def __init__(self, start: _Optional[_Union[AudioStart, _Mapping]] = ..., audio: _Optional[bytes] = ..., done: _Optional[_Union[SynthesizeDone, _Mapping]] = ...) -> None: ...

class TranscribeRequest(_message.Message):
    __slots__ = ("request_id", "model", "audio", "filename", "language", "prompt", "temperature", "word_timestamps")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    FILENAME_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    WORD_TIMESTAMPS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    audio: bytes
    filename: str
    language: str
    prompt: str
    temperature: float
    word_timestamps: bool
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., audio: _Optional[bytes] = ..., filename: _Optional[str] = ..., language: _Optional[str] = ..., prompt: _Optional[str] = ..., temperature: _Optional[float] = ..., word_timestamps: _Optional[bool] = ...) -> None: ...

class TranscriptInfo(_message.Message):
    __slots__ = ("language", "language_probability", "duration_s")
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    language: str
    language_probability: float
    duration_s: float
    def __init__(self, language: _Optional[str] = ..., language_probability: _Optional[float] = ..., duration_s: _Optional[float] = ...) -> None: ...

class TranscriptWord(_message.Message):
    __slots__ = ("start", "end", "word", "probability")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    WORD_FIELD_NUMBER: _ClassVar[int]
    PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    start: float
    end: float
    word: str
    probability: float
    def __init__(self, start: _Optional[float] = ..., end: _Optional[float] = ..., word: _Optional[str] = ..., probability: _Optional[float] = ...) -> None: ...

class TranscriptSegment(_message.Message):
    __slots__ = ("id", "start", "end", "text", "tokens", "temperature", "avg_logprob", "compression_ratio", "no_speech_prob", "words")
    ID_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    AVG_LOGPROB_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_RATIO_FIELD_NUMBER: _ClassVar[int]
    NO_SPEECH_PROB_FIELD_NUMBER: _ClassVar[int]
    WORDS_FIELD_NUMBER: _ClassVar[int]
    id: int
    start: float
    end: float
    text: str
    tokens: _containers.RepeatedScalarFieldContainer[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: _containers.RepeatedCompositeFieldContainer[TranscriptWord]
    def __init__(self, id: _Optional[int] = ..., start: _Optional[float] = ..., end: _Optional[float] = ..., text: _Optional[str] = ..., tokens: _Optional[_Iterable[int]] = ..., temperature: _Optional[float] = ..., avg_logprob: _Optional[float] = ..., compression_ratio: _Optional[float] = ..., no_speech_prob: _Optional[float] = ..., words: _Optional[_Iterable[_Union[TranscriptWord, _Mapping]]] = ...) -> None: ...

class TranscribeDone(_message.Message):
    __slots__ = ("duration_s",)
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    duration_s: float
    def __init__(self, duration_s: _Optional[float] = ...) -> None: ...

class TranscribeEvent(_message.Message):
    __slots__ = ("info", "segment", "done")
    INFO_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    info: TranscriptInfo
    segment: TranscriptSegment
    done: TranscribeDone
    def __init__(self, info: _Optional[_Union[TranscriptInfo, _Mapping]] = ..., segment: _Optional[_Union[TranscriptSegment, _Mapping]] = ..., done: _Optional[_Union[TranscribeDone, _Mapping]] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("request_ids",)
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    request_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class CancelResponse(_message.Message):
    __slots__ = ("cancelled",)
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    cancelled: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, cancelled: _Optional[_Iterable[str]] = ...) -> None: ...

class GetLoadRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LoadReport(_message.Message):
    __slots__ = ("model", "ready", "running_requests", "waiting_requests", "kv_cache_usage", "inflight_calls", "generated_tokens_total", "prompt_tokens_total", "max_model_len", "embedding_dimension", "audio_seconds_total")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    RUNNING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    WAITING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_USAGE_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_CALLS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_DIMENSION_FIELD_NUMBER: _ClassVar[int]
    AUDIO_SECONDS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    model: str
    ready: bool
    running_requests: int
    waiting_requests: int
    kv_cache_usage: float
    inflight_calls: int
    generated_tokens_total: int
    prompt_tokens_total: int
    max_model_len: int
    embedding_dimension: int
    audio_seconds_total: float
    def __init__(self, model: _Optional[str] = ..., ready: _Optional[bool] = ..., running_requests: _Optional[int] = ..., waiting_requests: _Optional[int] = ..., kv_cache_usage: _Optional[float] = ..., inflight_calls: _Optional[int] = ..., generated_tokens_total: _Optional[int] = ..., prompt_tokens_total: _Optional[int] = ..., max_model_len: _Optional[int] = ..., embedding_dimension: _Optional[int] = ..., audio_seconds_total: _Optional[float] = ...) -> None: ...
