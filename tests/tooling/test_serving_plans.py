"""The decode plan a server makes (split count from its static page bound) against the benchmark's (from the block
table's width): every shape reaches a valid plan, a plan made for the static bound reads every page of every sequence
up to the context length, and the report prints and saves what it computed."""

import json
import math
import sys

import pytest
import torch

from sglang_snapmla import decode_plan
from tools.kernel_dev import serving_plans as sp

CONTEXT = 163840  # DeepSeek-V3/R1's context length


def test_static_bound_covers_the_longest_sequence_and_a_draft_window():
    for context in (1, 63, 64, 65, 4096, CONTEXT):
        assert decode_plan.static_max_pages(context) * 64 >= context + 64


@pytest.mark.parametrize("heads", [8, 16, 64, 128])
@pytest.mark.parametrize("batch", [1, 3, 8, 33, 64, 128, 256, 512])
def test_static_bound_plans_read_every_page_of_every_length(heads, batch):
    """The split count planned for the static bound, applied to sequences of any admitted length, gives each page to
    exactly one split (the kernel's split_pages): lengths from one token to the context length."""
    splits = decode_plan.cuda_num_splits(batch, heads, decode_plan.static_max_pages(CONTEXT), torch.device("cpu"),
                                         sms=132)
    assert 1 <= splits <= decode_plan.MAX_SPLITS
    for seq_len in (1, 63, 64, 65, 640, 2049, 65536, CONTEXT):
        per = sp.pages_per_split(seq_len, splits)
        assert len(per) == splits and sum(per) == math.ceil(seq_len / 64), (seq_len, per)
        assert per == sorted(per, reverse=True) and per[0] == math.ceil(math.ceil(seq_len / 64) / splits)


def test_short_sequences_under_the_static_bound_leave_splits_without_pages():
    """At batch 1 a server plans many splits for its 2 561-page bound; a 640-token sequence (10 pages) gives pages to
    10 of them, one each, where the benchmark's own plan has 10 splits."""
    row = sp.compare([128], [1], [640], CONTEXT, 132)[0]
    assert row["bench"]["splits"] == 10 and row["bench"]["splits_with_pages"] == 10
    assert row["serving"]["splits"] > 10 and row["serving"]["splits_with_pages"] == 10
    assert row["serving"]["pages_per_cta"] == 1


def test_report_prints_and_saves_the_rows(tmp_path, monkeypatch, capsys):
    out = tmp_path / "plans.json"
    monkeypatch.setattr(sys, "argv", ["sp", "--heads", "128", "--batches", "1", "128", "--s-k", "640",
                                      "--out", str(out)])
    sp.main()
    text = capsys.readouterr().out
    assert "2561 pages" in text and "| 128 | 1 | 640 | 10 / " in text and "| 128 | 128 | 640 | 1 / 1 |" in text
    saved = json.loads(out.read_text())
    assert saved["context_len"] == CONTEXT and [r["batch"] for r in saved["rows"]] == [1, 128]


def test_a_length_above_the_context_is_refused():
    with pytest.raises(SystemExit, match="exceeds --context-len"):
        sp.compare([128], [1], [CONTEXT + 1], CONTEXT, 132)
