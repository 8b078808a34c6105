"""Training data = the target's own answers, generated through our SGLang CPU server (no speculation).

Each prompt becomes one chat turn; the answer is sampled at ``temperature`` (0.7: the draft should learn the
target's distribution, not only its argmax path). Output records are ``{"messages": [...], "task", "index"}``
(the trainer's chat format). The file is appended as answers arrive, so an interrupted run resumes where it
stopped; ``--deadline-minutes`` bounds the wall time on a small machine.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path
from typing import List, Optional

from .corpus import Prompt


def _done_keys(out: Path) -> set:
    if not out.is_file():
        return set()
    keys = set()
    with open(out, "r", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                rec = json.loads(line)
                keys.add((rec["task"], rec["index"]))
    return keys


def generate_answers(
    target: Path,
    prompts: List[Prompt],
    out: Path,
    *,
    temperature: float = 0.7,
    max_new_tokens: int = 192,
    concurrency: int = 32,
    seed: int = 0,
    deadline_minutes: Optional[float] = None,
    max_total_tokens: int = 32768,
    request_timeout: float = 1800,
    progress: bool = True,
) -> int:
    """Answer the prompts not yet in ``out``; returns how many were written in this call."""
    from sglang_dspark.local_server import chat, start_server

    done = _done_keys(out)
    todo = [p for p in prompts if (p.task, p.index) not in done]
    if not todo:
        return 0
    deadline = time.monotonic() + deadline_minutes * 60 if deadline_minutes else None
    server = start_server(target, ["--dtype", "float32"], max_total_tokens=max_total_tokens, timeout=600)
    written = 0
    try:
        bar = _progress(len(todo), progress)
        out.parent.mkdir(parents=True, exist_ok=True)

        def ask(p: Prompt, k: int) -> dict:
            reply = chat(server, [{"role": "user", "content": p.text}], temperature=temperature,
                         max_tokens=max_new_tokens, seed=seed + k, timeout=request_timeout)
            answer = reply["choices"][0]["message"]["content"]
            return {"task": p.task, "index": p.index,
                    "messages": [{"role": "user", "content": p.text}, {"role": "assistant", "content": answer}],
                    "completion_tokens": reply["usage"]["completion_tokens"]}

        with open(out, "a", encoding="utf-8") as f, ThreadPoolExecutor(concurrency) as pool:
            queue = iter(enumerate(todo))
            running = set()
            tokens = failed = 0
            started = time.monotonic()

            def submit_next() -> bool:
                if deadline is not None and time.monotonic() > deadline:
                    return False
                nxt = next(queue, None)
                if nxt is None:
                    return False
                running.add(pool.submit(ask, nxt[1], nxt[0]))
                return True

            for _ in range(concurrency):
                if not submit_next():
                    break
            while running:
                finished, running = wait(running, return_when=FIRST_COMPLETED)
                for fut in finished:
                    try:
                        rec = fut.result()
                    except Exception as exc:  # noqa: BLE001 - one bad prompt must not end a long run
                        failed += 1
                        bar.write(f"skipped a prompt: {type(exc).__name__}: {str(exc)[:200]}")
                        submit_next()
                        continue
                    f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                    f.flush()
                    written += 1
                    tokens += rec["completion_tokens"]
                    bar.update(1)
                    bar.set_postfix(tok_s=f"{tokens / (time.monotonic() - started):.0f}")
                    submit_next()
        bar.close()
        if failed:
            print(f"{failed} prompts failed and were skipped (a rerun retries them)")
    finally:
        server.stop()
    return written


def _progress(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc="answers", unit="ans", disable=not enabled)
