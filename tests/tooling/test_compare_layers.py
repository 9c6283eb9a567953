"""The layer-by-layer comparison of tools/compare_layers.py on fabricated tensor dumps (no server)."""

from pathlib import Path

import torch

from tools import compare_layers as cl


def _pass(ids, pos, layers):
    d = {"model.forward_batch_info.input_ids": torch.tensor(ids),
         "model.forward_batch_info.positions": torch.tensor(pos)}
    d.update({f"model.layers.{i}.self_attn.attn_mqa": t for i, t in enumerate(layers)})
    d["model.layers.0.mlp.down_proj"] = torch.zeros(3)  # other modules are ignored
    return d


def _dump(root: Path, passes):
    rank = root / "TP0_PP0_Rank0_pid1"
    rank.mkdir(parents=True)
    for i, p in enumerate(passes):
        torch.save(p, rank / f"Pass{i:05d}.pt")


def test_only_passes_with_identical_inputs_are_compared_and_bounds_apply(tmp_path, gen):
    ref_layers = [torch.randn(4, 1024, generator=gen) for _ in range(2)]
    close = [t + 0.01 * torch.randn(t.shape, generator=gen) for t in ref_layers]  # rel-L2 ~1e-2
    far = [t + 0.2 * torch.randn(t.shape, generator=gen) for t in ref_layers]     # rel-L2 ~2e-1
    _dump(tmp_path / "ref", [_pass([1, 2], [5, 9], ref_layers), _pass([3, 4], [6, 10], ref_layers)])
    # an extra pass (e.g. a health check) first; the second decode step took other tokens: not comparable
    _dump(tmp_path / "ours", [_pass([7], [0], far), _pass([1, 2], [5, 9], close), _pass([3, 5], [6, 10], far)])
    per_layer = cl.compare(cl.load_passes(tmp_path / "ours"), cl.load_passes(tmp_path / "ref"))
    assert sorted(per_layer) == [0, 1] and all(len(v) == 1 for v in per_layer.values())
    assert all(0.005 < v[0]["rel_l2"] < 0.02 for v in per_layer.values())
    text, ok = cl.summary_table(per_layer)
    assert ok and text.count("| yes |") == 2
    bad = cl.compare([_pass([1, 2], [5, 9], far)], cl.load_passes(tmp_path / "ref"))
    assert cl.summary_table(bad)[1] is False
    assert cl.summary_table({})[1] is False  # nothing compared is not a pass
