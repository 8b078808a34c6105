"""Load test SGLang servers the way SGLang users do: ``python -m sglang_dspark.loadtest`` (``sglang-dspark loadtest``).

* ``engine``: the request engine and per-level metrics, on SGLang's own ``sglang.benchmark.serving`` (streaming
  OpenAI chat client, arrivals, metric maths); shared with ``benchmarks/serve_side_by_side.py``.
* ``prompts``: the built-in chat set, JSONL and ShareGPT files, split so no prompt repeats across levels;
  ``grounded_prompts`` and ``code_edit_prompts``: the built-in sets whose answers copy a passage of the prompt.
* ``slo``: the capacity maths, pure: SLOs, goodput and attainment, the bootstrap interval of a ratio over rounds,
  the max-load search's decisions.
* ``report``: JSON, the frontier and goodput PNGs, the Markdown tables (ratios with intervals, goodput, users per
  server).
* ``runner``: configurations, launching servers one after another, URL checks, the command line.
"""

from sglang_dspark.loadtest.runner import main

__all__ = ["main"]
