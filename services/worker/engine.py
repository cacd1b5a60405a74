"""The engine interface a worker serves through. vLLM is the main implementation
(`vllm_engine.py`); anything that can render a prompt, stream token deltas and abort fits. The
audio engines (`piper_engine.py`, `whisper_engine.py`, on `audio_engine.AudioEngine`) implement
`synthesize` or `transcribe` instead.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from services.worker.sampling import Sampling


@dataclass
class RenderRequest:
    """What to turn into prompt tokens: a chat (OpenAI-style message dicts) or a raw prompt."""

    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    prompt_token_ids: list[int] | None = None
    tools: list[dict[str, Any]] | None = None  # OpenAI tool dicts, passed to the chat template
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    continue_final_message: bool = False
    cache_salt: str | None = None


@dataclass
class Prompt:
    """A rendered prompt: token ids plus the engine's own input object, and the end of its text
    where the engine knows it (decisions made once per request from how the chat template ended
    the prompt, e.g. a `<think>` block it left open: parsers.opens_reasoning)."""

    token_ids: list[int]
    engine_input: Any
    tail: str = ""  # the last TAIL_CHARS characters of the rendered text ("" where unknown)


TAIL_CHARS = 32  # enough for "<think>" and the whitespace a template puts after it


def tail_of(text: str) -> str:
    return text[-TAIL_CHARS:]


@dataclass
class TopToken:
    token: str
    logprob: float


@dataclass
class TokenLogprob:
    token: str
    logprob: float
    top: list[TopToken] = field(default_factory=list)


@dataclass
class ChoiceDelta:
    """New output of one choice since the previous step."""

    index: int
    text: str
    num_tokens: int
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None  # stop | length | abort | error
    stop_sequence: str | None = None


@dataclass
class StepOutput:
    choices: list[ChoiceDelta]
    finished: bool
    prompt_tokens: int
    cached_tokens: int


@dataclass
class EngineStats:
    running_requests: int = 0
    waiting_requests: int = 0
    kv_cache_usage: float = 0.0
    generated_tokens_total: int = 0
    prompt_tokens_total: int = 0
    audio_seconds_total: float = 0.0  # audio engines: seconds synthesized / transcribed
    last_step_at: float = 0.0  # time.monotonic() of the engine's last step, where it reports steps (vLLM)


@dataclass
class TranscribeOptions:
    language: str | None = None  # ISO-639-1; None: detected
    prompt: str | None = None
    temperature: float | None = None  # None: the engine's fallback schedule
    word_timestamps: bool = False


@dataclass
class TranscriptInfo:
    language: str
    language_probability: float
    duration_s: float


@dataclass
class TranscriptWord:
    start: float
    end: float
    word: str
    probability: float


@dataclass
class TranscriptSegment:
    id: int
    start: float
    end: float
    text: str
    tokens: list[int] = field(default_factory=list)
    temperature: float = 0.0
    avg_logprob: float = 0.0
    compression_ratio: float = 0.0
    no_speech_prob: float = 0.0
    words: list[TranscriptWord] = field(default_factory=list)


class Engine(abc.ABC):
    """One loaded model. All methods run on the worker's event loop."""

    max_model_len: int
    supports_embeddings: bool = False
    embedding_dimension: int = 0  # embed engines: the length of a vector
    supports_dimensions: bool = False  # embed engines: can shorten vectors (Matryoshka)
    accepts_images: bool = False  # vision models: chat messages may hold image_url parts
    supports_speech: bool = False  # text to speech: `synthesize`
    supports_transcription: bool = False  # speech to text: `transcribe`
    sample_rate: int = 0  # speech engines: Hz of the PCM `synthesize` yields

    @abc.abstractmethod
    async def render(self, req: RenderRequest) -> Prompt:
        """Tokenize; raise ServiceError for input the model cannot take."""

    @abc.abstractmethod
    def generate(self, prompt: Prompt, sampling: Sampling, request_id: str,
                 priority: int = 0) -> AsyncIterator[StepOutput]:
        """Stream deltas. Cancelling the consumer aborts the engine request."""

    @abc.abstractmethod
    async def abort(self, request_ids: list[str]) -> None: ...

    async def embed(self, inputs: list[str | list[int]], dimensions: int | None) -> tuple[list[list[float]], int]:
        """One vector per input (a text or token ids), in order, and the prompt tokens used; raise
        ServiceError for input the model cannot take (too long, `dimensions` it cannot honour)."""
        raise NotImplementedError

    def synthesize(self, text: str, voice: str, speed: float | None, request_id: str) -> AsyncIterator[bytes]:
        """Speech engines: signed 16-bit little-endian mono PCM at `sample_rate`, a chunk per
        sentence. Closing the iterator (the call cancelled) or `abort` stops the engine before its
        next sentence. Raise ServiceError for a voice or speed the model cannot take."""
        raise NotImplementedError

    def transcribe(self, audio: bytes, options: TranscribeOptions,
                   request_id: str) -> AsyncIterator[TranscriptInfo | TranscriptSegment]:
        """Transcription engines: one TranscriptInfo once the audio is decoded, then each segment as
        it is decoded. Closing the iterator or `abort` stops decoding before the next segment."""
        raise NotImplementedError

    @abc.abstractmethod
    def stats(self) -> EngineStats: ...

    async def metrics_text(self) -> str | None:
        """The engine's own Prometheus exposition, for engines that serve one apart from the worker
        (llama-server's /metrics); None for those whose metrics already reach the node (vLLM's)."""
        return None

    async def answers_probe(self) -> bool:
        """Whether the engine's working loop answers a probe now (stall_watch.py: an engine quiet
        for its stall timeout is asked before it is called hung); False for engines with none."""
        return False

    def kill(self) -> None:
        """A hung engine: stop its processes at once, so that its requests fail as for a crash
        (`errored`). Engines running in this process have nothing to kill: the replica goes."""
        return None

    @property
    @abc.abstractmethod
    def errored(self) -> bool: ...

    @abc.abstractmethod
    async def shutdown(self) -> None: ...
