"""A small generating model, made on this machine: see :mod:`examples.tinylm.app`.

- :mod:`.model`: the byte-level decoder-only transformer and :func:`~.model.generate`, a
  generator that makes one token per step with a KV cache.
- :mod:`.train`: its weights, trained for seconds on ``corpus.txt`` and cached.
- :mod:`.speech`: the later stages: an incremental translator and the speaker model.
- :mod:`.app`: the compass app (workflows ``tell`` and ``speak``).
- :mod:`.steps`: the same tasks as step-wise generators, for compass's step-wise tasks.
"""
