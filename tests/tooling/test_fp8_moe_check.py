"""tools/fp8_moe_check.py's reference (CPU): the top-1 MoE it compares SGLang's fused MoE against (the weights
dequantized by sglang_snapmla.block_fp8, tested in tests/product/test_dummy_weights.py)."""

import torch
import torch.nn.functional as F

from tools.fp8_moe_check import reference


def test_reference_routes_each_token_to_its_expert():
    g = torch.Generator().manual_seed(1)
    experts, hidden, inter, m = 4, 8, 6, 10
    w13, w2 = torch.randn(experts, 2 * inter, hidden, generator=g), torch.randn(experts, hidden, inter, generator=g)
    x = torch.randn(m, hidden, generator=g).to(torch.bfloat16)
    ids = torch.tensor([3, 0, 0, 2, 1, 3, 3, 2, 0, 1])
    want = torch.stack([(F.silu(x[t].float() @ w13[e, :inter].T) * (x[t].float() @ w13[e, inter:].T)) @ w2[e].T
                        for t, e in enumerate(ids.tolist())])
    torch.testing.assert_close(reference(x, ids, w13, w2), want)
