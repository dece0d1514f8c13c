"""What an app declares for the HTTP front door: OpenAI model names and tensor signatures.

Both are optional. A workflow is served by the Open Inference Protocol as soon as it exists
(``POST /v2/models/{workflow}/infer``); a :class:`TensorSpec` only makes its metadata say the
datatypes and shapes. The OpenAI-compatible routes serve only the model names an app maps to
a workflow (:class:`OpenAIModel`), since an OpenAI request names a model, not a workflow, and
its body must be turned into that workflow's inputs (see :mod:`compass.front.openai`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from compass.errors import WorkflowError

__all__ = ["DATATYPES", "KINDS", "Declarations", "OpenAIKind", "OpenAIModel", "TensorSpec"]

OpenAIKind = Literal["chat", "completion", "embedding"]
#: what an OpenAI model name may serve: /v1/chat/completions, /v1/completions, /v1/embeddings
KINDS: tuple[OpenAIKind, ...] = ("chat", "completion", "embedding")
#: the Open Inference Protocol's tensor datatypes compass reads and writes
DATATYPES = (
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64", "BYTES",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class OpenAIModel:
    """An OpenAI model name served by ``workflow``; ``kind`` says which endpoint."""

    model: str
    workflow: str
    kind: OpenAIKind = "chat"
    owned_by: str = "compass"

    def __post_init__(self) -> None:
        if not self.model or not isinstance(self.model, str):
            raise WorkflowError("an OpenAI model name must be a non-empty string")
        if self.kind not in KINDS:
            raise WorkflowError(
                f"OpenAI model {self.model!r}: kind must be one of {', '.join(KINDS)}, "
                f"got {self.kind!r}"
            )


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One input or output of a workflow as the protocol's metadata shows it (-1: any size)."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.datatype not in DATATYPES:
            raise WorkflowError(
                f"tensor {self.name!r}: datatype must be one of {', '.join(DATATYPES)}, "
                f"got {self.datatype!r}"
            )
        if any(not isinstance(d, int) or d < -1 for d in self.shape):
            raise WorkflowError(f"tensor {self.name!r}: shape must be sizes >= -1")

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


@dataclass(slots=True)
class Declarations:
    """An app's front-door declarations (``App.openai``, ``App.tensors``)."""

    openai: dict[str, OpenAIModel] = field(default_factory=dict)
    #: workflow -> (inputs, outputs)
    tensors: dict[str, tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]] = field(
        default_factory=dict
    )

    def add_openai(self, model: OpenAIModel) -> OpenAIModel:
        if model.model in self.openai:
            raise WorkflowError(f"OpenAI model {model.model!r} is declared twice")
        self.openai[model.model] = model
        return model

    def add_tensors(
        self,
        workflow: str,
        inputs: Mapping[str, tuple[str, Sequence[int]]],
        outputs: Mapping[str, tuple[str, Sequence[int]]],
    ) -> None:
        if workflow in self.tensors:
            raise WorkflowError(f"tensors of workflow {workflow!r} are declared twice")
        self.tensors[workflow] = (
            tuple(TensorSpec(n, d, tuple(s)) for n, (d, s) in inputs.items()),
            tuple(TensorSpec(n, d, tuple(s)) for n, (d, s) in outputs.items()),
        )
