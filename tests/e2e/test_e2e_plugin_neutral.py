"""With our DSPARK plugin installed, plain, NGRAM and EAGLE servers behave exactly as without it.

"Without it" = SGLANG_PLUGINS=dspark_cpu_platform: the CPU platform (which every CPU server needs) is loaded, our
DSPARK plugin (worker REPLACE, CPU fallbacks, patches) is not. Greedy ids must be identical. (Sampled NGRAM and
EAGLE differ on purpose: without our plugin SGLang verifies them by argmax on the CPU, with it they sample exactly,
``patches/cpu_tree_sampling.py``: here a batch mixing greedy, temperature, top-k / top-p and min_p requests must
complete at full length; ``test_e2e_sampled_exactness.py`` checks NGRAM's law.)
"""

from __future__ import annotations

import concurrent.futures

import pytest

from sglang_dspark.testing.helpers import PROMPTS, greedy_ids

pytestmark = pytest.mark.server

WITHOUT_DSPARK_PLUGIN = {"SGLANG_PLUGINS": "dspark_cpu_platform"}
MIX_TOKENS = 24
SAMPLED_MIX = [{"max_new_tokens": MIX_TOKENS, "ignore_eos": True, **extra} for extra in (
    {"temperature": 0}, {"temperature": 0.7}, {"temperature": 1.0, "top_k": 8, "top_p": 0.8},
    {"temperature": 1.0, "min_p": 0.1}, {"temperature": 0.7, "top_p": 0.9}, {"temperature": 1.2, "top_k": 3})]


def algorithm_args(name, eagle_dir):
    if name == "plain":
        return []
    if name == "NGRAM":
        return ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "4"]
    if name == "EAGLE":
        return [
            "--speculative-algorithm", "EAGLE",
            "--speculative-draft-model-path", str(eagle_dir),
            "--speculative-num-steps", "3",
            "--speculative-eagle-topk", "2",
            "--speculative-num-draft-tokens", "6",
        ]
    raise ValueError(name)


def test_plugin_filter_leaves_only_the_cpu_platform():
    """SGLANG_PLUGINS=dspark_cpu_platform really keeps our DSPARK plugin out (SGLang logs nothing about it)."""
    import os
    import subprocess
    import sys

    probe = (
        "from sglang.srt.plugins import load_plugins; load_plugins(); "
        "import sys; print('dspark-plugin-loaded', 'sglang_dspark.plugin' in sys.modules)"
    )
    for env, expected in ((WITHOUT_DSPARK_PLUGIN, "False"), ({}, "True")):
        out = subprocess.run(
            [sys.executable, "-c", probe], env={**os.environ, **env}, capture_output=True, text=True, timeout=300
        )
        assert f"dspark-plugin-loaded {expected}" in out.stdout, out.stderr[-2000:]


@pytest.mark.parametrize("algorithm", ["plain", "NGRAM", "EAGLE"])
def test_plugin_does_not_change_other_algorithms(algorithm, tiny_pair, tiny_eagle, launch, nospec_reference):
    args = algorithm_args(algorithm, tiny_eagle)
    outputs = {}
    for label, env in (("with", None), ("without", WITHOUT_DSPARK_PLUGIN)):
        if algorithm == "plain" and label == "with":
            outputs[label] = nospec_reference["bs1"]  # the session's no-spec server already has the plugin
            continue
        with launch(tiny_pair.target_dir, args, env=env) as server:  # private: no other test uses these launches
            outputs[label] = greedy_ids(server)
            if label == "with" and algorithm != "plain":
                # Sampled verify goes through our CPU tree sampler: a mixed batch (greedy, temperature, top-k +
                # top-p, min_p rows at once) completes every request at its full length.
                with concurrent.futures.ThreadPoolExecutor(len(SAMPLED_MIX)) as pool:
                    sampled = list(pool.map(lambda pair: server.generate(*pair), zip(PROMPTS, SAMPLED_MIX)))
                assert [len(r["output_ids"]) for r in sampled] == [MIX_TOKENS] * len(SAMPLED_MIX)
    assert outputs["with"] == outputs["without"]
    # Speculation is lossless on these algorithms too, so both equal the plain reference.
    assert outputs["with"] == nospec_reference["bs1"]
