"""On-policy distillation's settings (:mod:`grpokit.train.teacher`): the teacher, the coefficient, the loss. Keys of
the ``algo`` section, which is assembled from this class; torch-free, so the config reads it without loading torch.
docs/distillation.md."""

from __future__ import annotations

from dataclasses import dataclass, field

IN_MEMORY = " passed as teacher_model>"  # a teacher module built in memory: "<Class passed as teacher_model>"


def built_in_memory(name: str | None) -> bool:
    """Whether ``teacher_model_name_or_path`` names a teacher module built in memory (no folder to read)."""
    return bool(name) and name.startswith("<") and name.endswith(IN_MEMORY)


DISTILL_LOSSES = ("reverse_kl", "forward_kl_topk", "jsd")  # grpokit.algos.distill's, named without torch
TEACHER_DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass
class DistillSettings:
    """The teacher of on-policy distillation; TRL's experimental distillation trainers' names where they exist."""

    teacher_model_name_or_path: str | None = None
    """On-policy distillation: the teacher, a local folder or hub id of a causal LM with the student's tokenizer
    (frozen, its own dtype and device); each sampled token's advantage gets -distill_coef x (log pi_student - log
    pi_teacher); null = no local teacher (docs/distillation.md)."""
    teacher_server_url: str | None = None
    """On-policy distillation: a served teacher instead, e.g. http://127.0.0.1:8001 (`grpokit vllm-serve TEACHER`, or
    any server answering /v1/completions with prompt_logprobs for given token ids); TRL's teacher_model_server_url."""
    distill_coef: float = 1.0
    """lambda: weight of the teacher's term (reverse_kl: in each sampled token's advantage, TRL's distillation
    beta=1.0; forward_kl_topk, jsd: in the loss); 0 = the teacher only scores (distill/* metrics, stored log-probs)."""
    distill_loss: str = "reverse_kl"
    """reverse_kl (the sampled token's log pi_student - log pi_teacher in its advantage; every loss and estimator) |
    forward_kl_topk | jsd (a local teacher: the divergence over its top distill_topk ids and a tail bucket, a token
    mean times distill_coef added to the loss)."""
    distill_topk: int = 20
    """forward_kl_topk, jsd: how many of the teacher's most likely ids get a bucket each (the rest: one tail)."""
    teacher_temperature: float = 1.0
    """The temperature the teacher scores at (log softmax(logits / T)); the student's log-probs are at the sampling
    temperature, as the loss's. 1 = the teacher's own distribution."""
    teacher_dtype: str = "auto"
    """A local teacher's weights: auto (float32 on the CPU, bfloat16 on a GPU that has it) | float32 | bfloat16 |
    float16."""
    teacher_device: str | None = None
    """A local teacher's device, e.g. cuda:1 (a larger teacher beside the student); null = the student's."""
    teacher_server_api_key: str | None = field(default=None, metadata={"secret": True})
    """teacher_server_url: the teacher server's key, sent on every request; null = VLLM_API_KEY, else for a loopback
    URL the key file `grpokit vllm-serve` wrote for its port (docs/vllm.md); never written to the run's config.yaml."""
    teacher_server_timeout: float = 60.0
    """teacher_server_url: the longest one scoring request may take, in seconds; past it (or when the server is gone)
    the run ends with one line naming the URL."""

    @property
    def distilling(self) -> bool:
        """Whether the run has a teacher (local or served)."""
        return bool(self.teacher_model_name_or_path or self.teacher_server_url)

    def check(self) -> None:
        """One ValueError line naming the problem and the fix."""
        if self.teacher_model_name_or_path and self.teacher_server_url:
            raise ValueError(
                "teacher_model_name_or_path and teacher_server_url are both set; give the teacher one way: a local "
                "model or a server."
            )
        if self.distill_coef < 0:
            raise ValueError(f"distill_coef={self.distill_coef} must be >= 0 (e.g. 1.0; 0 = the teacher only scores).")
        if self.distill_loss not in DISTILL_LOSSES:
            raise ValueError(f"distill_loss={self.distill_loss!r}; valid values are {', '.join(DISTILL_LOSSES)}.")
        if self.distill_loss != "reverse_kl" and self.teacher_server_url:
            raise ValueError(
                f"distill_loss={self.distill_loss} with teacher_server_url: grpokit's served teacher returns only the "
                "sampled token's log-prob, not its top-k; use a local teacher (teacher_model_name_or_path) or "
                "distill_loss: reverse_kl."
            )
        if self.distill_topk < 1:
            raise ValueError(f"distill_topk={self.distill_topk} must be >= 1 (e.g. 20).")
        if not self.teacher_temperature > 0:
            raise ValueError(f"teacher_temperature={self.teacher_temperature} must be > 0 (1 = the teacher's own).")
        if self.teacher_dtype not in TEACHER_DTYPES:
            raise ValueError(f"teacher_dtype={self.teacher_dtype!r}; valid values are {', '.join(TEACHER_DTYPES)}.")
        if not self.teacher_server_timeout > 0:
            raise ValueError(f"teacher_server_timeout={self.teacher_server_timeout} must be > 0 seconds (e.g. 60).")
        url = self.teacher_server_url
        if url and self.teacher_temperature != 1.0:
            raise ValueError(
                f"teacher_temperature={self.teacher_temperature} with teacher_server_url: a server's prompt log-probs "
                "are at temperature 1 (vLLM #5592); use a local teacher or teacher_temperature: 1."
            )
        if url and not url.startswith(("http://", "https://")):
            raise ValueError(
                f"teacher_server_url={url!r} must start with http:// or https://, e.g. http://127.0.0.1:8001"
            )
