"""Image content parts at the OpenAI endpoint, through the official client: a vision-language model's
server renders each image as its tokens (the same parser as dataset rows), hands the images to the engine
and records them with the episode's ids; URLs and images sent to a text model are a 400 saying why; images
cross the front-end processes' wire intact."""

from __future__ import annotations

import base64
import pickle
from collections.abc import Iterator
from io import BytesIO

import numpy as np
import openai
import pytest
from PIL import Image

from ascent.data import image_codec
from ascent.messages import GenerationRequest, ImageInput, SamplingParams
from ascent.models.loading import load_tokenizer
from ascent.rollout.server import Limits, OpenAIServer, ServerOptions
from ascent.rollout.server.ipc import request_from_wire, request_to_wire
from tests.unit.rollout.server_support import EOS, KEY, ScriptedEngine, client
from tests.unit.vl_files import png_bytes

URL = "data:image/png;base64," + base64.b64encode(png_bytes(120, 90)).decode()


@pytest.fixture(scope="module")
def codec(vl_processor_dir):
    return image_codec(str(vl_processor_dir))


def _serve(vl_processor_dir, engine: ScriptedEngine, codec) -> OpenAIServer:
    tokenizer = load_tokenizer(vl_processor_dir)
    options = ServerOptions("tiny-vl", Limits(1024, len(tokenizer), 8), KEY)
    server = OpenAIServer(engine, tokenizer, options, codec=codec)
    server.start()
    return server


@pytest.fixture(scope="module")
def seen() -> list[GenerationRequest]:
    return []


@pytest.fixture(scope="module")
def server(vl_processor_dir, codec, seen) -> Iterator[OpenAIServer]:
    engine = ScriptedEngine(lambda r: seen.append(r) or [20, 21, EOS])
    srv = _serve(vl_processor_dir, engine, codec)
    yield srv
    srv.stop()


def _image_message(url: str) -> list[dict]:
    parts = [{"type": "text", "text": "what?"}, {"type": "image_url", "image_url": {"url": url}}]
    return [{"role": "user", "content": parts}]


def _decoded(url: str) -> Image.Image:
    return Image.open(BytesIO(base64.b64decode(url.partition(",")[2]))).convert("RGB")


def test_an_image_part_becomes_its_tokens_and_is_recorded(server, codec, seen):
    out = client(server).chat.completions.create(
        model="tiny-vl", messages=_image_message(URL), extra_headers={"X-Session-Id": "img-1"}
    )
    request = seen[-1]
    (image,) = request.images
    assert image.num_tokens > 4 and request.prompt_ids.count(codec.image_token_id) == image.num_tokens
    assert image.digest == codec.encode(_decoded(URL)).digest  # the pixels that were sent
    assert out.usage.prompt_tokens == len(request.prompt_ids)
    (record,) = server.recorder.drain("img-1")
    assert record.images == (image,) and record.prompt_ids == request.prompt_ids


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("https://example.com/cat.png", "never downloads"),
        ("data:image/png;base64,AAAA", "not a readable image"),
    ],
)
def test_urls_and_unreadable_images_are_a_400_saying_why(server, url, says):
    with pytest.raises(openai.BadRequestError, match=says):
        client(server).chat.completions.create(model="tiny-vl", messages=_image_message(url))


def test_a_text_model_refuses_images(vl_processor_dir):
    srv = _serve(vl_processor_dir, ScriptedEngine(lambda r: [EOS]), None)
    try:
        with pytest.raises(openai.BadRequestError, match="reads no images"):
            client(srv).chat.completions.create(model="tiny-vl", messages=_image_message(URL))
    finally:
        srv.stop()


def test_images_cross_the_front_end_wire_intact(codec):
    again = pickle.loads(pickle.dumps(codec))  # front-end processes get the codec in their spawn spec
    assert again.encode(_decoded(URL)).digest == codec.encode(_decoded(URL)).digest
    pixels = np.arange(24, dtype=np.float32).reshape(4, 6)
    image = ImageInput(pixels, (1, 2, 2), 1, "abc", "message 0 part 1 (data URL)")
    back = request_from_wire(request_to_wire(GenerationRequest([1, 6, 2], SamplingParams(), images=(image,))))
    (got,) = back.images
    assert got == image and np.array_equal(got.pixel_values, pixels)
