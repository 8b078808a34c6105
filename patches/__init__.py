"""sglang_dspark.patches (installed from the repository's top-level `patches/` folder): every change to SGLang's behaviour that is not a hook on our own classes."""

if __name__ == "patches":  # imported under the bare name from a checkout's root: see sglang_dspark/name_guard.py
    from sglang_dspark.name_guard import pose_as_unusable_install

    pose_as_unusable_install(globals())
