"""Minimal client for a server started with `--attention-backend snapmla` (standard SGLang/OpenAI endpoints).

    python examples/client.py --port 30000 --prompt "def quicksort(xs):"
"""

import argparse
import json
import urllib.request


def post(port: int, path: str, payload: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--prompt", default="def quicksort(xs):")
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    chat = post(args.port, "/v1/chat/completions", {"model": "default", "max_tokens": args.max_tokens,
                                                    "messages": [{"role": "user", "content": args.prompt}]})
    print("chat:", chat["choices"][0]["message"]["content"])
    gen = post(args.port, "/generate", {"text": args.prompt, "sampling_params": {"max_new_tokens": args.max_tokens}})
    print("generate:", gen["text"])


if __name__ == "__main__":
    main()
