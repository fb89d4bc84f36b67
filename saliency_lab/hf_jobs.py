"""Running a job on HuggingFace Jobs: what a remote container needs that a local process gets for free.

A job on HF Jobs cannot see this machine's disk, so before it starts:
- the code comes from the hub: the Space this app runs in (`SPACE_ID`, set by Spaces) or the repo named by
  `SALIENCY_LAB_CODE_REPO`, mounted read-only at /code;
- local inputs (the mask set folder) are uploaded to a private dataset repo `<user>/saliency-lab-job-<id>` and
  mounted at /inputs;
- the output goes to a private model repo `<user>/<model name>` that the job pushes to (`--push-to`); when the
  job has finished, `fetch_result` downloads it into the local weights folder, so the fine-tuned model appears in
  the model pickers like a local one.

Everything here talks to the hub through `huggingface_hub` module functions (tests replace them with fakes).
"""
from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from explainers import hub

push_result = hub.push_result  # runs inside the job; kept importable from here
CODE_MOUNT, INPUT_MOUNT = "/code", "/inputs"
# kind -> (CLI subcommand, [(param, flag)], required params, params that are local folders to upload)
COMMANDS = {
    "camal": ("camal", [("model", "--model"), ("data", "--data"), ("epochs", "--epochs"),
                        ("lambda", "--lambda"), ("out", "--out")], ("model", "data"), ("data",)),
    # model_files: an imported model's card and weights (the container has no data folder of ours), no flag
    "aha-train": ("train-aha", [("model", "--model"), ("data", "--data"), ("val_data", "--val-data"),
                                ("val_holdout", "--val-holdout"), ("steps", "--steps"),
                                ("minutes", "--time-budget-minutes"), ("seed", "--seed"),
                                ("batch_size", "--batch-size"), ("fraction_samples", "--fraction-samples"),
                                ("val_every", "--val-every"), ("val_track", "--val-track"),
                                ("val_limit", "--val-limit"), ("out", "--out"), ("model_files", None)],
                  ("model", "data", "out"), ("data", "val_data", "model_files")),
}
# a staged model folder becomes the container's own data folder, so the model loads by its name
MODEL_FILES_SETUP = ("mkdir -p /tmp/saliency-data/models && cp {inputs}/model_files/* /tmp/saliency-data/models/ && "
                     "export SALIENCY_DATA_DIR=/tmp/saliency-data")
STAGES = {"COMPLETED": "done", "ERROR": "failed", "CANCELED": "cancelled", "DELETED": "cancelled"}
# torch comes with the job image (CUDA build); the rest of requirements.txt is installed in the container
SETUP = ("cp -r {code} /tmp/app && cd /tmp/app && grep -v -i -E '^(torch|torchvision)([=<> ]|$)' requirements.txt "
         "> /tmp/requirements.txt && pip install -q -r /tmp/requirements.txt")


class HFJobsError(RuntimeError):
    """HF Jobs cannot be used as configured (no token, no code repo, hub refused); the message says why."""


@dataclass
class RemoteJob:
    command: list          # the container's command
    volumes: list          # huggingface_hub.Volume mounts (code, inputs)
    result_repo: str | None  # the model repo the job pushes its output to
    staged_repo: str | None  # the dataset repo holding the uploaded inputs


def cli_command(kind: str, params: dict) -> list[str]:
    """The `python -m explainers ...` command line that runs job `kind` with `params`."""
    if kind not in COMMANDS:
        raise ValueError(f"job kind {kind!r} cannot run on HF Jobs (supported: {', '.join(COMMANDS)})")
    subcommand, flags, required, _ = COMMANDS[kind]
    missing = [name for name in required if params.get(name) is None]
    unknown = set(params) - {name for name, _ in flags}
    if missing or unknown:
        raise ValueError(f"{kind} on HF Jobs: missing params {missing}, unsupported params {sorted(unknown)}")
    command = ["python", "-m", "explainers", subcommand]
    for name, flag in flags:
        if flag and params.get(name) is not None:
            command += [flag, str(params[name])]
    return command


