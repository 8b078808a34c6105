"""sglang_dspark.patches (installed from the repository's top-level `patches/` folder)."""

if __name__ == "patches":
    # Imported as the top-level name `patches` because a checkout's root is on sys.path (`python -m` run from it).
    # That name can belong to another distribution (`kernels` is one SGLang and transformers probe for), so
    # look like an unusable, version-0 install: version checks reject it and `from patches import x` fails with
    # ImportError, which is what their "is it installed?" code expects.
    __version__ = "0.0.0"

    def __getattr__(name):
        raise AttributeError(f"'patches' on sys.path here is the folder of sglang_dspark.patches; it has no {name!r}")
