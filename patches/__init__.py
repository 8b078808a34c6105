"""sglang_dspark.patches (installed from the repository's top-level `patches/` folder)."""

if __name__ == "patches":
    # The repository root is on sys.path (e.g. `python -m` run from a checkout) and something imported the
    # top-level name `patches`, which belongs to other distributions. Refuse, so that a `try: import patches` elsewhere
    # sees a missing module instead of ours.
    raise ImportError("'patches' here is sglang_dspark.patches, not a top-level package; import sglang_dspark.patches instead.")
