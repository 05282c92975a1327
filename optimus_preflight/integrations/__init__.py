"""The preflight inside other people's training loops: a Lightning ``Callback`` and a
Hugging Face ``TrainerCallback``. Each module imports its library, so import the one you
use (``optimus_preflight.integrations.lightning`` or ``.huggingface``); installing the
``lightning`` or ``hf`` extra provides it."""
