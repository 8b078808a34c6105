"""``sglang-dspark`` command line: the demo and project utilities.

    sglang-dspark demo [--keep-serving] [--prompt TEXT]   serve DSPARK on SmolLM2 + our draft, answer one request
    sglang-dspark tiny-pair OUT_DIR                       build the tiny random test pair
    sglang-dspark explain [--gpu H100] [--device cuda] -- <launch_server args>
                                                          what a server would do: backend, graphs, verify mode, why
    sglang-dspark loadtest [...]                          load-test servers (= python -m sglang_dspark.loadtest)
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time


def _demo(args: argparse.Namespace) -> int:
    from sglang_dspark.embedded.defaults import ensure_default_pair
    from sglang_dspark.local_server import chat, start_server

    target, draft = (args.model_path, args.draft_model_path) if args.model_path else ensure_default_pair()
    # --dtype float32: SGLang's "auto" would serve a float32 checkpoint in float16.
    spec_args = ["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", str(draft),
                 "--dtype", args.dtype]
    print(f"[demo] target {target}\n[demo] draft  {draft}")
    print("[demo] python -m sglang.launch_server --model-path", target, shlex.join(spec_args), "--device cpu ...")
    server = start_server(target, spec_args, max_total_tokens=args.max_total_tokens, timeout=args.timeout)
    try:
        print(f"[demo] server healthy after {server.startup_seconds:.1f} s at {server.url}")
        started = time.monotonic()
        reply = chat(server, [{"role": "user", "content": args.prompt}], max_tokens=args.max_tokens, temperature=0)
        seconds = time.monotonic() - started
        text = reply["choices"][0]["message"]["content"]
        tokens = reply["usage"]["completion_tokens"]
        print(f"[demo] reply ({tokens} tokens, {tokens / seconds:.1f} tok/s):\n{text}")
        info = server.generate(args.prompt, {"max_new_tokens": 32, "temperature": 0})["meta_info"]
        print(
            f"[demo] DSPARK ran: spec_verify_ct={info.get('spec_verify_ct')} "
            f"accept length={info.get('spec_accept_length')}"
        )
        if args.keep_serving:
            print(f"[demo] serving at {server.url} (Ctrl-C stops it)")
            server.process.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


def _tiny_pair(args: argparse.Namespace) -> int:
    from sglang_dspark.testing.tiny_pair import build_tiny_pair

    pair = build_tiny_pair(args.out_dir, seed=args.seed, force=args.force)
    print(pair.target_dir)
    print(pair.draft_dir)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["loadtest"]:  # its own parser takes every argument after the subcommand
        from sglang_dspark.loadtest.runner import main as loadtest_main

        return loadtest_main(argv[1:])
    parser = argparse.ArgumentParser(prog="sglang-dspark")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="serve DSPARK with the stock launcher and answer one request")
    demo.add_argument("--model-path", help="target model (default: the embedded default pair)")
    demo.add_argument("--draft-model-path", help="DSpark draft checkpoint (with --model-path)")
    demo.add_argument("--prompt", default="Write a Python function that reverses a list.")
    demo.add_argument("--max-tokens", type=int, default=64)
    demo.add_argument("--dtype", default="float32", help="float32 (default) makes greedy output bit-identical to no-spec")
    demo.add_argument("--max-total-tokens", type=int, default=4096)
    demo.add_argument("--timeout", type=float, default=300)
    demo.add_argument("--keep-serving", action="store_true", help="keep the server up after the request")
    demo.set_defaults(func=_demo)
    tiny = sub.add_parser("tiny-pair", help="build the tiny random target + DSpark draft (offline, seconds)")
    tiny.add_argument("out_dir")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument("--force", action="store_true")
    tiny.set_defaults(func=_tiny_pair)
    from sglang_dspark.engine.explain import add_explain_parser

    add_explain_parser(sub)
    sub.add_parser("loadtest", help="sweep load against SGLang servers, frontier PNG (see `loadtest --help`)",
                   add_help=False)
    args = parser.parse_args(argv)
    if args.command == "demo" and bool(args.model_path) != bool(args.draft_model_path):
        parser.error("--model-path and --draft-model-path go together")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
