"""Switches that keep litellm and huggingface_hub off the network.

Imported by the package ``__init__`` so that they are set before anything imports
litellm: at import litellm otherwise fetches a price map from GitHub, and its token
counter may try huggingface.co for 20+ seconds (see research notes).
"""

from __future__ import annotations

import os

OFFLINE_ENV = {
    "LITELLM_OFFLINE_MODE": "true",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def apply() -> None:
    """Set the offline switches unless the user set them explicitly."""
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)
