"""The plugin registered for tests of its SGLang integration on every release `sglang_release.ADAPTED` knows.

On an adapted release where snapmla does not serve yet (`sglang_release.SERVES`: 0.5.23), register() records the
release refusal, which stops every snapmla setup at its server-args pass. Tests of the integration points themselves
(server-args steps, sizing, draft factory) drop that one refusal so that they run as they will once the release
serves; every other integration error stays, and the refusal has its own tests (tests/product/test_plugin.py)."""

from __future__ import annotations


def registered_plugin():
    import sglang

    from sglang_snapmla import plugin
    from sglang_snapmla import sglang_release as release

    plugin.register()
    refused = release.refusal(getattr(sglang, "__version__", "?"))
    if getattr(sglang, "__version__", None) in release.ADAPTED and refused in plugin._integration_errors:
        plugin._integration_errors.remove(refused)
    return plugin


def installed_release_serves() -> bool:
    import sglang

    from sglang_snapmla import sglang_release as release

    return getattr(sglang, "__version__", None) in release.SERVES


# The backend's metadata tests (SGLang's capture / replay protocol, SGLang's attention kits) run where snapmla serves:
# on 0.5.23 SGLang's FlashMLA backend builds that metadata through KV location plans, not yet ported
NOT_SERVED_HERE = "snapmla does not serve on this SGLang release yet (sglang_release.SERVES): its backend metadata " \
                  "protocol differs there"
