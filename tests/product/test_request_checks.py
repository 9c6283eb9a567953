"""Token ids and sampling numbers a client sends, refused with HTTP 400 before they reach the GPU where snapmla
serves (sglang_snapmla.request_checks): the check itself, SGLang's per-request validation as the plugin hooks it, and a
/generate request through SGLang's own HTTP app."""

import re
from types import SimpleNamespace

import pytest

from sglang_snapmla.request_checks import (check_request_token_ids, check_sampling_numbers,
                                           check_top_logprobs_num)

VOCAB = 32000


@pytest.mark.parametrize("ids,params,field", [
    ([1000000000, -5, 3], {}, "input_ids[0] = 1000000000"),
    ([3, -5], {}, "input_ids[1] = -5"),
    ([-1, 3], {}, "input_ids[0] = -1"),
    ([0, VOCAB], {}, f"input_ids[1] = {VOCAB}"),
    ([1, 2], {"stop_token_ids": [7, VOCAB + 3]}, "sampling_params.stop_token_ids[1]"),
    ([1, 2], {"stop_token_ids": [7, 2.5]}, "sampling_params.stop_token_ids[1] = 2.5"),  # scattered as an index
    ([1, 2], {"logit_bias": {"5": 1.0, "-1": 2.0}}, "sampling_params.logit_bias[1] = -1"),
    ([1, "7"], {}, "input_ids[1] = '7'"),  # a string among numbers: min / max raise TypeError
    ([1, 2], {"logit_bias": {"5": 1.0, "x": 2.0}}, "sampling_params.logit_bias[1] = 'x'"),  # int("x") raises
    ([1, 2], {"stop_token_ids": [3, float("nan")]}, "sampling_params.stop_token_ids[1] = nan"),  # JSON's NaN
    # an infinity (JSON's Infinity as Python's json reads it, or a float handed to SGLang's Engine API): int() raises
    # OverflowError, which must still be the refusal, a ValueError
    ([1, 2], {"stop_token_ids": [float("inf")]}, "sampling_params.stop_token_ids[0] = inf"),
    ([1, float("-inf")], {}, "input_ids[1] = -inf"),
    # a NaN or a fraction between ids inside the vocabulary: no comparison with NaN is true, so min / max pass both
    ([1, float("nan"), 2], {}, "input_ids[1] = nan"),
    ([1, 2.5, 3], {}, "input_ids[1] = 2.5"),
])
def test_out_of_vocabulary_ids_are_refused_with_the_field_named(ids, params, field):
    obj = SimpleNamespace(sampling_params=params)
    with pytest.raises(ValueError, match=re.escape(field) + rf".*\[0, {VOCAB}\)"):
        check_request_token_ids(obj, ids, VOCAB)


def test_ids_inside_the_vocabulary_pass():
    obj = SimpleNamespace(sampling_params={"stop_token_ids": [0, VOCAB - 1, None], "logit_bias": {"12": -1.0}})
    check_request_token_ids(obj, [0, 17, VOCAB - 1], VOCAB)
    check_request_token_ids(obj, [0, 17.0, True], VOCAB)  # whole numbers of other types, as SGLang takes them
    check_request_token_ids(SimpleNamespace(sampling_params=None), None, VOCAB)  # a text prompt, tokenized later


@pytest.mark.parametrize("field,value", [("temperature", "hot"), ("top_p", [0.5]), ("max_new_tokens", "8"),
                                         ("top_k", True), ("repetition_penalty", {"x": 1}),
                                         ("min_new_tokens", "2")])
def test_sampling_numbers_of_another_type_are_refused_with_the_field_named(field, value):
    with pytest.raises(ValueError, match=rf"sampling_params.{field} = .* is not a number"):
        check_sampling_numbers(SimpleNamespace(sampling_params={"max_new_tokens": 4, field: value}))


def test_sampling_numbers_pass():
    check_sampling_numbers(SimpleNamespace(sampling_params={"temperature": 0, "top_p": 0.9, "top_k": -1,
                                                            "max_new_tokens": 16, "min_p": None}))
    check_sampling_numbers(SimpleNamespace(sampling_params=None))


@pytest.mark.parametrize("k", [VOCAB + 1, 10**9, -1, 2.5, True, "5"])
def test_top_logprob_counts_outside_the_vocabulary_are_refused(k):
    """What SGLang would pass to torch.topk over the vocabulary, in the scheduler: a count above the vocabulary or
    below 0 raises there (checked here on CPU tensors), so the request is refused before it is scheduled."""
    import torch

    if isinstance(k, int) and not isinstance(k, bool):
        with pytest.raises(RuntimeError):
            torch.zeros(2, VOCAB).topk(k, dim=-1)
    with pytest.raises(ValueError, match=re.escape(f"top_logprobs_num = {k!r} must be an integer in [0, {VOCAB}]")):
        check_top_logprobs_num(SimpleNamespace(return_logprob=True, top_logprobs_num=k), VOCAB)


