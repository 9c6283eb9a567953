"""Talk to a server started with `--attention-backend snapmla` through its OpenAI-compatible API (the `openai`
package, which SGLang installs): one chat completion, then the same question streamed token by token.

    python examples/client.py --base-url http://127.0.0.1:30000/v1 --prompt "Write a haiku about caches."
"""

from __future__ import annotations

import argparse

from openai import APIConnectionError, OpenAI


def chat(client: OpenAI, prompt: str, max_tokens: int) -> str:
    response = client.chat.completions.create(model="default", max_tokens=max_tokens, temperature=0,
                                              messages=[{"role": "user", "content": prompt}])
    return response.choices[0].message.content


def stream_chat(client: OpenAI, prompt: str, max_tokens: int):
    """Yields the answer's text pieces as the server sends them."""
    stream = client.chat.completions.create(model="default", max_tokens=max_tokens, temperature=0, stream=True,
                                            messages=[{"role": "user", "content": prompt}])
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            yield chunk.choices[0].delta.content


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:30000/v1")
    ap.add_argument("--prompt", default="Write a haiku about caches.")
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args(argv)
    # SGLang needs no key unless started with --api-key; one try, so that a missing server is reported at once
    client = OpenAI(base_url=args.base_url, api_key="EMPTY", max_retries=0)
    try:
        answer = chat(client, args.prompt, args.max_tokens)
    except APIConnectionError:
        raise SystemExit(f"no server answers at {args.base_url}: start one first (README, Use), or pass --base-url")
    print("chat:", answer)
    print("stream:", end=" ", flush=True)
    for piece in stream_chat(client, args.prompt, args.max_tokens):
        print(piece, end="", flush=True)
    print()


if __name__ == "__main__":
    main()
