"""docs/DEPLOY.md "Models": each model's KV bytes per token and tokens per GiB are its attention layers times the
cache layouts' bytes per token and layer (snapmla's from sglang_snapmla.layout; SGLang's BF16 and FP8 caches: 1 152
and 576 B), at the precision the table prints (KB = 1 000 B)."""

import re
from pathlib import Path

from helpers import doc_sections, doc_tables, shows
from sglang_snapmla.layout import BF16_BYTES_PER_TOKEN, BYTES_PER_TOKEN

ROOT = Path(__file__).resolve().parents[2]
SGLANG_FP8_BYTES_PER_TOKEN = 576  # all 576 dims cast to e4m3, one per-tensor scale


def test_the_models_table_is_the_layout_times_the_layers():
    table = doc_tables(doc_sections((ROOT / "docs" / "DEPLOY.md").read_text())["Models"])[0]
    assert len(table) >= 5
    for row in table:
        layers = int(re.match(r"\d+", row["attention layers, heads"]).group())
        per_token = [layers * b for b in (BYTES_PER_TOKEN, BF16_BYTES_PER_TOKEN, SGLANG_FP8_BYTES_PER_TOKEN)]
        assert shows(row["KV per token: snapmla / BF16 / FP8"], [b / 1000 for b in per_token]), row
        assert shows(row["tokens per GiB: snapmla / BF16 / FP8"], [2**30 / b for b in per_token]), row
