"""`/v1/audio/speech` and `/v1/audio/transcriptions`: `protocol` (speech), `protocol_transcription`,
`serving`, `router`."""
