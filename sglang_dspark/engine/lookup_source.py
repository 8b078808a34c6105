"""Prompt lookup as a proposal source of our DSPARK planner (SGLang adapter; issue #39).

Per decode step, on the host, before the step runs: each request's lookup proposal (``lookup/book.py``, from the
tokens the scheduler holds) with its acceptance estimates (``lookup/calibration.py``), as frozen
:class:`~sglang_dspark.scheduling.step_plan.LookupChains`; which rows take them is the step chooser's
(``scheduling/step_choice.py``). After the step, :meth:`LookupSource.observe` reads the step record (its plan, verify
and commit lengths) to teach the calibration and count what each source proposed, verified and got accepted.
:class:`NullLookup` is the source with the lookup off (``SGLANG_DSPARK_LOOKUP=off``): it proposes nothing.

A proposal is made only for rows whose host tokens are current: the anchor is the last token the host holds
(:func:`current_rows`). Under SGLang's overlap scheduler ``patches/lookup_current_tokens.py`` runs a batch with a lookup
match after the previous result is processed while chains are being verified at that load and pay for the wait
(:meth:`LookupSource.needs_current_tokens`, ``scheduling/current_tokens.py``; the patch reaches this source through
the scheduler's draft worker), and tells this source, per batch,
whether its tokens are current (``BatchLaunch``); every such wait is observed, with or without a proposal after it,
so a backend or load where chains do not pay goes back to the overlap. Nothing here reads a device tensor, and no
row is ever anchored on the KV reservation (the spec info's ``nxt_kv_lens_cpu``: committed + two blocks).
"""

from __future__ import annotations

import collections
import functools
import logging
import math
import time
from typing import Optional, Union

import torch

from sglang_dspark import envs
from sglang_dspark.lookup.book import LookupBook, key_scope, server_scope
from sglang_dspark.lookup.calibration import GREEDY, OWN, SHARED, LookupCalibration
from sglang_dspark.lookup.config import DEFAULT, LookupConfig
from sglang_dspark.lookup.shared_index import SharedIndices
from sglang_dspark.profiler.overlap_gap import OverlapGap
from sglang_dspark.patches.lookup_current_tokens import LAUNCH_ATTRIBUTE, BatchLaunch
from sglang_dspark.scheduling.current_tokens import CurrentTokensPolicy
from sglang_dspark.scheduling.step_choice import chain_saving_seconds, lookup_conditionals
from sglang_dspark.scheduling.step_plan import LookupChains, StepPlan

logger = logging.getLogger(__name__)

STEP_KINDS = ("plain", "drafted", "lookup", "mixed")




def _sampling_class(req, calibration: LookupCalibration) -> int:
    """The request's sampling class for the calibration (greedy where SGLang's parameters are not there to read)."""
    params = getattr(req, "sampling_params", None)
    if params is None:
        return GREEDY
    return calibration.sampling_class(getattr(params, "temperature", 1.0), getattr(params, "top_k", 1))


def _committed_len(req) -> Optional[int]:
    kv = getattr(req, "kv", None)
    committed = getattr(kv, "kv_committed_len", None)
    return None if committed is None else int(committed)


def current_rows(batch, reqs) -> list[bool]:
    """Per request of a decode batch: its host tokens end with the anchor of the step being planned.

    Where the scheduler says how it launched the batch (``patches/lookup_current_tokens.BatchLaunch``, every DSPARK decode batch under the overlap
    scheduler): the batch's tokens are current, and the request holds its committed KV length + 1 tokens (its anchor
    not in the KV yet). Elsewhere (the synchronous scheduler, or a batch built without the patch) SGLang's host
    sequence lengths where it publishes them: the request holds ``seq_len + 1`` tokens. Neither: no row is current."""
    held = [len(req.origin_input_ids) + len(req.output_ids) for req in reqs]
    launch: Optional[BatchLaunch] = getattr(batch, LAUNCH_ATTRIBUTE, None)
    if launch is not None:
        if not launch.tokens_current:
            return [False] * len(reqs)
        return [(c := _committed_len(req)) is not None and n == c + 1 for n, req in zip(held, reqs)]
    seq_lens = getattr(batch, "seq_lens_cpu", None)
    if seq_lens is None or len(seq_lens) != len(reqs):
        return [False] * len(reqs)
    return [n == int(seq_lens[i]) + 1 for i, n in enumerate(held)]