def test_top_logprob_counts_inside_the_vocabulary_pass():
    for k in (0, 5, VOCAB, None):
        check_top_logprobs_num(SimpleNamespace(return_logprob=True, top_logprobs_num=k), VOCAB)
    check_top_logprobs_num(SimpleNamespace(return_logprob=False, top_logprobs_num=10**9), VOCAB)  # not returned


@pytest.fixture
def manager_for():
    """TokenizerManager for one backend, with the fields SGLang's `_validate_one_request` reads and the server args
    published as its process publishes them (its constructor also starts the tokenizer and the sockets to the
    scheduler); the method itself is SGLang's, hooked by the plugin. The published config is reset afterwards."""
    from pathlib import Path

    from sglang.srt import runtime_context
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.server_args import prepare_server_args

    from sglang_snapmla import plugin

    plugin.register()
    model = str(Path(__file__).resolve().parents[2] / "configs/models/deepseek-v2-lite-shape")

    def make(backend: str):
        tm = object.__new__(TokenizerManager)
        tm.server_args = prepare_server_args(["--model-path", model, "--attention-backend", backend, "--device", "cpu"])
        runtime_context.publish(tm.server_args, role="tokenizer")
        tm.model_config = ModelConfig.from_server_args(tm.server_args)  # the bundled config: vocab 32 000
        assert tm.model_config.vocab_size == VOCAB
        tm.context_len, tm.num_reserved_tokens, tm.allow_auto_truncate = 4096, 0, False
        tm.validate_total_tokens, tm.is_generation = True, True
        return tm

    yield make
    runtime_context.reset_context()


def request(**kw):
    from sglang.srt.managers.io_struct import GenerateReqInput

    obj = GenerateReqInput(**{"sampling_params": {"max_new_tokens": 4}, **kw})
    obj.normalize_batch_and_arguments()
    return obj


@pytest.mark.cpu_interpreter  # the server args of a snapmla server on --device cpu
def test_sglangs_request_validation_refuses_them_where_snapmla_serves(manager_for):
    tm = manager_for("snapmla")
    obj = request(input_ids=[1000000000, -5, 3])
    with pytest.raises(ValueError, match=r"input_ids\[0\] = 1000000000 is not a token id"):
        tm._validate_one_request(obj, obj.input_ids)
    obj = request(input_ids=[5, 6], sampling_params={"max_new_tokens": 4, "stop_token_ids": [VOCAB],
                                                     "min_new_tokens": 2})
    with pytest.raises(ValueError, match=r"stop_token_ids\[0\]"):
        tm._validate_one_request(obj, obj.input_ids)
    obj = request(input_ids=[5, 6], sampling_params={"max_new_tokens": 4, "temperature": "hot"})
    with pytest.raises(ValueError, match=r"sampling_params.temperature = 'hot' is not a number"):
        tm._validate_one_request(obj, obj.input_ids)
    obj = request(input_ids=[5, 6], return_logprob=True, top_logprobs_num=VOCAB + 1)
    with pytest.raises(ValueError, match=rf"top_logprobs_num = {VOCAB + 1} must be an integer"):
        tm._validate_one_request(obj, obj.input_ids)
    good = request(input_ids=[5, 6, VOCAB - 1], return_logprob=True, top_logprobs_num=5, token_ids_logprob=[0, 9])
    tm._validate_one_request(good, good.input_ids)


@pytest.mark.cpu_interpreter
@pytest.mark.parametrize("logprob_ids,message", [([4, VOCAB], "out-of-vocabulary token id"),
                                                 ([-1], "out-of-vocabulary token id"),
                                                 ([[1, 2]], "flat list of integers")])
def test_sglang_itself_refuses_token_ids_logprob_outside_the_vocabulary(manager_for, logprob_ids, message):
    """The id list request_checks leaves to SGLang: both supported releases refuse it in the same validation, before
    the plugin's checks (a release without that check fails here: request_checks must then take it)."""
    tm = manager_for("snapmla")
    obj = request(input_ids=[5, 6], return_logprob=True, token_ids_logprob=logprob_ids)
    with pytest.raises(ValueError, match=message):
        tm._validate_one_request(obj, obj.input_ids)


@pytest.mark.cpu_interpreter
def test_other_backends_keep_sglangs_validation(manager_for):
    tm = manager_for("triton")
    obj = request(input_ids=[VOCAB + 1])
    tm._validate_one_request(obj, obj.input_ids)  # SGLang's own check passes it (the plugin leaves it alone)


