"""benchmarks/cpu_greedy_verify.py: a T > 0 answer that continues greedily after its first token is counted."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "cpu_greedy_verify.py"
spec = importlib.util.spec_from_file_location("cpu_greedy_verify", SCRIPT)
cpu_greedy_verify = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = cpu_greedy_verify
spec.loader.exec_module(cpu_greedy_verify)


class Tokenizer:
    def __call__(self, text):
        return {"input_ids": [len(text) % 50, 7]}


class Server:
    """Greedy text is the prompt's last id + 1, + 2, ...; a sampling server's answers start the same but go elsewhere."""

    def __init__(self, samples: bool) -> None:
        self.samples = samples

    def generate(self, input_ids, sampling_params):
        count = sampling_params["max_new_tokens"]
        if sampling_params["temperature"] > 0:
            first = 1000 + input_ids[0]  # a sampled first token, off the greedy path
            return {"output_ids": [first] + [(-first - i if self.samples else first + i) for i in range(1, count)]}
        return {"output_ids": [input_ids[-1] + i for i in range(1, count + 1)]}


def test_counts_the_prompts_whose_sampled_answer_goes_on_greedily():
    prompts = len(cpu_greedy_verify.PROMPTS)
    assert cpu_greedy_verify.greedy_after_first_token(Server(samples=False), Tokenizer(), 0.7, 12) == prompts
    assert cpu_greedy_verify.greedy_after_first_token(Server(samples=True), Tokenizer(), 0.7, 12) == 0
