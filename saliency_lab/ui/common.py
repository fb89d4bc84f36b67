"""What every tab uses: errors as messages (`friendly`), the checked image input, the data-set menu, `or_skip`."""
from __future__ import annotations

import functools
import inspect
import logging
import os
import time
import traceback

import gradio as gr
import torch

from explainers.images import ImageError
from saliency_lab import browse as browse_module
from saliency_lab.errors import is_user_error, user_message
from saliency_lab.services import UPLOADS

log = logging.getLogger("saliency_lab")


class _AggAlready:
    """Gradio wraps every event in `MatplotlibBackendMananger`, which calls `matplotlib.use("agg")` twice (~4-10 ms
    of CPU per event, 15% of a slider redraw on 2 vCPUs). With MPLBACKEND=Agg set before matplotlib loads, the
    switch changes nothing, so it is skipped."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if os.environ.get("MPLBACKEND", "").lower() == "agg":
    import gradio.utils as _gradio_utils

    _gradio_utils.MatplotlibBackendMananger = _AggAlready


def friendly(fn):
    """Turn every exception into a gr.Error with a clear message (never a stack trace in the UI)."""

    def convert(error):
        if isinstance(error, gr.Error):
            return error
        if is_user_error(error):
            return gr.Error(user_message(error))
        if isinstance(error, torch.cuda.OutOfMemoryError if hasattr(torch.cuda, "OutOfMemoryError") else MemoryError):
            return gr.Error("Out of memory: try a smaller image, fewer methods or a smaller model.")
        reference = f"{int(time.time()) % 1_000_000:06d}"
        log.error("unexpected error %s in %s:\n%s", reference, fn.__name__, traceback.format_exc())
        return gr.Error(f"Something went wrong on our side: this is a bug, not your input. The details are in "
                        f"the server log (reference {reference}).")

    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def generator_wrapper(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except Exception as error:  # noqa: BLE001 - every error becomes a message
                raise convert(error) from error
        return generator_wrapper

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - every error becomes a message
            raise convert(error) from error
    return wrapper


def refused_answer(error, status_index: int, outputs: int) -> tuple:
    """The outputs of a form whose input was refused: our sentence in its status line, gr.skip() elsewhere."""
    answer = [gr.skip()] * outputs
    answer[status_index] = "⚠ " + user_message(error)
    return tuple(answer)


def refusal_in_status(fn, untouched: int):
    """For a form whose outputs are (status line, *other parts): a refused input (a user error) becomes one
    sentence in the status line and leaves the other `untouched` outputs as they were (gr.skip()). Raising would
    show the message as a toast and put a red "Error" badge on every output; any other error stays a `friendly`
    one (a bug, logged)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - user errors become the status line, bugs a message
            if not is_user_error(error):
                raise
            return refused_answer(error, 0, 1 + untouched)
    return friendly(wrapper)


def refusal_in_status_stream(fn, status_index: int, outputs: int):
    """`refusal_in_status` for a streamed handler whose status line is output `status_index` of `outputs`: a
    refused input (no image, a model that cannot be loaded) becomes one sentence there, everything else stays as
    it was; a bug stays a `friendly` message."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            yield from fn(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - user errors become the status line, bugs a message
            if not is_user_error(error):
                raise
            yield refused_answer(error, status_index, outputs)
    return friendly(wrapper)


CHECKED = "checked-upload"  # the class that marks a gr.Image whose uploads load_image checks first
TO_HANDLER = "refusal-to-handler"  # ... and hands a refusal to its handler (RefusedUpload) instead of a toast


class RefusedUpload(str):
    """What a handler receives for an upload `load_image` refused, from a gr.Image made with
    `checked_image(refusal_to_handler=True)`: the message for the person (a str), so that the handler can clear
    the picture and say why where it stays in view, with no error event (no red badge on every output)."""


_REFUSED: dict = {}  # upload path -> when it was last refused (one toast per refused upload)


def _checked_preprocess(plain):
    def preprocess(self, payload):
        if CHECKED in (self.elem_classes or []) and payload is not None and getattr(payload, "path", None):
            try:
                UPLOADS.picture(payload.path)  # decoded once: the handlers take this picture from here
            except ImageError as error:
                if TO_HANDLER in (self.elem_classes or []):
                    return RefusedUpload(user_message(error))
                # the browser sends a replaced image's change twice: the second refusal fails silently
                now, path = time.monotonic(), str(payload.path)
                repeated = now - _REFUSED.get(path, -1e9) < 5.0
                _REFUSED.clear() if len(_REFUSED) > 256 else None
                _REFUSED[path] = now
                raise gr.Error(user_message(error), visible=not repeated) from error
        return plain(self, payload)

    preprocess.checked = True
    return preprocess


if not getattr(gr.Image.preprocess, "checked", False):
    # At the class, not per instance: an update of the component (gr.update, gr.skip as an output) makes Gradio
    # rebuild it from its constructor arguments, which would drop a per-instance wrapper; the marker class
    # survives. (A gr.Image subclass would make Gradio write a .pyi stub next to this file.)
    gr.Image.preprocess = _checked_preprocess(gr.Image.preprocess)


def checked_image(refusal_to_handler: bool = False, **kwargs) -> gr.Image:
    """A gr.Image that refuses unreadable, too large or too small uploads with a clear message, before any
    handler runs (explainers.images.load_image's checks: header-first size limits, allowed decoders), and hands
    the handler the file as uploaded (image_mode=None: Gradio's RGB conversion would whiten 16-bit data). The
    check decodes the upload once into `saliency_lab.services.UPLOADS`, where every handler finds it.
    `refusal_to_handler`: the handler gets a RefusedUpload (the message) instead of a toast."""
    kwargs.setdefault("image_mode", None)
    kwargs["elem_classes"] = [*(kwargs.get("elem_classes") or []), CHECKED] + ([TO_HANDLER] if refusal_to_handler
                                                                               else [])
    return gr.Image(**kwargs)


def dataset_dropdown(data_dir, **kwargs) -> gr.Dropdown:
    """A menu of named data sets (the catalogue, saliency_lab.datasets: shipped, BloodMNIST's splits when
    present, the data folder's), no server paths; off a Space a folder path inside the data roots may be typed."""
    choices, value = browse_module.dataset_menu(data_dir)
    local = not browse_module.on_space()
    return gr.Dropdown(choices, value=value, label="Data set", allow_custom_value=local,
                       info="Shipped sets, BloodMNIST's test split when present, and those in your data folder"
                            + (" (or type a folder inside the data roots)." if local else "."), **kwargs)


def named(fn, names):
    """`fn` with positional parameters called `names`: Gradio names an endpoint's API parameters after the
    handler's signature, and a handler that takes `*values` would show them as param_4, param_5..."""
    fn.__signature__ = inspect.Signature([inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                                          for name in names])
    return fn


def or_skip(value):
    """None -> gr.skip() (leave the output as it is)."""
    return gr.skip() if value is None else value


def model_picker_update(services):
    """The choices of a model menu now (fine-tuned and imported models included; the current choice is kept)."""
    from saliency_lab import menus

    return gr.update(choices=menus.model_choices(services.names()))
