"""sglang_dspark.profiler (installed from the repository's top-level `profiler/` folder)."""

if __name__ == "profiler":
    # The repository root is on sys.path (e.g. `python -m` run from a checkout) and something imported the
    # top-level name `profiler`, which belongs to other distributions. Refuse, so that a `try: import profiler` elsewhere
    # sees a missing module instead of ours.
    raise ImportError("'profiler' here is sglang_dspark.profiler, not a top-level package; import sglang_dspark.profiler instead.")
