"""Train the project's small byte-level BPE tokenizer (vocab 32000) on text available offline.

    python -m tools.train_tokenizer --out configs/tokenizer

Corpus: the running Python's standard-library sources (deterministic file order). Writes tokenizer.json and
tokenizer_config.json (with a simple chat template) that Hugging Face's AutoTokenizer and SGLang load.
"""

import argparse
import json
import sys
import sysconfig
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|user|>", "<|assistant|>", "<|system|>", "<|pad|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def corpus_files(limit_mb: int):
    root = Path(sysconfig.get_paths()["stdlib"])
    total = 0
    for p in sorted(root.rglob("*.py")):
        if "site-packages" in p.parts or "test" in p.parts:
            continue
        size = p.stat().st_size
        if total + size > limit_mb << 20:
            break
        total += size
        yield str(p)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("configs/tokenizer"))
    ap.add_argument("--vocab-size", type=int, default=32000)
    ap.add_argument("--corpus-mb", type=int, default=24)
    args = ap.parse_args()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=args.vocab_size, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    files = list(corpus_files(args.corpus_mb))
    tok.train(files, trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    args.out.mkdir(parents=True, exist_ok=True)
    tok.save(str(args.out / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": SPECIAL[0], "eos_token": SPECIAL[1],
           "pad_token": SPECIAL[5], "model_max_length": 163840, "chat_template": CHAT_TEMPLATE,
           "add_bos_token": False, "clean_up_tokenization_spaces": False}
    (args.out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1))
    print(f"trained on {len(files)} files from Python {sys.version.split()[0]}; vocab {tok.get_vocab_size()}; "
          f"wrote {args.out}")


if __name__ == "__main__":
    main()
