"""What the endpoints' protocols share: the OpenAI error object, strict wire types and their
validation, sampling fields, tool and format choices, finish reasons and usage, logprobs.
Pure: nothing here imports FastAPI, Starlette or grpc."""
