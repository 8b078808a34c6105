"""A DSPARK decode batch with a lookup match runs after the previous result is processed (patches/lookup_current_tokens)."""

from types import SimpleNamespace

from sglang_dspark.engine.lookup_source import LookupSource
from sglang_dspark.lookup.active import set_active_lookup
from sglang_dspark.patches.lookup_current_tokens import disable_overlap_for_lookup
from sglang_dspark.patches.lookup_current_tokens import LAUNCH_ATTRIBUTE, BatchLaunch


def _batch(reqs, dspark=True, decode=True, grammar=False):
    return SimpleNamespace(reqs=reqs, spec_algorithm=SimpleNamespace(is_dspark=lambda: dspark),
                           forward_mode=SimpleNamespace(is_decode=lambda: decode), has_grammar=grammar)


def _req(rid, prompt, output):
    return SimpleNamespace(rid=rid, origin_input_ids=prompt, output_ids=output)


MATCH, NO_MATCH = _req("a", [1, 2, 3, 1, 2], [3]), _req("b", [4, 5, 6], [7])


def _ask(batch, queued=1, upstream=False):
    scheduler = SimpleNamespace(result_queue=[object()] * queued)
    return disable_overlap_for_lookup(lambda self, batch, *a, **k: upstream, scheduler, batch, None)


def test_only_a_dspark_decode_batch_with_a_match_and_a_queued_result_waits():
    set_active_lookup(LookupSource(4))
    try:
        assert _ask(_batch([NO_MATCH, MATCH]))
        assert not _ask(_batch([NO_MATCH]))
        assert not _ask(_batch([MATCH]), queued=0)  # nothing to process: SGLang's loop would pop an empty queue
        assert not _ask(_batch([MATCH], dspark=False)) and not _ask(_batch([MATCH], decode=False))
        assert _ask(_batch([NO_MATCH]), upstream=True)  # upstream's own reasons stand
    finally:
        set_active_lookup(None)
    assert not _ask(_batch([MATCH]))  # lookup off in this process


def test_every_dspark_decode_batch_leaves_with_how_it_was_launched():
    """What the worker's lookup reads instead of a device length: current tokens exactly when the loop processes the
    queued result before the launch (the answer is True) or nothing was queued; ``overlap_given_up`` only for the
    lookup's own wait (upstream's reasons are not charged to it)."""
    set_active_lookup(LookupSource(4))
    try:
        cases = [(_batch([NO_MATCH, MATCH]), 1, False, BatchLaunch(True, True)),
                 (_batch([NO_MATCH]), 1, False, BatchLaunch(False, False)),
                 (_batch([MATCH]), 0, False, BatchLaunch(True, False)),
                 (_batch([MATCH]), 1, True, BatchLaunch(True, False)),
                 (_batch([MATCH], grammar=True), 1, False, BatchLaunch(False, False))]
        for batch, queued, upstream, launch in cases:
            waits = _ask(batch, queued=queued, upstream=upstream)
            assert getattr(batch, LAUNCH_ATTRIBUTE) == launch and waits == (launch.overlap_given_up or upstream)
        prefill = _batch([MATCH], decode=False)
        _ask(prefill)
        assert not hasattr(prefill, LAUNCH_ATTRIBUTE)
    finally:
        set_active_lookup(None)
