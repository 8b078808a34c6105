"""sglang-dspark: DSpark speculative decoding for SGLang 0.5.23.

Kept import-light on purpose: the CPU platform's start-up hook imports this package in every interpreter.
"""

__version__ = "0.1.0"
SUPPORTED_SGLANG_VERSION = "0.5.23"
