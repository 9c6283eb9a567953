"""SnapMLA's cache layout: the sizes every module shares (DeepSeek-V2/V3/R1 and LongCat-Flash MLA).

Per token and layer: FP8 e4m3 content [512] + one fp32 scale + BF16 RoPE [64] = 644 bytes (BF16 MLA: 1152), in pages
of 64 tokens. What the numbers mean: `numerics` (the spec) and docs/DESIGN.md.
"""

import torch

KV_LORA_RANK = 512  # the latent c_KV (content): K's first 512 dims and all of V
ROPE_DIM = 64  # the decoupled RoPE key
PAGE_SIZE = 64  # tokens per page (one decode block)
FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite e4m3fn value
BYTES_PER_TOKEN = KV_LORA_RANK * 1 + 4 + ROPE_DIM * 2  # 644
BF16_BYTES_PER_TOKEN = (KV_LORA_RANK + ROPE_DIM) * 2  # 1152
