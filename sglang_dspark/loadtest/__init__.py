"""Load test SGLang servers the way SGLang users do: ``python -m sglang_dspark.loadtest`` (``sglang-dspark loadtest``).

* ``engine``: the request engine and per-level metrics, on SGLang's own ``sglang.benchmark.serving`` (streaming
  OpenAI chat client, arrivals, metric maths); shared with ``benchmarks/serve_side_by_side.py``.
* ``prompts``: the built-in chat set, JSONL and ShareGPT files, split so no prompt repeats across levels.
* ``report``: JSON, the frontier PNG, the Markdown table.
* ``runner``: configurations, launching servers one after another, URL checks, the command line.
"""

from sglang_dspark.loadtest.runner import main

__all__ = ["main"]
