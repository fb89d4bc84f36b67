"""Which errors carry a message written for the user, and that message (for the app and the CLI alike).

    try:
        ...
    except Exception as error:
        if is_user_error(error):
            print(user_message(error))     # "Pick at least one explanation method."
        else:
            raise

The app turns these into gr.Error.
"""
from __future__ import annotations

import re

from explainers.images import ImageError
from explainers.methods import MethodNotApplicable
from explainers.models import ModelUnavailableError
from .review_store import ReviewError

# Errors whose message is written for the user: shown as is.
USER_ERRORS = (ImageError, ModelUnavailableError, MethodNotApplicable, ReviewError, FileNotFoundError, ValueError,
               KeyError)
# The same, for classes that are only importable with optional packages (matched by name).
USER_ERROR_NAMES = ("MaskError", "SamUnavailableError", "ExplainerUnavailable", "JobError", "HFJobsError")
# What makes one method fail without failing the others: it is skipped with a note.
SKIPPABLE = ("ExplainerUnavailable", "ModelUnavailableError")


def user_message(error: BaseException) -> str:
    """The error's text without quotes (KeyError adds them), first letter capitalised unless the text starts
    with a file or model name (`cell.png is not...` stays as is), or its class name."""
    text = str(error).strip().strip("'\"") or type(error).__name__
    first = text.split(" ", 1)[0]
    if re.search(r"[./\\_\d-]", first):
        return text
    return text[:1].upper() + text[1:]


def is_user_error(error: BaseException) -> bool:
    """True when the error's message is meant for the user (bad input, a missing model, ...)."""
    return isinstance(error, USER_ERRORS) or type(error).__name__ in USER_ERROR_NAMES


def is_skippable(error: BaseException) -> bool:
    """True when one explanation method cannot run here (this model, this image) and can be skipped with a
    note while the others go on; any other error is a bug and must propagate."""
    return isinstance(error, (MethodNotApplicable, ValueError)) or type(error).__name__ in SKIPPABLE
