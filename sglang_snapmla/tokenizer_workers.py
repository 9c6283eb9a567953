"""The plugin in SGLang's tokenizer worker processes (`--tokenizer-worker-num N > 1`).

With more than one tokenizer worker, SGLang serves HTTP from N worker processes that uvicorn (or granian) starts
fresh: each imports `sglang.srt.entrypoints.http_server` and builds its own tokenizer manager, but none calls
`load_plugins()` (SGLang 0.5.17 and 0.5.23). Without it, the request checks the plugin adds to
`TokenizerManager._validate_one_request` (`request_checks`) are absent there, and one out-of-vocabulary prompt id
reaches the embedding gather and stops the scheduler.

Each worker's first step is to read its arguments from the shared memory the main process fills
(`write_data_for_multi_tokenizer`: a pickle of port args, server args and scheduler info). Where snapmla serves,
the plugin adds one entry to that scheduler info whose unpickling loads SGLang's plugins in the worker, before the
worker builds its tokenizer manager, and checks that the request validation is the plugin's (a worker without the
checks refuses to start). The entry unpickles to a plain string, so the scheduler info stays JSON-serializable
(`/get_server_info` returns it).
"""

from __future__ import annotations

import logging
import os

from .request_checks import HOOKED_VALIDATION
from .server_policy import is_selected

logger = logging.getLogger(__name__)

# the scheduler-info key of the entry; its value in a worker, once plugins are loaded there
WORKER_PLUGINS_KEY = "snapmla_tokenizer_worker_plugins"
LOADED = "loaded"


def load_plugins_in_worker() -> str:
    """Runs where the worker unpickles its arguments: SGLang's `load_plugins()` (idempotent), then a check that the
    request validation is hooked. Returns LOADED (the entry's value in the worker's scheduler info)."""
    import pkgutil

    from sglang.srt.plugins import load_plugins

    load_plugins()
    if not hasattr(pkgutil.resolve_name(HOOKED_VALIDATION), "__wrapped__"):
        raise RuntimeError(f"sglang-snapmla: the request checks did not apply in tokenizer worker {os.getpid()} "
                           f"({HOOKED_VALIDATION} is SGLang's own); serve with --tokenizer-worker-num 1.")
    logger.info("sglang-snapmla: plugins loaded in tokenizer worker %d", os.getpid())
    return LOADED


class _LoadPluginsOnUnpickle:
    """Pickled as a call of `load_plugins_in_worker`: unpickling it in a worker runs that call."""

    def __reduce__(self):
        return load_plugins_in_worker, ()


def carry_plugins_to_workers_hook(original, port_args, server_args, scheduler_info, *args, **kwargs):
    """Around SGLang's `write_data_for_multi_tokenizer(port_args, server_args, scheduler_info)` (main process, only
    with --tokenizer-worker-num > 1): where snapmla serves, the scheduler info the workers read carries the entry
    that loads the plugins there."""
    if is_selected(server_args):
        scheduler_info = {**scheduler_info, WORKER_PLUGINS_KEY: _LoadPluginsOnUnpickle()}
    return original(port_args, server_args, scheduler_info, *args, **kwargs)
