"""The contract between an exported latency model and the code that serves it.

One input ``features`` of shape (batch, 16), float32, columns in ``FEATURE_NAMES`` order;
one output ``latency_ms`` of shape (batch,). The graph normalises its input itself, so a
server feeds raw feature rows. The model's ``metadata_props`` hold one entry,
``fairsched``, a JSON object:

``format_version``  this contract's version (``FORMAT_VERSION``); bumped when the input,
                    output or meaning of a feature changes, so old files are refused
``feature_names``   the 16 names in column order, checked against ``FEATURE_NAMES`` at load
``feature_units``   unit of each feature
``output_unit``     ``ms``
``memory_provider`` what measured the four memory features (see ``memory``)
``vllm_version``, ``hardware``  of the profile the model was trained on
``feature_ranges``  each feature's ``[minimum, maximum]`` over the training split;
                    serving clamps inputs into them (optional: a model without it is
                    served unclamped)
``training``        metrics on the held-out test split, sample counts, hyperparameters,
                    best epoch, training time
``created``         export time
"""

from __future__ import annotations

FORMAT_VERSION = 1
METADATA_KEY = "fairsched"
INPUT_NAME = "features"
OUTPUT_NAME = "latency_ms"
