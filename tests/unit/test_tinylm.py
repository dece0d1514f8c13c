"""examples/tinylm: a tiny transformer trained here, generation one token per step, the
streamed pipeline's stages, and the app on a real worker process answering what the same
model computes in this process.

The weights are trained for a few steps only (:data:`SHORT`, into a temporary folder): enough
for the text to come from training, few enough for a test; the app's own default trains longer
once per machine and caches the file.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn import functional

import compass
from compass.cluster import LocalCluster
from compass.errors import JobFailed
from examples.tinylm import speech
from examples.tinylm.app import build_app, synthesize, translate, write
from examples.tinylm.model import KVCache, TinyLM, generate
from examples.tinylm.steps import declare_steps, stream_locally, synthesize_steps, translate_steps
from examples.tinylm.train import (
    Training,
    corpus_bytes,
    ensure_weights,
    full_state,
    load_weights,
    save_weights,
)
from examples.tinylm.train import train as train_weights

ROOT = Path(__file__).resolve().parents[2]
#: a brief training that learns the corpus's commonest word on any CPU: 50 steps at 3e-2 left
#: the text all spaces on some (an AMD EPYC: float rounding differs by kernel); 160 at 5e-3
#: greedily writes " the the ...", about 3 s
SHORT = Training(steps=160, batch=8, window=48, lr=5e-3)
PROMPTS = ["The ship", "The captain read", "A good compass"]


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """One intra-op thread, as the workers get: on a busy machine a second thread makes these
    tiny matrix products a hundred times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def trained() -> dict[str, torch.Tensor]:
    return train_weights(training=SHORT)


