"""The on-device self-check that opens compact verify on SGLang's Triton and FlashInfer backends: the launcher's
verdict and its cache (``ragged_self_check``), the harness it runs in a child process (``ragged_verify_parity``) and
the harness's cases as plain data (``ragged_verify_cases``)."""
