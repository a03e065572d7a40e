"""The memory estimate: what a training process holds, term by term, as a pure function of typed inputs
(:class:`~grpokit.memory.estimate.MemoryInputs`, built from a config in one place: ``grpokit/compose/memory.py``)."""
