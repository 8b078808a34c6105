"""Prompt lookup: proposals copied from a request's own context (issue #39), beside the DSpark draft.

Pure Python/torch, no SGLang imports: the per-request index (``index.py``) and the online acceptance estimate of its
proposals (``calibration.py``). Not wired into the server yet.
"""
