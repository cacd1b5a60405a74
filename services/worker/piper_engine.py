"""The `piper` loader: Piper text to speech (a VITS voice in ONNX, run by onnxruntime) for
`usecase: speech`.

The model is a directory holding `voice.onnx` and `voice.onnx.json` (what builtin:piper-joe builds),
or the path of a voice's `.onnx` file with its `.onnx.json` beside it. Piper phonemizes the whole
text (espeak-ng, bundled), then runs the voice once per sentence: each sentence is one PCM chunk,
and a stopped request runs no further sentence. onnxruntime gets the replica's CPU share as its
thread count (`num_cpus`, at least one thread), and its threads do not spin while idle, so a voice
shares a node with the LLM engines fairly.

engine_args: `noise_scale` and `noise_w_scale`, the voice's sampling noise (unset: the voice's own,
from its `.onnx.json`). Piper samples that noise afresh on every call, so the same text sounds a
little different each time; 0 for both makes synthesis deterministic (the same input, the same
audio), a little flatter.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict

from mship.common.v1 import common_pb2
from services.common.errors import invalid_parameter
from services.worker.audio_engine import AudioEngine, engine_threads

log = logging.getLogger(__name__)
MODEL_FILE, CONFIG_FILE = "voice.onnx", "voice.onnx.json"
MIN_SPEED, MAX_SPEED = 0.25, 4.0
NOISE_ARGS = ("noise_scale", "noise_w_scale")
# OpenAI's voice names: a client's default choice, spoken by a multi-speaker voice's first speaker.
OPENAI_VOICES = frozenset({"alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer",
                           "verse", "marin", "cedar"})


def voice_files(model_path: str) -> tuple[Path, Path]:
    """The voice's ONNX model and its JSON config."""
    path = Path(model_path).expanduser()
    if path.is_dir():
        model = path / MODEL_FILE
        if not model.is_file():
            found = sorted(path.glob("*.onnx"))
            if len(found) != 1:
                raise FileNotFoundError(f"{path} holds no single Piper voice (.onnx): {[f.name for f in found]}")
            model = found[0]
    else:
        model = path
    config = model.with_name(model.name + ".json")
    if not model.is_file() or not config.is_file():
        raise FileNotFoundError(f"a Piper voice needs {model} and {config}")
    return model, config


def noise_args(spec: common_pb2.ModelSpec) -> dict[str, float]:
    """engine_args as piper's noise settings; an unknown key or a value that is not a number ≥ 0
    fails the load, named."""
    args = MessageToDict(spec.engine_args) if spec.HasField("engine_args") else {}
    unknown = sorted(set(args) - set(NOISE_ARGS))
    if unknown:
        raise ValueError(f"piper: unknown engine_args {unknown}; known: {list(NOISE_ARGS)}")
    for key, value in args.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ValueError(f"piper: engine_args.{key} must be a number >= 0, not {value!r}")
    return {key: float(value) for key, value in args.items()}


class PiperEngine(AudioEngine):
    supports_speech = True

    def __init__(self, voice: Any, name: str, noise: dict[str, float] | None = None) -> None:
        super().__init__()
        self.voice, self.name = voice, name
        self.noise = noise or {}  # unset: the voice's own
        self.sample_rate = int(voice.config.sample_rate)
        self.speakers: dict[str, int] = dict(voice.config.speaker_id_map or {})
        self.num_speakers = int(voice.config.num_speakers or 1)

    @classmethod
    async def start(cls, spec: common_pb2.ModelSpec, model_path: str) -> PiperEngine:
        noise = noise_args(spec)
        threads = engine_threads(spec.num_cpus)
        voice = await asyncio.to_thread(load_voice, model_path, threads)
        log.info("piper voice %s loaded (%d Hz, %d speaker(s), %d thread(s), noise %s)", model_path,
                 voice.config.sample_rate, voice.config.num_speakers, threads, noise or "the voice's own")
        return cls(voice, spec.name, noise)

    def speaker_id(self, voice: str) -> int | None:
        """The speaker to use for `voice`: a one-speaker voice speaks any name; a multi-speaker voice
        knows its speakers' names (OpenAI's names take the first speaker)."""
        if self.num_speakers <= 1:
            return None
        if voice in self.speakers:
            return self.speakers[voice]
        if voice in OPENAI_VOICES or not voice:
            return None
        raise invalid_parameter("voice", f"unknown voice {voice!r}; this model's voices: "
                                         f"{', '.join(sorted(self.speakers)) or 'one'}")

    def synthesis_config(self, voice: str, speed: float | None) -> Any:
        from piper.config import SynthesisConfig

        if speed is not None and not MIN_SPEED <= speed <= MAX_SPEED:
            raise invalid_parameter("speed", f"speed must be between {MIN_SPEED} and {MAX_SPEED}")
        length_scale = None
        if speed is not None and speed != 1.0:
            length_scale = (self.voice.config.length_scale or 1.0) / speed  # longer phonemes: slower
        return SynthesisConfig(speaker_id=self.speaker_id(voice), length_scale=length_scale, **self.noise)

    async def synthesize(self, text: str, voice: str, speed: float | None, request_id: str) -> AsyncIterator[bytes]:
        config = self.synthesis_config(voice, speed)  # refusals before any engine work

        def work(stop: threading.Event) -> Iterator[bytes]:
            for chunk in self.voice.synthesize(text, syn_config=config):  # lazy: one sentence per step
                pcm = chunk.audio_int16_bytes
                self.count_audio(len(pcm) / 2 / self.sample_rate)
                yield pcm

        async for pcm in self.run_blocking(request_id, work):
            yield pcm


def load_voice(model_path: str, threads: int) -> Any:
    import onnxruntime
    from piper import PiperVoice
    from piper.config import PiperConfig

    model, config = voice_files(model_path)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # idle threads yield the CPU
    session = onnxruntime.InferenceSession(str(model), sess_options=options, providers=["CPUExecutionProvider"])
    return PiperVoice(config=PiperConfig.from_dict(json.loads(config.read_text())), session=session)
