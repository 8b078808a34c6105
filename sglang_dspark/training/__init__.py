"""Small-scale, CPU-capable trainer for DSpark drafts in DeepSpec's checkpoint format.

Modules (one concept each):

* ``draft_model``  plain-torch DSpark draft: Qwen3-style layers with KV injection, Markov and confidence heads;
  ``training_forward`` (many anchors per sequence at once) and ``draft_block`` (one inference round).
* ``data``         JSONL -> token ids + loss mask (pre-tokenized, chat, prompt/completion or plain text).
* ``features``     runs the frozen target once and caches the chosen layers' outputs and its final hidden state.
* ``loss``         DeepSpec's loss: 0.1 CE + 0.9 L1(p_draft, p_target) + 1.0 confidence BCE, position weighted.
* ``trainer``      AdamW + cosine schedule, gradient clipping, resumable checkpoints, deterministic seed.
* ``export``       DeepSpec-format ``config.json`` + ``model.safetensors`` (loadable by SGLang's Qwen3DSparkModel).
* ``sts``          sequential temperature scaling of the confidence head, written in SGLang's STS JSON format.
* ``check_sglang_forward``  one draft round computed by SGLang's own Qwen3DSparkModel code (subprocess check).
* ``bench``        synthetic training-throughput estimate for a given draft geometry.

CLI: ``python -m sglang_dspark.training {train,features,export,calibrate} ...``.
"""
