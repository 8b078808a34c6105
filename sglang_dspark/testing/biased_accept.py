"""TEST ONLY: a deliberately wrong DSPARK acceptance, the positive control of the sampled-exactness test.

With ``DSPARK_TEST_ACCEPT_ALL_DRAFTS=1`` *and* this module installed in the server's interpreters (by the
``sitecustomize.py`` that :func:`control_env` writes into a temporary folder put first on ``PYTHONPATH``), our CPU
chain sampler (``sglang_dspark.kernels.rejection_sampling.chain_speculative_sampling_torch``, the one the B7 hook of
``patches/cpu_dspark.py`` calls) gets all-zero acceptance coins: ``u * q = 0 < p`` accepts every draft token the
target gives any probability, i.e. no ``min(1, p/q)`` ratio test. Tokens then follow the draft's distribution where
it is not the target's, which ``tests/e2e/test_e2e_sampled_exactness.py`` must detect.

Nothing in the package imports this module and no plugin entry point names it: a server is biased only when a test
builds the environment with :func:`control_env`. The variable is read only here.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

ENV = "DSPARK_TEST_ACCEPT_ALL_DRAFTS"
_COINS_POSITION = 7  # uniform_samples in the chain sampler's positional order

SITECUSTOMIZE = textwrap.dedent(
    f"""\
    # Written by sglang_dspark.testing.biased_accept (test-only positive control); inert unless {ENV}=1.
    import os
    if os.environ.get("{ENV}") == "1":
        from sglang_dspark.testing.biased_accept import install
        install()
    """
)


def install() -> None:
    """Replace the torch chain sampler by one that accepts without the ratio test (only when the env var is 1)."""
    if os.environ.get(ENV) != "1":
        return
    from sglang_dspark.kernels import rejection_sampling

    honest = rejection_sampling.chain_speculative_sampling_torch
    if getattr(honest, "_accepts_all_drafts", False):
        return

    def accept_all_drafts(*args, **kwargs):
        if "uniform_samples" in kwargs:
            kwargs["uniform_samples"] = kwargs["uniform_samples"].new_zeros(kwargs["uniform_samples"].shape)
        else:
            args = list(args)
            args[_COINS_POSITION] = args[_COINS_POSITION].new_zeros(args[_COINS_POSITION].shape)
        return honest(*args, **kwargs)

    accept_all_drafts._accepts_all_drafts = True
    rejection_sampling.chain_speculative_sampling_torch = accept_all_drafts


def control_env(folder: str | Path) -> dict[str, str]:
    """Environment for a deliberately biased server: writes ``folder/sitecustomize.py`` and returns the variables."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    path = os.environ.get("PYTHONPATH", "")
    return {ENV: "1", "PYTHONPATH": str(folder) + (os.pathsep + path if path else "")}