@pytest.mark.cpu_interpreter
def test_generate_answers_400_with_the_message(manager_for, monkeypatch):
    """POST /generate through SGLang's FastAPI app; its tokenizer manager validates the request with the hooked
    method and would go on to schedule it (never reached here)."""
    from fastapi.testclient import TestClient
    from sglang.srt.entrypoints import http_server

    tm = manager_for("snapmla")
    scheduled = []

    async def generate_request(obj, request=None):
        obj.normalize_batch_and_arguments()
        tm._validate_one_request(obj, obj.input_ids)
        scheduled.append(obj.input_ids)
        yield {"text": "", "output_ids": [], "meta_info": {}}

    monkeypatch.setattr(http_server, "_global_state", SimpleNamespace(tokenizer_manager=SimpleNamespace(
        generate_request=generate_request, create_abort_task=lambda obj: None)))
    client = TestClient(http_server.app)
    bad = client.post("/generate", json={"input_ids": [1000000000, -5, 3], "sampling_params": {"max_new_tokens": 2}})
    assert bad.status_code == 400, bad.text
    assert "is not a token id of this model" in bad.text
    hot = client.post("/generate", json={"input_ids": [1, 2], "sampling_params": {"temperature": "hot"}})
    # 0.5.17 reaches the hooked validation (ours names the field); 0.5.23 refuses the type when it parses the body
    assert hot.status_code == 400 and ("is not a number" in hot.text or "expected f64" in hot.text), hot.text
    ok = client.post("/generate", json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}})
    assert ok.status_code == 200, ok.text
    assert scheduled == [[1, 2, 3]]


# what a tokenizer worker runs first (SGLang's `init_multi_tokenizer`: its arguments from the main process's shared
# memory), then a request validated by its own tokenizer manager; prints the scheduler info and the refusal
WORKER = """
import json, sys
from sglang.srt.managers.multi_tokenizer_mixin import read_from_shared_memory
port_args, server_args, info = read_from_shared_memory(sys.argv[1])
from sglang.srt import runtime_context
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.tokenizer_manager import TokenizerManager
runtime_context.publish(server_args, role="tokenizer")  # as the worker's tokenizer manager does
tm = object.__new__(TokenizerManager)
tm.server_args, tm.model_config = server_args, ModelConfig.from_server_args(server_args)
tm.context_len, tm.num_reserved_tokens, tm.allow_auto_truncate = 4096, 0, False
tm.validate_total_tokens, tm.is_generation = True, True
obj = GenerateReqInput(input_ids=[1000000000, 3], sampling_params={"max_new_tokens": 4})
obj.normalize_batch_and_arguments()
try:
    tm._validate_one_request(obj, obj.input_ids)
    refusal = None
except ValueError as e:
    refusal = str(e)
print("WORKER", json.dumps({"info": info, "refusal": refusal}))
"""


def _run_tokenizer_worker(server_args, env=None):
    """The main process's hand-off to tokenizer workers (`write_data_for_multi_tokenizer`, hooked) for `server_args`,
    then a fresh interpreter reading it from shared memory as SGLang's workers do (WORKER) -> its CompletedProcess."""
    import os
    import subprocess
    import sys
    from multiprocessing import shared_memory

    from sglang.srt.entrypoints import http_server

    http_server.write_data_for_multi_tokenizer(SimpleNamespace(), server_args, {"max_req_input_len": 4096})
    name = f"multi_tokenizer_args_{os.getpid()}"
    try:
        return subprocess.run([sys.executable, "-c", WORKER, name], capture_output=True, text=True, timeout=600,
                              env=env)
    finally:
        try:  # the worker's resource tracker may have removed it already (Python < 3.13 tracks what a process opens)
            shared_memory.SharedMemory(name=name).unlink()
        except FileNotFoundError:
            pass


@pytest.mark.cpu_interpreter
@pytest.mark.parametrize("backend,refused", [("snapmla", True), ("triton", False)])
def test_tokenizer_workers_refuse_them_too(manager_for, backend, refused):
    """With --tokenizer-worker-num > 1 SGLang serves HTTP from fresh worker processes that load no plugins; the
    arguments the main process hands them (`write_data_for_multi_tokenizer`, hooked) load the plugin in each worker
    where snapmla serves, and leave other backends' workers as SGLang has them. The worker here is a fresh
    interpreter reading the shared memory as SGLang's workers do."""
    import json

    res = _run_tokenizer_worker(manager_for(backend).server_args)
    line = next((x for x in res.stdout.splitlines() if x.startswith("WORKER ")), None)
    assert line, res.stdout[-1000:] + res.stderr[-3000:]
    seen = json.loads(line[len("WORKER "):])
    if refused:
        assert seen["info"]["snapmla_tokenizer_worker_plugins"] == "loaded"
        assert "input_ids[0] = 1000000000 is not a token id" in seen["refusal"]
    else:
        assert "snapmla_tokenizer_worker_plugins" not in seen["info"] and seen["refusal"] is None


@pytest.mark.cpu_interpreter
def test_a_tokenizer_worker_without_the_checks_refuses_to_start(manager_for):
    """A worker where SGLang's plugin loading does not hook the request validation (here its SGLANG_PLUGINS whitelist
    leaves snapmla out) stops while it reads its arguments, naming the setting that serves, instead of serving
    requests unchecked."""
    import os

    res = _run_tokenizer_worker(manager_for("snapmla").server_args,
                                env=dict(os.environ, SGLANG_PLUGINS="another_plugin"))
    assert res.returncode != 0 and "WORKER " not in res.stdout, res.stdout[-1000:]
    assert "the request checks did not apply in tokenizer worker" in res.stderr, res.stderr[-3000:]
    assert "serve with --tokenizer-worker-num 1" in res.stderr
