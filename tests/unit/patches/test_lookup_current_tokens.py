"""A DSPARK decode batch with a lookup match runs after the previous result is processed (patches/lookup_current_tokens)."""

from types import SimpleNamespace

from sglang_dspark.engine.lookup_source import NULL_LOOKUP, LookupSource
from sglang_dspark.patches.lookup_current_tokens import disable_overlap_for_lookup
from sglang_dspark.patches.lookup_current_tokens import LAUNCH_ATTRIBUTE, BatchLaunch


def _batch(reqs, dspark=True, decode=True, grammar=False):
    return SimpleNamespace(reqs=reqs, spec_algorithm=SimpleNamespace(is_dspark=lambda: dspark),
                           forward_mode=SimpleNamespace(is_decode=lambda: decode), has_grammar=grammar)


def _req(rid, prompt, output):
    return SimpleNamespace(rid=rid, origin_input_ids=prompt, output_ids=output)


MATCH, NO_MATCH = _req("a", [1, 2, 3, 1, 2], [3]), _req("b", [4, 5, 6], [7])


def _ask(batch, queued=1, upstream=False, lookup=None):
    """The hook on a scheduler whose draft worker is ours (``lookup_source``: its planner's lookup; None: a draft
    worker without one, as upstream's)."""
    worker = SimpleNamespace() if lookup is None else SimpleNamespace(lookup_source=lookup)
    scheduler = SimpleNamespace(result_queue=[object()] * queued, draft_worker=worker)
    return disable_overlap_for_lookup(lambda self, batch, *a, **k: upstream, scheduler, batch, None)


def test_only_a_dspark_decode_batch_with_a_match_and_a_queued_result_waits():
    on = LookupSource(4)
    assert _ask(_batch([NO_MATCH, MATCH]), lookup=on)
    assert not _ask(_batch([NO_MATCH]), lookup=on)
    assert not _ask(_batch([MATCH]), queued=0, lookup=on)  # nothing to process: SGLang's loop would pop an empty queue
    assert not _ask(_batch([MATCH], dspark=False), lookup=on) and not _ask(_batch([MATCH], decode=False), lookup=on)
    assert _ask(_batch([NO_MATCH]), upstream=True, lookup=on)  # upstream's own reasons stand
    assert not _ask(_batch([MATCH]), lookup=NULL_LOOKUP)  # lookup off on this server
    assert not _ask(_batch([MATCH]))  # a draft worker without a lookup (upstream's)
    batch = _batch([MATCH])
    assert not disable_overlap_for_lookup(lambda *a, **k: False, SimpleNamespace(result_queue=[1]), batch, None)
    assert not hasattr(batch, LAUNCH_ATTRIBUTE)  # no draft worker at all


def test_every_dspark_decode_batch_leaves_with_how_it_was_launched():
    """What the worker's lookup reads instead of a device length: current tokens exactly when the loop processes the
    queued result before the launch (the answer is True) or nothing was queued; ``overlap_given_up`` only for the
    lookup's own wait (upstream's reasons are not charged to it)."""
    on = LookupSource(4)
    cases = [(_batch([NO_MATCH, MATCH]), 1, False, BatchLaunch(True, True)),
             (_batch([NO_MATCH]), 1, False, BatchLaunch(False, False)),
             (_batch([MATCH]), 0, False, BatchLaunch(True, False)),
             (_batch([MATCH]), 1, True, BatchLaunch(True, False)),
             (_batch([MATCH], grammar=True), 1, False, BatchLaunch(False, False))]
    for batch, queued, upstream, launch in cases:
        waits = _ask(batch, queued=queued, upstream=upstream, lookup=on)
        assert getattr(batch, LAUNCH_ATTRIBUTE) == launch and waits == (launch.overlap_given_up or upstream)
    prefill = _batch([MATCH], decode=False)
    _ask(prefill, lookup=on)
    assert not hasattr(prefill, LAUNCH_ATTRIBUTE)
