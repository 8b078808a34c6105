"""sglang_dspark.kernels (installed from the repository's top-level `kernels/` folder)."""

if __name__ == "kernels":
    # The repository root is on sys.path (e.g. `python -m` run from a checkout) and something imported the
    # top-level name `kernels`, which belongs to other distributions. Refuse, so that a `try: import kernels` elsewhere
    # sees a missing module instead of ours.
    raise ImportError("'kernels' here is sglang_dspark.kernels, not a top-level package; import sglang_dspark.kernels instead.")
