"""The serving-scale accuracy gate's arithmetic (tools/accuracy_gate.py), on made-up outputs (no server)."""

import math

from tools import accuracy_gate as ag


def probe(ids, lps):
    return {"ids": ids, "logprobs": lps}


def test_errors_stop_at_the_first_differing_token_and_nan_is_infinite():
    ref = [probe([1, 2, 3], [-0.1, -0.2, -0.3])]
    assert ag.token_errors(ref, ref) == (0.0, 1)
    run = [probe([1, 5, 3], [-0.2, -0.4, -9.0])]  # parts at token 1: tokens 0 and 1 compared, token 2 not
    err, same = ag.token_errors(run, ref)
    assert math.isclose(err, (0.1 + 0.2) / 2) and same == 0
    assert ag.token_errors([probe([1, 2, 3], [-0.1, None, -0.3])], ref)[0] == math.inf


def test_the_gate_fails_an_error_that_grows_with_batch_size():
    ref = {lv: [probe([1, 2], [-0.1, -0.2])] for lv in ("1", "512", ag.RADIX)}
    steady = {lv: [probe([1, 2], [-0.11, -0.21])] for lv in ref}
    assert ag.gate(steady, ref)["gate"] == "pass"
    grown = {**steady, "512": [probe([1, 2], [-0.3, -0.5])]}
    result = ag.gate(grown, ref)
    assert result["gate"] == "FAIL" and math.isclose(result["floor"], 0.01)
    assert ag.gate({**steady, "512": [probe([1, 2], [-0.1, None])]}, ref)["gate"] == "FAIL"


def test_runs_name_a_base_and_an_environment():
    assert ag.parse_run("snapmla") == ("snapmla", ag.RUNS["snapmla"], {})
    name, flags, env = ag.parse_run("bug=snapmla:PYTHONSAFEPATH=1;PYTHONPATH=/a:/b")
    assert name == "bug" and flags == ag.RUNS["snapmla"] and env == {"PYTHONSAFEPATH": "1", "PYTHONPATH": "/a:/b"}
    assert ag.parse_run("snapmla-triton")[2] == {"SNAPMLA_DECODE_IMPL": "triton"}
