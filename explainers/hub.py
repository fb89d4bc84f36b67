"""Handing a finished run back through the Hugging Face hub (the CLI's `camal --push-to`, run inside an HF Job)."""
from __future__ import annotations

import os
from pathlib import Path


def push_result(out, repo_id: str, token: str | None = None) -> None:
    """Upload a finished run's files (`<out>.json`, weights, figures, summary) to `repo_id` (run in the job)."""
    import huggingface_hub

    out = Path(out)
    name = out.name
    huggingface_hub.upload_folder(repo_id=repo_id, repo_type="model", folder_path=str(out.parent),
                                  allow_patterns=[f"{name}.*", f"{name}-*"], ignore_patterns=["*.ckpt", "*.pt"],
                                  token=token or os.environ.get("HF_TOKEN"),
                                  commit_message=f"Saliency Lab: {name}")
