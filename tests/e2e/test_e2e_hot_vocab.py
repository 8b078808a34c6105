"""End to end: a draft that ships ``dspark_hot_vocab.json`` drafts over those tokens only, and stays exact.

Real CPU servers (stock launcher), tiny fp32 pair, every draft verified (``SGLANG_DSPARK_ADMISSION=verify-all``, gate
off) so acceptance shows what the draft proposed:

* a hot set that leaves out every token the target emits on the test prompts: not one draft token can be accepted
  (mean accept length exactly 1.0, where the same draft over the whole vocabulary accepts some), and greedy ids still
  equal the non-speculative server's, batch of 1 and 8 concurrent; sampled requests are served;
* ``SGLANG_DSPARK_HOT_VOCAB=off`` ignores the file (the whole-vocabulary acceptance comes back);
* a hot set made for another vocabulary stops start-up with an error naming the file and the fix.
The sampled law with a hot set is checked in tests/unit/draft/test_hot_vocab.py.
"""

from __future__ import annotations

import json
import shutil

import pytest

from sglang_dspark.draft.hot_vocab import HOT_VOCAB_FILE
from sglang_dspark.loadtest.engine import admission_delta
from sglang_dspark.testing.helpers import GREEDY, PROMPTS, assert_same_ids, dspark_args, generate_all
from sglang_dspark.local_server import ServerStartError

pytestmark = pytest.mark.server

VERIFY_EVERY_DRAFT = {"SGLANG_DSPARK_ADMISSION": "verify-all", "SGLANG_DSPARK_DRAFT_GATE": "off"}


def _admission(server) -> dict:
    return server.get("/server_info").json()["internal_states"][0]["dspark_admission"]


def _accept_len(server, before: dict) -> float:
    """Mean accept length of the traffic since ``before`` (not the launcher's warm-up request, whose tokens the
    hot set was not built against)."""
    return admission_delta(before, _admission(server))["mean_accept_len"]


def _draft_with_hot_set(tiny_pair, tmp_path, token_ids, vocab_size):
    draft = tmp_path / "draft"
    shutil.copytree(tiny_pair.draft_dir, draft)
    (draft / HOT_VOCAB_FILE).write_text(json.dumps({"vocab_size": vocab_size, "token_ids": token_ids}))
    return draft


def test_cold_target_tokens_are_never_drafted_and_ids_stay_exact(tiny_pair, launch, nospec_reference, tmp_path):
    vocab = tiny_pair.vocab_size
    emitted = {t for ids in nospec_reference["bs1"] + nospec_reference["bs8"] for t in ids}
    cold_to_the_target = [t for t in range(vocab) if t not in emitted]
    draft = _draft_with_hot_set(tiny_pair, tmp_path, cold_to_the_target, vocab)
    with launch(tiny_pair.target_dir, dspark_args(draft), env=VERIFY_EVERY_DRAFT) as server:
        before = _admission(server)
        bs1 = generate_all(server, PROMPTS, GREEDY, concurrency=1)
        bs8 = generate_all(server, PROMPTS, GREEDY, concurrency=8)
        hot_accept = _accept_len(server, before)
        sampled = generate_all(server, PROMPTS[:4], {**GREEDY, "temperature": 0.8, "top_p": 0.9}, concurrency=4)
        log = server.log_text()
    assert f"hot vocabulary: the draft's logits over {len(cold_to_the_target)} of {vocab} tokens" in log
    assert_same_ids([r["output_ids"] for r in bs1], nospec_reference["bs1"], "hot vocabulary, bs1")
    assert_same_ids([r["output_ids"] for r in bs8], nospec_reference["bs8"], "hot vocabulary, 8 concurrent")
    assert hot_accept == 1.0  # every draft token was cold to the target: none accepted
    assert all(len(r["output_ids"]) == GREEDY["max_new_tokens"] for r in sampled)

    # The same folder with the switch off: the whole vocabulary, and the draft's acceptance is back.
    with launch(tiny_pair.target_dir, dspark_args(draft), env={**VERIFY_EVERY_DRAFT, "SGLANG_DSPARK_HOT_VOCAB": "off"}) as server:
        before = _admission(server)
        full = generate_all(server, PROMPTS, GREEDY, concurrency=1)
        full_accept = _accept_len(server, before)
        log = server.log_text()
    assert "hot vocabulary" not in log
    assert_same_ids([r["output_ids"] for r in full], nospec_reference["bs1"], "hot vocabulary off")
    assert full_accept > 1.0


def test_a_hot_set_for_another_vocabulary_stops_startup(tiny_pair, launch, tmp_path):
    vocab = tiny_pair.vocab_size
    draft = _draft_with_hot_set(tiny_pair, tmp_path, [0, 1, 2], vocab + 7)
    with pytest.raises(ServerStartError) as err:
        with launch(tiny_pair.target_dir, dspark_args(draft), timeout=120):
            pass
    message = str(err.value)
    assert HOT_VOCAB_FILE in message and f"made for a {vocab + 7}-token vocabulary" in message
