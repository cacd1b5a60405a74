"""`POST /v1/audio/speech` (audio bytes streamed as they are synthesized) and
`POST /v1/audio/transcriptions` (a multipart form: read here, validated by the protocol)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse, Response
from starlette.datastructures import UploadFile
from starlette.requests import ClientDisconnect, Request

from services.gateway.audio.protocol_transcription import TranscriptionForm, UploadedFile
from services.gateway.audio.serving import AudioStream, SpeechServing, TextAnswer, TranscriptionServing
from services.gateway.edge.answer import add_post, answer
from services.gateway.edge.disconnect import ClientDisconnected, unless_disconnected
from services.gateway.edge.errors import CLIENT_CLOSED
from services.gateway.edge.sse import ReleasingResponse
from services.gateway.identity import caller_of
from services.gateway.protocol_common.openai_error import OpenAIError

MAX_FORM_FIELDS = 64
MAX_FIELD_BYTES = 2**20  # a text field (the prompt); the file is bounded by the body limit and the protocol


def respond(result) -> Response:
    if isinstance(result, AudioStream):
        return ReleasingResponse(result.chunks(), result.release, result.media_type,
                                 {"Cache-Control": "no-cache", **result.headers})
    if isinstance(result, TextAnswer):
        return PlainTextResponse(result.text, media_type=result.media_type)
    return answer(result)


async def read_form(request: Request) -> TranscriptionForm:
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise OpenAIError(400, "This endpoint takes a multipart/form-data body with the audio in 'file'.",
                          param="file")
    form = TranscriptionForm()
    async with request.form(max_files=4, max_fields=MAX_FORM_FIELDS, max_part_size=MAX_FIELD_BYTES) as data:
        for name, value in data.multi_items():
            if isinstance(value, UploadFile):
                form.files.setdefault(name, []).append(UploadedFile(value.filename or "", await value.read()))
            else:
                form.fields.setdefault(name, []).append(value)
    return form


def audio_router(speech: SpeechServing, transcriptions: TranscriptionServing) -> APIRouter:
    router = APIRouter()

    async def create_speech(request: Request) -> Response:
        try:
            return respond(await speech.create(await request.body(), caller_of(request),
                                               lambda work: unless_disconnected(request.receive, work)))
        except (ClientDisconnected, ClientDisconnect):
            return Response(status_code=CLIENT_CLOSED)

    async def create_transcription(request: Request) -> Response:
        try:
            form = await read_form(request)
            return respond(await transcriptions.create(form, caller_of(request),
                                                       lambda work: unless_disconnected(request.receive, work)))
        except (ClientDisconnected, ClientDisconnect):
            return Response(status_code=CLIENT_CLOSED)

    add_post(router, "/v1/audio/speech", create_speech)
    add_post(router, "/v1/audio/transcriptions", create_transcription)
    return router
