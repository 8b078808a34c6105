"""The SGLang plugin (entry point ``dspark`` in group ``sglang.srt.plugins``): the front door.

SGLang calls ``register()`` in every process it starts (launcher, scheduler, detokenizer) before it builds the
scheduler, so hooks registered here are live where the worker runs. Heavy imports stay inside ``register``; what
the hooks are lives in ``patches/`` (changes to SGLang's behaviour) and ``engine/`` (our worker and planner).
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)
_registered = False


def register() -> None:
    global _registered
    if _registered:
        return
    _registered = True

    from sglang_dspark import envs
    from sglang_dspark.cpu.startup import cpu_platform_active
    from sglang_dspark.version_guard import require_supported_sglang

    require_supported_sglang()
    envs.validate_all()  # a mistyped switch fails here, by name, in every process

    # Input guard (issue #15): refuse requests that would kill the scheduler (HTTP 400 naming the field), on
    # every server this plugin is loaded into, DSPARK or not.
    from sglang_dspark.patches import input_guard

    input_guard.install()

    # Exact penalties in DSPARK's verify (issue #15): upstream ignores frequency/presence/repetition penalties and
    # min_new_tokens on speculative batches; these hooks feed the penalizers and penalise every verify position.
    from sglang_dspark.patches import spec_penalties

    spec_penalties.install()
    # Exact penalties for no-spec under the overlap scheduler (issue #38): upstream counts each decode step's input
    # token one step late there (the first decode counts the last prompt token).
    if envs.OVERLAP_PENALTIES.get() == "exact":
        from sglang_dspark.patches import overlap_penalties

        overlap_penalties.install()

    # Prompt lookup beside the draft (issue #39): a DSPARK batch with a lookup match reads current tokens.
    if envs.LOOKUP.get() != "off":
        from sglang_dspark.patches import lookup_current_tokens

        lookup_current_tokens.install()

    # Every TP rank reads the same confidences from the DSPARK relay on the same steps (issue #46): upstream's
    # rank-local readiness query (CUDA), and its synchronous read of rows never published (the CPU), would let ranks
    # pick different verify budgets, graph tiers and broadcasts.
    from sglang_dspark.patches import tp_relay_readiness

    tp_relay_readiness.install()

    # A speculative request clamped to the KV pool's edge would be aborted (HTTP 500) near its end: keep the room
    # a speculative decode step allocates (issue #15).
    from sglang_dspark.patches import spec_length_headroom

    spec_length_headroom.install()

    # dflash_info's eager FlashInfer packing breaks on a device-only ragged layout (a TypeError, then FlashInfer's
    # q-rows check): fixed everywhere.
    from sglang_dspark.engine.self_check.ragged_self_check import patched_backends
    from sglang_dspark.patches import flashinfer_ragged_verify

    flashinfer_ragged_verify.install_device_only_layout_fix()
    # Ragged verify on SGLang's Triton backend / FlashInfer in CUDA graphs (issue #10): only where the launcher chose
    # compact for that backend after the patch passed its on-device self-check (engine/self_check/ragged_self_check.py).
    ragged_patches = patched_backends()
    if "triton" in ragged_patches:
        from sglang_dspark.patches import triton_ragged_verify

        triton_ragged_verify.apply()
    if "flashinfer" in ragged_patches:
        flashinfer_ragged_verify.apply()
    # The draft's logits over a hot vocabulary when the draft ships one (issue #11, FR-Spec); our worker marks the
    # draft at start-up (engine/worker.py), the hooks do nothing to an unmarked one.
    from sglang_dspark.patches import hot_vocab

    hot_vocab.install()
    if cpu_platform_active():
        from sglang_dspark.patches import cpu_dspark

        cpu_dspark.apply()
        # NGRAM / EAGLE verify by argmax on the CPU at every temperature upstream: make them sample exactly.
        from sglang_dspark.patches import cpu_tree_sampling

        cpu_tree_sampling.apply()
        # Linear layers and the LM head through oneDNN with packed weights, on every server (patches/cpu_packed_linear.py).
        from sglang_dspark.patches import cpu_packed_linear

        cpu_packed_linear.install()

    from sglang_dspark.engine.hooks import register_engine_hooks

    register_engine_hooks()
