"""Run inside a ``vllm serve`` started by ``grpokit vllm-serve`` (``--worker-extension-cls``): the one worker method
grpokit calls through the dev-mode ``/collective_rpc`` route, whose arguments can only be strings.

``grpokit_reload_weights(weights_path)``: vLLM's own in-place reload from a folder of safetensors (as
``reload_weights(weights_path=...)``), then the re-processing of an LM head tied to the input embeddings
(:func:`grpokit.rollout.vllm.weights.repack_tied_head`: the reload loads only the embeddings, so the CPU build's
packed copy of the head would keep the old weights). Returns the number of heads re-processed."""

from __future__ import annotations

EXTENSION = "grpokit.rollout.vllm.server_worker.GrpokitWorkerExtension"


class GrpokitWorkerExtension:
    """Mixed into vLLM's worker class by vLLM (``--worker-extension-cls``)."""

    def grpokit_reload_weights(self, weights_path: str) -> int:
        from grpokit.rollout.vllm.weights import repack_tied_head

        self.reload_weights(weights_path=weights_path, is_checkpoint_format=True)
        return repack_tied_head(self.model_runner.get_model())
