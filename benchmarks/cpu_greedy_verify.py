"""Whether a speculative server samples at T > 0 on this machine, or commits the argmax after its first token.

    .venv/bin/python benchmarks/cpu_greedy_verify.py                       # three servers, 6 prompts, ~3 min

SGLang 0.5.23 verifies NGRAM's (and, by reading, EAGLE's) tokens through ``eagle_utils.eagle_sample``, which on a CPU
takes the greedy path at every temperature (``_verify_uses_greedy``: ``is_cpu``); with our plugin installed they
sample (``patches/cpu_tree_sampling.py``). If a server verifies by argmax, a T = 0.7 answer is its first token
(sampled at prefill) followed by greedy decoding: the check asks each server for a T = 0.7 answer, then for the
greedy continuation of the prompt plus that answer's first token, and counts the prompts where the two agree. A
server that samples agrees on (almost) none; one that verifies by argmax agrees on all. Servers: no-spec, NGRAM
with our plugin, and NGRAM without it (``SGLANG_PLUGINS=dspark_cpu_platform``: the CPU platform only).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from sglang_dspark.local_server import start_server

PROMPTS = ["Write a short story about a robot who learns to paint.", "Explain why the sky is blue to a child.",
           "List three ideas for a birthday party and describe each.", "Describe a walk through a forest in autumn.",
           "What makes a good cup of tea? Give advice.", "Summarise the plot of a detective novel you invent."]
NGRAM = ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "8"]
# name: (server arguments, environment)
SERVERS = {"no-spec": ([], {}), "NGRAM": (NGRAM, {}),
           "NGRAM without our plugin": (NGRAM, {"SGLANG_PLUGINS": "dspark_cpu_platform"})}


def greedy_after_first_token(server, tokenizer, temperature: float, max_tokens: int) -> int:
    """Prompts whose answer at ``temperature`` equals, after its first token, the greedy continuation."""
    agree = 0
    for prompt in PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        sampled = server.generate(input_ids=ids, sampling_params={
            "temperature": temperature, "max_new_tokens": max_tokens, "ignore_eos": True})["output_ids"]
        greedy = server.generate(input_ids=ids + list(sampled[:1]), sampling_params={
            "temperature": 0.0, "max_new_tokens": max_tokens - 1, "ignore_eos": True})["output_ids"]
        agree += list(sampled[1:]) == list(greedy)
    return agree


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--max-tokens", type=int, default=40)
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    from sglang_dspark.embedded.defaults import ensure_default_pair

    target, _ = ensure_default_pair()
    tokenizer = AutoTokenizer.from_pretrained(target)
    for name, (server_args, env) in SERVERS.items():
        with start_server(target, ["--dtype", "float32"] + server_args, env=env, max_total_tokens=8192,
                          log_dir=Path(tempfile.mkdtemp(prefix="sglang-dspark-greedy-verify-")), timeout=600) as server:
            agree = greedy_after_first_token(server, tokenizer, args.temperature, args.max_tokens)
        print(f"{name}: T = {args.temperature:g} answers greedy after their first token: {agree}/{len(PROMPTS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
