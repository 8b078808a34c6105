"""With our DSPARK plugin installed, plain, NGRAM and EAGLE servers behave exactly as without it.

"Without it" = SGLANG_PLUGINS=dspark_cpu_platform: the CPU platform (which every CPU server needs) is loaded, our
DSPARK plugin (worker REPLACE, CPU fallbacks, patches) is not. Greedy ids must be identical.
"""

from __future__ import annotations

import pytest

from sglang_dspark.testing.helpers import greedy_ids

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
    assert outputs["with"] == outputs["without"]
    # Speculation is lossless on these algorithms too, so both equal the plain reference.
    assert outputs["with"] == nospec_reference["bs1"]