@pytest.fixture(scope="module")
def weights(trained: dict[str, torch.Tensor], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The trained weights cached as the app caches them."""
    return save_weights(trained, tmp_path_factory.mktemp("tinylm") / "tinylm.safetensors")


@pytest.fixture(scope="module")
def model(weights: Path) -> TinyLM:
    return load_weights(weights)


def text_of(model: TinyLM, prompt: str, n: int, **options: Any) -> str:
    return "".join(generate(model, prompt, n, **options))


def corpus_loss(model: TinyLM) -> float:
    data = torch.tensor(list(corpus_bytes()[:1025]))
    with torch.inference_mode():
        logits = model(data[:-1].view(4, 256))
    return float(functional.cross_entropy(logits.flatten(0, 1), data[1:]))


def test_training_is_deterministic_and_learns_the_corpus(model: TinyLM, tmp_path: Path) -> None:
    # trained twice, once through the app's cache: the same bits
    brief = Training(steps=8, batch=4, window=32, seed=3)
    cached = ensure_weights(tmp_path / "brief.safetensors", training=brief)
    on_disk = load_weights(cached).state_dict()
    again = full_state(train_weights(training=brief))
    assert again.keys() == on_disk.keys()
    for key, tensor in again.items():
        assert torch.equal(tensor, on_disk[key]), key
    assert ensure_weights(cached, training=brief) == cached  # found: not trained again
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SHORT.seed)
        untrained = TinyLM().eval()
    assert corpus_loss(model) < corpus_loss(untrained) - 1.0  # ln 256 = 5.5 before


HOLDER = """\
import fcntl, os, shutil, sys
source, target = sys.argv[1:]
lock = open(target[: -len(".safetensors")] + ".lock", "a")
fcntl.flock(lock, fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.readline()
shutil.copy(source, target + ".part")
os.replace(target + ".part", target)
"""


def test_a_second_process_waits_for_the_first_ones_weights(weights: Path, tmp_path: Path) -> None:
    """Workers loading at once train once: while another process holds the lock, the cache
    waits for it, then takes its file rather than training its own."""
    target = tmp_path / "shared.safetensors"
    with subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(weights), str(target)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        try:
            assert holder.stdout is not None and holder.stdin is not None
            assert holder.stdout.readline() == "locked\n"
            found: list[Path] = []
            waiter = threading.Thread(
                target=lambda: found.append(ensure_weights(target, training=Training(steps=1)))
            )
            waiter.start()
            waiter.join(0.5)
            assert waiter.is_alive() and not target.exists()  # waiting for the lock
            holder.stdin.write("\n")
            holder.stdin.flush()
            waiter.join(30)
            assert found == [target]
            # the holder's file, not one trained here (one step of training makes other weights)
            assert target.read_bytes() == weights.read_bytes()
        finally:
            holder.kill()


def test_generation_is_deterministic_and_the_same_after_reloading(
    trained: dict[str, torch.Tensor], weights: Path
) -> None:
    in_memory = TinyLM()
    in_memory.load_state_dict(full_state(trained))
    in_memory.eval()
    reloaded = load_weights(weights)
    for prompt in PROMPTS:
        first = text_of(in_memory, prompt, 40)
        assert len(set(first)) >= 3, first  # the test means something only if the text varies
        assert text_of(in_memory, prompt, 40) == first
        assert text_of(reloaded, prompt, 40) == first
        # a longer run starts with the shorter one
        assert text_of(reloaded, prompt, 60).startswith(first)
    # sampling: the same seed gives the same text, another seed another one
    sampled = text_of(in_memory, "The", 60, temperature=1.0, seed=1)
    assert text_of(reloaded, "The", 60, temperature=1.0, seed=1) == sampled
    assert text_of(reloaded, "The", 60, temperature=1.0, seed=2) != sampled


def test_each_step_costs_one_token_and_the_cache_equals_recomputing(model: TinyLM) -> None:
    for prompt in PROMPTS:
        assert text_of(model, prompt, 50, cache=False) == text_of(model, prompt, 50)
    # teacher-forced: the logits at every position, all at once against one token at a time
    ids = torch.tensor([list(b"The compass points to the north.")])
    with torch.inference_mode():
        whole = model(ids)
        cache = KVCache(model.config, torch.device("cpu"), torch.float32)
        parts = [model(ids[:, :5], cache)]
        for position in range(5, ids.shape[1]):
            parts.append(model(ids[:, position : position + 1], cache))
            assert cache.length == position + 1
            assert parts[-1].shape[1] == 1  # the step ran one position through the model
    assert torch.allclose(torch.cat(parts, dim=1), whole, rtol=0, atol=1e-5)


def test_generate_refuses_bad_input_with_what_was_wrong(model: TinyLM) -> None:
    cases: list[tuple[str, int, float, str]] = [
        ("", 5, 0.0, "prompt must be a non-empty string"),
        ("The", 254, 0.0, "max_new_tokens must be in [0, 253]"),
        ("The", -1, 0.0, "max_new_tokens must be in [0, 253]"),
        ("The", 5, -0.5, "temperature must be >= 0"),
    ]
    for prompt, n, temperature, message in cases:
        with pytest.raises(ValueError, match=message.replace("[", r"\[")):
            next(generate(model, prompt, n, temperature=temperature))
    assert text_of(model, "The", 0) == ""


def test_pig_latin_given_in_pieces_equals_the_whole() -> None:
    assert speech.pig_latin("The ship sailed, and the crew sang.") == (
        "Ethay ipshay ailedsay, andway ethay ewcray angsay."
    )
    text = "The captain read the compass. A good crew! Is it north?\nYes"
    whole = speech.pig_latin(text)
    for size in (1, 2, 3, 7, 100):
        translator = speech.PigLatin()
        pieces = [text[i : i + size] for i in range(0, len(text), size)]
        assert "".join(translator.feed(p) for p in pieces) + translator.flush() == whole


def test_the_speaker_is_the_same_model_every_build() -> None:
    a, b = speech.build_speaker(), speech.build_speaker()
    audio = speech.speak(a, "Ethay ipshay.")
    assert audio.shape == (len("Ethay ipshay.") * speech.FRAME,)
    assert torch.equal(audio, speech.speak(b, "Ethay ipshay."))
    assert not torch.equal(audio, speech.speak(a, "Ethay easay."))


def test_the_later_stages_consume_pieces_as_they_come() -> None:
    pulled = 0

    def written() -> Iterator[str]:
        nonlocal pulled
        for piece in ["The ship ", "left. ", "The sea ", "was calm."]:
            pulled += 1
            yield piece

    spoken = synthesize_steps(speech.build_speaker(), translate_steps(None, written()))
    first = next(spoken)
    assert first["sentence"] == "Ethay ipshay eftlay."
    assert pulled == 2  # the first sentence was spoken before the rest was written
    rest = list(spoken)
    assert [s["sentence"] for s in rest] == ["Ethay easay asway almcay."]


def test_the_streamed_pipeline_gives_what_the_collecting_tasks_give(model: TinyLM) -> None:
    speaker = speech.build_speaker()
    prompt = "The captain"
    steps = stream_locally(model, speaker, prompt, 80)
    events: list[tuple[str, Any]] = []
    while True:
        try:
            events.append(next(steps))
        except StopIteration as stop:
            final = stop.value
            break
    text = write(model, prompt, 80)
    by_task = {
        task: [part for _, part in group]
        for task, group in itertools.groupby(sorted(events, key=lambda e: e[0]), lambda e: e[0])
    }
    assert "".join(by_task["generate"]) == text
    assert len(by_task["generate"]) >= 40  # a piece per step, not one at the end
    assert "".join(by_task["translate"]) == translate(None, text)
    expected = synthesize(speaker, translate(None, text))
    assert final["sentences"] == expected["sentences"]
    assert [s["sentence"] for s in by_task.get("synthesize", [])] == expected["sentences"]
    for got, want in zip(final["audio"], expected["audio"], strict=True):
        assert torch.equal(got, want)


def test_the_app_caches_its_weights_outside_the_repository() -> None:
    from examples.tinylm.app import app

    app.validate()
    path = app.models["tinylm"].weights
    assert path is not None and path.is_relative_to(tempfile.gettempdir())
    assert not path.resolve().is_relative_to(ROOT)
    assert set(app.workflows) == {"tell", "tell_steps", "tell_batched", "speak", "speak_steps"}


def test_the_step_wise_pipeline_streams_each_stage_into_the_next(weights: Path) -> None:
    app = build_app(weights, SHORT)
    app.validate()
    flow = app.get_workflow("speak_steps")
    assert set(flow.tasks) == {"generate", "translate", "synthesize"}
    assert flow.streamed_succs("generate") and flow.streamed_succs("translate")
    other = compass.App("again")
    declare_steps(other, name="mine")  # declarable in any app, under any name
    assert other.get_workflow("mine").streamed_succs("generate")


APP_MODULE = """\
from examples.tinylm.app import build_app
from examples.tinylm.train import Training

app = build_app({weights!r}, Training(**{training!r}))
"""


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_the_workflows_on_a_worker_process_answer_what_this_process_computes(
    weights: Path, model: TinyLM, tmp_path: Path
) -> None:
    training = {f: getattr(SHORT, f) for f in ("steps", "batch", "window", "lr", "seed")}
    (tmp_path / "tinylm_test_app.py").write_text(
        APP_MODULE.format(weights=str(weights), training=training)
    )
    env = dict(os.environ)
    env.pop("COMPASS_TOKEN", None)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    speaker = speech.build_speaker()
    prompt = "The captain read"
    async with (
        LocalCluster(1, args=["--app", "tinylm_test_app"], env=env, startup_timeout=90) as cluster,
        cluster.client() as client,
    ):
        told, spoken = await asyncio.gather(
            client.submit("tell", prompt=prompt, max_new_tokens=60, timeout=60),
            client.submit("speak", prompt=prompt, max_new_tokens=60, timeout=60),
        )
        with pytest.raises(JobFailed, match=r"max_new_tokens must be in \[0, 240\]"):
            await client.submit("tell", prompt=prompt, max_new_tokens=1000, timeout=60)
        again = await client.submit("tell", prompt="A good", max_new_tokens=20, timeout=60)
        # four jobs at once on one lane: they share the steps of one batch, each its own text
        lengths = (60, 25, 40, 5)
        batched = await asyncio.gather(*(
            client.submit("tell_batched", prompt=p, max_new_tokens=n, timeout=60)
            for p, n in zip([*PROMPTS, prompt], lengths, strict=True)
        ))  # fmt: skip
        sizes = (await client.status()).batches.get("tinylm", {})
        # the streamed pipeline: its three stages overlap, and its answer is speak's
        piped = await client.submit("speak_steps", prompt=prompt, max_new_tokens=60, timeout=60)
        streamed = [
            out async for out in client.stream("tell_steps", prompt=prompt, max_new_tokens=60)
        ]
    # the stream is the same generation, a token at a time, then the whole text
    assert [out.seq for out in streamed[:-1]] == list(range(60)) and streamed[-1].final
    assert "".join(out.value for out in streamed[:-1]) == streamed[-1].value == told
    assert told == write(model, prompt, 60)
    assert len(set(told)) >= 3, told
    expected = synthesize(speaker, translate(None, told))
    assert spoken["sentences"] == expected["sentences"]
    assert len(spoken["audio"]) == len(expected["audio"])
    for got, want in zip(spoken["audio"], expected["audio"], strict=True):
        assert torch.allclose(got, want, rtol=0, atol=1e-6)
    assert again == write(model, "A good", 20)  # the worker kept serving after the bad job
    for p, n, text in zip([*PROMPTS, prompt], lengths, batched, strict=True):
        assert text == write(model, p, n)
    assert max(int(size) for size in sizes) > 1, sizes  # steps were shared
    # into a second model as it is written: the same sentences and audio as run here
    locally = stream_locally(model, speaker, prompt, 60)
    while True:
        try:
            next(locally)
        except StopIteration as stop:
            reference = stop.value
            break
    assert piped["sentences"] == reference["sentences"] == expected["sentences"]
    for got, want in zip(piped["audio"], reference["audio"], strict=True):
        assert torch.allclose(got, want, rtol=0, atol=1e-6)
