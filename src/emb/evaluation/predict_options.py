"""The options rule predict passes to ``python -m emb.evaluation.predict``, from the workflow's
``predict:`` settings (validated and defaulted by workflow/schemas/config.schema.yaml)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping


def predict_options(settings: Mapping[str, object]) -> str:
    """``config["predict"]`` as predict's command-line options, shell-quoted: the window
    overlap, block and batch size always; the window side only when set (else the run's
    training tile), ``--with-probabilities`` only when asked for."""
    options = [
        f"--overlap={settings['overlap']}",
        f"--block={settings['block']}",
        f"--batch-size={settings['batch_size']}",
        *([f"--tile={settings['tile']}"] if settings.get("tile") else []),
        *(["--with-probabilities"] if settings["probabilities"] else []),
    ]
    return shlex.join(options)
