"""The ``_handle_dspark`` argument-resolution hook (launcher process), one wrapper for four jobs.

1. On the CPU platform, let upstream's DSPARK resolution run on device "cpu" (sglang_dspark/patches/cpu_dspark.py).
2. Serve the embedded SmolLM2 target with the draft we ship for it when no draft path is given (upstream would
   refuse: the target folder bundles no draft).
3. Use the STS calibration shipped beside the draft (``dspark_sts.json``) when none is given: upstream leaves the
   confidence uncalibrated unless ``--speculative-dspark-confidence-sts-path`` is passed, and nothing should need
   tuning by hand. An explicit path always wins.
4. With our worker, pick the verify mode (``engine/verify_mode.py``): compact only where the attention backend runs
   ragged verify correctly in the mode in use (CUDA graphs or eager; on triton / flashinfer graphs after our
   patch's on-device self-check, ``engine/self_check/ragged_self_check.py``) and the draft's config says it has a confidence
   head, wherever the draft comes from (``engine/draft_head.py``), static otherwise, with one log line saying
   why. SGLang builds the draft (and its confidence head) from ``SGLANG_RAGGED_VERIFY_MODE`` in the scheduler
   process, which inherits the launcher's environment; the choice is made here, before upstream's own resolution
   (so its "requires static" checks see it) and before any scheduler is spawned.
5. With ``--dtype auto`` (SGLang's default), load the draft in the dtype SGLang picks for the target. SGLang resolves
   "auto" for each model from its own config, so a float32 target (auto: float16) with a bfloat16 draft builds a
   float16 target and a bfloat16 draft, and the first prefill dies in the draft-KV injection (``fc`` of a float16
   hidden state by bfloat16 weights) and takes the server down. Upstream's worker included.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path

from sglang_dspark import envs
from sglang_dspark.engine.verify_mode import (
    STATIC,
    VERIFY_MODE_ENV,
    decide_verify_mode,
    facts_from_server_args,
    needs_ragged_self_check,
)
from sglang_dspark.engine.draft_head import read_draft_confidence_head
from sglang_dspark.scheduling.policy import read_admission_policy

logger = logging.getLogger(__name__)
DSPARK_ARG_HANDLER = "sglang.srt.arg_groups.speculative_hook._handle_dspark"
SHIPPED_STS_NAME = "dspark_sts.json"


def shipped_sts_path(draft_path) -> str | None:
    """``<draft>/dspark_sts.json`` for a local draft folder that ships one."""
    if not draft_path:
        return None
    candidate = Path(str(draft_path)) / SHIPPED_STS_NAME
    return str(candidate) if candidate.is_file() else None


def _default_draft_for_embedded_target(server_args, view) -> None:
    from sglang.srt.arg_groups.overrides import declare_resolution

    from sglang_dspark.embedded.defaults import is_embedded_target, packaged_draft_dir

    if view.speculative_draft_model_path is None and is_embedded_target(view.model_path):
        try:
            draft = packaged_draft_dir()
        except FileNotFoundError:
            return  # upstream's own error then names the missing --speculative-draft-model-path
        logger.info("sglang-dspark: embedded SmolLM2 target, using the shipped draft %s", draft)
        declare_resolution(server_args, "sglang_dspark.engine.arg_resolution", speculative_draft_model_path=str(draft))


def _draft_path_known_before_upstream(view):
    """Explicit draft, or a local ``<target>/dspark/`` folder (upstream's bundled-draft lookup); None: hub/bundled."""
    if view.speculative_draft_model_path:
        return str(view.speculative_draft_model_path)
    model = str(view.model_path or "")
    bundled = os.path.join(model, "dspark")
    return bundled if model and os.path.isfile(os.path.join(bundled, "config.json")) else None


def _with_ragged_self_check(facts):
    """Run (or read the kept verdict of) the on-device check that opens compact verify through our triton /
    flashinfer patches, only where compact hangs on nothing else (engine/self_check/ragged_self_check.py)."""
    from sglang_dspark.engine.self_check import ragged_self_check

    result = ragged_self_check.self_check(facts.attention_backend, ragged_self_check.gpu_identity())
    (logger.info if result.passed else logger.warning)(
        "sglang-dspark: ragged verify self-check (%s%s): %s%s", facts.attention_backend,
        ", kept from an earlier start" if result.cached else f", {result.seconds:.0f} s", result.detail,
        "" if result.passed else f" ({envs.RAGGED_SELF_CHECK.name}=force runs it again)")
    return replace(facts, ragged_self_check=result.passed, ragged_self_check_detail=result.detail)


def _draft_head(view, draft_path):
    return read_draft_confidence_head(draft_path, getattr(view, "speculative_draft_model_revision", None))


def _apply_verify_mode(view, draft_path, policy, user_mode, head=None):
    """Decide compact vs static for this engine (backend, graphs, device, TP/DP/PD, draft) and export it: SGLang
    reads SGLANG_RAGGED_VERIFY_MODE at every call and the scheduler processes inherit the environment, and so does
    the list of ragged-verify patches our plugin installs there.

    ``head`` (engine/draft_head.py) is read from ``draft_path`` when not given; a head that could not be read counts
    as none: compact only for a draft whose config was read and has one (upstream would refuse to start otherwise)."""
    from sglang_dspark.engine.self_check.ragged_self_check import export_patched_backends

    head = head if head is not None else _draft_head(view, draft_path)
    facts = facts_from_server_args(view, head.present is True, policy, user_mode,
                                   confidence_head_detail=head.source)
    if needs_ragged_self_check(facts):
        facts = _with_ragged_self_check(facts)
    decision = decide_verify_mode(facts)
    (logger.warning if decision.downgraded else logger.info)("sglang-dspark: %s", decision.reason)
    os.environ[VERIFY_MODE_ENV] = decision.verify_mode
    os.environ[envs.ADMISSION.name] = decision.admission_policy  # the policy in effect (verify-all when static)
    export_patched_backends([facts.attention_backend] if decision.verify_mode != STATIC and facts.ragged_self_check
                            else [])
    return decision


def _auto_dtype(model_path, view):
    """The dtype SGLang's ``--dtype auto`` gives ``model_path`` (its own rule, from the model's config)."""
    from sglang.srt.configs.model_config import _get_and_verify_dtype
    from sglang.srt.utils.hf_transformers.common import get_hf_text_config
    from sglang.srt.utils.hf_transformers.config import get_config

    config = get_config(str(model_path), trust_remote_code=bool(view.trust_remote_code))
    return _get_and_verify_dtype(get_hf_text_config(config), "auto")


def _draft_dtype_follows_target(server_args, view, draft_path) -> None:
    """Job 5 of the module docstring: make ``--dtype auto`` explicit as the target's dtype when the draft's own
    "auto" would differ (the target's dtype is unchanged; only the draft follows it)."""
    from sglang.srt.arg_groups.overrides import declare_resolution

    if str(view.dtype).lower() != "auto" or not draft_path:
        return
    try:
        target_dtype, draft_dtype = _auto_dtype(view.model_path, view), _auto_dtype(draft_path, view)
    except Exception as exc:  # noqa: BLE001 -- an unreadable config is SGLang's to report, with its own message
        logger.debug("sglang-dspark: dtype check skipped (%s)", exc)
        return
    if target_dtype == draft_dtype:
        return
    name = str(target_dtype).removeprefix("torch.")  # float16 / bfloat16 / float32: --dtype spells them so
    logger.info("sglang-dspark: --dtype auto gives the target %s and the draft %s; the draft runs in %s too "
                "(pass --dtype to choose another)", name, str(draft_dtype).removeprefix("torch."), name)
    declare_resolution(server_args, "sglang_dspark.engine.arg_resolution", dtype=name)


def handle_dspark(original, server_args):
    from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view

    from sglang_dspark.cpu.startup import cpu_platform_active
    from sglang_dspark.engine.worker import use_upstream_worker

    view = resolving_view(server_args)  # a live view: it sees declarations made after this line too
    _default_draft_for_embedded_target(server_args, view)
    ours = not use_upstream_worker()
    decided_before = False
    if ours:
        # Before upstream's resolution, so that its own "requires static" checks see the mode we choose.
        policy = read_admission_policy()
        user_mode = os.environ.get(VERIFY_MODE_ENV, "").strip() or None
        known_draft = _draft_path_known_before_upstream(view)
        head = _draft_head(view, known_draft)
        # Where the draft's config cannot be read yet (a hub id not in the local HF cache, a draft upstream finds in
        # the target checkpoint), the decision waits until after upstream's resolution, which reads that config itself
        # (speculative_hook.py:791-804: get_config downloads it into the HF cache) and declares a bundled draft.
        # Deciding in the scheduler process instead would come too late: the target's CUDA graphs are captured for the
        # verify mode before the draft (and its confidence head) is built. Meanwhile upstream's checks see the user's
        # mode or SGLang's default static, never a compact we may take back.
        if head.known:
            _apply_verify_mode(view, known_draft, policy, user_mode, head)  # raises on an unsafe forced compact
            decided_before = True
    if cpu_platform_active():
        from sglang_dspark.patches.cpu_dspark import handle_dspark_allowing_cpu

        result = handle_dspark_allowing_cpu(original, server_args)
    else:
        result = original(server_args)
    draft_path = view.speculative_draft_model_path
    sts_path = shipped_sts_path(draft_path)
    if view.speculative_dspark_confidence_sts_path is None and sts_path is not None:
        logger.info("sglang-dspark: using the draft's STS calibration %s", sts_path)
        declare_resolution(server_args, "sglang_dspark.engine.arg_resolution",
                           speculative_dspark_confidence_sts_path=sts_path)
    _draft_dtype_follows_target(server_args, view, draft_path)
    if ours and not (decided_before and draft_path == known_draft):
        # The draft upstream resolved (bundled, hub): its config is read now or never, and unread counts as no head,
        # so a draft without a confidence head runs verify-all instead of stopping start-up in upstream's loader.
        _apply_verify_mode(view, draft_path, policy, user_mode)
    return result
