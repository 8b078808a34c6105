"""A decode step the draft gate skipped: its verify kept at one logits row per request (``anchor_only_verify``),
run as SGLang's own decode step where the target is eager (``plain_decode_step``), and its draft-KV rows held for one
batched write (``pending_context_kv``)."""
