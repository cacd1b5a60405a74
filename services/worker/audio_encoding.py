"""Speech audio in the format a caller asked for, encoded as it streams: chunk by chunk of signed
16-bit mono PCM in, the next bytes of the file out.

WAV and raw PCM need nothing; MP3, FLAC, AAC (ADTS) and Opus (Ogg) are encoded by PyAV's bundled
FFmpeg where it is installed (the `speech` extra brings it); elsewhere they are refused before any
engine work, naming the formats this worker can produce. Raw PCM is what OpenAI sends: 24 kHz, a
voice's own rate resampled by PyAV (without PyAV: the voice's own rate, as `AudioStart` says).

An encoder is used by one call at a time; its methods hold a lock, so the call may run them in a
thread (off the worker's event loop) and close it from another once that work is done.
"""

from __future__ import annotations

import struct
import threading
from functools import cache
from typing import Any

from mship.worker.v1 import worker_pb2 as pb
from services.common.errors import invalid_parameter

F = pb.AudioFormat
# format -> (container, codec, output sample rate: None = the voice's own, bit rate: None = lossless)
COMPRESSED: dict[int, tuple[str, str, int | None, int | None]] = {
    F.AUDIO_FORMAT_MP3: ("mp3", "libmp3lame", None, 128_000),  # FFmpeg's default (32 kb/s mono) slurs speech
    F.AUDIO_FORMAT_FLAC: ("flac", "flac", None, None),
    F.AUDIO_FORMAT_AAC: ("adts", "aac", None, 96_000),
    F.AUDIO_FORMAT_OPUS: ("ogg", "libopus", 48_000, 48_000),  # Opus runs at 8/12/16/24/48 kHz only
}
NAMES = {F.AUDIO_FORMAT_WAV: "wav", F.AUDIO_FORMAT_PCM: "pcm", F.AUDIO_FORMAT_MP3: "mp3",
         F.AUDIO_FORMAT_FLAC: "flac", F.AUDIO_FORMAT_AAC: "aac", F.AUDIO_FORMAT_OPUS: "opus"}
UNKNOWN_SIZE = 0xFFFFFFFF  # a streamed WAV's sizes: not known when the header is sent
PCM_RATE = 24_000  # OpenAI's `pcm`: raw 24 kHz 16-bit mono little-endian


@cache
def available_formats() -> tuple[int, ...]:
    """The formats this process can encode."""
    out = [F.AUDIO_FORMAT_WAV, F.AUDIO_FORMAT_PCM]
    try:
        import av
    except ImportError:
        return tuple(out)
    for fmt, (_, codec, _, _) in COMPRESSED.items():
        try:
            av.codec.Codec(codec, "w")
        except Exception:  # this FFmpeg build lacks the encoder
            continue
        out.append(fmt)
    return tuple(out)


def wav_header(sample_rate: int, data_bytes: int | None = None) -> bytes:
    """RIFF/WAVE header of 16-bit mono audio: `data_bytes` long, or a stream of unknown length."""
    riff, data = (UNKNOWN_SIZE, UNKNOWN_SIZE) if data_bytes is None else (36 + data_bytes, data_bytes)
    return (b"RIFF" + struct.pack("<I", riff) + b"WAVE" + b"fmt " +
            struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16) +
            b"data" + struct.pack("<I", data))


class _Sink:
    """Where PyAV's muxer writes (no seek: a stream is written front to back)."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def write(self, data: bytes) -> int:
        self.buffer += data
        return len(data)

    def take(self) -> bytes:
        out = bytes(self.buffer)
        self.buffer.clear()
        return out


class Encoder:
    """`encode(pcm)` per chunk, then `finish()`; each returns the next bytes to send (maybe none)."""

    def __init__(self, fmt: int, sample_rate: int) -> None:
        fmt = fmt or F.AUDIO_FORMAT_WAV
        if fmt not in available_formats():
            names = ", ".join(NAMES[f] for f in available_formats())
            raise invalid_parameter("response_format", f"{NAMES.get(fmt, str(fmt))!r} audio cannot be encoded "
                                                       f"here; supported formats: {names}")
        self.format, self.input_rate = fmt, sample_rate
        self.output_rate = sample_rate
        self._lock = threading.Lock()
        self._started = False
        self._av: tuple[Any, Any, _Sink] | None = None
        self._resampler: Any = None
        if fmt == F.AUDIO_FORMAT_PCM and sample_rate != PCM_RATE:
            try:
                import av
            except ImportError:  # no resampler here: the voice's own rate (AudioStart says which)
                return
            self.output_rate = PCM_RATE
            self._resampler = av.AudioResampler(format="s16", layout="mono", rate=PCM_RATE)
        if fmt in COMPRESSED:
            import av

            container_name, codec, rate, bit_rate = COMPRESSED[fmt]
            self.output_rate = rate or sample_rate
            sink = _Sink()
            container = av.open(sink, mode="w", format=container_name)
            stream = container.add_stream(codec, rate=self.output_rate, layout="mono")
            if bit_rate:
                stream.bit_rate = bit_rate
            self._av = (container, stream, sink)

    def encode(self, pcm: bytes) -> bytes:
        with self._lock:
            if self._resampler is not None:
                return self._resample(self._frame(pcm))
            if self._av is None:
                head = b""
                if not self._started and self.format == F.AUDIO_FORMAT_WAV:
                    head = wav_header(self.input_rate)
                self._started = True
                return head + pcm
            container, stream, sink = self._av
            for packet in stream.encode(self._frame(pcm)):  # resampled to the codec's format and rate as needed
                container.mux(packet)
            return sink.take()

    def _frame(self, pcm: bytes) -> Any:
        import av
        import numpy as np

        frame = av.AudioFrame.from_ndarray(np.frombuffer(pcm, dtype="<i2").reshape(1, -1), format="s16",
                                           layout="mono")
        frame.sample_rate = self.input_rate
        return frame

    def _resample(self, frame: Any) -> bytes:
        """Raw PCM at PCM_RATE: the resampler's next samples (`frame` None: the rest)."""
        return b"".join(out.to_ndarray().astype("<i2").tobytes() for out in self._resampler.resample(frame))

    def finish(self) -> bytes:
        with self._lock:
            if self._resampler is not None:
                tail, self._resampler = self._resample(None), None
                return tail
            if self._av is None:
                return b"" if self._started or self.format != F.AUDIO_FORMAT_WAV else wav_header(self.input_rate)
            container, stream, sink = self._av
            for packet in stream.encode(None):
                container.mux(packet)
            container.close()
            self._av = None
            return sink.take()

    def close(self) -> None:
        """Drop an unfinished encoder (the call ended early)."""
        with self._lock:
            self._resampler = None
            if self._av is not None:
                container, _, _ = self._av
                self._av = None
                try:
                    container.close()
                except Exception:  # a muxer closed before its header: nothing to keep
                    pass
