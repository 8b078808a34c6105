"""A DSPARK decode batch with a lookup match runs after the previous result is processed (patches/lookup_current_tokens)."""

from types import SimpleNamespace

from sglang_dspark.engine.lookup_source import LookupSource
from sglang_dspark.lookup.active import set_active_lookup
from sglang_dspark.patches.lookup_current_tokens import disable_overlap_for_lookup


def _batch(reqs, dspark=True, decode=True):
    return SimpleNamespace(reqs=reqs, spec_algorithm=SimpleNamespace(is_dspark=lambda: dspark),
                           forward_mode=SimpleNamespace(is_decode=lambda: decode))


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
