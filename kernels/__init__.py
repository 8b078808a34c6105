"""sglang_dspark.kernels (installed from the repository's top-level `kernels/` folder): every kernel of ours, each torch reference beside its Triton version."""

if __name__ == "kernels":  # imported under the bare name from a checkout's root: see sglang_dspark/name_guard.py
    from sglang_dspark.name_guard import pose_as_unusable_install

    pose_as_unusable_install(globals())
