"""What a client sends, checked before the request is scheduled: token ids against the model's vocabulary, and the
sampling parameters SGLang compares as numbers.

SGLang 0.5.17 and 0.5.23 pass a request's prompt token ids (`/generate`'s `input_ids`, the token-id prompts of
`/v1/completions`) to the embedding gather unchecked: one id outside [0, vocab_size) ends in a device-side assert
that stops the scheduler, and every request in flight with it (sglang PR #8383, "a request-level DoS", open). Other
ids a client names reach the GPU as indices too: `stop_token_ids` (the min-new-tokens penalizer scatters them into a
vocabulary-wide tensor) and `logit_bias` keys. Where snapmla is the backend the plugin checks all of them in
`TokenizerManager._validate_one_request`, whose ValueError SGLang's HTTP layer answers with 400 and the message; other
backends are left as SGLang has them. The one other id list a request names, `token_ids_logprob`, SGLang checks
itself in that method (`_validate_token_ids_logprob` in both releases: a flat list of ids in the vocabulary) before
the plugin's checks run.

A sampling parameter of the wrong type (`"temperature": "hot"`) fails later, in SamplingParams' arithmetic, with a
TypeError that SGLang 0.5.17 answers with HTTP 500; the same hook refuses it with 400, naming the field. So does a
count of top logprobs per token (`top_logprobs_num` with `return_logprob`) that is negative, not an integer or above
the vocabulary: SGLang passes a batch's largest count to `torch.topk` over the vocabulary in the scheduler
(`logprob_processor.get_top_logprobs_raw`), whose error there would end the scheduler too.
"""

from __future__ import annotations

from typing import Iterable

PR = "sglang PR #8383"
# SGLang's per-request validation, which the plugin wraps with these checks (plugin.sglang_hooks; tokenizer_workers
# checks that the wrap applied in each tokenizer worker)
HOOKED_VALIDATION = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"


def _first_outside(ids: Iterable, vocab_size: int) -> tuple[int, object] | None:
    """(position, value) of the first id that is not an integer in [0, vocab_size), or None."""
    for i, v in enumerate(ids):
        try:
            ok = int(v) == v and 0 <= int(v) < vocab_size
        except (TypeError, ValueError, OverflowError):  # OverflowError: int() of JSON's Infinity
            ok = False
        if not ok:
            return i, v
    return None


def _refuse(field: str, where: tuple[int, object], vocab_size: int) -> ValueError:
    i, v = where
    return ValueError(f"{field}[{i}] = {v!r} is not a token id of this model: ids must be integers in "
                      f"[0, {vocab_size}). The request was refused before it reached the GPU ({PR}).")


def check_request_token_ids(obj, input_ids, vocab_size: int) -> None:
    """Raises ValueError (HTTP 400) naming the first out-of-vocabulary id in the prompt `input_ids` or in the
    request's stop_token_ids or logit_bias keys (`obj`: SGLang's GenerateReqInput or
    EmbeddingReqInput for one request). A prompt of Python ints (what SGLang's parsers make of a JSON array of
    integers) is checked by its extremes: a long prompt costs a pass over its types and one min / max pass. Any other
    prompt goes id by id: min / max alone would pass a NaN between two ids (no comparison with NaN is true) or a
    fraction."""
    if input_ids is not None and len(input_ids):
        if set(map(type, input_ids)) == {int}:
            bad = None if 0 <= min(input_ids) and max(input_ids) < vocab_size else _first_outside(input_ids, vocab_size)
        else:
            bad = _first_outside(input_ids, vocab_size)
        if bad:
            raise _refuse("input_ids", bad, vocab_size)
    params = getattr(obj, "sampling_params", None)
    if isinstance(params, dict):
        for field, ids in (("stop_token_ids", params.get("stop_token_ids")),
                           ("logit_bias", list((params.get("logit_bias") or {}).keys()))):
            bad = _first_outside(_as_ints(ids), vocab_size) if ids else None
            if bad:
                raise _refuse(f"sampling_params.{field}", bad, vocab_size)


# the sampling parameters SamplingParams compares or computes with (None: SGLang's default)
NUMERIC_SAMPLING_PARAMS = ("max_new_tokens", "min_new_tokens", "n", "temperature", "top_p", "top_k", "min_p",
                           "frequency_penalty", "presence_penalty", "repetition_penalty")


def check_sampling_numbers(obj) -> None:
    """Raises ValueError (HTTP 400) naming the first of NUMERIC_SAMPLING_PARAMS in the request's sampling_params that
    is neither a number nor None (booleans included: JSON's true is no temperature)."""
    params = getattr(obj, "sampling_params", None)
    if not isinstance(params, dict):
        return
    for field in NUMERIC_SAMPLING_PARAMS:
        v = params.get(field)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise ValueError(f"sampling_params.{field} = {v!r} is not a number. The request was refused before it "
                             "was scheduled.")


def check_top_logprobs_num(obj, vocab_size: int) -> None:
    """Raises ValueError (HTTP 400) if the request returns logprobs (`return_logprob`) with a `top_logprobs_num` that
    is not an integer in [0, vocab_size]."""
    if not getattr(obj, "return_logprob", False):
        return
    k = getattr(obj, "top_logprobs_num", None)
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= vocab_size):
        raise ValueError(f"top_logprobs_num = {k!r} must be an integer in [0, {vocab_size}] (the vocabulary's size). "
                         "The request was refused before it was scheduled.")


def _as_ints(ids) -> list:
    """Ids as a client may send them: ints, or strings of ints (logit_bias keys are JSON strings)."""
    out = []
    for v in ids:
        if v is None:  # SGLang drops None from stop_token_ids
            continue
        try:
            out.append(int(v) if isinstance(v, str) else v)
        except ValueError:
            out.append(v)
    return out
