"""Prompt lookup: proposals copied from a request's own context (issue #39), beside the DSpark draft.

Pure Python/torch, no SGLang imports: the per-request index (``index.py``), the running requests' indices and a
batch's proposals (``book.py``), the online acceptance estimate of its proposals (``calibration.py``) and every tuned
constant of the lookup (``config.py``). The server side is ``engine/lookup_source.py`` (the planner's source), the
choice ``scheduling/step_choice.py``.
"""
