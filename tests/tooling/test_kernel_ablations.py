"""tools/kernel_dev/ablations.py: every ablation still finds its source text in today's kernel (it would otherwise
time the unchanged kernel under an ablation's name), and the copies it writes differ from the kernel only there."""

import pytest

from sglang_snapmla.cuda_ext import SOURCE_DIR
from tools.kernel_dev import ablations


@pytest.mark.parametrize("name", [*ablations.ABLATIONS, "nopv_notr", "nosfu_notr"])
def test_each_ablation_applies_to_the_kernel(tmp_path, name):
    source = (SOURCE_DIR / ablations.KERNEL).read_text()
    dest = ablations.write(SOURCE_DIR, tmp_path, name)
    ablated = (dest / ablations.KERNEL).read_text()
    removed = [text for part in name.split("_") for text, _ in ablations.ABLATIONS[part]]
    for text in removed:
        assert text in source and text not in ablated
    # only those places changed: putting the removed text back gives the kernel again
    restored = ablated
    for part in name.split("_"):
        for text, replacement in ablations.ABLATIONS[part]:
            restored = restored.replace(replacement, text, 1)
    assert restored == source
    others = sorted(p.name for p in dest.iterdir())
    assert others == sorted(p.name for p in SOURCE_DIR.iterdir() if p.is_file())


def test_stale_or_unknown_ablation_is_refused():
    with pytest.raises(SystemExit, match="unknown ablation 'nothing'"):
        ablations.ablate("", "nothing")
    with pytest.raises(SystemExit, match="'notr': its source text occurs 0 times"):
        ablations.ablate("a kernel without the transpose call", "notr")
