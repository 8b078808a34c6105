"""With our DSPARK plugin installed, plain, NGRAM and EAGLE servers behave exactly as without it.

"Without it" = SGLANG_PLUGINS=dspark_cpu_platform: the CPU platform (which every CPU server needs) is loaded, our
DSPARK plugin (worker REPLACE, CPU fallbacks, patches) is not. Greedy ids must be identical.
"""

from __future__ import annotations

import pytest

from conftest import greedy_ids

pytestmark = pytest.mark.server

WITHOUT_DSPARK_PLUGIN = {"SGLANG_PLUGINS": "dspark_cpu_platform"}


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


@pytest.mark.parametrize("algorithm", ["plain", "NGRAM", "EAGLE"])
def test_plugin_does_not_change_other_algorithms(algorithm, tiny_pair, tiny_eagle, launch, nospec_reference):
    args = algorithm_args(algorithm, tiny_eagle)
    outputs = {}
    for label, env in (("with", None), ("without", WITHOUT_DSPARK_PLUGIN)):
        if algorithm == "plain" and label == "with":
            outputs[label] = nospec_reference["bs1"]  # the session's no-spec server already has the plugin
            continue
        with launch(tiny_pair.target_dir, args, env=env) as server:
            outputs[label] = greedy_ids(server)
            log = server.log_text()
        if label == "without":
            assert "Loaded plugin dspark " not in log and "Skipping plugin dspark " in log
    assert outputs["with"] == outputs["without"]
    # Speculation is lossless on these algorithms too, so both equal the plain reference.
    assert outputs["with"] == nospec_reference["bs1"]