def code_repo() -> tuple[str, str]:
    """(repo id, repo type) of the hub copy of this code that the job mounts."""
    configured = os.environ.get("SALIENCY_LAB_CODE_REPO")
    if configured:
        kind, _, repo = configured.rpartition(":")  # "space:owner/name" or "model:owner/name"; default space
        return repo, kind or "space"
    if os.environ.get("SPACE_ID"):
        return os.environ["SPACE_ID"], "space"
    raise HFJobsError("HF Jobs runs this app's code from the hub: run the app on a HuggingFace Space (SPACE_ID is "
                      "set there), or set SALIENCY_LAB_CODE_REPO to a Space holding this code (e.g. "
                      "'space:<user>/saliency-lab').")


def prepare(kind: str, params: dict, job_id: str, token: str) -> RemoteJob:
    """Upload local inputs, create the output repo and build the command + mounts for `kind`."""
    import huggingface_hub

    if kind not in COMMANDS:
        raise ValueError(f"job kind {kind!r} cannot run on HF Jobs (supported: {', '.join(COMMANDS)})")
    cli_command(kind, params)  # validate the params before touching the hub
    repo, repo_type = code_repo()
    try:
        user = huggingface_hub.whoami(token=token)["name"]
    except Exception as error:  # noqa: BLE001 - bad token, offline: the same to the user
        raise HFJobsError(f"The HuggingFace token was refused or the hub is unreachable: {error}") from error
    remote = dict(params)
    volumes = [huggingface_hub.Volume(type=repo_type, source=repo, mount_path=CODE_MOUNT)]
    staged = None
    uploads = [name for name in COMMANDS[kind][3] if params.get(name) is not None and Path(str(params[name])).exists()]
    if uploads:
        staged = f"{user}/saliency-lab-job-{job_id}"
        huggingface_hub.create_repo(staged, repo_type="dataset", private=True, exist_ok=True, token=token)
        for name in uploads:
            huggingface_hub.upload_folder(repo_id=staged, repo_type="dataset", folder_path=str(params[name]),
                                          path_in_repo=name, token=token,
                                          commit_message=f"Saliency Lab job {job_id}: {name}")
            remote[name] = f"{INPUT_MOUNT}/{name}"
        volumes.append(huggingface_hub.Volume(type="dataset", source=staged, mount_path=INPUT_MOUNT))
    result_repo = None
    if params.get("out"):
        name = Path(str(params["out"])).name
        result_repo = f"{user}/{name}"
        huggingface_hub.create_repo(result_repo, repo_type="model", private=True, exist_ok=True, token=token)
        remote["out"] = f"/tmp/out/{name}"
    command = cli_command(kind, remote)
    if result_repo:
        command += ["--push-to", result_repo]
    script = SETUP.format(code=CODE_MOUNT) + " && "
    if remote.get("model_files"):
        script += MODEL_FILES_SETUP.format(inputs=INPUT_MOUNT) + " && "
    script += shlex.join(command)
    return RemoteJob(command=["bash", "-c", script], volumes=volumes, result_repo=result_repo, staged_repo=staged)


def fetch_result(repo_id: str, weights_dir, token: str | None = None) -> dict:
    """Download a finished job's model into `weights_dir`; returns its summary with local paths."""
    import huggingface_hub

    weights_dir = Path(weights_dir)
    name = repo_id.split("/")[-1]
    huggingface_hub.snapshot_download(repo_id=repo_id, repo_type="model", local_dir=str(weights_dir), token=token,
                                      allow_patterns=[f"{name}.*", f"{name}-*"])
    summary_file = weights_dir / f"{name}.summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else {}
    summary.update({"name": name, "card": str(weights_dir / f"{name}.json"), "hub_repo": repo_id})
    if summary.get("weights"):
        summary["weights"] = str(weights_dir / Path(summary["weights"]).name)
    return summary
