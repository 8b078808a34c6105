"""sglang_dspark.profiler (installed from the repository's top-level `profiler/` folder): the step-cost model: SPS table, probe plan, cache, upstream JSON, learned overhead, engine measurer, CLI."""

if __name__ == "profiler":  # imported under the bare name from a checkout's root: see sglang_dspark/name_guard.py
    from sglang_dspark.name_guard import pose_as_unusable_install

    pose_as_unusable_install(globals())
