"""Uploading a saved model to the Hugging Face Hub (TRL's ``trainer.push_to_hub()``)."""

from __future__ import annotations

from pathlib import Path

# What a run folder holds besides the saved model: never uploaded.
RUN_FILES = ["checkpoints/**", "final/**", "eval/**", "rollouts.sqlite*", "metrics.jsonl", "report.html", "*.tmp"]


def push_folder(
    folder: Path,
    repo: str,
    *,
    token: str | None = None,
    private: bool = False,
    commit_message: str = "End of training",
    revision: str | None = None,
):
    """Create the Hub repo ``repo`` if needed and upload ``folder`` to it, without the run's own files
    (:data:`RUN_FILES`); returns huggingface_hub's commit info. Any failure (offline mode, no network, no token,
    no permission) is a ``ConnectionError`` of one line naming the repo, the cause and where the model is."""
    try:
        from huggingface_hub import HfApi

        api = HfApi(token=token)
        repo_id = api.create_repo(repo, private=private, exist_ok=True).repo_id
        return api.upload_folder(
            repo_id=repo_id,
            folder_path=str(folder),
            commit_message=commit_message,
            revision=revision,
            ignore_patterns=RUN_FILES,
        )
    except Exception as exc:  # offline, unreachable, unauthorised ...: one line, the model stays on disk
        cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConnectionError(
            f"push_to_hub: could not upload to the Hub repo {repo!r} ({type(exc).__name__}: {cause}); the model is "
            f"saved in {folder}, upload it later with `hf upload {repo} {folder}`."
        ) from None