def _tokens_left(req) -> int:
    """Tokens the request may still commit (its max_new_tokens less its output; large when unknown)."""
    limit = getattr(getattr(req, "sampling_params", None), "max_new_tokens", None)
    return 1 << 30 if limit is None else int(limit) - len(req.output_ids)


class LookupSource:
    def __init__(self, gamma: int, *, forced: bool = False, on_host: bool = True,
                 config: LookupConfig = DEFAULT, shared_scope: str = "off", long_chains: bool = False) -> None:
        """``on_host``: the model runs on the host (the CPU), where waiting for a result costs no device time;
        ``config``: every tuned constant of the lookup (``lookup/config.py``); ``shared_scope``: the shared suffix
        cache's scope (``SGLANG_DSPARK_SHARED_LOOKUP``: key, server or off); ``long_chains``: this server can verify
        chains past the draft's block (engine/long_chain_step.py), so proposals go up to ``max_chain_tokens``."""
        self.gamma = int(gamma)
        self.max_chain = max(self.gamma, config.max_chain_tokens) if long_chains else self.gamma
        self.forced = forced
        self.config = config
        self.shared_scope = shared_scope
        shared = None if shared_scope == "off" else SharedIndices(config)
        self.book = LookupBook(config, shared, key_scope if shared_scope == "key" else server_scope)
        self.calibration = LookupCalibration(max_tokens=max(1, self.gamma), config=config)
        self.current_tokens = CurrentTokensPolicy(config)
        self.overlap_gap = OverlapGap(on_host=on_host, config=config)  # what waiting for the previous result costs
        self.overlap_given_up = 0  # decode batches that waited for current tokens
        self.steps = dict.fromkeys(STEP_KINDS, 0)
        self.lookup_rows = self.lookup_verified = self.lookup_accepted = 0
        self.shared_proposals = self.shared_rows = self.shared_verified = self.shared_accepted = 0
        self.draft_rows = self.draft_verified = self.draft_accepted = 0
        self.proposals = 0  # rows with a proposal, over all planned steps
        self.chain_lengths: collections.Counter = collections.Counter()  # (verified, accepted) chain tokens per row
        self.planned_steps = 0
        self.proposal_steps = 0  # planned steps with a proposal: every ``explore_every``-th explores
        self.plan_seconds = 0.0  # host time of propose() over all steps (the lookup's cost per step)

    enabled = True

    @classmethod
    def from_env(cls, gamma: int, *, on_host: bool = True, long_chains: bool = False
                 ) -> Union["LookupSource", "NullLookup"]:
        """The source ``SGLANG_DSPARK_LOOKUP`` asks for (:class:`NullLookup` when off)."""
        mode = envs.LOOKUP.get()
        if mode == "off":
            return NULL_LOOKUP
        return cls(gamma, forced=mode == "forced", on_host=on_host, shared_scope=envs.SHARED_LOOKUP.get(),
                   long_chains=long_chains)

    # ------------------------------------------------------------------ before a batch is launched

    def needs_current_tokens(self, reqs) -> bool:
        """Whether a decode batch of SGLang's requests should run on current tokens: some request's tail (as the
        scheduler holds it) recurs in its context, and chains are being verified at this load."""
        reqs = list(reqs)
        return self.book.any_match(reqs) and self.current_tokens.wants(len(reqs), self.overlap_gap.seconds(len(reqs)))

    # ------------------------------------------------------------------ before a step

    def propose(self, batch) -> Optional[LookupChains]:
        """This step's proposals and their acceptance estimates (None: no row has one)."""
        started = time.perf_counter()
        try:
            return self._propose(batch)
        finally:
            self.plan_seconds += time.perf_counter() - started
            self.planned_steps += 1

    def _propose(self, batch) -> Optional[LookupChains]:
        reqs = list(getattr(batch, "reqs", None) or ())
        self.book.retain(req.rid for req in reqs)
        if not reqs:
            return None
        launch: Optional[BatchLaunch] = getattr(batch, LAUNCH_ATTRIBUTE, None)
        waited = launch is not None and launch.overlap_given_up
        self.overlap_given_up += int(waited)
        # Only rows whose host tokens end with the anchor (module docstring); the others get no proposal.
        scope_of = self.book.scope_of
        rows = [(req.rid, req.origin_input_ids, req.output_ids, scope_of(req)) if current else None
                for req, current in zip(reqs, current_rows(batch, reqs))]
        proposals = self.book.propose(rows, self.max_chain)
        if proposals.any:
            # A request commits at most its remaining tokens: proposing past them is verify work that cannot pay.
            remaining = torch.tensor([_tokens_left(req) for req in reqs], dtype=torch.int64)
            proposals = proposals.capped(torch.clamp(remaining - 1, min=0))
        if not proposals.any:
            if waited:  # the batch gave up the overlap for a chain that did not come: the policy learns it
                self.current_tokens.observe(len(reqs), verified_chains=False)
            return None
        self.proposals += int((proposals.lengths > 0).sum())
        self.shared_proposals += int(((proposals.lengths > 0) & (proposals.sources == SHARED)).sum())
        explore = self.calibration.explores(self.proposal_steps)
        self.proposal_steps += 1
        kinds = torch.tensor([_sampling_class(req, self.calibration) for req in reqs], dtype=torch.int64)
        conditional = lookup_conditionals(proposals.lengths, proposals.match_lens, self.max_chain,
                                          functools.partial(self.calibration.planning, explore=explore), kinds,
                                          proposals.sources)
        return LookupChains(tokens=proposals.tokens, lengths=proposals.lengths, match_lens=proposals.match_lens,
                            conditional=conditional, explored=explore, kinds=kinds, sources=proposals.sources)

    def chosen(self, plan: StepPlan, num_requests: int, cost) -> None:
        """The chooser's plan for a step this source proposed for: whether it verified chains, and their predicted
        saving with ``cost`` (a step without the draft), teach the current-tokens policy before the next launch
        (the step's record comes too late for that)."""
        chains = plan.lookup
        saved = chain_saving_seconds(chains.conditional, chains.lengths, cost) if chains is not None else 0.0
        self.current_tokens.observe(num_requests, verified_chains=chains is not None, saved_seconds=saved)

    # ------------------------------------------------------------------ after a step

    def observe(self, record) -> None:
        """A finished decode step (``engine/step_record.StepRecord``): the lookup rows teach the calibration; every
        row counts toward its source."""
        self.overlap_gap.observe(len(record.commit_lens), record.gap_seconds, record.overlap_given_up)
        lookup: Optional[LookupChains] = record.lookup
        self.steps[record.kind] += 1
        rows = lookup.rows.tolist() if lookup is not None and len(lookup.lengths) == len(record.commit_lens) else None
        for i, (verified, committed) in enumerate(zip(record.verify_lens, record.commit_lens)):
            proposed, accepted = max(0, verified - 1), max(0, min(committed, verified) - 1)
            if rows is not None and rows[i]:
                self.lookup_rows += 1
                self.lookup_verified += proposed
                self.lookup_accepted += accepted
                self.chain_lengths[(proposed, accepted)] += 1
                kind = GREEDY if lookup.kinds is None else int(lookup.kinds[i])
                source = OWN if lookup.sources is None else int(lookup.sources[i])
                if source == SHARED:
                    self.shared_rows += 1
                    self.shared_verified += proposed
                    self.shared_accepted += accepted
                self.calibration.observe(int(lookup.match_lens[i]), proposed, accepted, kind, source)
            elif record.drafted:
                self.draft_rows += 1
                self.draft_verified += proposed
                self.draft_accepted += accepted

    def trace_fields(self, record, cost) -> dict:
        """The gate trace's columns for a step with lookup rows (``SGLANG_DSPARK_GATE_TRACE``): rows, chain tokens
        verified, the accepted chain tokens the choice expected (Σ of the planned survivals, the estimates it planned
        with) and those it got, whether it was an exploring step, and, given ``cost`` (a step without the draft), the
        seconds that cost predicted."""
        plan: LookupChains = record.lookup
        rows = plan.rows.tolist()
        got = sum(max(0, min(c, v) - 1) for row, v, c in zip(rows, record.verify_lens, record.commit_lens) if row)
        fields = {"lookup_rows": int(sum(rows)), "lookup_tokens": int(plan.lengths.sum()),
                  "lookup_expected": round(float(torch.cumprod(plan.conditional, dim=-1).sum()), 4),
                  "lookup_accepted": got, "lookup_explored": plan.explored}
        if cost is not None:
            rate = cost.steps_per_second(len(record.verify_lens), sum(record.verify_lens))
            fields["lookup_predicted_seconds"] = round(1.0 / float(rate), 6)
        return fields

    def summary(self) -> dict:
        """Per-source proposals, verified and accepted tokens, step kinds and the lookup's cost (/server_info)."""
        ece = self.calibration.ece()
        return {
            "mode": "forced" if self.forced else "on",
            "max_chain_tokens": self.max_chain,
            "steps": dict(self.steps),
            "indexed_requests": len(self.book),
            "lookup": {"proposals": self.proposals, "rows": self.lookup_rows, "verified": self.lookup_verified,
                       "accepted": self.lookup_accepted,
                       "accept_length": round(1.0 + self.lookup_accepted / self.lookup_rows, 4) if self.lookup_rows
                       else None,
                       "ece": None if math.isnan(ece) else round(ece, 4),
                       # How long the verified chains were and how much of each was accepted: {length: rows}.
                       "verified_lengths": _histogram(self.chain_lengths, 0),
                       "accepted_lengths": _histogram(self.chain_lengths, 1)},
            "shared": self._shared_summary(),
            "draft": {"rows": self.draft_rows, "verified": self.draft_verified, "accepted": self.draft_accepted,
                      "accept_length": round(1.0 + self.draft_accepted / self.draft_rows, 4) if self.draft_rows
                      else None},
            "plan_us_per_step": round(1e6 * self.plan_seconds / self.planned_steps, 2) if self.planned_steps else None,
            "overlap_given_up_steps": self.overlap_given_up,
            "overlap_gap": self.overlap_gap.summary(),
            **self.current_tokens.summary(),
        }

    def _shared_summary(self) -> dict:
        """The shared suffix cache: its scope, what it holds, and what its proposals did (a part of "lookup")."""
        shared = self.book.shared
        if shared is None:
            return {"scope": "off"}
        return {"scope": self.shared_scope, "requests": shared.requests, "tokens": len(shared),
                "capacity_tokens": shared.capacity, "entries": shared.entries, "scopes": shared.scopes,
                "evicted_scopes": shared.evicted_scopes, "proposals": self.shared_proposals,
                # Of all rows with a proposal, the share the cache made (rows whose own context proposed nothing).
                "hit_rate": round(self.shared_proposals / self.proposals, 4) if self.proposals else None,
                "rows": self.shared_rows, "verified": self.shared_verified, "accepted": self.shared_accepted,
                "accept_length": round(1.0 + self.shared_accepted / self.shared_rows, 4) if self.shared_rows
                else None}


def _histogram(pairs: collections.Counter, index: int) -> dict[str, int]:
    counts: collections.Counter = collections.Counter()
    for key, rows in pairs.items():
        counts[key[index]] += rows
    return {str(length): counts[length] for length in sorted(counts)}


class NullLookup:
    """The lookup source when the lookup is off: proposes nothing, never asks for current tokens, learns nothing."""

    enabled = forced = False
    config = DEFAULT

    def needs_current_tokens(self, reqs) -> bool:
        return False

    def propose(self, batch) -> None:
        return None

    def chosen(self, plan: StepPlan, num_requests: int, cost) -> None:
        return None

    def observe(self, record) -> None:
        return None

    def trace_fields(self, record, cost) -> dict:
        return {}

    def summary(self) -> None:
        return None


NULL_LOOKUP = NullLookup()


__all__ = ["NULL_LOOKUP", "LookupSource", "NullLookup", "STEP_KINDS", "current_rows"]
