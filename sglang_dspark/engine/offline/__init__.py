"""Checks of a draft against SGLang that run outside a server: its weights load (``check_sglang_load``) and its
forward matches ours (``check_sglang_forward``)."""
