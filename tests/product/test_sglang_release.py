"""sglang_release, the one place that knows what moved between the supported SGLang releases: each of its adapters
on whichever release is installed (CI runs the suite on both)."""

import pytest

from sglang_snapmla import sglang_release as rel


class _HookType:
    AROUND = "around"


def test_an_around_hook_runs_our_step_and_passes_sglangs_arguments_through():
    """0.5.17: our step wraps the ServerArgs method, whose extra arguments (`_handle_gpu_memory_settings(gpu_mem)`)
    reach SGLang's own step. Releases with named resolution steps get no such hooks."""
    seen = []

    def step(server_args, previous):
        seen.append("ours")
        return previous(server_args)

    hooks = rel.server_args_hooks({"handle_gpu_memory_settings": step}, _HookType)
    if rel.has_resolution_hooks():
        assert hooks == {}
        return
    ((target, (around, kind)),) = hooks.items()
    assert target == "sglang.srt.server_args.ServerArgs._handle_gpu_memory_settings" and kind == "around"
    around(lambda server_args, gpu_mem, **kw: seen.append((server_args, gpu_mem, kw)), "args", 80.0, extra=1)
    assert seen == ["ours", ("args", 80.0, {"extra": 1})]


@pytest.mark.skipif(not rel.has_resolution_hooks(), reason="named resolution steps: SGLang 0.5.20 on")
def test_a_step_the_release_does_not_accept_is_reported_not_dropped():
    errors = rel.register_resolution_steps({"no_such_step": lambda server_args, previous: previous(server_args)})
    assert len(errors) == 1 and f"the resolution step no_such_step cannot be wrapped on SGLang {rel.installed()}" \
        in errors[0], errors


def test_the_planner_reads_the_server_args_it_is_given_else_the_published_ones(monkeypatch):
    """0.5.17 passes `server_args` to the memory planner; later releases publish them for the process, and before
    they are published (SGLang raises ValueError there) there are none."""
    from sglang.srt import runtime_context

    given, published = object(), object()
    monkeypatch.setattr(runtime_context, "get_server_args", lambda: published)
    assert rel.planner_server_args({"server_args": given}) is given
    assert rel.planner_server_args({"server_args": None}) is published

    def not_yet():
        raise ValueError("Global server args is not set yet!")

    monkeypatch.setattr(runtime_context, "get_server_args", not_yet)
    assert rel.planner_server_args({}) is None
