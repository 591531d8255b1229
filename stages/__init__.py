"""One module per stage, plus the torch-side executors they share.

Importing the package silences torchao's CUDA-extension notice and a torch pytree
deprecation log line that would otherwise print on every command.
"""

import logging
import os

os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")
for _name in ("torchao", "torch.utils._pytree"):
    logging.getLogger(_name).setLevel(logging.ERROR)
